"""Registration of the CANN modules in the OpenMMLab registries."""
from __future__ import annotations

from .pooling import CANNAdaptiveAvgPool2d, CANNAvgPool2d, CANNMaxPool2d
from .upsample import CANNUpsample

CANN_MODULES = (CANNUpsample, CANNMaxPool2d, CANNAvgPool2d, CANNAdaptiveAvgPool2d)


def register_modules() -> None:
    """Register every CANN module in mmseg's and mmengine's root ``MODELS`` (idempotent)."""
    from mmengine.registry import MODELS as ROOT_MODELS
    from mmseg.registry import MODELS as MMSEG_MODELS

    for registry in (MMSEG_MODELS, ROOT_MODELS):
        for module in CANN_MODULES:
            if registry.module_dict.get(module.__name__) is not module:
                registry.register_module(module=module, force=True)
