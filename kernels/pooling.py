"""Triton pooling kernels and their launchers: max pooling forward (values and PyTorch's
flat indices) and average pooling with float32 accumulation.

The window grid comes from :class:`mmseg_cann.ops.geometry.PoolSpec` (output size,
``pad_begin`` including asymmetric SAME padding, dilation); per-axis tables computed on
the host from the same module give the average divisor factors and max pooling's default
index (the first in-bounds tap). Kernel sizes are compile-time constants (the tap loops
unroll). Same device rules as :mod:`.upsample`: 1-D grid sized to the device, loop
inside, int32 offsets and index loads; NCHW and channels_last through strides.
"""
from __future__ import annotations

import triton
import triton.language as tl

from . import interpreter_compat
from .upsample import BLOCK, _channels_last, _decompose, _loop

interpreter_compat.apply()


@triton.jit
def max_pool_kernel(x_ptr, out_ptr, idx_ptr, first_h, first_w, total, nprog, iters,
                    C, OH, OW, IH, IW, sxn, sxc, sxh, sxw, son, soc, soh, sow,
                    SH: tl.constexpr, SW: tl.constexpr, PH: tl.constexpr, PW: tl.constexpr,
                    DH: tl.constexpr, DW: tl.constexpr, KH: tl.constexpr, KW: tl.constexpr,
                    CL: tl.constexpr, BLOCK: tl.constexpr):
    """Max over each window; NaN wins (PyTorch: ``val > max or isnan(val)``)."""
    pid = tl.program_id(0)
    for it in range(0, iters):
        e = (it * nprog + pid) * BLOCK + tl.arange(0, BLOCK)
        mask = e < total
        n, c, oy, ox = _decompose(e, C, OH, OW, CL)
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
                arg = tl.where(take, iy * IW + ix, arg)
        o = n * son + c * soc + oy * soh + ox * sow
        tl.store(out_ptr + o, best.to(out_ptr.dtype.element_ty), mask=mask)
        tl.store(idx_ptr + o, arg, mask=mask)


@triton.jit
def avg_pool_kernel(x_ptr, out_ptr, div_h, div_w, total, nprog, iters, C, OH, OW, IH, IW,
                    sxn, sxc, sxh, sxw, son, soc, soh, sow, override,
                    SH: tl.constexpr, SW: tl.constexpr, PH: tl.constexpr, PW: tl.constexpr,
                    KH: tl.constexpr, KW: tl.constexpr, OVERRIDE: tl.constexpr,
                    CL: tl.constexpr, BLOCK: tl.constexpr):
    """Window sums accumulated in float32, divided by the divisor, rounded once."""
    pid = tl.program_id(0)
    for it in range(0, iters):
        e = (it * nprog + pid) * BLOCK + tl.arange(0, BLOCK)
        mask = e < total
        n, c, oy, ox = _decompose(e, C, OH, OW, CL)
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
            div = override.to(tl.float32)
        else:
            div = (tl.load(div_h + oy, mask=mask, other=1)
                   * tl.load(div_w + ox, mask=mask, other=1)).to(tl.float32)
        tl.store(out_ptr + n * son + c * soc + oy * soh + ox * sow,
                 (acc / div).to(out_ptr.dtype.element_ty), mask=mask)


def _output(x, out_hw, dtype=None):
    import torch
    fmt = torch.channels_last if _channels_last(x) else torch.contiguous_format
    return torch.empty((x.shape[0], x.shape[1]) + tuple(out_hw), dtype=dtype or x.dtype,
                       device=x.device, memory_format=fmt)


def max_pool2d(x, spec):
    """``(values, indices)`` of max pooling; indices are int64 flat indices into H*W."""
    import torch
    from mmseg_cann.ops import geometry as geo
    out = _output(x, spec.out_size)
    idx = _output(x, spec.out_size, torch.int32)
    total = out.numel()
    if total:
        first = [torch.tensor([geo.first_valid_tap(o, spec.in_size[a], spec.stride[a],
                                                   spec.pad_begin[a], spec.dilation[a])
                               for o in range(spec.out_size[a])], dtype=torch.int32,
                              device=x.device) for a in range(2)]
        grid, nprog, iters = _loop(total, x.device)
        max_pool_kernel[grid](
            x, out, idx, *first, total, nprog, iters, x.shape[1], *spec.out_size,
            *spec.in_size, *x.stride(), *out.stride(), SH=spec.stride[0], SW=spec.stride[1],
            PH=spec.pad_begin[0], PW=spec.pad_begin[1], DH=spec.dilation[0],
            DW=spec.dilation[1], KH=spec.kernel[0], KW=spec.kernel[1],
            CL=_channels_last(x), BLOCK=BLOCK)
    return out, idx.long()


def avg_pool2d(x, spec, count_include_pad=True, divisor_override=None):
    """Average pooling with float32 accumulation; result in ``x``'s dtype."""
    import torch
    from mmseg_cann.ops import geometry as geo
    out = _output(x, spec.out_size)
    total = out.numel()
    if total:
        divs = [torch.tensor([geo.avg_divisor(o, spec.in_size[a], spec.kernel[a],
                                              spec.stride[a], spec.pad_begin[a],
                                              spec.pad_end[a], count_include_pad)
                              for o in range(spec.out_size[a])], dtype=torch.int32,
                             device=x.device) for a in range(2)]
        grid, nprog, iters = _loop(total, x.device)
        avg_pool_kernel[grid](
            x, out, *divs, total, nprog, iters, x.shape[1], *spec.out_size, *spec.in_size,
            *x.stride(), *out.stride(), int(divisor_override or 1),
            SH=spec.stride[0], SW=spec.stride[1], PH=spec.pad_begin[0], PW=spec.pad_begin[1],
            KH=spec.kernel[0], KW=spec.kernel[1], OVERRIDE=divisor_override is not None,
            CL=_channels_last(x), BLOCK=BLOCK)
    return out
