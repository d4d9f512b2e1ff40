"""The NPU call planner's decisions, one row per rule, over capability tables (A2, A3,
910A, 310P, 310B, 950, torch_npu <= 2.8 and 26.x). Expected values come from the sources
the rules transcribe (docs/npu_backend.md lists them), not from the planner."""
import math

import numpy as np
import pytest
import torch

from mmseg_cann.backends import npu_plan as P
from mmseg_cann.backends.npu_device import DeviceCaps
from mmseg_cann.core import geometry as geo

A2, A3 = DeviceCaps.npu('A2', torch_npu='2.8.0'), DeviceCaps.npu('A3', torch_npu='2.8.0')
A2_26 = DeviceCaps.npu('A2', torch_npu='2.10.0')                      # op-plugin 26.x
A2_26C = DeviceCaps.npu('A2', torch_npu='2.10.0', compatible_impl=True)
A1, P310, B310 = DeviceCaps.npu('A1'), DeviceCaps.npu('310P'), DeviceCaps.npu('310B')
N950 = DeviceCaps.npu('950', torch_npu='2.10.0')
CPU = DeviceCaps('cpu', 'cpu')
F32, F16, BF16, F64 = torch.float32, torch.float16, torch.bfloat16, torch.float64


def up_spec(in_hw, mode='bilinear', align_corners=None, **kw):
    return geo.upsample_spec(in_hw, geo.check_upsample_args(mode=mode, align_corners=align_corners,
                                                            **kw))


def plan_up(in_hw, dtype=F32, caps=A2, fmt='contiguous', **kw):
    return P.plan_upsample(up_spec(in_hw, **kw), (1, 4) + tuple(in_hw), dtype, fmt, caps)


