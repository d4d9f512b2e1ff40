"""The ``'fast'`` backend: the project's own kernels where they exist for the device,
PyTorch's op (the native backend) elsewhere, within a documented error bound of PyTorch.

Where each op runs (docs/fused_ops.md, "backend='fast'"); ``upsample_add`` and
``upsample_argmax`` run the ``'fused'`` backend's kernels on the CPU (``upsample_add``
bilinear differentiable: the gradient reaches ``input`` through the bilinear backward
kernel below) and the Triton kernels on CUDA/NPU tensors:

* **CPU, float32** (numba installed, not a process forked after numba's thread pool
  started): the kernels of :mod:`.numba_ops`, NCHW and channels_last (other strides are
  made contiguous first), differentiable through ``torch.autograd.Function``:

  - ``upsample`` bilinear (not antialiased): forward kernel; backward in gather form by a
    kernel (deterministic, no atomics);
  - ``upsample`` nearest / nearest-exact: gather kernel with PyTorch's indices
    (:func:`mmseg_cann.core.reference.nearest_indices`); backward PyTorch's own
    ``upsample_nearest*_backward``;
  - ``max_pool2d`` (symmetric padding PyTorch accepts, ceil mode, dilation): values and
    PyTorch's indices; backward PyTorch's ``max_pool2d_with_indices_backward``;
  - ``avg_pool2d`` (symmetric padding PyTorch accepts, ceil mode, both
    ``count_include_pad``, ``divisor_override``): backward PyTorch's
    ``avg_pool2d_backward``.
* **CUDA / Ascend NPU tensors** with Triton installed: the public functions of
  :mod:`.triton` (its own fallbacks apply; nearest upsampling that needs a gradient runs
  natively, its Triton kernel has no backward).
* **Everything else** (other dtypes, bicubic/area, antialias, SAME or asymmetric pooling
  padding, adaptive pooling, other devices, no numba): the native backend, each case
  counted and logged as a fallback (:func:`mmseg_cann.utils.record_fallback`).

Error bound against PyTorch (float32; ``eps = 2**-23``, ``M`` the largest magnitude of
the values combined):

* bilinear forward: ``|fast - torch| <= 4 eps M`` (both round two lerps of the same
  float32 weights; on NCHW decoder shapes the values are usually PyTorch's bit for bit);
* bilinear backward: ``|fast - torch| <= (kh*kw + kh + kw + 4) eps S`` per input element,
  ``S`` the sum of ``|weight * grad|`` over the ``kh x kw`` output elements reading it
  (the two sum the same products in different orders);
* nearest forward and backward, max pooling values and indices, average pooling:
  PyTorch's values exactly (same gather; same scan order and NaN rule; same summation
  order and division; the backwards are PyTorch's ops). The documented bound for
  averages is one float32 rounding of the sum per term (``k*k eps sum|x| / divisor``);
  observed bit-identical.
"""
from __future__ import annotations

import importlib.util
from functools import lru_cache
from typing import Optional

import numpy as np
import torch

from ..core import geometry as geo
from ..core import reference as ref
from ..core.taps import linear_taps, pool_divisors, pool_first_taps
from ..core.validation import is_channels_last
from ..utils import record_fallback
from . import fused, native, numba_ops
from . import triton as triton_backend

#: the device types whose tensors run the Triton kernels
TRITON_DEVICES = ('cuda', 'npu')


# ---------------------------------------------------------------------- dispatch
def _on_triton_device(input: torch.Tensor, op: str) -> bool:
    """Whether ``input`` lives on a Triton device and Triton is installed (a recorded
    fallback to native when it is not)."""
    if input.device.type not in TRITON_DEVICES:
        return False
    if importlib.util.find_spec('triton') is None:
        record_fallback(op, "backend='fast' on a CUDA/NPU tensor needs Triton; running "
                            'natively')
        return False
    return True


