"""Triton upsample kernels and their launchers: nearest/bilinear forward (optionally
fused with an add), fused upsample + argmax, and a deterministic bilinear backward.

Geometry comes from the host: per axis, two source taps ``i0, i1`` (int32) and weights
``w0, w1`` (float32) computed by :func:`mmseg_cann.core.taps.linear_taps` (bilinear)
or :func:`mmseg_cann.core.reference.nearest_indices` (nearest modes), so the kernels hold
no coordinate rules of their own. The value of an output pixel is
``(x[h0, w0] * ww0 + x[h0, w1] * ww1) * wh0 + (x[h1, w0] * ww0 + x[h1, w1] * ww1) * wh1``
in float32 (PyTorch's order), rounded once to the input dtype.

Written for triton-ascend as well as GPU Triton; device rules in :mod:`._common`.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ._common import BLOCK, channels_last, decompose, loop, output_like, taps


@triton.jit
def upsample_fwd_kernel(x_ptr, out_ptr, other_ptr, hi0, hi1, hw0, hw1, wi0, wi1, ww0, ww1,
                        total, nprog, iters, C, H, W, sxn, sxc, sxh, sxw, son, soc, soh, sow,
                        stn, stc, sth, stw,
                        NEAREST: tl.constexpr, ADD: tl.constexpr, CL: tl.constexpr,
                        BLOCK: tl.constexpr):
    """``out = [other +] upsample(x)``, one output element per lane."""
    pid = tl.program_id(0)
    for it in range(0, iters):
        e = (it * nprog + pid) * BLOCK + tl.arange(0, BLOCK)
        mask = e < total
        n, c, y, x = decompose(e, C, H, W, CL)
        base = n * sxn + c * sxc
        h0 = tl.load(hi0 + y, mask=mask, other=0)
        w0 = tl.load(wi0 + x, mask=mask, other=0)
        if NEAREST:
            v = tl.load(x_ptr + base + h0 * sxh + w0 * sxw, mask=mask, other=0).to(tl.float32)
        else:
            h1 = tl.load(hi1 + y, mask=mask, other=0)
            w1 = tl.load(wi1 + x, mask=mask, other=0)
            a0 = tl.load(hw0 + y, mask=mask, other=0.0)
            a1 = tl.load(hw1 + y, mask=mask, other=0.0)
            b0 = tl.load(ww0 + x, mask=mask, other=0.0)
            b1 = tl.load(ww1 + x, mask=mask, other=0.0)
            x00 = tl.load(x_ptr + base + h0 * sxh + w0 * sxw, mask=mask, other=0).to(tl.float32)
            x01 = tl.load(x_ptr + base + h0 * sxh + w1 * sxw, mask=mask, other=0).to(tl.float32)
            x10 = tl.load(x_ptr + base + h1 * sxh + w0 * sxw, mask=mask, other=0).to(tl.float32)
            x11 = tl.load(x_ptr + base + h1 * sxh + w1 * sxw, mask=mask, other=0).to(tl.float32)
            v = (x00 * b0 + x01 * b1) * a0 + (x10 * b0 + x11 * b1) * a1
        v = v.to(out_ptr.dtype.element_ty)
        if ADD:
            o = tl.load(other_ptr + n * stn + c * stc + y * sth + x * stw, mask=mask, other=0)
            v = (v.to(tl.float32) + o.to(tl.float32)).to(out_ptr.dtype.element_ty)
        tl.store(out_ptr + n * son + c * soc + y * soh + x * sow, v, mask=mask)


@triton.jit
def upsample_argmax_kernel(x_ptr, out_ptr, hi0, hi1, hw0, hw1, wi0, wi1, ww0, ww1,
                           total, nprog, iters, C, H, W, sxn, sxc, sxh, sxw,
                           NEAREST: tl.constexpr, BLOCK: tl.constexpr):
    """``out[n, y, x] = argmax_c upsample(x)[n, c, y, x]`` (int32; first maximum wins)."""
    pid = tl.program_id(0)
    for it in range(0, iters):
        e = (it * nprog + pid) * BLOCK + tl.arange(0, BLOCK)
        mask = e < total
        x = e % W
        t = e // W
        y = t % H
        n = t // H
        h0 = tl.load(hi0 + y, mask=mask, other=0)
        h1 = tl.load(hi1 + y, mask=mask, other=0)
        w0 = tl.load(wi0 + x, mask=mask, other=0)
        w1 = tl.load(wi1 + x, mask=mask, other=0)
        a0 = tl.load(hw0 + y, mask=mask, other=0.0)
        a1 = tl.load(hw1 + y, mask=mask, other=0.0)
        b0 = tl.load(ww0 + x, mask=mask, other=0.0)
        b1 = tl.load(ww1 + x, mask=mask, other=0.0)
        best = tl.full((BLOCK,), float('-inf'), tl.float32)
        label = tl.zeros((BLOCK,), tl.int32)
        for c in range(0, C):
            base = n * sxn + c * sxc
            if NEAREST:
                v = tl.load(x_ptr + base + h0 * sxh + w0 * sxw, mask=mask, other=0)
            else:
                x00 = tl.load(x_ptr + base + h0 * sxh + w0 * sxw, mask=mask, other=0).to(tl.float32)
                x01 = tl.load(x_ptr + base + h0 * sxh + w1 * sxw, mask=mask, other=0).to(tl.float32)
                x10 = tl.load(x_ptr + base + h1 * sxh + w0 * sxw, mask=mask, other=0).to(tl.float32)
                x11 = tl.load(x_ptr + base + h1 * sxh + w1 * sxw, mask=mask, other=0).to(tl.float32)
                v = (x00 * b0 + x01 * b1) * a0 + (x10 * b0 + x11 * b1) * a1
            # round to the input dtype first, as the unfused computation does
            v = v.to(x_ptr.dtype.element_ty).to(tl.float32)
            better = (v > best) | (c == 0)
            best = tl.where(better, v, best)
            label = tl.where(better, c, label)
        tl.store(out_ptr + e, label, mask=mask)


@triton.jit
def bilinear_bwd_kernel(g_ptr, out_ptr, hstart, hcount, wstart, wcount,
                        hi0, hi1, hw0, hw1, wi0, wi1, ww0, ww1,
                        total, nprog, iters, C, h, w, sgn, sgc, sgh, sgw,
                        MAXH: tl.constexpr, MAXW: tl.constexpr, BLOCK: tl.constexpr):
    """Gradient of bilinear upsampling, gather form: each input element sums the output
    gradients that read it, in a fixed order (no atomics: bitwise deterministic).

    ``hstart/hcount`` (per input row): the output rows whose taps include it, a
    contiguous range of at most ``MAXH``; the same along W. ``out`` is NCHW float32.
    """
    pid = tl.program_id(0)
    for it in range(0, iters):
        e = (it * nprog + pid) * BLOCK + tl.arange(0, BLOCK)
        mask = e < total
        j = e % w
        t = e // w
        i = t % h
        t = t // h
        c = t % C
        n = t // C
        ys = tl.load(hstart + i, mask=mask, other=0)
        yc = tl.load(hcount + i, mask=mask, other=0)
        xs = tl.load(wstart + j, mask=mask, other=0)
        xc = tl.load(wcount + j, mask=mask, other=0)
        acc = tl.zeros((BLOCK,), tl.float32)
        for dy in range(0, MAXH):
            y = ys + dy
            ym = mask & (dy < yc)
            wy = (tl.where(tl.load(hi0 + y, mask=ym, other=-1) == i,
                           tl.load(hw0 + y, mask=ym, other=0.0), 0.0)
                  + tl.where(tl.load(hi1 + y, mask=ym, other=-1) == i,
                             tl.load(hw1 + y, mask=ym, other=0.0), 0.0))
            row = tl.zeros((BLOCK,), tl.float32)
            for dx in range(0, MAXW):
                x = xs + dx
                xm = ym & (dx < xc)
                wx = (tl.where(tl.load(wi0 + x, mask=xm, other=-1) == j,
                               tl.load(ww0 + x, mask=xm, other=0.0), 0.0)
                      + tl.where(tl.load(wi1 + x, mask=xm, other=-1) == j,
                                 tl.load(ww1 + x, mask=xm, other=0.0), 0.0))
                g = tl.load(g_ptr + n * sgn + c * sgc + y * sgh + x * sgw, mask=xm,
                            other=0).to(tl.float32)
                row += g * wx
            acc += row * wy
        tl.store(out_ptr + e, acc, mask=mask)


# ------------------------------------------------------------------------ launchers
def upsample_fwd(x, out_hw, taps_h, taps_w, nearest: bool, other=None):
    """``[other +] upsample(x)``: ``x`` ``(N, C, h, w)``; taps per axis ``(i0, i1, w0, w1)``.

    Returns ``(N, C, H, W)`` in ``x``'s dtype and layout (channels_last stays channels_last).
    """
    import torch
    n, c = x.shape[:2]
    H, W = out_hw
    cl = channels_last(x)
    out = torch.empty((n, c, H, W), dtype=x.dtype, device=x.device,
                      memory_format=torch.channels_last if cl else torch.contiguous_format)
    total = out.numel()
    if total == 0:
        return out
    th, tw = taps(taps_h, x.device), taps(taps_w, x.device)
    o = other if other is not None else out
    grid, nprog, iters = loop(total, x.device)
    upsample_fwd_kernel[grid](
        x, out, o, *th, *tw, total, nprog, iters, c, H, W, *x.stride(), *out.stride(), *o.stride(),
        NEAREST=nearest, ADD=other is not None, CL=cl, BLOCK=BLOCK)
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
        grid, nprog, iters = loop(total, x.device)
        upsample_argmax_kernel[grid](
            x, out, *th, *tw, total, nprog, iters, c, H, W, *x.stride(), NEAREST=nearest,
            BLOCK=BLOCK)
    return out.long()


def _reverse_ranges(taps, in_size: int):
    """Per input index: first output index reading it, how many, and the longest range."""
    import torch
    i0, i1 = taps[0], taps[1]
    out_size = len(i0)
    lo = torch.full((in_size,), out_size, dtype=torch.int64)
    hi = torch.full((in_size,), -1, dtype=torch.int64)
    d = torch.arange(out_size)
    for idx in (i0, i1):
        lo.scatter_reduce_(0, idx, d, 'amin')
        hi.scatter_reduce_(0, idx, d, 'amax')
    count = (hi - lo + 1).clamp_min(0)
    start = torch.where(count > 0, lo, torch.zeros_like(lo))
    return start.to(torch.int32), count.to(torch.int32), max(int(count.max()), 1)


def bilinear_bwd(grad, in_hw, taps_h, taps_w):
    """Gradient with respect to the input of bilinear upsampling, float32 NCHW.

    Each input element gathers its contributions in a fixed order: deterministic.
    (The output rows reading an input row form one contiguous range because the taps
    are non-decreasing in the output index.)
    """
    import torch
    n, c = grad.shape[:2]
    h, w = in_hw
    out = torch.empty((n, c, h, w), dtype=torch.float32, device=grad.device)
    total = out.numel()
    if total == 0:
        return out
    hs, hc, maxh = _reverse_ranges(taps_h, h)
    ws, wc, maxw = _reverse_ranges(taps_w, w)
    th, tw = taps(taps_h, grad.device), taps(taps_w, grad.device)
    grid, nprog, iters = loop(total, grad.device)
    bilinear_bwd_kernel[grid](
        grad, out, hs.to(grad.device), hc.to(grad.device), ws.to(grad.device),
        wc.to(grad.device), *th, *tw, total, nprog, iters, c, h, w, *grad.stride(),
        MAXH=maxh, MAXW=maxw, BLOCK=BLOCK)
    return out
