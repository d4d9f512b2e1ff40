"""Triton pooling kernels and their launchers: max pooling forward (values and PyTorch's
flat indices) and average pooling with float32 accumulation.

The window grid comes from the caller's :class:`mmseg_cann.core.geometry.PoolSpec`
(output size, ``pad_begin`` including asymmetric SAME padding, dilation); per-axis tables
the caller computes from the same geometry give the average divisor factors and max
pooling's default index (the first in-bounds tap): the kernels hold no geometry rules.
Kernel sizes are compile-time constants (the tap loops unroll). Inputs are ``(N, C, H,
W)``; the caller adds and removes the batch dimension of 3-D inputs. Device rules and
the launch configuration as in :mod:`._common`.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ._common import (block_offsets, channels_last, decompose, launch, launch_kind,
                      output_like, row_plane, row_tile)


@triton.jit
def max_pool_kernel(x_ptr, out_ptr, idx_ptr, first_h, first_w, total,
                    C, OH, OW, IH, IW, sxn, sxc, sxh, sxw, nprog, iters,
                    SH: tl.constexpr, SW: tl.constexpr, PH: tl.constexpr, PW: tl.constexpr,
                    DH: tl.constexpr, DW: tl.constexpr, KH: tl.constexpr, KW: tl.constexpr,
                    CL: tl.constexpr, INT64: tl.constexpr, BLOCK: tl.constexpr):
    """Max over each window; NaN wins (PyTorch: ``val > max or isnan(val)``). Values and
    int32 plane indices are stored at ``+ e`` (the outputs' memory order is the flat
    order)."""
    pid = tl.program_id(0)
    for it in range(0, iters):
        e = block_offsets(pid, it, nprog, BLOCK, INT64)
        mask = e < total
        n, c, oy, ox = decompose(e, C, OH, OW, CL)
        base = n * sxn + c * sxc
        best = tl.full((BLOCK,), float('-inf'), tl.float32)
        fy = tl.load(first_h + oy, mask=mask, other=0)
        fx = tl.load(first_w + ox, mask=mask, other=0)
        arg = fy * IW + fx
        for ky in tl.static_range(KH):
            iy = oy * SH - PH + ky * DH
            for kx in tl.static_range(KW):
                ix = ox * SW - PW + kx * DW
                ok = mask & (iy >= 0) & (iy < IH) & (ix >= 0) & (ix < IW)
                v = tl.load(x_ptr + base + iy * sxh + ix * sxw, mask=ok,
                            other=float('-inf')).to(tl.float32)
                take = ok & ((v > best) | (v != v))
                best = tl.where(take, v, best)
                arg = tl.where(take, (iy * IW + ix).to(tl.int32), arg)
        tl.store(out_ptr + e, best.to(out_ptr.dtype.element_ty), mask=mask)
        tl.store(idx_ptr + e, arg, mask=mask)


@triton.jit
def avg_pool_kernel(x_ptr, out_ptr, div_h, div_w, total, C, OH, OW, IH, IW,
                    sxn, sxc, sxh, sxw, override, nprog, iters,
                    SH: tl.constexpr, SW: tl.constexpr, PH: tl.constexpr, PW: tl.constexpr,
                    KH: tl.constexpr, KW: tl.constexpr, OVERRIDE: tl.constexpr,
                    CL: tl.constexpr, INT64: tl.constexpr, BLOCK: tl.constexpr):
    """Window sums accumulated in float32, divided by the divisor, rounded once.

    ``override`` (used when ``OVERRIDE``) is passed as a float: a Python float is never
    specialised by the launch, where an int equal to 1 would become a constant.
    """
    pid = tl.program_id(0)
    for it in range(0, iters):
        e = block_offsets(pid, it, nprog, BLOCK, INT64)
        mask = e < total
        n, c, oy, ox = decompose(e, C, OH, OW, CL)
        base = n * sxn + c * sxc
        acc = tl.zeros((BLOCK,), tl.float32)
        for ky in tl.static_range(KH):
            iy = oy * SH - PH + ky
            for kx in tl.static_range(KW):
                ix = ox * SW - PW + kx
                ok = mask & (iy >= 0) & (iy < IH) & (ix >= 0) & (ix < IW)
                acc += tl.load(x_ptr + base + iy * sxh + ix * sxw, mask=ok,
                               other=0).to(tl.float32)
        if OVERRIDE:
            div = override
        else:
            div = (tl.load(div_h + oy, mask=mask, other=1)
                   * tl.load(div_w + ox, mask=mask, other=1)).to(tl.float32)
        tl.store(out_ptr + e, (acc / div).to(out_ptr.dtype.element_ty), mask=mask)


# ------------------------------------------------------------- row kernels (Ascend)
# Tiles of one output row of one (n, c) plane, addressed through strides (any layout):
# the input columns a tile's windows read along one input row are loaded as one segment
# (a contiguous or constant-stride load), and each tap's columns ``S * ox + o`` are
# selected from it in registers (``tl.gather``), so every load is a block access on
# triton-ascend (no per-element loop). Chosen at launch on NPUs; same taps in the same
# order as the flat kernels above. The window's rows are a runtime loop: unrolled,
# triton-adapter-opt 3.2 crashed on these kernels at random (heap corruption in about a
# third of the runs).
#: the widest window span (``(kernel - 1) * dilation``) and column stride the row
#: kernels take: a tile of ``BLOCK >= 16`` columns with stride ``S <= SP`` (``SP`` its
#: next power of two) reads ``S * (BLOCK - 1) + span + 1 <= 4 * BLOCK * SP`` columns,
#: its segment (the launch divides its block by ``SP``)
MAX_ROW_SPAN = 32
MAX_ROW_STRIDE = 16


@triton.jit
def row_segment(x_ptr, row_base, x0, o_first, IW, sxw, row_ok, other, S: tl.constexpr,
                SP: tl.constexpr, BLOCK: tl.constexpr):
    """The ``4 * BLOCK * SP`` input columns from ``S * x0 + o_first`` of one row
    (``other`` outside it), in one load."""
    cols = S * x0 + o_first + tl.arange(0, 4 * BLOCK * SP)
    return tl.load(x_ptr + row_base + cols * sxw,
                   mask=row_ok & (cols >= 0) & (cols < IW), other=other)


@triton.jit
def row_tap(segment, x0, o, o_first, IW, lane_ok, S: tl.constexpr, BLOCK: tl.constexpr):
    """Tap columns ``ix = S * ox + o`` of a :func:`row_segment` (``ox = x0 +
    tl.arange(0, BLOCK)``): values as float32, ``ix``, and where ``ix`` is inside the row
    (and ``lane_ok``)."""
    lanes = tl.arange(0, BLOCK)
    ix = S * (x0 + lanes) + o
    v = tl.gather(segment, S * lanes + (o - o_first), 0).to(tl.float32)
    return v, ix, lane_ok & (ix >= 0) & (ix < IW)


@triton.jit
def max_pool_rows_kernel(x_ptr, out_ptr, idx_ptr, first_h, first_w, rows,
                         C, OH, OW, IH, IW, sxn, sxc, sxh, sxw, son, soc, soh, sow, nprog,
                         iters,
                         SH: tl.constexpr, SW: tl.constexpr, PH: tl.constexpr,
                         PW: tl.constexpr, DH: tl.constexpr, DW: tl.constexpr,
                         KH: tl.constexpr, KW: tl.constexpr, SP: tl.constexpr,
                         INT64: tl.constexpr, BLOCK: tl.constexpr):
    """:func:`max_pool_kernel` on row tiles of the outputs (``rows = N * C * OH``; their
    strides ``so?``)."""
    pid = tl.program_id(0)
    for it in range(0, iters):
        row, x0 = row_tile(pid, it, nprog, OW, BLOCK, INT64)
        ok = row < rows
        ox = x0 + tl.arange(0, BLOCK)
        mask = ok & (ox < OW)
        n, c, oy = row_plane(row, C, OH)
        base = n * sxn + c * sxc
        best = tl.full((BLOCK,), float('-inf'), tl.float32)
        fy = tl.load(first_h + oy)
        fx = tl.load(first_w + ox, mask=mask, other=0)
        arg = fy * IW + fx
        for ky in range(0, KH):  # not unrolled (see above)
            iy = oy * SH - PH + ky * DH
            row_ok = ok & (iy >= 0) & (iy < IH)
            seg = row_segment(x_ptr, base + iy * sxh, x0, -PW, IW, sxw, row_ok,
                              float('-inf'), SW, SP, BLOCK)
            for kx in tl.static_range(KW):
                v, ix, tap_ok = row_tap(seg, x0, kx * DW - PW, -PW, IW, mask & row_ok, SW,
                                        BLOCK)
                take = tap_ok & ((v > best) | (v != v))
                best = tl.where(take, v, best)
                arg = tl.where(take, (iy * IW + ix).to(tl.int32), arg)
        e = n * son + c * soc + oy * soh + ox * sow
        tl.store(out_ptr + e, best.to(out_ptr.dtype.element_ty), mask=mask)
        tl.store(idx_ptr + e, arg, mask=mask)


@triton.jit
def avg_pool_rows_kernel(x_ptr, out_ptr, div_h, div_w, rows, C, OH, OW, IH, IW,
                         sxn, sxc, sxh, sxw, son, soc, soh, sow, override, nprog, iters,
                         SH: tl.constexpr, SW: tl.constexpr, PH: tl.constexpr,
                         PW: tl.constexpr, KH: tl.constexpr, KW: tl.constexpr,
                         OVERRIDE: tl.constexpr, SP: tl.constexpr, INT64: tl.constexpr,
                         BLOCK: tl.constexpr):
    """:func:`avg_pool_kernel` on row tiles of the output (``rows = N * C * OH``; its
    strides ``so?``)."""
    pid = tl.program_id(0)
    for it in range(0, iters):
        row, x0 = row_tile(pid, it, nprog, OW, BLOCK, INT64)
        ok = row < rows
        ox = x0 + tl.arange(0, BLOCK)
        mask = ok & (ox < OW)
        n, c, oy = row_plane(row, C, OH)
        base = n * sxn + c * sxc
        acc = tl.zeros((BLOCK,), tl.float32)
        for ky in range(0, KH):  # not unrolled (see above)
            iy = oy * SH - PH + ky
            row_ok = ok & (iy >= 0) & (iy < IH)
            seg = row_segment(x_ptr, base + iy * sxh, x0, -PW, IW, sxw, row_ok, 0, SW, SP,
                              BLOCK)
            for kx in tl.static_range(KW):
                v, ix, tap_ok = row_tap(seg, x0, kx - PW, -PW, IW, mask & row_ok, SW, BLOCK)
                acc += tl.where(tap_ok, v, 0.0)
        if OVERRIDE:
            div = override
        else:
            div = (tl.load(div_h + oy) * tl.load(div_w + ox, mask=mask, other=1)
                   ).to(tl.float32)
        tl.store(out_ptr + n * son + c * soc + oy * soh + ox * sow,
                 (acc / div).to(out_ptr.dtype.element_ty), mask=mask)


def _rows(x, spec) -> int:
    """``SP`` (the next power of two of the column stride) where a pooling launch on
    ``x`` takes the row kernels (on an NPU, a column stride of at most
    :data:`MAX_ROW_STRIDE`, a window span of at most :data:`MAX_ROW_SPAN` columns),
    else 0."""
    if (launch_kind(x) == 'npu' and spec.stride[1] <= MAX_ROW_STRIDE
            and (spec.kernel[1] - 1) * spec.dilation[1] <= MAX_ROW_SPAN):
        return triton.next_power_of_2(spec.stride[1])
    return 0


def _pool_geometry(spec):
    """The window grid's constexprs shared by both kernels."""
    return dict(SH=spec.stride[0], SW=spec.stride[1], PH=spec.pad_begin[0],
                PW=spec.pad_begin[1], KH=spec.kernel[0], KW=spec.kernel[1])


