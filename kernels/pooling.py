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

from ._common import block_offsets, channels_last, decompose, launch, output_like


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
        launch(avg_pool_kernel, 'pool', total,
               (x, out, *divs, total, x.shape[1], *spec.out_size, *spec.in_size,
                *x.stride(), override),
               dict(_pool_geometry(spec), OVERRIDE=divisor_override is not None,
                    CL=channels_last(x)))
    return out
