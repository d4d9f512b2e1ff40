"""Triton pooling kernels (interpreter) against PyTorch and the float64 reference."""
from __future__ import annotations

import pytest
import torch

from mmseg_cann.ops import adaptive_avg_pool2d, avg_pool2d, max_pool2d
from mmseg_cann.core import reference as ref
from tests._helpers import kernel_input

pytest.importorskip('triton')

#: (input H, W), kwargs: ceil_mode borders, padding, dilation, stride > kernel, SAME
CASES = [
    ((7, 9), dict(kernel_size=3, stride=2, padding=1)),
    ((5, 5), dict(kernel_size=3, stride=2, padding=1, ceil_mode=True)),
    ((1, 6), dict(kernel_size=(1, 3), stride=1)),
    ((8, 7), dict(kernel_size=2, stride=3)),
    ((6, 5), dict(kernel_size=3, stride=2, padding='same')),
]
MAX_ONLY = [((9, 9), dict(kernel_size=3, stride=2, padding=1, dilation=2))]


@pytest.mark.parametrize('dtype', [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize('layout', ['contiguous', 'channels_last'])
def test_max_pool_matches_pytorch_and_reference(layout, dtype):
    for seed, (hw, kw) in enumerate(CASES + MAX_ONLY):
        x = kernel_input((1, 3) + hw, dtype, layout, seed=seed)
        x[0, 0, 0, 0] = float('nan')  # NaN propagates
        got, idx = max_pool2d(x, **kw, return_indices=True, backend='triton')
        want, want_idx = max_pool2d(x, **kw, return_indices=True, backend='native')
        assert torch.equal(got.isnan(), want.isnan())
        assert torch.equal(torch.nan_to_num(got), torch.nan_to_num(want))  # max is exact
        assert torch.equal(idx, want_idx)
        exact = ref.max_pool2d(x, **kw)
        assert torch.equal(torch.nan_to_num(got.double()), torch.nan_to_num(exact))


@pytest.mark.parametrize('dtype', [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize('layout', ['contiguous', 'channels_last'])
@pytest.mark.parametrize('options', [dict(), dict(count_include_pad=False),
                                     dict(divisor_override=5), dict(divisor_override=1)], ids=str)
def test_avg_pool_matches_pytorch_and_reference(options, layout, dtype):
    for seed, (hw, kw) in enumerate(CASES):
        x = kernel_input((1, 3) + hw, dtype, layout, seed=seed)
        got = avg_pool2d(x, **kw, **options, backend='triton', precision='input')
        exact = ref.avg_pool2d(x, **kw, **options)
        assert got.dtype == dtype
        # float32 accumulation, one rounding to the output dtype
        atol = 1e-6 if dtype == torch.float32 else 1e-3
        torch.testing.assert_close(got.double(), exact, rtol=0, atol=atol)
        want = avg_pool2d(x, **kw, **options, backend='native', precision='input')
        torch.testing.assert_close(got, want, rtol=0, atol=atol)


def test_fp16_average_of_a_large_window_is_accumulated_in_fp32():
    x = torch.full((1, 1, 16, 16), 0.1, dtype=torch.float16) + torch.linspace(
        0, 1e-2, 16 * 16, dtype=torch.float16).view(1, 1, 16, 16)
    got = avg_pool2d(x, 16, backend='triton', precision='input')
    exact = ref.avg_pool2d(x, 16)
    # summing 256 values near 0.1 in fp16 (spacing 0.0156 above 16) would be off by ~1e-3
    assert abs(float(got) - float(exact)) <= 1e-4  # one fp16 rounding of the mean


@pytest.mark.parametrize('dtype', [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize('layout', ['contiguous', 'hwc'])
def test_three_d_input(layout, dtype):
    """(C, H, W) input through every Triton pooling op (the kernels take a batch of one),
    also with HWC strides (channels_last once batched)."""
    x = kernel_input((1, 4, 7, 9), dtype, seed=3)[0]
    if layout == 'hwc':
        x = x.permute(1, 2, 0).contiguous().permute(2, 0, 1)
    kw = dict(kernel_size=3, stride=2, padding=1)
    got, idx = max_pool2d(x, **kw, return_indices=True, backend='triton')
    want, want_idx = torch.nn.functional.max_pool2d(x, **kw, return_indices=True)
    assert got.shape == want.shape == (4, 4, 5)
    assert torch.equal(got, want) and torch.equal(idx, want_idx)
    for options in (dict(), dict(count_include_pad=False), dict(divisor_override=1)):
        got = avg_pool2d(x, **kw, **options, backend='triton', precision='input')
        exact = ref.avg_pool2d(x.unsqueeze(0), **kw, **options)[0]
        assert got.shape == (4, 4, 5) and got.dtype == dtype
        # float32 accumulation (within 1e-6 here), one rounding to the output dtype
        rtol = torch.finfo(dtype).eps / 2
        torch.testing.assert_close(got.double(), exact, rtol=rtol, atol=1e-6)
    got = adaptive_avg_pool2d(x, 2, backend='triton')  # runs natively (a fallback)
    torch.testing.assert_close(got, torch.nn.functional.adaptive_avg_pool2d(x, 2))


@pytest.mark.parametrize('layout', ['contiguous', 'channels_last', 'strided'])
def test_int64_offsets_and_gpu_plan_give_identical_results(layout, monkeypatch):
    from mmseg_cann.kernels import _common
    monkeypatch.setattr(_common, 'TUNER', _common.Tuner(lambda fn: (fn(), 1.0)[1]))
    x = kernel_input((2, 3, 9, 11), torch.float16, layout)
    x[0, 1, 2, 3] = float('nan')
    kw = dict(kernel_size=3, stride=2, padding=1)

    def results():
        return [*max_pool2d(x, **kw, return_indices=True, backend='triton'),
                avg_pool2d(x, **kw, backend='triton', precision='input'),
                avg_pool2d(x, **kw, divisor_override=1, backend='triton', precision='input')]

    want = results()
    with _common.launch_context(index_limit=1):
        int64 = results()
    with _common.launch_context(_common.DeviceProps('cuda', 132)):
        gpu = results()
    for got in (int64, gpu):
        for a, b in zip(got, want):
            assert torch.equal(a.isnan(), b.isnan())
            assert torch.equal(torch.nan_to_num(a), torch.nan_to_num(b))
