"""Region-of-interest (ROI) pooling: argument checks, the box-to-region rule and the bins.

One rule maps a box to an integer region of the feature map (``torchvision.ops.roi_pool``'s
and Caffe's): with ``T`` = float64 when the boxes are float64, else float32,

* ``x1' = round(T(x1) * T(spatial_scale))`` (likewise ``y1, x2, y2``), ``round`` halves
  away from zero (C's ``round``, not ``torch.round``);
* the region is rows ``y1' .. y2'`` and columns ``x1' .. x2'``, both ends inclusive:
  ``roi_h = max(y2' - y1' + 1, 1)`` (a reversed or empty box is one row/column at
  ``y1'``/``x1'``);
* the batch index (column 0) must be an integer in ``[0, N)``.

mmcv's ``RoIPool`` kernels keep float box edges instead (``x1 * scale`` unrounded, bins
``[floor(x1 + i * bin), ceil(x1 + (i + 1) * bin))``); rounding once gives integer
regions, so a box is a slice of the map and average pooling over it is exact.

The region is split into ``output_size`` bins per axis, then each bin is clipped to the
map (a bin outside it is empty: value 0, index -1):

``'max'`` (torchvision's bins)
    ``bin = T(roi_h) / T(out_h)``; bin ``i`` covers ``[floor(T(i) * bin),
    ceil(T(i + 1) * bin))`` rows from ``y1'``.
``'avg'`` (adaptive pooling's bins)
    bin ``i`` covers ``[floor(i * roi_h / out_h), ceil((i + 1) * roi_h / out_h))``
    in integer arithmetic (:func:`.geometry.adaptive_bin`).

The two agree except where rounding of the float product crosses an integer (about 3%
of (roi size, output size) pairs up to 4096 x 32, e.g. ``roi_h = 3, out_h = 21`` in
float32, ``roi_h = 7, out_h = 25`` in float64): torchvision's last bin then reaches one
row past the box (or a bin starts one row early). :func:`bin_rule_disagreements` lists
them. Max pooling follows torchvision (bit for bit, also MaxRoiPool in ONNX), average
pooling equals ``F.adaptive_avg_pool2d`` of the box's slice.
"""
from __future__ import annotations

import math
from typing import List, NamedTuple, Sequence, Tuple

import torch

from . import geometry as geo
from .errors import ArgumentError, InputRankError
from .validation import FLOATING_DTYPES, check_dtype, check_tensor

MODES = ('max', 'avg')
#: scaled coordinates must stay below this magnitude (C ``int`` arithmetic of the kernels)
COORD_LIMIT = 2 ** 30
#: the running maximum's start in torchvision's kernel (``-FLT_MAX``, also for float64):
#: a value must exceed it to be pooled, so NaN and values <= -FLT_MAX never win
MAX_START = -torch.finfo(torch.float32).max


class RoiBins(NamedTuple):
    """Per-ROI bins, clipped to the map: rows ``[hs[k, i], he[k, i])`` and columns
    ``[ws[k, j], we[k, j])`` of image ``batch[k]``; int64 tensors ``(K,)``, ``(K, out_h)``
    and ``(K, out_w)``. A bin with ``he <= hs`` or ``we <= ws`` is empty."""

    batch: torch.Tensor
    hs: torch.Tensor
    he: torch.Tensor
    ws: torch.Tensor
    we: torch.Tensor


def check_mode(mode) -> str:
    """``mode`` is ``'max'`` or ``'avg'``."""
    if not isinstance(mode, str) or mode not in MODES:
        raise ValueError(f"roi_pool2d: mode must be 'max' or 'avg', got {mode!r}")
    return mode


def check_output_size(output_size) -> Tuple[int, int]:
    """``output_size`` as a pair of positive ints (an int means a square)."""
    out = geo.int_pair(output_size, 'output_size')
    if min(out) < 1:
        raise ValueError(f'roi_pool2d: output_size must be positive, got {output_size!r}')
    return out


