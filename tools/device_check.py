#!/usr/bin/env python
"""Check the Triton kernels for real devices: compile them ahead of time, or (on a
device) measure them.

    python tools/device_check.py --aot [--targets cuda hip] [--workers N] [--json OUT]
    python tools/device_check.py --device cuda|npu|cpu [--quick] [--json OUT]

``--aot`` needs no GPU: the public ops run on CPU tensors with ``backend='triton'``,
every kernel launch is recorded and compiled for ``cuda:90`` (H100/H200) and
``hip:gfx942`` (MI300) as a real launch would specialise it, and a table of kernels,
variants, registers and spills is printed; the exit status is non-zero on any compile
error or spill (:mod:`mmseg_cann.backends.triton_aot`). A target this machine cannot
compile for is listed as skipped. ``--cases TEXT`` keeps only the cases whose label
contains ``TEXT``.

``--device`` is what a machine with a GPU or an NPU runs in one command: the parity
check on the device (``check_parity``: every op against the float64 reference), the
Triton kernel tests on the device (compiled, not interpreted), and the benchmark (eager,
``torch.compile``, native, fused and Triton rows; fraction of copy bandwidth), then one
JSON summary (``--json``) with the headline figures: Triton vs native time per kernel,
fraction of copy bandwidth, fused-op speedups. Without such a device it skips with a
message and exit status 0. ``--device cpu`` runs the same parts on the CPU, the kernels
under Triton's interpreter (how CI checks the tool end to end); ``--quick`` keeps each
part small. Exit status 1 when parity or the kernel tests fail.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Optional

from _common import UserError, add_debug, check_output, run

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument('--aot', action='store_true',
                      help='compile every kernel variant for the GPU targets, no GPU needed')
    mode.add_argument('--device', choices=['cuda', 'npu', 'cpu'],
                      help='parity, kernel tests and benchmark on this device (skipped '
                           'when absent; cpu: the kernels under the interpreter)')
    parser.add_argument('--quick', action='store_true',
                        help='--device: float32 parity, a subset of the kernel tests, the '
                             'smoke benchmark')
    parser.add_argument('--targets', nargs='+', default=['cuda', 'hip'],
                        choices=['cuda', 'hip'], help='--aot targets (default: %(default)s)')
    parser.add_argument('--workers', type=int, default=None,
                        help='--aot compile processes (default: CPU count, at most 4)')
    parser.add_argument('--cases', metavar='TEXT',
                        help='--aot: only the cases whose label contains TEXT')
    parser.add_argument('--json', metavar='OUT', help='write the report as JSON here')
    add_debug(parser)
    args = parser.parse_args(argv)
    if args.json:
        check_output(args.json, '--json')
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
            raise UserError(f'--cases: no case label contains {args.cases!r}')
    report = triton_aot.run_check(ops, args.targets, args.workers, cases, wide)
    print(triton_aot.format_report(report))
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(triton_aot.report_json(report), f, indent=1)
    return 0 if report.ok else 1


def device_available(name: str) -> Optional[str]:
    """None when ``name`` can run here, else why not."""
    import torch
    if name == 'cuda' and not torch.cuda.is_available():
        return 'no CUDA device is available'
    if name == 'npu':
        try:
            import torch_npu  # noqa: F401  (registers the npu device)
        except Exception as exc:  # torch_npu fails to import without the CANN runtime
            return f'torch_npu is not usable ({type(exc).__name__}: {exc})'
        if not torch.npu.is_available():
            return 'no NPU is available'
    return None


#: benchmark cases of the device run (the fused-op and kernel figures)
DEVICE_CASES = ['bilinear2x_fp32_nchw', 'bilinear2x_fp32_cl', 'nearest2x_fp32',
                'bilinear8x_logits', 'upsample_add', 'upsample_argmax_19', 'maxpool_3_2_1',
                'avgpool_3_2_1']


def _parity(device, quick: bool) -> dict:
    import torch

    from mmseg_cann.analysis import parity
    dtypes = [torch.float32] if quick else [torch.float32, torch.float16, torch.bfloat16]
    results = parity.run_all(parity.build_cases(quick=quick), torch.device(device), dtypes)
    return parity.summarize(results)


def _kernel_tests(device: str, quick: bool) -> dict:
    """The Triton kernel tests with their tensors on ``device``; (interpreter on cpu)."""
    env = {k: v for k, v in os.environ.items() if k != 'TRITON_INTERPRET'}
    env['MMSEG_CANN_KERNEL_DEVICE'] = device
    cmd = [sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider',
           'tests/kernels/test_upsample_kernels.py', 'tests/kernels/test_pooling_kernels.py']
    if quick:
        cmd += ['-k', 'float32 and not channels_last']
    proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True)
    lines = [ln for ln in proc.stdout.splitlines() if ' passed' in ln or ' failed' in ln]
    return dict(returncode=proc.returncode, summary=lines[-1].strip('= ') if lines else '',
                output_tail=proc.stdout[-2000:] if proc.returncode else '')


def _benchmark(device: str, quick: bool) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, 'bench.json')
        cases = ['smoke'] if quick else DEVICE_CASES
        cmd = [sys.executable, os.path.join(REPO_ROOT, 'tools', 'benchmark.py'), '--device',
               device, '--cases', *cases, '--repeats', '3' if quick else '10', '--json', out]
        proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True)
        if proc.returncode:
            return dict(returncode=proc.returncode, error=proc.stderr[-2000:])
        with open(out) as f:
            data = json.load(f)
    return dict(returncode=0, copy_gb_s=data['copy_gb_s'], rows=data['rows'],
                headline=headline(data['rows']))


def headline(rows) -> dict:
    """Per case: Triton and the fused backend relative to native/eager, and the Triton
    kernel's fraction of copy bandwidth (where those rows exist)."""
    out = {}
    for case in sorted({r['case'] for r in rows}):
        by = {r['impl']: r for r in rows if r['case'] == case}
        base = by.get('mmseg_cann native') or by.get('eager')
        entry = {}
        for label, key in (('mmseg_cann triton', 'triton'), ('mmseg_cann fused', 'fused')):
            if label in by and base:
                entry[f'{key}_speedup_vs_native'] = base['ms'] / by[label]['ms']
                if by[label].get('copy_fraction') is not None:
                    entry[f'{key}_copy_fraction'] = by[label]['copy_fraction']
        if entry:
            out[case] = entry
    return out


