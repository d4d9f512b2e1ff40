"""Environment rules shared by ``CANNOpsHook`` and ``env_check`` (no package imports)."""
from __future__ import annotations

from typing import Mapping, Optional

#: values people write to mean "off"
FALSE_LOOKING = ('0', 'false', 'no', 'off', 'n', 'f')


def npu_jit_compile_warning(environ: Mapping[str, str]) -> Optional[str]:
    """The warning for an ``NPUJITCompile`` value that mmengine reads the wrong way, or None.

    mmengine 0.10.x (``mmengine/device/utils.py``) decides with
    ``bool(os.getenv('NPUJITCompile', False))``: any non-empty string is true, so
    ``NPUJITCompile=0`` or ``=False`` turns JIT compilation *on*
    (``torch_npu.npu.set_compile_mode(jit_compile=True)``), against torch_npu's advice for
    A2/A3 chips and dynamic shapes (``jit_compile=False``).
    """
    value = environ.get('NPUJITCompile')
    if value is None or value.strip().lower() not in FALSE_LOOKING:
        return None
    return (f'NPUJITCompile={value!r} turns NPU JIT compilation ON: mmengine reads it as '
            f"bool(os.getenv('NPUJITCompile')), true for any non-empty string. Unset it "
            f'(unset NPUJITCompile) to keep jit_compile=False, which torch_npu recommends '
            f'on A2/A3 and for dynamic shapes')
