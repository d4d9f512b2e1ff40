#!/usr/bin/env python
"""The end-to-end demo: synthetic DRIVE data -> UNet with CANN ops -> evaluation -> PNG.

    python tools/demo.py [--work-dir work_dirs/demo] [--data-root data/synthetic_drive]
                         [--iters 300] [--num-train 20] [--num-val 5]

1. writes a DRIVE-like dataset in DRIVE's on-disk layout (tools/make_synthetic_data.py);
2. trains configs/medical/unet-s5-d16_fcn_cann_1xb4-300iter_synthetic-drive-64x64.py
   through mmengine's Runner on the CPU; the config's CANNOpsHook converts the model
   (its report is printed);
3. evaluates (mIoU, mDice) and compares with an all-background prediction;
4. saves image | ground truth | prediction side by side as a PNG.
Exits non-zero if the model does not clearly beat the all-background prediction.
"""
from __future__ import annotations

import argparse
import os
import os.path as osp
import sys
import time

import numpy as np
from _common import UserError, add_debug, check_config, check_output_dir, run

CONFIG = 'configs/medical/unet-s5-d16_fcn_cann_1xb4-300iter_synthetic-drive-64x64.py'
PALETTE = np.array([[0, 0, 0], [255, 255, 255]], np.uint8)  # background, vessel


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--config', default=CONFIG)
    parser.add_argument('--work-dir', default='work_dirs/demo')
    parser.add_argument('--data-root', default='data/synthetic_drive')
    parser.add_argument('--iters', type=int, default=300)
    parser.add_argument('--num-train', type=int, default=20)
    parser.add_argument('--num-val', type=int, default=5)
    parser.add_argument('--seed', type=int, default=0)
    add_debug(parser)
    args = parser.parse_args(argv)
    if args.iters < 1 or args.num_train < 1 or args.num_val < 1:
        raise UserError('--iters, --num-train and --num-val must be >= 1')
    check_output_dir(args.work_dir, '--work-dir')
    check_output_dir(args.data_root, '--data-root')
    return args


def trivial_scores(ann_paths):
    """mIoU and mDice (percent) of predicting background everywhere."""
    import cv2
    counts = np.zeros(2)
    for path in ann_paths:
        label = cv2.imread(path, cv2.IMREAD_UNCHANGED)
        counts += [(label == 0).sum(), (label == 1).sum()]
    total = counts.sum()
    iou = np.array([counts[0] / total, 0.0])          # background: TP=bg, union=all
    dice = np.array([2 * counts[0] / (counts[0] + total), 0.0])
    return 100 * iou.mean(), 100 * dice.mean()


def save_side_by_side(runner, out_path, max_rows=4):
    """Run the trained model on validation images; write image | GT | prediction rows."""
    import cv2
    import torch
    rows = []
    runner.model.eval()
    with torch.no_grad():
        for batch in runner.val_dataloader:
            for sample in runner.model.test_step(batch):
                image = cv2.imread(sample.img_path)
                gt = sample.gt_sem_seg.data[0].cpu().numpy()
                pred = sample.pred_sem_seg.data[0].cpu().numpy()
                h, w = image.shape[:2]
                panels = [image] + [cv2.resize(PALETTE[np.clip(m, 0, 1)], (w, h),
                                               interpolation=cv2.INTER_NEAREST)
                                    for m in (gt, pred)]
                rows.append(np.concatenate(panels, axis=1))
                if len(rows) == max_rows:
                    break
            if len(rows) == max_rows:
                break
    grid = np.concatenate(rows, axis=0)
    grid = cv2.resize(grid, None, fx=2, fy=2, interpolation=cv2.INTER_NEAREST)
    os.makedirs(osp.dirname(out_path) or '.', exist_ok=True)
    cv2.imwrite(out_path, grid)


def main(argv=None) -> int:
    args = parse_args(argv)
    from mmengine.runner import Runner

    import mmseg_cann
    from mmseg_cann.data import make_dataset
    from mmseg_cann.utils.config import set_data_root

    start = time.time()
    written = make_dataset('drive', args.data_root, args.num_train, args.num_val, args.seed)
    print(f'[demo] synthetic DRIVE: {len(written["training"])} training and '
          f'{len(written["validation"])} validation images in {args.data_root}')

    cfg = check_config(args.config)
    set_data_root(cfg, args.data_root)
    cfg.work_dir = args.work_dir
    cfg.randomness = dict(seed=args.seed)
    cfg.train_cfg.max_iters = cfg.train_cfg.val_interval = args.iters
    cfg.param_scheduler[0]['end'] = args.iters
    cfg.default_hooks.checkpoint.interval = args.iters
    runner = Runner.from_cfg(cfg)
    runner.train()  # validates once at the end

    hub = runner.message_hub
    miou, mdice = hub.get_scalar('val/mIoU').current(), hub.get_scalar('val/mDice').current()
    ann_dir = osp.join(args.data_root, 'annotations', 'validation')
    base_miou, base_mdice = trivial_scores(
        [osp.join(ann_dir, f) for f in sorted(os.listdir(ann_dir))])
    png = osp.join(args.work_dir, 'demo_predictions.png')
    save_side_by_side(runner, png)

    report = mmseg_cann.convert.unwrap_model(runner.model).cann_conversion_report
    print('\n[demo] converter report')
    print(report)
    print(f'\n[demo] validation: mIoU {miou:.2f}  mDice {mdice:.2f}   '
          f'(all-background prediction: mIoU {base_miou:.2f}  mDice {base_mdice:.2f})')
    print(f'[demo] image | ground truth | prediction: {png}')
    print(f'[demo] done in {time.time() - start:.0f} s')
    if mdice < base_mdice + 10:
        print('[demo] FAILED: the model does not clearly beat the all-background prediction')
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(run(main, 'demo'))