# (description, input HW, kwargs, dtype, caps, call, scales, fallback substring or None,
#  runs on CPU)
UPSAMPLE_RULES = [
    ('size call with consistent scales -> scale call, fast kernel',
     (16, 32), dict(size=(128, 256)), F32, A2, 'scales', (8.0, 8.0), None, False),
    ('A3 is 910B-class too', (16, 32), dict(size=(128, 256)), F32, A3, 'scales', (8.0, 8.0),
     None, False),
    ('uneven ratio 3x5 -> 7x11: scales out/in reproduce in/out',
     (3, 5), dict(size=(7, 11)), F32, A2, 'scales', (7 / 3, 11 / 5), None, False),
    ('scales (2.0, 2.0) are excluded (fp32)', (32, 64), dict(size=(64, 128)), F32, A2,
     'native', None, 'scales (2.0, 2.0)', False),
    ('scales (2.0, 2.0) are excluded (fp16)', (32, 64), dict(size=(64, 128)), F16, A2,
     'native', None, 'scales (2.0, 2.0)', False),
    ('bf16 size call is fast on torch_npu <= 2.8', (32, 64), dict(size=(64, 128)), BF16, A2,
     'native', None, None, False),
    ('bf16 on 26.x: the scale call, 2.0 allowed for bf16', (32, 64), dict(size=(64, 128)),
     BF16, A2_26, 'scales', (2.0, 2.0), None, False),
    ('one axis 2.0 does not leave the fast kernel', (32, 64), dict(size=(64, 256)), F32, A2,
     'scales', (2.0, 4.0), None, False),
    ('upscaling by 64 is fast (the limit is on downscaling)', (2, 2), dict(size=(128, 128)),
     F32, A2, 'scales', (64.0, 64.0), None, False),
    ('downscaling by 50 is still fast', (100, 100), dict(size=(2, 2)), F32, A2, 'scales',
     (0.02, 0.02), None, False),
    ('downscaling by 64 leaves the fast kernel', (128, 128), dict(size=(2, 2)), F32, A2,
     'native', None, 'source step 64 > 50', False),
    ('no scale reproduces in/out for 3 -> 29: the size call', (3, 3), dict(size=(29, 29)), F32,
     A2, 'native', None, 'no explicit scale', False),
    ('user scale keeps the user call (maps with 1/scale)', (7, 5),
     dict(scale_factor=1.5), F32, A2, 'native', None, None, False),
    ('user scales (2.0, 2.0) leave the fast kernel', (7, 5), dict(scale_factor=2.0), F32, A2,
     'native', None, 'scales (2.0, 2.0)', False),
    ('user scales (2.0, 2.5) stay fast', (7, 5), dict(scale_factor=(2.0, 2.5)), F32, A2,
     'native', None, None, False),
    ('align_corners=True: any s with floor(in*s)==out', (7, 7),
     dict(size=(8, 8), align_corners=True), F32, A2, 'scales', (8 / 7, 8 / 7), None, False),
    ('recompute_scale_factor=True maps with in/out: planned as a size call', (7, 5),
     dict(scale_factor=2.5, recompute_scale_factor=True), F32, A2, 'scales', (17 / 7, 12 / 5),
     None, False),
    ('nearest keeps the user call', (16, 32), dict(size=(128, 256), mode='nearest'), F32, A2,
     'native', None, None, False),
    ('antialias keeps the user call', (64, 64), dict(size=(16, 16), antialias=True), F32, A2,
     'native', None, None, False),
    ('bicubic size call 2 -> 82 reaches the fast kernel', (2, 2),
     dict(size=(82, 82), mode='bicubic'), F32, A2, 'native', None, None, False),
    ('bicubic downscaling by 45 leaves it (step > 40)', (90, 90),
     dict(size=(2, 2), mode='bicubic'), F32, A2, 'native', None, 'source step 45 > 40', False),
    ('bicubic with both steps 32 leaves it (both > 30)', (64, 64),
     dict(size=(2, 2), mode='bicubic'), F32, A2, 'native', None, 'both source steps > 30',
     False),
    ('bicubic with one step 32 stays fast', (64, 64), dict(size=(2, 64), mode='bicubic'), F32,
     A2, 'native', None, None, False),
    ('bicubic step exactly 40 stays fast', (80, 4), dict(size=(2, 4), mode='bicubic'), F32,
     A2, 'native', None, None, False),
    ('float64 bilinear: torch_npu rejects it, CPU', (16, 32), dict(size=(128, 256)), F64, A2,
     'native', None, 'float64', True),
    ('float64 bicubic: not listed, CPU', (16, 32), dict(size=(20, 40), mode='bicubic'), F64,
     A3, 'native', None, 'float64', True),
    ('910A size call: ResizeBilinearV2, exact', (16, 32), dict(size=(128, 256)), F32, A1,
     'native', None, None, False),
    ('910A user scale 1.5: ResizeBilinearV2 ignores it, CPU', (7, 5), dict(scale_factor=1.5),
     F32, A1, 'native', None, 'ignores scales', True),
    ('310P user scale 2.0 with 1/s == in/out: on the device', (8, 8), dict(scale_factor=2.0),
     F32, P310, 'native', None, None, False),
    ('310B user scale 2.5 with 1/s != in/out: CPU', (7, 5), dict(scale_factor=2.5), F32,
     B310, 'native', None, 'ignores scales', True),
    ('910A align_corners ignores the scale in PyTorch too', (7, 5),
     dict(scale_factor=1.5, align_corners=True), F32, A1, 'native', None, None, False),
    ('910A bf16 bilinear: computed in float32', (7, 5), dict(size=(10, 7)), BF16, A1,
     'native', None, 'bf16 is not supported', False),
    ('310P bf16 bicubic: computed in float32', (7, 5), dict(size=(10, 7), mode='bicubic'), BF16,
     P310, 'native', None, 'bf16 is not supported', False),
    ('950: the user call, no fast-path rules', (32, 64), dict(size=(64, 128)), F32, N950,
     'native', None, None, False),
    ('off Ascend: native call', (32, 64), dict(size=(64, 128)), F32, CPU, 'native', None, None,
     False),
]


@pytest.mark.parametrize('desc,in_hw,kw,dtype,caps,call,scales,fallback,cpu', UPSAMPLE_RULES,
                         ids=[r[0] for r in UPSAMPLE_RULES])
def test_upsample_rules(desc, in_hw, kw, dtype, caps, call, scales, fallback, cpu):
    plan = plan_up(in_hw, dtype, caps, **kw)
    assert plan.call == call, plan
    assert plan.on_cpu == cpu, plan
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


