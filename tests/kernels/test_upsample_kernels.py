"""Triton upsample kernels (interpreter) against PyTorch and the float64 reference."""
from __future__ import annotations

import textwrap

import pytest
import torch
import torch.nn.functional as F

from mmseg_cann.core import reference as ref
from mmseg_cann.ops import upsample
from mmseg_cann.ops.fused import upsample_add, upsample_argmax
from tests._helpers import (AWKWARD_SHAPES, KERNEL_DEVICE, assert_same_layout, kernel_input,
                            run_python)

pytest.importorskip('triton')

SETTINGS = [dict(mode='nearest'), dict(mode='nearest-exact'),
            dict(mode='bilinear', align_corners=False), dict(mode='bilinear', align_corners=True)]
LAYOUTS = ['contiguous', 'channels_last']
DTYPES = [torch.float32, torch.float16]
#: the awkward shapes without the two largest outputs (x32, 2 -> 82: thousands of pixels,
#: slow under the interpreter; their index rules are host-side and tested in tests/ops)
KERNEL_SHAPES = [s for s in AWKWARD_SHAPES if s[1][0] * s[1][1] < 2000]
#: one rounding of a value in [-1, 1] plus the last bit of a float32 product
ATOL = {torch.float32: 2e-6, torch.float16: 1e-3}


def _sid(setting):
    return '-'.join(f'{v}' for v in setting.values())


@pytest.mark.parametrize('dtype', DTYPES, ids=str)
@pytest.mark.parametrize('layout', LAYOUTS)
@pytest.mark.parametrize('setting', SETTINGS, ids=_sid)
def test_forward_add_argmax_match_pytorch_and_reference(setting, layout, dtype):
    for seed, ((h, w), (H, W)) in enumerate(KERNEL_SHAPES):
        x = kernel_input((1, 2, h, w), dtype, layout, seed=seed)
        other = kernel_input((1, 2, H, W), dtype, layout, seed=50 + seed)
        want = F.interpolate(x, size=(H, W), **setting)
        exact = ref.upsample(x, size=(H, W), **setting)
        got = upsample(x, size=(H, W), backend='triton', **setting)
        assert got.dtype == dtype
        if not x.is_contiguous():  # unambiguously channels_last in, channels_last out
            assert_same_layout(got, x)
        if setting['mode'] == 'bilinear':
            torch.testing.assert_close(got, want, rtol=0, atol=ATOL[dtype])
        else:  # a gather: bit for bit
            assert torch.equal(got, want)
        torch.testing.assert_close(got.double(), exact, rtol=0, atol=ATOL[dtype])
        fused = upsample_add(x, other, backend='triton', **setting)
        torch.testing.assert_close(fused, other + want, rtol=0, atol=2 * ATOL[dtype])
        labels = upsample_argmax(x, (H, W), backend='triton', **setting)
        differ = labels != want.argmax(1)
        if differ.any():  # only near-ties may differ
            top = want.double().topk(2, dim=1).values
            assert float((top[:, 0] - top[:, 1])[differ].max()) <= ATOL[dtype]


#: backward cost grows with the ratio (each input gathers ratio^2 outputs): ratios <= 4
BACKWARD_SHAPES = [s for s in AWKWARD_SHAPES if s[1][0] <= 4 * s[0][0] and s[1][1] <= 4 * s[0][1]
                   and s[1][0] * s[1][1] < 2000]


