"""What ``resize_conv2d`` costs and how far its result can be from the exact one: the
public plan, MAC and error-bound functions."""
from __future__ import annotations

from typing import Tuple

import torch
import torch.nn.functional as F

from ...core import geometry as geo
from .plan import (GROUPINGS, METHODS, NAME, ResizeConvPlan, check_args, check_shapes,
                   make_plan, shape_of)

_UNIT_ROUNDING = {torch.float32: 2.0 ** -24, torch.float64: 2.0 ** -53}


def resize_conv2d_plan(input, weight, bias=None, *, size=None, scale_factor=None,
                       mode: str = 'bilinear', align_corners=False, stride=1, padding=0,
                       dilation=1, groups=1, grouping: str = 'footprint',
                       method: str = 'auto') -> ResizeConvPlan:
    """Whether :func:`resize_conv2d` rewrites the call for these arguments (and why not),
    and how.

    Args:
        input: the input tensor, or its shape ``(N, C, H, W)``.
        weight: the weight tensor, or its shape ``(C_out, C_in / groups, kH, kW)``.
        bias, size, scale_factor, mode, align_corners, stride, padding, dilation, groups:
            as :func:`resize_conv2d`.
        grouping: the polyphase method's phase grouping, ``'footprint'`` (default) or
            ``'union'`` (see :data:`GROUPINGS`).
        method: ``'auto'`` (default: what :func:`resize_conv2d` runs: the phase method
            with the fewest multiply-accumulates where an integer factor allows, else
            ``'mix_resize'``; the composition where that has no fewer than it),
            ``'mix_first'``, ``'polyphase'`` (integer factors) or ``'mix_resize'``
            (any size).

    Returns:
        a :class:`ResizeConvPlan` (``applies``, ``reason``, ``method``, factors, sizes, MAC
        counts).

    Raises:
        TypeError, ValueError: invalid arguments (as :func:`resize_conv2d`).
    """
    args = check_args(size, scale_factor, mode, align_corners, stride, padding, dilation,
                      groups)
    if grouping not in GROUPINGS:
        raise ValueError(f'grouping must be one of {GROUPINGS}, got {grouping!r}')
    if method not in METHODS:
        raise ValueError(f'method must be one of {METHODS}, got {method!r}')
    in_shape = shape_of(input, 'input', 4)
    w_shape = shape_of(weight, 'weight', 4)
    check_shapes(in_shape, w_shape, bias, args)
    dtype = input.dtype if isinstance(input, torch.Tensor) else None
    return make_plan(in_shape, w_shape, dtype, args, grouping, method)


def resize_conv2d_macs(input, weight, *, size=None, scale_factor=None, mode='bilinear',
                       align_corners=False, stride=1, padding=0, dilation=1, groups=1,
                       grouping: str = 'footprint', method: str = 'auto') -> Tuple[int, int]:
    """``(direct, rewritten)`` multiply-accumulates of :func:`resize_conv2d` for these
    shapes (``input``/``weight`` tensors or shapes): the composition's convolution, and
    the rewrite's products and convolutions, border strips included (the same as direct
    where the rewrite does not apply). The composition's interpolation arithmetic is not
    counted; that of ``'mix_resize'`` (which interpolates ``C_out`` maps per tap) is."""
    plan = resize_conv2d_plan(input, weight, size=size, scale_factor=scale_factor, mode=mode,
                              align_corners=align_corners, stride=stride, padding=padding,
                              dilation=dilation, groups=groups, grouping=grouping,
                              method=method)
    return plan.macs_direct, plan.macs_rewritten


