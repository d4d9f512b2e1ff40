"""Ahead-of-time compilation of recorded kernel launches for Ascend NPUs through
triton-ascend's front end, without an NPU or CANN (``tools/ascend_check.py``).

triton-ascend (3.2) compiles in three stages: ``ttir`` (the AST lowered to Triton IR in
``libtriton``), ``ttadapter`` (``triton-adapter-opt``, shipped in the wheel: Triton IR to
the linalg/HIVM dialects the Ascend compiler takes) and ``npubin`` (``bishengir-compile``
from CANN). :func:`compile_variant` runs the first two. The ``ttadapter`` IR shows how
each load and store will be executed: an access whose addresses are not a contiguous
block (or a small set of them) becomes an ``scf.for`` over the block's elements marked
``ExtractedLoadOrStore`` ("discrete memory access"), element-at-a-time memory traffic on
the NPU's vector unit; :func:`count_discrete_loops` counts them.

A launch recorded by :func:`._common.launch_context` is bound as triton-ascend's own
``JITFunction.run`` binds it (``create_function_from_signature`` with the Ascend
backend's ``compute_spec_key``, then the backend's attribute descriptor: ints equal to 1
become constants, 16-divisible ints and pointers get the divisibility hint). Needs
triton-ascend, which replaces the ``triton`` module: a separate virtualenv
(``.venv-ascend``, made by ``make``).
"""
from __future__ import annotations

import importlib
import os
import re
import time
from typing import Iterable, List, Optional

import triton
from triton.backends.compiler import AttrsDescriptor, GPUTarget
from triton.compiler import ASTSource, make_backend
from triton.runtime.jit import JITFunction, create_function_from_signature

from .aot import Result, Variant, _first_lines

#: the Ascend target of the check (an Atlas 800T A2 class chip)
TARGET = GPUTarget('npu', 'Ascend910B3', 0)
#: the stages this machine can run, in order; ``npubin`` needs CANN
STAGES = ('ttir', 'ttadapter')
#: the attribute ``triton-adapter-opt`` puts on a loop that moves one element at a time
DISCRETE_MARK = 'ExtractedLoadOrStore'


def ascend_available() -> Optional[str]:
    """None when the installed ``triton`` is triton-ascend with an ``npu`` backend,
    else why not."""
    from triton.backends import backends
    if 'ascend' not in backends:
        return (f'the installed triton ({triton.__version__}) has no ascend backend '
                '(triton-ascend replaces the triton package)')
    return None


def bind(kernel, args: tuple, kwargs: dict, target: GPUTarget = TARGET) -> Variant:
    """Bind a launch ``kernel[grid](*args, **kwargs)`` for ``target`` as triton-ascend's
    ``JITFunction.run`` does (its binder, ``parse_options`` and attribute descriptor)."""
    if not isinstance(kernel, JITFunction):
        raise TypeError(f'kernel must be a triton JITFunction, got {type(kernel).__name__} '
                        '(unset TRITON_INTERPRET: the interpreter replaces @triton.jit)')
    backend = make_backend(target)
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    kwargs = dict(kwargs)
    kwargs['debug'] = kwargs.get('debug', False) or os.environ.get('TRITON_DEBUG') == '1'
    bound, sig_and_spec, _, _, _ = binder(*args, **kwargs)
    options = backend.parse_options(kwargs)
    values = tuple(bound.values())
    names = [p.name for p in kernel.params if not p.is_constexpr]
    signature = {k: ('*i8' if v == 'none' else v)
                 for k, v in zip(names, sig_and_spec[:len(names)])}
    attrs = backend.get_attrs_descriptor(kernel.params, values)
    constant_params = attrs.get_constants()
    constants = {p.name: v for v, p in zip(values, kernel.params)
                 if p.is_constexpr or p.num in constant_params or v is None}
    meta = ' '.join([f'{k}={v}' for k, v in sorted(constants.items())]
                    + [f'num_warps={options.num_warps}'])
    # constexprs by position as in :class:`.aot.Variant`; attributes as a plain dict
    # (picklable for worker processes)
    positions = {p.name: (p.num,) for p in kernel.params}
    return Variant(f'{kernel.fn.__module__}:{kernel.fn.__name__}', target, signature,
                   {positions[k]: v for k, v in constants.items()}, attrs.to_dict(),
                   dict(options.__dict__), meta)


