"""How the CANN modules call their ops.

Each module reads its settings at every call and passes them to its op in
:mod:`mmseg_cann.ops`, whose call cache (:func:`mmseg_cann.ops.direct.run_cached`) keys
on those values and their types. So every change that changes the result is seen: an
attribute assigned or edited in place (``m.size[0] = 20``), a setting held in a
``_``-prefixed attribute behind a property, an attribute replaced on the class. The
modules hold no cache: deep copies, pickles, replicas and shared instances carry
nothing but their settings.

Inputs the ops do not cover but the replaced ``torch.nn`` module takes (e.g. 3-D and
5-D input of ``nn.Upsample``) run PyTorch's own function in the op, counted in the
fallback log (:func:`mmseg_cann.utils.fallback_counts`).
"""
from __future__ import annotations

from ..core.precision import normalize_precision, precision_name


class CANNModule:
    """Mixin of the CANN modules: what ``torch.jit.script`` says about them, and the
    ``precision``/``backend`` part of their ``repr``."""

    def _settings_repr(self) -> str:
        """``', precision=..., backend=...'`` for the settings that are not the defaults."""
        parts = []
        if self.precision is not None:
            parts.append(f'precision={precision_name(normalize_precision(self.precision))!r}')
        if self.backend != 'auto':
            parts.append(f'backend={self.backend!r}')
        return ''.join(', ' + p for p in parts)

    #: what ``torch.jit.script`` says to use instead (each path it names is tested:
    #: tests/models/test_tracing.py, tests/models/test_roi_pool_module.py)
    _SCRIPT_ADVICE = ('Use torch.compile (fullgraph=True works), torch.export.export, '
                      'torch.fx.symbolic_trace or torch.jit.trace instead, or script the '
                      'model before mmseg_cann.convert_model replaces its torch.nn modules')

    def __prepare_scriptable__(self):
        raise RuntimeError(
            f'{type(self).__name__} cannot be compiled by torch.jit.script: its forward '
            f'chooses a backend and a compute dtype per call, which TorchScript cannot '
            f'express. {self._SCRIPT_ADVICE}')
