"""Triton kernels run on CPU tensors under Triton's interpreter (or, with
``MMSEG_CANN_KERNEL_DEVICE=cuda|npu`` as ``tools/device_check.py --device`` sets it, on
that device with the real compiler).

``@triton.jit`` reads ``TRITON_INTERPRET`` when a kernel is defined, i.e. when
``mmseg_cann.kernels.upsample`` is first imported; this conftest is imported before the
test modules of this package, so the variable is set before that import.
"""
import os

if os.environ.get('MMSEG_CANN_KERNEL_DEVICE', 'cpu') == 'cpu':
    os.environ['TRITON_INTERPRET'] = '1'