def _rounding_terms(plan: ResizeConvPlan, cin: int) -> Tuple[int, int]:
    """``(interior, border)``: the ``m`` of ``gamma(m)`` for the outputs the method
    computes and for the border rows and columns computed directly (see
    :func:`resize_conv2d_error_bound`)."""
    ah, aw = plan.axes
    kk = ah.k * aw.k
    if plan.method == 'mix_resize':
        # cin products + bias per mixed map; per axis an interpolation (two products and
        # a sum) and the shifted sum of its k taps; no border strips
        interior = (cin + 1) + (3 + aw.k) + (3 + ah.k)
        return interior, interior
    # border strips: two interpolations (a weight rounded from its exact value, at most
    # two products and a sum, per axis), then the direct sum of cin * kk products + bias
    border = cin * kk + 1 + 6
    if plan.method == 'mix_first':
        (_, th), (_, tw) = ah.span, aw.span
        # cin products + bias per mixed map; kk * th * tw terms per phase output;
        # a phase-kernel coefficient: two exact per-axis values rounded, their product
        return (cin + 1) + kk * th * tw + 3, border
    taps = max(g[3] - g[2] + 1 for g in ah.groups) * max(g[3] - g[2] + 1 for g in aw.groups)
    # cin * taps products + bias; a phase-kernel entry: its coefficient (3 roundings, as
    # above) times w, summed over kk taps
    return cin * taps + 1 + kk + 3, border


def resize_conv2d_error_bound(input: torch.Tensor, weight: torch.Tensor, bias=None, *,
                              size=None, scale_factor=None, mode: str = 'bilinear',
                              align_corners=False, padding=0,
                              method: str = 'auto') -> torch.Tensor:
    """Per output element, a bound on ``|rewritten - exact|`` (float64 tensor of the
    output's shape): ``rewritten`` the result of ``method`` (``'auto'``: what
    :func:`resize_conv2d` runs), ``exact`` the composition in exact arithmetic with exact
    interpolation weights; for a call the rewrite takes (``ValueError`` otherwise).

    With ``M = conv(up(|x|), |w|) + |b|`` (the composition of absolute values: the
    nearest and bilinear weights, and so every coefficient of the methods, are
    non-negative) and ``u`` the unit roundoff of the dtype, the result is within
    ``gamma(m) * M`` (``gamma(m) = m u / (1 - m u)``), ``m`` the roundings one output
    goes through (``kk = kH * kW``; ``Th``, ``Tw`` footprint widths):

    * mix_first: ``C_in + 1`` (a mixed map: the products and the bias) ``+ kk * Th * Tw``
      (the per-channel phase sum over the union footprint) ``+ 3`` (a coefficient);
    * polyphase: ``C_in * Th * Tw + 1`` (widest footprint) ``+ kk + 3`` (a phase-kernel
      entry: the coefficient, then a sum of ``kk`` products with ``w``);
    * border rows and columns (both phase methods): ``C_in * kk + 1 + 6`` (a direct sum
      over a strip interpolated along both axes);
    * mix_resize: ``C_in + 1`` (a mixed map) ``+ (3 + kW) + (3 + kH)`` (per axis an
      interpolation and the shifted sum of the taps), everywhere.

    The composition run in the same dtype obeys the same kind of bound plus PyTorch's
    geometry error (``plan.geometry_error``; 0 for nearest and power-of-two factors):
    ``(eh + ew + eh * ew) * sum |w| * max |x|``, included here, so twice this bound holds
    between the rewritten result and the composition.
    """
    plan = resize_conv2d_plan(input, weight, bias, size=size, scale_factor=scale_factor,
                              mode=mode, align_corners=align_corners, padding=padding,
                              method=method)
    if not plan.applies:
        raise ValueError(f'{NAME}: the rewrite does not apply ({plan.reason})')
    ah, aw = plan.axes
    interior, border = _rounding_terms(plan, weight.shape[1])
    u = _UNIT_ROUNDING[input.dtype]
    m = torch.full(plan.out_size, float(border), dtype=torch.float64)
    if plan.method != 'mix_resize':
        (top, bottom), (left, right) = ah.border, aw.border
        m[top:bottom, left:right] = float(interior)
    x_abs = input.detach().double().abs()
    w_abs = weight.detach().double().abs()
    interp = dict(mode=mode) if mode in geo.NEAREST_MODES else \
        dict(mode=mode, align_corners=align_corners)
    magnitude = F.conv2d(F.interpolate(x_abs, size=plan.up_size, **interp), w_abs,
                         None if bias is None else bias.detach().double().abs(),
                         padding=(ah.pad, aw.pad))
    eh, ew = plan.geometry_error
    geometry = (eh + ew + eh * ew) * float(x_abs.max()) * w_abs.sum((1, 2, 3))
    return magnitude * (m * u / (1 - m * u)) + geometry.view(1, -1, 1, 1)
