"""Every model config mmseg ships (``mmseg/.mim/configs/_base_/models``), built small for a
CPU sweep of a transform or an export.

:func:`base_model_names` lists them; :func:`build_base_model` builds one with random
init (mmseg's own, seeded), SyncBN as BN, no pretrained weights, and its repeated blocks
cut down (ResNet-50 -> ResNet-18, 2 transformer layers per output, 1 block per stage):
the same module types and data flow, a fraction of the graph. Configs whose packages are
that do not build or run on this stack are listed with the reason (:data:`NOT_BUILT`,
:data:`NOT_RUNNING`).
"""
from __future__ import annotations

import importlib.util
import os

import torch

#: configs that do not build here, and why (the sweep checks that this list is exact)
NOT_BUILT = {
    'fpn_poolformer_s12': 'needs mmpretrain (PoolFormer backbone)',
    'upernet_convnext': 'needs mmpretrain (ConvNeXt backbone)',
    'san_vit-b16': "the base names no vocabulary for SAN's text encoder (dataset_name)",
    'vpd_sd': 'a depth-estimation base without decode_head (VPD needs Stable Diffusion)',
}
#: configs that build but whose forward raises on this stack (checked as well)
NOT_RUNNING = {
    'pointrend_r50': "mmseg 1.2.2's PointHead: mmcv's point_sample returns a tuple "
                     '(TypeError, with or without mmseg_cann)',
    'upernet_beit': "BEiT's relative position bias is made for its img_size (640x640, "
                    '1601 tokens): other input sizes raise (RuntimeError, with or without '
                    'mmseg_cann)',
    'upernet_mae': "MAE (a BEiT backbone): the same relative position bias for 640x640",
}
#: ResNet-50 stage widths -> ResNet-18's (each // 4), for heads fed by the backbone
R50_TO_R18 = {256: 64, 512: 128, 1024: 256, 2048: 512}


def models_dir() -> str:
    """``mmseg/.mim/configs/_base_/models`` of the installed mmseg."""
    spec = importlib.util.find_spec('mmseg')
    root = os.path.dirname(spec.origin)
    return os.path.join(root, '.mim', 'configs', '_base_', 'models')


def base_model_names():
    """The config names (file names without ``.py``), sorted."""
    return sorted(f[:-3] for f in os.listdir(models_dir()) if f.endswith('.py'))


def _drop_pretrained(node) -> None:
    if isinstance(node, dict):
        init_cfg = node.get('init_cfg')
        if isinstance(init_cfg, dict) and init_cfg.get('type') == 'Pretrained':
            node['init_cfg'] = None
        if 'pretrained' in node:
            node['pretrained'] = None
        for value in node.values():
            _drop_pretrained(value)
    elif isinstance(node, (list, tuple)):
        for value in node:
            _drop_pretrained(value)


def _r18_channels(cfg, keys=('in_channels', 'c1_in_channels')) -> None:
    for key in keys:
        value = cfg.get(key)
        if isinstance(value, int) and value in R50_TO_R18:
            cfg[key] = R50_TO_R18[value]
        elif isinstance(value, (list, tuple)) and all(v in R50_TO_R18 for v in value):
            cfg[key] = type(value)(R50_TO_R18[v] for v in value)


def _shrink_resnet(model_cfg) -> None:
    """ResNet-50/101 trunks as ResNet-18 (widths / 4); the heads and necks they feed get
    the matching input widths (an FPN neck's outputs keep theirs)."""
    backbone = model_cfg.backbone
    if not backbone.get('type', '').startswith('ResNet') or backbone.get('depth', 18) < 50:
        return
    backbone.depth = 18
    neck = model_cfg.get('neck')
    if neck is not None:
        _r18_channels(neck)
    # JPU's fused map has mid_channels per dilation whatever the trunk; a head reading
    # it keeps its width (the backbone's last map is not passed through, so the widths
    # cannot be confused)
    jpu_fused = (neck.mid_channels * len(neck.dilations)
                 if neck is not None and neck.type == 'JPU' else None)
    heads = [model_cfg.get('decode_head'), model_cfg.get('auxiliary_head')]
    for head in heads:
        for one in head if isinstance(head, (list, tuple)) else [head]:
            # a neck that makes new maps (FPN) feeds the heads its own widths; JPU passes
            # the backbone's maps through besides its fused one
            if one is None or one.get('in_channels') == jpu_fused:
                continue
            if neck is None or neck.type == 'JPU':
                _r18_channels(one)


def _shrink_depths(backbone) -> None:
    """Transformer stacks to one layer per returned output; per-stage depths and block
    counts to 1."""
    layers, outs = backbone.get('num_layers'), backbone.get('out_indices')
    if isinstance(layers, int) and isinstance(outs, (list, tuple)) and len(outs) > 0:
        order = sorted(set(outs))
        backbone.out_indices = type(outs)(order.index(i) for i in outs)
        backbone.num_layers = len(order)
    elif isinstance(layers, int) and (outs is None or isinstance(outs, int)):
        # one output (the default -1: the last layer)
        backbone.num_layers, backbone.out_indices = 2, -1
    if isinstance(backbone.get('depths'), (list, tuple)):
        backbone.depths = [1] * len(backbone.depths)
    for stage in (backbone.get('extra') or {}).values():
        if isinstance(stage, dict) and 'num_blocks' in stage:
            stage['num_blocks'] = tuple(1 for _ in stage['num_blocks'])


def build_base_model(name: str):
    """The segmentor of ``_base_/models/{name}.py``, small (see the module docstring), in
    eval mode. Raises what the build raises (see :data:`NOT_BUILT`)."""
    from mmengine.registry import init_default_scope
    from mmseg.registry import MODELS

    from mmseg_cann.utils.config import sync_bn_to_bn
    from tests._helpers import load_config
    init_default_scope('mmseg')
    cfg = load_config(f'mmseg::_base_/models/{name}.py')
    model_cfg = cfg.model
    sync_bn_to_bn(model_cfg)
    _drop_pretrained(model_cfg)
    if isinstance(model_cfg.get('backbone'), dict):
        _shrink_resnet(model_cfg)
        _shrink_depths(model_cfg.backbone)
    torch.manual_seed(0)
    model = MODELS.build(model_cfg)
    _tools_common().quiet_init_weights(model)
    return model.eval()


def _tools_common():
    """``tools/_common.py`` (its ``quiet_init_weights``: mmseg's init without the log)."""
    from tests._helpers import REPO_ROOT
    spec = importlib.util.spec_from_file_location(
        'mmseg_cann_tools_common', os.path.join(REPO_ROOT, 'tools', '_common.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
