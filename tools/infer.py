#!/usr/bin/env python
"""Predict label maps for images with a converted model (mmseg's inference, CANN ops).

    python tools/infer.py CONFIG CHECKPOINT INPUT [INPUT ...] --out-dir DIR
        [--device cpu|cuda|npu] [--batch-size N] [--overlay] [--opacity A]
        [--cfg-options k=v ...] [--debug]

INPUT: image files or folders (a folder's images, sorted; its subfolders are not read).
Writes one label PNG per image (a palette PNG whose pixel values are the class ids, of
the input's height and width) and, with ``--overlay``, the image blended with the
coloured mask; where they go is :data:`OUTPUT_NAMES`. The model is built with
``mmseg_cann.apis.init_model`` (the config's ``CANNOpsHook`` settings, lean prediction:
labels without full-resolution logits; the config's test mode, ``whole`` or ``slide``).

Before any work (exit 2, one line, nothing written): a missing input, inputs without
images, a config or checkpoint that cannot be read, clashing output names, results that
would land in an input folder or overwrite an input, and an output folder that cannot be
made or written (a file where a folder must go). Per image (named on stderr in one line,
skipped, exit 1 after the others): a file that cannot be read as an image, an image the
model cannot take, a result that cannot be written. A batch (``--batch-size``) holds
consecutive images of one size; images of another size run in a batch of their own, so
the labels are those of batch size 1. The last line summarises images, failures and
seconds per image.
"""
from __future__ import annotations

import argparse
import os
import os.path as osp
import sys
import time
from collections import Counter

from _common import (UserError, add_cfg_options, add_debug, check_checkpoint,
                     check_output_dir, load_config, run)

IMAGE_SUFFIXES = ('.png', '.jpg', '.jpeg', '.bmp', '.tif', '.tiff', '.ppm', '.webp')

#: the output naming rule (``--help`` prints it)
OUTPUT_NAMES = """\
output names (DIR: --out-dir):
  DIR/REL.png per image, REL its path below the folder all inputs share (a folder
  INPUT holds its images, a file INPUT counts its own folder), suffix replaced:
    imgs/                      -> DIR/x.png, DIR/y.png
    a/x.png b/x.png a/y.png    -> DIR/a/x.png, DIR/b/x.png, DIR/a/y.png
    val/ test/                 -> DIR/val/..., DIR/test/...
  Images of one folder that share a stem keep their suffix in the name:
    a/y.png a/y.jpg            -> DIR/a/y.png.png, DIR/a/y.jpg.png
  --overlay: DIR/vis/REL.png. A file given twice is read once. Names that still clash,
  results that would go into an INPUT folder or over an input, and a file where an
  output folder must go stop the run before anything is read (exit 2).

exit status:
  0 every image written; 1 some images skipped (one line each on stderr: unreadable,
  not taken by the model, not writable), the others written; 2 nothing done (one line:
  missing input, no images, bad config/checkpoint, output conflicts)."""


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0], epilog=OUTPUT_NAMES,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('config', help='mmseg config (e.g. one of configs/)')
    parser.add_argument('checkpoint', help='checkpoint file')
    parser.add_argument('inputs', nargs='+', metavar='INPUT',
                        help='image files or folders of images (not read recursively)')
    parser.add_argument('--out-dir', required=True,
                        help='folder for the label PNGs (names: see below)')
    parser.add_argument('--device', default='cpu', choices=['cpu', 'cuda', 'npu'])
    parser.add_argument('--batch-size', type=int, default=1,
                        help='images per forward; a batch holds images of one size')
    parser.add_argument('--overlay', action='store_true',
                        help='also write image + mask blends under OUT_DIR/vis/')
    parser.add_argument('--opacity', type=float, default=0.5,
                        help='mask opacity of the overlay, in (0, 1] (default 0.5)')
    add_cfg_options(parser)
    add_debug(parser)
    args = parser.parse_args(argv)
    if args.batch_size < 1:
        parser.error(f'--batch-size must be >= 1, got {args.batch_size}')
    if not 0 < args.opacity <= 1:
        parser.error(f'--opacity must be in (0, 1], got {args.opacity}')
    return args


def collect_images(inputs):
    """The images named by ``inputs``: ``(path, folder)`` pairs, ``folder`` being the
    folder INPUT for its images and the file's own folder for a file INPUT. A folder
    gives its files with an image suffix, sorted (subfolders are not read); a file is
    taken as given (read errors come later, per image). A file named twice (the same
    absolute path) is kept once, where it first appears.

    Raises:
        FileNotFoundError: an input path does not exist (named in the message).
    """
    images, seen = [], set()
    for path in inputs:
        if osp.isdir(path):
            folder = path
            files = [osp.join(path, name) for name in sorted(os.listdir(path))
                     if name.lower().endswith(IMAGE_SUFFIXES)
                     and not osp.isdir(osp.join(path, name))]
        elif osp.isfile(path):
            folder, files = osp.dirname(path) or os.curdir, [path]
        else:
            raise FileNotFoundError(f'input {path!r} does not exist (give image files or '
                                    'folders of images)')
        for file in files:
            key = osp.normcase(osp.abspath(file))
            if key not in seen:
                seen.add(key)
                images.append((file, folder))
    return images


