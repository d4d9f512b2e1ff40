"""Validation shared by every op: tensor inputs (rank, emptiness, dtype) and the
argument checks that are not geometry (divisor override, fused-op modes).

The input rules are PyTorch's, per op, with PyTorch's wording inside the messages and
exceptions that are also of PyTorch's type (:mod:`.errors`):

* dtypes: each op takes the dtypes of PyTorch's CPU kernels (:data:`MAX_POOL_DTYPES`,
  :data:`AVG_POOL_DTYPES`, :data:`ADAPTIVE_AVG_POOL_DTYPES`, :func:`upsample_dtypes`);
  others raise :class:`UnsupportedDtypeError` (``TypeError`` and PyTorch's
  ``NotImplementedError``);
* ranks: 3-D or 4-D for pooling, 4-D for the upsample kernels;
* empty dimensions: max/avg pooling and upsampling take an empty batch only; adaptive
  average pooling (and ``'area'``) also an empty channel dimension, and its 1x1 output
  is PyTorch's mean over H and W, which takes any input (:func:`adaptive_mean_only`).
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from . import geometry as geo
from .errors import ArgumentError, InputRankError, UnsupportedDtypeError

FLOATING_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
INTEGER_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)

#: dtypes of PyTorch's max-pooling kernels (not bool, not complex)
MAX_POOL_DTYPES = FLOATING_DTYPES + INTEGER_DTYPES
#: dtypes of PyTorch's average-pooling kernels (int64: integer sums, truncating division)
AVG_POOL_DTYPES = FLOATING_DTYPES + (torch.int64,)
#: dtypes of PyTorch's adaptive average-pooling kernel (also ``mode='area'``)
ADAPTIVE_AVG_POOL_DTYPES = FLOATING_DTYPES

# PyTorch's names of its scalar types, as its "not implemented for 'Short'" errors say
_TORCH_TYPE_NAMES = {
    torch.uint8: 'Byte', torch.int8: 'Char', torch.int16: 'Short', torch.int32: 'Int',
    torch.int64: 'Long', torch.bool: 'Bool', torch.float16: 'Half',
    torch.bfloat16: 'BFloat16', torch.float32: 'Float', torch.float64: 'Double',
    torch.complex64: 'ComplexFloat', torch.complex128: 'ComplexDouble',
}


def upsample_dtypes(mode: str) -> tuple:
    """The dtypes PyTorch's CPU upsample kernels take for ``mode`` (4-D input).

    ``uint8`` is accepted by the nearest modes and by bilinear/bicubic (with or without
    antialias; PyTorch's own uint8 arithmetic, which only its native kernel reproduces:
    :func:`native_only_upsample`); ``'area'`` is adaptive average pooling (floating only).
    """
    return ADAPTIVE_AVG_POOL_DTYPES if mode == 'area' else FLOATING_DTYPES + (torch.uint8,)


def native_only_upsample(dtype: torch.dtype, mode: str) -> bool:
    """Whether only PyTorch's own kernel computes this upsample exactly: uint8
    bilinear/bicubic, whose fixed-point arithmetic (rounding of the weights and of
    the result) no other backend reproduces."""
    return dtype == torch.uint8 and mode in geo.INTERPOLATING_MODES


def check_tensor(input, name: str) -> None:
    """``TypeError`` unless ``input`` is a tensor."""
    if not isinstance(input, torch.Tensor):
        raise TypeError(f'{name}: input must be a torch.Tensor, got {type(input).__name__}')


def check_dtype(input: torch.Tensor, name: str, accepted: Sequence[torch.dtype],
                kernel: Optional[str] = None, hint: str = '') -> None:
    """:class:`UnsupportedDtypeError` unless ``input.dtype`` is one of ``accepted``; the
    message names the input dtype, the accepted ones and, in PyTorch's words, the kernel
    (``"max_pool2d" not implemented for 'Bool'``)."""
    if input.dtype in accepted:
        return
    torch_name = _TORCH_TYPE_NAMES.get(input.dtype, str(input.dtype).replace('torch.', ''))
    names = ', '.join(str(d).replace('torch.', '') for d in accepted)
    raise UnsupportedDtypeError(
        f'{name}: input dtype {input.dtype} is not supported ("{kernel or name}" not '
        f"implemented for '{torch_name}'); accepted dtypes: {names}{hint}")


def check_input(input, name: str, *, ranks: Sequence[int], integer_dtypes=(),
                dtypes: Optional[Sequence[torch.dtype]] = None,
                kernel: Optional[str] = None) -> None:
    """Check that ``input`` is a tensor an op accepts, before any kernel runs.

    Args:
        input: the value passed as the op's input.
        name: the op's name, used in messages.
        ranks: accepted numbers of dimensions: ``(3, 4)`` (pooling) or ``(4,)``
            (upsampling).
        integer_dtypes: integer dtypes accepted besides the floating ones.
        dtypes: the accepted dtypes (overrides the floating ones + ``integer_dtypes``).
        kernel: PyTorch's kernel name for the dtype message (default ``name``).

    Raises:
        TypeError: ``input`` is not a tensor.
        UnsupportedDtypeError: a dtype the op does not take (``TypeError`` and
            ``NotImplementedError``, as PyTorch raises).
        InputRankError: wrong rank (``ValueError``, ``RuntimeError``, ``IndexError``).
        ArgumentError: (``ValueError`` and ``RuntimeError``) an empty channel or spatial
            dimension (an empty batch is valid).
    """
    check_tensor(input, name)
    shape = list(input.shape)
    if input.dim() not in ranks:
        layouts = ' or '.join({3: '(C, H, W)', 4: '(N, C, H, W)'}[r] for r in ranks)
        raise InputRankError(f'{name}: input must be {layouts}, got a {input.dim()}-D '
                             f'tensor of shape {tuple(shape)} ({_rank_words(ranks, shape)})')
    if dtypes is None:
        dtypes = FLOATING_DTYPES + tuple(integer_dtypes)
    check_dtype(input, name, dtypes, kernel,
                '' if any(not d.is_floating_point for d in dtypes) else
                '; cast integer inputs to a floating dtype first')
    # symbolic sizes (dynamic-shape export) are not compared: that would specialise them
    if any(isinstance(d, int) and d == 0 for d in shape[-3:]):
        raise ArgumentError(f'{name}: channel and spatial dimensions must be non-empty, got '
                            f'shape {tuple(shape)} (only the batch dimension may be 0; '
                            f'{_empty_words(ranks, shape)})')


def _rank_words(ranks: Sequence[int], shape) -> str:
    if tuple(ranks) == (4,):
        return 'Expected a 4D input tensor (N, C, H, W)'
    return ('Expected 3D or 4D (batch mode) tensor with optional 0 dim batch size for '
            f'input, but got: {shape}')


def _empty_words(ranks: Sequence[int], shape) -> str:
    """PyTorch's message for an empty non-batch dimension."""
    if tuple(ranks) != (4,):
        return _rank_words(ranks, shape)
    h, w = shape[-2:]
    if h == 0 or w == 0:
        return f'Input and output sizes should be greater than 0, but got input (H: {h}, ' \
               f'W: {w})'
    return f'Non-empty 4D data tensor expected but got a tensor with sizes {shape}'