def count_discrete_loops(ttadapter: str) -> int:
    """The number of discrete-access loops (``ExtractedLoadOrStore``) in ttadapter IR."""
    return ttadapter.count(DISCRETE_MARK)


def compile_variant(variant: Variant) -> Result:
    """Compile ``variant`` through :data:`STAGES`; ``Result.discrete_loops`` counts the
    discrete-access loops. A failure is returned in ``Result.error`` as
    ``'<stage>: <first error line>'``, not raised."""
    result = Result(variant.name, f'{variant.target.backend}:{variant.target.arch}',
                    variant.key, variant.meta)
    start = time.perf_counter()
    try:
        result.discrete_loops = count_discrete_loops(lower(variant))
    except Exception as e:  # noqa: BLE001 - every compile failure is a finding
        result.error = f"{getattr(e, 'stage', 'ttir')}: {first_error_line(e)}"
    result.seconds = time.perf_counter() - start
    return result


def lower(variant: Variant) -> str:
    """The ttadapter IR of ``variant``: what ``triton.compile`` does for the stages of
    :data:`STAGES` (no cache). An exception carries the failing stage in ``.stage``."""
    from triton._C.libtriton import ir
    module, name = variant.kernel.rsplit(':', 1)
    kernel = getattr(importlib.import_module(module), name)
    names = {p.num: p.name for p in kernel.params}
    constants = {names[k[0]]: v for k, v in variant.constexprs.items()}
    src = ASTSource(kernel, variant.signature, constants,
                    AttrsDescriptor.from_dict(variant.attrs))
    backend = make_backend(variant.target)
    options = backend.parse_options(variant.options)
    stages = {}
    backend.add_stages(stages, options)
    metadata = {'hash': src.hash(), 'target': variant.target, **options.__dict__}
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    try:
        module = src.make_ir(options, backend.get_codegen_implementation(),
                             backend.get_module_map(), context)
        for stage in STAGES:
            try:
                module = stages[stage](module, metadata)
            except Exception as e:
                e.stage = stage
                raise
    finally:
        context.disable_multithreading()
    return module


def first_error_line(e: Exception) -> str:
    """The first informative line of a compile error: the compiler's ``error:`` or
    assertion line when it printed one, else the exception's first line."""
    text = getattr(e, 'stderr', None)
    text = text.decode('utf-8', 'replace') if isinstance(text, bytes) else str(e)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for ln in lines:
        m = re.search(r'([\w.]+\.(?:cpp|h)):(\d+):.*?(Assertion .*)', ln)
        if m:  # 'BlockPtrAnalysis.cpp:959: Assertion `...' failed.'
            return f'{m.group(1)}:{m.group(2)}: {m.group(3)}'[:300]
        if re.search(r'error:|Assertion|assert', ln):
            return ln[:300]
    return f'{type(e).__name__}: {_first_lines(text, 1)}'[:300]


def compile_all(variants: Iterable[Variant], workers: int = 1, initializer=None,
                initargs: tuple = ()) -> List[Result]:
    """Compile ``variants`` in ``workers`` spawned processes (``initializer(*initargs)``
    runs in each first: it must make the kernels' modules importable), results in the
    order given."""
    variants = list(variants)
    if workers <= 1 or len(variants) < 2:
        return [compile_variant(v) for v in variants]
    import concurrent.futures
    import multiprocessing
    context = multiprocessing.get_context('spawn')
    with concurrent.futures.ProcessPoolExecutor(min(workers, len(variants)),
                                                mp_context=context, initializer=initializer,
                                                initargs=initargs) as pool:
        return list(pool.map(compile_variant, variants, chunksize=2))
