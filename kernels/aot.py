"""Ahead-of-time compilation of recorded kernel launches, for GPUs this machine lacks.

A launch recorded by :func:`._common.launch_context` (``record=[...]``) is bound with
Triton's own JIT binder for a target (``create_function_from_signature`` and
``JITFunction._pack_args``, what ``JITFunction.run`` does before compiling): ints equal
to 1 become constants, ints and pointers divisible by 16 get alignment hints, pointers
on ROCm get the 2 GB buffer hint, so each :class:`Variant` is what a real launch on such
a device would compile. :func:`compile_variant` compiles it with ``triton.compile`` (the
cubin through the ``ptxas`` shipped in the wheel, the hsaco through Triton's linker)
and reads its resource usage: ``ptxas -v`` registers and spill bytes on CUDA, the VGPR
count and spill counts of the AMDGPU metadata on ROCm.

Compiled kernels land in Triton's on-disk cache (``TRITON_CACHE_DIR``, keyed by the
kernel source hash, the specialisation and the options), so a second check of unchanged
kernels compiles nothing. The CUDA resource usage is read from the ``ptxas -v`` log of
Triton's own ``ptxas`` call (the flags the cubin was made with) and stored beside the
cubin in that cache entry (:data:`USAGE_FILE`), so neither a cold nor a warm check runs
``ptxas`` a second time. Written against triton 3.6 (``requirements/tests.txt``); the
binder API is internal to Triton, so another version is refused.

Kernels must be real ``JITFunction`` objects: this module is used in a process where
``TRITON_INTERPRET`` is unset (the interpreter replaces every ``@triton.jit``).
"""
from __future__ import annotations

import contextlib
import dataclasses
import importlib
import io
import json
import os
import re
import subprocess
import tempfile
import time
from typing import Dict, Iterable, List, Optional, Tuple

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, make_backend
from triton.runtime.cache import get_cache_manager
from triton.runtime.jit import JITFunction, create_function_from_signature

try:  # Triton's settings object (newer releases; older ones read the environment)
    from triton import knobs
except ImportError:
    knobs = None

#: the targets of the check: H100/H200 (sm_90) and MI300 (gfx942)
TARGETS: Dict[str, GPUTarget] = {
    'cuda': GPUTarget('cuda', 90, 32),
    'hip': GPUTarget('hip', 'gfx942', 64),
}
#: the Triton release whose binder this module calls
TRITON_VERSION = '3.6.'
#: the file in a CUDA kernel's Triton cache entry that records its ``ptxas -v`` usage
USAGE_FILE = 'mmseg_cann_ptxas_usage.json'


@dataclasses.dataclass
class Variant:
    """One compilation: a kernel bound for a target as a real launch binds it."""

    kernel: str          # 'module:name', importable in a worker process
    target: GPUTarget
    signature: Dict[str, str]
    constexprs: dict     # {(argument index,): value}
    attrs: dict          # {(argument index,): [[attribute, value], ...]}
    options: dict        # the backend's parsed options (``options.__dict__``)
    meta: str = ''       # the constants by name, for reports


    @property
    def name(self) -> str:
        return self.kernel.rsplit(':', 1)[1]

    @property
    def key(self) -> str:
        """Identifies the compiled binary: equal keys compile to the same code."""
        return repr((self.kernel, self.target, sorted(self.signature.items()),
                     sorted(self.constexprs.items()), sorted(self.attrs.items()),
                     sorted((k, repr(v)) for k, v in self.options.items())))


@dataclasses.dataclass
class Result:
    """What compiling a :class:`Variant` gave."""

    kernel: str
    target: str
    key: str
    meta: str = ''
    registers: Optional[int] = None   # per thread (CUDA) / VGPRs (ROCm)
    spills: Optional[int] = None      # spill bytes (CUDA: stores + loads) / spill count
    error: Optional[str] = None
    seconds: float = 0.0
    discrete_loops: Optional[int] = None  # Ascend: loops moving one element at a time


def target_name(target: GPUTarget) -> str:
    """``'cuda:90'``, ``'hip:gfx942'``."""
    return f'{target.backend}:{target.arch}'