@pytest.mark.parametrize('in_hw,kw,dtype,caps,expect,forbid', [
    ((16, 32), dict(size=(128, 256)), F32, A2, ('UpsampleBilinear2d',), ('ResizeBilinearV2',)),
    ((32, 64), dict(size=(64, 128)), F32, A2, ('ResizeBilinearV2',), ('UpsampleBilinear2d',)),
    ((5, 7), dict(size=(5, 7)), F32, A2, (), ('ResizeBilinearV2',)),  # identity: no kernel
    ((2, 2), dict(size=(82, 82), mode='bicubic'), F32, A2, ('UpsampleBicubic2d',), ('ResizeD',)),
    ((90, 90), dict(size=(2, 2), mode='bicubic'), F32, A2, ('ResizeD',), ('UpsampleBicubic2d',)),
    ((16, 32), dict(size=(128, 256)), F32, A1, ('ResizeBilinearV2',), ()),
    ((16, 32), dict(size=(20, 40), mode='bicubic'), F32, A1, ('ResizeD',), ()),
    ((16, 32), dict(size=(20, 40), mode='bicubic'), F32, P310, ('UpsampleBicubic2d',), ()),
])
def test_upsample_plans_predict_the_trace(in_hw, kw, dtype, caps, expect, forbid):
    plan = plan_up(in_hw, dtype, caps, **kw)
    assert plan.expect == expect and plan.forbid == forbid, plan


def test_npu_upsample_keeps_the_layout():
    for fmt in ('contiguous', 'channels_last'):
        plan = plan_up((16, 32), fmt=fmt, size=(128, 256))
        assert plan.layout == 'keep'
        assert any('channels_last' in n for n in plan.notes) == (fmt == 'channels_last')


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
    assert P.passed_scales(spec) == (1.1, 2.5)  # PyTorch still passes the user scale


@pytest.mark.parametrize('in_hw,out_hw,scales,align,dtype,refused', [
    # ops-cv CheckBilinear2dScales / CheckScalesAndShapeValid, row by row
    ((8, 8), (16, 16), (2.0, 2.0), False, F32, 'scales (2.0, 2.0)'),
    ((8, 8), (16, 16), (2.0, 2.0), False, BF16, None),
    ((8, 8), (16, 16), (2.0 + 1e-10, 2.0), False, F16, 'scales (2.0, 2.0)'),  # |s-2| < 1e-9
    ((8, 8), (16, 24), (2.0, 3.0), False, F32, None),
    ((8, 8), (16, 16), (0.0, 2.0), False, F32, 'zero scale'),
    ((8, 8), (16, 16), (1.0, 1.0), False, F32, 'size call'),
    ((8, 8), (8, 8), (1.0, 1.0), False, F32, None),               # identity
    ((8, 8), (16, 16), (1.0, 1.0), False, BF16, 'CheckScalesAndShapeValid'),
    ((8, 8), (17, 16), (2.0, 2.0), False, BF16, 'CheckScalesAndShapeValid'),
    ((100, 8), (2, 16), (0.02, 2.0), False, F32, None),           # step 50
    ((102, 8), (2, 16), (2 / 102, 2.0), False, F32, 'source step 51 > 50'),
    ((102, 8), (2, 16), (2 / 102, 2.0), True, F32, 'source step 101 > 50'),
    ((8, 8), (16, 16), (2.0, 2.0), False, F64, 'not an AI-core dtype'),
])
def test_bilinear_fast_refusal_transcribes_ops_cv(in_hw, out_hw, scales, align, dtype, refused):
    reason = P.bilinear_fast_refusal(in_hw, out_hw, scales, align, dtype)
    assert (reason is None) if refused is None else (refused in reason), reason


@pytest.mark.parametrize('in_hw,out_hw,scales,align,steps', [
    ((5, 9), (9, 17), (0.0, 0.0), True, (0.5, 0.5)),          # (in-1)/(out-1)
    ((80, 6), (2, 4), (0.0, 0.0), False, (40.0, 1.5)),        # size call: in/out
    ((80, 6), (2, 4), (0.025, 0.5), False, (40.0, 2.0)),      # scale call: 1/s
    ((3, 3), (1, 1), (0.0, 0.0), True, (0.0, 0.0)),           # one output pixel
])
def test_bicubic_steps(in_hw, out_hw, scales, align, steps):
    assert P.bicubic_steps(in_hw, out_hw, scales, align) == pytest.approx(steps, rel=1e-7)


def test_upsample_candidates_have_no_layout_forms_on_the_npu():
    spec = up_spec((16, 32), size=(128, 256))
    on_npu = P.upsample_candidates(spec, (1, 3, 16, 32), F32, 'contiguous', A2)
    off_npu = P.upsample_candidates(spec, (1, 3, 16, 32), F32, 'contiguous', CPU)
    assert {p.layout for p in on_npu} == {'keep'}
    assert {p.layout for p in off_npu} == {'keep', 'to_channels_last'}
    assert {p.name for p in on_npu} == {'native', 'scales:8.0x8.0'}


