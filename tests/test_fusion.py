"""Opt-in fusions (mmseg_cann.fusion) on real small mmseg UPerNet and FPN models."""
import copy

import pytest
import torch

from mmseg_cann import convert_model
from mmseg_cann.convert import restore_resize
from mmseg_cann.fusion import FusionReport, fuse_upsample_add, lean_predict, unfuse_model

from tests._helpers import build_small, seg_batch

MODELS = {
    'upernet': 'mmseg::upernet/upernet_r50_4xb2-40k_cityscapes-512x1024.py',
    'fpn': 'mmseg::sem_fpn/fpn_r50_4xb2-80k_cityscapes-512x1024.py',
}
FUSED = {'upernet': ['decode_head (UPerHead._forward_feature)'], 'fpn': ['neck (FPN.forward)']}


@pytest.fixture(autouse=True)
def _restore_routing():
    yield
    restore_resize()


@pytest.fixture(scope='module', params=sorted(MODELS))
def pair(request):
    """(name, plain model, its deep copy to convert), eval mode."""
    torch.manual_seed(0)
    model = build_small(MODELS[request.param]).eval()
    return request.param, model, copy.deepcopy(model)


def _bound(model):
    return {p: m.__dict__.get('_cann_fused') for p, m in model.named_modules()
            if m.__dict__.get('_cann_fused')}


def _preds(samples):
    return torch.stack([s.pred_sem_seg.data for s in samples])


def test_off_by_default(pair):
    _, plain, other = pair
    model = copy.deepcopy(other)
    convert_model(model)
    assert _bound(model) == {}
    assert not str(model.cann_conversion_report.fusion)
    assert 'predict' not in model.__dict__


def test_options_validated(pair):
    _, _, other = pair
    with pytest.raises(TypeError, match='lean_predict'):
        convert_model(copy.deepcopy(other), lean_predict='yes')


def test_fused_top_down_is_identical(pair):
    name, plain, other = pair
    model = convert_model(copy.deepcopy(other), fuse_upsample_add=True, lean_predict=True)
    report = model.cann_conversion_report.fusion
    assert report.upsample_add == FUSED[name]
    assert report.lean_predict == ['EncoderDecoder.predict']
    assert 'upsample_add fused' in str(model.cann_conversion_report)
    x, samples = seg_batch(model)
    with torch.no_grad():
        # decoder logits (the whole network up to the head output): equal within float32
        # rounding (the fused CPU kernel's top-down sums may differ from PyTorch's in the
        # last bit on these small maps, mmseg_cann/backends/numba_cpu.py)
        torch.testing.assert_close(model._forward(x), plain._forward(x))
        expected = plain.predict(x, copy.deepcopy(samples))
        got = model.predict(x, copy.deepcopy(samples))
        full = plain.predict(x)
        got_none = model.predict(x)
    assert torch.equal(_preds(got), _preds(expected))
    assert torch.equal(_preds(got_none), _preds(full))
    # lean: no full-resolution logits, the decoder output instead
    assert 'seg_logits' not in got[0] and 'seg_logits' in expected[0]
    low = got[0].seg_logits_low.data
    assert low.shape == (19, 16, 32)
    with torch.no_grad():
        torch.testing.assert_close(low, plain._forward(x)[0])
    unfuse_model(model)
    assert _bound(model) == {} and 'predict' not in model.__dict__