def check_triton() -> None:
    """Refuse a Triton whose binder this module was not written against (an older
    release such as triton-ascend 3.2 imports this module but binds with
    :mod:`.aot_ascend`)."""
    if knobs is None or not triton.__version__.startswith(TRITON_VERSION):
        raise RuntimeError(f'the ahead-of-time check binds launches with the JIT binder of '
                           f'triton {TRITON_VERSION}x; installed: {triton.__version__}')


# ------------------------------------------------------------------------------ binding
_BINDERS: Dict[Tuple[int, GPUTarget], tuple] = {}


def bind(kernel, args: tuple, kwargs: dict, target: GPUTarget) -> Variant:
    """Bind a launch ``kernel[grid](*args, **kwargs)`` for ``target`` with Triton's JIT
    binder, exactly as ``JITFunction.run`` does on a device of that target."""
    if not isinstance(kernel, JITFunction):
        raise TypeError(f'kernel must be a triton JITFunction, got {type(kernel).__name__} '
                        '(unset TRITON_INTERPRET: the interpreter replaces @triton.jit)')
    if not isinstance(target, GPUTarget):
        raise TypeError(f'target must be a triton GPUTarget, got {type(target).__name__}')
    check_triton()
    cached = _BINDERS.get((id(kernel), target))
    if cached is None or cached[0] is not kernel:  # one binder per kernel and target
        backend = make_backend(target)
        cached = (kernel, backend, create_function_from_signature(
            kernel.signature, kernel.params, backend))
        _BINDERS[(id(kernel), target)] = cached
    _, backend, binder = cached
    kwargs = dict(kwargs)
    # the two options JITFunction.run adds before binding
    kwargs['debug'] = kwargs.get('debug', kernel.debug) or knobs.runtime.debug
    kwargs['instrumentation_mode'] = knobs.compilation.instrumentation_mode
    bound, specialization, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = kernel._pack_args(
        backend, kwargs, bound, specialization, options)
    meta = ' '.join([f'{kernel.arg_names[path[0]]}={value}'
                     for path, value in sorted(constexprs.items())]
                    + [f'num_warps={options.num_warps}'])
    return Variant(f'{kernel.fn.__module__}:{kernel.fn.__name__}', target, signature,
                   constexprs, attrs, dict(options.__dict__), meta)


# ---------------------------------------------------------------------------- compiling
def compile_variant(variant: Variant) -> Result:
    """Compile ``variant`` (as ``JITFunction._do_compile`` would) and read its resource
    usage; a compile error is returned in :attr:`Result.error`, not raised."""
    module, name = variant.kernel.rsplit(':', 1)
    kernel = getattr(importlib.import_module(module), name)
    src = ASTSource(kernel, variant.signature, variant.constexprs, variant.attrs)
    result = Result(variant.name, target_name(variant.target), variant.key, variant.meta)
    start = time.perf_counter()
    try:
        if variant.target.backend == 'cuda':
            log = io.StringIO()
            with knobs.nvidia.scope(), contextlib.redirect_stdout(log):
                knobs.nvidia.dump_ptxas_log = True   # Triton prints its ptxas -v log
                compiled = triton.compile(src, target=variant.target,
                                          options=variant.options)
            result.registers, result.spills = cuda_usage(compiled, log.getvalue(),
                                                         variant.target.arch)
        else:
            compiled = triton.compile(src, target=variant.target, options=variant.options)
            result.registers, result.spills = amdgcn_usage(compiled.asm['amdgcn'])
    except Exception as e:  # noqa: BLE001 - every compile failure is a finding
        result.error = f'{type(e).__name__}: {_first_lines(str(e))}'
    result.seconds = time.perf_counter() - start
    return result


