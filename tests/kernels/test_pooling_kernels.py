"""Triton pooling kernels (interpreter) against PyTorch and the float64 reference."""
from __future__ import annotations

import pytest
import torch

from mmseg_cann.ops import avg_pool2d, max_pool2d
from mmseg_cann.core import reference as ref
from tests._helpers import make_input

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
        x = make_input((1, 3) + hw, dtype, layout, seed=seed)
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
                                     dict(divisor_override=5)], ids=str)
def test_avg_pool_matches_pytorch_and_reference(options, layout, dtype):
    for seed, (hw, kw) in enumerate(CASES):
        x = make_input((1, 3) + hw, dtype, layout, seed=seed)
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
