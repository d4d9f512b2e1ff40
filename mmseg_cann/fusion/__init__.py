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

import torch
from torch import nn
import torch.nn.functional as F

from ..core import geometry as geo
from ..ops.fused import upsample_add, upsample_argmax
from ..ops.upsample import upsample
from ..strips import strip_execution
from ._common import FusionReport, _bind
from .resize_conv import SITES
from .rewrite import all_sites, fuse_resize_conv


# ----------------------------------------------------------------------------------
# upsample_add in top-down paths
# ----------------------------------------------------------------------------------
def _fpn_add_kwargs(cfg) -> dict:
    """``upsample_add`` keyword arguments for an FPN ``upsample_cfg``, or None."""
    if set(cfg) - {'mode', 'align_corners'}:
        return None
    mode = cfg.get('mode', 'nearest')
    if mode not in geo.FUSED_MODES:
        return None
    return dict(mode=mode, align_corners=cfg.get('align_corners', None))


def _fpn_forward_fused(self, inputs):
    """mmseg 1.x ``FPN.forward`` with the top-down ``lateral + resize(top)`` fused."""
    assert len(inputs) == len(self.in_channels)
    laterals = [lateral_conv(inputs[i + self.start_level])
                for i, lateral_conv in enumerate(self.lateral_convs)]
    used_backbone_levels = len(laterals)
    kwargs = _fpn_add_kwargs(self.upsample_cfg)
    for i in range(used_backbone_levels - 1, 0, -1):
        laterals[i - 1] = upsample_add(laterals[i], laterals[i - 1], **kwargs)
    outs = [self.fpn_convs[i](laterals[i]) for i in range(used_backbone_levels)]
    if self.num_outs > len(outs):
        if not self.add_extra_convs:
            for i in range(self.num_outs - used_backbone_levels):
                outs.append(F.max_pool2d(outs[-1], 1, stride=2))
        else:
            if self.add_extra_convs == 'on_input':
                extra_source = inputs[self.backbone_end_level - 1]
            elif self.add_extra_convs == 'on_lateral':
                extra_source = laterals[-1]
            elif self.add_extra_convs == 'on_output':
                extra_source = outs[-1]
            else:
                raise NotImplementedError
            outs.append(self.fpn_convs[used_backbone_levels](extra_source))
            for i in range(used_backbone_levels + 1, self.num_outs):
                if self.relu_before_extra_convs:
                    outs.append(self.fpn_convs[i](F.relu(outs[-1])))
                else:
                    outs.append(self.fpn_convs[i](outs[-1]))
    return tuple(outs)


def _uper_forward_feature_fused(self, inputs):
    """mmseg 1.x ``UPerHead._forward_feature`` with the top-down adds fused."""
    inputs = self._transform_inputs(inputs)
    laterals = [lateral_conv(inputs[i]) for i, lateral_conv in enumerate(self.lateral_convs)]
    laterals.append(self.psp_forward(inputs))
    used_backbone_levels = len(laterals)
    for i in range(used_backbone_levels - 1, 0, -1):
        laterals[i - 1] = upsample_add(laterals[i], laterals[i - 1], mode='bilinear',
                                       align_corners=self.align_corners)
    fpn_outs = [self.fpn_convs[i](laterals[i]) for i in range(used_backbone_levels - 1)]
    fpn_outs.append(laterals[-1])
    for i in range(used_backbone_levels - 1, 0, -1):
        fpn_outs[i] = upsample(fpn_outs[i], size=tuple(fpn_outs[0].shape[2:]), mode='bilinear',
                               align_corners=self.align_corners)
    fpn_outs = torch.cat(fpn_outs, dim=1)
    return self.fpn_bottleneck(fpn_outs)


def fuse_upsample_add(model: nn.Module, report: FusionReport = None) -> FusionReport:
    """Bind the fused top-down methods on every FPN neck / UPerHead of ``model``.

    Only modules whose class is exactly mmseg's ``FPN`` / ``UPerHead`` are rewritten (a
    subclass may have changed the method). Idempotent.
    """
    from mmseg.models.decode_heads import UPerHead
    from mmseg.models.necks import FPN
    report = report if report is not None else FusionReport()
    for path, module in model.named_modules():
        path = path or '<root>'
        if type(module) is FPN:
            if _fpn_add_kwargs(module.upsample_cfg) is None:
                report.skipped.append(f'{path} (FPN upsample_cfg={module.upsample_cfg})')
                continue
            _bind(module, 'forward', _fpn_forward_fused)
            report.upsample_add.append(f'{path} (FPN.forward)')
        elif type(module) is UPerHead:
            _bind(module, '_forward_feature', _uper_forward_feature_fused)
            report.upsample_add.append(f'{path} (UPerHead._forward_feature)')
    return report


