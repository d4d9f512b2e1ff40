#!/usr/bin/env python
"""Profile the upsample and pooling call sites of an mmseg model, converted to mmseg_cann.

Builds CONFIG's segmentor (random weights), converts it with ``mmseg_cann.convert_model``,
runs ``encode_decode`` (and optionally the backward) under the PyTorch profiler and
reports every upsample/pool call site: module path (or the module and line that called
``resize``), shapes, dtype, the plan the NPU planner picks, time, share of the whole
forward (and backward), bytes moved and achieved bandwidth. Answers "which upsample in
my decoder is the bottleneck".

    python tools/profile_ops.py configs/cityscapes/CONFIG.py --shape 256 512 --iters 3
    python tools/profile_ops.py CONFIG --device npu --backward --json ops.json --plot ops.png
    python tools/profile_ops.py CONFIG --assume-chip A2    # CPU run, plans for an A2 NPU
"""
from __future__ import annotations

import argparse
import json
import sys

from _common import (add_debug, check_output, check_shape, load_config,
                     required_multiple, resolve_device, run)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('config', help='mmseg config file (mmseg:: bases work)')
    parser.add_argument('--shape', nargs=2, type=int, metavar=('H', 'W'),
                        help="input size (default: the config's crop_size, else 512 1024)")
    parser.add_argument('--device', default='cpu', choices=['cpu', 'cuda', 'npu'])
    parser.add_argument('--iters', type=int, default=3, help='profiled iterations (default 3)')
    parser.add_argument('--batch', type=int, default=1, help='batch size (default 1)')
    parser.add_argument('--backward', action='store_true', help='also profile the backward')
    parser.add_argument('--json', metavar='OUT', help='write the report as JSON')
    parser.add_argument('--plot', metavar='OUT.png', help='write a bar chart')
    parser.add_argument('--assume-chip', choices=['A1', '310P', 'A2', 'A3', '310B', '950'],
                        help='show plans for this Ascend generation instead of the device')
    add_debug(parser)
    args = parser.parse_args(argv)
    if args.iters < 1 or args.batch < 1:
        parser.error('--iters and --batch must be >= 1')
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    from mmseg_cann.backends.npu_device import DeviceCaps
    from mmseg_cann.analysis import op_profile

    cfg = load_config(args.config)
    for path, what in ((args.json, '--json'), (args.plot, '--plot')):
        if path:
            check_output(path, what)
    device = resolve_device(args.device)
    shape = args.shape
    if shape is None:
        crop = cfg.get('crop_size', None)
        shape = list(crop) if crop else [512, 1024]
    check_shape(shape, required_multiple(cfg.model))
    model = op_profile.build_converted_model(args.config, tuple(shape), str(device))
    caps = DeviceCaps.npu(args.assume_chip) if args.assume_chip else None
    report = op_profile.profile_model(model, tuple(shape), str(device), iters=args.iters,
                                      batch=args.batch, backward=args.backward, caps=caps)
    report['config'] = args.config
    print(op_profile.format_report(report))
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(report, f, indent=1)
        print(f'wrote {args.json}')
    if args.plot:
        op_profile.plot_report(report, args.plot)
        print(f'wrote {args.plot}')
    return 0


if __name__ == '__main__':
    sys.exit(run(main, 'profile_ops'))
