"""Export backend for ``target='atc'``: every CANN op in a form whose meaning Ascend's ATC
compiler keeps (see :mod:`.atc` for how ATC's ONNX parser reads a graph, with sources).

Chosen per call, from the static geometry of :mod:`mmseg_cann.core.geometry`:

* nearest modes: constant-index ``Gather`` on H and W (PyTorch's float32 index rule,
  including the sizes where ONNX ``Resize`` differs, e.g. 2 -> 82); ATC reads ``Resize``
  nearest with TensorFlow's index rules and ignores ``nearest_mode``;
* bilinear, when PyTorch maps coordinates with ``in / out`` on both axes (a given size,
  or a user scale whose float32 ``1 / scale`` equals ``in / out``): ``Resize`` linear
  with constant ``sizes`` and ``half_pixel``/``align_corners`` (ATC's
  ``ResizeBilinearV2`` reads exactly these);
* bicubic (ATC lists only nearest and linear for images), antialias (ATC drops the
  attribute), scales whose mapping ATC would change (it turns ``scales`` into
  ``sizes``): per-axis interpolation matrices, ``A_h @ x @ A_w^T`` (``MatMul``);
* max pooling: ``MaxPool`` with explicit ``pads`` covering exactly PyTorch's windows,
  ``auto_pad=NOTSET``, ``ceil_mode=0`` (ATC reads SAME_LOWER as SAME and honours
  ``ceil_mode`` only with NOTSET); dilated windows, whose ``dilations`` ATC drops, as
  the elementwise ``Max`` of one strided ``Slice`` per kernel tap of a padded input;
* average pooling: an explicit zero ``Pad``, ``AveragePool`` without padding (every
  window divides by ``kH*kW``; no ``count_include_pad=0`` window can be all padding, and
  aclnnAvgPool2d's padding <= kernel/2 limit never applies), then a constant ``Mul`` by
  ``kH*kW / divisor`` where PyTorch's divisor differs (exclusive borders, ceil windows,
  ``divisor_override``);
* adaptive average pooling: ``GlobalAveragePool``, ``AveragePool`` for bins that divide
  evenly, constant bin-averaging ``MatMul`` otherwise.

Only static shapes: the forms are constants of the traced sizes.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F

from ..backends import portable
from ..core import geometry as geo
from . import ops
# MaxRoiPool passes ATC's reading unchanged (CANN lists it for opsets 8-16; the boxes
# are read as fp16 there: docs/roi_pooling.md)
from .ops import roi_pool2d  # noqa: F401


def _require_static(name: str, *sizes) -> None:
    if geo.any_symbolic(sizes):
        raise ValueError(f"{name}: target='atc' exports fixed shapes (its exact forms are "
                         'constants of the traced sizes); export one graph per input size '
                         '(tools/export_onnx.py --target atc --gears H,W ...) or use '
                         "target='onnx' with dynamic=True")


def _maps_with_in_over_out(spec: geo.UpsampleSpec) -> bool:
    """Whether PyTorch's coordinate step equals ``in / out`` on both axes in float32."""
    for axis in range(2):
        scale = spec.kernel_scales[axis]
        if scale is None:
            continue
        n_in, n_out = spec.in_size[axis], spec.out_size[axis]
        step = geo.coordinate_scale(n_in, n_out, bool(spec.align_corners), scale)
        ratio = geo.coordinate_scale(n_in, n_out, bool(spec.align_corners), None)
        if np.float32(step) != np.float32(ratio):
            return False
    return True


def resize_form(spec: geo.UpsampleSpec) -> str:
    """``'gather'``, ``'resize_linear'`` or ``'matmul'``: the node form of a resize."""
    if spec.mode in geo.NEAREST_MODES:
        return 'gather'
    if spec.mode == 'bilinear' and not spec.antialias and _maps_with_in_over_out(spec):
        return 'resize_linear'
    return 'matmul'


def upsample(input: torch.Tensor, spec: geo.UpsampleSpec) -> torch.Tensor:
    _require_static('upsample', *spec.in_size, *spec.out_size)
    if spec.mode == 'area':
        return adaptive_avg_pool2d(input, spec.out_size)
    form = resize_form(spec)
    if form == 'resize_linear':
        return ops.upsample_sizes_op(input, list(spec.out_size), spec.mode,
                                     bool(spec.align_corners))
    return portable.upsample(input, spec)  # Gather or MatMul


def _crop_end(x: torch.Tensor, ends):
    """Crop rows/columns no window reads (a negative end padding); returns the rest."""
    if ends[0] < 0:
        x = x[..., :x.shape[-2] + ends[0], :]
    if ends[1] < 0:
        x = x[..., :x.shape[-1] + ends[1]]
    return x, [max(e, 0) for e in ends]


def max_pool2d(input: torch.Tensor, spec: geo.PoolSpec, return_indices: bool = False):
    if return_indices:
        raise ValueError('max_pool2d with return_indices=True cannot be exported for ATC '
                         '(an Indices output is an error in its MaxPool parser, and ONNX '
                         'indices are not PyTorch flat indices); drop return_indices')
    _require_static('max_pool2d', *spec.in_size)
    x, squeezed = (input.unsqueeze(0), True) if input.dim() == 3 else (input, False)
    begin, ends = portable._windows(spec)
    if spec.dilation != (1, 1):
        out = _dilated_max(x, spec, begin, ends)
    else:
        x, ends = _crop_end(x, ends)
        out = ops.max_pool_op(x, list(spec.kernel), list(spec.stride), 'explicit',
                              [begin[0], begin[1], ends[0], ends[1]], [1, 1], False)
    return out.squeeze(0) if squeezed else out


def _dilated_max(x: torch.Tensor, spec: geo.PoolSpec, begin, ends) -> torch.Tensor:
    """Max over one strided slice per kernel tap: exact, and no ``dilations`` attribute."""
    x, ends = _crop_end(x, ends)
    # the lowest finite value: never wins against a finite input, and no -inf reaches a
    # kernel that does not take it (NaN inputs still propagate through Max)
    lowest = torch.finfo(x.dtype).min if x.dtype.is_floating_point else \
        torch.iinfo(x.dtype).min
    if any(begin) or any(ends):
        x = F.pad(x, (begin[1], ends[1], begin[0], ends[0]), value=lowest)
    (oh, ow), (sh, sw), (dh, dw) = spec.out_size, spec.stride, spec.dilation
    out: Optional[torch.Tensor] = None
    for i in range(spec.kernel[0]):
        for j in range(spec.kernel[1]):
            tap = x[..., i * dh: i * dh + (oh - 1) * sh + 1: sh,
                    j * dw: j * dw + (ow - 1) * sw + 1: sw]
            out = tap if out is None else torch.maximum(out, tap)
    return out


def avg_pool2d(input: torch.Tensor, spec: geo.PoolSpec, count_include_pad: bool = True,
               divisor_override=None) -> torch.Tensor:
    _require_static('avg_pool2d', *spec.in_size)
    return portable.avg_pool2d(input, spec, count_include_pad, divisor_override)


def adaptive_avg_pool2d(input: torch.Tensor, output_size) -> torch.Tensor:
    _require_static('adaptive_avg_pool2d', *input.shape[-2:], *output_size)
    return ops.adaptive_avg_pool2d(input, output_size)


def upsample_add(input: torch.Tensor, other: torch.Tensor,
                 spec: geo.UpsampleSpec) -> torch.Tensor:
    return other + upsample(input, spec)


def upsample_argmax(logits: torch.Tensor, spec: geo.UpsampleSpec) -> torch.Tensor:
    return upsample(logits, spec).argmax(1)
