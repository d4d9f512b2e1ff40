"""Plain ``torch.onnx.export`` (TorchScript and dynamo) of the CANN modules and ops: exact
in onnxruntime, or a clear error -- never a silently different graph.

While a standard exporter traces, ``backend='auto'`` records PyTorch's own aten op where
both exporters translate it exactly (:mod:`mmseg_cann.core.standard_export`) and the forms
of :mod:`mmseg_cann.backends.portable` otherwise; before those existed the exclude-pad
SAME average and legacy nearest 2 -> 82 exported wrong (errors 0.69-0.91 and 1.9-2.4)."""
from __future__ import annotations

import contextlib
import io
import logging
import warnings

import numpy as np
import pytest
import torch

from mmseg_cann import CANNAdaptiveAvgPool2d, CANNAvgPool2d, CANNMaxPool2d, CANNUpsample
from mmseg_cann.core import geometry as geo
from tests._helpers import (AWKWARD_SHAPES, UPSAMPLE_SETTINGS, Many, make_input, setting_id,
                            POOL_INPUTS, POOL_SETTINGS, valid_pool_cases)

pytest.importorskip('onnxruntime')
pytest.importorskip('onnxscript')
from mmseg_cann.onnx.export import run_onnx  # noqa: E402

EXPORTERS = {'torchscript': False, 'dynamo': True}
SCALE_CASES = [((7, 7), 1.5), ((7, 9), 1.7), ((9, 11), 0.6), ((5, 7), (1.1, 1.0)),
               ((6, 5), 2.5)]


def _export(model, inputs, dynamo: bool):
    """The ONNX bytes of a standard export, its progress output silenced."""
    buf = io.BytesIO()
    logger = logging.getLogger('torch.onnx')
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter('ignore')
            torch.onnx.export(model, inputs, buf, opset_version=18, dynamo=dynamo)
    finally:
        logger.setLevel(level)
    import onnx
    return onnx.load_from_string(buf.getvalue())


def _check(modules, inputs, exporter: str, exact) -> None:
    model = Many(modules).eval()
    proto = _export(model, tuple(inputs), EXPORTERS[exporter])
    got = run_onnx(proto, [x.numpy() for x in inputs])
    with torch.no_grad():
        expected = model(*inputs)
    for m, x, e, g in zip(modules, inputs, expected, got):
        assert g.shape == tuple(e.shape), (m, tuple(x.shape))
        err = float(np.abs(e.numpy() - g).max()) if e.numel() else 0.0
        atol = 0.0 if exact(m) else 1e-5 * max(1.0, float(x.abs().max()))
        assert err <= atol, (exporter, m, tuple(x.shape), err)


@pytest.mark.slow
@pytest.mark.parametrize('exporter', EXPORTERS)
@pytest.mark.parametrize('setting', UPSAMPLE_SETTINGS, ids=setting_id)
def test_upsample_exports_exactly(setting, exporter):
    cases = [(i, dict(size=o)) for i, o in AWKWARD_SHAPES + [((5, 4), (1, 1))]]
    for i, s in SCALE_CASES:
        cases += [(i, dict(scale_factor=s)), (i, dict(scale_factor=s, recompute_scale_factor=True))]
    modules = [CANNUpsample(**setting, **kw) for _, kw in cases]
    inputs = [make_input((1, 2) + i, seed=k) for k, (i, _) in enumerate(cases)]
    _check(modules, inputs, exporter, lambda m: m.mode in geo.NEAREST_MODES)


@pytest.mark.slow
@pytest.mark.parametrize('exporter', EXPORTERS)
@pytest.mark.parametrize('kind', ['max', 'max_dilated', 'avg_include', 'avg_exclude',
                                  'avg_override', 'adaptive'])
