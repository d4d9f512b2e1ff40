"""Pooling ops against ``torch.nn.functional``, explicit padding and the float64 reference."""
import math

import pytest
import torch
import torch.nn.functional as F

from mmseg_cann import ops
from mmseg_cann.core import reference as ref

from tests._helpers import MEMORY_FORMATS, assert_same_layout, make_input

POOL_CONFIGS = [
    # kernel, stride, padding, dilation, ceil_mode
    (3, 2, 1, 1, False), (3, 2, 1, 1, True), (5, 2, 2, 1, True), (2, 2, 0, 1, True),
    (3, 1, 1, 2, False), ((3, 2), (2, 1), (1, 0), 1, False), (2, 3, 1, 3, True),
    (1, 1, 0, 1, False), (4, None, 2, 1, False),
]
SHAPES = [(1, 1), (5, 5), (7, 9), (11, 6), (16, 32)]
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


def _valid(hw, k, s, p, d):
    k2 = (k, k) if isinstance(k, int) else k
    d2 = (d, d) if isinstance(d, int) else d
    p2 = (p, p) if isinstance(p, int) else p
    return all(n + 2 * pp >= dd * (kk - 1) + 1 for n, kk, pp, dd in zip(hw, k2, p2, d2))


@pytest.mark.parametrize('cfg', POOL_CONFIGS, ids=str)
@pytest.mark.parametrize('dtype', DTYPES)
@pytest.mark.parametrize('memory_format', MEMORY_FORMATS)
def test_max_pool_bitwise_equal_to_pytorch(cfg, dtype, memory_format):
    k, s, p, d, cm = cfg
    for i, hw in enumerate(SHAPES):
        if not _valid(hw, k, s, p, d):
            continue
        x = make_input((2, 3) + hw, dtype, memory_format, seed=i)
        values, index = ops.max_pool2d(x, k, s, p, d, cm, return_indices=True)
        exp_values, exp_index = F.max_pool2d(x, k, s, p, d, cm, return_indices=True)
        assert torch.equal(values, exp_values) and torch.equal(index, exp_index)
        assert values.dtype == dtype
        if min(values.shape[-2:]) > 1:
            assert_same_layout(values, exp_values)


@pytest.mark.parametrize('cfg', [c for c in POOL_CONFIGS if c[3] == 1], ids=str)
@pytest.mark.parametrize('dtype', DTYPES)
@pytest.mark.parametrize('cip', [True, False])
@pytest.mark.parametrize('divisor_override', [None, 3])
def test_avg_pool_bitwise_equal_to_pytorch(cfg, dtype, cip, divisor_override):
    k, s, p, d, cm = cfg
    for i, hw in enumerate(SHAPES):
        if not _valid(hw, k, s, p, d):
            continue
        for memory_format in MEMORY_FORMATS:
            x = make_input((2, 3) + hw, dtype, memory_format, seed=i)
            # precision='input' computes in the input dtype, exactly like PyTorch
            got = ops.avg_pool2d(x, k, s, p, cm, cip, divisor_override, precision='input')
            assert torch.equal(got, F.avg_pool2d(x, k, s, p, cm, cip, divisor_override))


@pytest.mark.parametrize('cfg', POOL_CONFIGS, ids=str)
def test_pooling_matches_reference(cfg):
    k, s, p, d, cm = cfg
    for i, hw in enumerate(SHAPES):
        if not _valid(hw, k, s, p, d):
            continue
        x = make_input((2, 3) + hw, torch.float64, seed=i)
        values, index = ops.max_pool2d(x, k, s, p, d, cm, return_indices=True)
        exp_values, exp_index = ref.max_pool2d(x, k, s, p, d, cm, return_indices=True)
        assert torch.equal(values, exp_values) and torch.equal(index, exp_index)
        if d == 1:
            for cip in (True, False):
                torch.testing.assert_close(ops.avg_pool2d(x, k, s, p, cm, cip),
                                           ref.avg_pool2d(x, k, s, p, cm, cip),
                                           rtol=0, atol=1e-12)


