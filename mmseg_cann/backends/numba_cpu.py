"""Parallel CPU kernels for the fused decoder ops, compiled with numba.

The fused bilinear ops spend their time moving memory, not computing: the kernels here
make one pass over the output, keep every intermediate in small per-thread buffers and
use the taps of :func:`mmseg_cann.core.taps.linear_taps` (PyTorch's float32 source
coordinates) with the arithmetic of PyTorch's compiled NCHW CPU kernel as read off
torch 2.13's AVX2 build, fused multiply-adds included::

    t0 = fma(x[y0, x0], w0, x[y0, x1] * w1)      # along W, row y0
    t1 = fma(x[y1, x0], w0, x[y1, x1] * w1)      # along W, row y1
    value = fma(t0, h0, t1 * h1)                  # along H

With it the values are bit-identical to ``F.interpolate``'s on decoder-sized outputs
(192 or more columns; ``tests/backends/test_numba_cpu.py``); on narrow outputs PyTorch's
loop contracts differently and a quarter of the values differ in the last bit (within
the rounding of two lerps, which the tests bound).

``upsample_add_into(x, other, out, ...)``
    ``out = other + upsample(x)``. Output rows are processed in chunks per channel; each
    chunk first interpolates its low-resolution rows along W into a buffer, then writes
    every output row as a lerp of two buffered rows plus the lateral, in one pass.
``upsample_argmax_into(x, out, ...)``
    labels of the upsampled logits. Chunks of output rows run in parallel; a chunk keeps
    two low-resolution rows of every class interpolated along W (``2 x C x W`` values,
    recomputed only when the rows advance); each output row between them is reduced by
    a running maximum over classes and its index (first index wins; NaN wins, as in
    ``torch.argmax``).
    Class pruning: all output pixels of one run of columns between the same two source
    rows interpolate the same four corners per class, so each value lies within the
    range of its class's corners, widened by the float32 rounding of the two lerps
    (:data:`ARGMAX_ROUNDING`). A class whose highest corner is below another class's
    lowest corner by more than twice that is never the maximum there and is skipped;
    runs left with one class are filled without arithmetic. The labels are those of
    evaluating every class, bit for bit (``tests/backends/test_numba_cpu.py``). Where
    the classes are close everywhere (iid random logits) the row-long loop over all
    classes runs instead, and the search is retried a few row pairs later.
    No full-resolution logits exist, ever.

The kernels take NumPy views of contiguous NCHW float32 CPU tensors (zero copy);
:func:`available` says whether numba is installed. They are compiled on first use
(about 8 s for both on 2 cores) and cached on disk by numba (``__pycache__`` next to
this file, or numba's user cache directory where that is not writable).
"""
from __future__ import annotations

import os
from functools import lru_cache

import numpy as np

#: the per-chunk buffer of W-interpolated low-resolution rows stays under this many bytes
CHUNK_BUFFER_BYTES = 2 << 20
#: bound on how far, relative to the largest corner magnitude, a bilinear value computed
#: in float32 (two levels of ``fma(a, w0, b * w1)``) can lie outside the range of its four
#: corners: each level rounds twice and its weights sum to 1 within one rounding, which is
#: about 3 units of 2**-24 per level; 16 units leave room to spare
ARGMAX_ROUNDING = 16 * 2.0 ** -24
#: rows whose column runs keep more candidate classes than this on average take the
#: row-long loop over every class instead, and the next this many pairs of source rows
#: do not search for candidates
PRUNED_RUN_CLASSES = 4
PRUNE_RETRY_PAIRS = 8


@lru_cache(maxsize=1)
def available() -> bool:
    """Whether numba can be imported (``pip install numba``; in requirements/runtime.txt)."""
    try:
        import numba  # noqa: F401
    except ImportError:
        return False
    return True


#: the process whose numba kernels started a thread pool, and that pool's threading layer
_pool = {'pid': None, 'layer': None}


