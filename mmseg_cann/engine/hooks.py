"""``CANNOpsHook``: convert the runner's model and apply the precision policy.

Usage in a config::

    custom_imports = dict(imports=['mmseg_cann'], allow_failed_imports=False)
    custom_hooks = [dict(type='CANNOpsHook', pool_precision=dict(max='fp16', avg='fp32'))]
"""
from __future__ import annotations

import os
from typing import Mapping, Optional

from mmengine.hooks import Hook

from ..backends import OPS, check_backend
from ..convert import convert_model, unwrap_model
from ..fusion import check_options as check_fusion_options
from ..core.precision import PrecisionLike, set_precision_policy
from ..models.registry import register_once
from ..utils.environment import npu_jit_compile_warning
from .checkpoint import allow_mmengine_checkpoints


class CANNOpsHook(Hook):
    """Converts the runner's model to CANN ops before training, validation and testing.

    Args:
        pool_precision: ``dict(max=..., avg=...)``, installed as the process-wide
            precision policy for the run (None keeps the current policy).
        upsample_precision: the policy's ``upsample`` entry (None keeps it).
        upsample, pooling, resize: what :func:`mmseg_cann.convert_model` converts.
        fuse_upsample_add, lean_predict, fuse_resize_conv: its opt-in fusions
            (:mod:`mmseg_cann.fusion`; each applies to training and to inference).
        backend: the backend of the CANN modules (``'auto'``, ``'fast'``, ...); None
            (the default) builds new modules with ``'auto'`` and leaves the backend of
            CANN modules built by the config as it is.

    Building the hook allow-lists mmengine's checkpoint contents for
    ``torch.load(weights_only=True)`` (:func:`allow_mmengine_checkpoints`), so the runner
    it belongs to can resume and load checkpoints. The conversion runs once (the first of
    ``before_run``/``before_train``/``before_val``/``before_test`` that sees an unconverted
    model) and its report is logged once.
    """

    priority = 'VERY_HIGH'

    def __init__(self, pool_precision: Optional[Mapping[str, PrecisionLike]] = None,
                 upsample_precision: PrecisionLike = None, upsample: bool = True,
                 pooling: bool = True, resize: bool = True, fuse_upsample_add: bool = False,
                 lean_predict: bool = False, backend: Optional[str] = None,
                 fuse_resize_conv: bool = False) -> None:
        from ..core.precision import PrecisionPolicy
        # validate now, so a bad config fails when the hook is built
        PrecisionPolicy().updated(pool_precision, upsample_precision)
        if backend is not None:
            for op in OPS:
                check_backend(backend, op)
        check_fusion_options(fuse_upsample_add=fuse_upsample_add, lean_predict=lean_predict,
                             fuse_resize_conv=fuse_resize_conv)
        self.pool_precision = dict(pool_precision) if pool_precision is not None else None
        self.upsample_precision = upsample_precision
        self.upsample = upsample
        self.pooling = pooling
        self.resize = resize
        self.fuse_upsample_add = fuse_upsample_add
        self.lean_predict = lean_predict
        self.fuse_resize_conv = fuse_resize_conv
        self.backend = backend
        self.report = None
        allow_mmengine_checkpoints()

    def _convert(self, runner) -> None:
        self._warn_environment(runner)
        model = unwrap_model(runner.model)
        if getattr(model, 'cann_conversion_report', None) is not None:
            self.report = model.cann_conversion_report
            return
        if self.pool_precision is not None or self.upsample_precision is not None:
            set_precision_policy(self.pool_precision, self.upsample_precision)
        convert_model(runner.model, upsample=self.upsample, pooling=self.pooling,
                      resize=self.resize, logger=runner.logger,
                      fuse_upsample_add=self.fuse_upsample_add, lean_predict=self.lean_predict,
                      backend=self.backend, fuse_resize_conv=self.fuse_resize_conv)
        self.report = model.cann_conversion_report

    def _warn_environment(self, runner) -> None:
        """Log environment pitfalls once per hook (see ``tools/env_check.py``)."""
        if getattr(self, '_environment_checked', False):
            return
        self._environment_checked = True
        warning = npu_jit_compile_warning(os.environ)
        if warning is not None:
            runner.logger.warning(f'mmseg_cann: {warning}')

    def before_run(self, runner) -> None:
        self._convert(runner)

    def before_train(self, runner) -> None:
        self._convert(runner)

    def before_val(self, runner) -> None:
        self._convert(runner)

    def before_test(self, runner) -> None:
        self._convert(runner)


def register_hooks() -> None:
    """Register :class:`CANNOpsHook` in mmseg's and mmengine's root ``HOOKS``."""
    from mmengine.registry import HOOKS as ROOT_HOOKS
    from mmseg.registry import HOOKS as MMSEG_HOOKS
    for registry in (MMSEG_HOOKS, ROOT_HOOKS):
        register_once(registry, CANNOpsHook)

