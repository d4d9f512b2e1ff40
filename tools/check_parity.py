#!/usr/bin/env python
"""Check that mmseg_cann's ops match PyTorch semantics on a device.

Runs every op, mode and ``align_corners`` setting over the awkward and typical shapes
on the chosen device, compares each result with the float64 reference computed on CPU,
prints a table and exits non-zero on any failure.

    python tools/check_parity.py                         # CPU, float32/float16/bfloat16
    python tools/check_parity.py --device cuda --dtype float32 float16 --json parity.json
    python tools/check_parity.py --device npu            # on an Ascend machine (torch_npu)
    python tools/check_parity.py --device npu --trace --trace-dir traces   # verify the plans
    python tools/check_parity.py --quick --assume-chip A2   # CPU run, plus the A2 plans

On ``--device npu`` the ops run through the NPU call planner (``backend='npu'``) and a
``plan`` column shows each case's plan (call form -> kernel [fallback: reason]); for max
pooling with indices the kernel is the one the device's indices reveal (an int8 mask:
aclnnMaxPool2dWithMask; int32 indices: aclnnMaxPool2dWithIndices). ``--trace`` records one
``torch_npu`` profiler trace per case (``ProfilerActivity.NPU``), adds the kernels that
ran and flags plans whose predicted kernels differ (``trace`` column; the count is in the
summary; mismatches do not fail the run). ``--assume-chip`` adds the plan column for an
assumed Ascend generation without changing what runs.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time

import torch
from _common import add_debug, check_output, resolve_device, run

DTYPES = {'float64': torch.float64, 'float32': torch.float32, 'float16': torch.float16,
          'bfloat16': torch.bfloat16}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--device', default='cpu', choices=['cpu', 'cuda', 'npu'])
    parser.add_argument('--dtype', nargs='+', default=['float32', 'float16', 'bfloat16'],
                        choices=sorted(DTYPES), help='dtypes to test (default: %(default)s)')
    parser.add_argument('--json', metavar='OUT', help='write every result as JSON here')
    parser.add_argument('--quick', action='store_true',
                        help='awkward shapes only (no typical shapes, scale factors or '
                             "precision='input' average pooling)")
    parser.add_argument('--failures-only', action='store_true',
                        help='print only failing rows (the summary is always printed)')
    parser.add_argument('--assume-chip', choices=['A1', '310P', 'A2', 'A3', '310B', '950'],
                        help='show the plans for this Ascend generation (runs unchanged)')
    parser.add_argument('--trace', action='store_true',
                        help='record a torch_npu profiler trace per case and check the '
                             'kernels that ran against the plans (needs --device npu)')
    parser.add_argument('--trace-dir', metavar='DIR',
                        help='where the traces go (implies --trace; default: a new '
                             'temporary folder)')
    add_debug(parser)
    args = parser.parse_args(argv)
    args.trace = args.trace or bool(args.trace_dir)
    if args.json:
        check_output(args.json, '--json')
    if args.trace and args.device != 'npu':
        parser.error('--trace needs --device npu (the torch_npu profiler records NPU kernels)')
    return args


def plan_reporter(device: torch.device, assume_chip=None):
    """``plan_fn`` for ``parity.run_all``: the NPU plan of each case, or None."""
    if device.type != 'npu' and assume_chip is None:
        return None
    from mmseg_cann.analysis.npu_calls import plan_for_call
    from mmseg_cann.backends.npu_device import DeviceCaps, device_caps
    caps = DeviceCaps.npu(assume_chip) if assume_chip else device_caps(device)
    return lambda case, x: plan_for_call(case.op, x, case.call_kwargs, caps)


def make_tracer(device: torch.device, trace_dir=None):
    """The profiler tracer of ``--trace`` (traces under ``trace_dir`` or a temporary
    folder)."""
    from mmseg_cann.analysis.npu_trace import NpuTracer
    out_dir = trace_dir or tempfile.mkdtemp(prefix='mmseg_cann_traces_')
    os.makedirs(out_dir, exist_ok=True)
    return NpuTracer(out_dir, device=device)


def main(argv=None) -> int:
    args = parse_args(argv)
    from mmseg_cann.analysis import parity

    device = resolve_device(args.device)
    dtypes = [DTYPES[d] for d in args.dtype]
    cases = parity.build_cases(quick=args.quick)
    start = time.perf_counter()
    op_kwargs = dict(backend='npu') if device.type == 'npu' else None
    tracer = make_tracer(device, args.trace_dir) if args.trace else None
    results = parity.run_all(cases, device, dtypes, op_kwargs=op_kwargs,
                             plan_fn=plan_reporter(device, args.assume_chip), tracer=tracer)
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
    if tracer is not None:
        print(f'  traced cases: {summary["traced"]}, plans whose predicted kernels differ '
              f'from the trace: {summary["trace_mismatches"]} (traces in {tracer.out_dir})')
    if args.json:
        with open(args.json, 'w') as f:
            json.dump({'device': str(device), 'dtypes': args.dtype, 'summary': summary,
                       'results': [dataclasses.asdict(r) for r in results]}, f, indent=1,
                      default=str)
        print(f'wrote {args.json}')
    print('PARITY OK' if summary['failed'] == 0 else 'PARITY FAILED')
    return 0 if summary['failed'] == 0 else 1


if __name__ == '__main__':
    sys.exit(run(main, 'check_parity'))
