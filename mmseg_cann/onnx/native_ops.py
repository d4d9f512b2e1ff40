"""PyTorch's own resize and pooling calls held to the CANN ops' export rules.

A model exported by :func:`mmseg_cann.onnx.export_onnx` may still call
``F.interpolate``, ``nn.AdaptiveAvgPool2d``, ``nn.MaxPool2d``... itself (a model that was
not converted, or a module :func:`mmseg_cann.convert_model` leaves alone). With dynamic
shapes, torch's own translations of these calls are not size-generic: torch.onnx
decomposes ``aten._adaptive_avg_pool2d`` with a Python rule that branches on
``in % out`` and builds gather indices of the traced size, and the guards it takes are
recorded nowhere, so the graph is silently wrong at other sizes (measured on a UPerHead
traced at 32x32: max error 1.20 at 64x64, onnxruntime ``GatherND ... invalid index`` at
48x48 and 96x96). Likewise legacy ``nearest`` resizing to a size and ``ceil_mode``
pooling have size-dependent rules that a generic translation does not check.

:func:`native_ops_as_cann` routes these calls, while ``torch.export`` traces, to the
functional ops of :mod:`mmseg_cann.ops` with the same arguments (``precision='input'``:
PyTorch's arithmetic). They then export as the CANN ops do -- size-generic nodes built
from the runtime shape, or a ``ValueError`` naming the rule
(:func:`~mmseg_cann.onnx.translation.check_dynamic_upsample`,
:func:`~mmseg_cann.core.geometry.ceil_mode_may_drop`). Calls the ops do not take as
drop-ins (other ranks, integer dtypes other than the ops' own) stay PyTorch's.
"""
from __future__ import annotations

from typing import Callable, Dict

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from .. import ops

#: PyTorch function -> the mmseg_cann op with the same signature (plus ``precision``)
ROUTED: Dict[Callable, Callable] = {
    F.interpolate: ops.upsample,
    F.adaptive_avg_pool2d: ops.adaptive_avg_pool2d,
    F.max_pool2d: ops.max_pool2d,
    F.avg_pool2d: ops.avg_pool2d,
}


def _takes(func: Callable, args: tuple, kwargs: dict) -> bool:
    """Whether the op is a drop-in for this call: a 4-D floating input (3-D too for
    the pools, as PyTorch's)."""
    x = args[0] if args else kwargs.get('input')
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        return False
    return x.dim() == 4 or (x.dim() == 3 and func is not F.interpolate)


class native_ops_as_cann(TorchFunctionMode):
    """``with native_ops_as_cann(): torch.export.export(...)`` -- each routed PyTorch call
    (:data:`ROUTED`) runs the matching :mod:`mmseg_cann.ops` op instead. Eager results are
    PyTorch's either way (the ops are exact drop-ins); under an export they become the
    export backend's custom ops."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        op = ROUTED.get(func)
        if op is not None and _takes(func, args, kwargs):
            return op(*args, precision='input', **kwargs)
        return func(*args, **kwargs)
