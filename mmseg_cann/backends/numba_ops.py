"""Parallel numba CPU kernels of the ``'fast'`` backend (:mod:`.fast`): bilinear and
nearest upsampling (forward; bilinear backward in gather form), max pooling with
PyTorch's indices and average pooling, for float32 NCHW and NHWC (channels_last) arrays.

What makes them fast (docs/fused_ops.md, "backend='fast'"):

* **Huge pages for fresh outputs.** Writing a freshly allocated output costs page faults,
  on the development machine about 3x the time of writing into touched memory (a 256 MB
  ``torch.empty(...).fill_`` takes 130 ms against 40 ms with huge pages). Large outputs
  are allocated by :func:`empty` with ``madvise(MADV_HUGEPAGE)`` on their pages, what
  PyTorch's own allocator does with ``THP_MEM_ALLOC_ENABLE=1``.
* **Row-buffered separable interpolation** (the structure of
  :func:`.numba_cpu.upsample_add_into`): each low-resolution row is interpolated along W
  once into a per-thread slot (two slots: the rows one output row needs differ by at most
  one), and every output row is the lerp of two slots, written once.
* **Unconditional stores.** Running maxima use an explicit ``select`` (no masked stores).

Arithmetic: bilinear uses the taps of :func:`mmseg_cann.core.taps.linear_taps` with the
fused multiply-adds of :mod:`.numba_cpu` (``fma(t0, w0, t1 * w1)`` along W, then along H);
the gather-form backward sums, per input element, the output gradients that read it in a
fixed order (first along H, then along W): deterministic, no atomics. Max pooling scans
each window row by row as PyTorch does (the first maximum wins, a NaN replaces any value:
the last NaN wins) starting from PyTorch's default index; average pooling sums each window
row by row from 0 and divides by the divisor, as PyTorch does.

Kernels take NumPy views of C-contiguous arrays: NCHW ``(N, C, H, W)`` or NHWC
``(N, H, W, C)`` (a channels_last tensor permuted). They live in :mod:`.numba_kernels`,
compiled on first use and cached on disk by numba for later processes.
"""
from __future__ import annotations

import ctypes
import ctypes.util
from functools import lru_cache

import numpy as np
import torch

from . import numba_cpu

#: max pooling's NCHW kernel carries indices as float32: exact for planes up to this size
MAX_POOL_PLANE = 1 << 24
#: outputs of at least this many bytes get huge pages (large enough to be an mmap of
#: their own in glibc, whose mmap threshold grows to at most 32 MB)
HUGE_PAGE_MIN_BYTES = 32 << 20
_HUGE_PAGE = 2 << 20
_MADV_HUGEPAGE = 14


@lru_cache(maxsize=1)
def _madvise():
    """libc's ``madvise``, or None where it cannot be loaded (non-Linux)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library('c') or 'libc.so.6', use_errno=True)
        fn = libc.madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    fn.restype = ctypes.c_int
    return fn


def empty(shape, dtype=torch.float32, memory_format=torch.contiguous_format) -> torch.Tensor:
    """``torch.empty`` whose whole 2 MB pages are advised as transparent huge pages when
    it is large (:data:`HUGE_PAGE_MIN_BYTES`); the advice is a hint: where it fails
    (another OS, THP disabled) the tensor is the same, only slower to fill."""
    out = torch.empty(shape, dtype=dtype, memory_format=memory_format)
    nbytes = out.numel() * out.element_size()
    madvise = _madvise() if nbytes >= HUGE_PAGE_MIN_BYTES else None
    if madvise is not None:
        start = -(-out.data_ptr() // _HUGE_PAGE) * _HUGE_PAGE
        length = (out.data_ptr() + nbytes - start) // _HUGE_PAGE * _HUGE_PAGE
        if length > 0:
            madvise(start, length, _MADV_HUGEPAGE)
    return out


def available() -> bool:
    """Whether the kernels can run here: numba installed, and not a process forked after
    numba's (not fork-safe) OpenMP pool started (:func:`.numba_cpu.forked_after_use`)."""
    return numba_cpu.available() and not numba_cpu.forked_after_use()


