"""mmseg_cann.apis: mmseg's inference APIs with the CANN conversion; labels equal to
mmseg's own APIs with the same weights, in whole and slide mode."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from mmseg_cann import CANNMaxPool2d, CANNUpsample, get_precision_policy
from mmseg_cann.apis import CANNInferencer, cann_settings, inference_model, init_model
from mmseg_cann.fusion import is_lean

DEMO = 'configs/medical/unet-s5-d16_fcn_cann_1xb4-300iter_synthetic-drive-64x64.py'
AMP = 'configs/medical/unet-s5-d16_fcn_cann_4xb4-amp-40k_drive-64x64.py'


@pytest.fixture(scope='module')
def checkpoint(tmp_path_factory):
    """An mmengine-style checkpoint (numpy values and a HistoryBuffer in it, as the
    Runner writes): loading it needs the weights_only allow-list."""
    from mmengine.logging import HistoryBuffer
    torch.manual_seed(0)
    model = init_model(DEMO, None, 'cpu')
    buffer = HistoryBuffer()
    buffer.update(0.5)
    path = tmp_path_factory.mktemp('ckpt') / 'demo.pth'
    torch.save({'state_dict': model.state_dict(),
                'meta': {'dataset_meta': {'classes': ('background', 'vessel'),
                                          'palette': [[120, 120, 120], [6, 230, 230]]},
                         'iter': np.int64(300)},
                'message_hub': {'log_scalars': {'loss': buffer}}}, path)
    return str(path)


def _images():
    """Two 64x64 images: the test pipeline rescales them to 96x96 (UNet needs sides
    divisible by 16), so the labels are resized back to ori_shape."""
    rng = np.random.RandomState(0)
    return [(rng.rand(64, 64, 3) * 255).astype(np.uint8) for _ in range(2)]


def _mmseg_model(checkpoint, mode):
    from mmengine.model import revert_sync_batchnorm
    from mmseg.apis import init_model as mmseg_init_model
    model = revert_sync_batchnorm(mmseg_init_model(
        DEMO, checkpoint, 'cpu', cfg_options={'model.test_cfg.mode': mode}))
    assert not any(isinstance(m, (CANNMaxPool2d, CANNUpsample)) for m in model.modules())
    return model


@pytest.mark.slow
@pytest.mark.parametrize('mode', ['whole', 'slide'])
def test_labels_equal_mmseg_apis(checkpoint, mode):
    from mmseg.apis import inference_model as mmseg_inference_model
    ours = init_model(DEMO, checkpoint, 'cpu', cfg_options={'model.test_cfg.mode': mode})
    assert is_lean(ours) and ours.dataset_meta['classes'] == ('background', 'vessel')
    assert any(isinstance(m, CANNMaxPool2d) for m in ours.modules())
    theirs = _mmseg_model(checkpoint, mode)
    images = _images()
    got = inference_model(ours, images)
    want = mmseg_inference_model(theirs, images)
    for g, w, image in zip(got, want, images):
        assert g.pred_sem_seg.data.shape == (1,) + image.shape[:2]
        assert torch.equal(g.pred_sem_seg.data, w.pred_sem_seg.data)
        assert 'seg_logits' not in g  # no full-resolution logits kept
    single = (np.random.RandomState(1).rand(96, 96, 3) * 255).astype(np.uint8)
    got, want = inference_model(ours, single), mmseg_inference_model(theirs, single)
    assert torch.equal(got.pred_sem_seg.data, want.pred_sem_seg.data)  # one in, one out


@pytest.mark.slow
def test_inferencer_matches_mmseg_inferencer(checkpoint, tmp_path):
    import cv2
    from mmseg.apis import MMSegInferencer
    paths = []
    for i, image in enumerate(_images()):
        paths.append(str(tmp_path / f'img{i}.png'))
        cv2.imwrite(paths[-1], image)
    ours = CANNInferencer(model=DEMO, weights=checkpoint, device='cpu')
    theirs = MMSegInferencer(model=DEMO, weights=checkpoint, device='cpu')
    assert is_lean(ours.model) and ours.model.cann_conversion_report.replaced
    got = ours(paths, return_datasamples=True)
    want = theirs(paths, return_datasamples=True)
    for g, w in zip(got, want):
        assert torch.equal(g.pred_sem_seg.data, w.pred_sem_seg.data)
    out = ours(paths, out_dir=str(tmp_path / 'out'))
    assert len(out['predictions']) == 2
    # MMSegInferencer's own file naming
    assert sorted(p.name for p in (tmp_path / 'out' / 'vis').iterdir()) == ['img0.png', 'img1.png']
    assert len(list((tmp_path / 'out' / 'pred').iterdir())) == 2


def test_hook_settings_of_the_config_are_applied():
    from mmengine.config import Config
    assert cann_settings(Config.fromfile(AMP))['pool_precision'] == dict(max='fp16', avg='fp32')
    model = init_model(AMP, None, 'cpu')
    assert get_precision_policy().max == torch.float16  # as CANNOpsHook installs it
    assert model.cann_conversion_report.resize_modules
    plain = init_model(DEMO, None, 'cpu', lean_predict=False)
    assert not is_lean(plain)
    with pytest.raises(TypeError, match='lean_predict'):
        init_model(DEMO, None, 'cpu', lean_predict='yes')
    bad = Config.fromfile(DEMO)
    bad.custom_hooks = [dict(type='CANNOpsHook', pool_precisoin=dict(max='fp16'))]
    with pytest.raises(ValueError, match='pool_precisoin'):
        cann_settings(bad)


def _rng_image(h, w, seed):
    return (np.random.RandomState(seed).rand(h, w, 3) * 255).astype(np.uint8)


@pytest.mark.slow
def test_demo_config_takes_any_image_size_in_whole_mode(checkpoint):
    """The demo config pads test images to a multiple of 16 (``size_divisor`` in the
    data preprocessor's ``test_cfg``), as mmseg does: labels equal mmseg's own APIs on
    non-square sides that are no multiple of 16 (UNet asserts divisibility)."""
    from mmseg.apis import inference_model as mmseg_inference_model
    ours = init_model(DEMO, checkpoint, 'cpu')
    assert ours.cfg.model.test_cfg.mode == 'whole'
    theirs = _mmseg_model(checkpoint, 'whole')
    for i, (h, w) in enumerate([(100, 80), (131, 50), (37, 203)]):
        image = _rng_image(h, w, i)
        got, want = inference_model(ours, image), mmseg_inference_model(theirs, image)
        assert got.pred_sem_seg.data.shape == (1, h, w)
        assert torch.equal(got.pred_sem_seg.data, want.pred_sem_seg.data)


def test_lean_slide_with_gaps_raises_mmseg_assertion(checkpoint):
    """Windows that leave pixels uncovered (stride > crop): mmseg's ``slide_inference``
    raises AssertionError; the lean path raises the same type (before any window)."""
    from mmseg.apis import inference_model as mmseg_inference_model
    options = {'model.test_cfg.mode': 'slide', 'model.test_cfg.crop_size': (32, 32),
               'model.test_cfg.stride': (48, 48)}
    image = _rng_image(96, 96, 0)
    theirs = _mmseg_model(checkpoint, 'slide')
    theirs.test_cfg.crop_size, theirs.test_cfg.stride = (32, 32), (48, 48)
    with pytest.raises(AssertionError):
        mmseg_inference_model(theirs, image)
    ours = init_model(DEMO, checkpoint, 'cpu', cfg_options=options)
    assert is_lean(ours)
    with pytest.raises(AssertionError, match='crop_size'):
        inference_model(ours, image)
    ours.test_cfg.stride = (32, 48)  # rows covered, columns not
    with pytest.raises(AssertionError, match='columns'):
        inference_model(ours, image)
    ours.test_cfg.stride = (32, 32)  # covered: labels as mmseg's
    theirs.test_cfg.stride = (32, 32)
    assert torch.equal(inference_model(ours, image).pred_sem_seg.data,
                       mmseg_inference_model(theirs, image).pred_sem_seg.data)
