"""The numba kernels of the CPU backends, compiled on first use and cached on disk.

Every kernel is a module-level function, so numba's on-disk cache (``cache=True``: the
``__pycache__`` next to this file, or numba's user cache directory where that is not
writable) is reused by later processes: a kernel defined inside a function carries its
closure in the cache key, which differs in every process, so it would be compiled again
each time. Numba checks only this file's time stamp to invalidate the cache, which is
why the kernels and the helpers they inline share one file.

The launchers, the tables they pass and the arithmetic are described in
:mod:`.numba_cpu` (the fused decoder ops ``upsample_add_into``/``upsample_argmax_into``)
and :mod:`.numba_ops` (the ``'fast'`` backend's upsampling and pooling kernels). Only
those modules import this one, and only once numba is known to be installed.
"""
import numba
import numpy as np
from numba import njit, prange
from numba.extending import intrinsic

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


# ---------------------------------------------------------------------- shared helpers
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


# ------------------------------------------------- fused decoder ops (numba_cpu)
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



# ------------------------------------------------ 'fast' backend (numba_ops)
# bilinear


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
                    lerp_row_w(x[b, ch, r], slots[r % 2], seg, seg_i0, seg_i1,
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
