#!/usr/bin/env python
"""Write a synthetic dataset in the exact on-disk layout mmseg reads.

    python tools/make_synthetic_data.py drive data/DRIVE --num-train 16 --num-val 4
    python tools/make_synthetic_data.py cityscapes data/cityscapes --size 256 512

Datasets: cityscapes, drive, stare, chase_db1, hrf, synapse (see mmseg_cann/data/synthetic.py).
"""
from __future__ import annotations

import argparse
import sys

from _common import UserError, add_debug, check_output_dir, run


def main(argv=None) -> int:
    from mmseg_cann.data import DATASETS, make_dataset
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('dataset', choices=sorted(DATASETS))
    parser.add_argument('out_dir', help='dataset root (the config data_root)')
    parser.add_argument('--num-train', type=int, default=8)
    parser.add_argument('--num-val', type=int, default=4)
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--size', type=int, nargs=2, metavar=('H', 'W'),
                        help='image size (default: per dataset)')
    add_debug(parser)
    args = parser.parse_args(argv)
    check_output_dir(args.out_dir, 'OUT_DIR')
    if args.num_train < 1 or args.num_val < 1:
        raise UserError(f'--num-train and --num-val must be >= 1, got {args.num_train} '
                        f'{args.num_val}')
    if args.size and min(args.size) < 16:
        raise UserError(f'--size must be at least 16 16, got {args.size[0]} {args.size[1]}')
    try:
        written = make_dataset(args.dataset, args.out_dir, args.num_train, args.num_val,
                               args.seed, args.size)
    except ValueError as exc:
        parser.error(str(exc))
    for split, paths in written.items():
        print(f'{args.dataset}: wrote {len(paths)} {split} samples under {args.out_dir}')
    return 0


if __name__ == '__main__':
    sys.exit(run(main, 'make_synthetic_data'))