# ----------------------------------------------------------------------------------
# max pooling
# ----------------------------------------------------------------------------------
def pool_spec(in_hw, k, s=None, p=0, d=1, ceil_mode=False):
    return geo.pool_spec(in_hw, geo.check_pool_args(k, s, p, d, ceil_mode))


MASK_3D = 'aclnnMaxPool2dWithMask -> MaxPool3DWithArgmaxV2'
MASK_V1 = 'MaxPoolWithArgmaxV1'
WITH_INDICES = 'aclnnMaxPool2dWithIndices -> MaxPool3DWithArgmaxV2'

MAX_RULES = [
    # desc, spec args, indices, dtype, caps, data (finite, fits), expected
    # (kernel substring or 'cpu', compute dtype, fallback substring)
    ('values only on A2: WithMask (composite max_pool2d)', (3, 2, 1), False, F32, A2, (None, None),
     (MASK_3D, None, None)),
    ('indices on A2 with op-plugin 7.x: still WithMask', (3, 2, 1), True, F32, A2, (None, None),
     (MASK_3D, None, None)),
    ('26.x without the compatible switch: WithMask', (3, 2, 1), True, F32, A2_26, (None, None),
     (MASK_3D, None, None)),
    ('26.x compatible, finite input: WithIndices', (3, 2, 1), True, F32, A2_26C, (True, None),
     (WITH_INDICES, None, None)),
    ('26.x compatible, NaN/-Inf input: CPU', (3, 2, 1), True, F32, A2_26C, (False, None),
     ('cpu', None, 'input holds NaN/-Inf')),
    ('26.x compatible, finiteness unknown: CPU', (3, 2, 1), True, F32, A2_26C, (None, None),
     ('cpu', None, 'may hold NaN/-Inf')),
    ('26.x compatible, values only: no check needed', (3, 2, 1), False, F32, A2_26C,
     (None, None), (WITH_INDICES, None, None)),
    ('Ascend950: WithIndices -> MaxPoolWithArgmaxV3', (3, 2, 1), True, F32, N950, (True, None),
     ('MaxPoolWithArgmaxV3', None, None)),
    ('1x1 window on A2: MaxPoolWithArgmaxV1', (1, 1, 0), False, F32, A2, (None, None),
     (MASK_V1, None, None)),
    ('dilation 2: the kernels take 1 only, CPU', (3, 1, 1, 2), True, F32, A2, (None, None),
     ('cpu', None, 'dilation 1 only')),
    ('dilation 2 on 950: on the device', (3, 1, 1, 2), False, F32, N950, (None, None),
     ('MaxPoolWithArgmaxV3', None, None)),
    ('float64: CPU', (3, 2, 1), False, F64, A2, (None, None), ('cpu', None, 'float64')),
    ('int8: float32 (always exact)', (3, 2, 1), True, torch.int8, A2, (None, None),
     (MASK_3D, 'float32', 'integer max pooling runs in float32')),
    ('int64 within 2**24: float32', (3, 2, 1), True, torch.int64, A2, (None, True),
     (MASK_3D, 'float32', 'integer max pooling runs in float32')),
    ('int64 beyond 2**24: CPU', (3, 2, 1), True, torch.int64, A2, (None, False),
     ('cpu', None, '|x| >= 2**24')),
    ('910A fp16: on the device (V1 on NC1HWC0)', (3, 2, 1), False, F16, A1, (None, None),
     (MASK_V1, None, None)),
    ('910A fp32 is computed in fp16 there: CPU', (3, 2, 1), False, F32, A1, (None, None),
     ('cpu', None, 'in float16')),
    ('910A bf16: CPU', (3, 2, 1), False, BF16, A1, (None, None), ('cpu', None, 'in float16')),
    ('910A int16 runs in float32, computed in fp16 there: CPU', (3, 2, 1), False, torch.int16,
     A1, (None, None), ('cpu', None, 'in float16')),
    ('310P fp16: float-only kernel, float32', (3, 2, 1), False, F16, P310, (None, None),
     (MASK_V1, 'float32', '310P max pooling takes float32 only')),
    ('310P bf16: float32', (3, 2, 1), False, BF16, P310, (None, None),
     (MASK_V1, 'float32', '310P')),
    ('310P fp32: as it is', (3, 2, 1), False, F32, P310, (None, None), (MASK_V1, None, None)),
    ('310B: not implemented, CPU', (3, 2, 1), False, F32, B310, (None, None),
     ('cpu', None, 'not implemented on 310B')),
    ('910A with 26.x compatible: WithIndices takes no dtype there, CPU', (3, 2, 1), True, F16,
     DeviceCaps.npu('A1', torch_npu='2.10', compatible_impl=True), (True, None),
     ('cpu', None, 'supports no dtype')),
    ('off Ascend: native', (3, 2, 1), True, F32, CPU, (None, None), ('aten', None, None)),
]


