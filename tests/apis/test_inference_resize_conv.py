"""fuse_resize_conv through the inference APIs: a config's CANNOpsHook entry turns it on
for mmseg_cann.apis.init_model (with the lean prediction path); labels equal mmseg's
own APIs with the same checkpoint except at near-ties."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from mmseg_cann.apis import cann_settings, inference_model, init_model
from mmseg_cann.convert import restore_resize

DEMO = 'configs/medical/unet-s5-d16_fcn_cann_1xb4-300iter_synthetic-drive-64x64.py'


@pytest.fixture(autouse=True)
def _restore_resize():
    yield
    restore_resize()


def test_settings_accept_the_option():
    assert cann_settings(dict(custom_hooks=[]))['fuse_resize_conv'] is False
    cfg = dict(custom_hooks=[dict(type='CANNOpsHook', fuse_resize_conv=True)])
    assert cann_settings(cfg)['fuse_resize_conv'] is True


@pytest.mark.slow
def test_init_model_from_config_rewrites_and_predicts(tmp_path):
    from mmengine.config import Config
    from mmengine.model import revert_sync_batchnorm
    from mmseg.apis import inference_model as mmseg_inference_model
    from mmseg.apis import init_model as mmseg_init_model

    from tests._helpers import REPO_ROOT
    torch.manual_seed(0)
    reference = mmseg_init_model(f'{REPO_ROOT}/{DEMO}', None, 'cpu')
    checkpoint = str(tmp_path / 'demo.pth')
    torch.save({'state_dict': reference.state_dict(),
                'meta': {'dataset_meta': {'classes': ('background', 'vessel'),
                                          'palette': [[120, 120, 120], [6, 230, 230]]}}},
               checkpoint)
    cfg = Config.fromfile(f'{REPO_ROOT}/{DEMO}')
    cfg.custom_hooks = [dict(type='CANNOpsHook', fuse_resize_conv=True)]
    ours = init_model(cfg, checkpoint, 'cpu')
    sites = ours.cann_conversion_report.fusion.resize_conv
    assert sites == [f'backbone.decoder.{i}.upsample (InterpConv.interp_upsample[1])'
                     for i in range(4)]
    theirs = revert_sync_batchnorm(mmseg_init_model(f'{REPO_ROOT}/{DEMO}', checkpoint, 'cpu'))
    rng = np.random.RandomState(0)
    image = (rng.rand(96, 96, 3) * 255).astype(np.uint8)
    got = inference_model(ours, image).pred_sem_seg.data
    expected = mmseg_inference_model(theirs, image)
    labels = expected.pred_sem_seg.data
    logits = expected.seg_logits.data
    top2 = logits.topk(2, dim=0).values
    clear = (top2[0] - top2[1]) > 1e-4 * float(logits.abs().max())
    assert torch.equal(got[0][clear], labels[0][clear]) and clear.float().mean() > 0.99
