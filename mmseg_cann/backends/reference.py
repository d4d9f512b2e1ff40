"""Reference backend: the float64 implementations of :mod:`mmseg_cann.core.reference`.

Computes in float64 (integer pooling in its own integer dtype, exactly) and returns the
input's dtype and memory format, so it can stand in for the native backend anywhere
(slowly). uint8 bilinear/bicubic is PyTorch's fixed-point arithmetic, which float64
does not reproduce: it runs natively, counted as a fallback.
"""
from __future__ import annotations

import torch

from ..core import reference as ref
from ..core.validation import is_channels_last, native_only_upsample
from ..utils import record_fallback
from . import native


def _like(result: torch.Tensor, input: torch.Tensor) -> torch.Tensor:
    if result.dtype == input.dtype or input.dtype.is_floating_point:
        out = result.to(input.dtype)
    else:  # float64 values of an integer input (uint8 nearest: exact)
        out = result.round().to(input.dtype)
    if is_channels_last(input):
        out = out.contiguous(memory_format=torch.channels_last)
    return out


def upsample(input, spec):
    if native_only_upsample(input.dtype, spec.mode):
        record_fallback('upsample', "backend='reference': uint8 bilinear/bicubic is "
                                    "PyTorch's fixed-point arithmetic; running natively")
        return native.upsample(input, spec)
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
