"""Loading mmengine checkpoints under torch >= 2.6 (``torch.load(weights_only=True)``).

mmengine 0.10.7 checkpoints carry, besides tensors, the message hub's
``HistoryBuffer`` objects and numpy arrays/scalars (log histories, metric values). With
``weights_only=True`` (torch's default since 2.6) those globals are refused. Instead of
turning ``weights_only`` off, which would let a checkpoint run arbitrary code,
:func:`allow_mmengine_checkpoints` allow-lists exactly these classes. The code paths
that load checkpoints call it (the tools, :class:`~mmseg_cann.engine.CANNOpsHook` when it is
built); importing ``mmseg_cann`` does not, so a process that never loads an mmengine
checkpoint keeps torch's safe globals unchanged.

``HistoryBuffer`` pickles its statistics methods (``min``, ``max``, ``mean``, ...) as
``getattr(HistoryBuffer, 'min')``. Allowing the builtin ``getattr`` would let a file read
any attribute of any allowed class, so the name ``builtins.getattr`` is mapped to
:func:`history_buffer_method`, which returns public methods of ``HistoryBuffer`` and
refuses everything else.
"""
from __future__ import annotations

import importlib
import pickle
from typing import List

import numpy as np
import torch

#: numpy dtypes whose dtype classes appear in mmengine log histories
_NUMPY_DTYPES = ('float64', 'float32', 'float16', 'int64', 'int32', 'int16', 'int8',
                 'uint8', 'bool')


def mmengine_checkpoint_globals() -> List[object]:
    """The classes and functions an mmengine checkpoint pickles besides tensors."""
    from mmengine.logging.history_buffer import HistoryBuffer
    core = importlib.import_module('numpy._core.multiarray' if hasattr(np, '_core')
                                   else 'numpy.core.multiarray')
    allowed: List[object] = [HistoryBuffer, core._reconstruct, core.scalar, np.ndarray,
                             np.dtype]
    allowed += [type(np.dtype(name)) for name in _NUMPY_DTYPES]
    return allowed


def history_buffer_method(owner, name: str):
    """``getattr`` restricted to the public methods of mmengine's ``HistoryBuffer``."""
    from mmengine.logging.history_buffer import HistoryBuffer
    if owner is HistoryBuffer and isinstance(name, str) and not name.startswith('_'):
        method = getattr(HistoryBuffer, name, None)
        if callable(method):
            return method
    raise pickle.UnpicklingError(
        f'checkpoint asks for getattr({owner!r}, {name!r}); only public HistoryBuffer '
        f'methods are allowed when loading with weights_only=True')


def allow_mmengine_checkpoints() -> None:
    """Allow-list :func:`mmengine_checkpoint_globals` for ``torch.load(weights_only=True)``."""
    if hasattr(torch.serialization, 'add_safe_globals'):
        torch.serialization.add_safe_globals(
            mmengine_checkpoint_globals() + [(history_buffer_method, 'builtins.getattr')])