def _jobs(n_parallel: int, rows: int, threads: int) -> int:
    """Rows per job: at least ``4 * threads`` jobs over ``n_parallel`` planes/images."""
    per_plane = max(1, -(-4 * threads // max(1, n_parallel)))
    return max(1, -(-rows // per_plane))


@lru_cache(maxsize=1)
def _kernels():
    """``(numba, module of the kernels)``; compiles or loads the kernels on first use."""
    import numba

    from . import numba_kernels
    return numba, numba_kernels


def _run(name: str, *args) -> None:
    """Run kernel ``name`` with PyTorch's thread count and note numba's thread pool (the
    fork-safety record shared with :mod:`.numba_cpu`)."""
    numba, kernels = _kernels()
    getattr(kernels, name)(*args)
    numba_cpu.note_pool(numba)


def _threads() -> int:
    numba, _ = _kernels()
    return numba_cpu.use_threads(numba)


# ---------------------------------------------------------------------- launchers
def bilinear(x: np.ndarray, out: np.ndarray, row_taps, col_taps, nhwc: bool) -> None:
    """``out[:] = bilinear(x)``; ``x``/``out`` NCHW or NHWC float32 (C-contiguous), taps
    ``(i0, i1, w0, w1)`` per axis (int64 indices, float32 weights)."""
    threads = _threads()
    if nhwc:
        n, H, W, C = out.shape
        rows = _jobs(n, H, threads)
        work = torch.empty((threads, 2, W, C), dtype=torch.float32).numpy()
        _run('bilinear_nhwc', x, out, *row_taps, *col_taps, rows, work)
        return
    n, c, H, W = out.shape
    rows = _jobs(n * c, H, threads)
    work = torch.empty((threads, 2, W), dtype=torch.float32).numpy()
    cols = numba_cpu.column_taps(*col_taps)
    _run('bilinear_nchw', x, out, *row_taps, *cols, rows, work)


def bilinear_backward(g: np.ndarray, gin: np.ndarray, row_rev, col_rev, nhwc: bool) -> None:
    """``gin[:]`` = the gradient of :func:`bilinear` for output gradient ``g``; the
    reverse taps ``(start, count, weight)`` per axis come from :func:`reverse_taps`."""
    threads = _threads()
    if nhwc:
        n, h, w, C = gin.shape
        W = g.shape[2]
        work = torch.empty((threads, W, C), dtype=torch.float32).numpy()
        _run('bilinear_bwd_nhwc', g, gin, *row_rev, *col_rev, _jobs(n, h, threads), work)
        return
    n, c, h, w = gin.shape
    work = torch.empty((threads, g.shape[3]), dtype=torch.float32).numpy()
    _run('bilinear_bwd_nchw', g, gin, *row_rev, *col_rev, _jobs(n * c, h, threads), work)


def nearest(x: np.ndarray, out: np.ndarray, ih: np.ndarray, iw: np.ndarray,
            nhwc: bool) -> None:
    """``out[..., Y, X] = x[..., ih[Y], iw[X]]`` (NCHW or NHWC)."""
    threads = _threads()
    if nhwc:
        _run('nearest_nhwc', x, out, ih, iw, _jobs(out.shape[0], out.shape[1], threads))
    else:
        _run('nearest_nchw', x, out, ih, iw,
             _jobs(out.shape[0] * out.shape[1], out.shape[2], threads))


def max_pool(x: np.ndarray, out: np.ndarray, idx: np.ndarray, spec, first_taps,
             nhwc: bool) -> None:
    """Max pooling values and PyTorch's flat indices for a symmetric-padding ``spec``
    (:class:`mmseg_cann.core.geometry.PoolSpec`); ``first_taps`` per axis are the
    windows' first in-bounds taps (:func:`mmseg_cann.core.taps.pool_first_taps`)."""
    _threads()
    (kh, kw), (sh, sw), (dh, dw) = spec.kernel, spec.stride, spec.dilation
    ph, pw = spec.pad_begin
    first_h, first_w = (np.asarray(t, dtype=np.int64) for t in first_taps)
    args = (x, out, idx, kh, kw, sh, sw, ph, pw, dh, dw, first_h, first_w)
    if nhwc:
        _run('max_pool_nhwc', *args)
    else:
        flat = torch.empty((_threads(), out.shape[3]), dtype=torch.float32).numpy()
        _run('max_pool_nchw', *args, flat)


def avg_pool(x: np.ndarray, out: np.ndarray, spec, divisors, divisor_override,
             nhwc: bool) -> None:
    """Average pooling for a symmetric-padding ``spec`` (dilation 1); ``divisors`` per
    axis from :func:`mmseg_cann.core.taps.pool_divisors`, or ``divisor_override``."""
    _threads()
    (kh, kw), (sh, sw) = spec.kernel, spec.stride
    ph, pw = spec.pad_begin
    div_h, div_w = (np.asarray(t, dtype=np.int64) for t in divisors)
    args = (x, out, kh, kw, sh, sw, ph, pw, div_h, div_w, int(divisor_override or 0))
    _run('avg_pool_nhwc' if nhwc else 'avg_pool_nchw', *args)


def reverse_taps(i0: np.ndarray, i1: np.ndarray, w0: np.ndarray, w1: np.ndarray,
                 in_size: int):
    """The gather-form backward's tables for one axis, from the forward taps: per input
    index ``i``, the output indices reading it, ``start[i] + j`` for ``j < count[i]``
    (contiguous: the taps are non-decreasing), and ``weight[i, j]``, that output's tap
    weight on ``i`` (``w0 + w1`` where both taps are ``i``). int64 ``(in,)``, int64
    ``(in,)``, float32 ``(in, max count)``."""
    out_size = len(i0)
    d = np.arange(out_size)
    lo = np.full(in_size, out_size, dtype=np.int64)
    hi = np.full(in_size, -1, dtype=np.int64)
    for idx in (i0, i1):
        np.minimum.at(lo, idx, d)
        np.maximum.at(hi, idx, d)
    count = np.maximum(hi - lo + 1, 0)
    start = np.where(count > 0, lo, 0)
    width = max(int(count.max()), 1)
    y = np.minimum(start[:, None] + np.arange(width), out_size - 1)
    i = np.arange(in_size)[:, None]
    weight = (np.where(i0[y] == i, w0[y], np.float32(0)) +
              np.where(i1[y] == i, w1[y], np.float32(0))).astype(np.float32)
    weight[np.arange(width)[None, :] >= count[:, None]] = 0
    return start, count, np.ascontiguousarray(weight)
