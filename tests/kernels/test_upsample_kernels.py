"""Triton upsample kernels (interpreter) against PyTorch and the float64 reference."""
from __future__ import annotations

import textwrap

import pytest
import torch
import torch.nn.functional as F

from mmseg_cann.core import reference as ref
from mmseg_cann.ops import upsample
from mmseg_cann.ops.fused import upsample_add, upsample_argmax
from tests._helpers import AWKWARD_SHAPES, assert_same_layout, make_input, run_python

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
        x = make_input((1, 2, h, w), dtype, layout, seed=seed)
        other = make_input((1, 2, H, W), dtype, layout, seed=50 + seed)
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
        x = make_input((1, 2, h, w), torch.float32, seed=seed).requires_grad_()
        grad = make_input((1, 2, H, W), torch.float32, seed=7 + seed)
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
    x = make_input((1, 3, 5, 7), torch.float16, 'channels_last').requires_grad_()
    grad = make_input((1, 3, 9, 13), torch.float16, seed=1)
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
