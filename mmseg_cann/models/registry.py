"""Registration of the CANN modules in the OpenMMLab registries."""
from __future__ import annotations

import importlib.util

from .pooling import CANNAdaptiveAvgPool2d, CANNAvgPool2d, CANNMaxPool2d
from .roi_pool import CANNRoIPool2d
from .upsample import CANNUpsample

CANN_MODULES = (CANNUpsample, CANNMaxPool2d, CANNAvgPool2d, CANNAdaptiveAvgPool2d)
#: registered modules that replace no ``torch.nn`` module (their forward takes boxes too)
EXTRA_MODULES = (CANNRoIPool2d,)


def openmmlab_installed() -> bool:
    """Whether mmseg and mmengine are installed (registration needs both)."""
    return all(importlib.util.find_spec(name) is not None for name in ('mmseg', 'mmengine'))


def register_once(registry, cls) -> None:
    """Register ``cls`` under its name unless it is registered already (idempotent).

    Never overrides another class registered under the same name: that raises
    mmengine's ``KeyError`` naming the clash instead of replacing a module silently.
    """
    if registry.module_dict.get(cls.__name__) is not cls:
        registry.register_module(module=cls)


def register_modules() -> bool:
    """Register every CANN module in mmseg's and mmengine's root ``MODELS``.

    Returns False (registering nothing) where mmseg is not installed; an installed
    mmseg that fails to import raises as usual.
    """
    if not openmmlab_installed():
        return False
    from mmengine.registry import MODELS as ROOT_MODELS
    from mmseg.registry import MODELS as MMSEG_MODELS

    for registry in (MMSEG_MODELS, ROOT_MODELS):
        for module in CANN_MODULES + EXTRA_MODULES:
            register_once(registry, module)
    return True
