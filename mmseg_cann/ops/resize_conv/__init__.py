"""``resize_conv2d``: an upsample followed by a convolution, computed without the
upsampled intermediate.

``resize_conv2d(x, w, b, size=..., mode=..., ...)`` equals
``F.conv2d(F.interpolate(x, size=..., mode=..., align_corners=...), w, b, stride, padding,
dilation, groups)``. The plan (:func:`resize_conv2d_plan`) takes the phase method with the
fewest multiply-accumulates where an integer factor allows, else mix-resize, or the
composition where the chosen method has no fewer multiply-accumulates than it:

* ``'polyphase'`` (:mod:`.polyphase`) and ``'mix_first'`` (:mod:`.mix_first`), for
  integer factors with constant phases (:mod:`.phases`): each output phase is a fixed
  linear function of a small low-resolution window;
* ``'mix_resize'`` (:mod:`.mix_resize`), for any sizes: each tap's channel mixing at low
  resolution, then resized and summed shifted.

The per-axis geometry is :mod:`mmseg_cann.core.resize_taps`; the plan and its MAC counts
are :mod:`.plan`, the error bound :mod:`.bounds`, the entry point :mod:`.op`. All methods
are exact in real arithmetic; in floating point the sums are reordered (bound:
:func:`resize_conv2d_error_bound`). Everything is written with differentiable torch ops
(autograd, ``gradcheck``). Calls outside the rewrite's domain run the composition itself
(the project's ``upsample``, which is ``F.interpolate``, then ``F.conv2d``), counted in
``fallback_counts()``.
"""
from ._common import pointwise_conv2d
from .bounds import resize_conv2d_error_bound, resize_conv2d_macs, resize_conv2d_plan
from .op import COMPOSITION, apply_plan, resize_conv2d, run_resize_conv2d
from .plan import GROUPINGS, METHODS, REWRITE_DTYPES, REWRITE_MODES, ResizeConvPlan

__all__ = ['resize_conv2d', 'resize_conv2d_plan', 'resize_conv2d_macs',
           'resize_conv2d_error_bound', 'run_resize_conv2d', 'apply_plan',
           'pointwise_conv2d', 'ResizeConvPlan', 'METHODS', 'GROUPINGS', 'REWRITE_DTYPES',
           'REWRITE_MODES', 'COMPOSITION']
