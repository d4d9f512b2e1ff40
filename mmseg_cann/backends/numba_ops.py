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
``(N, H, W, C)`` (a channels_last tensor permuted). They are compiled on first use and
cached on disk by numba.
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
    import numba
    from numba import njit, prange

    fma, select, _lerp_row_w = numba_cpu.jit_helpers()

    # ------------------------------------------------------------------ bilinear
    @njit(parallel=True, cache=True)
    def bilinear_nchw(x, out, ih0, ih1, lh0, lh1, seg, seg_i0, seg_i1, iw0, iw1, lw0, lw1,
                      rows, work):
        n, c = x.shape[0], x.shape[1]
        H, W = out.shape[2], out.shape[3]
        chunks = -(-H // rows)
        for job in prange(n * c * chunks):
            plane, k = divmod(np.int64(job), chunks)  # prange indices may be unsigned
            b, ch = divmod(plane, c)
            slots = work[numba.get_thread_id()]  # low-resolution row r lives in slot r % 2
            held0, held1 = -1, -1
            for Y in range(k * rows, min(H, (k + 1) * rows)):
                r0, r1 = ih0[Y], ih1[Y]
                for r in (r0, r1):
                    if (held0 if r % 2 == 0 else held1) != r:
                        _lerp_row_w(x[b, ch, r], slots[r % 2], seg, seg_i0, seg_i1,
                                    iw0, iw1, lw0, lw1)
                        if r % 2 == 0:
                            held0 = r
                        else:
                            held1 = r
                t0, t1, dst = slots[r0 % 2], slots[r1 % 2], out[b, ch, Y]
                a0, a1 = lh0[Y], lh1[Y]
                for X in range(W):
                    dst[X] = fma(t0[X], a0, t1[X] * a1)

    @njit(parallel=True, cache=True)
    def bilinear_nhwc(x, out, ih0, ih1, lh0, lh1, iw0, iw1, lw0, lw1, rows, work):
        n, C = x.shape[0], x.shape[3]
        H, W = out.shape[1], out.shape[2]
        chunks = -(-H // rows)
        for job in prange(n * chunks):
            b, k = divmod(np.int64(job), chunks)
            slots = work[numba.get_thread_id()]  # (2, W, C)
            held0, held1 = -1, -1
            for Y in range(k * rows, min(H, (k + 1) * rows)):
                r0, r1 = ih0[Y], ih1[Y]
                for r in (r0, r1):
                    if (held0 if r % 2 == 0 else held1) != r:
                        row, dst = x[b, r], slots[r % 2]
                        for X in range(W):
                            s0, s1, d = row[iw0[X]], row[iw1[X]], dst[X]
                            a0, a1 = lw0[X], lw1[X]
                            for ch in range(C):
                                d[ch] = fma(s0[ch], a0, s1[ch] * a1)
                        if r % 2 == 0:
                            held0 = r
                        else:
                            held1 = r
                t0, t1, dst = slots[r0 % 2], slots[r1 % 2], out[b, Y]
                a0, a1 = lh0[Y], lh1[Y]
                for X in range(W):
                    u0, u1, d = t0[X], t1[X], dst[X]
                    for ch in range(C):
                        d[ch] = fma(u0[ch], a0, u1[ch] * a1)

    @njit(parallel=True, cache=True)
    def bilinear_bwd_nchw(g, gin, hs, hc, hw, ws, wc, ww, rows, work):
        n, c, h, w = gin.shape
        W = g.shape[3]
        chunks = -(-h // rows)
        for job in prange(n * c * chunks):
            plane, k = divmod(np.int64(job), chunks)
            b, ch = divmod(plane, c)
            t = work[numba.get_thread_id()]  # (W,): one input row's gradient along H
            for i in range(k * rows, min(h, (k + 1) * rows)):
                for X in range(W):
                    t[X] = 0.0
                for j in range(hc[i]):  # the output rows reading input row i, in order
                    grow, a = g[b, ch, hs[i] + j], hw[i, j]
                    for X in range(W):
                        t[X] = fma(grow[X], a, t[X])
                dst = gin[b, ch, i]
                for x in range(w):  # the output columns reading input column x, in order
                    acc = np.float32(0.0)
                    for j in range(wc[x]):
                        acc = fma(t[ws[x] + j], ww[x, j], acc)
                    dst[x] = acc

    @njit(parallel=True, cache=True)
    def bilinear_bwd_nhwc(g, gin, hs, hc, hw, ws, wc, ww, rows, work):
        n, h, w, C = gin.shape
        W = g.shape[2]
        chunks = -(-h // rows)
        for job in prange(n * chunks):
            b, k = divmod(np.int64(job), chunks)
            t = work[numba.get_thread_id()]  # (W, C)
            for i in range(k * rows, min(h, (k + 1) * rows)):
                for X in range(W):
                    for ch in range(C):
                        t[X, ch] = 0.0
                for j in range(hc[i]):
                    grow, a = g[b, hs[i] + j], hw[i, j]
                    for X in range(W):
                        gx, tx = grow[X], t[X]
                        for ch in range(C):
                            tx[ch] = fma(gx[ch], a, tx[ch])
                for x in range(w):
                    dst = gin[b, i, x]
                    for ch in range(C):
                        dst[ch] = 0.0
                    for j in range(wc[x]):
                        tx, a = t[ws[x] + j], ww[x, j]
                        for ch in range(C):
                            dst[ch] = fma(tx[ch], a, dst[ch])

    # ------------------------------------------------------------------ nearest
    @njit(parallel=True, cache=True)
    def nearest_nchw(x, out, ih, iw, rows):
        n, c = x.shape[0], x.shape[1]
        H, W = out.shape[2], out.shape[3]
        chunks = -(-H // rows)
        for job in prange(n * c * chunks):
            plane, k = divmod(np.int64(job), chunks)
            b, ch = divmod(plane, c)
            for Y in range(k * rows, min(H, (k + 1) * rows)):
                src, dst = x[b, ch, ih[Y]], out[b, ch, Y]
                for X in range(W):
                    dst[X] = src[iw[X]]

    @njit(parallel=True, cache=True)
    def nearest_nhwc(x, out, ih, iw, rows):
        n, C = x.shape[0], x.shape[3]
        H, W = out.shape[1], out.shape[2]
        chunks = -(-H // rows)
        for job in prange(n * chunks):
            b, k = divmod(np.int64(job), chunks)
            for Y in range(k * rows, min(H, (k + 1) * rows)):
                src, dst = x[b, ih[Y]], out[b, Y]
                for X in range(W):
                    s, d = src[iw[X]], dst[X]
                    for ch in range(C):
                        d[ch] = s[ch]

    # ------------------------------------------------------------------ pooling
    @njit(inline='always')
    def _tap_range(size_out, size_in, stride, offset):
        """``[lo, hi)``: the outputs ``o`` whose tap ``o * stride + offset`` is in the input."""
        lo = -(offset // stride) if offset < 0 else 0
        hi = (size_in - 1 - offset) // stride + 1 if size_in - 1 - offset >= 0 else 0
        return lo, max(lo, min(size_out, hi))

    @njit(parallel=True, cache=True)
    def max_pool_nchw(x, out, idx, kh, kw, sh, sw, ph, pw, dh, dw, first_h, first_w, work):
        n, c, h, w = x.shape
        oh, ow = out.shape[2], out.shape[3]
        for job in prange(n * c * oh):
            plane, oy = divmod(np.int64(job), oh)
            b, ch = divmod(plane, c)
            best, arg = out[b, ch, oy], idx[b, ch, oy]
            # the running index as float32 (exact: H*W <= 2^24, checked by the caller):
            # a select of the values' width vectorises, an int64 one did not (165 vs
            # 61 ms for 2x256x128x256, 3/2/1, one thread)
            flat = work[numba.get_thread_id()]
            for ox in range(ow):  # PyTorch's start: -inf at the first in-bounds tap
                best[ox] = -np.inf
                flat[ox] = np.float32(first_h[oy] * w + first_w[ox])
            step = np.float32(sw)
            for ky in range(kh):  # taps in PyTorch's order: rows, then columns
                iy = oy * sh - ph + ky * dh
                if iy < 0 or iy >= h:
                    continue
                row = x[b, ch, iy]
                for kx in range(kw):
                    off = kx * dw - pw
                    lo, hi = _tap_range(ow, w, sw, off)
                    base = np.float32(iy * w + off)
                    for ox in range(lo, hi):
                        v, m = row[ox * sw + off], best[ox]
                        take = (v > m) | (v != v)  # as PyTorch: greater, or NaN
                        best[ox] = select(take, v, m)
                        flat[ox] = select(take, base + step * np.float32(ox), flat[ox])
            for ox in range(ow):
                arg[ox] = np.int64(flat[ox])

    @njit(parallel=True, cache=True)
    def max_pool_nhwc(x, out, idx, kh, kw, sh, sw, ph, pw, dh, dw, first_h, first_w):
        n, h, w, C = x.shape
        oh, ow = out.shape[1], out.shape[2]
        for job in prange(n * oh):
            b, oy = divmod(np.int64(job), oh)
            for ox in range(ow):
                best, arg = out[b, oy, ox], idx[b, oy, ox]
                start = np.int64(first_h[oy] * w + first_w[ox])
                for ch in range(C):
                    best[ch] = -np.inf
                    arg[ch] = start
                for ky in range(kh):
                    iy = oy * sh - ph + ky * dh
                    if iy < 0 or iy >= h:
                        continue
                    for kx in range(kw):
                        ix = ox * sw - pw + kx * dw
                        if ix < 0 or ix >= w:
                            continue
                        src, flat = x[b, iy, ix], np.int64(iy * w + ix)
                        for ch in range(C):
                            v, m = src[ch], best[ch]
                            take = (v > m) | (v != v)
                            best[ch] = select(take, v, m)
                            arg[ch] = select(take, flat, arg[ch])

    @njit(parallel=True, cache=True)
    def avg_pool_nchw(x, out, kh, kw, sh, sw, ph, pw, div_h, div_w, override):
        n, c, h, w = x.shape
        oh, ow = out.shape[2], out.shape[3]
        for job in prange(n * c * oh):
            plane, oy = divmod(np.int64(job), oh)
            b, ch = divmod(plane, c)
            acc = out[b, ch, oy]
            for ox in range(ow):
                acc[ox] = 0.0
            for ky in range(kh):  # window rows in order, columns in order: PyTorch's sum
                iy = oy * sh - ph + ky
                if iy < 0 or iy >= h:
                    continue
                row = x[b, ch, iy]
                for kx in range(kw):
                    off = kx - pw
                    lo, hi = _tap_range(ow, w, sw, off)
                    for ox in range(lo, hi):
                        acc[ox] += row[ox * sw + off]
            for ox in range(ow):
                d = override if override > 0 else div_h[oy] * div_w[ox]
                acc[ox] = acc[ox] / np.float32(d)

    @njit(parallel=True, cache=True)
    def avg_pool_nhwc(x, out, kh, kw, sh, sw, ph, pw, div_h, div_w, override):
        n, h, w, C = x.shape
        oh, ow = out.shape[1], out.shape[2]
        for job in prange(n * oh):
            b, oy = divmod(np.int64(job), oh)
            for ox in range(ow):
                acc = out[b, oy, ox]
                for ch in range(C):
                    acc[ch] = 0.0
                for ky in range(kh):
                    iy = oy * sh - ph + ky
                    if iy < 0 or iy >= h:
                        continue
                    for kx in range(kw):
                        ix = ox * sw - pw + kx
                        if ix < 0 or ix >= w:
                            continue
                        src = x[b, iy, ix]
                        for ch in range(C):
                            acc[ch] += src[ch]
                d = np.float32(override if override > 0 else div_h[oy] * div_w[ox])
                for ch in range(C):
                    acc[ch] = acc[ch] / d

    return numba, dict(
        bilinear_nchw=bilinear_nchw, bilinear_nhwc=bilinear_nhwc,
        bilinear_bwd_nchw=bilinear_bwd_nchw, bilinear_bwd_nhwc=bilinear_bwd_nhwc,
        nearest_nchw=nearest_nchw, nearest_nhwc=nearest_nhwc,
        max_pool_nchw=max_pool_nchw, max_pool_nhwc=max_pool_nhwc,
        avg_pool_nchw=avg_pool_nchw, avg_pool_nhwc=avg_pool_nhwc)


def _run(name: str, *args) -> None:
    """Run kernel ``name`` with PyTorch's thread count and note numba's thread pool (the
    fork-safety record shared with :mod:`.numba_cpu`)."""
    numba, kernels = _kernels()
    kernels[name](*args)
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
