"""Triton kernels run on CPU tensors under Triton's interpreter.

``@triton.jit`` reads ``TRITON_INTERPRET`` when a kernel is defined, i.e. when
``mmseg_cann.kernels.upsample`` is first imported; this conftest is imported before the
test modules of this package, so the variable is set before that import.
"""
import os

os.environ['TRITON_INTERPRET'] = '1'
