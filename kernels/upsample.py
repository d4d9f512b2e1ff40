"""Triton upsample kernels and their launchers: nearest/bilinear forward (optionally
fused with an add), fused upsample + argmax, and a deterministic bilinear backward.

Geometry comes from the host: per axis, two source taps ``i0, i1`` (int32) and weights
``w0, w1`` (float32) computed by :func:`mmseg_cann.core.taps.linear_taps` (bilinear)
or :func:`mmseg_cann.core.reference.nearest_indices` (nearest modes), and for the
backward the reverse tables built from them by the caller, so the kernels hold no
coordinate rules of their own. The value of an output pixel is
``(x[h0, w0] * ww0 + x[h0, w1] * ww1) * wh0 + (x[h1, w0] * ww0 + x[h1, w1] * ww1) * wh1``
in float32 (PyTorch's order), rounded once to the input dtype.

Written for triton-ascend as well as GPU Triton; device rules and the launch
configuration in :mod:`._common`.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ._common import (block_offsets, channels_last, decompose, launch, launch_kind,
                      output_like, row_plane, row_tile, taps)


@triton.jit
def lerp2(x_ptr, base, r0, r1, q0, q1, a0, a1, b0, b1, mask):
    """PyTorch's bilinear value in float32 from the four taps ``base + r? + q?`` (row
    offsets ``r0, r1`` with weights ``a0, a1``, column offsets ``q0, q1`` with ``b0, b1``).
    """
    x00 = tl.load(x_ptr + base + r0 + q0, mask=mask, other=0).to(tl.float32)
    x01 = tl.load(x_ptr + base + r0 + q1, mask=mask, other=0).to(tl.float32)
    x10 = tl.load(x_ptr + base + r1 + q0, mask=mask, other=0).to(tl.float32)
    x11 = tl.load(x_ptr + base + r1 + q1, mask=mask, other=0).to(tl.float32)
    return (x00 * b0 + x01 * b1) * a0 + (x10 * b0 + x11 * b1) * a1


@triton.jit
def upsample_fwd_kernel(x_ptr, out_ptr, other_ptr, hi0, hi1, hw0, hw1, wi0, wi1, ww0, ww1,
                        total, C, H, W, sxn, sxc, sxh, sxw, stn, stc, sth, stw, nprog, iters,
                        NEAREST: tl.constexpr, ADD: tl.constexpr, OTHER_FLAT: tl.constexpr,
                        CL: tl.constexpr, INT64: tl.constexpr, BLOCK: tl.constexpr):
    """``out = [other +] upsample(x)``, one output element per lane, stored at ``out + e``
    (the output's memory order is the flat order). ``OTHER_FLAT``: ``other`` has the
    output's strides, so it is read at ``other + e`` too (contiguous)."""
    pid = tl.program_id(0)
    for it in range(0, iters):
        e = block_offsets(pid, it, nprog, BLOCK, INT64)
        mask = e < total
        n, c, y, x = decompose(e, C, H, W, CL)
        base = n * sxn + c * sxc
        r0 = tl.load(hi0 + y, mask=mask, other=0) * sxh
        q0 = tl.load(wi0 + x, mask=mask, other=0) * sxw
        if NEAREST:
            v = tl.load(x_ptr + base + r0 + q0, mask=mask, other=0).to(tl.float32)
        else:
            v = lerp2(x_ptr, base, r0, tl.load(hi1 + y, mask=mask, other=0) * sxh,
                      q0, tl.load(wi1 + x, mask=mask, other=0) * sxw,
                      tl.load(hw0 + y, mask=mask, other=0.0),
                      tl.load(hw1 + y, mask=mask, other=0.0),
                      tl.load(ww0 + x, mask=mask, other=0.0),
                      tl.load(ww1 + x, mask=mask, other=0.0), mask)
        v = v.to(out_ptr.dtype.element_ty)
        if ADD:
            if OTHER_FLAT:
                o = tl.load(other_ptr + e, mask=mask, other=0)
            else:
                o = tl.load(other_ptr + n * stn + c * stc + y * sth + x * stw, mask=mask,
                            other=0)
            v = (v.to(tl.float32) + o.to(tl.float32)).to(out_ptr.dtype.element_ty)
        tl.store(out_ptr + e, v, mask=mask)


@triton.jit
def better_label(v, c, best, label, found_nan):
    """One step of ``torch.argmax`` over classes: ``v`` (class ``c``) replaces the running
    maximum if larger, or if it is the first NaN (NaN is the maximum; ties keep the first).
    """
    nan = v != v
    better = ~found_nan & (nan | (v > best))
    return tl.where(better, v, best), tl.where(better, c, label), found_nan | nan


@triton.jit
def upsample_argmax_kernel(x_ptr, out_ptr, hi0, hi1, hw0, hw1, wi0, wi1, ww0, ww1,
                           total, C, H, W, sxn, sxc, sxh, sxw, nprog, iters,
                           NEAREST: tl.constexpr, CL: tl.constexpr, INT64: tl.constexpr,
                           BLOCK: tl.constexpr, BLOCK_C: tl.constexpr):
    """``out[n, y, x] = argmax_c upsample(x)[n, c, y, x]`` (int32; first maximum wins,
    NaN is the maximum), one output pixel per row of a ``BLOCK x BLOCK_C`` tile.

    NCHW logits (``BLOCK_C == 1``): lanes along the output row, one class per step
    (each step reads neighbouring pixels of one plane). Channels_last logits (``CL``):
    ``BLOCK_C`` classes per step along the tile's second axis, which is contiguous in
    memory, reduced per row.
    """
    pid = tl.program_id(0)
    cs = tl.arange(0, BLOCK_C)
    for it in range(0, iters):
        e = block_offsets(pid, it, nprog, BLOCK, INT64)
        mask = e < total
        x = e % W
        t = e // W
        y = t % H
        n = t // H
        # per-pixel parts of the four tap offsets and the weights, as (BLOCK, 1) columns
        base = (n * sxn)[:, None]
        r0 = (tl.load(hi0 + y, mask=mask, other=0) * sxh)[:, None]
        q0 = (tl.load(wi0 + x, mask=mask, other=0) * sxw)[:, None]
        if not NEAREST:
            r1 = (tl.load(hi1 + y, mask=mask, other=0) * sxh)[:, None]
            q1 = (tl.load(wi1 + x, mask=mask, other=0) * sxw)[:, None]
            a0 = tl.load(hw0 + y, mask=mask, other=0.0)[:, None]
            a1 = tl.load(hw1 + y, mask=mask, other=0.0)[:, None]
            b0 = tl.load(ww0 + x, mask=mask, other=0.0)[:, None]
            b1 = tl.load(ww1 + x, mask=mask, other=0.0)[:, None]
        best = tl.full((BLOCK,), float('-inf'), tl.float32)
        label = tl.zeros((BLOCK,), tl.int32)
        found_nan = tl.zeros((BLOCK,), tl.int1)
        for c0 in range(0, C, BLOCK_C):
            c = c0 + cs
            cm = mask[:, None] & (c < C)[None, :]
            cbase = base + (c * sxc)[None, :]
            if NEAREST:
                v = tl.load(x_ptr + cbase + r0 + q0, mask=cm, other=0)
            else:
                v = lerp2(x_ptr, cbase, r0, r1, q0, q1, a0, a1, b0, b1, cm)
            # round to the input dtype first, as the unfused computation does
            v = v.to(x_ptr.dtype.element_ty).to(tl.float32)
            if CL:
                best, label, found_nan = _tile_argmax(v, c, cm, C, best, label, found_nan)
            else:  # BLOCK_C == 1: one class per step
                best, label, found_nan = better_label(
                    tl.reshape(v, (BLOCK,)), c0, best, label, found_nan)
        tl.store(out_ptr + e, label, mask=mask)


@triton.jit
def _tile_argmax(v, c, cm, C, best, label, found_nan):
    """Merge a ``(BLOCK, BLOCK_C)`` tile of classes ``c`` (valid where ``cm``) into the
    running argmax: per row, the first NaN if any, else the first maximum."""
    nan = (v != v) & cm
    vals = tl.where(cm & ~nan, v, float('-inf'))
    m = tl.max(vals, axis=1)
    has_nan = tl.max(nan.to(tl.int32), axis=1) > 0
    first_nan = tl.min(tl.where(nan, c[None, :], C), axis=1)
    first_max = tl.min(tl.where(cm & (vals == m[:, None]), c[None, :], C), axis=1)
    better = ~found_nan & (has_nan | (m > best))
    best = tl.where(better, m, best)
    label = tl.where(better, tl.where(has_nan, first_nan, first_max), label)
    return best, label, found_nan | has_nan


@triton.jit
def bilinear_bwd_kernel(g_ptr, out_ptr, hstart, hcount, hweight, wstart, wcount, wweight,
                        total, C, h, w, sgn, sgc, sgh, sgw, maxh, nprog, iters,
                        CL: tl.constexpr, INT64: tl.constexpr, BLOCK: tl.constexpr,
                        MAXW: tl.constexpr):
    """Gradient of bilinear upsampling, gather form: each input element sums the output
    gradients that read it, in a fixed order (no atomics: bitwise deterministic).

    Per input row ``i``: the output rows reading it are ``hstart[i] + dy`` for
    ``dy < hcount[i]`` with weights ``hweight[i, dy]`` (``maxh`` columns); the same along
    W with ``MAXW`` (a power of two) columns. An input element's W weights are loaded
    once as a ``(BLOCK, MAXW)`` tile; each output row then adds one tile of gradients
    (contiguous along W for NCHW gradients) reduced along W. ``out`` is float32 in the
    flat order (NCHW, or channels_last when ``CL``).
    """
    pid = tl.program_id(0)
    dxs = tl.arange(0, MAXW)[None, :]
    for it in range(0, iters):
        e = block_offsets(pid, it, nprog, BLOCK, INT64)
        mask = e < total
        n, c, i, j = decompose(e, C, h, w, CL)
        ys = tl.load(hstart + i, mask=mask, other=0)
        yc = tl.load(hcount + i, mask=mask, other=0)
        xs = tl.load(wstart + j, mask=mask, other=0)
        xc = tl.load(wcount + j, mask=mask, other=0)
        xm = mask[:, None] & (dxs < xc[:, None])
        wx = tl.load(wweight + j[:, None] * MAXW + dxs, mask=xm, other=0.0)
        cols = (xs[:, None] + dxs) * sgw
        base = n * sgn + c * sgc
        acc = tl.zeros((BLOCK,), tl.float32)
        for dy in range(0, maxh):
            ym = mask & (dy < yc)
            wy = tl.load(hweight + i * maxh + dy, mask=ym, other=0.0)
            g = tl.load(g_ptr + (base + (ys + dy) * sgh)[:, None] + cols,
                        mask=xm & ym[:, None], other=0).to(tl.float32)
            acc += tl.sum(g * wx, axis=1) * wy
        tl.store(out_ptr + e, acc, mask=mask)


# ------------------------------------------------------------- row kernels (Ascend)
# triton-ascend turns a load whose addresses are not an affine block into a loop over the
# block's elements (discrete memory access). These variants work on tiles of one row of
# one (n, c) plane, addressed through strides (NCHW, channels_last or strided): row taps
# are scalars, column taps select from a source row segment (one contiguous or
# constant-stride load) in registers (``tl.gather``), so every load and store is a block
# access. Chosen at launch on NPUs when the column taps allow it (:func:`_row_step`);
# same arithmetic in the same order as the flat kernels above.
@triton.jit
def row_segment(x_ptr, row_base, lo, n, stride, ok, SEG: tl.constexpr):
    """Elements ``lo .. lo + SEG - 1`` of a row of ``n`` (zero past its end)."""
    s = lo + tl.arange(0, SEG)
    return tl.load(x_ptr + row_base + s * stride, mask=ok & (s < n), other=0)


@triton.jit
def upsample_fwd_rows_kernel(x_ptr, out_ptr, other_ptr, hi0, hi1, hw0, hw1, wi0, wi1, ww0,
                             ww1, rows, C, H, W, w, sxn, sxc, sxh, sxw, son, soc, soh, sow,
                             stn, stc, sth, stw, nprog, iters, NEAREST: tl.constexpr,
                             ADD: tl.constexpr, OTHER_FLAT: tl.constexpr,
                             STEP: tl.constexpr, INT64: tl.constexpr, BLOCK: tl.constexpr):
    """:func:`upsample_fwd_kernel` on row tiles of the output (``rows = N * C * H``; the
    output's strides ``so?``). ``OTHER_FLAT``: ``other`` has the output's strides;
    ``STEP``: :func:`_row_step`."""
    SEG: tl.constexpr = 2 * BLOCK * STEP
    pid = tl.program_id(0)
    for it in range(0, iters):
        row, x0 = row_tile(pid, it, nprog, W, BLOCK, INT64)
        ok = row < rows
        x = x0 + tl.arange(0, BLOCK)
        mask = ok & (x < W)
        n, c, y = row_plane(row, C, H)
        base = n * sxn + c * sxc
        lo = tl.load(wi0 + x0)
        q0 = tl.load(wi0 + x, mask=mask, other=lo) - lo
        seg0 = row_segment(x_ptr, base + tl.load(hi0 + y) * sxh, lo, w, sxw, ok, SEG)
        if NEAREST:
            v = tl.gather(seg0, q0, 0).to(tl.float32)
        else:
            q1 = tl.load(wi1 + x, mask=mask, other=lo) - lo
            seg1 = row_segment(x_ptr, base + tl.load(hi1 + y) * sxh, lo, w, sxw, ok, SEG)
            a0 = tl.load(hw0 + y)
            a1 = tl.load(hw1 + y)
            b0 = tl.load(ww0 + x, mask=mask, other=0.0)
            b1 = tl.load(ww1 + x, mask=mask, other=0.0)
            x00 = tl.gather(seg0, q0, 0).to(tl.float32)
            x01 = tl.gather(seg0, q1, 0).to(tl.float32)
            x10 = tl.gather(seg1, q0, 0).to(tl.float32)
            x11 = tl.gather(seg1, q1, 0).to(tl.float32)
            v = (x00 * b0 + x01 * b1) * a0 + (x10 * b0 + x11 * b1) * a1
        v = v.to(out_ptr.dtype.element_ty)
        e = n * son + c * soc + y * soh + x * sow
        if ADD:
            if OTHER_FLAT:
                o = tl.load(other_ptr + e, mask=mask, other=0)
            else:
                o = tl.load(other_ptr + n * stn + c * stc + y * sth + x * stw, mask=mask,
                            other=0)
            v = (v.to(tl.float32) + o.to(tl.float32)).to(out_ptr.dtype.element_ty)
        tl.store(out_ptr + e, v, mask=mask)


@triton.jit
def upsample_argmax_rows_kernel(x_ptr, out_ptr, hi0, hi1, hw0, hw1, wi0, wi1, ww0, ww1,
                                rows, C, H, W, w, sxn, sxc, sxh, sxw, nprog, iters,
                                NEAREST: tl.constexpr, STEP: tl.constexpr,
                                INT64: tl.constexpr, BLOCK: tl.constexpr):
    """:func:`upsample_argmax_kernel` on row tiles of the labels (``rows = N * H``), one
    class per step (each a row segment of one class plane, in any layout); ``STEP``:
    :func:`_row_step`."""
    SEG: tl.constexpr = 2 * BLOCK * STEP
    pid = tl.program_id(0)
    for it in range(0, iters):
        row, x0 = row_tile(pid, it, nprog, W, BLOCK, INT64)
        ok = row < rows
        x = x0 + tl.arange(0, BLOCK)
        mask = ok & (x < W)
        y = row % H
        n = row // H
        lo = tl.load(wi0 + x0)
        q0 = tl.load(wi0 + x, mask=mask, other=lo) - lo
        r0 = tl.load(hi0 + y) * sxh
        if not NEAREST:
            q1 = tl.load(wi1 + x, mask=mask, other=lo) - lo
            r1 = tl.load(hi1 + y) * sxh
            a0 = tl.load(hw0 + y)
            a1 = tl.load(hw1 + y)
            b0 = tl.load(ww0 + x, mask=mask, other=0.0)
            b1 = tl.load(ww1 + x, mask=mask, other=0.0)
        best = tl.full((BLOCK,), float('-inf'), tl.float32)
        label = tl.zeros((BLOCK,), tl.int32)
        found_nan = tl.zeros((BLOCK,), tl.int1)
        for c in range(0, C):
            base = n * sxn + c * sxc
            seg0 = row_segment(x_ptr, base + r0, lo, w, sxw, ok, SEG)
            if NEAREST:
                v = tl.gather(seg0, q0, 0)
            else:
                seg1 = row_segment(x_ptr, base + r1, lo, w, sxw, ok, SEG)
                x00 = tl.gather(seg0, q0, 0).to(tl.float32)
                x01 = tl.gather(seg0, q1, 0).to(tl.float32)
                x10 = tl.gather(seg1, q0, 0).to(tl.float32)
                x11 = tl.gather(seg1, q1, 0).to(tl.float32)
                v = (x00 * b0 + x01 * b1) * a0 + (x10 * b0 + x11 * b1) * a1
            v = v.to(x_ptr.dtype.element_ty).to(tl.float32)
            best, label, found_nan = better_label(v, c, best, label, found_nan)
        tl.store(out_ptr + row * W + x, label, mask=mask)


@triton.jit
def bilinear_bwd_rows_kernel(g_ptr, out_ptr, hstart, hcount, hweight, wstart, wcount,
                             wweight, rows, C, h, w, W, sgn, sgc, sgh, sgw, son, soc, soh,
                             sow, maxh, nprog, iters, INT64: tl.constexpr,
                             BLOCK: tl.constexpr, MAXW: tl.constexpr):
    """:func:`bilinear_bwd_kernel` on row tiles of the input gradient (``rows = N * C *
    h``; its strides ``so?``): each row of output gradients is loaded as one segment of
    ``BLOCK * MAXW`` columns, the ``(BLOCK, MAXW)`` tile of taps gathered from it."""
    SEG: tl.constexpr = BLOCK * MAXW
    pid = tl.program_id(0)
    dxs = tl.arange(0, MAXW)[None, :]
    for it in range(0, iters):
        row, j0 = row_tile(pid, it, nprog, w, BLOCK, INT64)
        ok = row < rows
        j = j0 + tl.arange(0, BLOCK)
        mask = ok & (j < w)
        n, c, i = row_plane(row, C, h)
        ys = tl.load(hstart + i)
        yc = tl.load(hcount + i)
        lo = tl.load(wstart + j0)
        xs = tl.load(wstart + j, mask=mask, other=lo) - lo
        xc = tl.load(wcount + j, mask=mask, other=0)
        xm = mask[:, None] & (dxs < xc[:, None])
        wx = tl.load(wweight + j[:, None] * MAXW + dxs, mask=xm, other=0.0)
        idx = tl.reshape(tl.where(xm, xs[:, None] + dxs, 0), (BLOCK * MAXW,))
        base = n * sgn + c * sgc
        acc = tl.zeros((BLOCK,), tl.float32)
        for dy in range(0, maxh):
            ym = ok & (dy < yc)
            wy = tl.load(hweight + i * maxh + dy, mask=ym, other=0.0)
            seg = row_segment(g_ptr, base + (ys + dy) * sgh, lo, W, sgw, ym, SEG)
            g = tl.reshape(tl.gather(seg, idx, 0), (BLOCK, MAXW))
            g = tl.where(xm & ym, g, 0).to(tl.float32)
            acc += tl.sum(g * wx, axis=1) * wy
        tl.store(out_ptr + n * son + c * soc + i * soh + j * sow, acc, mask=mask)


def _rows(x) -> bool:
    """Whether launches on ``x`` take the row kernels: on an NPU."""
    return launch_kind(x) == 'npu'


def _row_step(taps_w) -> int:
    """The ``STEP`` of the row kernels for column taps ``(i0, i1, ...)``, or 0 where they
    do not suit them. ``i0`` must be non-decreasing and ``i1 - i0`` in {0, 1}; ``STEP``
    is the next power of two of the largest step of ``i0`` (1 when upsampling, about the
    ratio when downsampling), so a tile of ``BLOCK`` outputs reads fewer than ``2 *
    BLOCK * STEP`` consecutive source columns: its segment. The launch divides its block
    by ``STEP`` (at most :data:`MAX_ROW_STEP`), so segments keep their size."""
    i0, i1 = taps_w[0].long(), taps_w[1].long()
    step = i0[1:] - i0[:-1]
    gap = i1 - i0
    if not (((gap >= 0) & (gap <= 1)).all() and (step >= 0).all()):
        return 0
    largest = triton.next_power_of_2(max(1, int(step.max()) if len(step) else 1))
    return largest if largest <= MAX_ROW_STEP else 0


# ------------------------------------------------------------------------ launchers
#: the widest class step of the channels_last argmax tile
MAX_BLOCK_C = 32
#: the largest downsampling ratio along W the row kernels take (:func:`_row_step`)
MAX_ROW_STEP = 128


def upsample_fwd(x, out_hw, taps_h, taps_w, nearest: bool, other=None):
    """``[other +] upsample(x)``: ``x`` ``(N, C, h, w)``; taps per axis ``(i0, i1, w0, w1)``.

    Returns ``(N, C, H, W)`` in ``x``'s dtype and layout (channels_last stays channels_last).
    """
    out = output_like(x, out_hw)
    total = out.numel()
    if total == 0:
        return out
    th, tw = taps(taps_h, x.device), taps(taps_w, x.device)
    add = other is not None
    o = other if add else out
    flat = add and tuple(o.stride()) == tuple(out.stride())
    step = _row_step(taps_w) if _rows(x) else 0
    if step:
        launch(upsample_fwd_rows_kernel, 'map', total,
               (x, out, o, *th, *tw, total // out_hw[1], x.shape[1], *out_hw, x.shape[3],
                *x.stride(), *out.stride(), *o.stride()),
               dict(NEAREST=nearest, ADD=add, OTHER_FLAT=flat, STEP=step), inner=step,
               row=out_hw[1])
        return out
    launch(upsample_fwd_kernel, 'map', total,
           (x, out, o, *th, *tw, total, x.shape[1], *out_hw, *x.stride(), *o.stride()),
           dict(NEAREST=nearest, ADD=add, OTHER_FLAT=flat, CL=channels_last(x)))
    return out


def upsample_argmax(x, out_hw, taps_h, taps_w, nearest: bool):
    """Labels ``(N, H, W)`` int64 of ``upsample(x).argmax(1)`` (computed as int32)."""
    import torch
    n, c = x.shape[:2]
    H, W = out_hw
    out = torch.empty((n, H, W), dtype=torch.int32, device=x.device)
    total = out.numel()
    if total:
        th, tw = taps(taps_h, x.device), taps(taps_w, x.device)
        step = _row_step(taps_w) if _rows(x) else 0
        if step:
            launch(upsample_argmax_rows_kernel, 'reduce', total,
                   (x, out, *th, *tw, n * H, c, H, W, x.shape[3], *x.stride()),
                   dict(NEAREST=nearest, STEP=step), inner=step, row=W)
            return out.long()
        cl = channels_last(x)
        block_c = min(triton.next_power_of_2(c), MAX_BLOCK_C) if cl else 1
        launch(upsample_argmax_kernel, 'reduce', total,
               (x, out, *th, *tw, total, c, H, W, *x.stride()),
               dict(NEAREST=nearest, CL=cl, BLOCK_C=block_c), inner=block_c)
    return out.long()


def _row_starts(start, count):
    """Reverse column tables' ``start`` for :func:`bilinear_bwd_rows_kernel`: a column
    that no output reads (``count == 0``, start 0) takes the start of the column before
    it, so starts are non-decreasing (the column reads nothing either way)."""
    import torch
    return torch.cummax(torch.where(count > 0, start, 0), 0).values.to(torch.int32)


def _reverse_taps_fit(start, maxw: int) -> bool:
    """Whether :func:`_row_starts` suit :func:`bilinear_bwd_rows_kernel`: steps of at
    most ``maxw``, so ``BLOCK`` input columns read at most ``BLOCK * maxw`` consecutive
    output columns (its segment)."""
    step = start[1:].long() - start[:-1].long()
    return bool((step <= maxw).all())


def bilinear_bwd(grad, in_hw, rows, cols):
    """Gradient with respect to the input of bilinear upsampling, float32, in ``grad``'s
    layout (channels_last stays).

    ``rows``/``cols``: the reverse tables of the H/W taps, ``(start, count, weight)``
    per input index: the first output index reading it, how many, and their weights
    (``(in, width)`` float32, zero-padded), computed by the caller from the same taps.
    Each input element gathers its contributions in a fixed order: deterministic.
    """
    import torch
    out = output_like(grad, in_hw, torch.float32)
    total = out.numel()
    if total == 0:
        return out
    dev = grad.device
    hs, hc, hw = (t.to(dev) for t in rows)
    ws, wc, ww = (t.to(dev) for t in cols)
    maxw = triton.next_power_of_2(ww.shape[1])
    ww = torch.nn.functional.pad(ww, (0, maxw - ww.shape[1])).contiguous()
    starts = _row_starts(cols[0], cols[1]) if _rows(grad) else None
    if starts is not None and _reverse_taps_fit(starts, maxw):
        launch(bilinear_bwd_rows_kernel, 'reduce', total,
               (grad, out, hs, hc, hw.contiguous(), starts.to(dev), wc, ww,
                total // in_hw[1], grad.shape[1], *in_hw, grad.shape[3], *grad.stride(),
                *out.stride(), hw.shape[1]),
               dict(MAXW=maxw), inner=maxw, row=in_hw[1])
        return out
    launch(bilinear_bwd_kernel, 'reduce', total,
           (grad, out, hs, hc, hw.contiguous(), ws, wc, ww, total, grad.shape[1], *in_hw,
            *grad.stride(), hw.shape[1]),
           dict(CL=channels_last(grad), MAXW=maxw), inner=maxw)
    return out
