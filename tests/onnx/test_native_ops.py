"""PyTorch's own resize/pool calls in a dynamic export (:mod:`mmseg_cann.onnx.native_ops`):
an unconverted mmseg head and plain ``nn`` modules give one graph that is exact at every
size, or a ``ValueError`` naming the size-dependent rule -- never torch's generic
translation, which bakes the traced size in (a UPerHead traced at 32x32 gave max error
1.20 at 64x64 and onnxruntime ``GatherND ... invalid index`` at 48x48 and 96x96)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from tests._helpers import make_input

pytest.importorskip('onnxruntime')
pytest.importorskip('onnxscript')
from mmseg_cann.onnx import export_onnx  # noqa: E402
from mmseg_cann.onnx.export import dynamic_dims, run_onnx  # noqa: E402
from mmseg_cann.onnx.native_ops import native_ops_as_cann  # noqa: E402

class Head(nn.Module):
    """A decode head called with its feature maps as separate (dynamic) inputs."""

    def __init__(self, head):
        super().__init__()
        self.head = head

    def forward(self, *feats):
        return self.head(list(feats))


def _pyramid(size, n=1, seed=0, chs=(8, 16, 24, 32)):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(n, c, size // 2 ** i, size // 2 ** i, generator=g)
                 for i, c in enumerate(chs))


@pytest.mark.slow
def test_plain_uper_head_dynamic_export_is_exact_at_every_size():
    """The issue's head: pool scales (1, 2, 3, 6) on a 4x4 map at the traced size; at
    48/64/96 the last map is 6x6, 8x8, 12x12 (bins of other extents, some divisible)."""
    from mmengine.registry import init_default_scope
    from mmseg.registry import MODELS
    init_default_scope('mmseg')
    torch.manual_seed(0)
    head = Head(MODELS.build(dict(
        type='UPerHead', in_channels=[8, 16, 24, 32], in_index=[0, 1, 2, 3],
        pool_scales=(1, 2, 3, 6), channels=16, num_classes=5,
        norm_cfg=dict(type='BN', requires_grad=True)))).eval()
    proto = export_onnx(head, _pyramid(32), dynamic=True)
    assert 'GatherND' not in {n.op_type for n in proto.graph.node}
    for size, n in ((48, 1), (64, 2), (96, 1), (40, 1), (32, 1)):
        feats = _pyramid(size, n, seed=size)
        with torch.no_grad():
            expected = head(*feats)
        got, = run_onnx(proto, [f.numpy() for f in feats])
        # float32 rounding (torch.testing's float32 defaults): the fixed-shape export of
        # this head at these sizes differs from PyTorch by 5e-6..7e-6 (outputs up to 5)
        torch.testing.assert_close(torch.from_numpy(got), expected, msg=str(size))


class NativePyramid(nn.Module):
    """PSP-style bins with ``nn.AdaptiveAvgPool2d`` and ``F.interpolate`` back to the
    input size, then ``nn.MaxPool2d`` (ResNet stem), a ceil-mode ``nn.AvgPool2d`` and
    ``F.avg_pool2d``: every routed PyTorch call, none of them a CANN module."""

    def __init__(self, bins=(1, 2, 3, 6, (2, 5))):
        super().__init__()
        self.pools = nn.ModuleList([nn.AdaptiveAvgPool2d(b) for b in bins])
        self.stem = nn.MaxPool2d(3, 2, 1)
        self.avg = nn.AvgPool2d(2, 2, ceil_mode=True)

    def forward(self, x):
        up = [F.interpolate(p(x), size=x.shape[2:], mode='bilinear', align_corners=False)
              for p in self.pools]
        y = torch.cat([x] + up, 1)
        # APCHead's global context: a 1x1 map spread back with legacy nearest to a size
        spread = F.interpolate(self.pools[0](x), size=x.shape[2:], mode='nearest')
        return (self.stem(y), self.avg(y), F.avg_pool2d(y, 3, 1, 1, count_include_pad=False),
                F.interpolate(y, scale_factor=2, mode='nearest'), spread)


def test_native_modules_dynamic_export_matches_pytorch():
    model = NativePyramid().eval()
    proto = export_onnx(model, (make_input((1, 2, 4, 5)),), dynamic=True)
    assert all(isinstance(d, str) for d in dynamic_dims(proto)[0][2:])
    ops = {n.op_type for n in proto.graph.node}
    assert 'GatherND' not in ops and {'GlobalAveragePool', 'MatMul', 'MaxPool'} <= ops
    # bins smaller than, equal to and larger than the map; divisible and not; H or W 1
    for hw in [(1, 7), (2, 3), (3, 3), (5, 4), (6, 6), (7, 11), (12, 12), (13, 2)]:
        x = make_input((2, 2) + hw, seed=hw[0])
        with torch.no_grad():
            expected = model(x)
        got = run_onnx(proto, [x.numpy()])
        for e, g in zip(expected, got):
            assert g.shape == tuple(e.shape), hw
            assert float(np.abs(e.numpy() - g).max()) <= 1e-6, hw


@pytest.mark.parametrize('module,message', [
    (nn.MaxPool2d(2, 2, 1, ceil_mode=True), 'depends on the size'),
    (nn.AvgPool2d(4, 3, 2, ceil_mode=True), 'depends on the size'),
    (nn.Upsample(size=(7, 9), mode='nearest'), 'float32 ratio in/out'),
    (nn.Upsample(scale_factor=1.2, mode='bilinear'), 'keeps small sizes unchanged'),
    (nn.AdaptiveAvgPool2d((None, 3)), 'depends on the dynamic input'),
], ids=['maxpool-ceil', 'avgpool-ceil', 'nearest-size', 'scale-1.2', 'adaptive-none'])
def test_native_size_dependent_rules_are_refused(module, message):
    """The CANN ops' refusals apply to the same PyTorch modules, saying what to do."""
    x = make_input((1, 2, 5, 7))
    with pytest.raises(ValueError, match=message) as info:
        export_onnx(module.eval(), (x,), dynamic=True)
    assert 'fixed shapes' in str(info.value) or 'dynamic=False' in str(info.value)


