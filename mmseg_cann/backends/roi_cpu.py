"""ROI pooling on the CPU: the numba kernels of :mod:`.roi_numba` behind an autograd
function, batched over all ROIs in one call (no Python loop per ROI).

:func:`usable` says whether the kernels can run for a tensor (numba installed, a CPU
float32/float64 tensor, not a process forked after numba's OpenMP pool started); the
op falls back to the aten form of :mod:`.roi_npu` otherwise.
"""
from __future__ import annotations

from functools import lru_cache

import torch
from torch.autograd.function import once_differentiable

from ..core.roi import MAX_START, RoiBins
from . import numba_cpu

KERNEL_DTYPES = (torch.float32, torch.float64)


def usable(x: torch.Tensor) -> bool:
    """Whether the numba kernels can pool ``x``."""
    return (x.device.type == 'cpu' and x.dtype in KERNEL_DTYPES and numba_cpu.available()
            and not numba_cpu.forked_after_use())


@lru_cache(maxsize=1)
def _kernels():
    import numba

    from . import roi_numba
    return numba, roi_numba


def _arrays(bins: RoiBins):
    return tuple(t.contiguous().numpy() for t in bins)


def _sizes(bins: RoiBins, dtype: torch.dtype):
    """The clipped bin sizes (rows, columns) in ``dtype``: the divisors of average pooling."""
    return ((bins.he - bins.hs).to(dtype).contiguous().numpy(),
            (bins.we - bins.ws).to(dtype).contiguous().numpy())


def _nhwc(kernels, x: torch.Tensor):
    """``x`` as a C-contiguous NHWC array (no copy for a channels_last tensor)."""
    view = x.permute(0, 2, 3, 1)
    if view.is_contiguous():
        return view.numpy()
    out = torch.empty(view.shape, dtype=x.dtype)
    kernels.to_nhwc(x.contiguous().numpy(), out.numpy())
    return out.numpy()


def forward(x: torch.Tensor, bins: RoiBins, mode: str, with_index: bool):
    """``(values, int32 index or None)`` of ``(K, C, out_h, out_w)``."""
    numba, kernels = _kernels()
    numba_cpu.use_threads(numba)
    k, c = bins.batch.shape[0], x.shape[1]
    shape = (k, c, bins.hs.shape[1], bins.ws.shape[1])
    out = torch.empty(shape, dtype=x.dtype)
    if k == 0:
        return out, (torch.empty(shape, dtype=torch.int32) if with_index else None)
    nhwc = _nhwc(kernels, x.detach())
    if mode == 'max':
        index = torch.empty(shape if with_index else (1, 1, 1, 1), dtype=torch.int32)
        kernels.max_forward(nhwc, *_arrays(bins), MAX_START, out.numpy(), index.numpy(),
                            with_index)
        result = out, (index if with_index else None)
    else:
        kernels.avg_forward(nhwc, *_arrays(bins), *_sizes(bins, x.dtype), out.numpy())
        result = out, None
    numba_cpu.note_pool(numba)
    return result


def backward(grad_out: torch.Tensor, bins: RoiBins, mode: str, index, in_shape
             ) -> torch.Tensor:
    """The input gradient ``(N, C, H, W)`` of :func:`forward`."""
    numba, kernels = _kernels()
    numba_cpu.use_threads(numba)
    grad_in = torch.zeros(in_shape, dtype=grad_out.dtype)
    if bins.batch.shape[0] == 0:
        return grad_in
    g = grad_out.contiguous().numpy()
    if mode == 'max':
        kernels.max_backward(g, bins.batch.contiguous().numpy(), index.numpy(),
                             grad_in.numpy())
    else:
        kernels.avg_backward(g, *_arrays(bins), *_sizes(bins, grad_out.dtype),
                             grad_in.numpy())
    numba_cpu.note_pool(numba)
    return grad_in


class RoiPoolFunction(torch.autograd.Function):
    """Differentiable ROI pooling with the numba kernels (first derivatives; a second
    derivative raises)."""

    @staticmethod
    def forward(ctx, x, bins_hs, bins_he, bins_ws, bins_we, batch, mode, with_index):
        bins = RoiBins(batch, bins_hs, bins_he, bins_ws, bins_we)
        need_index = with_index or (mode == 'max' and ctx.needs_input_grad[0])
        out, index = forward(x, bins, mode, need_index)
        ctx.mode, ctx.in_shape = mode, tuple(x.shape)
        ctx.save_for_backward(batch, bins_hs, bins_he, bins_ws, bins_we,
                              index if index is not None else torch.empty(0))
        if with_index:
            index = index.long()
            ctx.mark_non_differentiable(index)
            return out, index
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out, *unused):
        batch, hs, he, ws, we, index = ctx.saved_tensors
        grad = backward(grad_out, RoiBins(batch, hs, he, ws, we), ctx.mode, index,
                        ctx.in_shape)
        return grad, None, None, None, None, None, None, None


def roi_pool(x: torch.Tensor, bins: RoiBins, mode: str, with_index: bool):
    """Pool ``x`` (CPU float32/float64, :func:`usable`) over ``bins``; returns values or
    ``(values, int64 index)``."""
    return RoiPoolFunction.apply(x, bins.hs, bins.he, bins.ws, bins.we, bins.batch, mode,
                                 with_index)
