"""Guarded detection of ``torch_npu`` and of the Ascend chip generation.

``import torch_npu`` fails on machines without the CANN runtime (and is slow where it
works), so nothing here imports it at package import time: :func:`torch_npu_module`
imports it on first use and remembers a failure.

Device facts come from torch_npu's public Python API:

* ``torch.npu.get_device_name(index)`` returns the SoC name, e.g. ``'Ascend910B2'``
  (used this way by torchair's ``_utils/check_platform.py`` and dlinfer's
  ``vendor/ascend/utils.py``);
* ``torch_npu.npu.get_soc_version()`` returns the numeric ``c10_npu::SocVersion``
  (``torch_npu/csrc/core/npu/NpuVariables.h``): 100-104 Ascend910 (A1), 200-207
  Ascend310P, 220-225 Ascend910B1..B4 (Atlas A2), 240-243 Ascend310B,
  250-255 Ascend910_93xx (Atlas A3); dlinfer tests ``220 <= v <= 225`` for A2 and
  ``250 <= v <= 255`` for A3 the same way.

:class:`DeviceCaps` is what the planner (:mod:`.npu_plan`) sees: a plain frozen value,
so the planner stays a pure function that tests drive with made-up capabilities.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional

import torch

#: ``SocVersion`` ranges -> generation name (NpuVariables.h)
_SOC_RANGES = (
    (100, 104, 'A1'),      # Ascend910 / 910A
    (200, 209, '310P'),
    (220, 229, 'A2'),      # Ascend910B1..B4: Atlas A2 training / 800I A2
    (240, 249, '310B'),
    (250, 259, 'A3'),      # Ascend910_93xx: Atlas A3
)
GENERATIONS = ('none', 'A1', '310P', 'A2', 'A3', '310B', 'npu-unknown')


def classify_soc(soc_version: Optional[int], name: str = '') -> str:
    """Generation of an Ascend chip from its ``SocVersion`` number, else from its name.

    Returns one of ``'A1'``, ``'310P'``, ``'A2'``, ``'A3'``, ``'310B'`` or
    ``'npu-unknown'``. Example: ``classify_soc(223) == 'A2'``,
    ``classify_soc(None, 'Ascend910B3') == 'A2'``.
    """
    if soc_version is not None and soc_version >= 0:
        for low, high, generation in _SOC_RANGES:
            if low <= soc_version <= high:
                return generation
    upper = name.upper()
    if upper.startswith('ASCEND910B'):
        return 'A2'
    if upper.startswith('ASCEND910_93'):
        return 'A3'
    if upper.startswith('ASCEND310P'):
        return '310P'
    if upper.startswith('ASCEND310B'):
        return '310B'
    if upper.startswith('ASCEND910'):
        return 'A1'
    return 'npu-unknown'


@dataclass(frozen=True)
class DeviceCaps:
    """What the planner needs to know about a device.

    Attributes:
        device_type: ``'cpu'``, ``'cuda'``, ``'npu'``, ...
        name: device name (``'Ascend910B2'``, a CUDA device name, ``'cpu'``).
        generation: one of :data:`GENERATIONS` (``'none'`` off Ascend).
        soc_version: torch_npu's ``SocVersion`` number, None when unknown.
    """

    device_type: str
    name: str
    generation: str = 'none'
    soc_version: Optional[int] = None

    @property
    def is_npu(self) -> bool:
        return self.device_type == 'npu'

    @property
    def a2_a3(self) -> bool:
        """910B-class chips (Atlas A2/A3), where the documented aclnn fast paths exist."""
        return self.is_npu and self.generation in ('A2', 'A3')

    @classmethod
    def npu(cls, generation: str = 'A2', name: str = '', soc_version: Optional[int] = None):
        """Capabilities of an Ascend NPU (for tests and for planning ahead on a CPU)."""
        if generation not in GENERATIONS or generation == 'none':
            raise ValueError(f'generation must be one of {GENERATIONS[1:]}, got {generation!r}')
        return cls('npu', name or f'Ascend-{generation}', generation, soc_version)

    def __str__(self) -> str:
        return self.name if not self.is_npu else f'{self.name} ({self.generation})'


@functools.lru_cache(maxsize=None)
def torch_npu_module():
    """``torch_npu`` if it imports (CANN runtime present), else None. Cached."""
    try:
        import torch_npu  # noqa: F401
    except Exception:  # ImportError, or OSError/RuntimeError without the CANN libraries
        return None
    return torch_npu


def npu_available() -> bool:
    """Whether torch_npu imports and reports at least one NPU."""
    module = torch_npu_module()
    if module is None:
        return False
    try:
        return bool(torch.npu.is_available())
    except Exception:
        return False


@functools.lru_cache(maxsize=None)
def _npu_caps(index: int) -> DeviceCaps:
    module = torch_npu_module()
    name, soc = 'npu', None
    try:
        name = str(torch.npu.get_device_name(index))
    except Exception:
        pass
    try:
        soc = int(module.npu.get_soc_version())
    except Exception:
        soc = None
    return DeviceCaps('npu', name, classify_soc(soc, name), soc)


def device_caps(device) -> DeviceCaps:
    """Capabilities of a ``torch.device`` (or device string); cached per NPU index."""
    device = torch.device(device)
    if device.type == 'npu':
        if torch_npu_module() is None:
            return DeviceCaps('npu', 'npu', 'npu-unknown')
        index = device.index if device.index is not None else torch.npu.current_device()
        return _npu_caps(int(index))
    if device.type == 'cuda' and torch.cuda.is_available():
        index = device.index if device.index is not None else torch.cuda.current_device()
        return DeviceCaps('cuda', torch.cuda.get_device_name(index))
    return DeviceCaps(device.type, device.type)