def check_spatial_scale(spatial_scale) -> float:
    """``spatial_scale`` is a positive finite real number (not a bool)."""
    if isinstance(spatial_scale, bool) or not isinstance(spatial_scale, (int, float)):
        if not (isinstance(spatial_scale, torch.Tensor) and spatial_scale.numel() == 1
                and not spatial_scale.dtype.is_complex):
            raise TypeError(f'roi_pool2d: spatial_scale must be a float, got '
                            f'{spatial_scale!r} ({type(spatial_scale).__name__})')
    value = float(spatial_scale)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f'roi_pool2d: spatial_scale must be positive and finite, got {value}')
    return value


def boxes_to_rois(rois, input: torch.Tensor) -> torch.Tensor:
    """``rois`` as a ``(K, 5)`` tensor: a tensor is returned as given; a list/tuple of
    ``(L_i, 4)`` box tensors (torchvision's form, one per image) gets batch index ``i``."""
    if isinstance(rois, torch.Tensor):
        return rois
    if not isinstance(rois, (list, tuple)) or not all(isinstance(b, torch.Tensor)
                                                      for b in rois):
        raise TypeError(f'roi_pool2d: rois must be a (K, 5) tensor or a list of (L, 4) '
                        f'tensors, got {type(rois).__name__}')
    parts: List[torch.Tensor] = []
    for i, boxes in enumerate(rois):
        if boxes.dim() != 2 or boxes.shape[1] != 4:
            raise ValueError(f'roi_pool2d: rois[{i}] must be an (L, 4) tensor of boxes, got '
                             f'shape {tuple(boxes.shape)}')
        parts.append(torch.cat([torch.full_like(boxes[:, :1], i), boxes], dim=1))
    if not parts:
        return torch.zeros((0, 5), dtype=torch.float32, device=input.device)
    return torch.cat(parts, dim=0)


def check_roi_input(input) -> None:
    """``input`` is an ``(N, C, H, W)`` floating tensor with non-empty C, H, W."""
    check_tensor(input, 'roi_pool2d')
    if input.dim() != 4:
        raise InputRankError(f'roi_pool2d: input must be (N, C, H, W), got a '
                             f'{input.dim()}-D tensor of shape {tuple(input.shape)}')
    check_dtype(input, 'roi_pool2d', FLOATING_DTYPES, hint='; cast integer inputs to a '
                                                          'floating dtype first')
    if 0 in input.shape[1:]:
        raise ArgumentError(f'roi_pool2d: C, H and W must be non-empty, got shape '
                            f'{tuple(input.shape)}')


def check_rois(rois: torch.Tensor, input: torch.Tensor) -> None:
    """``rois`` is a ``(K, 5)`` real tensor on ``input``'s device with finite coordinates
    and integer batch indices in ``[0, N)`` (one device sync)."""
    if not isinstance(rois, torch.Tensor):
        raise TypeError(f'roi_pool2d: rois must be a tensor, got {type(rois).__name__}')
    if rois.dim() != 2 or rois.shape[1] != 5:
        raise ValueError(f'roi_pool2d: rois must have shape (K, 5) [batch_index, x1, y1, '
                         f'x2, y2], got {tuple(rois.shape)}')
    if rois.dtype == torch.bool or rois.dtype.is_complex:
        raise TypeError(f'roi_pool2d: rois must be a real floating or integer tensor, got '
                        f'{rois.dtype}')
    if rois.device != input.device:
        raise ValueError(f'roi_pool2d: rois must be on the input device {input.device}, got '
                         f'{rois.device}')
    if rois.shape[0] == 0:
        return
    r = rois.detach()
    if r.dtype.is_floating_point and not bool(torch.isfinite(r).all()):
        raise ValueError('roi_pool2d: rois must be finite (found NaN or inf)')
    batch = r[:, 0]
    n = input.shape[0]
    if r.dtype.is_floating_point and not bool((batch == batch.trunc()).all()):
        raise ValueError('roi_pool2d: rois[:, 0] (batch indices) must be whole numbers')
    low, high = (int(v) for v in torch.aminmax(batch.double()))
    if low < 0 or high >= n:
        raise ValueError(f'roi_pool2d: rois[:, 0] (batch indices) must lie in [0, {n}) for '
                         f'an input of batch size {n}, got values in [{low}, {high}]')


