"""NPU backend: plan each call (:mod:`.npu_plan`) for the tensor's device, then run it.

``backend='npu'`` (and ``'auto'`` on ``npu`` tensors) goes through here. The executor
runs a :class:`~.npu_plan.Plan` with plain torch calls, so on an Ascend NPU torch_npu
routes them to the intended ``aclnn*`` kernels, and on a CPU the very same call forms
run PyTorch's CPU kernels. Off Ascend every plan is the native call, so this backend
behaves exactly like :mod:`.native` there; the executor itself runs any plan on any
device, which is how the planner's choices are tested end to end on a CPU.

Every plan with a ``fallback`` reason is recorded with
:func:`mmseg_cann.utils.record_fallback` (counted, logged once per call site), and so is
a device that returns a max-pooling mask where indices were wanted.
"""
from __future__ import annotations

import contextvars
from contextlib import contextmanager
from dataclasses import replace
from typing import Callable, Iterator, List, Optional

import torch
import torch.nn.functional as F

from ..core import geometry as geo
from ..utils import record_fallback
from . import native
from .npu_device import DeviceCaps, device_caps
from .npu_plan import (Plan, max_pool_data_checks, memory_format_of, plan_adaptive_avg_pool2d,
                       plan_avg_pool2d, plan_max_pool2d, plan_upsample)

__all__ = ['upsample', 'max_pool2d', 'avg_pool2d', 'adaptive_avg_pool2d', 'plan_for',
           'execute_upsample', 'execute_max_pool2d', 'execute_avg_pool2d',
           'execute_adaptive_avg_pool2d', 'fallbacks_muted', 'observe_device_indices']

_INDEX_DTYPES = (torch.int32, torch.int64)


# ----------------------------------------------------------------------------------
# planning for a tensor
# ----------------------------------------------------------------------------------
def _no_nan_or_neg_inf(x: torch.Tensor) -> bool:
    """No NaN and no -Inf in ``x`` (one reduction, a device sync)."""
    if not x.dtype.is_floating_point or x.numel() == 0:
        return True
    return not bool((torch.isnan(x) | torch.isneginf(x)).any())


def _fits_fp32(x: torch.Tensor) -> bool:
    """Every value of an integer tensor has ``|v| < 2**24`` (exact in float32)."""
    if x.numel() == 0:
        return True
    limit = 2 ** 24
    return int(x.amax()) < limit and int(x.amin()) > -limit


def plan_for(op: str, x: torch.Tensor, spec=None, *, caps: Optional[DeviceCaps] = None,
             return_indices: bool = False, count_include_pad: bool = True,
             divisor_override=None, out_size=None) -> Plan:
    """The plan the NPU backend uses for ``op`` on ``x`` (``caps`` defaults to x's device).

    ``spec`` is the op's geometry spec (``UpsampleSpec``/``PoolSpec``); adaptive pooling
    takes ``out_size`` instead. For max pooling the input is inspected only where the
    plan depends on it (:func:`.npu_plan.max_pool_data_checks`).
    """
    caps = caps if caps is not None else device_caps(x.device)
    shape, dtype, fmt = tuple(x.shape), x.dtype, memory_format_of(x)
    if op == 'upsample':
        return plan_upsample(spec, shape, dtype, fmt, caps)
    if op == 'max_pool2d':
        needs_finite, needs_range = max_pool_data_checks(spec, return_indices, dtype, caps)
        return plan_max_pool2d(spec, return_indices, shape, dtype, fmt, caps,
                               finite=_no_nan_or_neg_inf(x) if needs_finite else None,
                               int_fits_fp32=_fits_fp32(x) if needs_range else None)
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
    if plan.compute_dtype is not None:
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
_observations: contextvars.ContextVar = contextvars.ContextVar('mmseg_cann_npu_indices',
                                                               default=None)


@contextmanager
def fallbacks_muted():
    """Run plans without recording their fallbacks (the tuner's timing runs)."""
    token = _muted.set(True)
    try:
        yield
    finally:
        _muted.reset(token)


@contextmanager
def observe_device_indices() -> Iterator[List[str]]:
    """Collect what the device returned as max-pooling indices inside the block.

    Yields a list that receives one entry per device max-pool call with indices:
    ``'int32 indices'``/``'int64 indices'`` (real indices, used) or ``'int8 mask'``
    (``aclnnMaxPool2dWithMask``'s mask; PyTorch indices recomputed on the CPU). This is
    how a report tells which kernel the device actually used.
    """
    seen: List[str] = []
    token = _observations.set(seen)
    try:
        yield seen
    finally:
        _observations.reset(token)


def _note_fallback(plan: Plan) -> None:
    if plan.fallback and not _muted.get():
        record_fallback(plan.op, plan.fallback)


