"""Triton kernel sources, installed as ``mmseg_cann.kernels``.

Kernels live next to their launchers (one file per op). They are written to compile for
NVIDIA GPUs and, through triton-ascend, for Ascend NPUs; on CPU tensors they run under
``TRITON_INTERPRET=1``. Importing this package does not import Triton: use
:func:`triton_available` to find out whether kernels can run here.
"""
from __future__ import annotations

import importlib.util

__all__ = ['triton_available', 'KERNELS']

#: kernels shipped so far (op name -> module under mmseg_cann.kernels)
KERNELS: dict = {'upsample': 'upsample', 'upsample_add': 'upsample',
                 'upsample_argmax': 'upsample', 'upsample_backward': 'upsample',
                 'max_pool2d': 'pooling', 'avg_pool2d': 'pooling'}


def triton_available() -> bool:
    """Whether the ``triton`` package can be imported in this environment."""
    return importlib.util.find_spec('triton') is not None
