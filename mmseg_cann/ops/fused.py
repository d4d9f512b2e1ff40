"""Fused decoder ops: ``upsample_add`` (FPN top-down fusion) and ``upsample_argmax``.

Both are defined by the unfused PyTorch computation they replace:

* ``upsample_add(input, other)`` == ``other + F.interpolate(input, size=other.shape[-2:])``
* ``upsample_argmax(logits, size)`` == ``F.interpolate(logits, size).argmax(1)``

The arguments are validated with the shared rules of :mod:`.geometry` and :mod:`.inputs`
before any kernel runs. Backends (``backend=``):

``'auto'``
    ``'fused'`` when no gradient is needed, ``'native'`` otherwise (autograd); while
    :func:`mmseg_cann.onnx.export_onnx` traces, the unfused export form
    (:mod:`mmseg_cann.onnx.ops`: ``Resize`` + ``Add`` / ``Resize`` + ``ArgMax``).
``'native'``
    the unfused eager computation (PyTorch's kernels; differentiable).
``'fused'``
    the fast implementations of :mod:`mmseg_cann.backends.fused`: bilinear float32 on
    CPU runs numba kernels (:mod:`mmseg_cann.backends.numba_cpu`: one pass over the
    output; values within the rounding of two lerps of PyTorch's, bit-identical on
    decoder-sized outputs); otherwise ``upsample_add`` adds in place into the freshly
    upsampled tensor (one output allocation instead of two) and ``upsample_argmax``
    processes bands of output rows with a separable interpolation compiled by
    ``torch.compile``. ``upsample_argmax`` never holds full-resolution logits. Not
    differentiable; an input that needs a gradient takes the native path (counted as a
    fallback).
``'reference'``
    float64 from :mod:`.reference` (slow; for checking).
``'triton'``
    one Triton kernel per op (:mod:`mmseg_cann.backends.triton`; not differentiable).
"""
from __future__ import annotations

import torch

from .. import backends
from ..core import geometry as geo
from ..core.validation import check_fused_mode, check_input

def upsample_add(input: torch.Tensor, other: torch.Tensor, mode: str = 'bilinear',
                 align_corners=False, *, backend: str = 'auto') -> torch.Tensor:
    """``other + upsample(input, size=other.shape[-2:], mode, align_corners)``.

    Args:
        input: ``(N, C, h, w)`` floating tensor (the coarser map).
        other: ``(N, C, H, W)`` tensor of the same dtype and device (the lateral).
        mode: ``'nearest'``, ``'nearest-exact'`` or ``'bilinear'``.
        align_corners: bilinear only (``False``/``None`` for the nearest modes).
        backend: a backend implementing the op (``'auto'``, ``'native'``, ``'fused'``,
            ``'fast'``, ``'reference'``, ``'triton'``; see :mod:`mmseg_cann.backends`).

    Returns:
        ``(N, C, H, W)`` tensor with ``other``'s dtype; differentiable with respect to
        both inputs (through the native path). The fused CPU kernel's values may differ
        from the unfused ones in the last bit (see ``'fused'`` above).
    """
    name = 'upsample_add'
    check_input(input, name, ranks=(4,))
    if not isinstance(other, torch.Tensor):
        raise TypeError(f'{name}: other must be a torch.Tensor, got {type(other).__name__}')
    check_input(other, f'{name} (other)', ranks=(4,))
    if other.shape[:2] != input.shape[:2]:
        raise ValueError(f'{name}: input and other must have the same batch and channel '
                         f'sizes, got input {tuple(input.shape)} and other '
                         f'{tuple(other.shape)}')
    if other.dtype != input.dtype or other.device != input.device:
        raise TypeError(f'{name}: input and other must have the same dtype and device, got '
                        f'{input.dtype} on {input.device} and {other.dtype} on '
                        f'{other.device}')
    align_corners = check_fused_mode(name, mode, align_corners)
    args = geo.check_upsample_args(size=tuple(other.shape[-2:]), mode=mode,
                                   align_corners=align_corners)
    impl = backends.get_backend(backend, name)
    return impl.upsample_add(input, other, geo.upsample_spec(input.shape[-2:], args))


def upsample_argmax(logits: torch.Tensor, size, mode: str = 'bilinear', align_corners=False,
                    *, backend: str = 'auto') -> torch.Tensor:
    """``upsample(logits, size, mode, align_corners).argmax(1)`` without full-size logits.

    Args:
        logits: ``(N, C, h, w)`` floating tensor of class scores.
        size: output ``(H, W)`` or an int for both.
        mode: ``'nearest'``, ``'nearest-exact'`` or ``'bilinear'``.
        align_corners: bilinear only (``False``/``None`` for the nearest modes).
        backend: a backend implementing the op (``'auto'``, ``'native'``, ``'fused'``,
            ``'fast'``, ``'reference'``, ``'triton'``; see :mod:`mmseg_cann.backends`).

    Returns:
        ``(N, H, W)`` int64 labels. Equal to the unfused computation except where two
        classes tie exactly (or, for the fused bilinear path, differ by a rounding
        error of the interpolation: the last bit of the products may differ).
    """
    name = 'upsample_argmax'
    check_input(logits, name, ranks=(4,))
    align_corners = check_fused_mode(name, mode, align_corners)
    args = geo.check_upsample_args(size=size, mode=mode, align_corners=align_corners)
    impl = backends.get_backend(backend, name)
    return impl.upsample_argmax(logits, geo.upsample_spec(logits.shape[-2:], args))
