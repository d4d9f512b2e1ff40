#!/usr/bin/env python
"""Evaluate a checkpoint with mmengine's Runner, mmseg-cann style.

    python tools/test.py CONFIG CHECKPOINT [--work-dir D] [--data-root DIR] [--out DIR]
                         [--show-dir DIR] [--cfg-options k=v ...] [--launcher none|pytorch]

Like mmseg's tools/test.py: ``--out`` writes the predicted label maps as PNG files,
``--show-dir`` writes image / prediction visualisations; ``--data-root`` as in train.py.
"""
from __future__ import annotations

import argparse
import os
import os.path as osp
import sys

def parse_args(argv=None):
    from mmengine.config import DictAction
    parser = argparse.ArgumentParser(description='Test (and evaluate) a segmentor')
    parser.add_argument('config', help='test config file path')
    parser.add_argument('checkpoint', help='checkpoint file')
    parser.add_argument('--work-dir', help='the dir to save the evaluation metrics')
    parser.add_argument('--data-root', help='dataset root for every dataloader')
    parser.add_argument('--out', help='directory for the predicted label maps (PNG)')
    parser.add_argument('--show-dir', help='directory for visualisations')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override settings in the config, key=value')
    parser.add_argument('--launcher', choices=['none', 'pytorch', 'slurm', 'mpi'],
                        default='none', help='job launcher')
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)
    args = parser.parse_args(argv)
    if 'LOCAL_RANK' not in os.environ:
        os.environ['LOCAL_RANK'] = str(args.local_rank)
    return args

def main(argv=None) -> int:
    args = parse_args(argv)
    from mmengine.runner import Runner

    from train import build_config  # tools/ is on sys.path when run as a script

    cfg = build_config(args)
    cfg.load_from = args.checkpoint
    if args.show_dir:
        visualization = cfg.default_hooks.visualization
        visualization['draw'] = True
        visualization['interval'] = 1
        cfg.visualizer['save_dir'] = args.show_dir
    if args.out:
        cfg.test_evaluator['output_dir'] = args.out
        cfg.test_evaluator['keep_results'] = True
    runner = Runner.from_cfg(cfg)
    runner.test()
    return 0

if __name__ == '__main__':
    sys.exit(main())
