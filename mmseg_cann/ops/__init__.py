"""Functional API mirroring ``torch.nn.functional`` for upsampling and pooling.

``upsample``, ``max_pool2d``, ``avg_pool2d`` and ``adaptive_avg_pool2d`` have the
signatures and semantics of their ``torch.nn.functional`` counterparts plus the
keyword-only ``precision`` and ``backend``; ``upsample_add`` and ``upsample_argmax``
are fused decoder ops (:mod:`.fused`); ``resize_conv2d`` is ``conv2d(interpolate(x))``
computed from the low-resolution input where that applies
(:mod:`.resize_conv`); ``roi_pool2d`` pools regions of interest (:mod:`.roi_pool`).
``geometry`` (the shared size and coordinate rules) and ``reference`` (float64
implementations written from the formulas) are :mod:`mmseg_cann.core`'s, also importable
as ``mmseg_cann.ops.geometry`` and ``mmseg_cann.ops.reference``.
"""
import sys

from ..core import geometry, reference
from . import direct
from .pooling import adaptive_avg_pool2d, avg_pool2d, max_pool2d
from .upsample import upsample
from .fused import upsample_add, upsample_argmax
from .resize_conv import resize_conv2d, resize_conv2d_macs, resize_conv2d_plan
from .roi_pool import roi_pool2d

# the call cache runs an op's full path on the first call of a key, so it needs the ops
for _builder, _op in ((direct.max_pool2d, max_pool2d), (direct.avg_pool2d, avg_pool2d),
                      (direct.adaptive_avg_pool2d, adaptive_avg_pool2d),
                      (direct.upsample, upsample)):
    direct.register_op(_builder, _op)
del _builder, _op

# the same module objects under their historical names (``import mmseg_cann.ops.geometry``)
sys.modules[__name__ + '.geometry'] = geometry
sys.modules[__name__ + '.reference'] = reference

__all__ = ['upsample', 'upsample_add', 'upsample_argmax', 'max_pool2d', 'avg_pool2d',
           'adaptive_avg_pool2d', 'resize_conv2d', 'resize_conv2d_macs', 'resize_conv2d_plan',
           'roi_pool2d', 'geometry', 'reference']
