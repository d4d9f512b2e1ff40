"""``resize_conv2d`` (upsample + convolution without the upsampled tensor) against
PyTorch's own composition ``F.conv2d(F.interpolate(...))`` and a float64 composition,
with the documented bound; every method (mix-first, polyphase and, for any size,
mix-resize)."""
from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from mmseg_cann.ops import resize_conv as rc
from mmseg_cann.ops import resize_conv2d, resize_conv2d_macs, resize_conv2d_plan
from mmseg_cann.ops.resize_conv import resize_conv2d_error_bound
from mmseg_cann.utils import fallback_counts

METHODS = ['mix_first', 'polyphase', 'mix_resize']


def _composition(x, w, b=None, *, size=None, scale_factor=None, mode='bilinear',
                 align_corners=False, padding=0, stride=1, dilation=1, groups=1):
    """What resize_conv2d is defined as: PyTorch's own ops."""
    interp = dict(mode=mode) if mode in ('nearest', 'nearest-exact', 'area') else \
        dict(mode=mode, align_corners=align_corners)
    up = F.interpolate(x, size=size, scale_factor=scale_factor, **interp)
    return F.conv2d(up, w, b, stride, padding, dilation, groups)


def _make(shape, k, cout=4, dtype=torch.float64, seed=0, scale=1.0, layout='contiguous'):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=g, dtype=torch.float64) * scale).to(dtype)
    w = torch.randn(cout, shape[1], k, k, generator=g, dtype=torch.float64).to(dtype)
    b = (torch.randn(cout, generator=g, dtype=torch.float64) * scale).to(dtype)
    if layout == 'channels_last':
        x = x.contiguous(memory_format=torch.channels_last)
    return x, w, b


def _sizes(hw, s, mode, align_corners):
    if mode == 'bilinear' and align_corners:
        return tuple(s * (n - 1) + 1 if n > 1 else s for n in hw)
    return tuple(s * n for n in hw)


MODES = [('nearest', False), ('nearest-exact', False), ('bilinear', False), ('bilinear', True)]
SHAPES = [(1, 1), (1, 6), (5, 1), (3, 5), (6, 4)]
FACTORS = [2, 3, 4, 8]
KERNELS = [(1, 0), (1, 1), (2, 1), (3, 0), (3, 1), (4, 3), (5, 2), (5, 1)]


def _run_method(method, x, w, b, **kw):
    """The op with ``method`` forced (``resize_conv2d`` itself runs the plan's choice)."""
    plan = resize_conv2d_plan(x, w, b, method=method, **kw)
    assert plan.applies and plan.method == method, plan.reason
    return rc.apply_plan(x, w, b, plan)


# ------------------------------------------------------------------------ values
@pytest.mark.parametrize('method', METHODS)
@pytest.mark.parametrize('mode,align_corners', MODES, ids=lambda v: str(v))
@pytest.mark.parametrize('s', FACTORS)
def test_float64_matches_composition_every_shape(mode, align_corners, s, method):
    """Every awkward shape, kernel and padding, both methods: the rewrite runs and agrees
    with PyTorch's composition to float64 rounding (exact in arithmetic, borders
    included)."""
    for seed, (hw, (k, pad)) in enumerate(itertools.product(SHAPES, KERNELS)):
        x, w, b = _make((2, 3) + hw, k, seed=seed)
        size = _sizes(hw, s, mode, align_corners)
        if min(size) + 2 * pad < k:
            continue  # no output (PyTorch raises; see test_bad_input_names_the_argument)
        kw = dict(size=size, mode=mode, align_corners=align_corners, padding=pad)
        got = _run_method(method, x, w, b, **kw)
        expected = _composition(x, w, b, **kw)
        assert got.shape == expected.shape and got.dtype == torch.float64
        bound = resize_conv2d_error_bound(x, w, b, method=method, **kw)
        assert ((got - expected).abs() <= 2 * bound).all(), (hw, k, pad)
        scale = bound.max() / (bound.new_tensor(float(x.shape[1] * 9 + 3)) * 2.0 ** -53)
        assert (got - expected).abs().max() <= 1e-12 * scale, (hw, k, pad)


