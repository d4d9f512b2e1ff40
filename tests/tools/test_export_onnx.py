"""tools/export_onnx.py on small real mmseg models (a Cityscapes PSPNet and a DRIVE UNet
inheriting mmseg's configs with reduced depth/channels): export, onnx.checker,
onnxruntime verification against PyTorch, node summary, exit codes."""
from __future__ import annotations

import pytest

from tests.conftest import run_python

pytest.importorskip('onnxruntime')

PSPNET = """_base_ = 'mmseg::pspnet/pspnet_r50-d8_4xb2-40k_cityscapes-512x1024.py'
model = dict(
    data_preprocessor=dict(size=(64, 128)),
    backbone=dict(depth=18, base_channels=16, init_cfg=None),
    decode_head=dict(in_channels=128, channels=32),
    auxiliary_head=dict(in_channels=64, channels=16))
"""
UNET = """_base_ = 'mmseg::unet/unet-s5-d16_fcn_4xb4-40k_drive-64x64.py'
model = dict(
    data_preprocessor=dict(size=(64, 64)),
    backbone=dict(base_channels=8),
    decode_head=dict(in_channels=8, channels=8),
    auxiliary_head=dict(in_channels=16, channels=8))
"""


def _config(tmp_path, text, name):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.mark.slow
def test_cityscapes_pspnet_export_verified(tmp_path):
    cfg = _config(tmp_path, PSPNET, 'pspnet_small.py')
    out = tmp_path / 'psp.onnx'
    result = run_python(['tools/export_onnx.py', cfg, '--shape', '64', '128', '--out',
                         str(out), '--verify'], timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert out.exists()
    text = result.stdout
    assert 'onnx.checker: ok' in text and 'verification passed' in text
    assert text.count('argmax agreement 100.0000%') == 2
    # the PPM bins: global pool (1), AveragePool for the even bins, MaxPool stem
    assert 'GlobalAveragePool' in text and 'MaxPool' in text
    # final logits resize carries sizes, never scales
    assert 'sizes=[1,19,64,128]' in text and 'scales=' not in text


@pytest.mark.slow
def test_drive_unet_export_verified_and_tolerance_exit(tmp_path):
    cfg = _config(tmp_path, UNET, 'unet_small.py')
    out = tmp_path / 'unet.onnx'
    args = ['tools/export_onnx.py', cfg, '--shape', '64', '96', '--out', str(out), '--verify']
    result = run_python(args, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert 'verification passed' in result.stdout
    # nn.Upsample(scale_factor=2) in the decoder: integer ratio -> sizes baked in
    assert 'Resize' in result.stdout and 'scales=' not in result.stdout
    strict = run_python(args + ['--atol', '0'], timeout=300)
    assert strict.returncode == 1 and 'verification FAILED' in strict.stdout


def test_dynamic_export_refuses_specialised_graph():
    import torch

    from mmseg_cann import CANNUpsample
    from mmseg_cann.onnx import export_onnx
    model = torch.nn.Sequential(CANNUpsample(scale_factor=2, mode='bilinear'))
    with pytest.raises(ValueError, match='dynamic height/width export is not supported'):
        export_onnx(model, torch.randn(1, 2, 8, 8), dynamic=True)
