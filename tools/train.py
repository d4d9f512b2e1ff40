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
import os
import os.path as osp
import sys

def parse_args(argv=None):
    from mmengine.config import DictAction
    parser = argparse.ArgumentParser(description='Train a segmentor')
    parser.add_argument('config', help='train config file path')
    parser.add_argument('--work-dir', help='the dir to save logs and models')
    parser.add_argument('--data-root', help='dataset root for every dataloader')
    parser.add_argument('--resume', action='store_true', default=False,
                        help='resume from the latest checkpoint in the work dir')
    parser.add_argument('--amp', action='store_true', default=False,
                        help='enable automatic mixed precision (AmpOptimWrapper)')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override settings in the config, key=value')
    parser.add_argument('--launcher', choices=['none', 'pytorch', 'slurm', 'mpi'],
                        default='none', help='job launcher')
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)
    args = parser.parse_args(argv)
    if 'LOCAL_RANK' not in os.environ:
        os.environ['LOCAL_RANK'] = str(args.local_rank)
    return args

def build_config(args):
    """The config with the command line applied (shared with tools/test.py)."""
    from mmengine.config import Config

    import mmseg_cann  # noqa: F401  (registers modules and hooks)
    from mmseg_cann.utils.config import (set_data_root, use_cpu_distributed,
                                         use_cpu_optim_wrapper)

    cfg = Config.fromfile(args.config)
    cfg.launcher = args.launcher
    if args.cfg_options is not None:
        cfg.merge_from_dict(args.cfg_options)
    if args.work_dir is not None:
        cfg.work_dir = args.work_dir
    elif cfg.get('work_dir', None) is None:
        cfg.work_dir = osp.join('./work_dirs', osp.splitext(osp.basename(args.config))[0])
    if getattr(args, 'data_root', None):
        set_data_root(cfg, args.data_root)
    if getattr(args, 'amp', False):
        wrapper = cfg.optim_wrapper.get('type', 'OptimWrapper')
        if wrapper == 'OptimWrapper':
            cfg.optim_wrapper.type = 'AmpOptimWrapper'
            cfg.optim_wrapper.loss_scale = 'dynamic'
        elif wrapper != 'AmpOptimWrapper':
            raise SystemExit(f'--amp is only supported with OptimWrapper, got {wrapper}')
    if use_cpu_optim_wrapper(cfg):
        print('no GPU/NPU here: AmpOptimWrapper replaced by OptimWrapper '
              '(the CANN precision settings still apply)')
    if use_cpu_distributed(cfg):
        print('no GPU/NPU here: distributed run on CPU processes (gloo, BN for SyncBN)')
    return cfg

def main(argv=None) -> int:
    args = parse_args(argv)
    from mmengine.runner import Runner

    cfg = build_config(args)
    cfg.resume = args.resume
    runner = Runner.from_cfg(cfg)
    runner.train()
    return 0

if __name__ == '__main__':
    sys.exit(main())
