#!/usr/bin/env python
"""Check the Triton kernels for real devices: compile them ahead of time, or (on a
device) measure them.

    python tools/device_check.py --aot [--targets cuda hip] [--workers N] [--json OUT]
    python tools/device_check.py --device cuda|npu

``--aot`` needs no GPU: the public ops run on CPU tensors with ``backend='triton'``,
every kernel launch is recorded and compiled for ``cuda:90`` (H100/H200) and
``hip:gfx942`` (MI300) as a real launch would specialise it, and a table of kernels,
variants, registers and spills is printed; the exit status is non-zero on any compile
error or spill (:mod:`mmseg_cann.backends.triton_aot`). A target this machine cannot
compile for is listed as skipped. ``--cases TEXT`` keeps only the cases whose label
contains ``TEXT``.

``--device`` measures the kernels on a device (Triton vs native time, fraction of copy
bandwidth); it skips with a message, exit status 0, when no such device exists. The
measurements themselves are not implemented yet.
"""
from __future__ import annotations

import argparse
import json
import os
import sys


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument('--aot', action='store_true',
                      help='compile every kernel variant for the GPU targets, no GPU needed')
    mode.add_argument('--device', choices=['cuda', 'npu'],
                      help='measure the kernels on this device (skipped when absent)')
    parser.add_argument('--targets', nargs='+', default=['cuda', 'hip'],
                        choices=['cuda', 'hip'], help='--aot targets (default: %(default)s)')
    parser.add_argument('--workers', type=int, default=None,
                        help='--aot compile processes (default: CPU count, at most 4)')
    parser.add_argument('--cases', metavar='TEXT',
                        help='--aot: only the cases whose label contains TEXT')
    parser.add_argument('--json', metavar='OUT', help='write the --aot report as JSON here')
    args = parser.parse_args(argv)
    if args.workers is not None and args.workers < 1:
        parser.error(f'--workers must be >= 1, got {args.workers}')
    return args


def run_aot(args) -> int:
    """The ahead-of-time compile check; 0 when every variant compiled without spills."""
    from mmseg_cann import ops
    from mmseg_cann.backends import triton_aot
    cases = wide = None
    if args.cases:
        cases = [c for c in triton_aot.all_cases() if args.cases in c.label]
        wide = [c for c in triton_aot.int64_cases() if args.cases in c.label]
        if not cases and not wide:
            raise SystemExit(f'device_check: no case label contains {args.cases!r}')
    report = triton_aot.run_check(ops, args.targets, args.workers, cases, wide)
    print(triton_aot.format_report(report))
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(triton_aot.report_json(report), f, indent=1)
    return 0 if report.ok else 1


def run_device(name: str) -> int:
    """Measurements on a device: skipped cleanly where there is none."""
    import torch
    if name == 'cuda' and not torch.cuda.is_available():
        print('device_check: --device cuda skipped: no CUDA device is available')
        return 0
    if name == 'npu':
        try:
            import torch_npu  # noqa: F401  (registers the npu device)
            available = torch.npu.is_available()
        except Exception as exc:  # torch_npu fails to import without the CANN runtime
            print(f'device_check: --device npu skipped: torch_npu is not usable '
                  f'({type(exc).__name__}: {exc})')
            return 0
        if not available:
            print('device_check: --device npu skipped: no NPU is available')
            return 0
    print(f'device_check: --device {name}: the measurements are not implemented yet')
    return 2


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.aot:
        # real kernels, not the interpreter's (it replaces @triton.jit when set)
        os.environ.pop('TRITON_INTERPRET', None)
        return run_aot(args)
    return run_device(args.device)


if __name__ == '__main__':
    sys.exit(main())
