"""Float64 reference implementations, written straight from the formulas.

Used by the tests and by ``tools/check_parity.py`` to judge every backend. Nothing
here calls ``F.interpolate`` or a ``F.*pool*`` function: interpolation is a product
with per-axis weight matrices built from :mod:`mmseg_cann.core.geometry`, pooling a
loop over the window taps. Everything is differentiable (plain tensor ops in float64).

All functions take floating or integer tensors and return a tensor on the input's
device, NCHW-contiguous: float64, except pooling of integer input, which computes in the
input's integer dtype as PyTorch's integer kernels do (max pooling compares, average
pooling of int64 sums in int64 and divides truncating) and returns that dtype, exact for
any value. Arguments are validated as the public ops do.

Nearest-neighbour index rule
    PyTorch computes the legacy ``nearest`` source index as ``floorf(d * scale)`` with a
    float32 ``scale`` (``in / out``, or ``1 / scale_factor``), shortcutting
    ``out == in`` and ``out == 2 * in``; ``nearest-exact`` as
    ``floorf((d + 0.5) * scale)``. For some sizes this differs from exact rational
    arithmetic (e.g. 2 -> 82 at d = 41). ``nearest_rule='pytorch'`` (default) emulates
    the float32 computation; ``nearest_rule='exact'`` uses rational arithmetic.
    :func:`nearest_index_mismatches` lists where the two disagree.
"""
from __future__ import annotations

import math
from fractions import Fraction
from functools import lru_cache
from typing import List, Optional, Tuple

import numpy as np
import torch

from . import geometry as geo
from .taps import pool_divisors, pool_first_taps
from .validation import (AVG_POOL_DTYPES, FLOATING_DTYPES, INTEGER_DTYPES, MAX_POOL_DTYPES,
                         check_adaptive_input, check_input)

NEAREST_RULES = ('pytorch', 'exact')


# ----------------------------------------------------------------------------------
# interpolation weights
# ----------------------------------------------------------------------------------
def nearest_indices(in_size: int, out_size: int, scale: Optional[float], exact_mode: bool,
                    rule: str = 'pytorch') -> np.ndarray:
    """Source index of every output index for ``nearest`` / ``nearest-exact``."""
    if rule not in NEAREST_RULES:
        raise ValueError(f'nearest_rule must be one of {NEAREST_RULES}, got {rule!r}')
    d = np.arange(out_size)
    # legacy nearest shortcuts (both rules): whatever the scale, out == in copies and
    # out == 2 * in repeats every input twice
    if not exact_mode and out_size == in_size:
        return d
    if not exact_mode and out_size == 2 * in_size:
        return d >> 1
    if rule == 'exact':
        step = Fraction(1) / Fraction(scale) if scale else Fraction(in_size, out_size)
        idx = [math.floor((Fraction(2 * i + 1, 2) if exact_mode else i) * step) for i in d]
        return np.minimum(np.asarray(idx, dtype=np.int64), in_size - 1)
    f32 = np.float32
    step = f32(1.0 / scale) if scale else f32(in_size) / f32(out_size)
    offset = f32(0.5) if exact_mode else f32(0.0)
    src = (d.astype(f32) + offset) * step  # float32 arithmetic, as floorf(d * scale)
    return np.minimum(np.floor(src).astype(np.int64), in_size - 1)


def nearest_index_mismatches(max_in: int, max_out: int, exact_mode: bool = False
                             ) -> List[Tuple[int, int]]:
    """``(in, out)`` pairs (size-based) where PyTorch's float32 rule differs from exact math."""
    pairs = []
    for i in range(1, max_in):
        for o in range(1, max_out):
            if not np.array_equal(nearest_indices(i, o, None, exact_mode, 'pytorch'),
                                  nearest_indices(i, o, None, exact_mode, 'exact')):
                pairs.append((i, o))
    return pairs


def _linear_row(src: float, in_size: int) -> List[Tuple[int, float]]:
    i0 = min(math.floor(src), in_size - 1)
    lam = min(max(src - i0, 0.0), 1.0)
    i1 = min(i0 + 1, in_size - 1)
    return [(i0, 1.0 - lam), (i1, lam)]


def _cubic_row(src: float, in_size: int) -> List[Tuple[int, float]]:
    i0 = math.floor(src)
    weights = geo.cubic_weights(src - i0)
    return [(min(max(i0 - 1 + k, 0), in_size - 1), w) for k, w in enumerate(weights)]