def test_pooling_exports_exactly(kind, exporter):
    modules, inputs = [], []
    if kind == 'adaptive':
        for out in (1, 2, 3, 6, (3, 5), (None, 2)):
            for hw in ((10, 22), (7, 9), (6, 6)):
                modules.append(CANNAdaptiveAvgPool2d(out))
                inputs.append(make_input((1, 2) + hw, seed=len(inputs)))
    settings = [] if kind == 'adaptive' else POOL_SETTINGS
    if kind == 'max_dilated':  # explicit padding only (SAME dilated windows: the same)
        settings = [s for s in settings if not isinstance(s.get('padding'), str)]
    dilation = 2 if kind == 'max_dilated' else 1
    for setting, hw in valid_pool_cases(settings, POOL_INPUTS, dilation):
        if kind.startswith('max'):
            modules.append(CANNMaxPool2d(**setting, dilation=dilation))
        elif kind == 'avg_override' and isinstance(setting.get('padding'), str):
            continue
        else:
            extra = dict(avg_include=dict(count_include_pad=True),
                         avg_exclude=dict(count_include_pad=False),
                         avg_override=dict(divisor_override=3))[kind]
            modules.append(CANNAvgPool2d(**setting, **extra))
        inputs.append(make_input((1, 2) + hw, seed=len(inputs)))
    _check(modules, inputs, exporter, lambda m: isinstance(m, CANNMaxPool2d))


@pytest.mark.parametrize('exporter', EXPORTERS)
def test_the_measured_wrong_cases_now_export_exactly(exporter):
    modules = [CANNAvgPool2d(4, 2, padding='same_lower', count_include_pad=False),
               CANNUpsample(size=(82, 82), mode='nearest')]
    inputs = [make_input((1, 2, 9, 11)), make_input((1, 2, 2, 2), seed=1)]
    _check(modules, inputs, exporter, lambda m: isinstance(m, CANNUpsample))


@pytest.mark.parametrize('exporter', EXPORTERS)
def test_functional_and_fused_ops_export_exactly(exporter):
    from mmseg_cann import ops

    class Ops(torch.nn.Module):
        def forward(self, x, lateral, logits):
            return (ops.upsample(x, scale_factor=1.7, mode='bicubic'),
                    ops.max_pool2d(x, 3, 2, 'same_lower'),
                    ops.upsample_add(x, lateral),
                    ops.upsample_argmax(logits, (33, 47), mode='nearest'))

    x, lateral, logits = make_input((1, 3, 7, 9)), make_input((1, 3, 14, 18), seed=1), \
        make_input((1, 5, 6, 9), seed=2)
    proto = _export(Ops().eval(), (x, lateral, logits), EXPORTERS[exporter])
    got = run_onnx(proto, [x.numpy(), lateral.numpy(), logits.numpy()])
    expected = Ops()(x, lateral, logits)
    for e, g in zip(expected[:3], got[:3]):
        np.testing.assert_allclose(g, e.numpy(), rtol=0, atol=1e-5)
    np.testing.assert_array_equal(got[3], expected[3].numpy())


@pytest.mark.parametrize('exporter', EXPORTERS)
def test_max_pool_indices_raise_a_clear_error(exporter):
    model = CANNMaxPool2d(2, return_indices=True)
    with pytest.raises(Exception) as info:
        _export(model, (make_input((1, 2, 4, 4)),), EXPORTERS[exporter])
    chain, exc = [], info.value
    while exc is not None:
        chain.append(str(exc))
        exc = exc.__cause__ or exc.__context__
    text = '\n'.join(chain)
    assert 'return_indices' in text and 'tools/export_onnx.py' in text, text[-2000:]


def test_auto_uses_the_portable_forms_only_while_exporting():
    from mmseg_cann import backends
    from mmseg_cann.core import export_mode
    assert not export_mode.standard_export_tracing()
    assert backends.get_backend('auto') is backends.auto
    x = make_input((1, 2, 9, 11))
    m = CANNAvgPool2d(4, 2, padding='same_lower', count_include_pad=False)
    # eager results stay PyTorch's own (bit for bit the native backend)
    assert torch.equal(m(x), CANNAvgPool2d(4, 2, padding='same_lower', count_include_pad=False,
                                           backend='native')(x))


