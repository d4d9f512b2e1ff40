"""The executor runs every plan's call form with PyTorch's CPU ops: planner + executor
end to end on CPU, bit for bit equal to the native backend (values, indices, layout),
over the capability tables; and its handling of what a device returns as max-pool
indices (an int8 mask, int32 indices)."""
import logging
import math

import pytest
import torch
import torch.nn.functional as F

from mmseg_cann import ops
from mmseg_cann.backends import native, npu, npu_plan as P
from mmseg_cann.backends.npu_device import DeviceCaps
from mmseg_cann.core import geometry as geo
from mmseg_cann.utils import fallback_counts, reset_fallbacks

from tests._helpers import AWKWARD_SHAPES, make_input

CHIPS = [DeviceCaps.npu('A2', torch_npu='2.8'), DeviceCaps.npu('A3', torch_npu='2.10'),
         DeviceCaps.npu('A2', torch_npu='2.10', compatible_impl=True), DeviceCaps.npu('A1'),
         DeviceCaps.npu('310P'), DeviceCaps('cpu', 'cpu')]
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
                out = npu.execute_upsample(plan, x, spec)
                if plan.compute_dtype:  # bf16 computed in float32 (910A/310P): one rounding
                    assert torch.equal(out, ops.upsample(x.float(), (ho, wo), backend='native',
                                                         **call).to(dtype))
                    continue
                assert_bitwise(out, ref)


@pytest.mark.parametrize('scale,rc', [(1.5, None), (2.0, None), (2.5, True), (0.5, None),
                                      ((1.1, 2.5), None)])
def test_upsample_scale_calls_equal_native(scale, rc):
    x = make_input((2, 3, 7, 5))
    for mode in ('bilinear', 'bicubic'):
        args = geo.check_upsample_args(scale_factor=scale, mode=mode, recompute_scale_factor=rc)
        spec = geo.upsample_spec((7, 5), args)
        ref = ops.upsample(x, scale_factor=scale, mode=mode, recompute_scale_factor=rc,
                           backend='native')
        plans = [P.plan_upsample(spec, tuple(x.shape), x.dtype, 'contiguous', caps)
                 for caps in CHIPS] + list(P.upsample_candidates(spec, tuple(x.shape), x.dtype,
                                                                  'contiguous'))
        for plan in plans:
            assert_bitwise(npu.execute_upsample(plan, x, spec), ref)


def test_cpu_fallback_plans_run_and_are_recorded():
    reset_fallbacks()
    x = make_input((1, 2, 7, 5), torch.float64)
    spec = geo.upsample_spec((7, 5), geo.check_upsample_args(size=(15, 11), mode='bilinear'))
    plan = P.plan_upsample(spec, tuple(x.shape), x.dtype, 'contiguous', CHIPS[0])
    assert plan.on_cpu
    assert_bitwise(npu.execute_upsample(plan, x, spec),
                   ops.upsample(x, (15, 11), mode='bilinear', backend='native'))
    assert fallback_counts() == {('upsample', plan.fallback): 1}


POOLS = [(3, 2, 1, 1, False), (3, 2, 1, 1, True), (2, 2, 'same', 1, False),
         (2, 2, 'same_lower', 1, False), (3, 1, 1, 2, False), ((1, 9), 1, 0, 1, False),
         (5, 2, 2, 1, True)]


@pytest.mark.parametrize('caps', CHIPS, ids=str)
@pytest.mark.parametrize('k,s,p,d,cm', POOLS)
def test_pool_plans_equal_native(caps, k, s, p, d, cm):
    for fmt in ('contiguous', 'channels_last'):
        for dtype in DTYPES:
            x = make_input((2, 4, 17, 23), dtype, fmt)
            spec = geo.pool_spec((17, 23), geo.check_pool_args(k, s, p, d, cm))
            ref = ops.max_pool2d(x, k, s, p, d, cm, True, backend='native')
            for finite in (True, False):
                plan = P.plan_max_pool2d(spec, True, tuple(x.shape), dtype, fmt, caps,
                                         finite=finite)
                assert_bitwise(npu.execute_max_pool2d(plan, x, spec, True), ref)
            if d != 1:
                continue
            for cip in (True, False):
                plan = P.plan_avg_pool2d(spec, cip, None, tuple(x.shape), dtype, fmt, caps)
                # precision='input': fp16 reaches the backend, where the plan may average
                # in fp32; PyTorch's own fp16 kernel accumulates in fp32 too
                ref = ops.avg_pool2d(x, k, s, p, cm, cip, precision='input', backend='native')
                assert_bitwise(npu.execute_avg_pool2d(plan, x, spec, cip), ref)


@pytest.mark.parametrize('dtype', [torch.uint8, torch.int8, torch.int16, torch.int32,
                                   torch.int64, torch.float64])
@pytest.mark.parametrize('padding', [1, 'same'])
def test_integer_and_float64_max_pooling_equal_native(dtype, padding):
    # integers run in float32 (exact below 2**24) or on the CPU; float64 on the CPU
    gen = torch.Generator().manual_seed(1)
    low = 0 if dtype == torch.uint8 else -100
    x = torch.randint(low, 100, (2, 3, 9, 11), generator=gen).to(dtype)
    spec = geo.pool_spec((9, 11), geo.check_pool_args(2, 2, padding))
    for fits in (True, False):
        plan = P.plan_max_pool2d(spec, True, tuple(x.shape), dtype, 'contiguous', CHIPS[0],
                                 int_fits_fp32=fits)
        assert_bitwise(npu.execute_max_pool2d(plan, x, spec, True),
                       ops.max_pool2d(x, 2, 2, padding, return_indices=True, backend='native'))