@pytest.mark.parametrize('method', METHODS)
@pytest.mark.parametrize('scale_factor', [2, 3.0, (2, 4), (4, 1), (1.0, 8.0)])
def test_scale_factor_and_unequal_factors(scale_factor, method):
    x, w, b = _make((1, 3, 5, 6), 3)
    kw = dict(scale_factor=scale_factor, mode='bilinear', padding=1)
    torch.testing.assert_close(_run_method(method, x, w, b, **kw),
                               _composition(x, w, b, **kw), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize('method', METHODS)
@pytest.mark.parametrize('mode,align_corners', MODES[::2] + MODES[3:], ids=str)
@pytest.mark.parametrize('s', [2, 3, 4, 8])
def test_float32_large_activations_within_bound(mode, align_corners, s, method):
    """float32, random weights, activations ~1e4: within the documented bound of the
    float64 composition, and of PyTorch's float32 composition (twice the bound); and in
    practice no worse than the composition's own rounding."""
    x, w, b = _make((2, 64, 6, 5), 3, cout=32, dtype=torch.float32, seed=s, scale=1e4)
    kw = dict(size=_sizes((6, 5), s, mode, align_corners), mode=mode,
              align_corners=align_corners, padding=1)
    got = _run_method(method, x, w, b, **kw)
    direct = _composition(x, w, b, **kw)
    exact = _composition(x.double(), w.double(), b.double(), **kw)
    bound = resize_conv2d_error_bound(x, w, b, method=method, **kw)
    assert ((got.double() - exact).abs() <= bound).all()
    assert ((got.double() - direct.double()).abs() <= 2 * bound).all()
    assert (got.double() - exact).abs().max() <= 4 * (direct.double() - exact).abs().max()


def test_float32_bound_includes_pytorch_geometry_rounding():
    """Factor 3: PyTorch's float32 source coordinates are not exact; the bound says by
    how much (``geometry_error``) and holds against the float32 composition."""
    x, w, b = _make((1, 8, 40, 3), 3, dtype=torch.float32, scale=100.0)
    kw = dict(size=(120, 9), mode='bilinear', padding=1)
    plan = resize_conv2d_plan(x, w, b, **kw)
    assert plan.geometry_error[0] > 0 and plan.geometry_error[1] >= 0
    assert resize_conv2d_plan(x, w, b, size=(160, 12), padding=1).geometry_error == (0, 0)
    got = resize_conv2d(x, w, b, **kw)
    bound = resize_conv2d_error_bound(x, w, b, **kw)
    assert ((got.double() - _composition(x, w, b, **kw).double()).abs() <= 2 * bound).all()


@pytest.mark.parametrize('method', METHODS)
@pytest.mark.parametrize('layout', ['contiguous', 'channels_last'])
def test_batch_and_layout(layout, method):
    x, w, b = _make((3, 5, 4, 7), 3, dtype=torch.float32, layout=layout)
    kw = dict(size=(16, 28), mode='bilinear', padding=1)
    got = _run_method(method, x, w, b, **kw)
    expected = _composition(x, w, b, **kw)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    cl = torch.channels_last
    assert got.is_contiguous(memory_format=cl) == expected.is_contiguous(memory_format=cl)
    assert got.is_contiguous() == expected.is_contiguous()


@pytest.mark.parametrize('method', METHODS)
def test_padding_strings_and_no_bias(method):
    x, w, _ = _make((1, 2, 3, 4), 3)
    for padding, same in (('same', 1), ('valid', 0)):
        kw = dict(size=(12, 16), mode='nearest', padding=padding)
        torch.testing.assert_close(_run_method(method, x, w, None, **kw),
                                   _composition(x, w, **{**kw, 'padding': same}))


def test_auto_takes_the_phase_method_with_fewer_macs():
    """Few input channels: the polyphase kernels are cheaper; many: mixing first (its
    channel products run at low resolution, the rest scales with C_out alone)."""
    for cin, expected in ((3, 'polyphase'), (64, 'mix_first')):
        shapes = ((1, cin, 8, 8), (16, cin, 3, 3))
        plans = {m: resize_conv2d_plan(*shapes, size=(32, 32), padding=1, method=m)
                 for m in ('mix_first', 'polyphase')}
        auto = resize_conv2d_plan(*shapes, size=(32, 32), padding=1)
        assert auto.method == expected
        assert auto.macs_rewritten == min(p.macs_rewritten for p in plans.values())
        assert plans[expected].macs_rewritten < plans[
            {'polyphase': 'mix_first', 'mix_first': 'polyphase'}[expected]].macs_rewritten


# ----------------------------------------------------------------------- gradients
@pytest.mark.parametrize('mode,align_corners,s,hw,k,pad', [
    ('bilinear', False, 2, (3, 4), 3, 1), ('bilinear', False, 3, (1, 3), 3, 1),
    ('bilinear', True, 2, (3, 2), 3, 0), ('nearest', False, 4, (2, 1), 3, 1),
    ('bilinear', False, 4, (2, 2), 5, 2), ('bilinear', False, 2, (2, 3), 1, 1)])
@pytest.mark.parametrize('method', METHODS)
def test_gradcheck_float64(mode, align_corners, s, hw, k, pad, method):
    x, w, b = _make((1, 2) + hw, k, cout=2)
    kw = dict(size=_sizes(hw, s, mode, align_corners), mode=mode,
              align_corners=align_corners, padding=pad)
    inputs = tuple(t.clone().requires_grad_() for t in (x, w, b))
    # fast mode: random projections of the Jacobian (the full one for a 1xN input)
    assert torch.autograd.gradcheck(lambda *t: _run_method(method, *t, **kw), inputs,
                                    fast_mode=hw[0] > 1)


@pytest.mark.parametrize('method', METHODS)
@pytest.mark.parametrize('mode', ['nearest', 'bilinear'])
@pytest.mark.parametrize('s', [2, 4, 8])
def test_float32_gradients_match_composition(mode, s, method):
    """Gradients of input, weight and bias against the float64 composition's, within
    the same kind of bound: gamma(m) times the gradient of the absolute-value
    composition, ``m`` the most products in one gradient sum."""
    x, w, b = _make((2, 16, 5, 4), 3, cout=8, dtype=torch.float32, seed=s, scale=1e3)
    g = torch.randn(2, 8, 5 * s, 4 * s, generator=torch.Generator().manual_seed(1))
    kw = dict(size=(5 * s, 4 * s), mode=mode, padding=1)

    def grads(fn, dtype, absolute=False):
        ts = [t.detach().to(dtype) for t in (x, w, b)]
        if absolute:
            ts = [t.abs() for t in ts]
        ts = [t.requires_grad_() for t in ts]
        gg = g.to(dtype).abs() if absolute else g.to(dtype)
        return torch.autograd.grad(fn(*ts, **kw), ts, gg)

    got = grads(lambda *t, **k: _run_method(method, *t, **k), torch.float32)
    direct = grads(_composition, torch.float32)
    exact = grads(_composition, torch.float64)
    magnitude = grads(_composition, torch.float64, absolute=True)
    m = 2 * 5 * s * 4 * s * 16 + 8 * 25 * s * s + 6
    gamma = m * 2.0 ** -24 / (1 - m * 2.0 ** -24)
    for a, d, e, mag in zip(got, direct, exact, magnitude):
        assert ((a.double() - e).abs() <= gamma * mag).all()
        assert ((a.double() - d.double()).abs() <= 2 * gamma * mag).all()


# ----------------------------------------------------------------------- fallbacks
@pytest.mark.parametrize('kw,why', [
    (dict(size=(12, 16), stride=2), 'stride'),
    (dict(size=(12, 16), dilation=2, padding=2), 'dilation'),
    (dict(size=(12, 16), mode='bicubic'), 'bicubic'),
    (dict(size=(12, 16), mode='area'), 'area'),
    (dict(size=(3, 4)), 'does not change'),
])
def test_fallback_is_the_composition(kw, why):
    """Outside the rewrite's domain the composition runs, counted with the reason."""
    x, w, b = _make((2, 4, 3, 4), 3, dtype=torch.float32)
    plan = resize_conv2d_plan(x, w, b, **kw)
    assert not plan.applies and why in plan.reason
    assert plan.macs_direct == plan.macs_rewritten
    before = fallback_counts().get(('resize_conv2d', plan.reason), 0)
    assert torch.equal(resize_conv2d(x, w, b, **kw), _composition(x, w, b, **kw))
    assert fallback_counts()[('resize_conv2d', plan.reason)] == before + 1


@pytest.mark.parametrize('kw,why', [
    (dict(size=(10, 16)), 'integer multiple'),
    (dict(scale_factor=2.5), 'integer multiple'),
    (dict(size=(12, 16), align_corners=True), 'align_corners'),
])
def test_any_size_takes_mix_resize(kw, why):
    """Sizes without an integer factor (and downsampling): the phase methods do not
    apply (the reason says why), mix-resize does, within its bound of the composition."""
    x, w, b = _make((2, 16, 3, 4), 3, cout=8, dtype=torch.float32)
    for method in ('polyphase', 'mix_first'):
        plan = resize_conv2d_plan(x, w, b, method=method, **kw)
        assert not plan.applies and why in plan.reason
    plan = resize_conv2d_plan(x, w, b, **kw)
    assert plan.applies and plan.method == 'mix_resize' and plan.factors is None
    assert plan.macs_rewritten < plan.macs_direct
    got = resize_conv2d(x, w, b, **kw)
    bound = resize_conv2d_error_bound(x, w, b, **kw)
    assert ((got.double() - _composition(x, w, b, **kw).double()).abs() <= 2 * bound).all()


@pytest.mark.parametrize('mode,align_corners', MODES, ids=str)
def test_mix_resize_downsampling(mode, align_corners):
    """Downsampling has no integer factor; mix-resize computes it (the plan runs the
    composition, which has fewer multiply-accumulates there)."""
    x, w, b = _make((2, 3, 9, 11), 3)
    kw = dict(size=(4, 5), mode=mode, align_corners=align_corners, padding=1)
    assert 'shrinks' in resize_conv2d_plan(x, w, b, method='polyphase', **kw).reason
    assert not resize_conv2d_plan(x, w, b, **kw).applies
    got = _run_method('mix_resize', x, w, b, **kw)
    torch.testing.assert_close(got, _composition(x, w, b, **kw), rtol=1e-12, atol=1e-12)


def test_composition_where_it_takes_fewer_macs():
    """One channel in and out, 1x1: interpolating after mixing costs more than the
    composition's convolution, so 'auto' runs the composition (counted, with the
    figures); the method can still be asked for."""
    x, w, b = _make((1, 1, 3, 4), 1, cout=1, dtype=torch.float32)
    plan = resize_conv2d_plan(x, w, b, size=(10, 16))
    assert not plan.applies and 'more multiply-accumulates' in plan.reason
    assert resize_conv2d_plan(x, w, b, size=(10, 16), method='mix_resize').applies
    assert torch.equal(resize_conv2d(x, w, b, size=(10, 16)),
                       _composition(x, w, b, size=(10, 16)))


def test_fallback_groups_dtype_and_empty_batch():
    x, w, b = _make((2, 4, 3, 4), 3, dtype=torch.float32)
    wg = w[:, :2].contiguous()
    plan = resize_conv2d_plan(x, wg, b, size=(6, 8), groups=2)
    assert not plan.applies and 'groups' in plan.reason
    assert torch.equal(resize_conv2d(x, wg, b, size=(6, 8), groups=2),
                       _composition(x, wg, b, size=(6, 8), groups=2))
    xh, wh, bh = x.bfloat16(), w.bfloat16(), b.bfloat16()
    assert 'dtype' in resize_conv2d_plan(xh, wh, bh, size=(6, 8)).reason
    assert torch.equal(resize_conv2d(xh, wh, bh, size=(6, 8)),
                       _composition(xh, wh, bh, size=(6, 8)))
    empty = x[:0]
    assert 'empty batch' in resize_conv2d_plan(empty, w, b, size=(6, 8)).reason
    assert resize_conv2d(empty, w, b, size=(6, 8), padding=1).shape == (0, 4, 6, 8)


def test_nearest_index_rule_decides():
    """2 -> 82 is not an integer factor for the phase methods; a factor whose PyTorch
    float32 nearest index is floor(d / s) everywhere is. Mix-resize takes both (it
    calls PyTorch's own nearest), equal to the composition."""
    phase = resize_conv2d_plan((1, 1, 2, 2), (1, 1, 3, 3), size=(82, 82), mode='nearest',
                               method='polyphase')
    assert not phase.applies and 'nearest index' in phase.reason
    assert resize_conv2d_plan((1, 1, 2, 2), (1, 1, 3, 3), size=(82, 82),
                              mode='nearest').method == 'mix_resize'
    assert resize_conv2d_plan((1, 1, 7, 7), (1, 1, 3, 3), size=(21, 21),
                              mode='nearest').factors == (3, 3)
    x, w, b = _make((1, 2, 2, 2), 3, cout=2)
    kw = dict(size=(82, 82), mode='nearest', padding=1)
    torch.testing.assert_close(resize_conv2d(x, w, b, **kw), _composition(x, w, b, **kw),
                               rtol=1e-12, atol=1e-12)


# ----------------------------------------------------------------------- bad input
@pytest.mark.parametrize('call,exc,words', [
    (lambda x, w: resize_conv2d(x.numpy(), w, size=4), TypeError, 'input'),
    (lambda x, w: resize_conv2d(x, w.numpy(), size=4), TypeError, 'weight'),
    (lambda x, w: resize_conv2d(x, w, [0.0], size=4), TypeError, 'bias'),
    (lambda x, w: resize_conv2d(x[0], w, size=4), ValueError, 'input'),
    (lambda x, w: resize_conv2d(x, w[0], size=4), ValueError, 'weight'),
    (lambda x, w: resize_conv2d(x, w[:, :1], size=4), ValueError, 'channels'),
    (lambda x, w: resize_conv2d(x, w, torch.zeros(2), size=4), ValueError, 'bias'),
    (lambda x, w: resize_conv2d(x, w.double(), size=4), TypeError, 'weight'),
    (lambda x, w: resize_conv2d(x.long(), w.long(), size=4), TypeError, 'dtype'),
    (lambda x, w: resize_conv2d(x, w), ValueError, 'size'),
    (lambda x, w: resize_conv2d(x, w, size=4, scale_factor=2), ValueError, 'size'),
    (lambda x, w: resize_conv2d(x, w, size=4, mode='cubic'), ValueError, 'mode'),
    (lambda x, w: resize_conv2d(x, w, size=4, mode='nearest', align_corners=True),
     ValueError, 'align_corners'),
    (lambda x, w: resize_conv2d(x, w, size=4, align_corners='yes'), TypeError,
     'align_corners'),
    (lambda x, w: resize_conv2d(x, w, size=4, stride=0), ValueError, 'stride'),
    (lambda x, w: resize_conv2d(x, w, size=4, padding=-1), ValueError, 'padding'),
    (lambda x, w: resize_conv2d(x, w, size=4, padding='full'), ValueError, 'padding'),
    (lambda x, w: resize_conv2d(x, w, size=4, dilation=(1, 0)), ValueError, 'dilation'),
    (lambda x, w: resize_conv2d(x, w, size=4, groups=0), ValueError, 'groups'),
    (lambda x, w: resize_conv2d(x, w, size=4, groups=1.0), TypeError, 'groups'),
    (lambda x, w: resize_conv2d(x, w, size=1), ValueError, 'kernel'),
    (lambda x, w: resize_conv2d_plan(x, w, size=4, grouping='rows'), ValueError, 'grouping'),
    (lambda x, w: resize_conv2d_plan('x', w, size=4), TypeError, 'input'),
])
def test_bad_input_names_the_argument(call, exc, words):
    x, w, _ = _make((1, 2, 2, 2), 3, cout=3, dtype=torch.float32)
    with pytest.raises(exc, match=words):
        call(x, w)


# ----------------------------------------------------------------------- MACs
def _counted_macs(fn, weight_sized=0):
    """Convolution and matrix-product multiply-accumulates torch counts, less
    ``weight_sized`` (the polyphase kernels' preparation, a product of the weight with
    fixed coefficients, is not part of the count)."""
    with FlopCounterMode(display=False) as counter:
        fn()
    flops = counter.get_flop_counts()['Global']
    ops = (torch.ops.aten.convolution, torch.ops.aten.bmm, torch.ops.aten.mm)
    return sum(flops.get(op, 0) for op in ops) // 2 - weight_sized


def _kernel_preparation_macs(plan, w):
    """MACs of the polyphase kernels' products ``T @ w`` (one per phase group)."""
    ah, aw = plan.axes
    cout, cin, kh, kw = w.shape
    return sum(cout * (gh[1] - gh[0]) * (gw[1] - gw[0]) * (gh[3] - gh[2] + 1) *
               (gw[3] - gw[2] + 1) * kh * kw * cin for gh in ah.groups for gw in aw.groups)


@pytest.mark.parametrize('method,grouping', [('polyphase', 'footprint'),
                                             ('polyphase', 'union'), ('mix_first', 'union')])
@pytest.mark.parametrize('s', [2, 3, 4, 8])
def test_macs_are_what_runs(s, method, grouping):
    """The MAC counter agrees with torch's flop counter on every method."""
    x, w, b = _make((1, 6, 4, 5), 3, cout=5, dtype=torch.float32)
    kw = dict(size=(4 * s, 5 * s), padding=1)
    plan = resize_conv2d_plan(x, w, b, grouping=grouping, method=method, **kw)
    preparation = _kernel_preparation_macs(plan, w) if method == 'polyphase' else 0
    assert _counted_macs(lambda: rc.apply_plan(x, w, b, plan), preparation) == \
        plan.macs_rewritten
    assert _counted_macs(lambda: _composition(x, w, b, **kw)) == plan.macs_direct


@pytest.mark.parametrize('size', [(13, 17), (8, 10), (4, 7), (3, 3)])
def test_mix_resize_macs_are_what_runs(size):
    """Mix-resize: torch's flop counter sees the channel mixing (its only product); the
    plan adds the interpolations (two products per value along a bilinear axis that
    changes size, none along one that keeps it) and the shifted sums of the taps,
    written out here."""
    x, w, b = _make((1, 6, 4, 5), 3, cout=5, dtype=torch.float32)
    plan = resize_conv2d_plan(x, w, b, size=size, padding=1, method='mix_resize')
    (h, wd), (hu, wu) = (4, 5), size
    ho, wo = hu, wu  # 'same' padding
    mixing = 5 * 9 * 6 * h * wd
    assert _counted_macs(lambda: rc.apply_plan(x, w, b, plan)) == mixing
    th, tw = (0 if up == n else 2 for up, n in ((hu, h), (wu, wd)))
    width = 5 * 9 * h * (tw * wu + wo)
    height = 5 * 3 * wo * (th * hu + ho)
    assert plan.macs_rewritten == mixing + width + height


def test_uperhead_bottleneck_macs():
    """fpn_bottleneck at 512x1024 input: 4 maps at 128x256, three resized 2x/4x/8x,
    a 3x3 conv 4*512 -> 512 split per input: 309 G -> 114 G (0.37x) mixing first,
    257 G (0.83x) with polyphase kernels."""
    w = (512, 512, 3, 3)
    direct = {'mix_first': 0, 'polyphase': 0}
    rewritten = dict(direct)
    for method in direct:
        for s in (1, 2, 4, 8):
            d, r = resize_conv2d_macs((1, 512, 128 // s, 256 // s), w, size=(128, 256),
                                      padding=1, method=method)
            direct[method] += d
            rewritten[method] += r
            if s == 1 or method != 'mix_first':
                continue
            # written out: the 9 tap matrices over the (128/s + 2) x (256/s + 2)
            # replicated window; per channel a 9-map, 3x3 (union footprint) convolution
            # giving s*s phases; the first and last row and column directly
            h, wd = 128 // s, 256 // s
            mixing = 9 * 512 * 512 * (h + 2) * (wd + 2)
            phases = 512 * s * s * 9 * 9 * h * wd
            border = 512 * 512 * 9 * (2 * 256 + 2 * 128)
            assert r == mixing + phases + border
    assert round(direct['mix_first'] / 1e9) == 309
    # the unresized slice (77.3 G) is most of what is left
    assert round(rewritten['mix_first'] / 1e9) == 114
    # polyphase: interior taps per axis (2s + 2) / s of 3 (252 G), plus the border strips
    assert round(rewritten['polyphase'] / 1e9) == 257


# ----------------------------------------------------------------------- weight changes
@pytest.mark.parametrize('method', METHODS)
def test_weight_changes_are_seen(method):
    """Nothing derived from a weight outlives a call: an in-place update, an edit through
    ``.data`` (which bypasses the version counter: mmengine's EMAHook swaps weights with
    ``.data.copy_``), a new ``.data`` and a new weight are all seen, with and without
    autograd."""
    x, w, b = _make((1, 3, 4, 5), 3, dtype=torch.float32)
    conv = torch.nn.Conv2d(3, 4, 3, padding=1)
    kw = dict(size=(16, 20), padding=1)

    def run(weight):
        return _run_method(method, x, weight, None, **kw)
    with torch.no_grad():
        conv.weight.copy_(w)
        first = run(conv.weight)
        conv.weight.mul_(2)
        torch.testing.assert_close(run(conv.weight), 2 * first)
        conv.weight.data.mul_(-0.5)
        torch.testing.assert_close(run(conv.weight), -first)
        conv.weight.data.copy_(3 * w)
        torch.testing.assert_close(run(conv.weight), 3 * first)
        conv.weight.data = -w
        torch.testing.assert_close(run(conv.weight), -first)
        torch.testing.assert_close(run(w), first)
    y = resize_conv2d(x, conv.weight, None, **kw)  # with autograd: computed, not kept
    y.sum().backward()
    assert conv.weight.grad is not None and conv.weight.grad.abs().sum() > 0


# ----------------------------------------------------------------------- ONNX
class _ResizeConv(torch.nn.Module):
    def __init__(self, factor, channels=4):
        super().__init__()
        self.conv = torch.nn.Conv2d(channels, 3, 3, padding=1)
        self.factor = factor

    def forward(self, x):
        size = (x.shape[2] * self.factor, x.shape[3] * self.factor)
        return resize_conv2d(x, self.conv.weight, self.conv.bias, size=size, padding=1)


@pytest.mark.parametrize('channels,method', [(4, 'polyphase'), (48, 'mix_first')])
@pytest.mark.parametrize('target', ['onnx', 'atc'])
def test_onnx_export_runs_in_onnxruntime(target, channels, method):
    """Both methods export (Conv, DepthToSpace, Pad, Slice, ...; no Resize) and
    onnxruntime (and the graph as ATC reads it) reproduces the op."""
    pytest.importorskip('onnxruntime')
    from mmseg_cann.onnx import atc_reading, export_onnx
    from mmseg_cann.onnx.runtime import run_onnx
    model = _ResizeConv(4, channels).eval()
    x = torch.randn(1, channels, 5, 7, generator=torch.Generator().manual_seed(0))
    assert resize_conv2d_plan(x, model.conv.weight, size=(20, 28), padding=1).method == method
    with torch.no_grad():
        expected = model(x).numpy()
        direct = _composition(x, model.conv.weight, model.conv.bias, size=(20, 28),
                              padding=1).numpy()
    proto = export_onnx(model, x, target=target)
    ops = {n.op_type for n in proto.graph.node}
    assert 'DepthToSpace' in ops and 'Conv' in ops and 'Resize' not in ops
    graphs = [proto] + ([atc_reading(proto)] if target == 'atc' else [])
    for graph in graphs:
        got = run_onnx(graph, [x.numpy()])[0]
        assert got.shape == expected.shape
        assert abs(got - expected).max() <= 1e-5 * abs(direct).max()


def test_phase_kernels_of_weight_slices():
    """A conv over a concat split per input (``torch.split(weight, ...)``, a new view each
    call): each slice's kernels are its own and follow updates of the parameter."""
    x, w, _ = _make((1, 3, 4, 5), 3, dtype=torch.float32)
    weight = torch.nn.Parameter(torch.cat([w, -2 * w], 1))
    kw = dict(size=(16, 20), padding=1)
    with torch.no_grad():
        for _ in range(2):
            first, second = torch.split(weight, 3, dim=1)
            a, b = resize_conv2d(x, first, **kw), resize_conv2d(x, second, **kw)
            torch.testing.assert_close(b, -2 * a)
            torch.testing.assert_close(a, _composition(x, w, **kw), rtol=1e-5, atol=1e-5)
        weight[:, 3:].zero_()
        assert resize_conv2d(x, torch.split(weight, 3, dim=1)[1], **kw).abs().max() == 0


@pytest.mark.parametrize('channels', [48, 4])
def test_torch_compile_runs_the_composition_and_export_the_rewrite(channels):
    """torch.compile(fullgraph=True) traces the composition (the plan's geometry is
    Python work Dynamo cannot trace); torch.export records the rewrite (no upsampling
    node), both with the op's values."""
    x, w, b = _make((1, channels, 5, 7), 3, cout=6, dtype=torch.float32)
    kw = dict(size=(20, 28), padding=1)

    class Op(torch.nn.Module):
        def forward(self, x, w, b):
            return resize_conv2d(x, w, b, **kw)
    expected = _composition(x, w, b, **kw)
    tol = dict(rtol=0, atol=1e-5 * float(expected.abs().max()))
    torch._dynamo.reset()
    compiled = torch.compile(Op(), fullgraph=True, backend='eager')
    torch.testing.assert_close(compiled(x, w, b), expected, **tol)
    exported = torch.export.export(Op(), (x, w, b))
    targets = [str(n.target) for n in exported.graph.nodes]
    assert not any('upsample' in t for t in targets), targets
    torch.testing.assert_close(exported.module()(x, w, b), resize_conv2d(x, w, b, **kw))
    torch.testing.assert_close(exported.module()(x, w, b), expected, **tol)


def test_inference_mode_tensors():
    x, w, b = _make((1, 3, 4, 5), 3, dtype=torch.float32)
    with torch.inference_mode():
        xi, wi, bi = x.clone(), w.clone(), b.clone()
        got = resize_conv2d(xi, wi, bi, size=(8, 10), padding=1)
    torch.testing.assert_close(got, _composition(x, w, b, size=(8, 10), padding=1))


# ----------------------------------------------------------------------- modes
@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16])
@pytest.mark.parametrize('size', [(16, 20), (13, 17)])
@pytest.mark.parametrize('input_dtype', ['float32', 'autocast'])
def test_autocast_follows_conv2d(dtype, size, input_dtype):
    """Under ``torch.autocast`` the op casts its operands as a convolution's and returns
    autocast's dtype, as ``F.conv2d(F.interpolate(...))`` does (float32 parameters, an
    input of float32 or of autocast's dtype); its values are within two roundings to
    that dtype of the float64 composition of the cast operands (computed in float32,
    rounded once)."""
    x, w, b = _make((2, 16, 4, 5), 3, cout=8, dtype=torch.float32)
    if input_dtype == 'autocast':
        x = x.to(dtype)
    kw = dict(size=size, padding=1)
    with torch.autocast('cpu', dtype=dtype):
        got, ran = rc.run_resize_conv2d(x, w, b, **kw)
        expected = _composition(x, w, b, **kw)
    assert ran in METHODS
    assert got.dtype == expected.dtype == dtype
    exact = _composition(*(t.to(dtype).double() for t in (x, w, b)), **kw)
    magnitude = _composition(*(t.to(dtype).double().abs() for t in (x, w, b)), **kw)
    ulp = 2.0 ** -8 if dtype == torch.bfloat16 else 2.0 ** -11
    assert ((got.double() - exact).abs() <= 2 * ulp * magnitude + 1e-30).all()
    w16 = w.to(dtype)
    with torch.autocast('cpu', dtype=dtype), pytest.raises(TypeError, match='weight'):
        resize_conv2d(x.double(), w16, None, **kw)  # float64 is not cast (F.conv2d: neither)