# ----------------------------------------------------------------------------------
# lean predict
# ----------------------------------------------------------------------------------
def _logits_size(batch_img_metas):
    """The size ``BaseDecodeHead.predict_by_feat`` resizes logits to (mmseg 1.x rule)."""
    meta = batch_img_metas[0]
    if isinstance(meta['img_shape'], torch.Size):
        return tuple(meta['img_shape'])
    if 'pad_shape' in meta:
        return tuple(meta['pad_shape'][:2])
    return tuple(meta['img_shape'])


def _crop_flip(t: torch.Tensor, meta: dict) -> torch.Tensor:
    """``postprocess_result``'s padding crop and flip undo on the last two dims."""
    H, W = t.shape[-2:]
    if 'img_padding_size' not in meta:
        padding = meta.get('padding_size', [0] * 4)
    else:
        padding = meta['img_padding_size']
    left, right, top, bottom = padding
    t = t[..., top:H - bottom, left:W - right]
    if meta.get('flip', None):
        direction = meta.get('flip_direction', None)
        if direction not in ('horizontal', 'vertical'):
            raise ValueError(f'flip_direction must be horizontal or vertical, got {direction!r}')
        t = t.flip(dims=(-1,) if direction == 'horizontal' else (-2,))
    return t


def _lean_predict(self, inputs, data_samples=None):
    """``EncoderDecoder.predict`` with the labels from ``upsample_argmax`` (see module doc)."""
    from mmengine.structures import PixelData
    from mmseg.structures import SegDataSample
    mode = self.test_cfg.get('mode', 'whole')
    if mode not in ('whole', 'slide') or self.out_channels == 1:
        return type(self).predict(self, inputs, data_samples)
    if data_samples is not None:
        metas = [s.metainfo for s in data_samples]
    else:
        metas = [dict(ori_shape=inputs.shape[2:], img_shape=inputs.shape[2:],
                      pad_shape=inputs.shape[2:], padding_size=[0, 0, 0, 0])] * inputs.shape[0]
    with strip_execution(self):
        if mode == 'slide':
            return _lean_slide_predict(self, inputs, metas, data_samples)
        low = self.decode_head.forward(self.extract_feat(inputs))
    size = _logits_size(metas)
    align = self.align_corners
    keep = getattr(self, '_cann_keep_logits', False)
    samples = data_samples if data_samples is not None else \
        [SegDataSample() for _ in range(low.shape[0])]
    for i, sample in enumerate(samples):
        low_i = low[i:i + 1]
        if data_samples is None:
            pred = upsample_argmax(low_i, size, 'bilinear', align)
            full = upsample(low_i, size, mode='bilinear', align_corners=align)[0] if keep else None
        else:
            meta = metas[i]
            ori = tuple(int(s) for s in meta['ori_shape'][:2])
            if keep:
                full = _crop_flip(upsample(low_i, size, mode='bilinear', align_corners=align),
                                  meta)
                full = upsample(full, ori, mode='bilinear', align_corners=align)
                pred, full = full.argmax(1), full[0]
            else:
                full = None
                pred = _crop_flip(upsample_argmax(low_i, size, 'bilinear', align), meta)
                if tuple(pred.shape[-2:]) != ori:  # rescaled: mmseg resizes twice
                    mid = _crop_flip(upsample(low_i, size, mode='bilinear',
                                              align_corners=align), meta)
                    pred = upsample_argmax(mid, ori, 'bilinear', align)
        data = {'pred_sem_seg': PixelData(data=pred)}
        if full is not None:
            data['seg_logits'] = PixelData(data=full)
        else:
            data['seg_logits_low'] = PixelData(data=low[i])
        sample.set_data(data)
    return samples


def _slide_windows(size: int, crop: int, stride: int):
    """``EncoderDecoder.slide_inference``'s ``(start, end)`` windows along one side."""
    grids = max(size - crop + stride - 1, 0) // stride + 1
    windows = []
    for i in range(grids):
        end = min(i * stride + crop, size)
        windows.append((max(end - crop, 0), end))
    return windows


