"""``resize_conv2d`` itself: checks, the plan, autocast, and the method or composition
that runs."""
from __future__ import annotations

from dataclasses import replace
from typing import Tuple

import torch
import torch.nn.functional as F

from ...core.precision import autocast_cast, autocast_lower_dtype
from ...core.validation import FLOATING_DTYPES, check_dtype, check_tensor, is_channels_last
from ...utils import record_fallback
from ..upsample import upsample
from .mix_first import mix_first
from .mix_resize import mix_resize
from .plan import NAME, Args, ResizeConvPlan, check_args, check_shapes, make_plan, shape_of
from .polyphase import polyphase

#: what :func:`run_resize_conv2d` reports when the composition ran
COMPOSITION = 'composition'


def resize_conv2d(input: torch.Tensor, weight: torch.Tensor, bias=None, *, size=None,
                  scale_factor=None, mode: str = 'bilinear', align_corners=False, stride=1,
                  padding=0, dilation=1, groups=1) -> torch.Tensor:
    """``F.conv2d(F.interpolate(input, size, scale_factor, mode, align_corners), weight,
    bias, stride, padding, dilation, groups)`` without the upsampled intermediate where
    the rewrite applies (:func:`resize_conv2d_plan` says which method runs).

    Args:
        input: ``(N, C, H, W)`` floating tensor (contiguous or channels_last).
        weight: ``(C_out, C / groups, kH, kW)`` tensor of ``input``'s dtype and device
            (under ``torch.autocast`` both are cast as autocast casts a convolution's
            operands, and the result has autocast's dtype, as ``F.conv2d``'s).
        bias: None or ``(C_out,)``.
        size, scale_factor: as ``F.interpolate`` (exactly one).
        mode: any ``F.interpolate`` mode; the rewrite takes ``'nearest'``,
            ``'nearest-exact'`` and ``'bilinear'``. ``align_corners`` False means "not
            set" for the nearest modes.
        align_corners: for bilinear, as ``F.interpolate``. Integer factors (``out == s *
            in``, or ``out - 1 == s * (in - 1)`` with aligned corners) can take the phase
            methods; every size takes ``'mix_resize'``.
        stride, padding, dilation, groups: as ``F.conv2d`` (padding an int, a pair,
            ``'valid'`` or ``'same'``); the rewrite takes stride 1, dilation 1, groups 1
            and symmetric zero padding.

    Returns:
        ``(N, C_out, H_out, W_out)``, channels_last when the input or weight is. Where the
        rewrite runs, values are within float rounding of the composition (bound:
        :func:`resize_conv2d_error_bound`), differentiable with respect to input, weight
        and bias. Where the composition runs for the plan's reason, or under
        ``torch.jit.trace`` (whose recorded sizes must stay generic), it is counted in
        ``fallback_counts()``; ``torch.compile`` traces the composition, uncounted (Dynamo
        cannot trace the plan's Python geometry).

    Raises:
        TypeError, ValueError: invalid arguments, naming the argument, before any work.
    """
    return run_resize_conv2d(input, weight, bias, size=size, scale_factor=scale_factor,
                             mode=mode, align_corners=align_corners, stride=stride,
                             padding=padding, dilation=dilation, groups=groups)[0]


def run_resize_conv2d(input, weight, bias=None, **kwargs) -> Tuple[torch.Tensor, str]:
    """:func:`resize_conv2d`, also returning what ran: the method's name, or
    ``'composition: <reason>'``."""
    args = check_args(kwargs.get('size'), kwargs.get('scale_factor'),
                      kwargs.get('mode', 'bilinear'), kwargs.get('align_corners', False),
                      kwargs.get('stride', 1), kwargs.get('padding', 0),
                      kwargs.get('dilation', 1), kwargs.get('groups', 1))
    check_tensor(input, NAME)
    if not isinstance(weight, torch.Tensor):
        raise TypeError(f'{NAME}: weight must be a torch.Tensor, got {type(weight).__name__}')
    if bias is not None and not isinstance(bias, torch.Tensor):
        raise TypeError(f'{NAME}: bias must be None or a torch.Tensor, got '
                        f'{type(bias).__name__}')
    in_shape = shape_of(input, 'input', 4)
    w_shape = shape_of(weight, 'weight', 4)
    check_dtype(input, NAME, FLOATING_DTYPES, 'conv2d')
    device_type = input.device.type
    autocast = autocast_lower_dtype(device_type)
    # the operands as F.conv2d sees them (cast by autocast where it is on)
    x, w, b = (input, weight, bias) if autocast is None else \
        (autocast_cast(t, autocast) for t in (input, weight, bias))
    for name, t in (('weight', w), ('bias', b)):
        if t is not None and (t.dtype != x.dtype or t.device != x.device):
            raise TypeError(f'{NAME}: {name} must have the dtype and device of input '
                            f'({x.dtype} on {x.device}), got {t.dtype} on {t.device}')
    check_shapes(in_shape, w_shape, bias, args)
    if torch.compiler.is_compiling() and not torch.compiler.is_exporting():
        # torch.compile: the plan's geometry (exact rationals, NumPy coefficient tables)
        # is Python work Dynamo cannot trace; the composition compiles
        return _composition(input, weight, bias, args), COMPOSITION
    if torch.jit.is_tracing():
        # jit.trace records sizes as traced values: the composition with the size as
        # given (not the checked ints) keeps them generic
        traced = replace(args, upsample=replace(args.upsample, size=kwargs.get('size')))
        return _fallback(input, weight, bias, traced, 'torch.jit.trace records the '
                         'composition (the rewrite would fix the traced size)')
    half = x.dtype in (torch.float16, torch.bfloat16)
    compute = torch.float32 if autocast is not None and half else x.dtype
    plan = make_plan(in_shape, w_shape, compute, args, 'footprint')
    if not plan.applies:
        return _fallback(input, weight, bias, args, plan.reason)
    if compute == x.dtype:
        out = apply_plan(x, w, b, plan)
    else:
        # autocast: half operands, computed in float32 without autocast, returned in
        # autocast's dtype (a convolution's result under autocast)
        with torch.autocast(device_type, enabled=False):
            out = apply_plan(x.float(), w.float(), None if b is None else b.float(),
                             plan).to(x.dtype)
    return out, plan.method


def _fallback(input, weight, bias, args: Args, reason: str) -> Tuple[torch.Tensor, str]:
    record_fallback(NAME, reason)
    return _composition(input, weight, bias, args), f'{COMPOSITION}: {reason}'


def _composition(input, weight, bias, args: Args) -> torch.Tensor:
    """The definition: the project's ``upsample`` (``F.interpolate``), then ``F.conv2d``."""
    up = args.upsample
    resized = upsample(input, size=up.size, scale_factor=up.scale_factor, mode=up.mode,
                       align_corners=up.align_corners)
    return F.conv2d(resized, weight, bias, args.stride, args.padding, args.dilation,
                    args.groups)


def apply_plan(input, weight, bias, plan: ResizeConvPlan) -> torch.Tensor:
    """Run the plan's method on tensors of the shapes it was made for (it must apply)."""
    ah, aw = plan.axes
    if plan.method == 'mix_resize':
        out = mix_resize(input, weight, bias, ah, aw, plan.args.upsample)
    else:
        out = (mix_first if plan.method == 'mix_first' else polyphase)(input, weight, bias,
                                                                        ah, aw)
    if is_channels_last(input) or is_channels_last(weight):
        return out.contiguous(memory_format=torch.channels_last)
    return out.contiguous()
