#!/usr/bin/env python
"""Train a segmentor with mmengine's Runner, mmseg-cann style.

    python tools/train.py CONFIG [--work-dir D] [--data-root DIR] [--amp] [--resume]
                          [--cfg-options k=v ...] [--launcher none|pytorch]

Behaves like mmseg's tools/train.py, plus: imports mmseg_cann (CANN modules, hook,
checkpoint loading under torch >= 2.6); ``--data-root`` points every dataloader's dataset
(wrapped ones too) at DIR; on a machine without a GPU/NPU an AmpOptimWrapper is swapped
for OptimWrapper (AMP needs an accelerator; the config's CANN precision settings still
apply). Distributed: ``torchrun --nproc-per-node N tools/train.py CONFIG --launcher pytorch``
(without a GPU/NPU: gloo, CPU DDP, BN for SyncBN).
"""
from __future__ import annotations

import argparse
import sys

from _common import (add_debug, add_runner_args, build_runner_config, check_data,
                     close_distributed, parse_runner_args, run)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='Train a segmentor')
    parser.add_argument('config', help='train config file path')
    parser.add_argument('--work-dir', help='the dir to save logs and models')
    parser.add_argument('--resume', action='store_true', default=False,
                        help='resume from the latest checkpoint in the work dir')
    parser.add_argument('--amp', action='store_true', default=False,
                        help='enable automatic mixed precision (AmpOptimWrapper)')
    add_runner_args(parser)
    add_debug(parser)
    return parse_runner_args(parser, argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    from mmengine.runner import Runner

    cfg = build_runner_config(args)
    check_data(cfg, ('train_dataloader', 'val_dataloader'))
    cfg.resume = args.resume
    runner = Runner.from_cfg(cfg)
    try:
        runner.train()
    finally:
        close_distributed()
    return 0


if __name__ == '__main__':
    sys.exit(run(main, 'train'))
