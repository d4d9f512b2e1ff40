"""Functional API mirroring ``torch.nn.functional`` for upsampling and pooling.

``upsample``, ``max_pool2d``, ``avg_pool2d`` and ``adaptive_avg_pool2d`` have the
signatures and semantics of their ``torch.nn.functional`` counterparts plus the
keyword-only ``precision`` and ``backend``; ``upsample_add`` and ``upsample_argmax``
are fused decoder ops (:mod:`.fused`). ``reference`` holds float64 implementations
written from the formulas; ``geometry`` the shared size and coordinate rules.
"""
from . import geometry, reference
from .pooling import adaptive_avg_pool2d, avg_pool2d, max_pool2d
from .upsample import upsample
from .fused import upsample_add, upsample_argmax

__all__ = ['upsample', 'upsample_add', 'upsample_argmax', 'max_pool2d', 'avg_pool2d', 'adaptive_avg_pool2d', 'geometry',
           'reference']