def _cpu_kernel_applies(op: str, input: torch.Tensor, unsupported: Optional[str]) -> bool:
    """Whether the numba kernels run ``op`` on ``input``: a float32 CPU tensor, numba
    usable, and ``unsupported`` (the op's own reason to decline) None. Otherwise the
    reason is recorded as a fallback."""
    if input.device.type != 'cpu':
        reason = f'no fast kernel for {input.device.type} tensors'
    elif input.dtype != torch.float32:
        reason = f'the fast CPU kernels take float32, not {input.dtype}'
    elif not numba_ops.numba_cpu.available():
        reason = 'numba is not installed'
    elif numba_ops.numba_cpu.forked_after_use():
        reason = ('numba kernels are not used in a process forked after they ran (GNU '
                  'OpenMP is not fork-safe)')
    else:
        reason = unsupported
    if reason is None:
        return True
    record_fallback(op, f"backend='fast': {reason}; running natively")
    return False


def _layout(input: torch.Tensor):
    """``(dense input, nhwc)``: channels_last input runs the NHWC kernels, anything else
    the NCHW ones (made contiguous: a copy only for other strides)."""
    if is_channels_last(input):
        return input, True
    return input.contiguous(), False


def _view(t: torch.Tensor, nhwc: bool) -> np.ndarray:
    """The NumPy array a kernel takes: ``(N, C, H, W)`` or ``(N, H, W, C)``, zero copy."""
    return (t.permute(0, 2, 3, 1) if nhwc else t).numpy()


def _empty(shape, nhwc: bool, dtype=torch.float32) -> torch.Tensor:
    fmt = torch.channels_last if nhwc else torch.contiguous_format
    return numba_ops.empty(shape, dtype, fmt)


# ---------------------------------------------------------------------- upsample
@lru_cache(maxsize=256)
def _linear_axis(in_size: int, out_size: int, align_corners: bool, scale: Optional[float]):
    """NumPy forward taps ``(i0, i1, w0, w1)`` and reverse taps of one bilinear axis."""
    taps = tuple(t.numpy() for t in linear_taps(in_size, out_size, align_corners, scale))
    return taps, numba_ops.reverse_taps(*taps, in_size)


@lru_cache(maxsize=256)
def _nearest_axis(in_size: int, out_size: int, scale: Optional[float], exact: bool):
    return ref.nearest_indices(in_size, out_size, scale, exact).astype(np.int64)


def _bilinear_axes(spec: geo.UpsampleSpec):
    return [_linear_axis(spec.in_size[a], spec.out_size[a], bool(spec.align_corners),
                         spec.kernel_scales[a]) for a in range(2)]


class _Bilinear(torch.autograd.Function):
    """Bilinear upsampling by the numba kernels; gather-form backward kernel."""

    @staticmethod
    def forward(ctx, input, spec):
        x, nhwc = _layout(input)
        (rows, row_rev), (cols, col_rev) = _bilinear_axes(spec)
        out = _empty((x.shape[0], x.shape[1]) + tuple(spec.out_size), nhwc)
        numba_ops.bilinear(_view(x, nhwc), _view(out, nhwc), rows, cols, nhwc)
        ctx.reverse, ctx.nhwc, ctx.in_shape = (row_rev, col_rev), nhwc, x.shape
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        nhwc = ctx.nhwc
        # the kernels read the gradient in the input's layout (a copy if it differs)
        g = grad.contiguous(memory_format=torch.channels_last if nhwc
                            else torch.contiguous_format)
        gin = _empty(ctx.in_shape, nhwc)
        numba_ops.bilinear_backward(_view(g, nhwc), _view(gin, nhwc), *ctx.reverse, nhwc)
        return gin, None


class _Nearest(torch.autograd.Function):
    """Nearest upsampling by the numba gather kernel; PyTorch's backward."""

    @staticmethod
    def forward(ctx, input, spec):
        x, nhwc = _layout(input)
        exact = spec.mode == 'nearest-exact'
        ih, iw = (_nearest_axis(spec.in_size[a], spec.out_size[a], spec.kernel_scales[a],
                                exact) for a in range(2))
        out = _empty((x.shape[0], x.shape[1]) + tuple(spec.out_size), nhwc)
        numba_ops.nearest(_view(x, nhwc), _view(out, nhwc), ih, iw, nhwc)
        ctx.spec, ctx.in_shape = spec, tuple(x.shape)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        spec = ctx.spec
        op = (torch.ops.aten._upsample_nearest_exact2d_backward
              if spec.mode == 'nearest-exact' else torch.ops.aten.upsample_nearest2d_backward)
        return op(grad, list(spec.out_size), list(ctx.in_shape), *spec.kernel_scales), None


