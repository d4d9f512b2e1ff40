"""``fuse_upsample_add``: the top-down ``lateral + resize(top)`` of mmseg's ``FPN`` neck and
``UPerHead`` as :func:`mmseg_cann.ops.upsample_add` (see :mod:`mmseg_cann.fusion`)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..core import geometry as geo
from ..ops.fused import upsample_add
from ..ops.upsample import upsample
from ._common import FusionReport, _bind


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
