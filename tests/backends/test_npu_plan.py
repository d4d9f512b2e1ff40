"""The NPU call planner's decisions, one row per documented rule (docs/design.md 2.3)."""
import math

import numpy as np
import pytest
import torch

from mmseg_cann.backends import npu_plan as P
from mmseg_cann.backends.npu_device import DeviceCaps
from mmseg_cann.core import geometry as geo

A2, A3, A1 = DeviceCaps.npu('A2'), DeviceCaps.npu('A3'), DeviceCaps.npu('A1')
CPU = DeviceCaps('cpu', 'cpu')
F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16


def up_spec(in_hw, mode='bilinear', align_corners=None, **kw):
    return geo.upsample_spec(in_hw, geo.check_upsample_args(mode=mode, align_corners=align_corners,
                                                            **kw))


def plan_up(in_hw, dtype=F32, caps=A2, fmt='contiguous', **kw):
    return P.plan_upsample(up_spec(in_hw, **kw), (1, 4) + tuple(in_hw), dtype, fmt, caps)


# (description, input HW, kwargs, dtype, caps, expected call, expected scales,
#  fallback substring or None)
UPSAMPLE_RULES = [
    ('size call with consistent scales -> scale call, fast kernel',
     (16, 32), dict(size=(128, 256)), F32, A2, 'scales', (8.0, 8.0), None),
    ('A3 is 910B-class too', (16, 32), dict(size=(128, 256)), F32, A3, 'scales', (8.0, 8.0), None),
    ('uneven ratio 3x5 -> 7x11: scales out/in reproduce in/out',
     (3, 5), dict(size=(7, 11)), F32, A2, 'scales', (7 / 3, 11 / 5), None),
    ('scale exactly 2.0 is excluded (fp32)', (32, 64), dict(size=(64, 128)), F32, A2,
     'size', None, 'scale exactly 2.0'),
    ('scale exactly 2.0 is excluded (fp16)', (32, 64), dict(size=(64, 128)), F16, A2,
     'size', None, 'scale exactly 2.0'),
    ('scale exactly 2.0 is allowed in bf16', (32, 64), dict(size=(64, 128)), BF16, A2,
     'scales', (2.0, 2.0), None),
    ('one axis 2.0 is enough to leave the fast kernel', (32, 64), dict(size=(64, 256)), F32,
     A2, 'size', None, 'scale exactly 2.0'),
    ('effective scale 50 is still fast', (2, 2), dict(size=(100, 100)), F32, A2, 'scales',
     (50.0, 50.0), None),
    ('effective scale 64 > 50 falls back', (2, 2), dict(size=(128, 128)), F32, A2, 'size',
     None, '> 50'),
    ('bicubic 40 is fast', (2, 2), dict(size=(80, 80), mode='bicubic'), F32, A2, 'scales',
     (40.0, 40.0), None),
    ('bicubic 41 > 40 falls back', (2, 2), dict(size=(82, 82), mode='bicubic'), F32, A2,
     'size', None, '> 40'),
    ('no scale reproduces in/out for 3 -> 29: size call', (3, 3), dict(size=(29, 29)), F32,
     A2, 'size', None, 'no explicit scale'),
    ('user scale keeps the user call (maps with 1/scale)', (7, 5),
     dict(scale_factor=1.5), F32, A2, 'native', None, None),
    ('user scale 2.0 falls back (the user call passes 2.0)', (7, 5),
     dict(scale_factor=2.0), F32, A2, 'native', None, 'scale exactly 2.0'),
    ('align_corners=True: any s with floor(in*s)==out', (7, 7),
     dict(size=(8, 8), align_corners=True), F32, A2, 'scales', (8 / 7, 8 / 7), None),
    ('recompute_scale_factor=True maps with in/out: planned as a size call', (7, 5),
     dict(scale_factor=2.5, recompute_scale_factor=True), F32, A2, 'scales', (17 / 7, 12 / 5),
     None),
    ('nearest keeps the user call', (16, 32), dict(size=(128, 256), mode='nearest'), F32, A2,
     'native', None, None),
    ('antialias keeps the user call', (64, 64), dict(size=(16, 16), antialias=True), F32, A2,
     'native', None, None),
    ('older chips: native call, no fast-path rules', (16, 32), dict(size=(128, 256)), F32, A1,
     'native', None, None),
    ('off Ascend: native call', (32, 64), dict(size=(64, 128)), F32, CPU, 'native', None, None),
]


@pytest.mark.parametrize('desc,in_hw,kw,dtype,caps,call,scales,fallback', UPSAMPLE_RULES,
                         ids=[r[0] for r in UPSAMPLE_RULES])