def _upsample_unsupported(spec: geo.UpsampleSpec) -> Optional[str]:
    if spec.antialias:
        return 'no fast kernel for antialias'
    if spec.mode not in geo.FUSED_MODES:
        return f'no fast kernel for mode={spec.mode!r}'
    return None


def upsample(input: torch.Tensor, spec: geo.UpsampleSpec) -> torch.Tensor:
    """Bilinear/nearest upsampling by the fast kernels (differentiable); other cases native."""
    if _on_triton_device(input, 'upsample'):
        if spec.mode in geo.NEAREST_MODES and fused.needs_grad(input):
            record_fallback('upsample', "backend='fast': the Triton nearest kernel has no "
                                        'backward; running natively')
            return native.upsample(input, spec)
        return triton_backend.upsample(input, spec)
    if not _cpu_kernel_applies('upsample', input, _upsample_unsupported(spec)):
        return native.upsample(input, spec)
    if spec.mode == 'bilinear':
        return _Bilinear.apply(input, spec)
    return _Nearest.apply(input, spec)


# ---------------------------------------------------------------------- pooling
def _pool_unsupported(spec: geo.PoolSpec) -> Optional[str]:
    if not spec.torch_padding_ok:
        return f'no fast kernel for padding {spec.args.padding!r} (asymmetric or above ' \
               'half the kernel)'
    return None


def _batched(input: torch.Tensor) -> torch.Tensor:
    return input.unsqueeze(0) if input.dim() == 3 else input


def _unbatched(input: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    return out.squeeze(0) if input.dim() == 3 else out


class _MaxPool(torch.autograd.Function):
    """Max pooling values and indices by the numba kernels; PyTorch's backward."""

    @staticmethod
    def forward(ctx, input, spec):
        x, nhwc = _layout(input)
        shape = (x.shape[0], x.shape[1]) + tuple(spec.out_size)
        out, idx = _empty(shape, nhwc), _empty(shape, nhwc, torch.int64)
        numba_ops.max_pool(_view(x, nhwc), _view(out, nhwc), _view(idx, nhwc), spec,
                           pool_first_taps(spec), nhwc)
        ctx.mark_non_differentiable(idx)
        ctx.save_for_backward(input, idx)
        ctx.spec = spec
        return out, idx

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad, _grad_idx):
        input, idx = ctx.saved_tensors
        a = ctx.spec.args
        return torch.ops.aten.max_pool2d_with_indices_backward(
            grad, input, list(a.kernel), list(a.stride), list(ctx.spec.pad_begin),
            list(a.dilation), a.ceil_mode, idx), None


def max_pool2d(input: torch.Tensor, spec: geo.PoolSpec, return_indices: bool = False):
    """Max pooling with PyTorch's values and indices (differentiable); other cases native."""
    if _on_triton_device(input, 'max_pool2d'):
        return triton_backend.max_pool2d(input, spec, return_indices)
    unsupported = _pool_unsupported(spec)
    if unsupported is None and spec.in_size[0] * spec.in_size[1] > numba_ops.MAX_POOL_PLANE:
        unsupported = 'an H*W plane above 2^24 elements'
    if not _cpu_kernel_applies('max_pool2d', input, unsupported):
        return native.max_pool2d(input, spec, return_indices)
    out, idx = _MaxPool.apply(_batched(input), spec)
    out, idx = _unbatched(input, out), _unbatched(input, idx)
    return (out, idx) if return_indices else out