def check_pool_input(input, name: str, dtypes: Sequence[torch.dtype]) -> None:
    """The input rules of ``max_pool2d``/``avg_pool2d``: ``(C, H, W)`` or ``(N, C, H, W)``,
    non-empty except the batch, one of ``dtypes`` (:func:`check_input`)."""
    check_input(input, name, ranks=(3, 4), dtypes=dtypes)


def adaptive_mean_only(input: torch.Tensor, out_hw) -> bool:
    """Whether an adaptive average pooling call is outside the kernels' domain but
    accepted by PyTorch as its mean over H and W: a 1x1 output of an input with an empty
    H or W (the mean of nothing: NaN), of another rank than 3 or 4, or of a non-real
    floating dtype such as complex. Such calls run PyTorch's own op."""
    # a symbolic output size (dynamic-shape export) is not compared: that would
    # specialise it; the kernels' path handles it
    if any(geo.is_symbolic(o) for o in out_hw) or tuple(out_hw) != (1, 1):
        return False
    if input.dim() not in (3, 4):
        return True
    if input.dtype.is_complex:
        return True
    return input.dtype.is_floating_point and any(
        isinstance(d, int) and d == 0 for d in input.shape[-2:])


def check_adaptive_input(input, out_hw, name: str = 'adaptive_avg_pool2d') -> None:
    """The input rules of adaptive average pooling to ``out_hw`` for calls that are not
    :func:`adaptive_mean_only`: ``(C, H, W)`` or ``(N, C, H, W)`` (batch and channels may
    be empty, H and W may not), a floating dtype.

    Raises :class:`InputRankError`, :class:`UnsupportedDtypeError` or
    :class:`ArgumentError`, with PyTorch's wording.
    """
    check_tensor(input, name)
    shape = list(input.shape)
    if input.dim() not in (3, 4):
        raise InputRankError(f'{name}: input must be (C, H, W) or (N, C, H, W), got a '
                             f'{input.dim()}-D tensor of shape {tuple(shape)} '
                             f'(adaptive_avg_pool2d(): Expected 3D or 4D tensor, but got '
                             f'{shape})')
    check_dtype(input, name, ADAPTIVE_AVG_POOL_DTYPES, 'adaptive_avg_pool2d',
                '; cast integer inputs to a floating dtype first')
    for axis in (-2, -1):
        if isinstance(shape[axis], int) and shape[axis] == 0:
            raise ArgumentError(
                f'{name}: H and W must be non-empty, got shape {tuple(shape)} '
                f'(adaptive_avg_pool2d(): Expected input to have non-zero size for '
                f'non-batch dimensions, but input has sizes {shape} with dimension '
                f'{input.dim() + axis} being empty)')


def check_divisor_override(divisor_override) -> None:
    """``divisor_override`` is None or a non-zero int."""
    if divisor_override is None:
        return
    if isinstance(divisor_override, bool) or not geo._is_int(divisor_override):
        raise TypeError(f'divisor_override must be None or a non-zero int, got '
                        f'{divisor_override!r}')
    if int(divisor_override) == 0:
        raise ArgumentError('divisor_override must be None or a non-zero int, got 0 '
                            '(divisor must be not zero)')


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