def test_jit_trace_is_size_generic():
    """``torch.jit.trace`` records the composition with the traced sizes (counted): the
    traced module gives the op's values at other input sizes too."""
    conv = torch.nn.Conv2d(8, 4, 3, padding=1)

    class Head(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = conv

        def forward(self, x, like):
            return resize_conv2d(x, self.conv.weight, self.conv.bias, size=like.shape[2:],
                                 padding=1)
    head = Head().eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        traced = torch.jit.trace(head, (torch.randn(1, 8, 13, 17, generator=g),
                                        torch.zeros(1, 1, 25, 33)))
        for hw, out in (((7, 9), (13, 17)), ((16, 16), (32, 32)), ((13, 17), (25, 33))):
            x, like = torch.randn((2, 8) + hw, generator=g), torch.zeros((1, 1) + out)
            expected = _composition(x, conv.weight, conv.bias, size=out, padding=1)
            got = traced(x, like)
            assert got.shape == expected.shape
            torch.testing.assert_close(got, expected)
    assert any('jit.trace' in reason for (op, reason) in fallback_counts()
               if op == 'resize_conv2d')


@pytest.mark.parametrize('size', [(6, 8), (7, 9)])
def test_empty_batch(size):
    x, w, b = _make((0, 4, 3, 4), 3, dtype=torch.float32)
    assert resize_conv2d(x, w, b, size=size, padding=1).shape == (0, 4) + size