def _on_cpu(run: Callable, plan: Plan, x: torch.Tensor, *args):
    """Run ``plan`` (its fallback already recorded) on a CPU copy of ``x``; results move
    back to ``x``'s device."""
    local = replace(plan, on_cpu=False, fallback=None)
    out = run(local, x.cpu(), *args)
    if isinstance(out, tuple):
        return tuple(t.to(x.device) for t in out)
    return out.to(x.device)


def execute_upsample(plan: Plan, x: torch.Tensor, spec: geo.UpsampleSpec) -> torch.Tensor:
    """Run an upsample ``plan`` (its call form, layout, dtype and device) on ``x``."""
    _note_fallback(plan)
    if plan.on_cpu and x.device.type != 'cpu':
        return _on_cpu(execute_upsample, plan, x, spec)
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


def _lowest(dtype: torch.dtype) -> float:
    """The lowest finite value of ``dtype`` (the NPU kernels reject -Inf input)."""
    return torch.finfo(dtype).min if dtype.is_floating_point else torch.iinfo(dtype).min


def _max_pool_call(plan: Plan, y: torch.Tensor, spec: geo.PoolSpec, return_indices: bool):
    """The max-pool call of ``plan``: SAME/asymmetric padding with the lowest finite value
    when ``plan.pad == 'lowest'``, else the native call (``-inf`` padding).

    With indices returns ``(values, index as the device returned it, padded)``; a real
    index of a padded call still refers to the padded plane.
    """
    if plan.pad != 'lowest' or spec.torch_padding_ok:
        result = native.max_pool2d(y, spec, return_indices)
        return (result + (False,)) if return_indices else result
    args = spec.args
    padded = native._explicit_pad(y, spec, _lowest(y.dtype))
    result = F.max_pool2d(padded, args.kernel, args.stride, 0, args.dilation, False,
                          return_indices)
    return (result + (True,)) if return_indices else result


def _as_indices(index: torch.Tensor, values: torch.Tensor) -> Optional[torch.Tensor]:
    """PyTorch's int64 indices from a device result, or None when it is not indices.

    int32 (``aclnnMaxPool2dWithIndices``) and int64 tensors of the output's shape are
    indices; anything else, such as ``aclnnMaxPool2dWithMask``'s int8 mask of shape
    ``(N, C, kh*kw, (ceil(oh*ow/16)+1)*32)``, is not.
    """
    if index.dtype in _INDEX_DTYPES and index.shape == values.shape:
        return index.long()
    return None


def _observe(entry: str) -> None:
    seen = _observations.get()
    if seen is not None:
        seen.append(entry)


def execute_max_pool2d(plan: Plan, x: torch.Tensor, spec: geo.PoolSpec,
                       return_indices: bool = False):
    """Run a max-pool ``plan``; indices are always PyTorch's int64 flat indices."""
    _note_fallback(plan)
    if plan.on_cpu and x.device.type != 'cpu':
        return _on_cpu(execute_max_pool2d, plan, x, spec, return_indices)
    y, restore = _enter(plan, x)
    result = _max_pool_call(plan, y, spec, return_indices)
    if not return_indices:
        return restore(result)
    values, index, padded = result
    indices = _as_indices(index, values)
    _observe(f'{str(index.dtype).replace("torch.", "")} {"mask" if indices is None else "indices"}')
    if indices is not None and padded:
        indices = native._unpad_indices(values, indices, spec)
    if indices is None:
        if not _muted.get():
            record_fallback('max_pool2d', f'the device returned {index.dtype} indices of shape '
                                          f'{tuple(index.shape)} (a mask), recomputing '
                                          'PyTorch indices on the CPU')
        values, indices = native.max_pool2d(x.cpu(), spec, True)
        return values.to(x.device), indices.to(x.device)
    return restore(values), restore(indices)


def execute_avg_pool2d(plan: Plan, x: torch.Tensor, spec: geo.PoolSpec,
                       count_include_pad: bool = True, divisor_override=None) -> torch.Tensor:
    """Run an average-pool ``plan`` on ``x``."""
    _note_fallback(plan)
    if plan.on_cpu and x.device.type != 'cpu':
        return _on_cpu(execute_avg_pool2d, plan, x, spec, count_include_pad, divisor_override)
    y, restore = _enter(plan, x)
    return restore(native.avg_pool2d(y, spec, count_include_pad, divisor_override))


def execute_adaptive_avg_pool2d(plan: Plan, x: torch.Tensor, out_hw) -> torch.Tensor:
    """Run an adaptive-average-pool ``plan`` (``'mean'`` or the adaptive kernel)."""
    _note_fallback(plan)
    if plan.on_cpu and x.device.type != 'cpu':
        return _on_cpu(execute_adaptive_avg_pool2d, plan, x, out_hw)
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
