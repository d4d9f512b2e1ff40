"""The executor runs every plan's call form with PyTorch's CPU ops: planner + executor
end to end on CPU, bit for bit equal to the native backend (values, indices, layout)."""
import logging

import pytest
import torch

from mmseg_cann import ops
from mmseg_cann.backends import npu, npu_plan as P
from mmseg_cann.backends.npu_device import DeviceCaps
from mmseg_cann.core import geometry as geo
from mmseg_cann.utils import fallback_counts, reset_fallbacks

from tests._helpers import AWKWARD_SHAPES, make_input

CHIPS = [DeviceCaps.npu('A2'), DeviceCaps.npu('A3'), DeviceCaps.npu('A1'), DeviceCaps('cpu', 'cpu')]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def same_layout(a, b):
    """Equal strides on every dimension longer than 1 (size-1 strides are arbitrary)."""
    return all(sa == sb for sa, sb, n in zip(a.stride(), b.stride(), a.shape) if n > 1)


def assert_bitwise(out, ref):
    if isinstance(ref, tuple):
        for o, r in zip(out, ref):
            assert_bitwise(o, r)
        return
    assert out.dtype == ref.dtype and out.shape == ref.shape
    assert torch.equal(out, ref)
    assert same_layout(out, ref)


UP_CALLS = [dict(mode='bilinear'), dict(mode='bilinear', align_corners=True),
            dict(mode='bicubic'), dict(mode='bicubic', align_corners=True),
            dict(mode='nearest'), dict(mode='bilinear', antialias=True)]
EXTRA_SHAPES = [((16, 32), (128, 256)), ((32, 64), (64, 128)), ((3, 3), (29, 29)),
                ((13, 17), (97, 129))]


@pytest.mark.parametrize('caps', CHIPS, ids=str)
@pytest.mark.parametrize('call', UP_CALLS, ids=lambda c: '-'.join(map(str, c.values())))
def test_upsample_plans_equal_native(caps, call):
    for fmt in ('contiguous', 'channels_last'):
        for dtype in DTYPES:
            for (hi, wi), (ho, wo) in AWKWARD_SHAPES + EXTRA_SHAPES:
                x = make_input((1, 3, hi, wi), dtype, fmt)
                spec = geo.upsample_spec((hi, wi), geo.check_upsample_args(size=(ho, wo), **call))
                plan = P.plan_upsample(spec, tuple(x.shape), dtype, fmt, caps)
                ref = ops.upsample(x, (ho, wo), precision='input', backend='native', **call)
                assert_bitwise(npu.execute_upsample(plan, x, spec), ref)


@pytest.mark.parametrize('scale,rc', [(1.5, None), (2.0, None), (2.5, True), (0.5, None),
                                      ((1.1, 2.5), None)])
def test_upsample_scale_calls_equal_native(scale, rc):
    x = make_input((2, 3, 7, 5))
    for mode in ('bilinear', 'bicubic'):
        args = geo.check_upsample_args(scale_factor=scale, mode=mode, recompute_scale_factor=rc)
        spec = geo.upsample_spec((7, 5), args)
        for plan in (P.plan_upsample(spec, tuple(x.shape), x.dtype, 'contiguous', CHIPS[0]),) + \
                P.upsample_candidates(spec, tuple(x.shape), x.dtype, 'contiguous'):
            ref = ops.upsample(x, scale_factor=scale, mode=mode, recompute_scale_factor=rc,
                               backend='native')
            assert_bitwise(npu.execute_upsample(plan, x, spec), ref)


POOLS = [(3, 2, 1, 1, False), (3, 2, 1, 1, True), (2, 2, 'same', 1, False),
         (3, 1, 1, 2, False), ((1, 9), 1, 0, 1, False), (5, 2, 2, 1, True)]


@pytest.mark.parametrize('caps', CHIPS, ids=str)
@pytest.mark.parametrize('k,s,p,d,cm', POOLS)
def test_pool_plans_equal_native(caps, k, s, p, d, cm):
    for fmt in ('contiguous', 'channels_last'):
        for dtype in DTYPES:
            x = make_input((2, 4, 17, 23), dtype, fmt)
            spec = geo.pool_spec((17, 23), geo.check_pool_args(k, s, p, d, cm))
            for finite in (True, False):
                plan = P.plan_max_pool2d(spec, True, tuple(x.shape), dtype, fmt, caps,
                                         finite=finite)
                ref = ops.max_pool2d(x, k, s, p, d, cm, True, backend='native')
                assert_bitwise(npu.execute_max_pool2d(plan, x, spec, True), ref)
            if d != 1:
                continue
            for cip in (True, False):
                plan = P.plan_avg_pool2d(spec, cip, None, tuple(x.shape), dtype, fmt, caps)
                # precision='input': fp16 reaches the backend, where the plan may average
                # in fp32; PyTorch's own fp16 kernel accumulates in fp32 too
                ref = ops.avg_pool2d(x, k, s, p, cm, cip, precision='input', backend='native')
                assert_bitwise(npu.execute_avg_pool2d(plan, x, spec, cip), ref)