# ---- the aten ops where the exporters translate them exactly (core/standard_export.py)
def _upsample_case(hw, mode, factors, by, align_corners=None):
    """A CANNUpsample scaling ``hw`` by integral ``factors``, given as a size, a scale
    factor or a recomputed scale factor (``by``)."""
    kw = dict(mode=mode, align_corners=align_corners)
    if by == 'size':
        kw['size'] = (hw[0] * factors[0], hw[1] * factors[1])
    else:
        kw['scale_factor'] = tuple(float(f) for f in factors)
        kw['recompute_scale_factor'] = by == 'recompute' or None
    return CANNUpsample(**kw), hw


def _aten_cases():
    """(module, input H W, aten op name) for every case of the rule."""
    cases = []
    for by in ('size', 'scale', 'recompute'):
        for hw, factors in (((5, 4), (2, 2)), ((7, 9), (3, 3)), ((3, 5), (4, 8)),
                            ((1, 6), (7, 2)), ((6, 1), (5, 16)), ((2, 3), (24, 6))):
            for ac in (False, True):
                cases.append(_upsample_case(hw, 'bilinear', factors, by, ac)
                             + ('upsample_bilinear2d',))
            cases.append(_upsample_case(hw, 'nearest', factors, by) + ('upsample_nearest2d',))
    pools = [(dict(kernel_size=3, stride=2, padding=1), ((6, 6), (7, 9), (10, 13))),
             (dict(kernel_size=2), ((6, 6), (7, 9), (10, 13))),
             (dict(kernel_size=(2, 3), stride=(2, 1), padding=(1, 0)), ((6, 6), (7, 9))),
             (dict(kernel_size=5, stride=2, padding=2), ((6, 6), (10, 13))),
             # ceil_mode that adds no window (10x13 adds one: a kept-portable case)
             (dict(kernel_size=3, stride=2, padding=1, ceil_mode=True), ((9, 9), (1, 1)))]
    for setting, sizes in pools:
        for hw in sizes:
            cases.append((CANNMaxPool2d(**setting), hw, 'max_pool2d'))
            if not setting.get('ceil_mode'):
                cases.append((CANNMaxPool2d(**setting, dilation=(1, 2)), hw, 'max_pool2d'))
            for include in (True, False):
                cases.append((CANNAvgPool2d(**setting, count_include_pad=include), hw,
                              'avg_pool2d'))
    for out, hw in ((1, (7, 9)), (2, (10, 22)), (3, (6, 6)), (6, (12, 24)), ((3, 5), (9, 10)),
                    ((None, 2), (5, 4))):
        cases.append((CANNAdaptiveAvgPool2d(out), hw, 'adaptive_avg_pool2d'))
    cases.append((CANNUpsample(size=(3, 2), mode='area'), (9, 10), 'adaptive_avg_pool2d'))
    cases.append((CANNUpsample(scale_factor=0.5, mode='area'), (8, 6), 'adaptive_avg_pool2d'))
    return cases


def _portable_cases():
    """(module, input H W, why) of cases the rule keeps in the portable forms."""
    return [
        (CANNUpsample(scale_factor=1.5, mode='bilinear'), (7, 7), 'non-integral scale'),
        (CANNUpsample(scale_factor=2.2, mode='bilinear'), (5, 5), 'scale 2.2 -> out 2x'),
        (CANNUpsample(size=(10, 15), mode='bilinear'), (4, 6), 'size 2.5x'),
        (CANNUpsample(scale_factor=2, mode='bilinear', antialias=True), (4, 6), 'antialias'),
        (CANNUpsample(scale_factor=2, mode='bicubic'), (4, 6), 'bicubic'),
        (CANNUpsample(scale_factor=2, mode='nearest-exact'), (4, 6), 'nearest-exact'),
        (CANNUpsample(size=(82, 82), mode='nearest'), (2, 2), 'non-integral nearest'),
        (CANNUpsample(size=(8, 8), mode='bilinear'), (16, 16), 'downsampling'),
        (CANNMaxPool2d(3, 2, 1, ceil_mode=True), (10, 13), 'ceil_mode adds a window'),
        (CANNAvgPool2d(3, 2, 1, ceil_mode=True), (10, 13), 'ceil_mode adds a window'),
        (CANNAvgPool2d(2, divisor_override=3), (6, 6), 'divisor_override'),
        (CANNMaxPool2d(3, 2, 'same_lower'), (9, 11), 'asymmetric SAME padding'),
        (CANNAvgPool2d(4, 2, 'same_lower', count_include_pad=False), (9, 11), 'SAME'),
        (CANNAdaptiveAvgPool2d(3), (10, 22), 'bins do not divide the input'),
        (CANNUpsample(size=(3, 4), mode='area'), (10, 22), 'area bins do not divide'),
    ]


