"""Validation shared by every op: tensor inputs (rank, emptiness, dtype) and the
argument checks that are not geometry (divisor override, fused-op modes)."""
from __future__ import annotations

from typing import Sequence

import torch

from . import geometry as geo
from .errors import ArgumentError

FLOATING_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
INTEGER_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


def check_input(input, name: str, *, ranks: Sequence[int], integer_dtypes=()) -> None:
    """Check that ``input`` is a tensor an op accepts, before any kernel runs.

    Args:
        input: the value passed as the op's input.
        name: the op's name, used in messages.
        ranks: accepted numbers of dimensions, e.g. ``(4,)`` or ``(3, 4)``.
        integer_dtypes: integer dtypes accepted besides the floating ones.

    Raises:
        TypeError: ``input`` is not a tensor, or has a dtype the op does not accept.
        ArgumentError: (a ``ValueError`` and a ``RuntimeError``, as PyTorch raises) wrong
            rank, or an empty channel or spatial dimension (an empty batch is valid).
    """
    if not isinstance(input, torch.Tensor):
        raise TypeError(f'{name}: input must be a torch.Tensor, got {type(input).__name__}')
    if input.dim() not in ranks:
        layouts = ' or '.join({3: '(C, H, W)', 4: '(N, C, H, W)'}[r] for r in ranks)
        raise ArgumentError(f'{name}: input must be {layouts}, got a {input.dim()}-D tensor '
                         f'of shape {tuple(input.shape)}')
    if input.dtype not in FLOATING_DTYPES and input.dtype not in integer_dtypes:
        accepted = [str(d).replace('torch.', '') for d in FLOATING_DTYPES + tuple(integer_dtypes)]
        hint = '' if integer_dtypes else '; cast integer inputs to a floating dtype first'
        raise TypeError(f'{name}: input dtype {input.dtype} is not supported; accepted '
                        f'dtypes: {", ".join(accepted)}{hint}')
    # symbolic sizes (dynamic-shape export) are not compared: that would specialise them
    if any(isinstance(d, int) and d == 0 for d in input.shape[-3:]):
        raise ArgumentError(f'{name}: channel and spatial dimensions must be non-empty, got '
                         f'shape {tuple(input.shape)} (only the batch dimension may be 0)')


def check_divisor_override(divisor_override) -> None:
    """``divisor_override`` is None or a non-zero int."""
    if divisor_override is None:
        return
    if isinstance(divisor_override, bool) or not geo._is_int(divisor_override):
        raise TypeError(f'divisor_override must be None or a non-zero int, got '
                        f'{divisor_override!r}')
    if int(divisor_override) == 0:
        raise ArgumentError('divisor_override must be None or a non-zero int, got 0')


def check_fused_mode(name: str, mode, align_corners):
    """Validate the mode of a fused op; returns ``align_corners`` as the geometry takes it."""
    if not isinstance(mode, str) or mode not in geo.FUSED_MODES:
        raise ValueError(f'{name}: mode must be one of {geo.FUSED_MODES}, got {mode!r}')
    if align_corners is not None and not isinstance(align_corners, bool):
        raise TypeError(f'{name}: align_corners must be None, True or False, '
                        f'got {align_corners!r}')
    if mode in geo.NEAREST_MODES:
        if align_corners:
            raise ValueError(f'{name}: align_corners=True is only meaningful for '
                             f"mode='bilinear', got mode={mode!r}")
        align_corners = None  # the default False means "not set" for nearest modes
    return align_corners


def is_channels_last(x: torch.Tensor) -> bool:
    """Whether ``x`` is a 4-D tensor whose strides are unambiguously channels_last (NHWC):
    the layout PyTorch's kernels (and ours) then keep for their output."""
    return (x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last)
            and not x.is_contiguous())
