#!/usr/bin/env python
"""Evaluate a checkpoint with mmengine's Runner, mmseg-cann style.

    python tools/test.py CONFIG CHECKPOINT [--work-dir D] [--data-root DIR] [--out DIR]
                         [--show-dir DIR] [--cfg-options k=v ...] [--launcher none|pytorch]

Like mmseg's tools/test.py: ``--out`` writes the predicted label maps as PNG files,
``--show-dir`` writes image / prediction visualisations; ``--data-root`` as in train.py.
"""
from __future__ import annotations

import argparse
import sys

from _common import (add_debug, add_runner_args, build_runner_config, check_checkpoint,
                     check_config, check_data, check_output_dir, close_distributed,
                     parse_runner_args, run)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='Test (and evaluate) a segmentor')
    parser.add_argument('config', help='test config file path')
    parser.add_argument('checkpoint', help='checkpoint file')
    parser.add_argument('--work-dir', help='the dir to save the evaluation metrics')
    parser.add_argument('--out', help='directory for the predicted label maps (PNG)')
    parser.add_argument('--show-dir', help='directory for visualisations')
    add_runner_args(parser)
    add_debug(parser)
    return parse_runner_args(parser, argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    from mmengine.runner import Runner

    check_config(args.config)  # the config, then the checkpoint, before any data
    check_checkpoint(args.checkpoint)
    for folder in (args.out, args.show_dir):
        if folder:
            check_output_dir(folder, '--out' if folder == args.out else '--show-dir')
    cfg = build_runner_config(args)
    check_data(cfg, ('test_dataloader',))
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
    try:
        runner.test()
    finally:
        close_distributed()
    return 0


if __name__ == '__main__':
    sys.exit(run(main, 'test'))