def max_pool2d(x, spec, first_taps):
    """``(values, indices)`` of max pooling of ``(N, C, H, W)`` ``x``; indices are int64
    flat indices into H*W (which must be below 2^31).

    ``spec`` is a :class:`mmseg_cann.core.geometry.PoolSpec`; ``first_taps`` the per-axis
    int32 tables of each window's first in-bounds tap (PyTorch's default index), computed
    by the caller from the same geometry.
    """
    import torch
    out = output_like(x, spec.out_size)
    idx = output_like(x, spec.out_size, torch.int32)
    total = out.numel()
    if total:
        first = [t.to(x.device, torch.int32) for t in first_taps]
        sp = _rows(x, spec)
        if sp:
            launch(max_pool_rows_kernel, 'pool', total,
                   (x, out, idx, *first, total // spec.out_size[1], x.shape[1],
                    *spec.out_size, *spec.in_size, *x.stride(), *out.stride()),
                   dict(_pool_geometry(spec), DH=spec.dilation[0], DW=spec.dilation[1],
                        SP=sp), inner=sp, row=spec.out_size[1])
            return out, idx.long()
        launch(max_pool_kernel, 'pool', total,
               (x, out, idx, *first, total, x.shape[1], *spec.out_size, *spec.in_size,
                *x.stride()),
               dict(_pool_geometry(spec), DH=spec.dilation[0], DW=spec.dilation[1],
                    CL=channels_last(x)))
    return out, idx.long()


