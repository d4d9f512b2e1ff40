"""Models rewritten by fuse_resize_conv export to ONNX (targets 'onnx' and 'atc') with the
rewrite's form (the linear layer at low resolution; UPerHead's bottleneck as
resize_conv2d's phase convolutions and DepthToSpace, both methods) and the rewritten model's values in onnxruntime, also as
ATC reads the graph."""
from __future__ import annotations

import copy

import pytest
import torch

from mmseg_cann.fusion import fuse_resize_conv

pytest.importorskip('onnxruntime')
pytest.importorskip('onnxscript')
from mmseg_cann.onnx import export_onnx, verify_onnx  # noqa: E402

SEGFORMER = 'mmseg::segformer/segformer_mit-b0_8xb2-160k_ade20k-512x512.py'
BN = dict(type='BN', requires_grad=True)


class Logits(torch.nn.Module):
    """A segmentor's decoder logits (``mode='tensor'``) as a one-input module."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        return self.model(x, mode='tensor')


class Head(torch.nn.Module):
    """A decode head on four feature maps given as separate inputs."""

    def __init__(self, head):
        super().__init__()
        self.head = head

    def forward(self, *feats):
        return self.head(list(feats))


def _shapes(proto):
    """The shapes of the graph's intermediate values (ONNX shape inference)."""
    import onnx
    inferred = onnx.shape_inference.infer_shapes(proto)
    return {tuple(d.dim_value for d in v.type.tensor_type.shape.dim)
            for v in inferred.graph.value_info}


def _segformer():
    from mmengine.registry import init_default_scope
    from mmseg.registry import MODELS

    from mmseg_cann.utils.config import sync_bn_to_bn
    from tests._helpers import load_config
    init_default_scope('mmseg')
    cfg = load_config(SEGFORMER).model
    cfg.pretrained = None
    cfg.backbone.pop('init_cfg', None)
    sync_bn_to_bn(cfg)
    torch.manual_seed(0)
    model = MODELS.build(cfg)
    model.init_weights()
    return model.eval()


def _uper():
    from mmengine.registry import init_default_scope
    from mmseg.registry import MODELS
    init_default_scope('mmseg')
    torch.manual_seed(0)
    head = MODELS.build(dict(type='UPerHead', in_channels=[8, 16, 24, 32],
                             in_index=[0, 1, 2, 3], pool_scales=(1, 2, 3, 6), channels=16,
                             num_classes=5, norm_cfg=BN))
    head.init_weights()
    return head.eval()


def _feats():
    g = torch.Generator().manual_seed(1)
    return tuple(torch.randn(1, c, h, h, generator=g)
                 for c, h in zip([8, 16, 24, 32], [32, 16, 8, 4]))


@pytest.mark.slow
@pytest.mark.parametrize('target', ['onnx', 'atc'])
def test_segformer_rewritten_exports_exactly(target):
    plain = _segformer()
    fused = copy.deepcopy(plain)
    assert fuse_resize_conv(fused).resize_conv == ['decode_head (SegformerHead.fusion_conv)']
    x = torch.rand(1, 3, 64, 96)
    proto = export_onnx(Logits(fused), (x,), target=target,
                        opset=17 if target == 'atc' else 18)
    # the fusion conv's 1024-channel full-size input (1/4 of 64x96) is never made
    assert (1, 1024, 16, 24) not in _shapes(proto)
    assert (1, 1024, 16, 24) in _shapes(export_onnx(Logits(plain), (x,), target=target,
                                                    opset=17 if target == 'atc' else 18))
    result, = verify_onnx(proto, Logits(fused), [(x,)], target=target)
    assert result['max_abs'] <= 2e-6 and result['argmax_agree'] == 1.0
    with torch.no_grad():
        torch.testing.assert_close(Logits(fused)(x), Logits(plain)(x))


