"""Guarded detection of ``torch_npu`` and of the Ascend chip generation.

``import torch_npu`` fails on machines without the CANN runtime (and is slow where it
works), so no module of mmseg_cann imports it at import time: :func:`torch_npu_module`
imports it on first use and remembers a failure. Note that ``import mmseg_cann`` does load
``mmengine.device`` (through mmengine/mmseg), and mmengine 0.10.7's
``mmengine/device/utils.py`` runs ``import torch_npu`` at its own import and calls
``torch.npu.set_compile_mode(jit_compile=False)`` (unless ``NPUJITCompile`` is set). So on
an Ascend machine torch_npu is usually loaded, with jit compilation disabled, as soon as
mmseg_cann is imported, by mmengine and not by this package. The planner relies on that
setting: op-plugin's generated dispatch (Ascend/op-plugin ``codegen/gen.py``) sends an
aten op to its ``aclnn*`` implementation only when jit compilation is disabled
(``CheckJitDisable()``) and the inputs have a base format (``IsOpInputBaseFormat``);
otherwise the older ``acl_op`` implementations run and none of the rules here apply.

Device facts come from torch_npu's public Python API:

* ``torch_npu.npu.get_soc_version()`` returns the numeric ``c10_npu::SocVersion``
  (Ascend/pytorch ``torch_npu/csrc/core/npu/NpuVariables.h``): 100-104 Ascend910 (A1),
  200-207 Ascend310P, 220-225 Ascend910B1..B4 (Atlas A2), 240-243 Ascend310B,
  250-255 Ascend910_93xx (Atlas A3), 260 Ascend950 (torch_npu ``_inductor/config.py``:
  ``Ascend950 = 260``). It is called first because it initialises the device;
* ``torch_npu.npu.get_device_name(index)`` returns the SoC name, e.g. ``'Ascend910B2'``.
  In newer torch_npu (Ascend/pytorch ``torch_npu/npu/utils.py``:
  ``return torch_npu._C._npu_getDeviceName()``) it ignores its index and does not
  initialise the device, so it may return ``''`` before any NPU work: it is asked after
  ``get_soc_version()`` and ``'npu'`` is used when it answers nothing.

:class:`DeviceCaps` is what the planner (:mod:`.npu_plan`) sees: a plain frozen value,
so the planner stays a pure function that tests drive with made-up capabilities
(chip generation, torch_npu version, ``TORCH_NPU_USE_COMPATIBLE_IMPL``).
"""
from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass
from typing import Optional, Tuple, Union

import torch

#: ``SocVersion`` ranges -> generation name (NpuVariables.h)
_SOC_RANGES = (
    (100, 104, 'A1'),      # Ascend910 / 910A
    (200, 209, '310P'),
    (220, 229, 'A2'),      # Ascend910B1..B4: Atlas A2 training / 800I A2
    (240, 249, '310B'),
    (250, 259, 'A3'),      # Ascend910_93xx: Atlas A3
    (260, 269, '950'),     # Ascend950 (torch_npu _inductor/config.py: Ascend950 = 260)
)
GENERATIONS = ('none', 'A1', '310P', 'A2', 'A3', '310B', '950', 'npu-unknown')
#: environment switch of torch_npu 26.x/master (Ascend docs, environment variable list:
#: "TORCH_NPU_USE_COMPATIBLE_IMPL": API implementations fully aligned with PyTorch)
ENV_COMPATIBLE_IMPL = 'TORCH_NPU_USE_COMPATIBLE_IMPL'
#: the last torch_npu minor release paired with op-plugin 6.0.0-7.3.0 (branches
#: v2.1.0-6.0.0 ... v2.8.0-7.3.0); later releases carry op-plugin 26.x/master
LAST_LEGACY_TORCH_NPU = (2, 8)