def output_names(images):
    """The output name (relative path ending ``.png``) of each ``(path, folder)`` of
    :func:`collect_images`: the path below the folder all those folders share, with the
    suffix replaced by ``.png``, or appended where images of one folder share a stem
    (``y.png``, ``y.jpg`` -> ``y.png.png``, ``y.jpg.png``). Distinct paths give distinct
    names except in contrived cases (``y.jpg.png`` beside ``y.jpg`` and ``y.png``) that
    :func:`plan_outputs` refuses."""
    root = osp.commonpath([osp.abspath(folder) for _, folder in images])
    rels = [osp.relpath(osp.abspath(path), root) for path, _ in images]
    stems = [osp.splitext(rel)[0] for rel in rels]
    shared = Counter(osp.normcase(stem) for stem in stems)
    return [(rel if shared[osp.normcase(stem)] > 1 else stem) + '.png'
            for rel, stem in zip(rels, stems)]


def plan_outputs(images, inputs, out_dir: str, overlay: bool):
    """``(label path, overlay path or None)`` per image, checked before anything is
    written or read: no two results share a path or need a path as file and folder, no
    result overwrites an input or lands in an INPUT folder (it would be read as an image
    next time), and no existing file or folder blocks a result.

    Raises:
        UserError: the first conflict, naming the paths.
    """
    names = output_names(images)
    plan = [(osp.join(out_dir, name), osp.join(out_dir, 'vis', name) if overlay else None)
            for name in names]
    owners = {}  # absolute output path -> the input it is the result of
    for (source, _), outputs in zip(images, plan):
        for out in filter(None, outputs):
            key = osp.normcase(osp.abspath(out))
            if key in owners:
                raise UserError(f'{owners[key]!r} and {source!r} would both be written as '
                                f'{out!r}; give them in separate runs (other --out-dir)')
            owners[key] = source
    top = osp.normcase(osp.abspath(out_dir))
    folders = {top}
    for key in owners:
        parent = osp.dirname(key)
        while parent.startswith(top) and parent not in folders:
            folders.add(parent)
            parent = osp.dirname(parent)
    both = sorted(folders & owners.keys())
    if both:
        raise UserError(f'the result of {owners[both[0]]!r} would be written as '
                        f'{both[0]!r}, a folder other results go into; give them in '
                        'separate runs')
    input_files = {osp.realpath(path) for path, _ in images}
    input_folders = {osp.realpath(path) for path in inputs if osp.isdir(path)}
    for key, source in owners.items():
        real = osp.realpath(key)
        if real in input_files:
            raise UserError(f'--out-dir {out_dir!r}: the result of {source!r} would '
                            f'overwrite the input {real!r}')
        if osp.dirname(real) in input_folders:
            raise UserError(f'--out-dir {out_dir!r}: results would be written into the '
                            f'input folder {osp.dirname(real)!r} (and read as images by '
                            'the next run); choose another --out-dir')
    for folder in sorted(folders):
        if osp.lexists(folder) and not osp.isdir(folder):
            what = '--out-dir' if folder == top else 'output folder'
            raise UserError(f'{what} {folder!r} exists and is not a folder')
    for key, source in owners.items():
        if osp.isdir(key):
            raise UserError(f'the result of {source!r} goes to {key!r}, which is a folder')
        if osp.lexists(key) and not os.access(key, os.W_OK):
            raise UserError(f'the result of {source!r} goes to {key!r}, which is not '
                            'writable')
    return plan


def make_output_folders(out_dir: str, plan) -> None:
    """Create the folders of ``plan`` (after :func:`plan_outputs`); UserError if one
    cannot be made or written."""
    check_output_dir(out_dir, '--out-dir')
    for folder in sorted({osp.dirname(p) for outputs in plan for p in outputs if p}):
        check_output_dir(folder, 'output folder')


def palette_for(model, num_classes: int):
    """The dataset's palette, or a fixed pseudo-random one, as ``num_classes`` RGB rows."""
    import numpy as np
    palette = (getattr(model, 'dataset_meta', None) or {}).get('palette')
    if palette is None or len(palette) < num_classes:
        rng = np.random.RandomState(42)
        palette = rng.randint(0, 256, size=(max(num_classes, 1), 3))
    return np.asarray(palette, dtype=np.uint8)[:num_classes]


