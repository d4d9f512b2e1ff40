"""Validation of tensor inputs (rank, emptiness, dtype) shared by every op."""
from __future__ import annotations

from typing import Sequence

import torch

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
        ValueError: wrong rank, or an empty channel or spatial dimension (an empty batch
            is valid).
    """
    if not isinstance(input, torch.Tensor):
        raise TypeError(f'{name}: input must be a torch.Tensor, got {type(input).__name__}')
    if input.dim() not in ranks:
        layouts = ' or '.join({3: '(C, H, W)', 4: '(N, C, H, W)'}[r] for r in ranks)
        raise ValueError(f'{name}: input must be {layouts}, got a {input.dim()}-D tensor '
                         f'of shape {tuple(input.shape)}')
    if input.dtype not in FLOATING_DTYPES and input.dtype not in integer_dtypes:
        accepted = [str(d).replace('torch.', '') for d in FLOATING_DTYPES + tuple(integer_dtypes)]
        hint = '' if integer_dtypes else '; cast integer inputs to a floating dtype first'
        raise TypeError(f'{name}: input dtype {input.dtype} is not supported; accepted '
                        f'dtypes: {", ".join(accepted)}{hint}')
    # symbolic sizes (dynamic-shape export) are not compared: that would specialise them
    if any(isinstance(d, int) and d == 0 for d in input.shape[-3:]):
        raise ValueError(f'{name}: channel and spatial dimensions must be non-empty, got '
                         f'shape {tuple(input.shape)} (only the batch dimension may be 0)')