def classify_soc(soc_version: Optional[int], name: str = '') -> str:
    """Generation of an Ascend chip from its ``SocVersion`` number, else from its name.

    Returns one of ``'A1'``, ``'310P'``, ``'A2'``, ``'A3'``, ``'310B'``, ``'950'`` or
    ``'npu-unknown'``. Example: ``classify_soc(223) == 'A2'``,
    ``classify_soc(None, 'Ascend910B3') == 'A2'``.
    """
    if soc_version is not None and soc_version >= 0:
        for low, high, generation in _SOC_RANGES:
            if low <= soc_version <= high:
                return generation
    upper = name.upper()
    for prefix, generation in (('ASCEND910B', 'A2'), ('ASCEND910_93', 'A3'),
                               ('ASCEND310P', '310P'), ('ASCEND310B', '310B'),
                               ('ASCEND950', '950'), ('ASCEND910', 'A1')):
        if upper.startswith(prefix):
            return generation
    return 'npu-unknown'


def parse_torch_npu_version(version: Union[str, Tuple[int, int], None]
                            ) -> Optional[Tuple[int, int]]:
    """``(major, minor)`` of a torch_npu version (``'2.8.0.post2'`` -> ``(2, 8)``), or None.

    Raises:
        ValueError: ``version`` is a string without a leading ``major.minor``.
        TypeError: ``version`` is neither None, a string nor a pair of ints.
    """
    if version is None:
        return None
    if isinstance(version, tuple) and len(version) == 2 and all(
            isinstance(v, int) and not isinstance(v, bool) for v in version):
        return version
    if not isinstance(version, str):
        raise TypeError(f'torch_npu version must be a string like "2.8.0" or a (major, minor) '
                        f'pair, got {version!r}')
    match = re.match(r'\s*(\d+)\.(\d+)', version)
    if match is None:
        raise ValueError(f'torch_npu version must start with "major.minor", got {version!r}')
    return int(match.group(1)), int(match.group(2))


@dataclass(frozen=True)
class DeviceCaps:
    """What the planner needs to know about a device.

    Attributes:
        device_type: ``'cpu'``, ``'cuda'``, ``'npu'``, ...
        name: device name (``'Ascend910B2'``, a CUDA device name, ``'cpu'``).
        generation: one of :data:`GENERATIONS` (``'none'`` off Ascend).
        soc_version: torch_npu's ``SocVersion`` number, None when unknown.
        torch_npu_version: ``(major, minor)`` of torch_npu, None when unknown (planned as
            a release paired with op-plugin 6.0.0-7.3.0, i.e. torch_npu <= 2.8).
        compatible_impl: ``TORCH_NPU_USE_COMPATIBLE_IMPL=1`` was set for torch_npu.
    """

    device_type: str
    name: str
    generation: str = 'none'
    soc_version: Optional[int] = None
    torch_npu_version: Optional[Tuple[int, int]] = None
    compatible_impl: bool = False

    @property
    def is_npu(self) -> bool:
        return self.device_type == 'npu'

    @property
    def a2_a3(self) -> bool:
        """910B-class chips (Atlas A2/A3), where the aclnn fast paths exist."""
        return self.is_npu and self.generation in ('A2', 'A3')

    @property
    def op_plugin_26(self) -> bool:
        """torch_npu newer than 2.8: op-plugin 26.x/master behaviour (else 6.0.0-7.3.0)."""
        return self.torch_npu_version is not None and \
            self.torch_npu_version > LAST_LEGACY_TORCH_NPU

    @property
    def max_pool_returns_indices(self) -> bool:
        """Whether ``max_pool2d_with_indices`` runs ``aclnnMaxPool2dWithIndices`` (int32
        indices) instead of ``aclnnMaxPool2dWithMask`` (an int8 mask).

        op-plugin 6.0.0-7.3.0 always use WithMask; 26.x/master use WithIndices with
        ``TORCH_NPU_USE_COMPATIBLE_IMPL=1`` or on Ascend950 (per a reported reading of
        those branches; the stored op-plugin ``MaxPool2dWithIndicesKernelNpuOpApi.cpp``
        shows the Ascend950 half, ``c10_npu::IsAclnnOnly()``).
        """
        return self.is_npu and (self.generation == '950' or
                                (self.op_plugin_26 and self.compatible_impl))

    @classmethod
    def npu(cls, generation: str = 'A2', name: str = '', soc_version: Optional[int] = None,
            torch_npu: Union[str, Tuple[int, int], None] = None,
            compatible_impl: bool = False) -> 'DeviceCaps':
        """Capabilities of an Ascend NPU (for tests and for planning ahead on a CPU).

        Raises:
            ValueError: ``generation`` is not an Ascend generation, or ``torch_npu`` is
                not a version string.
            TypeError: ``compatible_impl`` is not a bool.
        """
        if generation not in GENERATIONS or generation == 'none':
            raise ValueError(f'generation must be one of {GENERATIONS[1:]}, got {generation!r}')
        if not isinstance(compatible_impl, bool):
            raise TypeError(f'compatible_impl must be True or False, got {compatible_impl!r}')
        return cls('npu', name or f'Ascend-{generation}', generation, soc_version,
                   parse_torch_npu_version(torch_npu), compatible_impl)

    def __str__(self) -> str:
        if not self.is_npu:
            return self.name
        extra = [self.generation]
        if self.torch_npu_version is not None:
            extra.append('torch_npu %d.%d' % self.torch_npu_version)
        if self.compatible_impl:
            extra.append(f'{ENV_COMPATIBLE_IMPL}=1')
        return f'{self.name} ({", ".join(extra)})'


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
        return bool(module.npu.is_available())
    except Exception:
        return False


