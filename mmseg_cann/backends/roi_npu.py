"""Where ROI pooling runs: the plan per call, the exact aten form, the vendor call.

Three call forms:

``'kernels'``
    the numba CPU kernels of :mod:`.roi_cpu` (CPU float32/float64; fp16/bf16 pooled in
    float32 and rounded once, which is what PyTorch's CPU pooling kernels do).
``'aten'``
    :func:`pool_aten`: gathers, ``max``/``where`` and a sum in each bin's row-major order,
    in plain aten ops on the tensor's device (CPU, CUDA, NPU through torch_npu); the same
    values as the kernels (differentiable through autograd).
``'mean'``
    average pooling to 1x1: PyTorch's ``adaptive_avg_pool2d`` is then ``mean`` over H and
    W, whose vectorised summation order depends on the slice's strides; the only exact
    batched equivalent is ``mean`` of each box's slice view, so this form runs one
    ``mean`` per ROI (a loop over ROIs, for this output size only).
``'vendor'``
    on an Ascend NPU, max pooling through mmcv's NPU build (installed by
    :mod:`mmseg_cann.models.roi_pool`, :func:`set_vendor_max_pool`): ``mmcv.ops.roi_pool`` runs
    the CANN operator ``RoiPoolingWithArgMax`` (mmcv
    ``mmcv/ops/csrc/pytorch/npu/roi_pool_npu.cpp``; that file issues it only for channel
    counts that are multiples of 16). torch_npu itself has no max ROI pooling API:
    ``torch_npu.npu_roi_align`` samples bilinearly (RoIAlign) and
    ``torch_npu.npu_ps_roi_pooling`` is position-sensitive pooling, neither of which is
    this op. No vendor kernel averages over integer regions, so ``mode='avg'`` takes the
    aten form on the NPU.

:func:`plan_roi_pool` is a pure function of what it is given (device type, dtype,
channels, whether mmcv's NPU ops are importable), unit-tested on a CPU.
"""
from __future__ import annotations

import importlib.util
import math
from dataclasses import dataclass
from typing import Optional

import torch

from ..core.roi import MAX_START, RoiBins

#: ``backend`` values of ``roi_pool2d`` and ``CANNRoIPool2d``
ROI_BACKENDS = ('auto', 'native', 'fast', 'npu')
#: the aten form gathers at most about this many values at once (ROIs in chunks)
GATHER_LIMIT = 1 << 24
#: dtypes of mmcv's NPU RoIPool path
VENDOR_DTYPES = (torch.float16, torch.float32)


@dataclass(frozen=True)
class RoiPlan:
    """A call form (``'kernels'``, ``'aten'`` or ``'vendor'``) and, when it is not the
    preferred one for the device, why (recorded in the fallback log)."""

    call: str
    fallback: Optional[str] = None


def check_roi_backend(backend) -> str:
    """``backend`` is one of :data:`ROI_BACKENDS`."""
    if not isinstance(backend, str):
        raise TypeError(f'roi_pool2d: backend must be a string, one of {ROI_BACKENDS}, got '
                        f'{backend!r}')
    if backend not in ROI_BACKENDS:
        raise ValueError(f'roi_pool2d: backend must be one of {ROI_BACKENDS}, got {backend!r}')
    return backend


#: the vendor max ROI pooling kernel, ``fn(x, rois, output_size, spatial_scale)``; set by
#: :mod:`mmseg_cann.models.roi_pool` to mmcv's ``roi_pool`` (this layer imports no
#: OpenMMLab package)
_vendor = {'max': None}


def set_vendor_max_pool(fn) -> None:
    """Install (or, with None, remove) the NPU vendor kernel of max ROI pooling."""
    _vendor['max'] = fn


def mmcv_npu_available() -> bool:
    """Whether a vendor kernel is installed and torch_npu and mmcv are importable (no
    import here)."""
    return _vendor['max'] is not None and all(
        importlib.util.find_spec(n) is not None for n in ('mmcv', 'torch_npu'))


def plan_roi_pool(mode: str, backend: str, device_type: str, dtype: torch.dtype,
                  channels: int, return_indices: bool, *, kernels_usable: bool,
                  vendor_available: bool) -> RoiPlan:
    """The call form for one ROI pooling call.

    ``'fast'`` asks for the CPU kernels, ``'native'`` for the aten form; ``'auto'`` and
    ``'npu'`` take the kernels on a CPU, the vendor kernel for max pooling on an NPU
    where it applies, the aten form elsewhere (each fallback with its reason).
    """
    if backend == 'native':
        return RoiPlan('aten')
    if device_type == 'cpu' or backend == 'fast':
        if kernels_usable:
            return RoiPlan('kernels')
        return RoiPlan('aten', f'the numba ROI kernels do not run here ({device_type} '
                               f'{dtype}, or numba missing): aten form')
    if device_type != 'npu':
        return RoiPlan('aten')
    if mode != 'max':
        return RoiPlan('aten', 'no Ascend kernel averages over integer regions '
                               '(npu_roi_align samples bilinearly): aten form')
    reasons = []
    if not vendor_available:
        reasons.append("mmcv's NPU ops are not installed")
    if channels % 16:
        reasons.append(f"{channels} channels (mmcv's RoiPoolingWithArgMax path needs a "
                       'multiple of 16)')
    if dtype not in VENDOR_DTYPES:
        reasons.append(f'{dtype} input')
    if return_indices:
        reasons.append("return_indices (RoiPoolingWithArgMax's argmax is not PyTorch's "
                       'flat index)')
    if reasons:
        return RoiPlan('aten', '; '.join(reasons) + ': aten form')
    return RoiPlan('vendor')


