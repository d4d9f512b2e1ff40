"""Small real mmseg models built from mmseg's own configs (shared by several tests)."""
from __future__ import annotations

import os
import tempfile

import torch
from mmengine.config import Config
from mmengine.registry import init_default_scope

from mmseg_cann.utils.config import sync_bn_to_bn

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_config(path_or_base: str) -> Config:
    """A config from a file of this repository or from ``mmseg::...`` (through a base)."""
    if path_or_base.startswith('mmseg::'):
        with tempfile.NamedTemporaryFile('w', suffix='.py', delete=False) as f:
            f.write(f"_base_ = '{path_or_base}'\n")
        try:
            return Config.fromfile(f.name)
        finally:
            os.unlink(f.name)
    return Config.fromfile(os.path.join(REPO_ROOT, path_or_base))


def build_small(base: str, depth: int = 18, channels: int = 32):
    """Build an mmseg segmentor from ``base`` with a ResNet-``depth`` and thin heads."""
    from mmseg.registry import MODELS
    init_default_scope('mmseg')
    cfg = load_config(base)
    model_cfg = cfg.model
    model_cfg.pretrained = None
    sync_bn_to_bn(model_cfg)
    backbone = model_cfg.backbone
    if backbone.get('type', '').startswith('ResNet'):
        backbone.depth = depth
        backbone.pop('init_cfg', None)
        widths = [64, 128, 256, 512]
        for head_name in ('decode_head', 'auxiliary_head'):
            head = model_cfg.get(head_name)
            if head is None:
                continue
            index = head.get('in_index', -1)
            if isinstance(index, (list, tuple)):
                head.in_channels = [widths[i] for i in index]
            else:
                head.in_channels = widths[index]
            head.channels = channels
            if 'c1_in_channels' in head:
                head.c1_in_channels = widths[0]
                head.c1_channels = channels // 2
        neck = model_cfg.get('neck')
        if neck is not None:
            neck.in_channels = widths
            neck.out_channels = channels
            head = model_cfg.decode_head
            head.in_channels = [channels] * len(head.in_channels) \
                if isinstance(head.in_channels, list) else channels
    model = MODELS.build(model_cfg)
    model.init_weights()
    return model


def seg_batch(model, shape=(2, 3, 64, 128), num_classes=19, seed=0):
    """Inputs and data samples for ``model.loss``."""
    from mmengine.structures import PixelData
    from mmseg.structures import SegDataSample
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(shape, generator=gen)
    samples = []
    for _ in range(shape[0]):
        sample = SegDataSample()
        sample.gt_sem_seg = PixelData(
            data=torch.randint(0, num_classes, (1,) + shape[2:], generator=gen))
        sample.set_metainfo(dict(img_shape=shape[2:], ori_shape=shape[2:],
                                 pad_shape=shape[2:]))
        samples.append(sample)
    return x, samples