def _aten_ops(model, inputs):
    """The aten op names ``torch.export`` records for ``model``."""
    exported = torch.export.export(model, tuple(inputs))
    return [getattr(n.target, '_opname', str(n.target)) for n in exported.graph.nodes
            if n.op == 'call_function']


_AVERAGING = ('avg_pool2d', 'adaptive_avg_pool2d', 'upsample_bilinear2d')


def _modules_and_inputs(cases):
    """The modules of ``(module, (H, W), op)`` cases and a seeded 1x2xHxW input each."""
    modules = [m for m, _, _ in cases]
    inputs = [make_input((1, 2) + hw, seed=k) for k, (_, hw, _) in enumerate(cases)]
    return modules, inputs


@pytest.mark.slow
@pytest.mark.parametrize('exporter', EXPORTERS)
def test_aten_forms_are_recorded_and_export_exactly(exporter):
    cases = _aten_cases()
    modules, inputs = _modules_and_inputs(cases)
    if exporter == 'torchscript':  # the graph check once, on torch.export
        for (m, hw, op), x in zip(cases, inputs):
            ops = _aten_ops(m.eval(), [x])
            assert op in ops and 'matmul' not in ops and 'index_select' not in ops, \
                (m, hw, ops)
    # nearest and max pooling: bit for bit; averages and bilinear: float32 rounding of
    # the same sums and taps (the big-input bound is test_bilinear_*_no_further_*)
    _check(modules, inputs, exporter,
           lambda m: not any(op in _AVERAGING for mm, _, op in cases if mm is m))


@pytest.mark.slow
@pytest.mark.parametrize('exporter', EXPORTERS)
def test_cases_outside_the_rule_keep_the_portable_forms_and_export_exactly(exporter):
    cases = _portable_cases()
    modules, inputs = _modules_and_inputs(cases)
    aten = ('upsample_bilinear2d', 'upsample_nearest2d', '_upsample_nearest_exact2d',
            'upsample_bicubic2d', '_upsample_bilinear2d_aa', 'adaptive_avg_pool2d')
    if exporter == 'torchscript':
        for (m, hw, why), x in zip(cases, inputs):
            ops = _aten_ops(m.eval(), [x])
            assert not set(ops) & set(aten), (why, ops)
            if isinstance(m, CANNAvgPool2d):  # a pool without padding, then a correction
                assert all(n.args[3:4] in ((), ([0, 0],)) for n in
                           torch.export.export(m, (x,)).graph.nodes
                           if getattr(n.target, '_opname', '') == 'avg_pool2d'), why
    _check(modules, inputs, exporter, lambda m: isinstance(m, CANNMaxPool2d) or (
        isinstance(m, CANNUpsample) and m.mode in geo.NEAREST_MODES))


