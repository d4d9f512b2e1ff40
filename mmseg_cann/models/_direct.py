"""Per-module cache of direct calls (:mod:`mmseg_cann.ops.direct`) by input geometry."""
from __future__ import annotations

from typing import Dict, Optional

from ..ops.direct import direct_state

#: at most this many input geometries per module (a module sees few sizes in practice)
MAX_ENTRIES = 64


class DirectCallCache:
    """Mixin for the CANN modules: ``_direct(input)`` runs the cached direct call for
    ``input``'s shape/dtype/device when the state allows, else returns None. Modules
    define ``_build_direct(input)`` (an :mod:`mmseg_cann.ops.direct` builder).

    The cache is dropped whenever a public attribute of the module changes, and is not
    pickled or deep-copied (it holds closures).
    """

    def _direct(self, input):
        try:
            # the direct calls are torch.nn.functional calls, the same on any CPU/CUDA
            # device: the geometry and dtype decide them
            key = (input.shape, input.dtype)
            state = direct_state(input)
        except AttributeError:  # not a tensor: the op raises its TypeError
            return None
        if state is None:
            return None
        calls: Optional[Dict] = self.__dict__.get('_direct_calls')
        if calls is None:
            calls = self.__dict__['_direct_calls'] = {}
        entry = calls.get(key)
        if entry is None or entry[0] is not state:
            if len(calls) >= MAX_ENTRIES:
                calls.clear()
            try:
                entry = (state, self._build_direct(input))
            except (TypeError, ValueError):  # the op raises it: leave it to the full path
                return None
            calls[key] = entry
        call = entry[1]
        return None if call is None else call(input)

    def __setattr__(self, name, value):
        if not name.startswith('_'):
            self.__dict__.pop('_direct_calls', None)
        super().__setattr__(name, value)

    def __getstate__(self):
        state = super().__getstate__() if hasattr(super(), '__getstate__') else \
            self.__dict__.copy()
        state = dict(state)
        state.pop('_direct_calls', None)
        return state