def test_three_dimensional_input_and_empty_batch():
    x = make_input((3, 7, 9), torch.float32).view(3, 7, 9)
    assert torch.equal(ops.max_pool2d(x, 3, 2, 1), F.max_pool2d(x, 3, 2, 1))
    assert torch.equal(ops.avg_pool2d(x, 3, 2, 1), F.avg_pool2d(x, 3, 2, 1))
    assert torch.equal(ops.adaptive_avg_pool2d(x, (2, 3)), F.adaptive_avg_pool2d(x, (2, 3)))
    empty = torch.zeros(0, 3, 8, 8)
    assert ops.max_pool2d(empty, 3, 2, 1).shape == (0, 3, 4, 4)
    assert ops.avg_pool2d(empty, 3, 2, 'same').shape == (0, 3, 4, 4)


def test_max_pool_nan_propagation_and_integer_input():
    x = make_input((1, 2, 6, 6), torch.float32)
    x[0, 0, 1, 1] = math.nan
    x[0, 1, 4, 2] = math.nan
    x[0, 1, 5, 3] = math.nan
    for padding in (1, 'same', 'same_lower'):
        values, index = ops.max_pool2d(x, 3, 2, padding, return_indices=True)
        ref_values, ref_index = ref.max_pool2d(x, 3, 2, padding, return_indices=True)
        assert torch.equal(values.isnan(), ref_values.isnan())
        assert torch.equal(index, ref_index)
        if padding == 1:
            assert torch.equal(index, F.max_pool2d(x, 3, 2, 1, return_indices=True)[1])
    labels = torch.randint(-5, 100, (2, 1, 9, 9), dtype=torch.int64)
    for padding in (1, 'same'):
        got, idx = ops.max_pool2d(labels, 3, 2, padding, return_indices=True)
        exp, exp_idx = ref.max_pool2d(labels, 3, 2, padding, return_indices=True)
        assert got.dtype == torch.int64 and torch.equal(got, exp.long()) and \
            torch.equal(idx, exp_idx)


# ----------------------------------------------------------------------------------
# SAME padding (ONNX auto_pad) against explicit asymmetric padding
# ----------------------------------------------------------------------------------
SAME_CONFIGS = [(3, 2, 1), (2, 2, 1), (4, 3, 1), (3, 1, 2), (5, 2, 1), (2, 1, 1), (1, 3, 1),
                ((3, 4), (2, 3), 1), (3, 3, 3)]


