"""The ``'fast'`` backend against PyTorch and the float64 reference, with its documented
error bound (mmseg_cann/backends/fast.py, docs/fused_ops.md "backend='fast'")."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from mmseg_cann import ops
from mmseg_cann.backends import check_backend, fast, numba_cpu, numba_ops
from mmseg_cann.core import reference as ref
from mmseg_cann.utils import fallback_counts
from tests._helpers import AWKWARD_SHAPES, MEMORY_FORMATS, assert_same_layout, make_input

pytestmark = pytest.mark.skipif(not numba_cpu.available(), reason='numba is not installed')

EPS = torch.finfo(torch.float32).eps
MODES = [dict(mode='bilinear', align_corners=False), dict(mode='bilinear', align_corners=True),
         dict(mode='nearest'), dict(mode='nearest-exact')]
POOLS = [dict(kernel_size=3, stride=2, padding=1), dict(kernel_size=2),
         dict(kernel_size=3, stride=1, padding=1), dict(kernel_size=(3, 2), stride=(2, 1)),
         dict(kernel_size=3, stride=2, padding=1, ceil_mode=True)]


def _mode_id(m):
    return '-'.join(f'{v}' for v in m.values())


def _kernel_calls(monkeypatch):
    """Count the numba kernel launches (so a silent fallback to native fails the test)."""
    calls = []
    real = numba_ops._run
    monkeypatch.setattr(numba_ops, '_run', lambda name, *a: calls.append(name) or real(name, *a))
    return calls


def _forward_bound(x, setting):
    """Bilinear: two lerps rounded in float32 by both implementations (4 eps M); nearest:
    exact."""
    if setting['mode'] != 'bilinear':
        return 0.0
    return 4 * EPS * float(x.abs().max())


@pytest.mark.parametrize('setting', MODES, ids=_mode_id)
@pytest.mark.parametrize('layout', MEMORY_FORMATS)
def test_upsample_matches_pytorch_and_reference(monkeypatch, setting, layout):
    calls = _kernel_calls(monkeypatch)
    for seed, (in_hw, out_hw) in enumerate(AWKWARD_SHAPES):
        x = make_input((2, 3) + in_hw, memory_format=layout, seed=seed)
        got = ops.upsample(x, size=out_hw, backend='fast', **setting)
        want = F.interpolate(x, size=out_hw, **setting)
        assert_same_layout(got, want)
        bound = _forward_bound(x, setting)
        diff = float((got - want).abs().max())
        assert diff <= bound, (in_hw, out_hw, diff, bound)
        exact = ref.upsample(x, size=out_hw, **setting)
        # vs float64: the float32 coordinates PyTorch uses plus the rounding (as for
        # the fused ops, tests/ops/test_fused.py)
        torch.testing.assert_close(got.double(), exact, rtol=0, atol=2e-6)
    assert len(calls) == len(AWKWARD_SHAPES)


@pytest.mark.parametrize('align_corners', [False, True])
def test_bilinear_scale_factor_maps_with_the_user_scale(align_corners):
    x = make_input((1, 2, 7, 9))
    for scale in (1.5, 2.0, 0.7, (1.0, 3.3)):
        got = ops.upsample(x, scale_factor=scale, mode='bilinear', align_corners=align_corners,
                           backend='fast')
        want = F.interpolate(x, scale_factor=scale, mode='bilinear', align_corners=align_corners)
        assert float((got - want).abs().max()) <= 4 * EPS * float(x.abs().max())
    for scale in (1.5, 2.0, 0.7, 2.05):
        got = ops.upsample(x, scale_factor=scale, mode='nearest', backend='fast')
        assert torch.equal(got, F.interpolate(x, scale_factor=scale, mode='nearest'))


def _grad_bound(setting, in_hw, out_hw, g):
    """Per input element: ``(kh*kw + kh + kw + 4) eps S`` with ``S = sum |w g|`` over the
    output elements reading it (both sides sum the same products in different orders)."""
    mats = [ref.interpolation_matrix(i, o, setting['mode'], setting.get('align_corners'))
            for i, o in zip(in_hw, out_hw)]
    reads = [int((m != 0).sum(0).max()) for m in mats]
    S = mats[0].abs().t() @ g.double().abs() @ mats[1].abs()
    return (reads[0] * reads[1] + reads[0] + reads[1] + 4) * EPS * S


@pytest.mark.parametrize('setting', MODES, ids=_mode_id)
@pytest.mark.parametrize('layout', MEMORY_FORMATS)
def test_upsample_gradient_within_bound_of_pytorch(setting, layout):
    for seed, (in_hw, out_hw) in enumerate(AWKWARD_SHAPES):
        x = make_input((2, 3) + in_hw, memory_format=layout, seed=seed).requires_grad_()
        x2 = x.detach().clone().requires_grad_()
        g = make_input((2, 3) + out_hw, seed=100 + seed)
        ops.upsample(x, size=out_hw, backend='fast', **setting).backward(g)
        F.interpolate(x2, size=out_hw, **setting).backward(g)
        if setting['mode'] != 'bilinear':
            assert torch.equal(x.grad, x2.grad), (in_hw, out_hw)
            continue
        bound = _grad_bound(setting, in_hw, out_hw, g)
        assert bool(((x.grad - x2.grad).abs() <= bound).all()), (in_hw, out_hw)


def test_bilinear_backward_is_deterministic_and_channels_last():
    x = make_input((2, 16, 13, 21), memory_format='channels_last').requires_grad_()
    g = make_input((2, 16, 50, 77), seed=3)
    grads = []
    for _ in range(3):
        x.grad = None
        ops.upsample(x, size=(50, 77), mode='bilinear', backend='fast').backward(g)
        grads.append(x.grad.clone())
    assert all(torch.equal(grads[0], other) for other in grads[1:])
    assert grads[0].is_contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize('align_corners', [False, True])
def test_upsample_add_is_differentiable_with_the_kernels(monkeypatch, align_corners):
    """``upsample_add`` on the fast backend with inputs that need a gradient: the fused
    forward kernel and the bilinear backward kernel run (no fallback); values as the
    fused op's, gradients within the bilinear backward bound of PyTorch's (the lateral's
    gradient is the incoming one, exactly)."""
    setting = dict(mode='bilinear', align_corners=align_corners)
    for seed, (in_hw, out_hw) in enumerate(AWKWARD_SHAPES):
        if any(o < i for i, o in zip(in_hw, out_hw)):
            continue  # the fused kernel upsamples
        x = make_input((2, 3) + in_hw, seed=seed).requires_grad_()
        other = make_input((2, 3) + out_hw, seed=50 + seed).requires_grad_()
        g = make_input((2, 3) + out_hw, seed=100 + seed)
        calls = _kernel_calls(monkeypatch)
        before = sum(n for op, n in fallback_counts() if op == 'upsample_add')
        out = ops.upsample_add(x, other, backend='fast', **setting)
        out.backward(g)
        assert calls == ['bilinear_bwd_nchw'], (in_hw, out_hw)
        assert sum(n for op, n in fallback_counts() if op == 'upsample_add') == before
        with torch.no_grad():
            assert torch.equal(out, ops.upsample_add(x, other, backend='fused', **setting))
        x2, other2 = (t.detach().clone().requires_grad_() for t in (x, other))
        (other2 + F.interpolate(x2, size=out_hw, **setting)).backward(g)
        assert torch.equal(other.grad, g)
        bound = _grad_bound(setting, in_hw, out_hw, g)
        assert bool(((x.grad - x2.grad).abs() <= bound).all()), (in_hw, out_hw)


@pytest.mark.parametrize('pool', POOLS, ids=str)
@pytest.mark.parametrize('layout', MEMORY_FORMATS)
def test_max_pool_values_and_indices_are_pytorchs(monkeypatch, pool, layout):
    calls = _kernel_calls(monkeypatch)
    for seed, hw in enumerate([(7, 9), (16, 24), (1, 5), (5, 2), (33, 17)]):
        if any(s < k for s, k in zip(hw, torch.nn.modules.utils._pair(pool['kernel_size']))):
            continue
        x = make_input((2, 4) + hw, memory_format=layout, seed=seed)
        x[0, 0, 0, 0] = float('nan')
        x[1, 1] = float('-inf')  # whole planes at the lowest value: PyTorch's default index
        x[1, 2, :, 1] = x[1, 2, :, 0]  # ties: the first maximum wins
        got = ops.max_pool2d(x, return_indices=True, backend='fast', **pool)
        want = F.max_pool2d(x, return_indices=True, **pool)
        assert torch.equal(got[0].nan_to_num(7.0), want[0].nan_to_num(7.0))
        assert torch.equal(got[1], want[1])
        assert_same_layout(got[0], want[0])
        assert_same_layout(got[1], want[1])
    assert calls


def test_max_pool_dilation_3d_input_and_gradient():
    x = make_input((3, 20, 22)).requires_grad_()
    x2 = x.detach().clone().requires_grad_()
    got = ops.max_pool2d(x, 3, 2, 1, dilation=2, backend='fast')
    want = F.max_pool2d(x2, 3, 2, 1, dilation=2)
    assert torch.equal(got, want)
    g = make_input(tuple(want.shape), seed=5)
    got.backward(g)
    want.backward(g)
    assert torch.equal(x.grad, x2.grad)


@pytest.mark.parametrize('pool', POOLS, ids=str)
@pytest.mark.parametrize('layout', MEMORY_FORMATS)
@pytest.mark.parametrize('extra', [dict(), dict(count_include_pad=False),
                                   dict(divisor_override=5)], ids=str)
def test_avg_pool_within_bound_and_gradient(pool, layout, extra):
    for seed, hw in enumerate([(7, 9), (16, 24), (5, 2), (33, 17)]):
        x = make_input((2, 4) + hw, memory_format=layout, seed=seed).requires_grad_()
        x2 = x.detach().clone().requires_grad_()
        got = ops.avg_pool2d(x, backend='fast', **pool, **extra)
        want = F.avg_pool2d(x2, **pool, **extra)
        k = torch.nn.modules.utils._pair(pool['kernel_size'])
        # documented bound: k*k roundings of the sum of |x| over the window, / divisor
        bound = k[0] * k[1] * EPS * F.avg_pool2d(x.detach().abs(), **pool, **extra)
        assert bool(((got - want).abs() <= bound).all())
        assert_same_layout(got, want)
        g = make_input(tuple(want.shape), seed=9)
        got.backward(g)
        want.backward(g)
        assert torch.equal(x.grad, x2.grad)


def _fallbacks(op):
    return sum(n for (o, _), n in fallback_counts().items() if o == op)


@pytest.mark.parametrize('call, op', [
    (lambda x: ops.upsample(x.double(), size=(9, 9), mode='bilinear', backend='fast'),
     'upsample'),
    (lambda x: ops.upsample(x.half(), size=(9, 9), mode='nearest', backend='fast'), 'upsample'),
    (lambda x: ops.upsample(x, size=(9, 9), mode='bicubic', backend='fast'), 'upsample'),
    (lambda x: ops.upsample(x, size=(3, 3), mode='bilinear', antialias=True, backend='fast'),
     'upsample'),
    (lambda x: ops.max_pool2d(x, 3, 2, padding='same', backend='fast'), 'max_pool2d'),
    (lambda x: ops.max_pool2d(x.double(), 2, backend='fast'), 'max_pool2d'),
    (lambda x: ops.avg_pool2d(x, 3, 2, padding='same_lower', backend='fast'), 'avg_pool2d'),
    (lambda x: ops.adaptive_avg_pool2d(x, 2, backend='fast'), 'adaptive_avg_pool2d'),
])
def test_unsupported_cases_fall_back_to_native_and_are_counted(call, op):
    x = make_input((1, 2, 6, 6))
    before = _fallbacks(op)
    call(x)
    assert _fallbacks(op) == before + 1


def test_float64_falls_back_with_pytorchs_exact_results():
    x = make_input((1, 2, 5, 7), dtype=torch.float64).requires_grad_()
    got = ops.upsample(x, size=(11, 13), mode='bilinear', backend='fast')
    assert torch.equal(got, F.interpolate(x, size=(11, 13), mode='bilinear'))
    assert torch.autograd.gradcheck(
        lambda t: ops.upsample(t, size=(11, 13), mode='bilinear', backend='fast'), (x,))


def test_forked_process_falls_back(monkeypatch):
    monkeypatch.setattr(numba_cpu, 'forked_after_use', lambda: True)
    before = _fallbacks('upsample')
    x = make_input((1, 2, 5, 5))
    assert torch.equal(ops.upsample(x, size=(10, 10), mode='nearest', backend='fast'),
                       F.interpolate(x, size=(10, 10), mode='nearest'))
    assert _fallbacks('upsample') == before + 1


def test_thread_count_follows_torch(monkeypatch):
    import numba
    saved = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        ops.upsample(make_input((1, 2, 5, 5)), size=(10, 10), mode='bilinear', backend='fast')
        assert numba.get_num_threads() == 1
    finally:
        torch.set_num_threads(saved)


def test_huge_page_allocation_is_a_plain_tensor():
    out = numba_ops.empty((1, 1, 4096, 2048 + 7))  # above the huge-page threshold
    assert out.shape == (1, 1, 4096, 2055) and out.is_contiguous()
    out.fill_(1.5)
    assert float(out.sum()) == 1.5 * out.numel()


def test_auto_is_unchanged_and_fast_is_registered():
    assert check_backend('fast') == 'fast'
    x = make_input((1, 3, 13, 21))
    for setting in MODES:
        assert torch.equal(ops.upsample(x, size=(50, 77), **setting),
                           F.interpolate(x, size=(50, 77), **setting))


def test_fast_modules_and_convert_model_option():
    pytest.importorskip('mmengine')
    from torch import nn

    from mmseg_cann import convert_model
    model = nn.Sequential(nn.MaxPool2d(3, 2, 1), nn.Upsample(scale_factor=2, mode='bilinear'),
                          nn.AvgPool2d(2))
    convert_model(model, resize=False, backend='fast')
    assert [m.backend for m in model] == ['fast'] * 3
    x = make_input((1, 3, 16, 16))
    want = F.avg_pool2d(F.interpolate(F.max_pool2d(x, 3, 2, 1), scale_factor=2,
                                      mode='bilinear'), 2)
    assert float((model(x) - want).abs().max()) <= 4 * EPS
    with pytest.raises(ValueError, match='backend'):
        convert_model(nn.Sequential(nn.MaxPool2d(2)), resize=False, backend='fastest')
    with pytest.raises(TypeError, match='backend'):
        convert_model(nn.Sequential(nn.MaxPool2d(2)), resize=False, backend=1)


def test_hook_option():
    pytest.importorskip('mmengine')
    from mmseg_cann.apis.inference import HOOK_DEFAULTS
    from mmseg_cann.engine.hooks import CANNOpsHook
    assert HOOK_DEFAULTS['backend'] is None   # "not given": config-built modules keep theirs
    assert CANNOpsHook().backend is None
    assert CANNOpsHook(backend='fast').backend == 'fast'
    with pytest.raises(ValueError, match='backend'):
        CANNOpsHook(backend='nope')


def test_triton_devices_route_to_the_triton_backend(monkeypatch):
    """On CUDA/NPU tensors the fast backend calls the Triton backend's public functions
    (checked without a device by pretending the CPU is one)."""
    monkeypatch.setattr(fast, 'TRITON_DEVICES', ('cpu',))
    monkeypatch.setattr(fast.importlib.util, 'find_spec', lambda name: object())
    seen = []
    for name in ('upsample', 'max_pool2d', 'avg_pool2d'):
        monkeypatch.setattr(fast.triton_backend, name,
                            lambda *a, name=name, **k: seen.append(name) or a[0])
    x = make_input((1, 2, 6, 6))
    fast.upsample(x, ops.geometry.upsample_spec((6, 6), ops.geometry.check_upsample_args(
        (9, 9), mode='bilinear')))
    fast.max_pool2d(x, ops.geometry.pool_spec((6, 6), ops.geometry.check_pool_args(2)))
    fast.avg_pool2d(x, ops.geometry.pool_spec((6, 6), ops.geometry.check_pool_args(2)))
    assert seen == ['upsample', 'max_pool2d', 'avg_pool2d']
    # nearest needing a gradient: the Triton kernel has no backward, so native
    x.requires_grad_()
    out = fast.upsample(x, ops.geometry.upsample_spec((6, 6), ops.geometry.check_upsample_args(
        (9, 9), mode='nearest')))
    assert out.requires_grad and seen == ['upsample', 'max_pool2d', 'avg_pool2d']
