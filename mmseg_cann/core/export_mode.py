"""The export-mode flag: whether an mmseg_cann export is tracing, and with which backend.

The ONNX layer (:mod:`mmseg_cann.onnx`) enters :func:`export_mode` with its export
backend; while ``torch.export`` traces inside it, ``backend='auto'`` resolves to that
backend (see :func:`mmseg_cann.backends.get_backend`). Nothing below the ONNX layer
imports it: they only read this flag. Eager calls inside the block are untouched.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from types import ModuleType
from typing import Optional

import torch

_state = threading.local()
DEFAULT_OPSET = 18
#: what an export is for: standard ONNX (onnxruntime) or Ascend's ATC compiler
TARGETS = ('onnx', 'atc')


@contextmanager
def export_mode(backend: ModuleType, opset: int = DEFAULT_OPSET, target: str = 'onnx'):
    """Route ``backend='auto'`` to ``backend`` while ``torch.export`` traces in this block."""
    if target not in TARGETS:
        raise ValueError(f'target must be one of {TARGETS}, got {target!r}')
    previous = (getattr(_state, 'backend', None), getattr(_state, 'opset', DEFAULT_OPSET),
                getattr(_state, 'target', 'onnx'))
    _state.backend, _state.opset, _state.target = backend, opset, target
    try:
        yield
    finally:
        _state.backend, _state.opset, _state.target = previous


def current_opset() -> int:
    """The opset of the export in progress (the default outside one)."""
    return getattr(_state, 'opset', DEFAULT_OPSET)


def current_target() -> str:
    """The target of the export in progress (``'onnx'`` outside one)."""
    return getattr(_state, 'target', 'onnx')


def export_backend() -> Optional[ModuleType]:
    """The export backend while an export traces, else None."""
    backend = getattr(_state, 'backend', None)
    if backend is None or not torch.compiler.is_exporting():
        return None
    return backend


def is_exporting() -> bool:
    """Whether an mmseg_cann export is tracing right now."""
    return export_backend() is not None


def standard_export_tracing() -> bool:
    """Whether a standard exporter traces right now (``torch.onnx.export`` with TorchScript
    or dynamo, ``torch.export``) outside :func:`export_mode`: ``backend='auto'`` then takes
    PyTorch's aten op where the exporters translate it exactly
    (:mod:`mmseg_cann.core.standard_export`), the exporter-safe forms of
    :mod:`mmseg_cann.backends.portable` otherwise."""
    if torch.compiler.is_exporting():
        return True
    from torch import onnx as torch_onnx
    return torch_onnx.is_in_onnx_export()
