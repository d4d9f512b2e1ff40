"""The ``'portable'`` backend: every op in plain aten forms that standard exporters
(``torch.onnx.export`` with TorchScript or dynamo, ``torch.export``) translate exactly.

While a standard exporter traces (see
:func:`mmseg_cann.core.export_mode.standard_export_tracing`), ``backend='auto'`` takes
these forms wherever PyTorch's own aten op would not export exactly
(:mod:`mmseg_cann.core.standard_export` has the rule, :mod:`.standard` applies it), so a
CANN module exported without :func:`mmseg_cann.onnx.export_onnx` is never silently
wrong. ``backend='portable'`` takes them for every call, and the ATC export
(:mod:`mmseg_cann.onnx.atc_backend`) builds on them. Measured before this
backend existed: the exporters drop the ``divisor_override`` of the native exclude-pad
SAME average, and ONNX ``Resize`` reads some legacy nearest sizes differently from
PyTorch (2 -> 82). The forms, all with sizes fixed at trace time:

* nearest modes: ``index_select`` with PyTorch's source indices (``Gather``; exact);
* bilinear, bicubic, antialias, area: per-axis interpolation matrices,
  ``A_h @ x @ A_w^T`` in float32 (``MatMul``; within float32 rounding), so no
  ``Resize`` attribute (coordinate mode, cubic coefficient, antialias filter, size-1
  outputs) can be read differently;
* pooling: an explicit pad (lowest value for max, zero for average) to exactly the
  windows PyTorch computes, then a pool without padding or ``ceil_mode``; averages are
  multiplied by a constant ``kH*kW / divisor`` per window (``count_include_pad``,
  exclusive borders, ``divisor_override``);
* adaptive average pooling: a mean for 1x1, bin-averaging matrices otherwise.

Max pooling with ``return_indices`` has no portable form (ONNX indices are not
PyTorch's flat indices) and raises, pointing to ``tools/export_onnx.py``. uint8
bilinear/bicubic (PyTorch's fixed-point arithmetic) is PyTorch's own call, counted as a
fallback; int64 average pooling divides window sums truncating, as PyTorch.
"""
from __future__ import annotations

from typing import List, Tuple

import numpy as np
import torch
import torch.nn.functional as F

from ..core import geometry as geo
from ..core import reference as ref
from ..core.taps import pool_divisors
from ..core.validation import native_only_upsample
from ..utils import record_fallback
from . import native

_EXPORT_TOOL = ('export with mmseg_cann.onnx.export_onnx (tools/export_onnx.py), which '
                'translates the CANN ops itself')


def _axis_matrix(spec: geo.UpsampleSpec, axis: int, dtype: torch.dtype) -> torch.Tensor:
    return ref.interpolation_matrix(spec.in_size[axis], spec.out_size[axis], spec.mode,
                                    spec.align_corners, spec.kernel_scales[axis],
                                    spec.antialias).to(dtype)


