"""Row-strip execution (mmseg_cann.strips): bit-identical to the whole tensor, real
mmseg/mmcv stages, and the lean prediction path of a real Fast-SCNN."""
import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mmseg_cann import convert_model, strips
from mmseg_cann.strips import is_row_local, row_geometry, run_in_strips, strip_execution

from tests._helpers import load_config


def _randomize_bn(module: nn.Module, seed: int = 0) -> nn.Module:
    """Non-trivial running statistics and affine parameters, so batch norm is not identity."""
    gen = torch.Generator().manual_seed(seed)
    for m in module.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.copy_(torch.randn(m.num_features, generator=gen))
            m.running_var.copy_(torch.rand(m.num_features, generator=gen) + 0.5)
            m.weight.data.copy_(torch.randn(m.num_features, generator=gen))
            m.bias.data.copy_(torch.randn(m.num_features, generator=gen))
    return module.eval()


def _fast_scnn():
    from mmengine.registry import init_default_scope
    from mmseg.registry import MODELS
    init_default_scope('mmseg')
    cfg = load_config('mmseg::fastscnn/fast_scnn_8xb4-160k_cityscapes-512x1024.py')
    cfg.model.backbone.norm_cfg = dict(type='BN', requires_grad=True)
    for head in [cfg.model.decode_head] + list(cfg.model.auxiliary_head):
        head.norm_cfg = dict(type='BN', requires_grad=True)
    torch.manual_seed(0)
    return _randomize_bn(MODELS.build(cfg.model))


def _stacks():
    """Awkward row-local stacks: strides, dilation, ceil-mode and padding-excluding pools,
    explicit reflection padding, residual blocks."""
    from mmcv.cnn import ConvModule
    from mmseg.models.utils import InvertedResidual
    torch.manual_seed(0)
    pools = nn.Sequential(
        nn.Conv2d(3, 16, 5, stride=2, padding=2), nn.BatchNorm2d(16), nn.ReLU(),
        nn.MaxPool2d(3, 2, 1, ceil_mode=True),
        nn.Conv2d(16, 16, 3, padding=2, dilation=2), nn.Hardswish(),
        nn.AvgPool2d(3, 2, 1, ceil_mode=True, count_include_pad=False))
    reflect = nn.Sequential(
        ConvModule(3, 16, 3, stride=2, padding=1, norm_cfg=dict(type='BN'),
                   padding_mode='reflect'),
        ConvModule(16, 16, (5, 3), padding=(2, 1), norm_cfg=dict(type='BN'),
                   order=('norm', 'conv', 'act')))
    inverted = nn.Sequential(
        nn.Conv2d(3, 16, 3, 2, 1),
        InvertedResidual(16, 16, 1, expand_ratio=4), InvertedResidual(16, 24, 2, expand_ratio=6),
        InvertedResidual(24, 24, 1, expand_ratio=6))
    return {'pools': _randomize_bn(pools), 'reflect': _randomize_bn(reflect),
            'inverted': _randomize_bn(inverted),
            'fast_scnn_stem': _fast_scnn().backbone.learning_to_downsample}


STACKS = _stacks()
BIT_IDENTICAL = ('fast_scnn_stem', 'pools', 'reflect')


@pytest.mark.parametrize('name', sorted(STACKS))
@pytest.mark.parametrize('height,parts', [(517, 3), (256, 2), (1000, 7), (1021, 4)])
def test_strips_equal_the_whole_tensor(name, height, parts):
    """Same shape; values bit-identical where each convolution's per-output reduction
    does not depend on the height (PyTorch's CPU kernels for short reductions: the
    stems below), otherwise within float32 rounding of the reduction."""
    stack = STACKS[name]
    assert is_row_local(stack)
    x = torch.randn(1, 3, height, 333, generator=torch.Generator().manual_seed(height))
    with torch.no_grad():
        whole = stack(x)
        stride, halo = row_geometry(stack)
        got = run_in_strips(stack, x, parts, stride, halo)
    assert got.shape == whole.shape
    if name in BIT_IDENTICAL:
        assert torch.equal(got, whole)
    else:
        _assert_within_rounding(got, whole)


def _assert_within_rounding(got, whole):
    """Differences of the order of float32 rounding of the values (a few ulp of the
    largest magnitude), nothing like a strip-edge error (order one, see below)."""
    scale = whole.abs().max()
    assert (got - whole).abs().max() <= 64 * torch.finfo(torch.float32).eps * scale