def forked_after_use() -> bool:
    """Whether this process was forked from one whose numba kernels already ran on the
    GNU OpenMP threading layer: GNU OpenMP is not fork-safe, and numba then terminates
    the child at its first parallel kernel ("fork() called from a process already
    using GNU OpenMP"). The callers fall back to the torch paths there."""
    return (_pool['pid'] is not None and _pool['pid'] != os.getpid()
            and _pool['layer'] == 'omp')


def note_pool(numba) -> None:
    """Record that this process started numba's thread pool (see :func:`forked_after_use`);
    every numba kernel calls it after running."""
    if _pool['pid'] != os.getpid():
        _pool['pid'], _pool['layer'] = os.getpid(), numba.threading_layer()


def chunk_rows(h: int, H: int, bytes_per_low_row: int, n_parallel: int, threads: int) -> int:
    """Output rows per chunk: the W-interpolated low-resolution rows one chunk needs
    (about ``rows * h / H + 2``) fit in :data:`CHUNK_BUFFER_BYTES`, and there are at
    least ``4 * threads`` chunks over ``n_parallel`` images to share between threads."""
    by_memory = (CHUNK_BUFFER_BYTES / max(1, bytes_per_low_row) - 2) * H / max(1, h)
    by_balance = -(-n_parallel * H // (4 * max(1, threads))) // max(1, n_parallel)
    return int(max(1, min(H, by_memory, max(1, by_balance))))


@lru_cache(maxsize=1)
def jit_helpers():
    """``(fma, select, lerp_row_w)`` for njit code, shared by every numba kernel: two LLVM
    intrinsics and the W interpolation of one row."""
    from numba import njit
    from numba.extending import intrinsic

    @intrinsic
    def fma(typingctx, a, b, c):
        """``a * b + c`` rounded once (LLVM's ``llvm.fma``; vectorises)."""
        def codegen(context, builder, signature, args):
            return builder.fma(*args)
        return a(a, b, c), codegen

    @intrinsic
    def select(typingctx, cond, a, b):
        """``a if cond else b`` as one LLVM ``select`` (no branch): a conditional
        expression becomes branches that LLVM turns into masked stores, which are
        microcoded and several times slower on some x86 CPUs."""
        def codegen(context, builder, signature, args):
            return builder.select(*args)
        return a(cond, a, b), codegen

    @njit(inline='always')
    def lerp_row_w(row, dst, seg, seg_i0, seg_i1, iw0, iw1, lw0, lw1):
        """``dst[X] = fma(row[iw0], lw0, row[iw1] * lw1)``. Where output columns come in
        runs sharing their two source columns (upsampling by 4 or more), the inner loop
        broadcasts two values per run (vectorised); otherwise it gathers."""
        if seg_i0.shape[0] * 4 <= lw0.shape[0]:
            for k in range(seg_i0.shape[0]):
                x0, x1 = row[seg_i0[k]], row[seg_i1[k]]
                for X in range(seg[k], seg[k + 1]):
                    dst[X] = fma(x0, lw0[X], x1 * lw1[X])
        else:
            for X in range(dst.shape[0]):
                dst[X] = fma(row[iw0[X]], lw0[X], row[iw1[X]] * lw1[X])

    return fma, select, lerp_row_w


@lru_cache(maxsize=1)
def _kernels():
    import numba
    from numba import njit, prange

    fma, select, lerp_row_w = jit_helpers()

    @njit(inline='always')
    def _lerp_rows_along_w(src, c_lo, c_hi, r_lo, r_hi, cols, buf):
        """``buf[r - r_lo, c - c_lo] = x[c, r]`` interpolated along W, for the given
        rows and classes; ``cols`` from :func:`column_taps`."""
        seg, seg_i0, seg_i1, iw0, iw1, lw0, lw1 = cols
        for r in range(r_lo, r_hi + 1):
            for c in range(c_lo, c_hi):
                lerp_row_w(src[c, r], buf[r - r_lo, c - c_lo], seg, seg_i0, seg_i1, iw0, iw1,
                           lw0, lw1)

    @njit(parallel=True, cache=True)
    def upsample_add_into(x, other, out, ih0, ih1, lh0, lh1, cols, rows, work):
        n, c, h, w = x.shape
        H, W = out.shape[2], out.shape[3]
        chunks = -(-H // rows)
        for job in prange(n * c * chunks):
            b, rest = divmod(np.int64(job), c * chunks)  # prange indices may be unsigned
            ch, k = divmod(rest, chunks)
            y_lo, y_hi = k * rows, min(H, (k + 1) * rows)
            r_lo, r_hi = ih0[y_lo], ih1[y_hi - 1]
            buf = work[numba.get_thread_id()]
            _lerp_rows_along_w(x[b], ch, ch + 1, r_lo, r_hi, cols, buf)
            for Y in range(y_lo, y_hi):
                t0, t1 = buf[ih0[Y] - r_lo, 0], buf[ih1[Y] - r_lo, 0]
                a0, a1 = lh0[Y], lh1[Y]
                lat, dst = other[b, ch, Y], out[b, ch, Y]
                for X in range(W):
                    dst[X] = lat[X] + fma(t0[X], a0, t1[X] * a1)

    @njit(inline='always')
    def _argmax_row(t0, t1, a0, a1, best, label):
        """Running argmax over classes of ``fma(t0[c], a0, t1[c] * a1)`` per column.

        ``best``/``label`` are ``(2, W)`` ping-pong buffers: each class reads one row and
        writes the other, and the choice is an explicit ``select``, so every store is
        unconditional (updating one buffer in place compiles to masked stores, which
        are microcoded and several times slower on some x86 CPUs: 0.95 vs 0.15 ns per
        value measured). Returns the row of ``label`` holding the result.
        """
        u0, u1 = t0[0], t1[0]
        first_best, first_label = best[0], label[0]
        for X in range(first_best.shape[0]):
            first_best[X] = fma(u0[X], a0, u1[X] * a1)
            first_label[X] = 0
        src = 0
        for cls in range(1, t0.shape[0]):
            u0, u1 = t0[cls], t1[cls]
            best_in, label_in = best[src], label[src]
            best_out, label_out = best[1 - src], label[1 - src]
            for X in range(best_in.shape[0]):
                v = fma(u0[X], a0, u1[X] * a1)
                m = best_in[X]
                # torch.argmax: the first maximum wins and a NaN is the maximum:
                # take v unless v <= m or m is already a NaN
                take = (not v <= m) & (m == m)
                best_out[X] = select(take, v, m)
                label_out[X] = select(take, np.int32(cls), label_in[X])
            src = 1 - src
        return src

    @njit(inline='always')
    def _candidates(xb, r0, r1, seg_i0, seg_i1, cand, count, highs, floor, scale):
        """Per column run ``k`` of the output (source columns ``seg_i0[k]``/``seg_i1[k]``,
        source rows ``r0``/``r1``): the classes that can be the argmax somewhere in it,
        ascending, into ``cand[k, :count[k]]``; returns the sum of the counts.

        A value of the run lies within ``ARGMAX_ROUNDING * scale`` of its class's corner
        range (``scale`` the largest corner magnitude of the run), so a class whose highest
        corner is below the best lowest corner by twice that is never the maximum. Runs
        with a NaN or an infinity among their corners keep every class."""
        runs = seg_i0.shape[0]
        floor[:runs] = -np.inf
        scale[:runs] = 0.0
        for c in range(xb.shape[0]):
            top, bottom = xb[c, r0], xb[c, r1]
            for k in range(runs):
                p, q = top[seg_i0[k]], top[seg_i1[k]]
                u, v = bottom[seg_i0[k]], bottom[seg_i1[k]]
                lo = min(min(p, q), min(u, v))
                hi = max(max(p, q), max(u, v))
                ok = (abs(p) < np.inf) & (abs(q) < np.inf) & (abs(u) < np.inf) & \
                    (abs(v) < np.inf)
                floor[k] = max(floor[k], lo)
                # a non-finite corner makes the scale infinite: nothing is pruned
                scale[k] = select(ok, max(scale[k], max(-lo, hi)), np.float32(np.inf))
                highs[c, k] = hi
        total = 0
        for k in range(runs):
            bar = floor[k] - 2 * ARGMAX_ROUNDING * scale[k]
            n = 0
            for c in range(xb.shape[0]):
                if not highs[c, k] < bar:
                    cand[k, n] = c
                    n += 1
            count[k] = n
            total += n
        return total

    @njit(parallel=True, cache=True)
    def upsample_argmax_into(x, out, ih0, ih1, lh0, lh1, cols, rows, prune, work, work_best,
                             work_label, work_cand, work_count, work_highs):
        seg, seg_i0, seg_i1, _, _, lw0, lw1 = cols
        n, c, h, w = x.shape
        H, W = out.shape[1], out.shape[2]
        runs = seg_i0.shape[0]
        chunks = -(-H // rows)
        for job in prange(n * chunks):
            b, k = divmod(np.int64(job), chunks)
            xb = x[b]
            # two slots of W-interpolated rows: low-resolution row r lives in slot r % 2
            # (the two rows an output row needs differ by at most one)
            thread = numba.get_thread_id()
            slots, best, label = work[thread], work_best[thread], work_label[thread]
            cand, count, highs = work_cand[thread], work_count[thread], work_highs[thread]
            floor, scale = best[0], best[1]
            held = np.full(2, -1, dtype=np.int64)
            pair = (np.int64(-1), np.int64(-1))
            whole_rows = True
            skip = 0
            for Y in range(k * rows, min(H, (k + 1) * rows)):
                r0, r1 = ih0[Y], ih1[Y]
                a0, a1 = lh0[Y], lh1[Y]
                if (r0, r1) != pair:
                    pair = (r0, r1)
                    whole_rows = True
                    if prune and skip == 0:
                        total = _candidates(xb, r0, r1, seg_i0, seg_i1, cand, count, highs,
                                            floor, scale)
                        # pruning pays where most runs keep few classes; elsewhere the
                        # row-long loop over every class is faster (it vectorises), and
                        # the next few row pairs, likely alike, skip the candidate search
                        whole_rows = total > PRUNED_RUN_CLASSES * runs
                        skip = PRUNE_RETRY_PAIRS if whole_rows else 0
                    elif skip > 0:
                        skip -= 1
                dst = out[b, Y]
                if whole_rows:
                    for r in (r0, r1):
                        if held[r % 2] != r:
                            _lerp_rows_along_w(xb, 0, c, r, r, cols, slots[r % 2:r % 2 + 1])
                            held[r % 2] = r
                    src = _argmax_row(slots[r0 % 2], slots[r1 % 2], a0, a1, best, label)
                    labels = label[src]
                    for X in range(W):
                        dst[X] = labels[X]
                    continue
                row_best, row_label = best[0], label[0]
                for s in range(runs):
                    x_lo, x_hi, n_cand = seg[s], seg[s + 1], count[s]
                    i0, i1 = seg_i0[s], seg_i1[s]
                    first = cand[s, 0]
                    if n_cand == 1:
                        for X in range(x_lo, x_hi):
                            dst[X] = first
                        continue
                    # the values _argmax_row computes, from the run's corners (the
                    # W-interpolation of lerp_row_w, then along H)
                    for j in range(n_cand):
                        cls = cand[s, j]
                        p, q = xb[cls, r0, i0], xb[cls, r0, i1]
                        u, v = xb[cls, r1, i0], xb[cls, r1, i1]
                        for X in range(x_lo, x_hi):
                            t0 = fma(p, lw0[X], q * lw1[X])
                            t1 = fma(u, lw0[X], v * lw1[X])
                            value = fma(t0, a0, t1 * a1)
                            m = row_best[X]
                            # as in _argmax_row; the first candidate always enters
                            take = (j == 0) | ((not value <= m) & (m == m))
                            row_best[X] = select(take, value, m)
                            row_label[X] = select(take, np.int32(cls), row_label[X])
                    for X in range(x_lo, x_hi):
                        dst[X] = row_label[X]

    return numba, upsample_add_into, upsample_argmax_into


def column_taps(i0: np.ndarray, i1: np.ndarray, w0: np.ndarray, w1: np.ndarray) -> tuple:
    """Column taps for the kernels: ``(seg, seg_i0, seg_i1, i0, i1, w0, w1)`` where
    output columns ``seg[k]:seg[k + 1]`` all lerp source columns ``seg_i0[k]`` and
    ``seg_i1[k]`` (taps are non-decreasing, so each pair is one run of columns)."""
    change = np.flatnonzero((i0[1:] != i0[:-1]) | (i1[1:] != i1[:-1])) + 1
    seg = np.concatenate([[0], change, [len(i0)]]).astype(np.int64)
    return seg, i0[seg[:-1]], i1[seg[:-1]], i0, i1, w0, w1


def use_threads(numba) -> int:
    """Run with as many threads as PyTorch uses (``torch.set_num_threads`` applies)."""
    import torch
    threads = max(1, min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS))
    numba.set_num_threads(threads)
    return threads


def upsample_add_into(x: np.ndarray, other: np.ndarray, out: np.ndarray, row_taps, col_taps
                      ) -> None:
    """``out[:] = other + bilinear(x)`` for ``(N, C, h, w)`` ``x`` and ``(N, C, H, W)``
    ``other``/``out`` (C-contiguous float32); taps are ``(i0, i1, w0, w1)`` NumPy arrays
    per axis (int64 indices, float32 weights). The per-thread buffers are torch
    tensors, so memory profilers see them."""
    import torch
    numba, add, _ = _kernels()
    n, c, h, w = x.shape
    H, W = out.shape[2:]
    threads = use_threads(numba)
    rows = chunk_rows(h, H, W * x.itemsize, n * c, threads)
    i0, i1 = row_taps[:2]
    starts = np.arange(0, H, rows)
    needed = int((i1[np.minimum(starts + rows, H) - 1] - i0[starts]).max()) + 1
    work = torch.empty((threads, needed, 1, W), dtype=torch.float32).numpy()
    add(x, other, out, *row_taps, column_taps(*col_taps), rows, work)
    note_pool(numba)


def upsample_argmax_into(x: np.ndarray, out: np.ndarray, row_taps, col_taps,
                         prune: bool = True) -> None:
    """``out[:] = bilinear(x).argmax(1)`` for ``(N, C, h, w)`` ``x`` and ``(N, H, W)``
    int64 ``out``; arguments as :func:`upsample_add_into`. Per thread the kernel holds
    ``2 x C x W`` interpolated values, a row of maxima and labels and the candidate
    classes of each column run. ``prune=False`` evaluates every class everywhere (the
    same labels, slower; the tests compare the two)."""
    import torch
    numba, _, argmax = _kernels()
    n, c, h, w = x.shape
    H, W = out.shape[1:]
    threads = use_threads(numba)
    rows = -(-H // max(1, -(-4 * threads // n)))  # >= 4 chunks per thread
    cols = column_taps(*col_taps)
    runs = len(cols[1])
    work = torch.empty((threads, 2, c, W), dtype=torch.float32).numpy()
    work_best = torch.empty((threads, 2, max(W, runs)), dtype=torch.float32).numpy()
    work_label = torch.empty((threads, 2, max(W, runs)), dtype=torch.int32).numpy()
    work_cand = torch.empty((threads, runs, c), dtype=torch.int32).numpy()
    work_count = torch.empty((threads, runs), dtype=torch.int32).numpy()
    work_highs = torch.empty((threads, c, runs), dtype=torch.float32).numpy()
    argmax(x, out, *row_taps, cols, rows, bool(prune), work, work_best, work_label,
           work_cand, work_count, work_highs)
    note_pool(numba)
