"""The ``'mix_resize'`` method of ``resize_conv2d``: any sizes, no integer factor needed.

A resize acts on each channel alone and linearly, so for the convolution's tap ``(i, j)``
with ``C_out x C_in`` matrix ``W_ij``: ``conv(up(x), w) = Σ_ij shift_ij(up(W_ij · x))``,
``shift_ij`` moving the map by the tap's offset with zero fill (the convolution's own
zero padding, so no border strips are needed). The resize is separable (PyTorch maps
each axis on its own), and a shift along one axis commutes with the resize along the
other, so per kernel row ``i``:

1. mix at low resolution: ``z_ij = W_ij · x`` for the row's ``kW`` taps (one product);
2. resize the ``z_ij`` along the width only and sum them shifted along the width:
   ``a_i = Σ_j shift_j(up_W(z_ij))`` (maps of ``H_in`` rows);
3. resize ``a_i`` along the height and add it, shifted along the height, to the output.

So the full-resolution work is ``kH`` height resizes and sums of ``C_out`` maps. A
bilinear resize along one axis is the project's :func:`~mmseg_cann.ops.upsample` with the
call's own size or scale for that axis and the other axis at its own size (which PyTorch
copies); a nearest one selects the source indices PyTorch's 2-D kernel reads for the
call's sizes and dtype (:func:`mmseg_cann.core.taps.nearest_taps_of_kernel`; its index
arithmetic depends on the dtype and the kernel's path, e.g. 2 -> 82), so nearest sizes
must be concrete. The
bias is added to a tap that covers every output once (the centre tap of a ``'same'``
convolution) before its resizes (interpolation weights sum to one), else to the output.
Bilinear sizes may be symbolic: eagerly the shifted sums add into one buffer in place;
while a tracer records the op they are padded slices added out of place (ONNX ``Pad``,
``Slice``, ``Add``), valid for any size.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from ...core import geometry as geo
from ...core.resize_taps import ShiftAxis
from ...core.taps import nearest_taps_of_kernel
from ..upsample import upsample
from ._common import pointwise_conv2d, tracing


def _covering_tap(axis: ShiftAxis) -> Optional[int]:
    """The tap whose shifted map covers every output row once (``k = 2 * pad + 1``)."""
    return axis.pad if axis.k == 2 * axis.pad + 1 else None


def _resize_axis(t: torch.Tensor, axis: ShiftAxis, dim: int, args: geo.UpsampleArgs,
                 nearest) -> torch.Tensor:
    """``t`` resized along ``dim`` (2: height, 3: width) as the call resizes that axis;
    the other axis keeps its size (PyTorch copies an axis whose size does not change).
    Nearest modes select the source indices of PyTorch's 2-D kernel (``nearest``: the
    axis's table of :func:`~mmseg_cann.core.taps.nearest_taps_of_kernel`)."""
    if axis.identity:
        return t
    if nearest is not None:
        return t.index_select(dim, nearest.to(t.device))
    if axis.scale is None:
        size = (axis.n_up, t.shape[3]) if dim == 2 else (t.shape[2], axis.n_up)
        return upsample(t, size=size, mode=args.mode, align_corners=args.align_corners)
    scale = (axis.scale, 1.0) if dim == 2 else (1.0, axis.scale)
    return upsample(t, scale_factor=scale, recompute_scale_factor=False, mode=args.mode,
                    align_corners=args.align_corners)


def _shifted(u: torch.Tensor, axis: ShiftAxis, j: int, dim: int):
    """``(lead, rows)``: tap ``j``'s contribution along ``dim``, the rows of ``u`` it
    reads (none where the tap sees only padding) and the output row where they go (the
    rest of the output is zero for it)."""
    lead, _ = axis.window(j)
    start, left_out = axis.slice(j)
    return lead, u.narrow(dim, min(start, u.shape[dim]),
                          max(0, u.shape[dim] - start - left_out))


def _accumulate(acc, u: torch.Tensor, axis: ShiftAxis, j: int, dim: int, traced: bool):
    """``acc + shift_j(u)`` along ``dim`` (``acc`` None: the first term)."""
    if traced:
        # a padded slice (the zero padding, then the tap's window): any size
        pads = [0, 0, 0, 0]
        pads[2 * (3 - dim)] = pads[2 * (3 - dim) + 1] = axis.pad
        term = F.pad(u, pads).narrow(dim, j, axis.n_out)
        return term if acc is None else acc + term
    lead, rows = _shifted(u, axis, j, dim)
    if acc is None:
        if rows.shape[dim] == axis.n_out:
            return rows  # covers every output row: the buffer itself
        shape = list(u.shape)
        shape[dim] = axis.n_out
        acc = u.new_zeros(shape)
    if rows.shape[dim]:
        acc.narrow(dim, lead, rows.shape[dim]).add_(rows)
    return acc


def mix_resize(x: torch.Tensor, w: torch.Tensor, b, ah: ShiftAxis, aw: ShiftAxis,
               args: geo.UpsampleArgs) -> torch.Tensor:
    """``conv2d(upsample(x, args), w, b)`` (stride 1, one group, zero padding ``(ah.pad,
    aw.pad)``) by the mix-resize method (module doc)."""
    n, cin = x.shape[0], x.shape[1]
    cout, kh, kw = w.shape[0], w.shape[2], w.shape[3]
    traced = tracing()
    rows_idx = cols_idx = None
    if args.mode in geo.NEAREST_MODES:
        rows_idx, cols_idx = nearest_taps_of_kernel((ah.n_in, aw.n_in), args, x.dtype)
    cover_h, cover_w = _covering_tap(ah), _covering_tap(aw)
    bias_in_tap = b is not None and cover_h is not None and cover_w is not None
    out = None
    for i in range(kh):
        # the row's taps mixed at once: channels (j, o)
        w_row = w[:, :, i, :].permute(2, 0, 1).reshape(kw * cout, cin)
        row_bias = None
        if bias_in_tap and i == cover_h:
            row_bias = F.pad(b, (cover_w * cout, (kw - 1 - cover_w) * cout))
        z = pointwise_conv2d(x, w_row, row_bias)
        u = _resize_axis(z, aw, 3, args, cols_idx)
        u = u.reshape(n, kw, cout, u.shape[2], u.shape[3])
        row = None
        for j in range(kw):
            row = _accumulate(row, u[:, j], aw, j, 3, traced)
        out = _accumulate(out, _resize_axis(row, ah, 2, args, rows_idx), ah, i, 2, traced)
    if b is not None and not bias_in_tap:
        bias = b.view(1, -1, 1, 1)
        out = out + bias if traced or out.requires_grad else out.add_(bias)
    return out
