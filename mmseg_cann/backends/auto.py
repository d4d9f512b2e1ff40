"""``backend='auto'``: per call, the tuned backend when ``MMSEG_CANN_TUNE`` is set, the
NPU planner (:mod:`.npu`) for tensors on an ``npu`` device, the native ops otherwise.
The fused ops run on the ``'fused'`` backend when no gradient is needed and unfused
(native, differentiable) otherwise."""
from __future__ import annotations

from types import ModuleType

import torch

from . import fused, native, npu, tuned


def select(input: torch.Tensor) -> ModuleType:
    """The backend module ``'auto'`` uses for ``input``."""
    if tuned.tuning_enabled():
        return tuned
    return npu if input.device.type == 'npu' else native


def upsample(input, spec):
    return select(input).upsample(input, spec)


def max_pool2d(input, spec, return_indices=False):
    return select(input).max_pool2d(input, spec, return_indices)


def avg_pool2d(input, spec, count_include_pad=True, divisor_override=None):
    return select(input).avg_pool2d(input, spec, count_include_pad, divisor_override)


def adaptive_avg_pool2d(input, output_size):
    return select(input).adaptive_avg_pool2d(input, output_size)


def upsample_add(input, other, spec):
    impl = native if fused.needs_grad(input, other) else fused
    return impl.upsample_add(input, other, spec)


def upsample_argmax(logits, spec):
    impl = native if fused.needs_grad(logits) else fused
    return impl.upsample_argmax(logits, spec)