def test_lowest_value_padding_gives_pytorch_values_and_indices():
    # finite inputs that sit at the bottom of the range tie with the padded cells
    x = torch.full((1, 1, 5, 7), torch.finfo(torch.float32).min)
    x[0, 0, 2, 3] = 1.0
    spec = geo.pool_spec((5, 7), geo.check_pool_args(2, 2, 'same_lower'))
    plan = P.plan_max_pool2d(spec, True, (1, 1, 5, 7), x.dtype, 'contiguous', CHIPS[0])
    assert plan.pad == 'lowest'
    assert_bitwise(npu.execute_max_pool2d(plan, x, spec, True),
                   ops.max_pool2d(x, 2, 2, 'same_lower', return_indices=True, backend='native'))


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
    assert 'scales (2.0, 2.0)' in plan.fallback
    with caplog.at_level(logging.WARNING, logger='mmseg_cann'):
        for _ in range(3):
            npu.execute_upsample(plan, x, spec)  # one call site
        npu.execute_upsample(plan, x, spec)      # a second call site
    assert fallback_counts()[('upsample', plan.fallback)] == 4
    logged = [r for r in caplog.records if 'scales (2.0, 2.0)' in r.getMessage()]
    assert len(logged) == 2
    assert all('test_npu_executor.py' in r.getMessage() for r in logged)


# ----------------------------------------------------------------------------------
# what the device returns as indices
# ----------------------------------------------------------------------------------
def npu_mask(values: torch.Tensor, kernel) -> torch.Tensor:
    """An int8 tensor of aclnnMaxPool2dWithMask's indices shape
    (N, C, kh*kw, (ceil(oh*ow/16)+1)*32), as torch_npu returns it."""
    n, c, oh, ow = values.shape
    kh, kw = kernel
    return torch.zeros((n, c, kh * kw, (math.ceil(oh * ow / 16) + 1) * 32), dtype=torch.int8)


class FakeDevicePooling:
    """Replaces F.max_pool2d: the first ``device_calls`` calls answer like the NPU (a mask
    or int32 indices), later ones (the CPU recomputation) like PyTorch."""

    def __init__(self, answer: str, device_calls: int = 1):
        self.answer, self.left, self.calls = answer, device_calls, 0
        self.real = F.max_pool2d

    def __call__(self, input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
                 return_indices=False):
        self.calls += 1
        result = self.real(input, kernel_size, stride, padding, dilation, ceil_mode,
                           return_indices)
        if not return_indices or self.left == 0:
            return result
        self.left -= 1
        values, index = result
        kernel = kernel_size if isinstance(kernel_size, tuple) else (kernel_size,) * 2
        return values, (npu_mask(values, kernel) if self.answer == 'mask'
                        else index.to(torch.int32))


@pytest.mark.parametrize('padding', [1, 'same'])
def test_a_mask_from_the_device_is_replaced_by_cpu_indices(monkeypatch, padding):
    x = make_input((1, 2, 9, 9))
    spec = geo.pool_spec((9, 9), geo.check_pool_args(2, 2, padding))
    plan = P.plan_max_pool2d(spec, True, (1, 2, 9, 9), x.dtype, 'contiguous', CHIPS[0])
    ref = ops.max_pool2d(x, 2, 2, padding, return_indices=True, backend='native')
    fake = FakeDevicePooling('mask')
    monkeypatch.setattr(F, 'max_pool2d', fake)
    reset_fallbacks()
    with npu.observe_device_indices() as seen:
        out = npu.execute_max_pool2d(plan, x, spec, True)
    assert_bitwise(out, ref)
    assert fake.calls == 2 and seen == ['int8 mask']
    assert any('a mask' in reason for _, reason in fallback_counts())


@pytest.mark.parametrize('padding', [1, 'same'])
def test_int32_indices_from_the_device_are_used(monkeypatch, padding):
    x = make_input((1, 2, 9, 9))
    spec = geo.pool_spec((9, 9), geo.check_pool_args(2, 2, padding))
    caps = DeviceCaps.npu('A2', torch_npu='2.10', compatible_impl=True)
    plan = P.plan_max_pool2d(spec, True, (1, 2, 9, 9), x.dtype, 'contiguous', caps, finite=True)
    ref = ops.max_pool2d(x, 2, 2, padding, return_indices=True, backend='native')
    fake = FakeDevicePooling('int32')
    monkeypatch.setattr(F, 'max_pool2d', fake)
    reset_fallbacks()
    with npu.observe_device_indices() as seen:
        out = npu.execute_max_pool2d(plan, x, spec, True)
    assert_bitwise(out, ref)  # int64, mapped back to the input plane for SAME
    assert fake.calls == 1 and seen == ['int32 indices']
    assert fallback_counts() == {}


def test_unpad_indices_passes_a_mask_through(monkeypatch):
    # the tuner crash: native.max_pool2d with SAME padding got torch_npu's
    # int8 mask and _unpad_indices' expand_as raised; a mask is now handed back as it is
    x = make_input((1, 2, 9, 9))
    spec = geo.pool_spec((9, 9), geo.check_pool_args(2, 2, 'same'))
    assert not spec.torch_padding_ok
    monkeypatch.setattr(F, 'max_pool2d', FakeDevicePooling('mask'))
    values, index = native.max_pool2d(x, spec, True)
    assert index.dtype == torch.int8 and index.shape == npu_mask(values, (2, 2)).shape
