"""Whether an mmseg_cann ONNX export is tracing (routes the ``'auto'`` backend)."""
from __future__ import annotations

import threading
from contextlib import contextmanager
from types import ModuleType
from typing import Optional

_state = threading.local()


@contextmanager
def onnx_export_mode(opset: int = 18):
    """Within this block, ``backend='auto'`` ops traced by ``torch.export`` become the
    ``mmseg_cann::*`` custom ops of :mod:`mmseg_cann.onnx.ops`. Eager calls are untouched."""
    previous = getattr(_state, 'active', False), getattr(_state, 'opset', 18)
    _state.active, _state.opset = True, opset
    try:
        yield
    finally:
        _state.active, _state.opset = previous


def current_opset() -> int:
    """The opset of the export in progress."""
    return getattr(_state, 'opset', 18)


def export_backend() -> Optional[ModuleType]:
    """The export backend while an export traces, else None."""
    if not getattr(_state, 'active', False):
        return None
    import torch
    if not torch.compiler.is_exporting():
        return None
    from . import ops
    return ops