def read_image(path: str):
    """The image as mmseg's ``LoadImageFromFile`` reads it (``mmcv`` ``'color'``: BGR,
    8 bits, grey expanded, alpha dropped); ValueError if it is not a readable image."""
    import mmcv
    image = mmcv.imread(path)
    if image is None:
        raise ValueError('not a readable image')
    return image


def write_labels(path: str, labels, palette) -> None:
    """A palette ("P" mode) PNG whose pixel values are the class ids."""
    import numpy as np
    from PIL import Image
    if labels.max() > 255:
        raise ValueError(f'{path}: more than 256 classes do not fit a palette PNG')
    image = Image.fromarray(labels.astype(np.uint8), mode='P')
    flat = np.zeros((256, 3), dtype=np.uint8)
    flat[:len(palette)] = palette
    image.putpalette(flat.ravel().tolist())
    image.save(path)


def write_overlay(path: str, image_bgr, labels, palette, opacity: float) -> None:
    """The image blended with the coloured mask (``opacity`` of the mask), as a PNG."""
    import mmcv
    import numpy as np
    color = palette[labels][..., ::-1]  # RGB palette -> BGR like the image
    blend = (image_bgr * (1 - opacity) + color * opacity).round().clip(0, 255)
    if not mmcv.imwrite(blend.astype(np.uint8), path, auto_mkdir=False):
        raise OSError(f'cannot write {path!r}')


def same_size_groups(loaded):
    """``(index, image)`` pairs grouped by image size, in order of first appearance."""
    groups = {}
    for index, image in loaded:
        groups.setdefault(image.shape[:2], []).append((index, image))
    return list(groups.values())


def predict_group(model, group):
    """``(index, image, SegDataSample or the exception)`` per image of ``group``: one
    batch, or each image alone when the batch fails (so one image the model cannot take
    does not cost the others)."""
    from mmseg_cann.apis import inference_model
    try:
        results = inference_model(model, [image for _, image in group])
    except Exception as exc:  # noqa: BLE001  (reported per image by the caller)
        if len(group) == 1:
            return [(group[0][0], group[0][1], exc)]
        return [item for one in group for item in predict_group(model, [one])]
    return [(index, image, result) for (index, image), result in zip(group, results)]


def failure_line(path: str, exc: BaseException, debug: bool) -> str:
    """``PATH: Type: first line of the message`` (with ``--debug`` the traceback is
    printed first)."""
    if debug:
        import traceback
        traceback.print_exception(type(exc), exc, exc.__traceback__)
    text = str(exc).strip()
    return f'{path}: {type(exc).__name__}: {text.splitlines()[0] if text else ""}'


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        images = collect_images(args.inputs)
    except FileNotFoundError as exc:
        raise UserError(str(exc)) from exc
    if not images:
        raise UserError(f'no images ({", ".join(IMAGE_SUFFIXES)}) in {args.inputs}')
    plan = plan_outputs(images, args.inputs, args.out_dir, args.overlay)
    load_config(args.config, args.cfg_options)
    check_checkpoint(args.checkpoint)
    make_output_folders(args.out_dir, plan)
    from mmengine.utils import ProgressBar

    from mmseg_cann.apis import init_model
    model = init_model(args.config, args.checkpoint, device=args.device,
                       cfg_options=args.cfg_options)
    palette = palette_for(model, model.decode_head.out_channels)
    failures, done, start = [], 0, time.perf_counter()
    progress = ProgressBar(len(images))
    for first in range(0, len(images), args.batch_size):
        loaded = []
        for index in range(first, min(first + args.batch_size, len(images))):
            try:
                loaded.append((index, read_image(images[index][0])))
            except Exception as exc:  # noqa: BLE001  (unreadable: skip it, go on)
                failures.append(failure_line(images[index][0], exc, args.debug))
                progress.update()
        for group in same_size_groups(loaded):
            for index, image, result in predict_group(model, group):
                path, (label_path, overlay_path) = images[index][0], plan[index]
                try:
                    if isinstance(result, BaseException):
                        raise result
                    labels = result.pred_sem_seg.data[0].cpu().numpy()
                    write_labels(label_path, labels, palette)
                    if overlay_path:
                        write_overlay(overlay_path, image, labels, palette, args.opacity)
                    done += 1
                except Exception as exc:  # noqa: BLE001  (this image only)
                    failures.append(failure_line(path, exc, args.debug))
                progress.update()
    seconds = time.perf_counter() - start
    print()
    for line in failures:
        print(f'skipped {line}', file=sys.stderr)
    print(f'infer: {done} image(s) written to {args.out_dir}, {len(failures)} failed, '
          f'{seconds / max(done, 1):.3f} s per image')
    return 1 if failures else 0


if __name__ == '__main__':
    sys.exit(run(main, 'infer'))