@pytest.mark.parametrize('desc,sargs,ri,dtype,caps,data,expected', MAX_RULES,
                         ids=[r[0] for r in MAX_RULES])
def test_max_pool_rules(desc, sargs, ri, dtype, caps, data, expected):
    spec = pool_spec((17, 23), *sargs)
    finite, fits = data
    plan = P.plan_max_pool2d(spec, ri, (2, 4, 17, 23), dtype, 'contiguous', caps,
                             finite=finite, int_fits_fp32=fits)
    kernel, compute, fallback = expected
    if kernel == 'cpu':
        assert plan.on_cpu, plan
    else:
        assert not plan.on_cpu and kernel in plan.kernel, plan
    assert plan.compute_dtype == compute, plan
    assert (plan.fallback is None) if fallback is None else (fallback in plan.fallback), plan
    assert plan.layout == 'keep'


@pytest.mark.parametrize('caps,ri,dtype,checks', [
    (A2, True, F32, (False, False)),       # a mask kernel: indices come from the CPU anyway
    (A2_26, True, F32, (False, False)),
    (A2_26C, True, F32, (True, False)),    # real indices possible: NaN/-Inf matters
    (A2_26C, False, F32, (False, False)),  # no indices wanted
    (A2_26C, True, F64, (False, False)),   # runs on the CPU whatever the data
    (N950, True, F16, (True, False)),
    (A2, False, torch.int32, (False, True)),
    (A2_26C, True, torch.int64, (False, True)),
    (A2, False, torch.int16, (False, False)),
    (CPU, True, torch.int64, (False, False)),
])
def test_max_pool_data_checks_only_where_the_plan_depends_on_them(caps, ri, dtype, checks):
    assert P.max_pool_data_checks(pool_spec((9, 9), 3, 2, 1), ri, dtype, caps) == checks


def test_same_padding_uses_the_lowest_finite_value_on_the_npu():
    asymmetric = pool_spec((17, 23), 2, 2, 'same')       # 17 -> 9 windows: padding at the end
    symmetric = pool_spec((17, 23), 3, 2, 'same')        # total padding 2: symmetric
    assert not asymmetric.torch_padding_ok and symmetric.torch_padding_ok
    plan = P.plan_max_pool2d(asymmetric, True, (1, 1, 17, 23), F32, 'contiguous', A2)
    assert plan.pad == 'lowest' and any('finfo' in n for n in plan.notes)
    assert P.plan_max_pool2d(symmetric, True, (1, 1, 17, 23), F32, 'contiguous', A2).pad is None
    assert P.plan_max_pool2d(asymmetric, True, (1, 1, 17, 23), F32, 'contiguous', CPU).pad is None


def test_max_pool_keeps_the_layout_on_the_npu_and_notes_the_mask():
    plan = P.plan_max_pool2d(pool_spec((9, 9), 3, 2, 1), True, (1, 2, 9, 9), F32,
                             'channels_last', A3)
    assert plan.layout == 'keep'
    assert any('TensorFactories' in n for n in plan.notes)
    assert any('int8 mask' in n for n in plan.notes)
    assert plan.expect == ('MaxPool3DWithArgmaxV2',)


# ----------------------------------------------------------------------------------
# average pooling
# ----------------------------------------------------------------------------------
def plan_avg(in_hw, sargs, dtype=F32, caps=A2, channels=4, cip=True, divisor=None,
             fmt='contiguous'):
    return P.plan_avg_pool2d(pool_spec(in_hw, *sargs), cip, divisor, (2, channels) + in_hw,
                             dtype, fmt, caps)


