"""Tap builders: the per-axis index and weight tables the fast paths consume.

One rule per table, shared by every implementation that needs it (the torch band path
and the numba kernels of the fused ops, the Triton kernels, the native backend's
asymmetric pooling), so two paths never round a coordinate differently.
"""
from __future__ import annotations

from functools import lru_cache
from typing import List, Optional, Tuple

import torch

from . import geometry as geo


@lru_cache(maxsize=256)
def linear_taps(in_size: int, out_size: int, align_corners: bool,
                scale: Optional[float] = None
                ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """PyTorch's bilinear taps along one axis: ``(i0, i1, w0, w1)``, shape ``(out,)``.

    ``scale`` is the user scale factor PyTorch maps with (``1 / scale``), or None to map
    with ``in / out`` (:func:`geometry.coordinate_scale`). Source coordinates are
    computed in float32 as PyTorch's kernel does (``step * (d + 0.5) - 0.5`` clamped at
    0, or ``d * step`` with ``align_corners``); ``i0 = min(floor(src), in - 1)``,
    ``i1 = min(i0 + 1, in - 1)``, ``w1 = clamp(src - i0, 0, 1)``, ``w0 = 1 - w1``.
    An unchanged axis mapped with ``in / out`` is copied (``i0 = i1 = d``), as PyTorch
    does (:class:`geometry.UpsampleSpec` passes ``scale=None`` for such axes).

    The half-pixel coordinate is one fused multiply-add, rounded once, as the compiled
    x86 kernel of PyTorch evaluates it (``fma(step, d + 0.5, -0.5)``; with a separate
    rounding of the product, 1081 of 20100 values of a 37x53 -> 100x201 resize differ
    in the last bit). The float64 product of two float32 values is exact and so is the
    sum with -0.5, so computing in float64 and rounding to float32 is that FMA.
    """
    if scale is None and in_size == out_size:
        idx = torch.arange(out_size)
        return idx, idx, torch.ones(out_size), torch.zeros(out_size)
    step = torch.tensor(geo.coordinate_scale(in_size, out_size, align_corners, scale),
                        dtype=torch.float32)
    if align_corners:
        src = torch.arange(out_size, dtype=torch.float32) * step
    else:
        d = torch.arange(out_size, dtype=torch.float64)
        src = ((d + 0.5) * step.double() - 0.5).float().clamp_min(0)
    i0 = src.floor().to(torch.int64).clamp_max(in_size - 1)
    w1 = (src - i0).clamp(0, 1)
    return i0, (i0 + 1).clamp_max(in_size - 1), 1 - w1, w1


def pool_first_taps(spec: geo.PoolSpec) -> List[List[int]]:
    """Per axis, each window's first in-bounds tap (PyTorch's index for a window whose
    input cells are all the lowest value)."""
    return [[geo.first_valid_tap(o, spec.in_size[a], spec.stride[a], spec.pad_begin[a],
                                 spec.dilation[a]) for o in range(spec.out_size[a])]
            for a in range(2)]


def pool_divisors(spec: geo.PoolSpec, count_include_pad: bool) -> List[List[int]]:
    """Per axis, each window's divisor factor (a window's divisor is the product)."""
    return [[geo.avg_divisor(o, spec.in_size[a], spec.kernel[a], spec.stride[a],
                             spec.pad_begin[a], spec.pad_end[a], count_include_pad)
             for o in range(spec.out_size[a])] for a in range(2)]


@lru_cache(maxsize=256)
def nearest_taps_of_kernel(in_hw: Tuple[int, int], args: geo.UpsampleArgs,
                           dtype: torch.dtype) -> Tuple[torch.Tensor, torch.Tensor]:
    """Per axis, the source index PyTorch's own 2-D nearest kernel reads for each output
    index of the call ``args`` on an input of spatial size ``in_hw`` and ``dtype``:
    ``(rows, cols)``, int64.

    PyTorch's index arithmetic depends on the dtype and on the kernel's path: for
    2 -> 82 (legacy nearest) the float32 2-D kernel reads source 0 at output 41
    (``floorf(41 * (2/82f))``), the float64 one source 1, and a call that changes one
    axis only source 0 in float64 too. So the tables are read from the kernel itself: a
    probe whose values number the source pixels (exact in float32 up to 2^24 pixels),
    resized by the call."""
    h, w = in_hw
    probe = torch.arange(h * w, dtype=torch.float64).to(dtype).view(1, 1, h, w)
    out = torch.nn.functional.interpolate(
        probe, size=args.size, scale_factor=args.scale_factor, mode=args.mode,
        recompute_scale_factor=args.recompute_scale_factor)[0, 0].to(torch.int64)
    return out[:, 0] // w, out[0, :] % w