@pytest.mark.slow
@pytest.mark.parametrize('target', ['onnx', 'atc'])
def test_uper_bottleneck_exports_exactly(target):
    """16-channel FPN maps: the 2x slice runs the composition (no method has fewer
    multiply-accumulates for so few channels), the 4x one mix-first, the 8x one
    polyphase; both methods export."""
    from mmseg_cann.ops import resize_conv2d_plan
    plain = _uper()
    fused = copy.deepcopy(plain)
    assert fuse_resize_conv(fused).resize_conv == ['<root> (UPerHead.fpn_bottleneck)']
    methods = [resize_conv2d_plan((1, 16, 32 // s, 32 // s), (16, 16, 3, 3), size=(32, 32),
                                  padding=1).method for s in (2, 4, 8)]
    assert methods == [None, 'mix_first', 'polyphase']
    feats = _feats()
    proto = export_onnx(Head(fused), feats, target=target, opset=17 if target == 'atc' else 18,
                        input_names=[f'f{i}' for i in range(4)])
    ops = [n.op_type for n in proto.graph.node]
    assert ops.count('DepthToSpace') == 2  # each rewritten slice's phases interleaved
    result, = verify_onnx(proto, Head(fused), [feats], target=target)
    assert result['max_abs'] <= 2e-6 and result['argmax_agree'] == 1.0
    with torch.no_grad():
        torch.testing.assert_close(Head(fused)(*feats), Head(plain)(*feats))


def _segformer_head():
    from mmengine.registry import init_default_scope
    from mmseg.registry import MODELS
    init_default_scope('mmseg')
    torch.manual_seed(0)
    head = MODELS.build(dict(type='SegformerHead', in_channels=[8, 16, 24, 32],
                             in_index=[0, 1, 2, 3], channels=16, num_classes=5,
                             norm_cfg=BN))
    head.init_weights()
    return head.eval()


def _pyramid(sizes, seed=1):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(1, c, h, w, generator=g)
                 for c, (h, w) in zip([8, 16, 24, 32], sizes))


#: the traced pyramid, then sizes that are not multiples of the stride, then larger ones
DYNAMIC_SIZES = [[(32, 32), (16, 16), (8, 8), (4, 4)],
                 [(25, 33), (13, 17), (7, 9), (4, 5)],
                 [(48, 40), (24, 20), (12, 10), (6, 5)]]


@pytest.mark.slow
@pytest.mark.parametrize('build', [_segformer_head, _uper], ids=['segformer', 'uper'])
def test_rewritten_heads_export_dynamic(build):
    """dynamic=True: the rewritten head exports as the unrewritten one does (the rewrite
    forces no size: its kxk slices take the size-generic mix-resize form) and the graph
    reproduces the rewritten head at every size, odd ones included; where the
    unrewritten head is refused for a rule of its own, the rewritten one is refused with
    the same message."""
    plain = build()
    fused = copy.deepcopy(plain)
    assert fuse_resize_conv(fused).resize_conv
    names = [f'f{i}' for i in range(4)]
    outcomes = {}
    for key, model in (('plain', plain), ('fused', fused)):
        try:
            outcomes[key] = export_onnx(Head(model), _pyramid(DYNAMIC_SIZES[0]),
                                        dynamic=True, input_names=names)
        except ValueError as exc:
            outcomes[key] = str(exc)
    if isinstance(outcomes['plain'], str):
        assert outcomes['fused'] == outcomes['plain']
        assert 'forces the traced size' not in outcomes['fused']
        return
    proto = outcomes['fused']
    assert not isinstance(proto, str), proto
    inputs = [_pyramid(sizes, seed) for seed, sizes in enumerate(DYNAMIC_SIZES)]
    for result in verify_onnx(proto, Head(fused), inputs):
        assert result['max_abs'] <= 2e-6 and result['argmax_agree'] == 1.0, result
    with torch.no_grad():
        for feats in inputs:
            ref = Head(plain)(*feats)
            torch.testing.assert_close(Head(fused)(*feats), ref, rtol=0,
                                       atol=1e-5 * float(ref.abs().max()))