@pytest.mark.slow
@pytest.mark.parametrize('exporter', EXPORTERS)
def test_bilinear_resize_is_no_further_from_exact_math_than_pytorch(exporter):
    """Integral bilinear factors export as ``Resize``. Where PyTorch's float32 source
    coordinates are rounded (factors that are not powers of two, ``align_corners=True``)
    the graph must be as close to exact math (the float64 reference) as PyTorch's own
    kernel is, up to the rounding of the two lerps (4 ulps of the largest input, as
    :func:`tests._helpers.assert_within_interpolation_rounding`); with exact
    coordinates (powers of two, ``align_corners=False``) it is PyTorch's result to
    within those 4 ulps."""
    from mmseg_cann import ops
    cases = [(k, ac) for k in (2, 3, 6, 8, 24) for ac in (False, True)]
    modules = [CANNUpsample(scale_factor=k, mode='bilinear', align_corners=ac)
               for k, ac in cases]
    inputs = [make_input((1, 1, 96, 128), seed=k) for k in range(len(cases))]
    proto = _export(Many(modules).eval(), tuple(inputs), EXPORTERS[exporter])
    got = run_onnx(proto, [x.numpy() for x in inputs])
    eps = float(torch.finfo(torch.float32).eps)
    for (k, ac), m, x, g in zip(cases, modules, inputs, got):
        with torch.no_grad():
            ours = m(x).double()
        exact = ops.upsample(x.double(), scale_factor=k, mode='bilinear', align_corners=ac,
                             backend='reference')
        slack = 4 * eps * float(x.abs().max())
        onnx_err = float((torch.from_numpy(g).double() - exact).abs().max())
        torch_err = float((ours - exact).abs().max())
        assert onnx_err <= torch_err + slack, (exporter, k, ac, onnx_err, torch_err)
        if k & (k - 1) == 0 and not ac:
            assert float((torch.from_numpy(g).double() - ours).abs().max()) <= slack, (k, ac)


def test_the_rule_answers_and_rejects_bad_input():
    from mmseg_cann.core import standard_export as rule
    x = make_input((1, 2, 8, 8))
    up = geo.upsample_spec((8, 8), geo.check_upsample_args(scale_factor=2, mode='bilinear'))
    assert rule.upsample_exports_exactly(x, up)
    assert not rule.upsample_exports_exactly(x.double(), up)  # float32 only
    assert not rule.upsample_exports_exactly(x.half(), up)
    pool = geo.pool_spec((8, 8), geo.check_pool_args(3, 2, 1))
    assert rule.max_pool_exports_exactly(x, pool)
    assert not rule.max_pool_exports_exactly(x, pool, return_indices=True)
    assert not rule.max_pool_exports_exactly(x[0], pool)  # 3-D input
    assert rule.avg_pool_exports_exactly(x, pool)
    assert not rule.avg_pool_exports_exactly(x, pool, divisor_override=2)
    assert rule.adaptive_avg_pool_exports_exactly(x, (4, 2))
    assert not rule.adaptive_avg_pool_exports_exactly(x, (3, 2))
    assert not rule.adaptive_avg_pool_exports_exactly(x, (0, 2))
    with pytest.raises(TypeError, match='UpsampleSpec'):
        rule.upsample_exports_exactly(x, pool)
    with pytest.raises(TypeError, match='PoolSpec'):
        rule.avg_pool_exports_exactly(x, up)
    with pytest.raises(TypeError, match='torch.Tensor'):
        rule.max_pool_exports_exactly(x.numpy(), pool)
    with pytest.raises(TypeError, match='output_size'):
        rule.adaptive_avg_pool_exports_exactly(x, 3)


@pytest.mark.slow
def test_integral_nearest_factors_keep_pytorchs_indices():
    """The nearest rule's index check: PyTorch's float32 index ``floor(d * float32(1/k))``
    equals ``floor(d / k)`` for every factor to 39 and input to 199 (the docs say so)."""
    from mmseg_cann.core import standard_export as rule
    for k in range(2, 40):
        for n in range(1, 200):
            x = torch.empty(1, 1, n, 1)
            spec = geo.upsample_spec((n, 1), geo.check_upsample_args(scale_factor=(k, 1)))
            assert rule.upsample_exports_exactly(x, spec), (n, k)
