#!/usr/bin/env python
"""Predict label maps for images with a converted model (mmseg's inference, CANN ops).

    python tools/infer.py CONFIG CHECKPOINT INPUT [INPUT ...] --out-dir DIR
        [--device cpu|cuda|npu] [--batch-size N] [--overlay] [--opacity A]
        [--cfg-options k=v ...]

INPUT: image files or directories (their images, sorted). Writes ``DIR/<stem>.png`` per
image: a palette PNG whose pixel values are the class ids, of the input's height and
width; with ``--overlay`` also ``DIR/vis/<stem>.png``, the image blended with the
coloured mask. The model is built with ``mmseg_cann.apis.init_model`` (the config's
``CANNOpsHook`` settings, lean prediction: labels without full-resolution logits; the
config's test mode, ``whole`` or ``slide``). A missing input path stops the run before
anything is written (exit 2); an image that cannot be read is named, skipped, and the
run exits 1 after the others. The last line summarises images, failures and seconds per
image.
"""
from __future__ import annotations

import argparse
import os
import os.path as osp
import sys
import time

from _common import (UserError, add_cfg_options, add_debug, check_checkpoint,
                     check_output_dir, load_config, run)

IMAGE_SUFFIXES = ('.png', '.jpg', '.jpeg', '.bmp', '.tif', '.tiff', '.ppm', '.webp')


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('config', help='mmseg config (e.g. one of configs/)')
    parser.add_argument('checkpoint', help='checkpoint file')
    parser.add_argument('inputs', nargs='+', metavar='INPUT', help='image files or folders')
    parser.add_argument('--out-dir', required=True, help='folder for the label PNGs')
    parser.add_argument('--device', default='cpu', choices=['cpu', 'cuda', 'npu'])
    parser.add_argument('--batch-size', type=int, default=1)
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
    """The image files named by ``inputs`` (files as given, folders' images sorted).

    Raises:
        FileNotFoundError: an input path does not exist (named in the message).
    """
    images = []
    for path in inputs:
        if osp.isdir(path):
            images += sorted(osp.join(path, f) for f in os.listdir(path)
                             if f.lower().endswith(IMAGE_SUFFIXES))
        elif osp.isfile(path):
            images.append(path)
        else:
            raise FileNotFoundError(f'input {path!r} does not exist (give image files or '
                                    'folders of images)')
    return images


def palette_for(model, num_classes: int):
    """The dataset's palette, or a fixed pseudo-random one, as ``num_classes`` RGB rows."""
    import numpy as np
    palette = (getattr(model, 'dataset_meta', None) or {}).get('palette')
    if palette is None or len(palette) < num_classes:
        rng = np.random.RandomState(42)
        palette = rng.randint(0, 256, size=(max(num_classes, 1), 3))
    return np.asarray(palette, dtype=np.uint8)[:num_classes]


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
    import mmcv
    import numpy as np
    color = palette[labels][..., ::-1]  # RGB palette -> BGR like the image
    blend = (image_bgr * (1 - opacity) + color * opacity).round().clip(0, 255)
    mmcv.imwrite(blend.astype(np.uint8), path)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        images = collect_images(args.inputs)
    except FileNotFoundError as exc:
        raise UserError(str(exc)) from exc
    if not images:
        raise UserError(f'no images ({", ".join(IMAGE_SUFFIXES)}) in {args.inputs}')
    load_config(args.config, args.cfg_options)
    check_checkpoint(args.checkpoint)
    check_output_dir(args.out_dir, '--out-dir')
    import mmcv
    from mmengine.utils import ProgressBar

    from mmseg_cann.apis import inference_model, init_model
    model = init_model(args.config, args.checkpoint, device=args.device,
                       cfg_options=args.cfg_options)
    palette = palette_for(model, model.decode_head.out_channels)
    os.makedirs(args.out_dir, exist_ok=True)
    if args.overlay:
        os.makedirs(osp.join(args.out_dir, 'vis'), exist_ok=True)
    failures, done, start = [], 0, time.perf_counter()
    progress = ProgressBar(len(images))
    for first in range(0, len(images), args.batch_size):
        batch, arrays = [], []
        for path in images[first:first + args.batch_size]:
            try:
                image = mmcv.imread(path)
                if image is None:
                    raise ValueError('not a readable image')
                arrays.append(image)
                batch.append(path)
            except Exception as exc:  # unreadable or not an image: skip it, go on
                failures.append(f'{path}: {type(exc).__name__}: {exc}')
                progress.update()
        if not batch:
            continue
        results = inference_model(model, arrays)
        for path, image, result in zip(batch, arrays, results):
            labels = result.pred_sem_seg.data[0].cpu().numpy()
            stem = osp.splitext(osp.basename(path))[0]
            write_labels(osp.join(args.out_dir, stem + '.png'), labels, palette)
            if args.overlay:
                write_overlay(osp.join(args.out_dir, 'vis', stem + '.png'), image, labels,
                              palette, args.opacity)
            done += 1
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