def _slide_logits(self, inputs: torch.Tensor, metas) -> torch.Tensor:
    """``EncoderDecoder.slide_inference`` accumulating in place: each crop's logits are
    added into their window of one full-size tensor (mmseg pads every crop's logits to
    the full size first), then divided in place by the window counts. Same values.

    Raises:
        AssertionError: the windows leave pixels uncovered (a stride larger than the
            crop), as mmseg's ``slide_inference`` asserts -- here before any window runs.
    """
    h_stride, w_stride = self.test_cfg.stride
    h_crop, w_crop = self.test_cfg.crop_size
    batch_size, _, h_img, w_img = inputs.size()
    rows = _slide_windows(h_img, h_crop, h_stride)
    cols = _slide_windows(w_img, w_crop, w_stride)
    for side, windows, size in (('rows', rows, h_img), ('columns', cols, w_img)):
        reach = 0  # the windows are ordered: a gap is a start beyond all ends before it
        for start, end in windows:
            if start > reach:
                break
            reach = max(reach, end)
        if reach < size:
            raise AssertionError(
                f'slide inference leaves {side} without a window: test_cfg crop_size '
                f'{tuple(self.test_cfg.crop_size)} with stride {tuple(self.test_cfg.stride)} '
                f'on a {h_img}x{w_img} input (mmseg asserts this too; use a stride <= the crop)')
    preds = inputs.new_zeros((batch_size, self.out_channels, h_img, w_img))
    count_mat = inputs.new_zeros((batch_size, 1, h_img, w_img))
    for y1, y2 in rows:
        for x1, x2 in cols:
            crop_img = inputs[:, :, y1:y2, x1:x2]
            metas[0]['img_shape'] = crop_img.shape[2:]  # as mmseg does
            preds[:, :, y1:y2, x1:x2] += self.encode_decode(crop_img, metas)
            count_mat[:, :, y1:y2, x1:x2] += 1
    return preds.div_(count_mat)


def _lean_slide_predict(self, inputs, metas, data_samples):
    """Slide-mode ``predict``: in-place logits accumulation (:func:`_slide_logits`), then
    labels straight from them: the argmax of the cropped, un-flipped logits when they
    already have ``ori_shape`` (mmseg's resize to the same size copies them), otherwise
    :func:`mmseg_cann.ops.upsample_argmax` -- no second full-size tensor."""
    from mmengine.structures import PixelData
    from mmseg.structures import SegDataSample
    logits = _slide_logits(self, inputs, metas)
    samples = data_samples if data_samples is not None else \
        [SegDataSample() for _ in range(logits.shape[0])]
    for i, sample in enumerate(samples):
        t = logits[i:i + 1]
        if data_samples is not None:
            t = _crop_flip(t, metas[i])
            ori = tuple(int(v) for v in metas[i]['ori_shape'][:2])
        else:
            ori = tuple(t.shape[-2:])
        if tuple(t.shape[-2:]) == ori:
            pred = t.argmax(1)
        else:
            pred = upsample_argmax(t, ori, 'bilinear', self.align_corners)
        sample.set_data({'pred_sem_seg': PixelData(data=pred)})
    return samples


def is_lean(model: nn.Module) -> bool:
    """Whether :func:`lean_predict` is bound on ``model``."""
    return 'predict' in getattr(model, '_cann_fused', ())


def lean_predict(model: nn.Module, keep_logits: bool = False,
                 report: FusionReport = None) -> FusionReport:
    """Bind the lean ``predict`` on ``model`` (an mmseg ``EncoderDecoder``); see module doc.

    Args:
        model: the segmentor (unwrapped). Other segmentors are reported as skipped.
        keep_logits: also compute full-resolution ``seg_logits`` as mmseg does.
    """
    from mmseg.models.decode_heads.decode_head import BaseDecodeHead
    from mmseg.models.segmentors import EncoderDecoder
    from mmseg.models.segmentors.base import BaseSegmentor
    report = report if report is not None else FusionReport()
    cls = type(model)
    if not isinstance(model, EncoderDecoder):
        report.skipped.append(f'lean predict: {cls.__name__} is not an EncoderDecoder')
        return report
    overridden = [n for n in ('predict', 'inference', 'whole_inference', 'encode_decode',
                              'extract_feat')
                  if getattr(cls, n) is not getattr(EncoderDecoder, n)]
    if getattr(cls, 'postprocess_result') is not BaseSegmentor.postprocess_result:
        overridden.append('postprocess_result')
    head = model.decode_head
    if not isinstance(head, BaseDecodeHead) or type(head).predict is not BaseDecodeHead.predict \
            or type(head).predict_by_feat is not BaseDecodeHead.predict_by_feat:
        overridden.append('decode_head.predict')
    if overridden:
        report.skipped.append(f'lean predict: {cls.__name__} overrides {overridden}')
        return report
    model._cann_keep_logits = bool(keep_logits)
    _bind(model, 'predict', _lean_predict)
    report.lean_predict.append(f'{cls.__name__}.predict')
    return report


def unfuse_model(model: nn.Module) -> List[str]:
    """Remove every method bound by this module from ``model``; returns the module paths."""
    # every rewrite binds through ``_bind``, which records the names in ``_cann_fused``
    undone = []
    for path, module in model.named_modules():
        names = module.__dict__.pop('_cann_fused', ())
        for name in names:
            module.__dict__.pop(name, None)
        module.__dict__.pop('_cann_keep_logits', None)
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