def test_upsample_rules(desc, in_hw, kw, dtype, caps, call, scales, fallback):
    plan = plan_up(in_hw, dtype, caps, **kw)
    assert plan.call == call, plan
    if scales is not None:
        assert plan.scales == pytest.approx(scales, rel=1e-15, abs=0), plan
    if fallback is None:
        assert plan.fallback is None, plan
    else:
        assert fallback in plan.fallback, plan
    if plan.scales is not None:
        # every explicit scale reproduces the output size, as PyTorch computes it
        spec = up_spec(in_hw, **kw)
        assert tuple(math.floor(float(i) * s) for i, s in zip(in_hw, plan.scales)) == spec.out_size


def test_upsample_takes_nchw_and_nhwc_without_conversion():
    for fmt in ('contiguous', 'channels_last'):
        assert plan_up((16, 32), fmt=fmt, size=(128, 256)).layout == 'keep'


def test_consistent_scales_match_coordinates_in_float32_and_float64():
    # the rule checked independently of the planner: 1/s equals in/out in both precisions
    found = missing = 0
    for n_in in range(1, 40):
        for n_out in range(1, 120):
            spec = up_spec((n_in, n_in), size=(n_out, n_out))
            scales = P.consistent_scales(spec)
            if scales is None:
                missing += 1
                continue
            found += 1
            s = scales[0]
            assert math.floor(n_in * s) == n_out
            assert 1.0 / s == n_in / n_out
            assert np.float32(1.0 / s) == np.float32(n_in) / np.float32(n_out)
    assert found > 3000 and missing > 0  # both outcomes occur


def test_bilinear_axis_copied_by_pytorch_gets_scale_one():
    spec = up_spec((5, 7), scale_factor=(1.1, 2.5))  # H: floor(5*1.1) = 5, copied by PyTorch
    assert spec.out_size == (5, 17)
    assert P.consistent_scales(spec) == (1.0, 2.5)


# ----------------------------------------------------------------------------------
# pooling
# ----------------------------------------------------------------------------------
def pool_spec(in_hw, k, s=None, p=0, d=1, ceil_mode=False):
    return geo.pool_spec(in_hw, geo.check_pool_args(k, s, p, d, ceil_mode))


MAX_RULES = [
    # desc, spec args, return_indices, fmt, caps, finite, expected (layout, on_cpu, fallback)
    ('values only: aclnnMaxPool2d', (3, 2, 1), False, 'contiguous', A2, None,
     ('keep', False, None)),
    ('channels_last converted to NCHW', (3, 2, 1), False, 'channels_last', A2, None,
     ('to_nchw', False, None)),
    ('indices on A2, finite input: aclnnMaxPool2dWithIndices', (3, 2, 1), True, 'contiguous',
     A2, True, ('keep', False, None)),
    ('indices with channels_last: converted, still WithIndices', (3, 2, 1), True,
     'channels_last', A3, True, ('to_nchw', False, None)),
    ('indices with NaN/-Inf: CPU fallback', (3, 2, 1), True, 'contiguous', A2, False,
     ('keep', True, 'NaN/-Inf')),
    ('indices, finiteness unknown: CPU fallback', (3, 2, 1), True, 'contiguous', A2, None,
     ('keep', True, 'NaN/-Inf')),
    ('indices with dilation 2: CPU fallback', (3, 1, 1, 2), True, 'contiguous', A2, True,
     ('keep', True, 'dilation 1 only')),
    ('indices with asymmetric SAME padding (-inf pad): CPU fallback', (2, 2, 'same'), True,
     'contiguous',
     A2, True, ('keep', True, '-inf padding')),
    ('indices on an A1 chip: CPU fallback', (3, 2, 1), True, 'contiguous', A1, True,
     ('keep', True, 'A2/A3')),
    ('off Ascend: native', (3, 2, 1), True, 'channels_last', CPU, None, ('keep', False, None)),
]


@pytest.mark.parametrize('desc,sargs,ri,fmt,caps,finite,expected', MAX_RULES,
                         ids=[r[0] for r in MAX_RULES])
def test_max_pool_rules(desc, sargs, ri, fmt, caps, finite, expected):
    spec = pool_spec((17, 23), *sargs)
    plan = P.plan_max_pool2d(spec, ri, (2, 4, 17, 23), F32, fmt, caps, finite=finite)
    layout, on_cpu, fallback = expected
    assert (plan.layout, plan.indices_on_cpu) == (layout, on_cpu), plan
    assert (plan.fallback is None) if fallback is None else (fallback in plan.fallback), plan


