"""``CANNRoIPool2d``: ROI pooling as a module (:func:`mmseg_cann.ops.roi_pool2d`)."""
from __future__ import annotations

import torch
from torch import nn

from ..backends.roi_npu import check_roi_backend, set_vendor_max_pool
from ..core import geometry as geo
from ..core import roi as roi_rules
from ..core.precision import normalize_precision
from ..ops.roi_pool import roi_pool2d
from ._direct import CANNModule


def mmcv_roi_pool(x: torch.Tensor, rois: torch.Tensor, output_size, spatial_scale: float):
    """mmcv's ``roi_pool`` (on an Ascend NPU: CANN ``RoiPoolingWithArgMax``)."""
    from mmcv.ops import roi_pool
    return roi_pool(x, rois.to(x.dtype), tuple(output_size), spatial_scale)


# the vendor kernel of max ROI pooling on an NPU (planned by mmseg_cann.backends.roi_npu)
set_vendor_max_pool(mmcv_roi_pool)


class CANNRoIPool2d(CANNModule, nn.Module):
    """Pool each box of a batch of feature maps to ``output_size`` (max or average).

    Args:
        output_size: int or ``(out_h, out_w)``: the bins per box. "A kernel derived from
            the box's size" is this fixed bin count: a box of ``h x w`` cells is split
            into ``out_h x out_w`` bins of about ``h / out_h x w / out_w`` cells.
        spatial_scale: box coordinates -> feature-map cells (1/16 for stride 16).
        mode: ``'max'`` (``torchvision.ops.RoIPool`` bit for bit) or ``'avg'`` (exact
            adaptive average pooling of each box's region).
        return_indices: ``mode='max'`` only: forward also returns the flat indices.
        precision: compute dtype (None defers to the policy's ``max``/``avg`` entry).
        backend: ``'auto'``, ``'npu'``, ``'fast'`` or ``'native'`` (see
            :func:`mmseg_cann.ops.roi_pool2d`).

    Shape:
        ``forward(input, rois)``: ``(N, C, H, W)`` and ``(K, 5)`` ``[batch_index, x1, y1,
        x2, y2]`` (or a list of ``(L_i, 4)`` boxes per image) -> ``(K, C, out_h, out_w)``.

    Config::

        dict(type='CANNRoIPool2d', output_size=7, spatial_scale=1 / 16, mode='avg')
    """

    _SCRIPT_ADVICE = (
        'Use torch.jit.trace, torch.export.export or torch.compile instead: each records '
        'one call of the registered op mmseg_cann::roi_pool2d, which reads the boxes when '
        'the graph runs (for inference: under torch.compile an input that needs a '
        'gradient runs the op eagerly between graphs, so fullgraph=True holds it only '
        'without one), or torch.fx.symbolic_trace (one call_function node)')

    def __init__(self, output_size, spatial_scale: float = 1.0, mode: str = 'max',
                 return_indices: bool = False, *, precision=None,
                 backend: str = 'auto') -> None:
        super().__init__()
        roi_rules.check_output_size(output_size)
        roi_rules.check_spatial_scale(spatial_scale)
        roi_rules.check_mode(mode)
        if geo.truth_flag(return_indices) and mode != 'max':
            raise ValueError("CANNRoIPool2d: return_indices=True needs mode='max'")
        normalize_precision(precision)
        check_roi_backend(backend)
        self.output_size = output_size
        self.spatial_scale = spatial_scale
        self.mode = mode
        self.return_indices = return_indices
        self.precision = precision
        self.backend = backend

    def forward(self, input: torch.Tensor, rois):
        return roi_pool2d(input, rois, self.output_size, self.mode, self.spatial_scale,
                          self.return_indices, precision=self.precision,
                          backend=self.backend)

    def extra_repr(self) -> str:
        parts = [f'output_size={self.output_size}', f'spatial_scale={self.spatial_scale}',
                 f'mode={self.mode!r}']
        if self.return_indices:
            parts.append('return_indices=True')
        return ', '.join(parts) + self._settings_repr()