def _onnx_pads(n, k, s, d, lower):
    """ONNX auto_pad as written in the ONNX operator spec."""
    out = -(-n // s)
    total = max(0, (out - 1) * s + ((k - 1) * d + 1) - n)
    return (total - total // 2, total // 2) if lower else (total // 2, total - total // 2)


def _explicit(x, k, s, d, lower, value):
    k2, s2, d2 = [(v, v) if isinstance(v, int) else v for v in (k, s, d)]
    (top, bottom), (left, right) = [_onnx_pads(x.shape[-2 + a], k2[a], s2[a], d2[a], lower)
                                    for a in range(2)]
    return F.pad(x, (left, right, top, bottom), value=value), (top, left)


@pytest.mark.parametrize('cfg', SAME_CONFIGS, ids=str)
@pytest.mark.parametrize('padding', ['same', 'same_upper', 'same_lower'])
def test_same_padding_equals_explicit_asymmetric_padding(cfg, padding):
    k, s, d = cfg
    lower = padding == 'same_lower'
    for i, hw in enumerate([(1, 1), (5, 5), (7, 10), (12, 9)]):
        x = make_input((2, 3) + hw, torch.float64, seed=i)
        values, index = ops.max_pool2d(x, k, s, padding, d, return_indices=True)
        padded, _ = _explicit(x, k, s, d, lower, -math.inf)
        expected = F.max_pool2d(padded, k, s, 0, d)
        assert torch.equal(values, expected)
        assert values.shape[-2:] == tuple(-(-n // (s if isinstance(s, int) else s[a]))
                                          for a, n in enumerate(hw))
        # indices address the unpadded input plane
        assert torch.equal(x.flatten(2).gather(2, index.flatten(2)).view_as(values), values)
        if d == 1:
            zero_padded, _ = _explicit(x, k, s, d, lower, 0.0)
            got = ops.avg_pool2d(x, k, s, padding, count_include_pad=True)
            torch.testing.assert_close(got, F.avg_pool2d(zero_padded, k, s, 0), rtol=0,
                                       atol=1e-12)
            ones, _ = _explicit(torch.ones_like(x), k, s, d, lower, 0.0)
            counts = F.avg_pool2d(ones, k, s, 0, divisor_override=1)
            got = ops.avg_pool2d(x, k, s, padding, count_include_pad=False)
            expected = F.avg_pool2d(zero_padded, k, s, 0, divisor_override=1) / counts
            torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)
            torch.testing.assert_close(
                got, ref.avg_pool2d(x, k, s, padding, count_include_pad=False), rtol=0, atol=1e-12)


def test_same_padding_all_minus_inf_window_takes_pytorch_default_index():
    x = torch.full((1, 1, 4, 5), -math.inf)
    x[0, 0, 3, 4] = 1.0
    values, index = ops.max_pool2d(x, 2, 2, 'same_lower', return_indices=True)
    exp_values, exp_index = ref.max_pool2d(x, 2, 2, 'same_lower', return_indices=True)
    assert torch.equal(values, exp_values) and torch.equal(index, exp_index)
    assert int(index.min()) >= 0 and int(index.max()) < 20


def test_valid_padding_is_zero_padding():
    x = make_input((1, 2, 9, 8), torch.float32)
    assert torch.equal(ops.max_pool2d(x, 3, 2, 'valid', ceil_mode=True),
                       F.max_pool2d(x, 3, 2, 0, ceil_mode=True))
    assert torch.equal(ops.avg_pool2d(x, 3, 2, 'valid', precision='input'),
                       F.avg_pool2d(x, 3, 2, 0))


@pytest.mark.parametrize('memory_format', ['contiguous', 'channels_last'])
def test_same_padding_keeps_layout(memory_format):
    x = make_input((1, 4, 7, 7), torch.float32, memory_format)
    for fn in (lambda t: ops.max_pool2d(t, 2, 2, 'same'),
               lambda t: ops.avg_pool2d(t, 4, 3, 'same')):
        assert_same_layout(fn(x), x)


# ----------------------------------------------------------------------------------
# adaptive average pooling
# ----------------------------------------------------------------------------------
@pytest.mark.parametrize('output_size', [1, 2, 3, 6, (5, 7), (None, 2), (4, None)])
@pytest.mark.parametrize('dtype', DTYPES)
def test_adaptive_avg_pool(output_size, dtype):
    for i, hw in enumerate([(5, 5), (7, 9), (13, 10), (64, 32)]):
        x = make_input((2, 3) + hw, dtype, seed=i)
        got = ops.adaptive_avg_pool2d(x, output_size, precision='input')
        assert torch.equal(got, F.adaptive_avg_pool2d(x, output_size))
        if dtype == torch.float64:
            torch.testing.assert_close(got, ref.adaptive_avg_pool2d(x, output_size),
                                       rtol=0, atol=1e-12)


# ----------------------------------------------------------------------------------
# gradients
# ----------------------------------------------------------------------------------
@pytest.mark.parametrize('backend', ['auto', 'reference'])
def test_pooling_gradcheck(backend):
    x = make_input((1, 2, 6, 7), torch.float64).requires_grad_()
    calls = [
        lambda t: ops.max_pool2d(t, 3, 2, 1, backend=backend),
        lambda t: ops.max_pool2d(t, 2, 2, 'same', backend=backend),
        lambda t: ops.max_pool2d(t, 3, 1, 'same_lower', 2, backend=backend),
        lambda t: ops.avg_pool2d(t, 3, 2, 1, True, False, backend=backend),
        lambda t: ops.avg_pool2d(t, 4, 3, 'same', count_include_pad=False, backend=backend),
        lambda t: ops.avg_pool2d(t, 2, 2, 'same', divisor_override=3, backend=backend),
        lambda t: ops.adaptive_avg_pool2d(t, (4, 3), backend=backend),
    ]
    for call in calls:
        assert torch.autograd.gradcheck(call, (x,))


def test_pooling_gradients_equal_pytorch():
    x = make_input((2, 3, 9, 8), torch.float64).requires_grad_()
    for ours, theirs in [
        (lambda t: ops.max_pool2d(t, 3, 2, 1, ceil_mode=True),
         lambda t: F.max_pool2d(t, 3, 2, 1, ceil_mode=True)),
        (lambda t: ops.avg_pool2d(t, 3, 2, 1, count_include_pad=False),
         lambda t: F.avg_pool2d(t, 3, 2, 1, count_include_pad=False)),
        (lambda t: ops.adaptive_avg_pool2d(t, 3), lambda t: F.adaptive_avg_pool2d(t, 3)),
    ]:
        g1, = torch.autograd.grad(ours(x).sum(), x)
        g2, = torch.autograd.grad(theirs(x).sum(), x)
        assert torch.equal(g1, g2)