AVG_RULES = [
    # desc, input HW, spec args, dtype, caps, channels, divisor,
    # expected (path kernel substring, compute dtype, note substring)
    ('fp16 on the Cube path is averaged in fp32', (17, 23), (3, 2, 1), F16, A2, 4, None,
     ('Pooling (Cube)', 'float32', 'fp16 weight')),
    ('fp32 on the Cube path', (17, 23), (3, 2, 1), F32, A2, 4, None,
     ('Pooling (Cube)', None, None)),
    ('bf16 on the Cube path (the kernel casts to fp32)', (17, 23), (3, 2, 1), BF16, A2, 4, None,
     ('Pooling (Cube)', None, None)),
    ('a 1x9 window on a square-ish input stays on the Cube', (17, 23), ((1, 9), 1, 0), F16, A2,
     4, None, ('Pooling (Cube)', 'float32', None)),
    ('a long-strip input (W >= 2H) takes the vector path', (17, 34), (3, 2, 1), F16, A2, 4, None,
     ('AvgPool3D', None, 'long-strip')),
    ('W just below 2H stays on the Cube', (17, 33), (3, 2, 1), F32, A2, 4, None,
     ('Pooling (Cube)', None, None)),
    ('ceil_mode takes the vector path', (17, 23), (3, 2, 1, 1, True), F16, A2, 4, None,
     ('AvgPool3D', None, 'ceil_mode')),
    ('a kernel side of 256 takes the vector path', (300, 300), (256, 1, 0), F32, A2, 4, None,
     ('AvgPool3D', None, 'kernel side > 255')),
    ('20x20 = 400 cells, both sides <= 20: Cube', (300, 300), (20, 1, 0), F32, A2, 4, None,
     ('Pooling (Cube)', None, None)),
    ('15x17 = 255 cells: Cube', (300, 300), ((15, 17), 1, 0), F32, A2, 4, None,
     ('Pooling (Cube)', None, None)),
    ('16x21 = 336 cells with a side > 20: vector', (300, 300), ((16, 21), 1, 0), F32, A2, 4,
     None, ('AvgPool3D', None, 'kH*kW > 255')),
    ('divisor_override 256: vector', (17, 23), (3, 2, 1), F32, A2, 4, 256,
     ('AvgPool3D', None, 'divisor_override')),
    ('divisor_override -255: Cube', (17, 23), (3, 2, 1), F32, A2, 4, -255,
     ('Pooling (Cube)', None, None)),
    ('C = 65536: vector', (17, 23), (3, 2, 1), F32, A2, 65536, None, ('AvgPool3D', None, 'C >=')),
    ('C = 65535: Cube', (17, 23), (3, 2, 1), F32, A2, 65535, None, ('Pooling (Cube)', None, None)),
    ('a window covering the input: the global mean', (9, 13), ((9, 13), 1, 0), F16, A3, 4, None,
     ('ReduceMean', 'float32', 'global mean')),
    ('910A: Cube without the fp16 change (no fp32 Cube there)', (17, 23), (3, 2, 1), F16, A1, 4,
     None, ('Pooling (Cube)', None, None)),
    ('910A fp32 on the Cube: noted', (17, 23), (3, 2, 1), F32, A1, 4, None,
     ('Pooling (Cube)', None, 'no fp32 Cube')),
    ('910A kernel side 256: AI CPU', (300, 300), (256, 1, 0), F32, A1, 4, None,
     ('AI CPU', None, 'kernel side > 255')),
    ('310P 16x21 window with one output column: AI CPU', (40, 21), ((16, 21), 1, 0), F32, P310,
     4, None, ('AI CPU', None, 'kH*kW')),
    ('310P 16x21 window with more output columns: Cube', (40, 40), ((16, 21), 1, 0), F32, P310,
     4, None, ('Pooling (Cube)', None, None)),
    ('910A global mean of fp16: float32', (9, 9), (9, 1, 0), F16, A1, 4, None,
     ('ReduceMean', 'float32', None)),
    ('off Ascend: native', (17, 23), (3, 2, 1), F16, CPU, 4, None, ('native', None, None)),
]


@pytest.mark.parametrize('desc,in_hw,sargs,dtype,caps,channels,divisor,expected', AVG_RULES,
                         ids=[r[0] for r in AVG_RULES])
