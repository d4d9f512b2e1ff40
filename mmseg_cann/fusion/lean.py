"""``lean_predict``: ``EncoderDecoder.predict`` taking the labels straight from the decoder's
low-resolution logits with :func:`mmseg_cann.ops.upsample_argmax` (see
:mod:`mmseg_cann.fusion`)."""
from __future__ import annotations

import torch
from torch import nn

from ..ops.fused import upsample_argmax
from ..ops.upsample import upsample
from ..strips import strip_execution
from ._common import FusionReport, _bind


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