@pytest.mark.parametrize('out', [(1, 1), (2, 3), (6, 6)])
def test_adaptive_plans_equal_native(out):
    for fmt in ('contiguous', 'channels_last'):
        x = make_input((2, 4, 9, 13), torch.float32, fmt)
        ref = ops.adaptive_avg_pool2d(x, out, backend='native')
        plan = P.plan_adaptive_avg_pool2d(out, tuple(x.shape), x.dtype, fmt, CHIPS[0])
        assert plan.call == ('mean' if out == (1, 1) else 'native')
        assert_bitwise(npu.execute_adaptive_avg_pool2d(plan, x, out), ref)
        # the mean in the input's own layout is what ATen runs; in the other layout the
        # reduction order differs (the tuner rejects such candidates, see test_tuned)
        same = [p for p in P.pool_candidates('adaptive_avg_pool2d', fmt, out)
                if p.layout == 'keep']
        for plan in same:
            assert_bitwise(npu.execute_adaptive_avg_pool2d(plan, x, out), ref)


def test_npu_backend_on_cpu_equals_native_through_the_ops():
    x = make_input((2, 3, 12, 16), torch.float32, 'channels_last')
    pairs = [
        lambda b: ops.upsample(x, size=(96, 128), mode='bilinear', backend=b),
        lambda b: ops.max_pool2d(x, 3, 2, 1, return_indices=True, backend=b),
        lambda b: ops.avg_pool2d(x, 3, 2, 1, backend=b),
        lambda b: ops.adaptive_avg_pool2d(x, 1, backend=b),
    ]
    for run in pairs:
        assert_bitwise(run('npu'), run('native'))
        assert_bitwise(run('auto'), run('native'))


def test_gradients_flow_through_plans():
    x = make_input((1, 2, 5, 6)).requires_grad_()
    spec = geo.upsample_spec((5, 6), geo.check_upsample_args(size=(15, 18), mode='bilinear'))
    plan = P.plan_upsample(spec, (1, 2, 5, 6), x.dtype, 'contiguous', CHIPS[0])
    assert plan.call == 'scales'
    npu.execute_upsample(plan, x, spec).sum().backward()
    x2 = x.detach().clone().requires_grad_()
    ops.upsample(x2, size=(15, 18), mode='bilinear').sum().backward()
    assert torch.equal(x.grad, x2.grad)


def test_fallback_plans_are_counted_and_logged_once_per_call_site(caplog):
    reset_fallbacks()
    x = make_input((1, 2, 32, 64))
    spec = geo.upsample_spec((32, 64), geo.check_upsample_args(size=(64, 128), mode='bilinear'))
    plan = P.plan_upsample(spec, tuple(x.shape), x.dtype, 'contiguous', CHIPS[0])
    assert 'scale exactly 2.0' in plan.fallback
    with caplog.at_level(logging.WARNING, logger='mmseg_cann'):
        for _ in range(3):
            npu.execute_upsample(plan, x, spec)  # one call site
        npu.execute_upsample(plan, x, spec)      # a second call site
    assert fallback_counts()[('upsample', plan.fallback)] == 4
    logged = [r for r in caplog.records if 'scale exactly 2.0' in r.getMessage()]
    assert len(logged) == 2
    assert all('test_npu_executor.py' in r.getMessage() for r in logged)


def test_non_int64_indices_from_the_device_are_replaced():
    # the executor's guard for torch_npu's int8 mask: simulate a device returning a mask
    x = make_input((1, 2, 9, 9))
    spec = geo.pool_spec((9, 9), geo.check_pool_args(3, 2, 1))
    plan = P.plan_max_pool2d(spec, True, (1, 2, 9, 9), x.dtype, 'contiguous', CHIPS[0],
                             finite=True)
    original = npu.native.max_pool2d
    reset_fallbacks()

    calls = []

    def masked(inp, sp, ri=False):  # the device's answer first, then the CPU's
        calls.append(inp.device)
        values, index = original(inp, sp, ri)
        return (values, index.to(torch.int8)) if len(calls) == 1 else (values, index)

    try:
        npu.native.max_pool2d = masked
        values, index = npu.execute_max_pool2d(plan, x, spec, True)
    finally:
        npu.native.max_pool2d = original
    ref = ops.max_pool2d(x, 3, 2, 1, return_indices=True, backend='native')
    assert index.dtype == torch.int64 and torch.equal(index, ref[1])
    assert torch.equal(values, ref[0]) and len(calls) == 2
    assert any('mask' in reason for _, reason in fallback_counts())
