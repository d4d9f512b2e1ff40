"""Backends: where an op runs.

A backend is a module with four functions taking already validated specs from
:mod:`mmseg_cann.ops.geometry` (see :mod:`.native` for the signatures). The names:

``'auto'``
    per call: the NPU planner (``'npu'``) for tensors on an Ascend NPU, the native
    PyTorch op on other devices; ``'tuned'`` everywhere when ``MMSEG_CANN_TUNE=1``.
``'native'``
    the same, named explicitly.
``'reference'``
    the float64 reference written from the formulas (slow; for checking).
``'npu'``
    the call planner (:mod:`.npu_plan`) and its executor (:mod:`.npu`): the aten call form
    that reaches the fast CANN kernel, documented fallbacks; native calls off Ascend.
``'tuned'``
    the fastest bit-identical call form per shape, measured once and cached on disk
    (:mod:`.tuned`).
``'triton'``
    the Triton kernels of :mod:`mmseg_cann.kernels` (CUDA, Ascend through triton-ascend,
    CPU under ``TRITON_INTERPRET=1``); see :mod:`.triton`.

Names reserved for backends that are not available yet raise a clear error.
"""
from __future__ import annotations

from types import ModuleType

from . import auto, native, npu, reference, tuned
from . import triton as triton_backend

BACKENDS = {'native': native, 'reference': reference, 'npu': npu, 'tuned': tuned,
            'triton': triton_backend}
#: names accepted in the future; asking for them now is an error that says so
RESERVED_BACKENDS = ('compiled',)
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
    """The backend module for ``name`` (``'auto'`` picks per tensor, see :mod:`.auto`)."""
    check_backend(name)
    if name == 'auto':
        from ..onnx.state import export_backend
        return export_backend() or auto
    return BACKENDS[name]
