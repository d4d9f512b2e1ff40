"""Backends: where an op runs.

A backend is a module with four functions taking already validated specs from
:mod:`mmseg_cann.ops.geometry` (see :mod:`.native` for the signatures). The names:

``'auto'``
    the native PyTorch op for the tensor's device (on an Ascend NPU the aten ops that
    torch_npu routes to the CANN ``aclnn*`` kernels).
``'native'``
    the same, named explicitly.
``'reference'``
    the float64 reference written from the formulas (slow; for checking).

Names reserved for backends that are not available yet raise a clear error.
"""
from __future__ import annotations

from types import ModuleType

from . import native, reference

BACKENDS = {'native': native, 'reference': reference}
#: names accepted in the future; asking for them now is an error that says so
RESERVED_BACKENDS = ('triton', 'tuned', 'npu', 'compiled')
BACKEND_NAMES = ('auto',) + tuple(BACKENDS)


def check_backend(name) -> str:
    """Validate a backend name without running anything; returns it."""
    if not isinstance(name, str):
        raise TypeError(f'backend must be a string, one of {BACKEND_NAMES}, got {name!r}')
    if name in RESERVED_BACKENDS:
        raise ValueError(f'backend {name!r} is reserved for a later release and is not '
                         f'available yet; use one of {BACKEND_NAMES}')
    if name not in BACKEND_NAMES:
        raise ValueError(f'backend must be one of {BACKEND_NAMES}, got {name!r}')
    return name


def get_backend(name: str) -> ModuleType:
    """The backend module for ``name`` (``'auto'`` resolves to the native backend)."""
    check_backend(name)
    if name == 'auto':
        from ..onnx.state import export_backend
        return export_backend() or native
    return BACKENDS[name]