def compile_all(variants: Iterable[Variant], workers: int = 1) -> List[Result]:
    """Compile ``variants`` in ``workers`` processes (spawned: Triton and torch are not
    fork-safe once used), results in the order given."""
    variants = list(variants)
    if workers <= 1 or len(variants) < 2:
        return [compile_variant(v) for v in variants]
    import concurrent.futures
    import multiprocessing
    context = multiprocessing.get_context('spawn')
    with concurrent.futures.ProcessPoolExecutor(min(workers, len(variants)),
                                                mp_context=context,
                                                initializer=_worker_init) as pool:
        return list(pool.map(compile_variant, variants, chunksize=4))


def _worker_init() -> None:
    os.environ.pop('TRITON_INTERPRET', None)


def _first_lines(text: str, n: int = 12) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return '\n'.join(lines[:n])


# ------------------------------------------------------------------------ resource usage
def ptxas_usage(ptx: str, arch: int) -> Tuple[int, int]:
    """``(registers, spill bytes)`` of a PTX kernel from ``ptxas -v`` (the wheel's ptxas,
    the flags Triton compiles with)."""
    from triton.backends.nvidia.compiler import get_ptxas, sm_arch_from_capability
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, 'kernel.ptx')
        with open(src, 'w') as f:
            f.write(ptx)
        proc = subprocess.run([get_ptxas(arch).path, '-lineinfo', '-v',
                               f'--gpu-name={sm_arch_from_capability(arch)}', src,
                               '-o', os.path.join(tmp, 'kernel.cubin')],
                              capture_output=True, text=True, check=True)
    return parse_ptxas_log(proc.stderr + proc.stdout)


def cuda_usage(compiled, log: str, arch: int) -> Tuple[int, int]:
    """``(registers, spill bytes)`` of a compiled CUDA kernel: from ``log``, the ``ptxas
    -v`` log Triton printed while compiling it, recorded in its cache entry; on a cache
    hit (no log) from that record, or from :func:`ptxas_usage` where there is none."""
    cache = get_cache_manager(compiled.hash)
    if 'Used ' in log:
        usage = parse_ptxas_log(log)
    else:
        path = cache.get_file(USAGE_FILE)
        if path is not None:
            with open(path) as f:
                return tuple(json.load(f))
        usage = ptxas_usage(compiled.asm['ptx'], arch)
    cache.put(json.dumps(list(usage)), USAGE_FILE, binary=False)
    return usage


def parse_ptxas_log(log: str) -> Tuple[int, int]:
    """``(registers, spill store + load bytes)`` from a ``ptxas -v`` log of one kernel."""
    regs = re.search(r'Used (\d+) registers', log)
    spill = re.search(r'(\d+) bytes spill stores, (\d+) bytes spill loads', log)
    if regs is None or spill is None:
        raise ValueError(f'log is not a ptxas -v log of a kernel: {log[:200]!r}')
    return int(regs.group(1)), int(spill.group(1)) + int(spill.group(2))


def amdgcn_usage(amdgcn: str) -> Tuple[int, int]:
    """``(VGPRs, spilled VGPRs + SGPRs)`` from the AMDGPU metadata of an amdgcn listing."""
    def field(name):
        m = re.search(rf'\.{name}:\s+(\d+)', amdgcn)
        if m is None:
            raise ValueError(f'amdgcn has no .{name} metadata')
        return int(m.group(1))
    return field('vgpr_count'), field('vgpr_spill_count') + field('sgpr_spill_count')


# ------------------------------------------------------------------------- availability
@triton.jit
def _probe_kernel(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1.0, mask=offs < n)


def unavailable_reason(target: GPUTarget) -> Optional[str]:
    """None when this machine can compile for ``target``, else why not (the backend is
    not in this Triton build, or its toolchain fails on a trivial kernel)."""
    from triton.backends import backends
    package = {'cuda': 'nvidia', 'hip': 'amd'}.get(target.backend, target.backend)
    if package not in backends:
        return f'no {package} backend in this triton build (triton.backends.{package})'
    import torch
    try:
        variant = bind(_probe_kernel, (torch.empty(16), 16), dict(BLOCK=16), target)
    except Exception as e:  # noqa: BLE001
        return f'{type(e).__name__}: {_first_lines(str(e), 3)}'
    result = compile_variant(variant)
    return None if result.error is None else result.error