def pool_mean(x: torch.Tensor, bins: RoiBins) -> torch.Tensor:
    """1x1 average pooling as ``mean`` of each clipped box's slice view (empty: 0)."""
    k, c = bins.batch.shape[0], x.shape[1]
    if k == 0:
        return x.reshape(-1)[:0].reshape(0, c, 1, 1)
    zero = x.new_zeros((c, 1, 1))
    rows = zip(*(t.reshape(-1).tolist() for t in (bins.batch, bins.hs, bins.he,
                                                   bins.ws, bins.we)))
    return torch.stack([x[b, :, h0:h1, w0:w1].mean((-2, -1), keepdim=True)
                        if h1 > h0 and w1 > w0 else zero for b, h0, h1, w0, w1 in rows])


def pool_vendor(x: torch.Tensor, rois: torch.Tensor, output_size, spatial_scale: float):
    """Max ROI pooling with the installed vendor kernel (:func:`set_vendor_max_pool`)."""
    return _vendor['max'](x, rois, tuple(output_size), spatial_scale)


def _offsets(start: torch.Tensor, count: torch.Tensor, length: int):
    """``(K, out, length)`` positions ``start + t`` and whether ``t < count``."""
    t = torch.arange(length, device=start.device)
    return start[..., None] + t, t < count[..., None]


def pool_aten(x: torch.Tensor, bins: RoiBins, mode: str, with_index: bool):
    """ROI pooling of ``x`` over ``bins`` in aten ops (the kernels' values, any device).

    Returns values ``(K, C, out_h, out_w)`` or ``(values, int64 index)``. ROIs are
    processed in chunks of at most :data:`GATHER_LIMIT` gathered values.
    """
    n, c, h, w = x.shape
    k, out_h, out_w = bins.batch.shape[0], bins.hs.shape[1], bins.ws.shape[1]
    rows = (bins.he - bins.hs).clamp(min=0)
    cols = (bins.we - bins.ws).clamp(min=0)
    lh = max(1, int(rows.max())) if k else 1   # 1: an all-empty call still gathers
    lw = max(1, int(cols.max())) if k else 1
    per_roi = max(1, c * out_h * out_w * lh * lw)
    step = max(1, GATHER_LIMIT // per_roi)
    planes = x.permute(1, 0, 2, 3).reshape(c, n * h * w)
    values, indices = [], []
    for begin in range(0, k, step):  # chunks of ROIs, not one ROI at a time
        part = slice(begin, begin + step)
        r, r_ok = _offsets(bins.hs[part], rows[part], lh)            # (k, out_h, lh)
        q, q_ok = _offsets(bins.ws[part], cols[part], lw)            # (k, out_w, lw)
        flat = (r.clamp(max=h - 1)[:, :, None, :, None] * w
                + q.clamp(max=w - 1)[:, None, :, None, :])           # (k, oh, ow, lh, lw)
        ok = r_ok[:, :, None, :, None] & q_ok[:, None, :, None, :]
        kk = flat.shape[0]
        flat = flat.reshape(kk, out_h, out_w, lh * lw)
        ok = ok.reshape(kk, out_h, out_w, lh * lw)
        source = bins.batch[part].view(kk, 1, 1, 1) * (h * w) + flat
        v = planes[:, source.reshape(-1)].reshape(c, kk, out_h, out_w, lh * lw)
        empty = (rows[part][:, :, None] == 0) | (cols[part][:, None, :] == 0)   # (k, oh, ow)
        if mode == 'max':
            take = ok & (v > MAX_START)                 # NaN and <= -FLT_MAX never win
            best, pos = torch.where(take, v, -math.inf).max(-1)
            found = take.any(-1)
            fill = torch.where(empty, 0.0, MAX_START).to(x.dtype)
            values.append(torch.where(found, best, fill).permute(1, 0, 2, 3))
            if with_index:
                idx = torch.gather(flat.expand(c, *flat.shape), -1, pos[..., None])[..., 0]
                indices.append(torch.where(found, idx, -1).permute(1, 0, 2, 3))
        else:
            v = torch.where(ok, v, torch.zeros((), dtype=x.dtype, device=x.device))
            acc = torch.zeros(v.shape[:-1], dtype=x.dtype, device=x.device)
            for t in range(lh * lw):                     # each bin in row-major order
                acc = acc + v[..., t]
            kh = rows[part].clamp(min=1).to(x.dtype)[:, :, None]
            kw = cols[part].clamp(min=1).to(x.dtype)[:, None, :]
            mean = acc / kh / kw
            values.append(torch.where(empty, torch.zeros((), dtype=x.dtype, device=x.device),
                                      mean).permute(1, 0, 2, 3))
    if k == 0:
        out = x.reshape(-1)[:0].reshape(0, c, out_h, out_w)  # empty, still in the graph
        return (out, torch.zeros(out.shape, dtype=torch.long, device=x.device)) \
            if with_index else out
    out = torch.cat(values).contiguous()
    return (out, torch.cat(indices).contiguous()) if with_index else out