def test_avg_pool_rules(desc, in_hw, sargs, dtype, caps, channels, divisor, expected):
    plan = plan_avg(in_hw, sargs, dtype, caps, channels, divisor=divisor)
    kernel, compute, note = expected
    assert kernel in plan.kernel and plan.compute_dtype == compute, plan
    assert plan.layout == 'keep' and not plan.on_cpu
    if note is not None:
        assert any(note in n for n in plan.notes), plan


def test_avg_pool_same_without_count_include_pad_sums_in_float32():
    # native.avg_pool2d sums fp16 windows in float32 for this case: the kernel sees float32
    call = P.avg_kernel_call(pool_spec((17, 23), 2, 2, 'same'), False, None, (1, 1, 17, 23), F16)
    assert call == P.AvgKernelCall((18, 24), (0, 0), False, 1, F32)
    plan = plan_avg((17, 23), (2, 2, 'same'), F16, cip=False)
    assert plan.compute_dtype is None and 'Pooling (Cube)' in plan.kernel
    assert any('asymmetric' in n for n in plan.notes)


def test_avg_pool_float64_and_bf16_fallbacks():
    plan = plan_avg((17, 23), (3, 2, 1), F64)
    assert plan.on_cpu and 'float64' in plan.fallback
    plan = plan_avg((17, 23), (3, 2, 1), BF16, P310)
    assert plan.compute_dtype == 'float32' and 'bf16 is not supported' in plan.fallback


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


@pytest.mark.parametrize('in_hw,sargs,expect,forbid', [
    ((17, 23), (3, 2, 1), ('Pooling',), ('AvgPool3D',)),
    ((17, 23), (3, 2, 1, 1, True), ('AvgPool3D',), ('Pooling',)),
    ((9, 9), (9, 1, 0), ('ReduceMean',), ()),
])
def test_avg_pool_plans_predict_the_trace(in_hw, sargs, expect, forbid):
    plan = plan_avg(in_hw, sargs)
    assert plan.expect == expect and plan.forbid == forbid


@pytest.mark.parametrize('out,caps,call', [((1, 1), A2, 'mean'), ((1, 1), A1, 'mean'),
                                           ((2, 3), A2, 'native'), ((1, 1), CPU, 'native')])
def test_adaptive_avg_pool_rules(out, caps, call):
    plan = P.plan_adaptive_avg_pool2d(out, (1, 4, 9, 9), F32, 'contiguous', caps)
    assert plan.call == call
    if call == 'native' and caps.is_npu:
        assert any('channels-last' in n for n in plan.notes)


def test_pool_candidates_on_and_off_the_npu():
    assert P.pool_candidates('max_pool2d', 'contiguous', caps=A2) == ()
    assert P.pool_candidates('avg_pool2d', 'channels_last', caps=A2) == ()
    assert [p.name for p in P.pool_candidates('adaptive_avg_pool2d', 'contiguous', (1, 1), A2)] \
        == ['native', 'mean']
    assert [p.name for p in P.pool_candidates('max_pool2d', 'channels_last', caps=CPU)] == \
        ['native', 'native:to_nchw']


def test_plans_are_frozen_and_named():
    plan = plan_up((16, 32), size=(128, 256))
    with pytest.raises(Exception):
        plan.call = 'size'
    assert plan.name == 'scales:8.0x8.0'
    assert 'UpsampleBilinear2d (fast' in plan.describe()
    cpu = plan_up((16, 32), F64, size=(128, 256))
    assert cpu.name == 'native:cpu' and '[fallback: float64' in cpu.describe()
    same = P.plan_max_pool2d(pool_spec((9, 9), 2, 2, 'same'), False, (1, 1, 9, 9), torch.int8,
                             'contiguous', A2)
    assert same.name == 'native:float32:pad_lowest'


@pytest.mark.parametrize('bad,match', [
    (dict(memory_format='nhwc'), 'memory_format'), (dict(dtype='float32'), 'dtype'),
    (dict(caps='A2'), 'caps'), (dict(shape=(4, 4)), 'shape')])
def test_planner_rejects_bad_arguments(bad, match):
    kw = dict(shape=(1, 1, 4, 4), dtype=F32, memory_format='contiguous', caps=A2)
    kw.update(bad)
    with pytest.raises((TypeError, ValueError), match=match):
        P.plan_upsample(up_spec((4, 4), size=(8, 8)), kw['shape'], kw['dtype'],
                        kw['memory_format'], kw['caps'])