def _antialias_row(dst: int, step: float, in_size: int, mode: str) -> List[Tuple[int, float]]:
    support = geo.antialias_support(step, mode)
    center = step * (dst + 0.5)
    inv = 1.0 / step if step >= 1.0 else 1.0
    lo = max(int(center - support + 0.5), 0)  # int(): truncation, as the C++ cast
    hi = min(int(center + support + 0.5), in_size)
    taps = [(j, geo.antialias_filter((j - center + 0.5) * inv, mode)) for j in range(lo, hi)]
    total = sum(w for _, w in taps)
    return [(j, w / total) for j, w in taps] if total != 0 else taps


@lru_cache(maxsize=256)
def _weights_np(in_size: int, out_size: int, mode: str, align_corners: Optional[bool],
                scale: Optional[float], antialias: bool, nearest_rule: str) -> np.ndarray:
    w = np.zeros((out_size, in_size), dtype=np.float64)
    if mode in geo.NEAREST_MODES:
        idx = nearest_indices(in_size, out_size, scale, mode == 'nearest-exact', nearest_rule)
        w[np.arange(out_size), idx] = 1.0
        return w
    if mode == 'area':
        for o in range(out_size):
            start, end = geo.adaptive_bin(o, in_size, out_size)
            w[o, start:end] = 1.0 / (end - start)
        return w
    step = geo.coordinate_scale(in_size, out_size, bool(align_corners), scale)
    for o in range(out_size):
        if antialias:
            row = _antialias_row(o, step, in_size, mode)
        else:
            src = geo.linear_source_coordinate(o, step, bool(align_corners), mode == 'bicubic')
            row = _linear_row(src, in_size) if mode == 'bilinear' else _cubic_row(src, in_size)
        for j, weight in row:
            w[o, j] += weight
    w.setflags(write=False)
    return w


def interpolation_matrix(in_size: int, out_size: int, mode: str,
                         align_corners: Optional[bool] = None, scale: Optional[float] = None,
                         antialias: bool = False, nearest_rule: str = 'pytorch') -> torch.Tensor:
    """The ``(out, in)`` float64 matrix that maps one axis of the input to the output."""
    return torch.from_numpy(_weights_np(in_size, out_size, mode, align_corners, scale,
                                        antialias, nearest_rule).copy())


def _as_float64_nchw(input: torch.Tensor) -> Tuple[torch.Tensor, bool]:
    return _as_nchw(input.to(torch.float64))


def _as_nchw(x: torch.Tensor) -> Tuple[torch.Tensor, bool]:
    if x.dim() == 3:
        return x.unsqueeze(0), True
    return x, False


def _pooling_nchw(input: torch.Tensor) -> Tuple[torch.Tensor, bool]:
    """The pooling computation's input: float64 for floating input, the input's own
    dtype for integers (exact, as PyTorch's integer kernels)."""
    return _as_float64_nchw(input) if input.dtype.is_floating_point else _as_nchw(input)


def upsample(input: torch.Tensor, size=None, scale_factor=None, mode: str = 'nearest',
             align_corners=None, recompute_scale_factor=None, antialias: bool = False, *,
             nearest_rule: str = 'pytorch') -> torch.Tensor:
    """Float64 reference of :func:`mmseg_cann.ops.upsample` (4-D input)."""
    check_input(input, 'reference.upsample', ranks=(4,), integer_dtypes=INTEGER_DTYPES)
    args = geo.check_upsample_args(size, scale_factor, mode, align_corners,
                                   recompute_scale_factor, antialias)
    spec = geo.upsample_spec(input.shape[-2:], args)
    return upsample_from_spec(input, spec, nearest_rule=nearest_rule)


def upsample_from_spec(input: torch.Tensor, spec: geo.UpsampleSpec, *,
                       nearest_rule: str = 'pytorch') -> torch.Tensor:
    """Reference upsample of an already validated spec."""
    mats = [interpolation_matrix(spec.in_size[a], spec.out_size[a], spec.mode,
                                 spec.align_corners, spec.kernel_scales[a], spec.antialias,
                                 nearest_rule).to(input.device) for a in range(2)]
    x = input.to(torch.float64)
    return torch.einsum('oh,nchw,pw->ncop', mats[0], x, mats[1]).contiguous()


# ----------------------------------------------------------------------------------
# pooling
# ----------------------------------------------------------------------------------
def _window_taps(spec: geo.PoolSpec, axis: int):
    """For each kernel tap: input index per output position, and its validity."""
    n, k, s, d = spec.in_size[axis], spec.kernel[axis], spec.stride[axis], spec.dilation[axis]
    starts = torch.arange(spec.out_size[axis]) * s - spec.pad_begin[axis]
    for tap in range(k):
        pos = starts + tap * d
        yield pos.clamp(0, n - 1), (pos >= 0) & (pos < n)


