"""Triton kernel sources, installed as ``mmseg_cann.kernels``.

Kernels live next to their launchers (one file per op). They are written to compile for
NVIDIA GPUs and, through triton-ascend, for Ascend NPUs; on CPU tensors they run under
``TRITON_INTERPRET=1``. Importing this package does not import Triton; the launchers
are called by :mod:`mmseg_cann.backends.triton`, which decides whether Triton can run.
Kernel files share helpers through :mod:`._common` (launch configuration, the one launch
point) and take every geometry table from their caller. :mod:`.aot` compiles recorded
launches ahead of time for GPU targets this machine lacks (``tools/device_check.py
--aot``), :mod:`.aot_ascend` for an Ascend NPU through triton-ascend's front end
(``tools/ascend_check.py``, in the side virtualenv ``.venv-ascend``). On an NPU the
launchers take row variants of the kernels whose loads are all block accesses
(docs/fused_ops.md, Row kernels on Ascend).
"""