def _matmul_resize(x: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """``rows @ x @ cols^T`` over the last two axes, computed in float32 at least."""
    work = torch.promote_types(x.dtype, torch.float32)
    y = torch.matmul(rows.to(work), torch.matmul(x.to(work), cols.to(work).t()))
    return y.to(x.dtype)


def upsample(input: torch.Tensor, spec: geo.UpsampleSpec) -> torch.Tensor:
    if native_only_upsample(input.dtype, spec.mode):
        record_fallback('upsample', "backend='portable': uint8 bilinear/bicubic is "
                                    "PyTorch's fixed-point arithmetic; running natively")
        return native.upsample(input, spec)
    if spec.mode in geo.NEAREST_MODES:
        exact = spec.mode == 'nearest-exact'
        out = input
        for axis in range(2):
            idx = ref.nearest_indices(spec.in_size[axis], spec.out_size[axis],
                                      spec.kernel_scales[axis], exact)
            out = out.index_select(2 + axis, torch.as_tensor(idx, device=input.device))
        return out
    mats = [_axis_matrix(spec, axis, torch.float64) for axis in range(2)]
    return _matmul_resize(input, mats[0].to(input.device), mats[1].to(input.device))


def _windows(spec: geo.PoolSpec) -> Tuple[List[int], List[int]]:
    """Begin and end padding (negative: crop) after which a pool without padding or
    ``ceil_mode`` computes exactly PyTorch's windows."""
    ends = [(spec.out_size[a] - 1) * spec.stride[a]
            + geo.effective_kernel(spec.kernel[a], spec.dilation[a])
            - spec.in_size[a] - spec.pad_begin[a] for a in range(2)]
    return list(spec.pad_begin), ends


def _pad_to_windows(x: torch.Tensor, spec: geo.PoolSpec, value: float) -> torch.Tensor:
    (top, left), (bottom, right) = _windows(spec)
    if bottom < 0:
        x = x[..., :x.shape[-2] + bottom, :]
        bottom = 0
    if right < 0:
        x = x[..., :x.shape[-1] + right]
        right = 0
    if top or left or bottom or right:
        x = F.pad(x, (left, right, top, bottom), value=value)
    return x


def _as_4d(input: torch.Tensor):
    return (input.unsqueeze(0), True) if input.dim() == 3 else (input, False)


def max_pool2d(input: torch.Tensor, spec: geo.PoolSpec, return_indices: bool = False):
    if return_indices:
        raise ValueError('max_pool2d with return_indices=True has no exact form for a '
                         'standard ONNX exporter (ONNX MaxPool indices are not PyTorch '
                         f'flat indices); drop return_indices to export, or {_EXPORT_TOOL}')
    x, squeezed = _as_4d(input)
    lowest = (torch.finfo(x.dtype).min if x.dtype.is_floating_point
              else torch.iinfo(x.dtype).min)
    # -inf where the dtype has it: a padded cell never wins (also against -inf inputs)
    pad_value = -float('inf') if x.dtype.is_floating_point else lowest
    out = F.max_pool2d(_pad_to_windows(x, spec, pad_value), spec.kernel, spec.stride, 0,
                       spec.dilation, False)
    return out.squeeze(0) if squeezed else out


def avg_pool2d(input: torch.Tensor, spec: geo.PoolSpec, count_include_pad: bool = True,
               divisor_override=None) -> torch.Tensor:
    x, squeezed = _as_4d(input)
    if not x.dtype.is_floating_point:  # int64: window sums, truncating division
        sums = F.avg_pool2d(_pad_to_windows(x, spec, 0), spec.kernel, spec.stride, 0, False,
                            True, 1)
        if divisor_override is not None:
            divisor = np.asarray(divisor_override, dtype=np.int64)
        else:
            rows, cols = (np.asarray(t, dtype=np.int64)
                          for t in pool_divisors(spec, count_include_pad))
            divisor = rows[:, None] * cols[None, :]
        out = torch.div(sums, torch.as_tensor(divisor, device=sums.device),
                        rounding_mode='trunc')
        return out.squeeze(0) if squeezed else out
    out = F.avg_pool2d(_pad_to_windows(x, spec, 0.0), spec.kernel, spec.stride, 0, False,
                       True)
    # the correction is computed in NumPy: a constant of the traced graph
    area = spec.kernel[0] * spec.kernel[1]
    if divisor_override is not None:
        correction = np.full(spec.out_size, area / divisor_override)
    else:
        rows, cols = (np.asarray(t, dtype=np.float64)
                      for t in pool_divisors(spec, count_include_pad))
        correction = area / (rows[:, None] * cols[None, :])
    if not (correction == 1).all():
        out = out * torch.as_tensor(correction, dtype=out.dtype, device=out.device)
    return out.squeeze(0) if squeezed else out


def _bin_matrix(n_in: int, n_out: int) -> torch.Tensor:
    return ref.interpolation_matrix(n_in, n_out, 'area')


def adaptive_avg_pool2d(input: torch.Tensor, output_size) -> torch.Tensor:
    x, squeezed = _as_4d(input)
    out_h, out_w = output_size
    if (out_h, out_w) == (1, 1):
        out = x.mean(dim=(-2, -1), keepdim=True)
    else:
        rows = _bin_matrix(x.shape[-2], out_h).to(x.device)
        cols = _bin_matrix(x.shape[-1], out_w).to(x.device)
        out = _matmul_resize(x, rows, cols)
    return out.squeeze(0) if squeezed else out


def upsample_add(input: torch.Tensor, other: torch.Tensor,
                 spec: geo.UpsampleSpec) -> torch.Tensor:
    return other + upsample(input, spec)


def upsample_argmax(logits: torch.Tensor, spec: geo.UpsampleSpec) -> torch.Tensor:
    return upsample(logits, spec).argmax(1)
