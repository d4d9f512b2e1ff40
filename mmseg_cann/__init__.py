"""mmseg-cann: exact upsampling and pooling for MMSegmentation on Ascend NPUs and elsewhere.

Importing the package registers the CANN modules in mmseg's ``MODELS`` registry and
``CANNOpsHook`` in its ``HOOKS``, so ``custom_imports=dict(imports=['mmseg_cann'])`` in a
config makes ``dict(type='CANNUpsample', ...)`` and
``custom_hooks=[dict(type='CANNOpsHook', ...)]`` buildable.
"""
from .version import __version__
from . import ops
from .models import CANNAdaptiveAvgPool2d, CANNAvgPool2d, CANNMaxPool2d, CANNUpsample
from .precision import (PrecisionPolicy, get_precision_policy, precision_policy,
                        set_precision_policy)
from .convert import convert_model, restore_resize, route_resize
from .engine import CANNOpsHook
from .utils.checkpoint import allow_mmengine_checkpoints

allow_mmengine_checkpoints()  # mmengine checkpoints load with torch.load(weights_only=True)

__all__ = ['__version__', 'ops', 'CANNUpsample', 'CANNMaxPool2d', 'CANNAvgPool2d',
           'CANNAdaptiveAvgPool2d', 'PrecisionPolicy', 'get_precision_policy',
           'set_precision_policy', 'precision_policy', 'convert_model', 'route_resize',
           'restore_resize', 'CANNOpsHook']
