"""The geometry module against PyTorch's observable behaviour and the documented rules."""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mmseg_cann.core import geometry as geo
from mmseg_cann.core import reference as ref


@pytest.mark.parametrize('ceil_mode', [False, True])
def test_pool_output_size_matches_pytorch(ceil_mode):
    checked = 0
    for n in range(1, 14):
        for k in range(1, 6):
            for s in range(1, 4):
                for d in (1, 2):
                    for p in range(0, k // 2 + 1):
                        if n + 2 * p < geo.effective_kernel(k, d):
                            continue
                        out = F.max_pool2d(torch.zeros(1, 1, n, 1), (k, 1), (s, 1), (p, 0),
                                           (d, 1), ceil_mode).shape[2]
                        assert geo.pool_output_size(n, k, s, p, d, ceil_mode) == out
                        checked += 1
    assert checked > 500


def test_kernel5_stride2_ceil_mode_last_window():
    # the classic "one pixel short": 8 + 2*2 - 5 = 7, ceil(7/2) + 1 = 5 windows
    assert geo.pool_output_size(8, 5, 2, 2, 1, ceil_mode=True) == 5
    assert geo.pool_output_size(8, 5, 2, 2, 1, ceil_mode=False) == 4
    # a last window that would start in the right padding is dropped
    assert geo.pool_output_size(5, 2, 2, 1, 1, ceil_mode=True) == 3


@pytest.mark.parametrize('lower', [False, True])
def test_same_padding_properties(lower):
    for n in range(1, 30):
        for k in range(1, 7):
            for s in range(1, 5):
                for d in (1, 2, 3):
                    begin, end, out = geo.same_padding(n, k, s, d, lower)
                    assert out == math.ceil(n / s)
                    eff = geo.effective_kernel(k, d)
                    # the padded input holds exactly `out` windows
                    assert (n + begin + end - eff) // s + 1 == out
                    assert abs(begin - end) <= 1
                    assert (begin >= end) if lower else (end >= begin)
                    if begin + end > 0:  # minimal: one cell less loses the last window
                        assert (n + begin + end - 1 - eff) // s + 1 < out or \
                            n + begin + end - 1 < eff


def test_upsample_output_size_rules():
    args = geo.check_upsample_args(scale_factor=1.5, mode='bilinear')
    spec = geo.upsample_spec((7, 7), args)
    assert spec.out_size == (10, 10)
    assert spec.kernel_scales == (1.5, 1.5)  # mapping with 1/scale, PyTorch's rule
    spec = geo.upsample_spec((7, 7), geo.check_upsample_args(
        scale_factor=1.5, mode='bilinear', recompute_scale_factor=True))
    assert spec.out_size == (10, 10) and spec.kernel_scales == (None, None)
    for n in range(1, 40):
        for scale in (0.3, 0.5, 1.5, 2.3, 3.7, 8.0, 1 / 3):
            if math.floor(n * scale) < 1:
                continue
            out = F.interpolate(torch.zeros(1, 1, n, 1), scale_factor=(scale, 1.0)).shape[2]
            assert geo.upsample_output_size(n, scale) == out


def test_source_coordinates_examples():
    # docs/design.md 2.1: 2 -> 4
    step = geo.coordinate_scale(2, 4, True, None)
    assert [geo.linear_source_coordinate(d, step, True, False) for d in range(4)] == \
        pytest.approx([0, 1 / 3, 2 / 3, 1])
    step = geo.coordinate_scale(2, 4, False, None)
    assert [geo.linear_source_coordinate(d, step, False, False) for d in range(4)] == \
        pytest.approx([0, 0.25, 0.75, 1.25])
    assert geo.linear_source_coordinate(0, step, False, True) == pytest.approx(-0.25)
    assert geo.coordinate_scale(5, 1, True, None) == 0.0
    assert geo.coordinate_scale(4, 7, False, 2.0) == 0.5


def test_adaptive_bins_cover_input():
    for n in range(1, 30):
        for o in range(1, 12):
            bins = [geo.adaptive_bin(i, n, o) for i in range(o)]
            assert bins[0][0] == 0 and bins[-1][1] == n
            assert all(0 <= a < b <= n for a, b in bins)


def test_cubic_weights_sum_to_one():
    for t in np.linspace(0, 1, 17):
        assert sum(geo.cubic_weights(t)) == pytest.approx(1.0)
    assert geo.cubic_weights(0.0) == pytest.approx((0, 1, 0, 0))


def test_float32_nearest_rule_differs_from_exact_math_on_135_pairs():
    pairs = ref.nearest_index_mismatches(80, 160)
    assert len(pairs) == 135
    assert (2, 82) in pairs
    assert ref.nearest_indices(2, 82, None, False, 'pytorch')[41] == 0
    assert ref.nearest_indices(2, 82, None, False, 'exact')[41] == 1


def _pytorch_indices(n_in, n_out, mode, scale=None):
    x = torch.arange(n_in, dtype=torch.float32).reshape(1, 1, 1, n_in)
    if scale is None:
        y = F.interpolate(x, size=(1, n_out), mode=mode)
    else:
        y = F.interpolate(x, scale_factor=(1.0, scale), mode=mode)
    return y[0, 0, 0].long().numpy()


def test_pytorch_float32_nearest_follows_the_float32_rule_everywhere():
    for n_in in range(1, 80):
        for n_out in range(1, 160):
            np.testing.assert_array_equal(
                _pytorch_indices(n_in, n_out, 'nearest'),
                ref.nearest_indices(n_in, n_out, None, False, 'pytorch'),
                err_msg=f'{n_in}->{n_out}')
    for n_in in range(1, 40):  # scale-based, with the out == in / out == 2*in shortcuts
        for scale in (0.5, 0.7, 1.0, 1.3, 2.0, 2.3, 2.5, 3.7, 1 / 3, 8.0):
            n_out = math.floor(n_in * scale)
            if n_out >= 1:
                np.testing.assert_array_equal(
                    _pytorch_indices(n_in, n_out, 'nearest', scale),
                    ref.nearest_indices(n_in, n_out, scale, False, 'pytorch'))


def test_pytorch_nearest_exact_differs_from_float32_rule_only_at_rounding_ties():
    f32 = np.float32
    for n_in in range(1, 80):
        for n_out in range(1, 160):
            got = _pytorch_indices(n_in, n_out, 'nearest-exact')
            rule = ref.nearest_indices(n_in, n_out, None, True, 'pytorch')
            for d in np.nonzero(got != rule)[0]:
                # the float32 source coordinate sits within one ulp of an integer
                src = (f32(d) + f32(0.5)) * (f32(n_in) / f32(n_out))
                nearest_int = np.round(src)
                assert abs(src - nearest_int) <= np.spacing(f32(max(nearest_int, 1))), \
                    (n_in, n_out, d)
