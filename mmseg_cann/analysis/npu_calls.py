"""Plans for op calls given in the functional API's terms (for reports and tools).

:func:`plan_for_call` takes the keyword arguments of :func:`mmseg_cann.ops.upsample`,
``max_pool2d``, ``avg_pool2d`` or ``adaptive_avg_pool2d``, resolves them with
:mod:`mmseg_cann.core.geometry` and the precision policy exactly as the op would, and
returns the :class:`~.npu_plan.Plan` the NPU backend would run for that input on
``caps`` (default: the input's device). ``tools/check_parity.py --device npu`` and
``tools/profile_ops.py`` report these plans.
"""
from __future__ import annotations

import inspect
from typing import Optional, Sequence

import torch

from ..core import geometry as geo
from ..core.precision import resolve_compute_dtype
from ..backends.npu import plan_for
from ..backends.npu_device import DeviceCaps, device_caps
from ..backends.npu_plan import Plan

_FAMILY = {'upsample': 'upsample', 'max_pool2d': 'max', 'avg_pool2d': 'avg',
           'adaptive_avg_pool2d': 'avg'}


def _bound(op: str, kwargs: dict) -> dict:
    from .. import ops
    fn = getattr(ops, op)
    sig = inspect.signature(fn)
    bound = sig.bind_partial(**kwargs)
    bound.apply_defaults()
    return dict(bound.arguments)


def plan_for_call(op: str, input: torch.Tensor, kwargs: dict,
                  caps: Optional[DeviceCaps] = None) -> Plan:
    """The NPU plan for ``mmseg_cann.ops.<op>(input, **kwargs)`` on ``caps``.

    Only ``input``'s shape, dtype, memory format and, for max pooling, the data checks
    the plan depends on (NaN/-Inf where the device returns real indices, the range of
    int32/int64 input) are used; no op runs.
    """
    if op not in _FAMILY:
        raise ValueError(f'op must be one of {tuple(_FAMILY)}, got {op!r}')
    a = _bound(op, dict(kwargs))
    caps = caps if caps is not None else device_caps(input.device)
    dtype = resolve_compute_dtype(_FAMILY[op], a.get('precision'), input.dtype) or input.dtype
    probe = input.to(dtype) if op == 'max_pool2d' else \
        torch.empty_strided(input.shape, input.stride(), dtype=dtype, device='meta')
    hw = input.shape[-2:]
    if op == 'upsample':
        args = geo.check_upsample_args(a['size'], a['scale_factor'], a['mode'],
                                       a['align_corners'], a['recompute_scale_factor'],
                                       a['antialias'])
        return plan_for(op, probe, geo.upsample_spec(hw, args), caps=caps)
    if op == 'adaptive_avg_pool2d':
        return plan_for(op, probe, caps=caps,
                        out_size=geo.adaptive_output_size(hw, a['output_size']))
    dilation = a.get('dilation', 1)
    args = geo.check_pool_args(a['kernel_size'], a['stride'], a['padding'], dilation,
                               a['ceil_mode'])
    spec = geo.pool_spec(hw, args)
    if op == 'max_pool2d':
        return plan_for(op, probe, spec, caps=caps, return_indices=a['return_indices'])
    return plan_for(op, probe, spec, caps=caps, count_include_pad=a['count_include_pad'],
                    divisor_override=a['divisor_override'])


#: what the device's max-pooling indices reveal about the kernel that ran
_INDEX_KERNELS = {'int8 mask': 'aclnnMaxPool2dWithMask (the device returned an int8 mask; '
                               'indices recomputed on the CPU)',
                  'int32 indices': 'aclnnMaxPool2dWithIndices (the device returned int32 '
                                   'indices)',
                  'int64 indices': 'int64 indices from the device'}


def kernel_from_indices(observed: Sequence[str]) -> str:
    """The max-pooling kernel the device used, from what it returned as indices.

    ``observed`` is what :func:`mmseg_cann.backends.npu.observe_device_indices` collected
    for one call (``'int8 mask'``, ``'int32 indices'``...). Returns '' when nothing was
    observed.
    """
    if not observed:
        return ''
    kinds = sorted(set(observed))
    return '; '.join(_INDEX_KERNELS.get(kind, f'the device returned {kind}') for kind in kinds)


def describe_observed(plan: Plan, observed: Sequence[str]) -> str:
    """``plan.describe()`` with the kernel replaced by the one the device's indices reveal.

    For max pooling with indices this reports what ran instead of the planner's
    prediction; other plans are described as they are.
    """
    kernel = kernel_from_indices(observed)
    if not kernel or plan.op != 'max_pool2d' or plan.on_cpu:
        return plan.describe()
    text = f'{plan.name} -> {kernel}'
    if plan.fallback:
        text += f' [fallback: {plan.fallback}]'
    return text
