#!/usr/bin/env python
"""Check that mmseg_cann's ops match PyTorch semantics on a device.

Runs every op, mode and ``align_corners`` setting over the awkward and typical shapes
on the chosen device, compares each result with the float64 reference computed on CPU,
prints a table and exits non-zero on any failure.

    python tools/check_parity.py                         # CPU, float32/float16/bfloat16
    python tools/check_parity.py --device cuda --dtype float32 float16 --json parity.json
    python tools/check_parity.py --device npu            # on an Ascend machine (torch_npu)
    python tools/check_parity.py --quick --assume-chip A2   # CPU run, plus the A2 plans

On ``--device npu`` the ops run through the NPU call planner (``backend='npu'``) and a
``plan`` column shows each case's plan (call form -> kernel [fallback: reason]).
``--assume-chip`` adds the plan column for an assumed Ascend generation without
changing what runs.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time

import torch
from _common import resolve_device

DTYPES = {'float64': torch.float64, 'float32': torch.float32, 'float16': torch.float16,
          'bfloat16': torch.bfloat16}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--device', default='cpu', choices=['cpu', 'cuda', 'npu'])
    parser.add_argument('--dtype', nargs='+', default=['float32', 'float16', 'bfloat16'],
                        choices=sorted(DTYPES), help='dtypes to test (default: %(default)s)')
    parser.add_argument('--json', metavar='OUT', help='write every result as JSON here')
    parser.add_argument('--quick', action='store_true',
                        help='awkward shapes only (no typical shapes or scale factors)')
    parser.add_argument('--failures-only', action='store_true',
                        help='print only failing rows (the summary is always printed)')
    parser.add_argument('--assume-chip', choices=['A1', '310P', 'A2', 'A3', '310B'],
                        help='show the plans for this Ascend generation (runs unchanged)')
    return parser.parse_args(argv)


def plan_reporter(device: torch.device, assume_chip=None):
    """``plan_fn`` for ``parity.run_all``: the NPU plan of each case, or None."""
    if device.type != 'npu' and assume_chip is None:
        return None
    from mmseg_cann.analysis.npu_calls import plan_for_call
    from mmseg_cann.backends.npu_device import DeviceCaps, device_caps
    caps = DeviceCaps.npu(assume_chip) if assume_chip else device_caps(device)
    return lambda case, x: plan_for_call(case.op, x, case.kwargs, caps).describe()


def main(argv=None) -> int:
    args = parse_args(argv)
    from mmseg_cann.analysis import parity

    device = resolve_device(args.device, 'check_parity')
    dtypes = [DTYPES[d] for d in args.dtype]
    cases = parity.build_cases(quick=args.quick)
    start = time.perf_counter()
    op_kwargs = dict(backend='npu') if device.type == 'npu' else None
    results = parity.run_all(cases, device, dtypes, op_kwargs=op_kwargs,
                             plan_fn=plan_reporter(device, args.assume_chip))
    elapsed = time.perf_counter() - start
    print(parity.format_table(results, failures_only=args.failures_only))
    summary = parity.summarize(results)
    print()
    print(f'device={device} dtypes={",".join(args.dtype)} cases={summary["total"]} '
          f'failed={summary["failed"]} ({elapsed:.1f} s)')
    for group, stats in summary['groups'].items():
        print(f'  {group:32s} cases={stats["cases"]:4d} failed={stats["failed"]:3d} '
              f'max abs err={stats["max_abs_err"]:.3g}')
    print(f'  nearest index rules seen: {", ".join(summary["nearest_rules_seen"]) or "-"}')
    if args.json:
        with open(args.json, 'w') as f:
            json.dump({'device': str(device), 'dtypes': args.dtype, 'summary': summary,
                       'results': [dataclasses.asdict(r) for r in results]}, f, indent=1,
                      default=str)
        print(f'wrote {args.json}')
    print('PARITY OK' if summary['failed'] == 0 else 'PARITY FAILED')
    return 0 if summary['failed'] == 0 else 1


if __name__ == '__main__':
    sys.exit(main())
