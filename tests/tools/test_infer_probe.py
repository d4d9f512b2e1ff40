"""tools/infer.py tried the way users break it: colliding output names (same name in
several folders, same stem with another suffix, several input folders), symlinks, grey,
RGBA and 16-bit images, non-image files, an empty folder, an image the model cannot
take, a batch of mixed sizes, the output folder inside an input folder, and output
folders that cannot be used (exit 2 before any work)."""
from __future__ import annotations

import os
import os.path as osp

import numpy as np
import pytest
import torch

from tests._helpers import REPO_ROOT, run_python

from .conftest import import_tool

DEMO = 'configs/medical/unet-s5-d16_fcn_cann_1xb4-300iter_synthetic-drive-64x64.py'


@pytest.fixture
def tool(monkeypatch):
    """tools/infer.py imported in-process (its naming and checks)."""
    return import_tool(monkeypatch, 'infer')


def _image(path, hw=(64, 64), seed=0, channels=3, dtype=np.uint8):
    import cv2
    os.makedirs(osp.dirname(path), exist_ok=True)
    top = 65535 if dtype == np.uint16 else 255
    shape = hw if channels == 1 else hw + (channels,)
    cv2.imwrite(str(path), (np.random.RandomState(seed).rand(*shape) * top).astype(dtype))
    return str(path)


def _touch(path, data=b''):
    os.makedirs(osp.dirname(path), exist_ok=True)
    with open(path, 'wb') as f:
        f.write(data)
    return str(path)