def avg_pool2d(x, spec, divisors, divisor_override=None):
    """Average pooling of ``(N, C, H, W)`` ``x`` with float32 accumulation; result in
    ``x``'s dtype.

    ``divisors`` are the per-axis int32 divisor factors of each window (their product is
    the window's divisor), computed by the caller; ``divisor_override`` replaces them.
    """
    import torch
    out = output_like(x, spec.out_size)
    total = out.numel()
    if total:
        divs = [t.to(x.device, torch.int32) for t in divisors]
        override = float(divisor_override) if divisor_override is not None else 1.0
        sp = _rows(x, spec)
        if sp:
            launch(avg_pool_rows_kernel, 'pool', total,
                   (x, out, *divs, total // spec.out_size[1], x.shape[1], *spec.out_size,
                    *spec.in_size, *x.stride(), *out.stride(), override),
                   dict(_pool_geometry(spec), OVERRIDE=divisor_override is not None,
                        SP=sp), inner=sp, row=spec.out_size[1])
            return out
        launch(avg_pool_kernel, 'pool', total,
               (x, out, *divs, total, x.shape[1], *spec.out_size, *spec.in_size,
                *x.stride(), override),
               dict(_pool_geometry(spec), OVERRIDE=divisor_override is not None,
                    CL=channels_last(x)))
    return out
