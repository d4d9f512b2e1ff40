"""tools/infer.py as a user runs it: label PNGs equal to mmseg_cann.apis, overlays,
unreadable images skipped (exit 1), missing inputs (exit 2, nothing written), and an
HRF-size image in slide mode."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from tests._helpers import run_python

DEMO = 'configs/medical/unet-s5-d16_fcn_cann_1xb4-300iter_synthetic-drive-64x64.py'


def _write_images(folder, n=3, hw=(64, 64)):
    import cv2
    folder.mkdir()
    rng = np.random.RandomState(0)
    for i in range(n):
        cv2.imwrite(str(folder / f'im{i}.png'), (rng.rand(*hw, 3) * 255).astype(np.uint8))
    return folder


@pytest.mark.slow
def test_labels_overlays_and_a_bad_image(checkpoint, tmp_path):
    from PIL import Image

    from mmseg_cann.apis import inference_model, init_model
    images = _write_images(tmp_path / 'imgs')
    (images / 'broken.png').write_bytes(b'not an image')
    out = tmp_path / 'out'
    result = run_python(['tools/infer.py', DEMO, checkpoint, str(images), '--out-dir',
                         str(out), '--overlay', '--batch-size', '2'], timeout=600)
    assert result.returncode == 1, result.stdout + result.stderr  # one image failed
    assert 'broken.png' in result.stderr and 'Traceback' not in result.stderr
    assert '3 image(s) written' in result.stdout and '1 failed' in result.stdout
    model = init_model(DEMO, checkpoint, 'cpu')
    for i in range(3):
        label = Image.open(out / f'im{i}.png')
        assert label.mode == 'P' and label.size == (64, 64)
        expected = inference_model(model, str(images / f'im{i}.png')).pred_sem_seg.data[0]
        np.testing.assert_array_equal(np.array(label), expected.numpy())
        assert label.getpalette()[:6] == [0, 0, 0, 255, 0, 0]
        assert Image.open(out / 'vis' / f'im{i}.png').size == (64, 64)


def test_missing_input_exits_2_before_writing(checkpoint, tmp_path):
    out = tmp_path / 'out'
    result = run_python(['tools/infer.py', DEMO, checkpoint, str(tmp_path / 'nope.png'),
                         '--out-dir', str(out)], timeout=300)
    assert result.returncode == 2 and 'nope.png' in result.stderr
    assert 'Traceback' not in result.stderr and not out.exists()


@pytest.mark.slow
def test_hrf_size_image_in_slide_mode(checkpoint, tmp_path):
    from PIL import Image
    images = _write_images(tmp_path / 'imgs', n=1, hw=(2336, 3504))
    out = tmp_path / 'out'
    result = run_python(['tools/infer.py', DEMO, checkpoint, str(images / 'im0.png'),
                         '--out-dir', str(out), '--cfg-options', 'model.test_cfg.mode=slide',
                         'model.test_cfg.crop_size=(256,256)', 'model.test_cfg.stride=(200,200)',
                         'test_pipeline.1.scale=(3504,2336)'], timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    label = Image.open(out / 'im0.png')
    assert label.size == (3504, 2336) and os.path.getsize(out / 'im0.png') > 0