def max_pool2d(input: torch.Tensor, kernel_size, stride=None, padding=0, dilation=1,
               ceil_mode=False, return_indices=False):
    """Float64 reference of :func:`mmseg_cann.ops.max_pool2d`.

    Follows PyTorch's scan: taps in row-major order, a tap wins when it is greater than
    the running maximum or is NaN; the default index is the window's first in-bounds tap.
    """
    check_input(input, 'reference.max_pool2d', ranks=(3, 4), dtypes=MAX_POOL_DTYPES)
    spec = geo.pool_spec(input.shape[-2:], geo.check_pool_args(kernel_size, stride, padding,
                                                               dilation, ceil_mode))
    return max_pool2d_from_spec(input, spec, return_indices)


def max_pool2d_from_spec(input: torch.Tensor, spec: geo.PoolSpec, return_indices=False):
    x, squeezed = _pooling_nchw(input)
    n, c, h, w = x.shape
    oh, ow = spec.out_size
    # the running maximum starts at the lowest value, as PyTorch's kernels
    lowest = -math.inf if x.dtype.is_floating_point else torch.iinfo(x.dtype).min
    best = torch.full((n, c, oh, ow), lowest, dtype=x.dtype, device=x.device)
    rows0, cols0 = (torch.tensor(t) for t in pool_first_taps(spec))
    index = (rows0[:, None] * w + cols0[None, :]).to(x.device).expand(n, c, oh, ow).clone()
    for rows, row_ok in _window_taps(spec, 0):
        for cols, col_ok in _window_taps(spec, 1):
            val = x[:, :, rows][:, :, :, cols]
            ok = (row_ok[:, None] & col_ok[None, :]).to(x.device)
            take = ok & ((val > best) | torch.isnan(val))
            best = torch.where(take, val, best)
            flat = (rows[:, None] * w + cols[None, :]).to(x.device)
            index = torch.where(take, flat, index)
    if squeezed:
        best, index = best.squeeze(0), index.squeeze(0)
    return (best, index) if return_indices else best


def avg_pool2d(input: torch.Tensor, kernel_size, stride=None, padding=0, ceil_mode=False,
               count_include_pad=True, divisor_override=None) -> torch.Tensor:
    """Float64 reference of :func:`mmseg_cann.ops.avg_pool2d` (PyTorch's divisor rule;
    int64 input: integer sums, truncating division)."""
    check_input(input, 'reference.avg_pool2d', ranks=(3, 4), dtypes=AVG_POOL_DTYPES)
    spec = geo.pool_spec(input.shape[-2:], geo.check_pool_args(kernel_size, stride, padding,
                                                               1, ceil_mode))
    return avg_pool2d_from_spec(input, spec, count_include_pad, divisor_override)


def avg_pool2d_from_spec(input: torch.Tensor, spec: geo.PoolSpec, count_include_pad=True,
                         divisor_override=None) -> torch.Tensor:
    x, squeezed = _pooling_nchw(input)
    zero = torch.zeros((), dtype=x.dtype, device=x.device)
    total = 0
    for rows, row_ok in _window_taps(spec, 0):
        for cols, col_ok in _window_taps(spec, 1):
            ok = (row_ok[:, None] & col_ok[None, :]).to(x.device)
            total = total + torch.where(ok, x[:, :, rows][:, :, :, cols], zero)
    if divisor_override is not None:
        divisor = torch.tensor(divisor_override, dtype=x.dtype)
    else:
        per_axis = [torch.tensor(t, dtype=x.dtype) for t in pool_divisors(spec, count_include_pad)]
        divisor = per_axis[0][:, None] * per_axis[1][None, :]
    if x.dtype.is_floating_point:
        out = total / divisor.to(x.device)
    else:  # PyTorch's integer kernel: C++ integer division, truncating
        out = torch.div(total, divisor.to(x.device), rounding_mode='trunc')
    return out.squeeze(0) if squeezed else out


def adaptive_avg_pool2d(input: torch.Tensor, output_size) -> torch.Tensor:
    """Float64 reference of :func:`mmseg_cann.ops.adaptive_avg_pool2d`."""
    out_hw = geo.adaptive_output_size(input.shape[-2:], output_size) \
        if isinstance(input, torch.Tensor) and input.dim() >= 2 else (1, 1)
    check_adaptive_input(input, out_hw, 'reference.adaptive_avg_pool2d')
    x, squeezed = _as_float64_nchw(input)
    mats = [interpolation_matrix(x.shape[2 + a], out_hw[a], 'area').to(x.device)
            for a in range(2)]
    out = torch.einsum('oh,nchw,pw->ncop', mats[0], x, mats[1]).contiguous()
    return out.squeeze(0) if squeezed else out


__all__ = ['upsample', 'max_pool2d', 'avg_pool2d', 'adaptive_avg_pool2d',
           'interpolation_matrix', 'nearest_indices', 'nearest_index_mismatches',
           'FLOATING_DTYPES']