def test_a_strip_without_halo_differs():
    """The halo is what makes strips exact (the equality tests above can fail)."""
    stack = STACKS['fast_scnn_stem']
    x = torch.randn(1, 3, 256, 64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        stride, _ = row_geometry(stack)
        assert not torch.equal(run_in_strips(stack, x, 4, stride, 0), stack(x))


def test_geometry_of_known_stages():
    # Fast-SCNN's stem: three 3x3 convolutions of stride 2 and padding 1 read
    # P = 1 + 2 + 4 = 7 rows above an output row's anchor and E = 2 + 4 + 8 = 14 in all;
    # max(7, 14 - 7) = 7, rounded up to the total stride 8.
    assert row_geometry(STACKS['fast_scnn_stem']) == (8, 8)
    # 5x5/2 pad 2, pool 3x3/2 pad 1 at stride 2, 3x3 dilation 2 pad 2 at stride 4, pool
    # 3x3/2 pad 1 at stride 4: P = 2 + 2 + 8 + 4 = 16, E = 4 + 4 + 16 + 8 = 32.
    assert row_geometry(STACKS['pools']) == (8, 16)
    # explicit reflection padding shifts (P) without widening the field (E):
    # (1 + 0) at stride 1, then the 5x3 convolution's 2 rows at stride 2: P = 5, E = 2 + 8
    assert row_geometry(STACKS['reflect']) == (2, 6)


def test_what_is_row_local():
    from mmcv.cnn import ConvModule
    conv = nn.Conv2d(3, 3, 3, padding=1)
    bn = nn.BatchNorm2d(3)
    assert is_row_local(nn.Sequential(conv, copy.deepcopy(bn).eval(), nn.ReLU()))
    assert not is_row_local(nn.Sequential(conv, bn.train()))  # batch statistics
    assert not is_row_local(nn.Sequential(conv, nn.AdaptiveAvgPool2d(1)))
    assert not is_row_local(nn.Conv2d(3, 3, 3, padding=1, padding_mode='circular'))
    assert not is_row_local(nn.MaxPool2d(2, return_indices=True))
    assert not is_row_local(nn.Upsample(scale_factor=2))
    assert not is_row_local(nn.GroupNorm(1, 3))
    assert not is_row_local(nn.Sequential())
    assert is_row_local(ConvModule(3, 3, 3, norm_cfg=dict(type='BN')).eval())
    assert not is_row_local(ConvModule(3, 4, 3, norm_cfg=dict(type='GN', num_groups=2)))

    class Pooled(nn.Sequential):
        def forward(self, x):
            return super().forward(x).mean((2, 3), keepdim=True)
    assert not is_row_local(Pooled(conv))


def _image_conv_heights(monkeypatch):
    """The input heights of the convolutions reading a 3-channel image (the stem's first),
    recorded without hooks (a hooked module is never split inside a stage)."""
    heights = []
    real = F.conv2d

    def recording(input, *args, **kwargs):
        if input.dim() == 4 and input.shape[1] == 3:
            heights.append(input.shape[2])
        return real(input, *args, **kwargs)
    monkeypatch.setattr(F, 'conv2d', recording)
    return heights


def test_strip_execution_scope(monkeypatch):
    """Stages are patched inside the block only, split only without gradients and above
    the activation budget, and the forward is restored afterwards."""
    model = _fast_scnn()
    stem = model.backbone.learning_to_downsample
    calls = _image_conv_heights(monkeypatch)
    x = torch.randn(1, 3, 512, 256)
    monkeypatch.setattr(strips, 'STRIP_ACTIVATION_BYTES', 2**20)
    with strip_execution(model) as patched:
        assert stem in patched and model.backbone.global_feature_extractor not in patched
        model.backbone(x)  # gradients enabled: whole tensor
        assert calls == [512]
        with torch.no_grad():
            model.backbone(x)
        assert len(calls) > 2 and max(calls[1:]) < 512
    assert 'forward' not in stem.__dict__
    monkeypatch.setattr(strips, 'STRIP_ACTIVATION_BYTES', 2**40)
    with strip_execution(model), torch.no_grad():
        model.backbone(x)
    assert calls[-1] == 512


@pytest.mark.slow
def test_lean_predict_in_strips_equals_mmseg(monkeypatch):
    """A real Fast-SCNN at 512x1024 through the lean prediction path, its stages in strips:
    the stem's output is bit-identical, the backbone's within float32 rounding, and the
    labels are mmseg's except where mmseg's own top two logits are within rounding."""
    from mmseg.structures import SegDataSample
    model = _fast_scnn()
    converted = convert_model(copy.deepcopy(model), resize=False, lean_predict=True)
    x = torch.randn(1, 3, 512, 1024, generator=torch.Generator().manual_seed(0))
    meta = dict(ori_shape=(512, 1024), img_shape=(512, 1024), pad_shape=(512, 1024),
                padding_size=[0, 0, 0, 0])
    monkeypatch.setattr(strips, 'STRIP_ACTIVATION_BYTES', 2 * 2**20)
    stem = converted.backbone.learning_to_downsample
    stem_calls = _image_conv_heights(monkeypatch)
    with torch.no_grad():
        expected = model.predict(x, [SegDataSample(metainfo=dict(meta))])[0]
        stem_calls.clear()
        got = converted.predict(x, [SegDataSample(metainfo=dict(meta))])[0]
        assert len(stem_calls) > 2  # the stem ran in strips
        with strip_execution(converted):
            split_stem, split = stem(x), converted.backbone(x)
        assert torch.equal(split_stem, stem(x))
        for a, b in zip(split, converted.backbone(x)):
            _assert_within_rounding(a, b)
    top2 = expected.seg_logits.data.topk(2, dim=0).values
    margin = top2[0] - top2[1]
    differ = got.pred_sem_seg.data[0] != expected.pred_sem_seg.data[0]
    assert not bool((differ & (margin > 1e-4)).any())