AVG_RULES = [
    # desc, spec args, dtype, fmt, caps, expected (layout, compute dtype, kernel substr,
    # fallback substr, note substr)
    ('fp16 on the Cube path is averaged in fp32', (3, 2, 1), F16, 'contiguous', A2,
     ('keep', 'float32', 'Cube path in fp32', None, 'fp16 weight')),
    ('fp32 on the Cube path', (3, 2, 1), F32, 'contiguous', A2,
     ('keep', None, 'Cube path', None, None)),
    ('bf16 is not changed', (3, 2, 1), BF16, 'contiguous', A2,
     ('keep', None, 'Cube path', None, None)),
    ('ceil_mode leaves the Cube path (vector path sums in fp32)', (3, 2, 1, 1, True), F16,
     'contiguous', A2, ('keep', None, 'vector path', None, 'ceil_mode')),
    ('strip window leaves the Cube path', ((1, 9), 1, 0), F16, 'contiguous', A2,
     ('keep', None, 'vector path', None, 'strip')),
    ('channels_last converted to NCHW', (3, 2, 1), F32, 'channels_last', A2,
     ('to_nchw', None, 'Cube path', None, 'NCHW only')),
    ('asymmetric SAME padding applied explicitly', (2, 2, 'same_lower'), F32, 'contiguous', A2,
     ('keep', None, 'Cube path', None, 'asymmetric')),
    ('older chip: plain aclnnAvgPool2d, no fp16 change', (3, 2, 1), F16, 'contiguous', A1,
     ('keep', None, 'aclnnAvgPool2d', None, None)),
    ('off Ascend: native', (3, 2, 1), F16, 'channels_last', CPU,
     ('keep', None, 'native', None, None)),
]


@pytest.mark.parametrize('desc,sargs,dtype,fmt,caps,expected', AVG_RULES,
                         ids=[r[0] for r in AVG_RULES])
def test_avg_pool_rules(desc, sargs, dtype, fmt, caps, expected):
    spec = pool_spec((17, 23), *sargs)
    plan = P.plan_avg_pool2d(spec, True, None, (2, 4, 17, 23), dtype, fmt, caps)
    layout, compute, kernel, fallback, note = expected
    assert plan.layout == layout and plan.compute_dtype == compute, plan
    assert kernel in plan.kernel, plan
    assert (plan.fallback is None) if fallback is None else (fallback in plan.fallback), plan
    if note is not None:
        assert any(note in n for n in plan.notes), plan


def test_avg_pool_kernel_above_255_leaves_the_cube_path():
    spec = pool_spec((300, 300), 256, 1, 0)
    plan = P.plan_avg_pool2d(spec, True, None, (1, 1, 300, 300), F16, 'contiguous', A2)
    assert 'vector path' in plan.kernel and plan.compute_dtype is None
    assert any('kernel > 255' in n for n in plan.notes)


def test_avg_pool_padding_above_half_kernel_is_a_fallback():
    # geometry rejects it for user input; a spec built directly (as SAME-like padding
    # could be) must still never reach aclnnAvgPool2d with padding > kernel/2
    args = geo.PoolArgs((3, 3), (1, 1), (2, 2), (1, 1), False)
    spec = geo.PoolSpec(args, (9, 9), (11, 11), (2, 2), (2, 2))
    plan = P.plan_avg_pool2d(spec, True, None, (1, 1, 9, 9), F32, 'contiguous', A2)
    assert 'padding > kernel/2' in plan.fallback


def test_avg_pool_divisor_override_zero_is_rejected():
    with pytest.raises(ValueError, match='divisor_override'):
        P.plan_avg_pool2d(pool_spec((8, 8), 2), True, 0, (1, 1, 8, 8), F32, 'contiguous', A2)


@pytest.mark.parametrize('out,caps,call', [((1, 1), A2, 'mean'), ((1, 1), A1, 'mean'),
                                           ((2, 3), A2, 'native'), ((1, 1), CPU, 'native')])
def test_adaptive_avg_pool_rules(out, caps, call):
    plan = P.plan_adaptive_avg_pool2d(out, (1, 4, 9, 9), F32, 'contiguous', caps)
    assert plan.call == call
    if call == 'native' and caps.is_npu:
        assert any('channels-last' in n for n in plan.notes)


def test_plans_are_frozen_and_named():
    plan = plan_up((16, 32), size=(128, 256))
    with pytest.raises(Exception):
        plan.call = 'size'
    assert plan.name == 'scales:8.0x8.0'
    assert 'fast fp32-compute' in plan.describe()


@pytest.mark.parametrize('bad,match', [
    (dict(memory_format='nhwc'), 'memory_format'), (dict(dtype='float32'), 'dtype'),
    (dict(caps='A2'), 'caps'), (dict(shape=(4, 4)), 'shape')])
def test_planner_rejects_bad_arguments(bad, match):
    kw = dict(shape=(1, 1, 4, 4), dtype=F32, memory_format='contiguous', caps=A2)
    kw.update(bad)
    with pytest.raises((TypeError, ValueError), match=match):
        P.plan_upsample(up_spec((4, 4), size=(8, 8)), kw['shape'], kw['dtype'],
                        kw['memory_format'], kw['caps'])


def test_symmetric_same_padding_is_a_direct_call_with_indices():
    spec = pool_spec((17, 23), 3, 2, 'same')  # total padding 2 on both axes: symmetric
    assert spec.torch_padding_ok
    plan = P.plan_max_pool2d(spec, True, (1, 1, 17, 23), F32, 'contiguous', A2, finite=True)
    assert plan.fallback is None and 'WithIndices' in plan.kernel
