"""Opt-in use of the fused decoder ops inside real mmseg models (per model instance).

Three rewrites, each applied by binding a replacement method on the module objects found
in one model (never by editing mmseg's classes, so other models in the process are
untouched) and undone by :func:`unfuse_model`:

``fuse_upsample_add`` (:func:`fuse_upsample_add`)
    The top-down paths of mmseg's ``FPN`` neck (``forward``) and ``UPerHead``
    (``_forward_feature``) compute ``laterals[i - 1] + resize(laterals[i],
    size=laterals[i - 1].shape[2:], ...)``; the replacement computes
    :func:`mmseg_cann.ops.upsample_add` ``(laterals[i], laterals[i - 1], ...)`` instead
    (bit-identical values; one full-size allocation instead of two when no gradient is
    needed, PyTorch's unfused computation when one is). An FPN whose ``upsample_cfg``
    uses ``scale_factor``, another mode than nearest/nearest-exact/bilinear, or other
    keys keeps mmseg's expression for that module (listed as skipped).

``lean_predict`` (:func:`lean_predict`)
    ``EncoderDecoder.predict`` in ``whole`` test mode resizes the decoder's logits to the
    padded input size, crops the padding, undoes the flip, resizes to ``ori_shape`` and
    takes the argmax, keeping the full-resolution logits as ``seg_logits``. The lean
    replacement takes the labels with :func:`mmseg_cann.ops.upsample_argmax` straight
    from the decoder's low-resolution logits (crop and flip are applied to the labels,
    which commute with a per-pixel argmax), so no ``C x H x W`` full-resolution tensor is
    made. The data samples get ``pred_sem_seg`` as before and, instead of
    ``seg_logits``, ``seg_logits_low`` (the decoder output of that image, ``(C, h, w)``,
    before resize/crop/flip), unless ``keep_logits=True`` is given, in which case the
    full-resolution ``seg_logits`` are computed as mmseg does (no memory saving, same
    predictions). When the cropped size differs from ``ori_shape`` (a test pipeline that
    rescales), mmseg resizes twice; for that image the intermediate logits are made and
    only the final resize is fused. Labels equal mmseg's except at near-ties of the top
    two classes (the contract of ``upsample_argmax``). Segmentors other than
    ``EncoderDecoder`` (or subclasses overriding its predict path), single-channel
    (threshold) heads and decode heads overriding ``predict`` keep mmseg's ``predict``.

    The segmentor's row-local stages (:mod:`mmseg_cann.strips`) run on horizontal strips
    when their activations are large (CPU only): Fast-SCNN's stem at 1024x2048 no longer
    holds a 64 MB map twice. Values agree to float32 rounding (bit-identical where the
    convolutions' reductions are short), within the same near-tie contract.

    In ``slide`` test mode the crops' logits are accumulated in place into one full-size
    tensor (mmseg pads each crop's logits to full size before adding) and divided in
    place; the labels are the argmax of those logits (cropped and un-flipped), through
    ``upsample_argmax`` when ``ori_shape`` differs. Labels equal mmseg's; the samples
    carry ``pred_sem_seg`` only (no ``seg_logits``).

``fuse_resize_conv`` (:func:`fuse_resize_conv`, :mod:`.resize_conv`)
    The per-pixel linear layer after a resize (SegFormer's ``fusion_conv``, LightHam's
    ``squeeze``, UNet's ``InterpConv``, SETR's ``cls_seg``, ...) runs at each input's own
    resolution and the results are summed with ``upsample_add``: exact in arithmetic,
    within float32 rounding of the unrewritten model (docs/resize_conv.md).
"""
from __future__ import annotations

from typing import List

from torch import nn

from ._common import LAST_CALL, FusionReport
from .lean import is_lean, lean_predict
from .resize_conv import SITES
from .rewrite import all_sites, fuse_resize_conv
from .upsample_add import fuse_upsample_add


def unfuse_model(model: nn.Module) -> List[str]:
    """Remove every method bound by this module from ``model``; returns the module paths."""
    # every rewrite binds through ``_bind``, which records the names in ``_cann_fused``
    undone = []
    for path, module in model.named_modules():
        names = module.__dict__.pop('_cann_fused', ())
        for name in names:
            module.__dict__.pop(name, None)
        module.__dict__.pop('_cann_keep_logits', None)
        module.__dict__.pop(LAST_CALL, None)
        if names:
            undone.append(path or '<root>')
    return undone


def check_options(**options) -> None:
    """Raise ``TypeError`` naming the option unless every value is True or False (the
    fusion switches of ``convert_model``, ``CANNOpsHook`` and the config)."""
    for name, value in options.items():
        if not isinstance(value, bool):
            raise TypeError(f'{name} must be True or False, got {value!r}')


def apply_fusion(model: nn.Module, fuse_add: bool = False, lean: bool = False,
                 resize_conv: bool = False) -> FusionReport:
    """The options of :func:`mmseg_cann.convert_model`: validate and apply; the report."""
    check_options(fuse_upsample_add=fuse_add, lean_predict=lean, fuse_resize_conv=resize_conv)
    report = FusionReport()
    if fuse_add:
        fuse_upsample_add(model, report)
    if resize_conv:
        fuse_resize_conv(model, report)
    if lean:
        lean_predict(model, report=report)
    return report


__all__ = ['FusionReport', 'SITES', 'all_sites', 'apply_fusion', 'check_options',
           'fuse_resize_conv', 'fuse_upsample_add', 'is_lean', 'lean_predict', 'unfuse_model']