def _identify_npu(module, index: int) -> DeviceCaps:
    """Ask torch_npu about NPU ``index``: SoC version first (it initialises the device),
    then the name (``''`` or an error gives ``'npu'``), the version and the
    compatible-implementation switch."""
    npu = module.npu
    try:
        soc: Optional[int] = int(npu.get_soc_version())
    except Exception:
        soc = None
    try:
        name = str(npu.get_device_name(index) or '')
    except Exception:
        name = ''
    name = name or 'npu'
    try:
        version = parse_torch_npu_version(str(getattr(module, '__version__', '')))
    except ValueError:
        version = None
    compatible = os.environ.get(ENV_COMPATIBLE_IMPL, '').strip() == '1'
    return DeviceCaps('npu', name, classify_soc(soc, name), soc, version, compatible)


@functools.lru_cache(maxsize=None)
def _npu_caps(index: int) -> DeviceCaps:
    return _identify_npu(torch_npu_module(), index)


def device_type_of(device) -> str:
    """``'cpu'``/``'cuda'``/``'npu'``... of a ``torch.device`` or device string, without
    building a ``torch.device`` (``'npu'`` strings need torch_npu for that)."""
    if isinstance(device, torch.device):
        return device.type
    if isinstance(device, str):
        return device.split(':', 1)[0]
    raise TypeError(f'device must be a torch.device or a device string, got {device!r}')


def device_caps(device) -> DeviceCaps:
    """Capabilities of a ``torch.device`` (or device string); cached per NPU index.

    An ``'npu...'`` string is only turned into a ``torch.device`` after torch_npu is
    imported (torch_npu registers the ``npu`` device type).
    """
    kind = device_type_of(device)
    if kind == 'npu':
        module = torch_npu_module()
        if module is None:
            return DeviceCaps('npu', 'npu', 'npu-unknown')
        device = torch.device(device)
        index = device.index if device.index is not None else module.npu.current_device()
        return _npu_caps(int(index))
    device = torch.device(device)
    if device.type == 'cuda' and torch.cuda.is_available():
        index = device.index if device.index is not None else torch.cuda.current_device()
        return DeviceCaps('cuda', torch.cuda.get_device_name(index))
    return DeviceCaps(device.type, device.type)


def synchronize(device) -> None:
    """Wait until the work queued on ``device`` has run (no-op on the CPU).

    The device is passed on: ``torch.cuda.synchronize(device)``, and torch_npu's
    ``torch.npu.synchronize(device)``, which enters ``torch_npu.npu.device(device)``
    before ``_npu_synchronize()`` (Ascend/pytorch ``torch_npu/npu/utils.py``); without
    the argument only the current device would be waited for.
    """
    kind = device_type_of(device)
    if kind == 'cuda':
        torch.cuda.synchronize(device)
    elif kind == 'npu':
        module = torch_npu_module()
        if module is None:
            raise RuntimeError(f'cannot synchronize {device}: torch_npu is not available')
        module.npu.synchronize(device)
