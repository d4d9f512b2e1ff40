"""The geometry module against PyTorch's observable behaviour and the documented rules."""
import itertools
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


def _torch_pool_outcome(n, k, s, p, d, ceil_mode):
    """PyTorch's output height for an (n x 1) input, or None when it raises."""
    try:
        return F.max_pool2d(torch.zeros(1, 1, n, 1), (k, 1), (s, 1), (p, 0), (d, 1),
                            ceil_mode).shape[2]
    except RuntimeError:
        return None


@pytest.mark.parametrize('ceil_mode', [False, True])
def test_pool_spec_accepts_exactly_the_geometries_pytorch_accepts(ceil_mode):
    """``pool_spec`` raises exactly where PyTorch raises (an empty output), and gives
    PyTorch's size everywhere else, also where a ceil-mode window runs past the padded
    input (e.g. n=1, k=2, s=2: one window)."""
    past_input = 0
    for n, k, s, d in itertools.product(range(1, 8), range(1, 6), range(1, 4), range(1, 4)):
        for p in range(0, k // 2 + 1):
            expected = _torch_pool_outcome(n, k, s, p, d, ceil_mode)
            args = geo.check_pool_args((k, 1), (s, 1), (p, 0), (d, 1), ceil_mode)
            if expected is None:
                with pytest.raises(RuntimeError, match='Output size is too small'):
                    geo.pool_spec((n, 1), args)
                continue
            assert geo.pool_spec((n, 1), args).out_size[0] == expected, (n, k, s, p, d)
            past_input += n + 2 * p < geo.effective_kernel(k, d)
    assert (past_input > 0) == ceil_mode


def test_adaptive_output_size_rules_of_pytorch():
    assert geo.adaptive_output_size((5, 6), 0) == (0, 0)
    assert geo.adaptive_output_size((5, 6), (None, 0)) == (5, 0)
    for bad in ((2,), (1, 2, 3), -1, (2, -1)):
        with pytest.raises(RuntimeError):  # as F.adaptive_avg_pool2d
            geo.adaptive_output_size((5, 6), bad)
    for bad in (2.0, True, np.int64(2), torch.tensor(2), None):
        with pytest.raises(TypeError):
            geo.adaptive_output_size((5, 6), bad)


def test_upsample_args_follow_interpolate():
    """Truth-valued flags, one size per spatial dimension, empty 'area' outputs, and
    PyTorch's NotImplementedError for modes it has no 4-D kernel for."""
    args = geo.check_upsample_args(size=3, mode='bilinear', antialias=1,
                                   recompute_scale_factor=None)
    assert args.antialias is True and args.align_corners is False
    args = geo.check_upsample_args(scale_factor=2.0, recompute_scale_factor=np.bool_(True))
    assert args.recompute_scale_factor is True
    assert geo.check_upsample_args(size=0, mode='area').size == (0, 0)
    with pytest.raises(ValueError, match='align_corners'):  # before the type check
        geo.check_upsample_args(size=3, align_corners=1)
    with pytest.raises(TypeError, match='align_corners'):
        geo.check_upsample_args(size=3, mode='bicubic', align_corners=1)
    for size in ((3,), [3]):
        with pytest.raises(ValueError, match='size'):
            geo.check_upsample_args(size=size)
    for mode in ('linear', 'trilinear', 'lanczos-ish', 3):
        with pytest.raises(NotImplementedError):
            geo.check_upsample_args(size=3, mode=mode)
        with pytest.raises(ValueError, match='mode'):
            geo.check_upsample_args(size=3, mode=mode)
