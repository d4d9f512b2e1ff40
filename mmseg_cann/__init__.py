"""mmseg-cann: exact upsampling and pooling for MMSegmentation on Ascend NPUs and elsewhere.

Importing the package registers the CANN modules in mmseg's ``MODELS`` registry, so
``custom_imports=dict(imports=['mmseg_cann'])`` in a config makes
``dict(type='CANNUpsample', ...)`` and friends buildable.
"""
from .version import __version__
from . import ops
from .models import CANNAdaptiveAvgPool2d, CANNAvgPool2d, CANNMaxPool2d, CANNUpsample
from .precision import (PrecisionPolicy, get_precision_policy, precision_policy,
                        set_precision_policy)

__all__ = ['__version__', 'ops', 'CANNUpsample', 'CANNMaxPool2d', 'CANNAvgPool2d',
           'CANNAdaptiveAvgPool2d', 'PrecisionPolicy', 'get_precision_policy',
           'set_precision_policy', 'precision_policy']
