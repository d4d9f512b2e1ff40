"""mmseg-cann: exact upsampling and pooling for MMSegmentation on Ascend NPUs and elsewhere.

``mmseg_cann.core`` and ``mmseg_cann.ops`` need only torch. Where mmseg is installed,
importing the package registers the CANN modules in mmseg's ``MODELS`` registry and
``CANNOpsHook`` in its ``HOOKS``, so ``custom_imports=dict(imports=['mmseg_cann'])`` in a
config makes ``dict(type='CANNUpsample', ...)`` and
``custom_hooks=[dict(type='CANNOpsHook', ...)]`` buildable; without mmseg that step is
skipped. Importing changes nothing else in the process: the mmengine checkpoint
allow-list is installed by the code that loads checkpoints, or by calling
:func:`allow_mmengine_checkpoints`.
"""
from .version import __version__
from . import core, ops
from .core.errors import (ArgumentError, InputRankError, UnsupportedDtypeError,
                          UnsupportedModeError)
from .core.precision import (PrecisionPolicy, get_precision_policy, precision_policy,
                             set_precision_policy)
from .models import (CANNAdaptiveAvgPool2d, CANNAvgPool2d, CANNMaxPool2d, CANNRoIPool2d,
                     CANNUpsample)
from .models.registry import openmmlab_installed
from .convert import convert_model, restore_resize, route_resize

_OPENMMLAB_NAMES = ('CANNOpsHook', 'allow_mmengine_checkpoints')
if openmmlab_installed():
    from .engine import CANNOpsHook, allow_mmengine_checkpoints


def __getattr__(name):
    if name in _OPENMMLAB_NAMES:
        raise ImportError(f'mmseg_cann.{name} needs mmsegmentation and mmengine, which are '
                          f'not installed (pip install mmsegmentation; see the README)')
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


__all__ = ['__version__', 'core', 'ops', 'ArgumentError', 'InputRankError',
           'UnsupportedDtypeError', 'UnsupportedModeError', 'CANNUpsample', 'CANNMaxPool2d',
           'CANNAvgPool2d', 'CANNAdaptiveAvgPool2d', 'CANNRoIPool2d', 'PrecisionPolicy',
           'get_precision_policy', 'set_precision_policy', 'precision_policy', 'convert_model', 'route_resize',
           'restore_resize', 'CANNOpsHook', 'allow_mmengine_checkpoints']
