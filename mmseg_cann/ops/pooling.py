"""Pooling ops: ``max_pool2d``, ``avg_pool2d`` and ``adaptive_avg_pool2d``.

Same signatures and semantics as ``torch.nn.functional``, plus the ONNX ``auto_pad``
padding strings (``'valid'``, ``'same'`` = ``'same_upper'``, ``'same_lower'``), a
``precision`` setting and a ``backend`` choice.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import backends
from ..core.errors import InputRankError
from ..core.precision import normalize_precision, run_with_precision
from ..core import geometry as geo
from ..core.validation import (AVG_POOL_DTYPES, MAX_POOL_DTYPES, adaptive_mean_only,
                               check_adaptive_input, check_divisor_override,
                               check_pool_input, check_tensor)
from ..utils import record_fallback
from . import direct


def max_pool2d(input: torch.Tensor, kernel_size, stride=None, padding=0, dilation=1,
               ceil_mode: bool = False, return_indices: bool = False, *, precision=None,
               backend: str = 'auto'):
    """2-D max pooling exactly as ``F.max_pool2d``.

    Args:
        input: ``(N, C, H, W)`` or ``(C, H, W)`` floating or integer tensor (not bool),
            empty only in the batch dimension.
        kernel_size, stride, dilation: int or pair; ``stride`` defaults to the kernel.
        padding: int or pair (at most half the kernel, PyTorch's rule), or
            ``'valid'``, ``'same'``/``'same_upper'``, ``'same_lower'`` (ONNX ``auto_pad``:
            output ``ceil(in / stride)``, the odd padded cell at the end or the start;
            padded cells never win).
        ceil_mode: ceil instead of floor in the output size (ignored by SAME padding,
            whose output size is exact). The last window may then run past the padded
            input, as long as it starts inside the input or the left padding.
        return_indices: also return int64 flat indices into each input ``H * W`` plane
            (PyTorch's format, also for SAME padding); read by truth value, as
            ``F.max_pool2d`` does (``1`` and ``numpy.bool_(True)`` count as true).
        precision: compute dtype, None defers to the policy's ``max`` entry.
        backend: a registered backend name (``'auto'``, ``'native'``, ``'fast'``,
            ``'reference'``, ``'npu'``, ``'tuned'``, ``'triton'``, ...; see
            :mod:`mmseg_cann.backends`).

    Returns:
        ``(N, C, H_out, W_out)`` values (and indices). NaN propagates.

    Raises:
        TypeError, ValueError: invalid arguments, before any kernel runs; each also of
            PyTorch's type for the same call (:mod:`mmseg_cann.core.errors`).
    """
    out = direct.run_cached(direct.max_pool2d, (kernel_size, stride, padding, dilation,
                                                ceil_mode, return_indices, precision,
                                                backend), input)
    if out is not None:
        return out
    # PyTorch's order: argument types, then the input's shape, then its dtype
    check_tensor(input, 'max_pool2d')
    args = geo.check_pool_args(kernel_size, stride, padding, dilation, ceil_mode,
                               check_padding_limit=False)
    return_indices = geo.truth_flag(return_indices)
    normalize_precision(precision)
    impl = backends.get_backend(backend, 'max_pool2d')
    check_pool_input(input, 'max_pool2d', MAX_POOL_DTYPES)
    geo.check_padding_limit_of(args)
    spec = geo.pool_spec(input.shape[-2:], args)
    return run_with_precision(
        'max', precision, input, lambda x: impl.max_pool2d(x, spec, return_indices),
        probe_key='max_pool2d', probe=lambda t: F.max_pool2d(t, 2))


def avg_pool2d(input: torch.Tensor, kernel_size, stride=None, padding=0,
               ceil_mode: bool = False, count_include_pad: bool = True, divisor_override=None,
               *, precision=None, backend: str = 'auto') -> torch.Tensor:
    """2-D average pooling exactly as ``F.avg_pool2d``.

    Args:
        input: ``(N, C, H, W)`` or ``(C, H, W)`` floating or int64 tensor (int64 sums
            in integers and divides truncating, as PyTorch), empty only in the batch
            dimension.
        kernel_size, stride, ceil_mode: as ``F.avg_pool2d``.
        padding: int or pair (at most half the kernel), or a padding string as in
            :func:`max_pool2d`. With SAME padding, ``count_include_pad`` follows ONNX:
            True divides every window by ``kH * kW``, False by its number of input cells.
        count_include_pad: whether padded cells count in the divisor.
        divisor_override: a non-zero int used as the divisor for every window.
        precision: compute dtype, None defers to the policy's ``avg`` entry (default
            ``'fp32'``: fp16/bf16 inputs are averaged in float32).
        backend: a registered backend name (``'auto'``, ``'native'``, ``'fast'``,
            ``'reference'``, ``'npu'``, ``'tuned'``, ``'triton'``, ...; see
            :mod:`mmseg_cann.backends`).
    """
    out = direct.run_cached(direct.avg_pool2d, (kernel_size, stride, padding, ceil_mode,
                                                count_include_pad, divisor_override,
                                                precision, backend), input)
    if out is not None:
        return out
    check_tensor(input, 'avg_pool2d')
    args = geo.check_pool_args(kernel_size, stride, padding, 1, ceil_mode,
                               check_padding_limit=False)
    if not isinstance(count_include_pad, bool):
        raise TypeError(f'count_include_pad must be True or False, got {count_include_pad!r}')
    check_divisor_override(divisor_override)
    normalize_precision(precision)
    impl = backends.get_backend(backend)
    check_pool_input(input, 'avg_pool2d', AVG_POOL_DTYPES)
    geo.check_padding_limit_of(args)
    spec = geo.pool_spec(input.shape[-2:], args)
    return run_with_precision(
        'avg', precision, input,
        lambda x: impl.avg_pool2d(x, spec, count_include_pad, divisor_override),
        probe_key='avg_pool2d', probe=lambda t: F.avg_pool2d(t, 2))


def adaptive_avg_pool2d(input: torch.Tensor, output_size, *, precision=None,
                        backend: str = 'auto') -> torch.Tensor:
    """Adaptive average pooling exactly as ``F.adaptive_avg_pool2d``.

    Args:
        input: ``(N, C, H, W)`` or ``(C, H, W)`` floating tensor; the batch and channel
            dimensions may be empty.
        output_size: int or pair; a None entry keeps that input size; 0 gives an empty
            output. Bin ``i`` of an axis averages input
            ``[floor(i*in/out), ceil((i+1)*in/out))``.
        precision: compute dtype, None defers to the policy's ``avg`` entry.
        backend: a registered backend name (``'auto'``, ``'native'``, ``'fast'``,
            ``'reference'``, ``'npu'``, ``'tuned'``, ``'triton'``, ...; see
            :mod:`mmseg_cann.backends`).

    A 1x1 output is PyTorch's mean over H and W, which PyTorch also takes for inputs
    outside the kernels' domain (other ranks, an empty H or W, complex dtypes): those
    calls run ``F.adaptive_avg_pool2d`` itself, counted as a fallback.
    """
    out = direct.run_cached(direct.adaptive_avg_pool2d, (output_size, precision, backend),
                            input)
    if out is not None:
        return out
    check_tensor(input, 'adaptive_avg_pool2d')
    normalize_precision(precision)
    impl = backends.get_backend(backend)
    if input.dim() < 2:
        raise InputRankError(f'adaptive_avg_pool2d: input must be (C, H, W) or (N, C, H, W), '
                             f'got a {input.dim()}-D tensor (Dimension out of range)')
    out_hw = geo.adaptive_output_size(input.shape[-2:], output_size)
    if adaptive_mean_only(input, out_hw):
        result = F.adaptive_avg_pool2d(input, output_size)
        record_fallback('adaptive_avg_pool2d', f'a 1x1 output of a {input.dim()}-D '
                        f'{input.dtype} input of shape {tuple(input.shape)} is outside the '
                        "kernels' domain; PyTorch's mean ran")
        return result
    check_adaptive_input(input, out_hw)
    return run_with_precision(
        'avg', precision, input, lambda x: impl.adaptive_avg_pool2d(x, out_hw),
        probe_key='adaptive_avg_pool2d', probe=lambda t: F.adaptive_avg_pool2d(t, 2))
