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


@contextmanager
def export_mode(backend: ModuleType, opset: int = DEFAULT_OPSET):
    """Route ``backend='auto'`` to ``backend`` while ``torch.export`` traces in this block."""
    previous = (getattr(_state, 'backend', None), getattr(_state, 'opset', DEFAULT_OPSET))
    _state.backend, _state.opset = backend, opset
    try:
        yield
    finally:
        _state.backend, _state.opset = previous


def current_opset() -> int:
    """The opset of the export in progress (the default outside one)."""
    return getattr(_state, 'opset', DEFAULT_OPSET)


def export_backend() -> Optional[ModuleType]:
    """The export backend while an export traces, else None."""
    backend = getattr(_state, 'backend', None)
    if backend is None or not torch.compiler.is_exporting():
        return None
    return backend


def is_exporting() -> bool:
    """Whether an mmseg_cann export is tracing right now."""
    return export_backend() is not None