# ---------------------------------------------------------------------------------------
# naming and output checks, in-process
# ---------------------------------------------------------------------------------------
def test_output_names_mirror_the_inputs(tool, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ('a/x.png', 'b/x.png', 'a/y.png', 'a/y.jpg', 'val/p.png', 'test/p.png',
                 'one/q.png', 'one/r.JPG'):
        _touch(tmp_path / name)
    os.makedirs('one/sub.png')  # a folder with an image suffix is not an image
    _touch(tmp_path / 'one' / 'notes.txt')

    def names(*inputs):
        return tool.output_names(tool.collect_images(list(inputs)))
    assert names('a/x.png', 'b/x.png', 'a/y.png', 'a/y.jpg') == [
        'a/x.png', 'b/x.png', 'a/y.png.png', 'a/y.jpg.png']
    assert names('a') == ['x.png', 'y.jpg.png', 'y.png.png']  # a folder's images, sorted
    assert names('val', 'test') == ['val/p.png', 'test/p.png']
    assert names('one') == ['q.png', 'r.png'] and names('one/q.png') == ['q.png']
    assert names(str(tmp_path / 'one'), 'one/q.png') == ['q.png', 'r.png']  # read once
    assert names('one', 'a/x.png') == ['one/q.png', 'one/r.png', 'a/x.png']


def test_plan_refuses_conflicts_before_writing(tool, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ('a/x.png', 'c/x.jpg', 'c/x.png', 'c/x.jpg.png', 'vis/x.png', 'x.png',
                 'j/x.jpg'):
        _touch(tmp_path / name)

    def plan(inputs, out_dir, overlay=False):
        return tool.plan_outputs(tool.collect_images(inputs), inputs, out_dir, overlay)

    def refused(inputs, out_dir, overlay=False):
        with pytest.raises(tool.UserError) as info:
            plan(inputs, out_dir, overlay)
        return str(info.value)
    assert plan(['a'], 'out', overlay=True) == [('out/x.png', 'out/vis/x.png')]
    assert 'would both be written as' in refused(['c'], 'out')  # x.jpg.png twice
    # the label of vis/x.png is the overlay of x.png
    assert 'would both be written as' in refused(['x.png', 'vis/x.png'], 'out', True)
    assert 'overwrite the input' in refused(['a'], 'a')
    assert 'overwrite the input' in refused(['a/x.png'], 'a')
    assert 'input folder' in refused(['j'], 'j')  # j/x.png: read by the next run
    assert plan(['j/x.jpg'], 'j') == [('j/x.png', None)]  # a file input: next to it
    assert plan(['a'], 'a/pred') == [('a/pred/x.png', None)]  # below an input folder: fine
    _touch(tmp_path / 'out' / 'vis')  # a file where the overlay folder goes
    assert plan(['a'], 'out') == [('out/x.png', None)]
    assert 'not a folder' in refused(['a'], 'out', overlay=True)
    assert 'not a folder' in refused(['a'], 'out/vis')
    os.makedirs('out2/x.png')
    assert 'is a folder' in refused(['a'], 'out2')
    assert not osp.exists('out/x.png') and not osp.exists('a/pred')  # nothing written


def test_output_conflicts_exit_2_before_any_work(checkpoint, tmp_path):
    images = tmp_path / 'imgs'
    _image(images / 'x.png')
    out = tmp_path / 'out'
    _touch(out / 'vis')
    result = run_python(['tools/infer.py', DEMO, checkpoint, str(images), '--out-dir',
                         str(out), '--overlay'], timeout=300)
    assert result.returncode == 2, result.stdout + result.stderr
    assert 'Traceback' not in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert "vis' exists and is not a folder" in result.stderr
    assert sorted(os.listdir(out)) == ['vis'] and 'image(s) written' not in result.stdout


# ---------------------------------------------------------------------------------------
# one run through the adversarial inputs
# ---------------------------------------------------------------------------------------
@pytest.mark.slow
def test_adversarial_inputs_in_one_run(checkpoint, tmp_path):
    """Colliding names, symlinks, grey/RGBA/16-bit images, non-image files, an empty
    folder, a file that is not an image, images the model cannot take (two in one batch),
    mixed sizes with --batch-size 2 (windows: [e/odd 100x80, e/rgba 64x64], [e/tall,
    f/broken], [f/line, f/line2]), the output folder inside an input folder. Every label
    equals ``inference_model(model, path)`` of its own input (batch size 1)."""
    import cv2
    from PIL import Image

    from mmseg_cann.apis import inference_model, init_model
    t = tmp_path
    inputs = [_image(t / 'a' / 'x.png', seed=1), _image(t / 'b' / 'x.png', seed=2),
              _image(t / 'a' / 'y.png', seed=3), _image(t / 'a' / 'y.jpg', seed=4)]
    _image(t / 'c' / 'z.png', seed=5)
    _image(t / 'd' / 'z.png', seed=6)
    os.symlink(t / 'b' / 'x.png', t / 'c' / 'link.png')
    _image(t / 'c' / 'sub' / 'deep.png')      # subfolders are not read
    _touch(t / 'c' / 'notes.txt', b'text')     # nor files without an image suffix
    _image(t / 'e' / 'grey.png', channels=1, seed=7)
    _image(t / 'e' / 'rgba.png', channels=4, seed=8)
    _image(t / 'e' / 'deep16.png', dtype=np.uint16, seed=9)
    _image(t / 'e' / 'grey16.png', channels=1, dtype=np.uint16, seed=10)
    _image(t / 'e' / 'odd.png', hw=(100, 80), seed=11)      # not square, not x16
    _image(t / 'e' / 'tall.png', hw=(131, 50), seed=12)
    _image(t / 'f' / 'line.png', hw=(1, 300), seed=15)     # resized to 0 rows
    _image(t / 'f' / 'line2.png', hw=(1, 300), seed=16)    # the same, in the same batch
    _touch(t / 'f' / 'broken.png', b'not an image')
    os.makedirs(t / 'empty')
    out = t / 'c' / 'pred'                      # inside an input folder
    _touch(out / 'c' / 'z.png', b'an earlier result')  # not read as an input
    args = inputs + [str(t / p) for p in ('c', 'd', 'e', 'f', 'empty')]
    result = run_python(['tools/infer.py', DEMO, checkpoint, *args, '--out-dir', str(out),
                         '--overlay', '--batch-size', '2'], timeout=900)
    err = result.stderr
    assert result.returncode == 1, result.stdout + err
    assert 'Traceback' not in err
    skipped = [line for line in err.splitlines() if line.startswith('skipped ')]
    assert len(skipped) == 3, err
    for name in ('line.png', 'line2.png', 'broken.png'):
        assert sum(name in line for line in skipped) == 1, (name, skipped)
    expected = {'a/x.png': 'a/x.png', 'b/x.png': 'b/x.png', 'a/y.png': 'a/y.png.png',
                'a/y.jpg': 'a/y.jpg.png', 'c/link.png': 'c/link.png', 'c/z.png': 'c/z.png',
                'd/z.png': 'd/z.png'}
    expected.update({f'e/{n}.png': f'e/{n}.png' for n in (
        'grey', 'rgba', 'deep16', 'grey16', 'odd', 'tall')})
    assert f'{len(expected)} image(s) written' in result.stdout
    assert '3 failed' in result.stdout
    model = init_model(DEMO, checkpoint, 'cpu')
    for source, name in expected.items():
        label = Image.open(out / name)
        want = inference_model(model, str(t / source)).pred_sem_seg.data[0].numpy()
        assert label.mode == 'P' and np.array(label).shape == want.shape, name
        np.testing.assert_array_equal(np.array(label), want, err_msg=name)
        overlay = cv2.imread(str(out / 'vis' / name))
        assert overlay.shape == want.shape + (3,), name
    assert not (out / 'c' / 'sub').exists() and not (out / 'empty').exists()
    assert (out / 'c' / 'z.png').read_bytes() != b'an earlier result'
    # each result is its own image's: the two x.png give different labels
    assert not np.array_equal(np.array(Image.open(out / 'a/x.png')),
                              np.array(Image.open(out / 'b/x.png')))
