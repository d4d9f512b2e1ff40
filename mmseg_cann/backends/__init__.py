"""Backends: where an op runs. One registry, one protocol.

A backend is a module (or any object) implementing the :class:`Backend` protocol: the four
ops, taking specs already validated by :mod:`mmseg_cann.core.geometry` (see :mod:`.native`
for the signatures), and optionally the fused decoder ops ``upsample_add`` and
``upsample_argmax``. :func:`register_backend` adds one; :func:`get_backend` resolves a
name; :func:`backends_implementing` says which backends implement an op. The shipped
backends:

``'auto'``
    per call: ``'tuned'`` when ``MMSEG_CANN_TUNE=1``, the NPU planner for tensors on an
    Ascend NPU, the native PyTorch op otherwise; for the fused ops ``'fused'`` when no
    gradient is needed, ``'native'`` (unfused, differentiable) otherwise. While
    :mod:`mmseg_cann.onnx` traces an export, the export backend it registered in
    :mod:`mmseg_cann.core.export_mode`; while a standard exporter traces, :mod:`.standard`
    (the aten op where the exporters translate it exactly, the ``'portable'`` form
    otherwise; :mod:`mmseg_cann.core.standard_export` has the rule).
``'native'``
    PyTorch's own ops (the fused ops unfused).
``'reference'``
    the float64 reference written from the formulas (slow; for checking).
``'npu'``
    the call planner (:mod:`.npu_plan`) and its executor (:mod:`.npu`): the aten call form
    that reaches the fast CANN kernel, documented fallbacks; native calls off Ascend.
``'tuned'``
    the fastest bit-identical call form per shape, measured once and cached on disk.
``'fused'``
    the fast fused decoder ops of :mod:`.fused` (numba kernels on CPU); the four plain
    ops run natively.
``'portable'``
    exact forms in plain aten ops that standard exporters (``torch.onnx.export``,
    ``torch.export``) translate faithfully, for every call; ``'auto'`` uses them while
    those trace wherever PyTorch's own aten op would not export exactly.
``'triton'``
    the Triton kernels of :mod:`mmseg_cann.kernels` (CUDA, Ascend through triton-ascend,
    CPU under ``TRITON_INTERPRET=1``).
``'fast'``
    the project's own kernels where they exist for the device (:mod:`.fast`: numba on
    CPU for float32 bilinear/nearest upsampling, max and average pooling, differentiable;
    the Triton kernels on CUDA/NPU tensors), PyTorch's op elsewhere; within a documented
    error bound of PyTorch (max pooling values and indices exact).
"""
from __future__ import annotations

from typing import Dict, Protocol, Tuple, runtime_checkable

import torch

from ..core import export_mode
from ..core import geometry as geo
from . import auto, fast, fused, native, npu, portable, reference, standard, tuned
from . import triton as triton_backend

#: the ops every backend implements
OPS = ('upsample', 'max_pool2d', 'avg_pool2d', 'adaptive_avg_pool2d')
#: the fused decoder ops a backend may implement
FUSED_OPS = ('upsample_add', 'upsample_argmax')


@runtime_checkable
class Backend(Protocol):
    """What a backend implements (the fused ops are optional)."""

    def upsample(self, input: torch.Tensor, spec: geo.UpsampleSpec) -> torch.Tensor: ...

    def max_pool2d(self, input: torch.Tensor, spec: geo.PoolSpec,
                   return_indices: bool = False): ...

    def avg_pool2d(self, input: torch.Tensor, spec: geo.PoolSpec,
                   count_include_pad: bool = True, divisor_override=None) -> torch.Tensor: ...

    def adaptive_avg_pool2d(self, input: torch.Tensor, output_size) -> torch.Tensor: ...


_REGISTRY: Dict[str, object] = {}


def register_backend(name: str, backend: object) -> None:
    """Make ``backend`` selectable as ``backend=name`` in every op and module.

    Raises:
        TypeError: ``backend`` lacks one of the four ops (:data:`OPS`).
        ValueError: ``name`` is not a non-empty string, or is taken by another backend.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f'backend name must be a non-empty string, got {name!r}')
    missing = [op for op in OPS if not callable(getattr(backend, op, None))]
    if missing:
        raise TypeError(f'backend {name!r} must implement {OPS}; missing {missing}')
    current = _REGISTRY.get(name)
    if current is not None and current is not backend:
        raise ValueError(f'backend name {name!r} is already registered')
    _REGISTRY[name] = backend


def backend_names() -> Tuple[str, ...]:
    """Every registered backend name, in registration order."""
    return tuple(_REGISTRY)


def implements(backend: object, op: str) -> bool:
    """Whether ``backend`` implements ``op`` (one of :data:`OPS` + :data:`FUSED_OPS`)."""
    return callable(getattr(backend, op, None))


def backends_implementing(op: str) -> Tuple[str, ...]:
    """The registered backend names that implement ``op``."""
    return tuple(name for name, b in _REGISTRY.items() if implements(b, op))


def check_backend(name, op: str = 'upsample') -> str:
    """Validate a backend name for ``op`` without running anything; returns it.

    Raises:
        TypeError: ``name`` is not a string.
        ValueError: no registered backend of that name implements ``op``.
    """
    accepted = backends_implementing(op)
    if not isinstance(name, str):
        raise TypeError(f'backend must be a string, one of {accepted}, got {name!r}')
    if name not in accepted:
        raise ValueError(f'backend must be one of {accepted}, got {name!r}')
    return name


def get_backend(name: str, op: str = 'upsample') -> object:
    """The backend for ``name``, validated for ``op``. While an ONNX export traces,
    ``'auto'`` resolves to the export backend (:mod:`mmseg_cann.core.export_mode`); while
    a standard exporter traces, to :mod:`.standard`."""
    check_backend(name, op)
    if name == 'auto':
        exporting = export_mode.export_backend()
        if exporting is not None:
            return exporting
        if export_mode.standard_export_tracing():
            return standard
    return _REGISTRY[name]


for _name, _backend in (('auto', auto), ('native', native), ('reference', reference),
                        ('npu', npu), ('tuned', tuned), ('fused', fused),
                        ('portable', portable), ('triton', triton_backend), ('fast', fast)):
    register_backend(_name, _backend)
del _name, _backend

__all__ = ['Backend', 'OPS', 'FUSED_OPS', 'register_backend', 'backend_names', 'implements',
           'backends_implementing', 'check_backend', 'get_backend']