@pytest.mark.parametrize('align_corners', [False, True])
def test_bilinear_backward_matches_and_is_deterministic(align_corners):
    for seed, ((h, w), (H, W)) in enumerate(BACKWARD_SHAPES):
        x = kernel_input((1, 2, h, w), torch.float32, seed=seed).requires_grad_()
        grad = kernel_input((1, 2, H, W), torch.float32, seed=7 + seed)
        kw = dict(size=(H, W), mode='bilinear', align_corners=align_corners)
        got, = torch.autograd.grad(upsample(x, backend='triton', **kw), x, grad)
        again, = torch.autograd.grad(upsample(x, backend='triton', **kw), x, grad)
        assert torch.equal(got, again)  # fixed summation order, no atomics
        want, = torch.autograd.grad(F.interpolate(x, **kw), x, grad)
        xd = x.detach().double().requires_grad_()
        exact, = torch.autograd.grad(ref.upsample(xd, **kw), xd, grad.double())
        # a sum of up to (2 * ratio)^2 products of terms in [-1, 1]
        atol = 1e-6 * max(1, (H // h + 1) * (W // w + 1))
        torch.testing.assert_close(got, want, rtol=0, atol=atol)
        torch.testing.assert_close(got.double(), exact, rtol=0, atol=atol)


def test_backward_fp16_channels_last():
    x = kernel_input((1, 3, 5, 7), torch.float16, 'channels_last').requires_grad_()
    grad = kernel_input((1, 3, 9, 13), torch.float16, seed=1)
    got, = torch.autograd.grad(upsample(x, size=(9, 13), mode='bilinear', backend='triton'),
                               x, grad)
    xd = x.detach().double().requires_grad_()
    exact, = torch.autograd.grad(ref.upsample(xd, size=(9, 13), mode='bilinear'), xd,
                                 grad.double())
    assert got.dtype == torch.float16
    torch.testing.assert_close(got.double(), exact, rtol=0, atol=4e-3)


def test_cpu_without_interpreter_is_a_clear_error():
    script = textwrap.dedent('''
        import os, torch
        os.environ.pop('TRITON_INTERPRET', None)
        from mmseg_cann.ops import upsample
        try:
            upsample(torch.zeros(1, 1, 2, 2), size=4, backend='triton')
        except RuntimeError as e:
            print('ERR', e)
    ''')
    env_free = run_python(['-c', script])
    assert 'ERR' in env_free.stdout and 'TRITON_INTERPRET=1' in env_free.stdout, env_free.stderr


def _all_upsample_ops(x, other, grad, size):
    """Every upsample kernel's result for one input: forward (nearest, bilinear), add,
    argmax (nearest, bilinear) and the bilinear input gradient."""
    xg = x.detach().requires_grad_()
    y = upsample(xg, size=size, mode='bilinear', backend='triton')
    g, = torch.autograd.grad(y, xg, grad)
    return [upsample(x, size=size, mode='nearest', backend='triton'), y.detach(),
            upsample_add(x, other, backend='triton'),
            upsample_add(x, other, mode='nearest', backend='triton'),
            upsample_argmax(x, size, backend='triton'),
            upsample_argmax(x, size, mode='nearest', backend='triton'), g]


def _assert_all_equal(got, want):
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a, b)


@pytest.mark.parametrize('layout', LAYOUTS + ['strided'])
def test_int64_offsets_give_identical_results(layout):
    from mmseg_cann.kernels import _common
    x = kernel_input((2, 5, 3, 4), torch.float32, layout)
    other = kernel_input((2, 5, 7, 9), torch.float32, layout, seed=1)
    grad = kernel_input((2, 5, 7, 9), torch.float32, layout, seed=2)
    want = _all_upsample_ops(x, other, grad, (7, 9))
    with _common.launch_context(index_limit=1):  # every launch takes the int64 path
        got = _all_upsample_ops(x, other, grad, (7, 9))
    _assert_all_equal(got, want)


@pytest.mark.parametrize('layout', LAYOUTS)
def test_gpu_launch_plan_gives_identical_results(layout, monkeypatch):
    """The CUDA plan (grid covering the work, larger blocks, tuned) under the
    interpreter: the same values as the interpreter's own plan."""
    from mmseg_cann.kernels import _common
    measured = []
    monkeypatch.setattr(_common, 'TUNER', _common.Tuner(
        lambda fn: (fn(), measured.append(1), 1.0)[-1]))
    x = kernel_input((1, 40, 3, 5), torch.float16, layout)  # 40 classes: two class steps
    other = kernel_input((1, 40, 6, 11), torch.float16, layout, seed=1)
    grad = kernel_input((1, 40, 6, 11), torch.float16, layout, seed=2)
    want = _all_upsample_ops(x, other, grad, (6, 11))
    h100 = _common.DeviceProps('cuda', 132)
    with _common.launch_context(h100):
        got = _all_upsample_ops(x, other, grad, (6, 11))
    _assert_all_equal(got, want)
    assert measured  # the tuner measured the candidates


@pytest.mark.parametrize('layout', LAYOUTS)
@pytest.mark.parametrize('classes', [1, 3, 40])
def test_argmax_nan_and_ties_as_torch_argmax(classes, layout):
    """NaN is the maximum (first NaN wins), ties keep the first class, all -inf gives
    class 0: in both class orders (one class per step / tiles of classes along C)."""
    gen = torch.Generator().manual_seed(classes)
    x = torch.randint(-2, 3, (2, classes, 3, 4), generator=gen).float()  # many ties
    x[0, :, 0, 0] = float('-inf')
    x[0, -1, 1, 1] = float('nan')
    x[1, classes // 2, 2, 3] = float('nan')
    x[1, -1, 2, 3] = float('nan')
    x[1, :, 0, 1] = float('inf')
    if layout == 'channels_last':
        x = x.contiguous(memory_format=torch.channels_last)
    x = x.to(KERNEL_DEVICE)
    labels = upsample_argmax(x, (6, 8), mode='nearest', backend='triton')
    want = F.interpolate(x, size=(6, 8), mode='nearest').argmax(1)
    assert torch.equal(labels, want)


def test_backward_channels_last_float32_matches_and_keeps_layout():
    x = kernel_input((2, 5, 4, 6), torch.float32, 'channels_last').requires_grad_()
    grad = kernel_input((2, 5, 13, 9), torch.float32, 'channels_last', seed=3)
    kw = dict(size=(13, 9), mode='bilinear', align_corners=False)
    got, = torch.autograd.grad(upsample(x, backend='triton', **kw), x, grad)
    want, = torch.autograd.grad(F.interpolate(x, **kw), x, grad)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    assert_same_layout(got, x)


def test_three_d_input_is_rejected_before_any_kernel():
    """The fused ops take (N, C, H, W) only: a clear ValueError, also with
    backend='triton'. A 3-D upsample input is 1-D resizing, which upsample hands to
    F.interpolate, so a 2-D size gets torch's own ValueError."""
    x = torch.zeros(3, 4, 5)
    with pytest.raises(ValueError, match='same number of spatial dimensions'):
        upsample(x, size=(8, 10), mode='bilinear', backend='triton')
    with pytest.raises(ValueError, match='input must be'):
        upsample_add(x, torch.zeros(3, 8, 10), backend='triton')
    with pytest.raises(ValueError, match='input must be'):
        upsample_argmax(x, (8, 10), backend='triton')


@pytest.mark.parametrize('sizes', [(1, 2), (7, 13), (9, 4), (4, 32), (5, 5)], ids=str)
@pytest.mark.parametrize('align_corners', [False, True])
def test_backward_tables_invert_the_taps(sizes, align_corners):
    """The reverse tables give back the forward interpolation matrix: output ``start[i]
    + k`` reads input ``i`` with weight ``weight[i, k]`` (both taps' weights summed)."""
    from mmseg_cann.backends.triton import reverse_taps
    from mmseg_cann.core.taps import linear_taps
    n_in, n_out = sizes
    taps = linear_taps(n_in, n_out, align_corners)
    forward = torch.zeros(n_out, n_in)
    for d in range(n_out):
        forward[d, taps[0][d]] += taps[2][d]
        forward[d, taps[1][d]] += taps[3][d]
    start, count, weight = reverse_taps(taps, n_in)
    assert start.dtype == count.dtype == torch.int32 and weight.dtype == torch.float32
    assert weight.shape == (n_in, int(count.max()))
    back = torch.zeros(n_out, n_in)
    for i in range(n_in):
        for k in range(weight.shape[1]):
            if k < count[i]:
                back[start[i] + k, i] = weight[i, k]
            else:
                assert weight[i, k] == 0  # zero padding past the range
    assert torch.equal(back, forward)