def test_training_gradients_unchanged(pair):
    _, plain, other = pair
    model = copy.deepcopy(other).train()
    fuse_upsample_add(model)
    ref = copy.deepcopy(other).train()
    x, samples = seg_batch(model, seed=1)
    losses = []
    for m in (model, ref):
        torch.manual_seed(4)  # same dropout masks
        losses.append(sum(v for k, v in m.loss(x, copy.deepcopy(samples)).items()
                          if 'loss' in k))
    assert torch.equal(losses[0], losses[1])
    for loss in losses:
        loss.backward()
    for (n, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        assert (p.grad is None) == (q.grad is None), n
        if p.grad is not None:
            assert torch.equal(p.grad, q.grad), n


def _test_data(num, hw, seed):
    from mmseg.structures import SegDataSample
    gen = torch.Generator().manual_seed(seed)
    inputs, samples = [], []
    for i in range(num):
        inputs.append(torch.randint(0, 256, (3,) + hw, generator=gen, dtype=torch.uint8))
        sample = SegDataSample()
        sample.set_metainfo(dict(img_shape=hw, ori_shape=hw, flip=i == 1,
                                 flip_direction='horizontal'))
        samples.append(sample)
    return dict(inputs=inputs, data_samples=samples)


def test_lean_test_step_with_padding_flip_and_keep_logits(pair):
    _, plain, other = pair
    # a size divisor makes the preprocessor pad 60x100 to 64x128 (crop path)
    for m in (plain, other):
        m.data_preprocessor.test_cfg = dict(size_divisor=32)
    model = copy.deepcopy(other)
    lean_predict(model)
    keep = copy.deepcopy(other)
    lean_predict(keep, keep_logits=True)
    data = _test_data(2, (60, 100), seed=2)
    with torch.no_grad():
        expected = plain.test_step(copy.deepcopy(data))
        got = model.test_step(copy.deepcopy(data))
        kept = keep.test_step(copy.deepcopy(data))
    assert got[0].pred_sem_seg.data.shape == (1, 60, 100)
    assert torch.equal(_preds(got), _preds(expected))
    assert torch.equal(_preds(kept), _preds(expected))
    for k, e in zip(kept, expected):
        assert torch.equal(k.seg_logits.data, e.seg_logits.data)


def test_lean_rescaled_ori_shape(pair):
    """ori_shape differs from the cropped size: mmseg's second resize, fused."""
    _, plain, other = pair
    model = copy.deepcopy(other)
    lean_predict(model)
    x, samples = seg_batch(model, seed=3)
    for s in samples:
        s.set_metainfo(dict(ori_shape=(90, 170)))
    with torch.no_grad():
        expected = plain.predict(x, copy.deepcopy(samples))
        got = model.predict(x, copy.deepcopy(samples))
    assert got[0].pred_sem_seg.data.shape == (1, 90, 170)
    assert torch.equal(_preds(got), _preds(expected))


def test_per_instance_and_skips():
    from mmseg.models.necks import FPN
    fpn = FPN([8, 16], 8, 2, upsample_cfg=dict(scale_factor=2, mode='nearest'))
    report = fuse_upsample_add(torch.nn.Sequential(fpn))
    assert report.upsample_add == [] and 'FPN upsample_cfg' in report.skipped[0]
    plain = FPN([8, 16], 8, 2)
    fused = FPN([8, 16], 8, 2)
    fuse_upsample_add(fused)
    assert 'forward' in fused.__dict__ and 'forward' not in plain.__dict__
    assert FPN.forward.__module__.startswith('mmseg')
    report = lean_predict(torch.nn.Conv2d(1, 1, 1))
    assert report.lean_predict == [] and 'not an EncoderDecoder' in report.skipped[0]
    assert isinstance(report, FusionReport)


def test_hook_options(pair):
    import types as _types
    from mmengine.logging import MMLogger
    from mmseg_cann import CANNOpsHook
    name, plain, other = pair
    runner = _types.SimpleNamespace(model=copy.deepcopy(other),
                                    logger=MMLogger.get_current_instance())
    CANNOpsHook(fuse_upsample_add=True, lean_predict=True).before_test(runner)
    assert runner.model.cann_conversion_report.fusion.upsample_add == FUSED[name]
    assert 'predict' in runner.model.__dict__
    default = _types.SimpleNamespace(model=copy.deepcopy(other), logger=runner.logger)
    CANNOpsHook().before_test(default)
    assert _bound(default.model) == {}