def run_device(args) -> int:
    """Parity, kernel tests and benchmark on the device; skipped cleanly without one."""
    why = device_available(args.device)
    summary = dict(device=args.device, quick=args.quick)
    if why is not None:
        print(f'device_check: --device {args.device} skipped: {why}')
        summary['skipped'] = why
        _write(args.json, summary)
        return 0
    start = time.time()
    summary['parity'] = _parity(args.device, args.quick)
    print(f'parity: {summary["parity"]["total"]} cases, {summary["parity"]["failed"]} failed')
    summary['kernel_tests'] = _kernel_tests(args.device, args.quick)
    print(f'Triton kernel tests on {args.device}: {summary["kernel_tests"]["summary"]}')
    summary['benchmark'] = _benchmark(args.device, args.quick)
    for case, figures in summary['benchmark'].get('headline', {}).items():
        print(f'benchmark {case}: ' + ', '.join(f'{k} {v:.2f}' for k, v in figures.items()))
    summary['seconds'] = round(time.time() - start, 1)
    ok = (summary['parity']['failed'] == 0 and summary['kernel_tests']['returncode'] == 0
          and summary['benchmark']['returncode'] == 0)
    summary['ok'] = ok
    _write(args.json, summary)
    print(f'device_check: {"passed" if ok else "FAILED"} in {summary["seconds"]} s')
    return 0 if ok else 1


def _write(path, summary) -> None:
    if path:
        with open(path, 'w') as f:
            json.dump(summary, f, indent=1)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.aot:
        # real kernels, not the interpreter's (it replaces @triton.jit when set)
        os.environ.pop('TRITON_INTERPRET', None)
        return run_aot(args)
    return run_device(args)


if __name__ == '__main__':
    sys.exit(run(main, 'device_check'))