def test_routing_is_pytorch_eagerly_and_leaves_other_calls_alone():
    """Under the mode each routed call equals PyTorch's; other ranks, integer inputs and
    unrouted functions run PyTorch's own op."""
    x = make_input((2, 3, 7, 9))
    calls = [lambda t: F.interpolate(t, size=(5, 11), mode='bicubic', align_corners=True),
             lambda t: F.interpolate(t, scale_factor=1.5, mode='nearest'),
             lambda t: F.adaptive_avg_pool2d(t, (3, 4)),
             lambda t: F.max_pool2d(t, 3, 2, 1, ceil_mode=True, return_indices=True),
             lambda t: F.avg_pool2d(t, 2, ceil_mode=True, count_include_pad=False),
             lambda t: F.avg_pool2d(t[0], 2),
             lambda t: F.interpolate(t[0], scale_factor=2.0, mode='linear'),
             lambda t: F.max_pool2d((t * 10).long(), 2),
             lambda t: F.adaptive_max_pool2d(t, 2)]
    for call in calls:
        expected = call(x)
        with native_ops_as_cann():
            got = call(x)
        expected = expected if isinstance(expected, tuple) else (expected,)
        got = got if isinstance(got, tuple) else (got,)
        for e, g in zip(expected, got):
            assert e.dtype == g.dtype and torch.equal(e, g)


def test_fixed_shape_export_keeps_torch_translation():
    """Routing applies to dynamic exports only: a fixed-shape export of native modules
    is torch's translation at the traced size (exact there)."""
    model = NativePyramid().eval()
    x = make_input((1, 2, 7, 11))
    proto = export_onnx(model, (x,))
    with torch.no_grad():
        expected = model(x)
    for e, g in zip(expected, run_onnx(proto, [x.numpy()])):
        assert float(np.abs(e.numpy() - g).max()) <= 1e-6
