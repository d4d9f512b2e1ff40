"""Plain ``torch.onnx.export`` (TorchScript and dynamo) of the CANN modules and ops: exact
in onnxruntime, or a clear error -- never a silently different graph.

While a standard exporter traces, ``backend='auto'`` takes the forms of
:mod:`mmseg_cann.backends.portable`; before it existed the exclude-pad SAME average and
legacy nearest 2 -> 82 exported wrong (errors 0.69-0.91 and 1.9-2.4)."""
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
