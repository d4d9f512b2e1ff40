"""``nn.Module`` wrappers registered in mmseg's (and mmengine's root) ``MODELS``.

Importing this package registers ``CANNUpsample``, ``CANNMaxPool2d``,
``CANNAvgPool2d`` and ``CANNAdaptiveAvgPool2d``: in mmseg's registry, so configs with
``custom_imports=dict(imports=['mmseg_cann'])`` build them under mmseg's default
scope, and in mmengine's root registry, so mmcv's builders
(``build_upsample_layer``, ``build_*``) find them from any scope. Where mmseg is not
installed the modules work as plain ``torch.nn`` modules and nothing is registered.
"""
from .pooling import CANNAdaptiveAvgPool2d, CANNAvgPool2d, CANNMaxPool2d
from .roi_pool import CANNRoIPool2d
from .registry import register_modules
from .upsample import CANNUpsample

register_modules()

__all__ = ['CANNUpsample', 'CANNMaxPool2d', 'CANNAvgPool2d', 'CANNAdaptiveAvgPool2d',
           'CANNRoIPool2d']
