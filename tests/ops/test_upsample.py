"""``mmseg_cann.ops.upsample`` against ``F.interpolate`` and the float64 reference."""
import math

import pytest
import torch
import torch.nn.functional as F

from mmseg_cann import ops
from mmseg_cann.core import reference as ref
from mmseg_cann.utils import fallback_counts, reset_fallbacks

from tests._helpers import (AWKWARD_SHAPES, MEMORY_FORMATS, UPSAMPLE_SETTINGS,
                            assert_same_layout, make_input, setting_id)

HALF = (torch.float16, torch.bfloat16)


def _pytorch_supports(setting, dtype):
    return not (setting.get('antialias') and dtype in HALF)  # no CPU half AA kernel


def _pytorch_aa_defect(setting, memory_format, in_hw, size):
    # see test_cpu_antialias_output_width_one_is_correct
    return (setting.get('antialias') and memory_format != 'channels_last' and size[1] == 1
            and size[0] != in_hw[0])


@pytest.mark.parametrize('setting', UPSAMPLE_SETTINGS, ids=setting_id)
@pytest.mark.parametrize('dtype', [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize('memory_format', MEMORY_FORMATS)
def test_bitwise_equal_to_pytorch(setting, dtype, memory_format):
    for i, ((hi, wi), size) in enumerate(AWKWARD_SHAPES):
        if _pytorch_aa_defect(setting, memory_format, (hi, wi), size):
            continue
        x = make_input((2, 3, hi, wi), dtype, memory_format, seed=i)
        if _pytorch_supports(setting, dtype):
            expected = F.interpolate(x, size=size, **setting)
        else:  # no CPU half antialias kernel: computed in float32 (see the fallback test)
            expected = F.interpolate(x.float(), size=size, **setting).to(dtype)
        got = ops.upsample(x, size=size, **setting)
        assert got.dtype == expected.dtype
        assert torch.equal(got, expected), (hi, wi, size)
        if min(hi, wi) > 1:
            assert_same_layout(got, expected)


@pytest.mark.parametrize('setting', UPSAMPLE_SETTINGS, ids=setting_id)
def test_float64_matches_reference(setting):
    for i, ((hi, wi), size) in enumerate(AWKWARD_SHAPES):
        x = make_input((2, 3, hi, wi), torch.float64, seed=i)
        got = ops.upsample(x, size=size, **setting)
        rule = 'exact' if setting['mode'].startswith('nearest') else 'pytorch'
        expected = ref.upsample(x, size=size, **setting, nearest_rule=rule)
        if setting['mode'].startswith('nearest'):
            # PyTorch maps float64 nearest indices in double precision: exact math here
            assert torch.equal(got, expected), (hi, wi, size)
        else:
            torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize('setting', UPSAMPLE_SETTINGS, ids=setting_id)
def test_float32_matches_reference_with_float32_index_rule(setting):
    for i, ((hi, wi), size) in enumerate(AWKWARD_SHAPES):
        x = make_input((1, 2, hi, wi), torch.float32, seed=i)
        got = ops.upsample(x, size=size, **setting).double()
        expected = ref.upsample(x, size=size, **setting)
        if setting['mode'].startswith('nearest'):
            assert torch.equal(got, expected), (hi, wi, size)
        else:  # float32 coordinates: error bounded by eps * in_size (see utils.parity)
            atol = 2e-6 + 16 * torch.finfo(torch.float32).eps * max(hi, wi)
            torch.testing.assert_close(got, expected, rtol=0, atol=atol)


@pytest.mark.parametrize('mode', ['nearest', 'nearest-exact', 'bilinear', 'bicubic', 'area'])
@pytest.mark.parametrize('scale', [1.5, 2.0, 2.3, 0.5, 1 / 3, 8.0, (2.0, 0.7)])
@pytest.mark.parametrize('recompute', [None, False, True])
def test_scale_factor_rules(mode, scale, recompute):
    x = make_input((1, 2, 7, 5), torch.float64)
    align = dict(align_corners=False) if mode in ('bilinear', 'bicubic') else {}
    kw = dict(scale_factor=scale, mode=mode, recompute_scale_factor=recompute, **align)
    expected = F.interpolate(x, **kw)
    got = ops.upsample(x, **kw)
    assert torch.equal(got, expected)
    rule = 'exact' if mode.startswith('nearest') else 'pytorch'
    torch.testing.assert_close(got, ref.upsample(x, **kw, nearest_rule=rule), rtol=0,
                               atol=1e-12)


def test_user_scale_maps_with_one_over_scale():
    # 7 * 2.3 -> 16 outputs; mapping with 1/2.3 differs from mapping with 7/16
    x = make_input((1, 1, 7, 7), torch.float64)
    by_scale = ops.upsample(x, scale_factor=2.3, mode='bilinear')
    by_size = ops.upsample(x, size=(16, 16), mode='bilinear')
    recomputed = ops.upsample(x, scale_factor=2.3, mode='bilinear', recompute_scale_factor=True)
    assert by_scale.shape == by_size.shape == (1, 1, 16, 16)
    assert not torch.allclose(by_scale, by_size)
    assert torch.equal(recomputed, by_size)


def test_uint8_nearest_and_empty_batch():
    labels = torch.randint(0, 19, (1, 1, 5, 7), dtype=torch.uint8)
    assert torch.equal(ops.upsample(labels, size=(10, 13)),
                       F.interpolate(labels, size=(10, 13)))
    for setting in UPSAMPLE_SETTINGS:
        x = torch.zeros(0, 3, 4, 5)
        assert ops.upsample(x, size=(8, 9), **setting).shape == (0, 3, 8, 9)


@pytest.mark.parametrize('mode', ['bilinear', 'bicubic'])
def test_cpu_antialias_output_width_one_is_correct(mode):
    """PyTorch's NCHW CPU antialias kernel is wrong for output width 1; we are not."""
    reset_fallbacks()
    for (hi, wi), (ho, wo) in [((3, 1), (2, 1)), ((5, 4), (2, 1)), ((2, 3), (5, 1))]:
        x = make_input((2, 3, hi, wi), torch.float64)
        got = ops.upsample(x, size=(ho, wo), mode=mode, antialias=True)
        torch.testing.assert_close(got, ref.upsample(x, size=(ho, wo), mode=mode, antialias=True),
                                   rtol=0, atol=1e-12)
        cl = x.contiguous(memory_format=torch.channels_last)  # PyTorch's other kernel agrees
        torch.testing.assert_close(got, F.interpolate(cl, size=(ho, wo), mode=mode,
                                                      antialias=True), rtol=0, atol=1e-12)
        assert got.is_contiguous()
        pytorch_nchw = F.interpolate(x, size=(ho, wo), mode=mode, antialias=True)
        assert not torch.allclose(pytorch_nchw, got)  # the defect this works around
    assert any('width 1' in reason for _, reason in fallback_counts())


def test_cpu_half_antialias_computes_in_float32_and_counts_the_fallback():
    reset_fallbacks()
    x = make_input((1, 2, 16, 16), torch.float16)
    got = ops.upsample(x, size=(5, 7), mode='bilinear', antialias=True)
    expected = F.interpolate(x.float(), size=(5, 7), mode='bilinear', antialias=True).half()
    assert got.dtype == torch.float16 and torch.equal(got, expected)
    assert any(op == 'upsample' for op, _ in fallback_counts())


@pytest.mark.parametrize('setting', UPSAMPLE_SETTINGS, ids=setting_id)
@pytest.mark.parametrize('backend', ['auto', 'reference'])
def test_gradcheck(setting, backend):
    x = make_input((1, 2, 3, 4), torch.float64).requires_grad_()
    for size in [(5, 7), (2, 3), (8, 8)]:
        assert torch.autograd.gradcheck(
            lambda t: ops.upsample(t, size=size, **setting, backend=backend), (x,))


@pytest.mark.parametrize('setting', UPSAMPLE_SETTINGS, ids=setting_id)
def test_gradients_equal_pytorch_and_reference(setting):
    x = make_input((2, 3, 5, 6), torch.float64).requires_grad_()
    grad_out = make_input((2, 3, 9, 4), torch.float64, seed=3)
    got, = torch.autograd.grad(ops.upsample(x, size=(9, 4), **setting), x, grad_out)
    expected, = torch.autograd.grad(F.interpolate(x, size=(9, 4), **setting), x, grad_out)
    assert torch.equal(got, expected)
    rule = 'exact' if setting['mode'].startswith('nearest') else 'pytorch'
    via_ref, = torch.autograd.grad(ref.upsample(x, size=(9, 4), **setting, nearest_rule=rule),
                                   x, grad_out)
    torch.testing.assert_close(got, via_ref, rtol=0, atol=1e-12)


def test_reference_backend_keeps_dtype_and_layout():
    x = make_input((1, 3, 5, 6), torch.float32, 'channels_last')
    y = ops.upsample(x, size=(7, 9), mode='bicubic', backend='reference')
    assert y.dtype == torch.float32
    assert y.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(y, F.interpolate(x, size=(7, 9), mode='bicubic'),
                               rtol=0, atol=1e-5)


def test_large_ratio_segmentation_head_shape():
    x = make_input((1, 19, 16, 32), torch.float32)
    y = ops.upsample(x, scale_factor=8, mode='bilinear', align_corners=False)
    assert y.shape == (1, 19, 128, 256)
    assert torch.equal(y, F.interpolate(x, scale_factor=8, mode='bilinear'))
    assert math.isfinite(float(y.abs().max()))


@pytest.mark.parametrize('mode, antialias', [('bilinear', False), ('bilinear', True),
                                             ('bicubic', False), ('bicubic', True),
                                             ('nearest', False), ('nearest-exact', False)])
def test_axis_with_unchanged_size_under_a_user_scale(mode, antialias):
    """PyTorch copies such an axis for bilinear, antialiased bicubic and legacy nearest."""
    x = make_input((1, 2, 5, 7), torch.float64)
    for scale in [(1.1, 1.1), (1.5, 1.1), (1.25, 1.0)]:
        kw = dict(scale_factor=scale, mode=mode)
        if mode in ('bilinear', 'bicubic'):
            kw['antialias'] = antialias
        got = ops.upsample(x, **kw)
        assert torch.equal(got, F.interpolate(x, **kw))
        if mode.startswith('nearest'):
            assert any(torch.equal(got, ref.upsample(x, **kw, nearest_rule=rule))
                       for rule in ('pytorch', 'exact'))
        else:
            torch.testing.assert_close(got, ref.upsample(x, **kw), rtol=0, atol=1e-12)
