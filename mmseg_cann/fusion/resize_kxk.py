"""``UPerHead.fpn_bottleneck`` through :func:`mmseg_cann.ops.resize_conv.resize_conv2d`.

UPerHead concatenates its four FPN outputs, three of them resized (2x, 4x, 8x) to the
first one's size, and runs a 3x3 ``ConvModule`` on the concat. A convolution over a
concat is the sum of the convolutions of the parts with the weight's input-channel
slices, so the rewrite computes

    ``conv(cat(f_0, up(f_1), ...), W, b) = conv(f_0, W_0, b) + Σ_i resize_conv2d(f_i, W_i)``

(the non-resized part as a plain convolution carrying the bias once), then the
ConvModule's norm and activation on the full-size sum, as its ``forward`` would. Each
``resize_conv2d`` works on the low-resolution map where its plan applies (integer
factors, nearest/bilinear; for UPerHead's 512-channel maps it mixes the channels at low
resolution first: 0.30x, 0.11x and 0.06x the direct multiply-accumulates at 2x, 4x, 8x)
and runs the composition otherwise. The full-size concat is never made. The top-down
path uses the fused ``upsample_add`` as :func:`mmseg_cann.fusion.fuse_upsample_add` does.
Values: within the bound of :func:`mmseg_cann.ops.resize_conv.resize_conv2d_error_bound`
summed over the parts (float32 rounding of reordered sums).
"""
from __future__ import annotations

from typing import List

import torch
import torch.nn.functional as F

from ..core import geometry as geo
from ..ops.fused import upsample_add
from ..ops.resize_conv import run_resize_conv2d
from . import resize_conv as rc
from ._common import Site, record_last_call


def _conv_kxk(conv, what: str):
    """A stride-1, undilated, single-group ``nn.Conv2d`` with symmetric zero padding."""
    reason = rc._as_built(conv, (torch.nn.Conv2d,), what)
    if reason is not None:
        return reason
    pad = conv.padding
    if tuple(conv.stride) != (1, 1) or tuple(conv.dilation) != (1, 1) or conv.groups != 1 \
            or conv.padding_mode != 'zeros' or isinstance(pad, str):
        return (f'{what} is not a stride-1, undilated, single-group zero-padded convolution '
                f'(stride {conv.stride}, dilation {conv.dilation}, groups {conv.groups}, '
                f'padding {pad!r} {conv.padding_mode})')
    return None


def _uper_reason(head):
    return rc._conv_module(head.fpn_bottleneck, 'fpn_bottleneck', _conv_kxk) \
        or rc._mode('bilinear', head.align_corners)


def bottleneck_over_resized(cm, maps, mode, align_corners):
    """``(cm(cat([maps[0]] + [resize(m, maps[0].shape[2:]) for m in maps[1:]], 1)),
    what ran per resized part)`` as a sum of per-part convolutions (see the module doc);
    ``(None, ())`` when the channels do not add up to the conv's (the caller runs the
    unfused expression)."""
    conv = cm.conv
    channels = [int(m.shape[1]) for m in maps]
    if sum(channels) != conv.weight.shape[1]:
        return None, ()
    weights = torch.split(conv.weight, channels, dim=1)
    size = rc.resize_size(maps[0].shape[2:])
    pad = tuple(conv.padding)
    y = F.conv2d(maps[0], weights[0], conv.bias, padding=pad)
    ran = []
    for m, w in zip(maps[1:], weights[1:]):
        if geo.same_sizes(m.shape[2:], size):
            part, how = F.conv2d(m, w, padding=pad), 'conv2d (no resize)'
        else:
            part, how = run_resize_conv2d(m, w, size=size, mode=mode,
                                          align_corners=align_corners, padding=pad)
        ran.append(how)
        # in place only where nothing records the sum (autograd, autocast's dtypes)
        y = y + part if (torch.is_grad_enabled() and (y.requires_grad or part.requires_grad)) \
            or y.dtype != part.dtype else y.add_(part)
    return rc._after_conv(cm, y), tuple(ran)


def _uper_forward_feature(self, inputs):
    """``UPerHead._forward_feature`` with the top-down adds fused and ``fpn_bottleneck``
    as a sum of :func:`resize_conv2d` calls on the low-resolution FPN outputs."""
    inputs, unfused = rc._head_inputs(self, _uper_reason, inputs, '_forward_feature')
    if unfused is not None:
        return unfused
    laterals = [conv(inputs[i]) for i, conv in enumerate(self.lateral_convs)]
    laterals.append(self.psp_forward(inputs))
    levels = len(laterals)
    for i in range(levels - 1, 0, -1):
        if rc._plain_torch():
            laterals[i - 1] = laterals[i - 1] + rc._resize(
                laterals[i], laterals[i - 1].shape[2:], 'bilinear', self.align_corners)
        else:
            laterals[i - 1] = upsample_add(laterals[i], laterals[i - 1], mode='bilinear',
                                           align_corners=self.align_corners)
    fpn_outs = [self.fpn_convs[i](laterals[i]) for i in range(levels - 1)]
    fpn_outs.append(laterals[-1])
    out, ran = bottleneck_over_resized(self.fpn_bottleneck, fpn_outs, 'bilinear',
                                       self.align_corners)
    record_last_call(self, ran if out is not None else
                     ('composition: the channels do not add up to the convolution\'s',))
    if out is None:
        resize = rc._module_resize(self)
        size = fpn_outs[0].shape[2:]
        out = self.fpn_bottleneck(torch.cat(
            [fpn_outs[0]] + [resize(f, size=size, mode='bilinear',
                                    align_corners=self.align_corners) for f in fpn_outs[1:]],
            dim=1))
    return out


#: the kxk sites (:func:`mmseg_cann.fusion.fuse_resize_conv`)
SITES: List[Site] = [
    Site('mmseg.models.decode_heads.uper_head.UPerHead', 'fpn_bottleneck',
         'kxk ConvModule over cat of resized maps (resize_conv2d)', '_forward_feature',
         _uper_reason, _uper_forward_feature, label=None)]