class _AvgPool(torch.autograd.Function):
    """Average pooling by the numba kernels; PyTorch's backward."""

    @staticmethod
    def forward(ctx, input, spec, count_include_pad, divisor_override):
        x, nhwc = _layout(input)
        out = _empty((x.shape[0], x.shape[1]) + tuple(spec.out_size), nhwc)
        numba_ops.avg_pool(_view(x, nhwc), _view(out, nhwc), spec,
                           pool_divisors(spec, count_include_pad), divisor_override, nhwc)
        ctx.save_for_backward(input)
        ctx.args = (spec, count_include_pad, divisor_override)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        (input,), (spec, count_include_pad, divisor_override) = ctx.saved_tensors, ctx.args
        a = spec.args
        return torch.ops.aten.avg_pool2d_backward(
            grad, input, list(a.kernel), list(a.stride), list(spec.pad_begin), a.ceil_mode,
            count_include_pad, divisor_override), None, None, None


def avg_pool2d(input: torch.Tensor, spec: geo.PoolSpec, count_include_pad: bool = True,
               divisor_override: Optional[int] = None) -> torch.Tensor:
    """Average pooling with PyTorch's summation order (differentiable); other cases native."""
    if _on_triton_device(input, 'avg_pool2d'):
        return triton_backend.avg_pool2d(input, spec, count_include_pad, divisor_override)
    unsupported = _pool_unsupported(spec)
    if unsupported is None and spec.dilation != (1, 1):
        unsupported = 'average pooling has no dilation'
    if not _cpu_kernel_applies('avg_pool2d', input, unsupported):
        return native.avg_pool2d(input, spec, count_include_pad, divisor_override)
    out = _AvgPool.apply(_batched(input), spec, count_include_pad, divisor_override)
    return _unbatched(input, out)


def adaptive_avg_pool2d(input: torch.Tensor, output_size) -> torch.Tensor:
    """PyTorch's op (no fast kernel; counted as a fallback)."""
    record_fallback('adaptive_avg_pool2d', "backend='fast' has no adaptive pooling "
                                           'kernel; running natively')
    return native.adaptive_avg_pool2d(input, output_size)


# ---------------------------------------------------------------------- fused ops
class _BilinearAdd(torch.autograd.Function):
    """``other + bilinear(input)`` by the fused numba kernel (one full-size pass); the
    gradient goes to ``other`` unchanged and to ``input`` through the bilinear
    gather-form backward kernel (as :class:`_Bilinear`)."""

    @staticmethod
    def forward(ctx, input, other, spec):
        out = fused.upsample_add(input, other, spec)  # no grad recorded in here
        (_, row_rev), (_, col_rev) = _bilinear_axes(spec)
        ctx.reverse, ctx.in_shape = (row_rev, col_rev), input.shape
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        gin = None
        if ctx.needs_input_grad[0]:
            g = grad.contiguous()
            gin = _empty(ctx.in_shape, False)
            numba_ops.bilinear_backward(_view(g, False), _view(gin, False), *ctx.reverse,
                                        False)
        return gin, grad if ctx.needs_input_grad[1] else None, None


def upsample_add(input: torch.Tensor, other: torch.Tensor,
                 spec: geo.UpsampleSpec) -> torch.Tensor:
    """The Triton kernel on CUDA/NPU tensors (not differentiable); on the CPU the
    ``'fused'`` backend's paths, differentiable for the bilinear numba kernel
    (:class:`_BilinearAdd`; other inputs that need a gradient take the native
    computation)."""
    if _on_triton_device(input, 'upsample_add'):
        return triton_backend.upsample_add(input, other, spec)
    if spec.mode == 'bilinear' and fused.needs_grad(input, other) and \
            fused.numba_add_applies(spec, input, other):
        return _BilinearAdd.apply(input, other, spec)
    return fused.upsample_add(input, other, spec)


def upsample_argmax(logits: torch.Tensor, spec: geo.UpsampleSpec) -> torch.Tensor:
    """The Triton kernel on CUDA/NPU tensors, the ``'fused'`` backend's paths elsewhere."""
    if _on_triton_device(logits, 'upsample_argmax'):
        return triton_backend.upsample_argmax(logits, spec)
    return fused.upsample_argmax(logits, spec)
