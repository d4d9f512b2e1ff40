"""NPU backend: plan each call (:mod:`.npu_plan`) for the tensor's device, then run it.

``backend='npu'`` (and ``'auto'`` on ``npu`` tensors) goes through here. The executor
runs a :class:`~.npu_plan.Plan` with plain torch calls, so on an Ascend NPU torch_npu
routes them to the intended ``aclnn*`` kernels, and on a CPU the very same call forms
run PyTorch's CPU kernels. Off Ascend every plan is the native call, so this backend
behaves exactly like :mod:`.native` there; the executor itself runs any plan on any
device, which is how the planner's choices are tested end to end on a CPU.

Every plan with a ``fallback`` reason is recorded with
:func:`mmseg_cann.utils.record_fallback` (counted, logged once per call site).
"""
from __future__ import annotations

import contextvars
from contextlib import contextmanager
from typing import Optional

import torch
import torch.nn.functional as F

from ..core import geometry as geo
from ..utils import record_fallback
from . import native
from .npu_device import DeviceCaps, device_caps
from .npu_plan import (Plan, memory_format_of, plan_adaptive_avg_pool2d, plan_avg_pool2d,
                       plan_max_pool2d, plan_upsample)

__all__ = ['upsample', 'max_pool2d', 'avg_pool2d', 'adaptive_avg_pool2d', 'plan_for',
           'execute_upsample', 'execute_max_pool2d', 'execute_avg_pool2d',
           'execute_adaptive_avg_pool2d']


# ----------------------------------------------------------------------------------
# planning for a tensor
# ----------------------------------------------------------------------------------
def _finite(x: torch.Tensor) -> bool:
    return bool(torch.isfinite(x).all()) if x.dtype.is_floating_point else True


def plan_for(op: str, x: torch.Tensor, spec=None, *, caps: Optional[DeviceCaps] = None,
             return_indices: bool = False, count_include_pad: bool = True,
             divisor_override=None, out_size=None) -> Plan:
    """The plan the NPU backend uses for ``op`` on ``x`` (``caps`` defaults to x's device).

    ``spec`` is the op's geometry spec (``UpsampleSpec``/``PoolSpec``); adaptive pooling
    takes ``out_size`` instead.
    """
    caps = caps if caps is not None else device_caps(x.device)
    shape, dtype, fmt = tuple(x.shape), x.dtype, memory_format_of(x)
    if op == 'upsample':
        return plan_upsample(spec, shape, dtype, fmt, caps)
    if op == 'max_pool2d':
        finite = _finite(x) if (return_indices and caps.a2_a3) else None
        return plan_max_pool2d(spec, return_indices, shape, dtype, fmt, caps, finite=finite)
    if op == 'avg_pool2d':
        return plan_avg_pool2d(spec, count_include_pad, divisor_override, shape, dtype, fmt,
                               caps)
    if op == 'adaptive_avg_pool2d':
        return plan_adaptive_avg_pool2d(out_size, shape, dtype, fmt, caps)
    raise ValueError(f'op must be one of upsample, max_pool2d, avg_pool2d, '
                     f'adaptive_avg_pool2d, got {op!r}')


# ----------------------------------------------------------------------------------
# executing a plan
# ----------------------------------------------------------------------------------
def _enter(plan: Plan, x: torch.Tensor):
    """Apply the plan's layout and compute dtype; returns (converted x, restore fn)."""
    fmt = memory_format_of(x)
    y = x
    if plan.layout != 'keep' and x.dim() == 4:
        target = torch.channels_last if plan.layout == 'to_channels_last' else \
            torch.contiguous_format
        y = y.contiguous(memory_format=target)
    if plan.compute_dtype is not None and x.dtype.is_floating_point:
        y = y.to(getattr(torch, plan.compute_dtype))

    def restore(out: torch.Tensor) -> torch.Tensor:
        if plan.compute_dtype is not None and out.dtype != x.dtype and out.is_floating_point():
            out = out.to(x.dtype)
        if plan.layout != 'keep' and out.dim() == 4:
            out = out.contiguous(memory_format=torch.channels_last if fmt == 'channels_last'
                                 else torch.contiguous_format)
        return out

    return y, restore


_muted: contextvars.ContextVar = contextvars.ContextVar('mmseg_cann_npu_muted', default=False)


@contextmanager
def fallbacks_muted():
    """Run plans without recording their fallbacks (the tuner's timing runs)."""
    token = _muted.set(True)
    try:
        yield
    finally:
        _muted.reset(token)


def _note_fallback(plan: Plan) -> None:
    if plan.fallback and not _muted.get():
        record_fallback(plan.op, plan.fallback)


