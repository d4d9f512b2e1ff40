"""Reference backend: the float64 implementations of :mod:`mmseg_cann.core.reference`.

Computes in float64 and returns the input's dtype and memory format, so it can stand
in for the native backend anywhere (slowly).
"""
from __future__ import annotations

import torch

from ..core import reference as ref
from ..core.validation import is_channels_last


def _like(result: torch.Tensor, input: torch.Tensor) -> torch.Tensor:
    out = result.to(input.dtype) if input.dtype.is_floating_point else result.round().to(
        input.dtype)
    if is_channels_last(input):
        out = out.contiguous(memory_format=torch.channels_last)
    return out


def upsample(input, spec):
    return _like(ref.upsample_from_spec(input, spec), input)


def max_pool2d(input, spec, return_indices=False):
    result = ref.max_pool2d_from_spec(input, spec, return_indices)
    if return_indices:
        return _like(result[0], input), result[1]
    return _like(result, input)


def avg_pool2d(input, spec, count_include_pad=True, divisor_override=None):
    return _like(ref.avg_pool2d_from_spec(input, spec, count_include_pad, divisor_override),
                 input)


def adaptive_avg_pool2d(input, output_size):
    return _like(ref.adaptive_avg_pool2d(input, output_size), input)


def upsample_add(input, other, spec):
    """float64 ``other + upsample(input)``, rounded once to ``other``'s dtype."""
    return _like(ref.upsample_from_spec(input, spec) + other.to(torch.float64), other)


def upsample_argmax(logits, spec):
    """Argmax over classes of the float64 upsampled logits."""
    return ref.upsample_from_spec(logits, spec).argmax(1)
