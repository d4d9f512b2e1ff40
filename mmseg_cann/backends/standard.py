"""What ``backend='auto'`` runs while a standard exporter traces (``torch.onnx.export``
with TorchScript or dynamo, ``torch.export``): per call, PyTorch's own aten op where
:mod:`mmseg_cann.core.standard_export` says both ONNX exporters translate it exactly,
the exporter-safe form of :mod:`.portable` otherwise.

So a converted model exports to the graph its unconverted self exports to wherever that
graph is exact (a 2x bilinear stays ``upsample_bilinear2d``, a ``MaxPool2d(3, 2, 1)``
stays ``max_pool2d``), and graph passes such as torchao's PT2E quantizers see the same
ops; only the cases the exporters would get wrong (non-integral or non-power-of-two
bilinear factors, ``divisor_override``, ``ceil_mode`` windows, adaptive bins that do not
divide the input, ...) take the portable forms. Not a registered backend: ``'portable'``
keeps the portable forms for every call (the ATC export builds on them).
"""
from __future__ import annotations

import torch

from ..core import geometry as geo
from ..core import standard_export as rule
from . import native, portable


def upsample(input: torch.Tensor, spec: geo.UpsampleSpec) -> torch.Tensor:
    if rule.upsample_exports_exactly(input, spec):
        if spec.mode == 'area':
            # the resolved size: F.interpolate would compute it from the traced shape,
            # which the TorchScript exporter cannot take for adaptive pooling
            return native.adaptive_avg_pool2d(input, spec.out_size)
        return native.upsample(input, spec)
    return portable.upsample(input, spec)


def max_pool2d(input: torch.Tensor, spec: geo.PoolSpec, return_indices: bool = False):
    if rule.max_pool_exports_exactly(input, spec, return_indices):
        return native.max_pool2d(input, spec)
    return portable.max_pool2d(input, spec, return_indices)


def avg_pool2d(input: torch.Tensor, spec: geo.PoolSpec, count_include_pad: bool = True,
               divisor_override=None) -> torch.Tensor:
    if rule.avg_pool_exports_exactly(input, spec, divisor_override):
        return native.avg_pool2d(input, spec, count_include_pad)
    return portable.avg_pool2d(input, spec, count_include_pad, divisor_override)


def adaptive_avg_pool2d(input: torch.Tensor, output_size) -> torch.Tensor:
    if rule.adaptive_avg_pool_exports_exactly(input, output_size):
        return native.adaptive_avg_pool2d(input, output_size)
    return portable.adaptive_avg_pool2d(input, output_size)


def upsample_add(input: torch.Tensor, other: torch.Tensor,
                 spec: geo.UpsampleSpec) -> torch.Tensor:
    return other + upsample(input, spec)


def upsample_argmax(logits: torch.Tensor, spec: geo.UpsampleSpec) -> torch.Tensor:
    return upsample(logits, spec).argmax(1)