def execute_upsample(plan: Plan, x: torch.Tensor, spec: geo.UpsampleSpec) -> torch.Tensor:
    """Run an upsample ``plan`` (its call form, layout and dtype) on ``x``."""
    _note_fallback(plan)
    y, restore = _enter(plan, x)
    args = spec.args
    if plan.call == 'native':
        out = native.upsample(y, spec)
    elif plan.call == 'size':
        out = F.interpolate(y, size=spec.out_size, mode=args.mode,
                            align_corners=args.align_corners, antialias=args.antialias)
    elif plan.call == 'scales':
        out = F.interpolate(y, scale_factor=plan.scales, mode=args.mode,
                            align_corners=args.align_corners, recompute_scale_factor=False,
                            antialias=args.antialias)
    else:
        raise ValueError(f'unknown upsample call form {plan.call!r}')
    return restore(out)


def execute_max_pool2d(plan: Plan, x: torch.Tensor, spec: geo.PoolSpec,
                       return_indices: bool = False):
    """Run a max-pool ``plan``; indices are always PyTorch's int64 flat indices."""
    _note_fallback(plan)
    y, restore = _enter(plan, x)
    if plan.indices_on_cpu and return_indices and y.device.type != 'cpu':
        values, index = native.max_pool2d(y.cpu(), spec, True)
        return restore(values.to(x.device)), restore(index.to(x.device))
    result = native.max_pool2d(y, spec, return_indices)
    if not return_indices:
        return restore(result)
    values, index = result
    if index.dtype != torch.int64:
        # torch_npu's default max_pool2d_with_indices returns an int8 mask, not indices
        record_fallback('max_pool2d', f'the device returned {index.dtype} indices (a mask), '
                                      'recomputing PyTorch indices on the CPU')
        values, index = native.max_pool2d(y.cpu(), spec, True)
        values, index = values.to(x.device), index.to(x.device)
    return restore(values), restore(index)


def execute_avg_pool2d(plan: Plan, x: torch.Tensor, spec: geo.PoolSpec,
                       count_include_pad: bool = True, divisor_override=None) -> torch.Tensor:
    """Run an average-pool ``plan`` on ``x``."""
    _note_fallback(plan)
    y, restore = _enter(plan, x)
    return restore(native.avg_pool2d(y, spec, count_include_pad, divisor_override))


def execute_adaptive_avg_pool2d(plan: Plan, x: torch.Tensor, out_hw) -> torch.Tensor:
    """Run an adaptive-average-pool ``plan`` (``'mean'`` or the adaptive kernel)."""
    _note_fallback(plan)
    y, restore = _enter(plan, x)
    if plan.call == 'mean':
        out = y.mean(dim=(-2, -1), keepdim=True)
        if memory_format_of(y) == 'channels_last':
            out = out.contiguous(memory_format=torch.channels_last)  # as ATen does
    else:
        out = native.adaptive_avg_pool2d(y, out_hw)
    return restore(out)


# ----------------------------------------------------------------------------------
# the backend interface
# ----------------------------------------------------------------------------------
def upsample(input: torch.Tensor, spec: geo.UpsampleSpec) -> torch.Tensor:
    """Plan for ``input``'s device, then run (see :func:`.npu_plan.plan_upsample`)."""
    return execute_upsample(plan_for('upsample', input, spec), input, spec)


def max_pool2d(input: torch.Tensor, spec: geo.PoolSpec, return_indices: bool = False):
    """Plan for ``input``'s device, then run (see :func:`.npu_plan.plan_max_pool2d`)."""
    plan = plan_for('max_pool2d', input, spec, return_indices=return_indices)
    return execute_max_pool2d(plan, input, spec, return_indices)


def avg_pool2d(input: torch.Tensor, spec: geo.PoolSpec, count_include_pad: bool = True,
               divisor_override: Optional[int] = None) -> torch.Tensor:
    """Plan for ``input``'s device, then run (see :func:`.npu_plan.plan_avg_pool2d`)."""
    plan = plan_for('avg_pool2d', input, spec, count_include_pad=count_include_pad,
                    divisor_override=divisor_override)
    return execute_avg_pool2d(plan, input, spec, count_include_pad, divisor_override)


def adaptive_avg_pool2d(input: torch.Tensor, output_size) -> torch.Tensor:
    """Plan for ``input``'s device, then run (see :func:`.npu_plan.plan_adaptive_avg_pool2d`)."""
    plan = plan_for('adaptive_avg_pool2d', input, out_size=tuple(output_size))
    return execute_adaptive_avg_pool2d(plan, input, output_size)
