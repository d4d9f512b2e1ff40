"""Fused ops against the unfused PyTorch computation and the float64 reference."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from mmseg_cann.backends import fused as fused_backend
from mmseg_cann.core import geometry as geo
from mmseg_cann.core import reference as ref
from mmseg_cann.ops.fused import upsample_add, upsample_argmax
from mmseg_cann.core.taps import linear_taps
from tests._helpers import AWKWARD_SHAPES, assert_within_interpolation_rounding, make_input

SETTINGS = [dict(mode='nearest'), dict(mode='nearest-exact'),
            dict(mode='bilinear', align_corners=False), dict(mode='bilinear', align_corners=True)]
LAYOUTS = ['contiguous', 'channels_last']
DTYPES = [torch.float32, torch.float16]
#: largest rounding error of one interpolated value in [-1, 1] (two lerps, one rounding)
ROUNDING = {torch.float32: 4e-7, torch.float16: 2e-3}


def _sid(setting):
    return '-'.join(f'{v}' for v in setting.values())


def _interp(x, size, setting):
    kw = dict(setting)
    if kw['mode'] != 'bilinear':
        kw.pop('align_corners', None)
    return F.interpolate(x, size=size, **kw)


def _top2_gap(values: torch.Tensor) -> torch.Tensor:
    top = values.double().topk(2, dim=1).values
    return top[:, 0] - top[:, 1]


def _runs_numba_kernel(setting, x, other):
    """Whether the fused upsample_add takes the numba kernel."""
    spec = geo.upsample_spec(x.shape[-2:], geo.check_upsample_args(
        size=tuple(other.shape[-2:]), mode=setting['mode'],
        align_corners=setting.get('align_corners') if setting['mode'] == 'bilinear' else None))
    return fused_backend.numba_add_applies(spec, x, other)


# ---------------------------------------------------------------------------- add
@pytest.mark.parametrize('dtype', DTYPES, ids=str)
@pytest.mark.parametrize('layout', LAYOUTS)
@pytest.mark.parametrize('setting', SETTINGS, ids=_sid)
def test_upsample_add_matches_unfused_and_reference(setting, layout, dtype):
    for seed, ((h, w), (H, W)) in enumerate(AWKWARD_SHAPES):
        x = make_input((2, 3, h, w), dtype, layout, seed=seed)
        other = make_input((2, 3, H, W), dtype, layout, seed=100 + seed)
        expected = other + _interp(x, (H, W), setting)
        for backend in ('auto', 'fused', 'native'):
            got = upsample_add(x, other, backend=backend, **setting)
            assert got.dtype == dtype and got.shape == expected.shape
            if backend != 'native' and _runs_numba_kernel(setting, x, other):
                assert_within_interpolation_rounding(got, expected, x)
            else:  # PyTorch's own kernel, then an in-place add: bit for bit
                assert torch.equal(got, expected), (backend, (h, w), (H, W))
        exact = ref.upsample(x, size=(H, W), **setting) + other.double()
        atol = ROUNDING[dtype] * 4 if dtype == torch.float16 else 2e-6
        torch.testing.assert_close(got.double(), exact, rtol=0, atol=atol)
        ref_backend = upsample_add(x, other, backend='reference', **setting)
        assert torch.equal(ref_backend, exact.to(dtype))


@pytest.mark.parametrize('setting', SETTINGS, ids=_sid)
def test_upsample_add_autograd_matches_unfused(setting):
    x = make_input((2, 3, 5, 7), torch.float64, seed=1).requires_grad_()
    other = make_input((2, 3, 9, 13), torch.float64, seed=2).requires_grad_()
    grad = make_input((2, 3, 9, 13), torch.float64, seed=3)
    got = torch.autograd.grad(upsample_add(x, other, **setting), (x, other), grad)
    want = torch.autograd.grad(other + _interp(x, (9, 13), setting), (x, other), grad)
    for g, w in zip(got, want):
        assert torch.equal(g, w)
    # and the gradient of the formula itself, against finite differences
    assert torch.autograd.gradcheck(lambda a, b: upsample_add(a, b, **setting),
                                    (x[:1, :1], other[:1, :1]))


def test_upsample_add_fused_backend_with_grad_falls_back_to_native():
    from mmseg_cann.utils.fallbacks import fallback_counts
    x = make_input((1, 2, 3, 3)).requires_grad_()
    other = make_input((1, 2, 6, 6), seed=1)
    out = upsample_add(x, other, backend='fused')
    assert out.requires_grad
    assert any(op == 'upsample_add' for op, _ in fallback_counts())


# ---------------------------------------------------------------------------- argmax
def _check_labels(got, upsampled_values, tol):
    """``got`` equals the argmax of ``upsampled_values`` wherever the top two are apart."""
    want = upsampled_values.argmax(1)
    assert got.dtype == torch.int64 and got.shape == want.shape
    differ = got != want
    if differ.any():
        gap = _top2_gap(upsampled_values)[differ]
        assert float(gap.max()) <= tol, f'{int(differ.sum())} labels differ, gap {gap.max()}'
    return int(differ.sum())


@pytest.mark.parametrize('dtype', DTYPES, ids=str)
@pytest.mark.parametrize('layout', LAYOUTS)
@pytest.mark.parametrize('setting', SETTINGS, ids=_sid)
def test_upsample_argmax_matches_unfused_and_reference(setting, layout, dtype):
    for seed, ((h, w), (H, W)) in enumerate(AWKWARD_SHAPES):
        x = make_input((2, 5, h, w), dtype, layout, seed=seed)
        eager = _interp(x, (H, W), setting)
        exact = ref.upsample(x, size=(H, W), **setting)
        for backend in ('auto', 'fused'):
            got = upsample_argmax(x, (H, W), backend=backend, **setting)
            if setting['mode'] == 'bilinear':
                # same arithmetic as the eager kernel up to the last bit of a product
                _check_labels(got, eager, 2 * ROUNDING[dtype])
            else:  # a gather commutes with the argmax: identical, ties included
                assert torch.equal(got, eager.argmax(1))
            _check_labels(got, exact, 2 * ROUNDING[dtype])
        assert torch.equal(upsample_argmax(x, (H, W), backend='native', **setting),
                           eager.argmax(1))
        assert torch.equal(upsample_argmax(x, (H, W), backend='reference', **setting),
                           exact.argmax(1))


@pytest.mark.parametrize('mode', ['nearest', 'nearest-exact'])
def test_upsample_argmax_nearest_keeps_first_of_exact_ties(mode):
    x = torch.randint(0, 3, (1, 6, 5, 7)).float()  # many exact ties
    eager = F.interpolate(x, size=(11, 16), mode=mode).argmax(1)
    assert torch.equal(upsample_argmax(x, (11, 16), mode=mode), eager)


@pytest.mark.parametrize('layout', LAYOUTS)
def test_upsample_argmax_compiled_path(monkeypatch, layout):
    """The torch.compile'd band function (used for large outputs without the numba
    kernel: other dtypes and devices) on small shapes."""
    monkeypatch.setattr(fused_backend, 'COMPILE_MIN_ELEMENTS', 0)
    monkeypatch.setattr(fused_backend, 'USE_NUMBA', False)
    for seed, ((h, w), (H, W)) in enumerate([((5, 7), (37, 29)), ((9, 11), (4, 5))]):
        x = make_input((2, 4, h, w), torch.float32, layout, seed=seed)
        got = upsample_argmax(x, (H, W), backend='fused')
        _check_labels(got, F.interpolate(x, (H, W), mode='bilinear'), 2 * ROUNDING[torch.float32])


def test_band_plan_covers_every_row_with_valid_taps():
    for h, H in [(1, 2), (3, 4), (7, 8), (128, 1024), (9, 4), (5, 5), (2, 82), (13, 3)]:
        for ac in (False, True):
            i0, i1, _, _ = linear_taps(h, H, ac)
            covered = torch.zeros(H, dtype=torch.bool)
            for y0, r0, rows, (a, b, w0, w1) in fused_backend._band_plan(
                    h, H, ac, max(1, H // 3)):
                assert 0 <= r0 and r0 + rows <= h
                assert int(a.min()) >= 0 and int(b.max()) < rows
                assert torch.equal(a + r0, i0[y0:y0 + len(a)])
                assert torch.equal(b + r0, i1[y0:y0 + len(b)])
                covered[y0:y0 + len(a)] = True
            assert covered.all()


def test_linear_taps_match_reference_weights():
    for h, H in [(3, 4), (7, 8), (2, 82), (9, 4), (1, 6)]:
        for ac in (False, True):
            i0, i1, w0, w1 = linear_taps(h, H, ac)
            mat = torch.zeros(H, h, dtype=torch.float64)
            mat[torch.arange(H), i0] += w0.double()
            mat[torch.arange(H), i1] += w1.double()
            torch.testing.assert_close(mat, ref.interpolation_matrix(h, H, 'bilinear', ac),
                                       rtol=0, atol=1e-6)


# ---------------------------------------------------------------------------- bad input
@pytest.mark.parametrize('call, error, words', [
    (lambda x, o: upsample_add(x.numpy(), o), TypeError, 'input must be a torch.Tensor'),
    (lambda x, o: upsample_add(x, [1]), TypeError, 'other must be a torch.Tensor'),
    (lambda x, o: upsample_add(x, o[:, :2]), ValueError, 'same batch and channel'),
    (lambda x, o: upsample_add(x, o.half()), TypeError, 'same dtype and device'),
    (lambda x, o: upsample_add(x[0], o), ValueError, '(N, C, H, W)'),
    (lambda x, o: upsample_add(x, o, mode='bicubic'), ValueError, 'mode must be one of'),
    (lambda x, o: upsample_add(x, o, mode='nearest', align_corners=True), ValueError,
     'align_corners=True'),
    (lambda x, o: upsample_add(x, o, align_corners=1), TypeError, 'align_corners'),
    (lambda x, o: upsample_add(x, o, backend='tuned'), ValueError, 'backend must be one of'),
    (lambda x, o: upsample_argmax(x, (0, 4)), ValueError, 'size must be greater than zero'),
    (lambda x, o: upsample_argmax(x, 'big'), TypeError, 'size'),
    (lambda x, o: upsample_argmax(x.long(), 8), TypeError, 'dtype'),
    (lambda x, o: upsample_argmax(x, 8, mode='area'), ValueError, 'mode must be one of'),
    (lambda x, o: upsample_argmax(x, 8, backend=None), TypeError, 'backend must be a string'),
])
def test_bad_input_raises_before_any_kernel(monkeypatch, call, error, words):
    def boom(*args, **kwargs):
        raise AssertionError('a kernel ran')
    for module in (fused_backend,):
        monkeypatch.setattr(module, 'upsample_add', boom)
        monkeypatch.setattr(module, 'upsample_argmax', boom)
    x, o = make_input((1, 3, 4, 4)), make_input((1, 3, 8, 8))
    with pytest.raises(error, match=__import__('re').escape(words)):
        call(x, o)
