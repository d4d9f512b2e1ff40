#!/usr/bin/env python
"""CPU seconds per CUDA variant of the ahead-of-time check, cold and warm Triton cache:
``kernels.aot.compile_variant`` (the resource usage from the ``ptxas -v`` log of
Triton's own ptxas call, recorded in the cache entry) against the former way
(``triton.compile``, then ``ptxas -v`` run again on the PTX), in one process.

    python tools/_bench_aot.py [--variants N] [--seed S]

Records the check's cases for ``cuda:90`` (``mmseg_cann.backends.triton_aot``), binds
them, draws ``N`` distinct variants and compiles each four times, alternating which way
goes first: both ways cold (each with its own empty cache folder), then both warm. CPU
time is this process's plus its finished children's (ptxas), so other load on the
machine does not count. The two ways must report the same registers and spills.
"""
from __future__ import annotations

import argparse
import importlib
import os
import random
import resource
import sys
import tempfile
import time


def cpu_seconds() -> float:
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def variants(n: int, seed: int) -> list:
    from mmseg_cann import ops
    from mmseg_cann.backends import triton_aot
    from mmseg_cann.kernels import _common, aot
    target = aot.TARGETS['cuda']
    props = _common.DeviceProps(**triton_aot.TARGET_DEVICES['cuda'])
    recorded = (triton_aot.record(ops, triton_aot.all_cases(), props)
                + triton_aot.record(ops, triton_aot.int64_cases(), props, int64=True))
    found = {}
    for rec in recorded:
        for item in rec.launches:
            variant = aot.bind(item.kernel, item.args, item.kwargs, target)
            found.setdefault(variant.key, variant)
    return random.Random(seed).sample(sorted(found.values(), key=lambda v: v.key), n)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--variants', type=int, default=24)
    parser.add_argument('--seed', type=int, default=0)
    args = parser.parse_args(argv)
    os.environ.pop('TRITON_INTERPRET', None)
    import triton
    from triton import knobs
    from triton.compiler import ASTSource

    from mmseg_cann.kernels import aot

    def former(v):
        kernel = getattr(importlib.import_module(v.kernel.rsplit(':', 1)[0]), v.name)
        compiled = triton.compile(ASTSource(kernel, v.signature, v.constexprs, v.attrs),
                                  target=v.target, options=v.options)
        return aot.ptxas_usage(compiled.asm['ptx'], v.target.arch)

    def current(v):
        result = aot.compile_variant(v)
        assert result.error is None, result.error
        return result.registers, result.spills

    chosen = variants(args.variants, args.seed)
    ways = [('former', tempfile.mkdtemp(), former), ('current', tempfile.mkdtemp(), current)]
    with tempfile.TemporaryDirectory() as warmup:   # imports and Triton's own key, once
        knobs.cache.dir = warmup
        current(chosen[0])
    totals = {}
    for i, v in enumerate(chosen):
        usage = set()
        for phase in ('cold', 'warm'):
            for name, folder, compile_ in (ways if i % 2 == 0 else ways[::-1]):
                knobs.cache.dir = folder
                start = cpu_seconds()
                usage.add(compile_(v))
                totals[name, phase] = totals.get((name, phase), 0.0) + cpu_seconds() - start
        assert len(usage) == 1, (v.name, v.meta, usage)
    n = len(chosen)
    print(f'{n} cuda:90 variants (seed {args.seed}), triton {triton.__version__}; CPU s per '
          'variant (process + ptxas)')
    print('| cache | former (compile + ptxas -v again) | current (Triton\'s ptxas log) | ratio |')
    print('|---|---:|---:|---:|')
    for phase in ('cold', 'warm'):
        a, b = totals['former', phase] / n, totals['current', phase] / n
        print(f'| {phase} | {a:.3f} | {b:.3f} | {b / a:.2f} |')
    return 0


if __name__ == '__main__':
    sys.exit(main())
