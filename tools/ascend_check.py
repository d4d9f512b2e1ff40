#!/usr/bin/env python
"""Compile every Triton kernel variant for an Ascend NPU through triton-ascend's front
end, without an NPU or CANN, and count the loads and stores it cannot vectorise.

    .venv-ascend/bin/python tools/ascend_check.py [--root DIR] [--workers N]
        [--cases TEXT] [--json OUT]

Runs in the side virtualenv ``.venv-ascend`` (``make side-envs``;
triton-ascend replaces the ``triton`` module, so it cannot share ``.venv``); it needs
only torch, numpy and triton-ascend: the package is imported from the source tree
``--root`` (default: this repository), ``kernels/`` as ``mmseg_cann.kernels``, without
installing it.

The cases of :mod:`mmseg_cann.backends.triton_aot` (the ahead-of-time GPU check's, with
32- and 64-bit offsets) are recorded with an Ascend 910B3's launch plan (40 vector
cores, looping programs), bound as triton-ascend's ``JITFunction.run`` binds them and
compiled for ``GPUTarget('npu', 'Ascend910B3', 0)`` through the ``ttir`` and
``ttadapter`` stages (:mod:`mmseg_cann.kernels.aot_ascend`; ``npubin`` needs CANN).
Printed per kernel: variants, failures, and the number of discrete-access loops
(``ExtractedLoadOrStore``: element-at-a-time memory traffic) per variant, separately
for the main-path variants (NCHW 2x upsampling, k3s2p1/k2s2 pooling). The exit status
is 1 when a variant fails to compile or exceeds the loop targets (``--max-main``,
``--max-other``), 2 on a usage error.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import sys
import time

from _common import UserError, add_debug, check_output, run

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--root', default=REPO_ROOT,
                        help='source tree whose kernels are compiled (default: %(default)s)')
    parser.add_argument('--workers', type=int, default=min(2, os.cpu_count() or 1),
                        help='compile processes (default: %(default)s)')
    parser.add_argument('--cases', metavar='TEXT',
                        help='only the cases whose label contains TEXT')
    parser.add_argument('--max-main', type=int, default=0,
                        help='most discrete-access loops a main-path variant may have '
                             '(default: %(default)s)')
    parser.add_argument('--max-other', type=int, default=2,
                        help='most discrete-access loops any other variant may have '
                             '(default: %(default)s)')
    parser.add_argument('--json', metavar='OUT', help='write the report as JSON here')
    add_debug(parser)
    args = parser.parse_args(argv)
    args.root = os.path.abspath(args.root)
    if not os.path.isfile(os.path.join(args.root, 'mmseg_cann', '__init__.py')) or \
            not os.path.isfile(os.path.join(args.root, 'kernels', '__init__.py')):
        raise UserError(f'--root {args.root!r} is not an mmseg-cann source tree '
                        '(no mmseg_cann/ and kernels/ packages)')
    if args.workers < 1:
        parser.error(f'--workers must be >= 1, got {args.workers}')
    if args.json:
        check_output(args.json, '--json')
    return args


def use_source_tree(root: str) -> None:
    """Make ``mmseg_cann`` importable from ``root`` with ``root/kernels`` as
    ``mmseg_cann.kernels`` (what setup.py maps), in this process and in worker processes.

    The package's ``__init__`` is not run: it imports the integration layers (models,
    conversion), while the check needs only the ops, backends and kernels, which need
    only torch and numpy.
    """
    os.environ.pop('TRITON_INTERPRET', None)  # the interpreter replaces @triton.jit
    for name, folder in (('mmseg_cann', os.path.join(root, 'mmseg_cann')),
                         ('mmseg_cann.kernels', os.path.join(root, 'kernels'))):
        module = sys.modules.get(name)
        if module is not None:
            if list(module.__path__) != [folder]:
                raise UserError(f'{name} is already imported from {list(module.__path__)}, '
                                f'not from --root {root!r}')
            continue
        spec = importlib.util.spec_from_file_location(
            name, os.path.join(folder, '__init__.py'), submodule_search_locations=[folder])
        sys.modules[name] = importlib.util.module_from_spec(spec)
        if name == 'mmseg_cann.kernels':  # the kernels' package docstring only
            spec.loader.exec_module(sys.modules[name])
            sys.modules['mmseg_cann'].kernels = sys.modules[name]


@dataclasses.dataclass
class Compiled:
    """One distinct variant: its result, the cases that launched it (the first one
    first), and whether any main-path case launched it."""

    result: object
    cases: list
    main: bool

    @property
    def case(self) -> str:
        return self.cases[0]


def check(root: str, workers: int, text=None):
    """Record, bind and compile every case; ``(compiled variants, case count, launch
    count)``."""
    use_source_tree(root)
    try:
        from mmseg_cann import ops
        from mmseg_cann.backends import triton_aot
        from mmseg_cann.kernels import _common, aot_ascend
    except ImportError as e:
        raise UserError(f'the kernels of --root {root!r} do not import with this triton: '
                        f'{type(e).__name__}: {e}') from e
    reason = aot_ascend.ascend_available()
    if reason is not None:
        raise UserError(f'{reason}; run with .venv-ascend/bin/python (make side-envs)')
    cases, wide = triton_aot.all_cases(), triton_aot.int64_cases()
    if text:
        cases = [c for c in cases if text in c.label]
        wide = [c for c in wide if text in c.label]
        if not cases and not wide:
            raise UserError(f'--cases: no case label contains {text!r}')
    props = _common.DeviceProps(**triton_aot.TARGET_DEVICES['npu'])
    recorded = (triton_aot.record(ops, cases, props)
                + triton_aot.record(ops, wide, props, int64=True))
    variants, cases_of, main = {}, {}, {}
    for rec in recorded:
        for item in rec.launches:
            variant = aot_ascend.bind(item.kernel, item.args, item.kwargs)
            variants.setdefault(variant.key, variant)
            labels = cases_of.setdefault(variant.key, [])
            if rec.case not in labels:
                labels.append(rec.case)
            main[variant.key] = main.get(variant.key, False) or rec.main
    results = aot_ascend.compile_all(variants.values(), workers,
                                     initializer=use_source_tree, initargs=(root,))
    compiled = [Compiled(r, cases_of[r.key], main[r.key]) for r in results]
    return compiled, len(cases) + len(wide), sum(len(r.launches) for r in recorded)


def summary(compiled, max_main: int, max_other: int):
    """Per kernel: variants, failures, discrete-access loops per variant (main path and
    other: min-max), variants over the targets."""
    rows = {}
    for c in compiled:
        r = c.result
        row = rows.setdefault(r.kernel, dict(kernel=r.kernel, variants=0, failures=0,
                                             main=[], other=[], over=0))
        row['variants'] += 1
        if r.error is not None:
            row['failures'] += 1
            continue
        row['main' if c.main else 'other'].append(r.discrete_loops)
        row['over'] += r.discrete_loops > (max_main if c.main else max_other)
    return [rows[k] for k in sorted(rows)]


def _span(values) -> str:
    if not values:
        return '-'
    lo, hi = min(values), max(values)
    return f'{lo}' if lo == hi else f'{lo}-{hi}'


def format_table(rows, compiled) -> str:
    lines = ['| kernel | variants | failures | loops per variant, main path (variants) | '
             'loops per variant, other | over target |', '|---|---|---|---|---|---|']
    for row in rows:
        lines.append(f"| {row['kernel']} | {row['variants']} | {row['failures']} | "
                     f"{_span(row['main'])} ({len(row['main'])}) | {_span(row['other'])} | "
                     f"{row['over']} |")
    for c in compiled:
        if c.result.error is not None:
            lines.append(f'\n{c.result.kernel} [{c.result.meta}]\n  first case: {c.case}\n'
                         f'  {c.result.error}')
    return '\n'.join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    start = time.perf_counter()
    compiled, ncases, nlaunches = check(args.root, args.workers, args.cases)
    seconds = time.perf_counter() - start
    rows = summary(compiled, args.max_main, args.max_other)
    failures = sum(row['failures'] for row in rows)
    over = sum(row['over'] for row in rows)
    import triton
    print(f'triton {triton.__version__}, target npu:Ascend910B3, stages ttir -> ttadapter, '
          f'source tree {args.root}')
    print(format_table(rows, compiled))
    print(f'\n{ncases} cases, {nlaunches} launches, {len(compiled)} distinct variants, '
          f'{failures} failed, {over} over the loop targets (main path <= {args.max_main}, '
          f'other <= {args.max_other}), {seconds:.1f} s with {args.workers} workers')
    if args.json:
        data = dict(ok=not failures and not over, root=args.root, triton=triton.__version__,
                    target='npu:Ascend910B3', stages=['ttir', 'ttadapter'], cases=ncases,
                    launches=nlaunches, seconds=seconds, workers=args.workers,
                    max_main=args.max_main, max_other=args.max_other, summary=rows,
                    results=[dict(kernel=c.result.kernel, meta=c.result.meta, case=c.case,
                                  cases=c.cases, main=c.main,
                                  discrete_loops=c.result.discrete_loops,
                                  error=c.result.error, seconds=c.result.seconds)
                             for c in compiled])
        with open(args.json, 'w') as f:
            json.dump(data, f, indent=1)
    return 1 if failures or over else 0


if __name__ == '__main__':
    sys.exit(run(main, 'ascend_check.py'))