def coord_dtype(rois: torch.Tensor) -> torch.dtype:
    """The dtype of the coordinate and bin arithmetic: float64 for float64 boxes, else
    float32 (torchvision computes in the input dtype, which must equal the boxes')."""
    return torch.float64 if rois.dtype == torch.float64 else torch.float32


def round_half_away(x: torch.Tensor) -> torch.Tensor:
    """C's ``round``: to the nearest integer, halves away from zero (exact: the
    fractional part ``x - trunc(x)`` of a float is exact)."""
    t = torch.trunc(x)
    return t + torch.where((x - t).abs() >= 0.5, torch.sign(x), torch.zeros_like(x))


def roi_regions(rois: torch.Tensor, spatial_scale: float
                ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The integer region of each box: ``(batch, y1, x1, roi_h, roi_w)`` int64 ``(K,)``
    tensors (the module docstring's rule). Raises ValueError for scaled coordinates at or
    beyond :data:`COORD_LIMIT` in magnitude."""
    dtype = coord_dtype(rois)
    coords = rois[:, 1:].detach().to(dtype) * torch.tensor(spatial_scale, dtype=dtype,
                                                            device=rois.device)
    if coords.numel() and float(coords.abs().max()) >= COORD_LIMIT:
        raise ValueError(f'roi_pool2d: rois * spatial_scale must stay below {COORD_LIMIT} in '
                         f'magnitude, got {float(coords.abs().max())}')
    x1, y1, x2, y2 = round_half_away(coords).long().unbind(1)
    roi_w = torch.clamp(x2 - x1 + 1, min=1)
    roi_h = torch.clamp(y2 - y1 + 1, min=1)
    return rois[:, 0].detach().long(), y1, x1, roi_h, roi_w


def _axis_bins(start: torch.Tensor, size: torch.Tensor, out: int, limit: int, mode: str,
               dtype: torch.dtype) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(begin, end)`` ``(K, out)`` of one axis, offset by ``start`` and clipped to
    ``[0, limit]``."""
    i = torch.arange(out, device=size.device)
    if mode == 'max':
        step = size.to(dtype)[:, None] / torch.tensor(float(out), dtype=dtype,
                                                      device=size.device)
        begin = torch.floor(i.to(dtype)[None, :] * step).long()
        end = torch.ceil((i + 1).to(dtype)[None, :] * step).long()
    else:
        begin = torch.div(i[None, :] * size[:, None], out, rounding_mode='floor')
        end = -torch.div(-(i + 1)[None, :] * size[:, None], out, rounding_mode='floor')
    return ((begin + start[:, None]).clamp(0, limit), (end + start[:, None]).clamp(0, limit))


def roi_bins(rois: torch.Tensor, spatial_scale: float, output_size: Sequence[int],
             map_size: Sequence[int], mode: str) -> RoiBins:
    """The clipped bins of every box for ``mode`` on a map of ``map_size`` (H, W)."""
    batch, y1, x1, roi_h, roi_w = roi_regions(rois, spatial_scale)
    dtype = coord_dtype(rois)
    hs, he = _axis_bins(y1, roi_h, output_size[0], int(map_size[0]), mode, dtype)
    ws, we = _axis_bins(x1, roi_w, output_size[1], int(map_size[1]), mode, dtype)
    return RoiBins(batch, hs, he, ws, we)


def bin_rule_disagreements(max_size: int, max_out: int, dtype: torch.dtype = torch.float32
                           ) -> List[Tuple[int, int]]:
    """The ``(roi_size, out)`` pairs (``1 <= roi_size <= max_size``,
    ``1 <= out <= max_out``) where torchvision's float bins differ from adaptive pooling's
    integer bins, computed in ``dtype`` (float32 or float64)."""
    size = torch.arange(1, max_size + 1)
    pairs = []
    zero = torch.zeros_like(size)
    for out in range(1, max_out + 1):
        a = _axis_bins(zero, size, out, 1 << 40, 'max', dtype)
        b = _axis_bins(zero, size, out, 1 << 40, 'avg', dtype)
        differ = ((a[0] != b[0]) | (a[1] != b[1])).any(1)
        pairs += [(int(s), out) for s in size[differ]]
    return sorted(pairs)
