"""CANN modules exported alone: onnx.checker, onnxruntime equality with PyTorch, and the
Resize/pool attributes. Cases are batched into one multi-input graph per setting (one
export costs seconds)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from mmseg_cann import CANNAdaptiveAvgPool2d, CANNAvgPool2d, CANNMaxPool2d, CANNUpsample
from mmseg_cann.core import geometry as geo
from tests._helpers import (AWKWARD_SHAPES, UPSAMPLE_SETTINGS, Many, make_input, setting_id,
                            POOL_INPUTS, POOL_SETTINGS, valid_pool_cases)

pytest.importorskip('onnxruntime')
pytest.importorskip('onnxscript')
from mmseg_cann.onnx import export_onnx, resize_attributes  # noqa: E402
from mmseg_cann.onnx.export import node_attributes, run_onnx  # noqa: E402

#: extra shapes: output size 1 (half_pixel vs pytorch_half_pixel differ there)
SIZE_SHAPES = AWKWARD_SHAPES + [((5, 4), (1, 1)), ((9, 9), (1, 3))]
#: (input, scale_factor): integer ratios, non-integer ratios, a kept axis
SCALE_CASES = [((7, 7), 1.5), ((3, 5), 2), ((9, 11), 0.6), ((5, 7), (1.1, 1.0)),
               ((2, 2), 41), ((6, 5), 2.5)]


def _unexportable(setting, in_hw, kwargs) -> bool:
    """Cases ONNX Resize cannot reproduce (written from the measured onnxruntime results)."""
    mode, ac, aa = setting['mode'], setting.get('align_corners'), setting.get('antialias')
    spec = geo.upsample_spec(in_hw, geo.check_upsample_args(**setting, **kwargs))
    if mode == 'nearest' and in_hw == (2, 2) and spec.out_size == (82, 82):
        return True  # PyTorch float32 index: output 41 reads 0, ONNX reads 1
    if aa and (mode == 'bicubic' or ac or any(o < i for i, o in zip(in_hw, spec.out_size))):
        return True
    return (mode == 'bicubic' and not ac and kwargs.get('scale_factor') == (1.1, 1.0)
            and not kwargs.get('recompute_scale_factor'))


def _cases(setting):
    cases = [(i, dict(size=o)) for i, o in SIZE_SHAPES]
    for i, s in SCALE_CASES:
        cases += [(i, dict(scale_factor=s)), (i, dict(scale_factor=s, recompute_scale_factor=True))]
    return cases


def _tolerance(setting):
    """Nearest copies values (exact); interpolation differs only by float32 rounding of
    the source coordinate (ONNX divides by the scale, PyTorch multiplies by its inverse):
    a few ulps of the values, more for bicubic's 16 taps with overshoot."""
    if setting['mode'] in geo.NEAREST_MODES:
        return 0.0
    return 1e-5 if setting['mode'] == 'bicubic' else 2e-6


@pytest.mark.slow
@pytest.mark.parametrize('setting', UPSAMPLE_SETTINGS, ids=setting_id)
def test_upsample_export_matches_pytorch(setting):
    cases = [c for c in _cases(setting) if not _unexportable(setting, *c)]
    if not cases:
        pytest.skip('no exportable case for this setting (see test_unexportable_cases_raise)')
    modules = [CANNUpsample(**setting, **kw) for _, kw in cases]
    inputs = tuple(make_input((1, 2) + i, seed=k) for k, (i, _) in enumerate(cases))
    model = Many(modules)
    proto = export_onnx(model, inputs)
    got = run_onnx(proto, [x.numpy() for x in inputs])
    with torch.no_grad():
        expected = model(*inputs)
    for (in_hw, kw), e, g in zip(cases, expected, got):
        assert g.shape == tuple(e.shape), (in_hw, kw)
        err = float(np.abs(e.numpy() - g).max())
        assert err <= _tolerance(setting), (setting, in_hw, kw, err)
    if setting['mode'] == 'area':
        assert not node_attributes(proto, 'Resize')
        return
    resizes = node_attributes(proto, 'Resize')
    assert len(resizes) == len(cases)
    for (in_hw, kw), node in zip(cases, resizes):
        spec = geo.upsample_spec(in_hw, geo.check_upsample_args(**setting, **kw))
        # sizes whenever PyTorch maps with in/out; scales only for its 1/scale rule
        uses_scales = 'scale_factor' in kw and not kw.get('recompute_scale_factor') and (
            any(s is not None for s in spec.kernel_scales))
        assert ('scales' in node) == uses_scales, (in_hw, kw, node)
        assert ('sizes' in node) != uses_scales
        if not uses_scales:
            assert node['sizes'] == '[1,2,%d,%d]' % spec.out_size
        want = resize_attributes(setting['mode'], bool(setting.get('align_corners')),
                                 bool(setting.get('antialias')), 18)
        for key, value in want.items():
            assert node[key] == str(value), (key, node)


@pytest.mark.parametrize('setting', [s for s in UPSAMPLE_SETTINGS if s['mode'] != 'area'],
                         ids=setting_id)
def test_unexportable_cases_raise(setting):
    cases = [c for c in _cases(setting) if _unexportable(setting, *c)]
    for in_hw, kw in cases[:2]:
        with pytest.raises(ValueError, match='cannot be exported'):
            export_onnx(CANNUpsample(**setting, **kw), make_input((1, 2) + in_hw))


def test_nearest_attributes_follow_pytorch_rules():
    legacy = resize_attributes('nearest', False, False, 17)
    assert legacy['coordinate_transformation_mode'] == 'asymmetric'
    assert legacy['nearest_mode'] == 'floor'
    bicubic = resize_attributes('bicubic', True, False, 17)
    assert bicubic['cubic_coeff_a'] == -0.75
    assert bicubic['coordinate_transformation_mode'] == 'align_corners'
    with pytest.raises(ValueError, match='antialias'):
        resize_attributes('bicubic', False, True, 18)




def _pool_cases():
    return valid_pool_cases(POOL_SETTINGS, POOL_INPUTS)


def _ceil_drops_window(setting, hw) -> bool:
    """Whether PyTorch's ceil_mode drops a last window that ONNX's ceil_mode keeps."""
    if not setting.get('ceil_mode') or str(setting.get('padding')).startswith('same'):
        return False
    k = geo.int_pair(setting['kernel_size'], 'k')
    s = geo.int_pair(setting.get('stride', k), 's')
    p = (0, 0) if setting.get('padding') in (None, 'valid') else geo.int_pair(setting['padding'], 'p')
    return any(math.ceil((n + 2 * q - kk) / ss) * ss >= n + q
               for n, kk, ss, q in zip(hw, k, s, p))


@pytest.mark.slow
def test_pool_export_matches_pytorch():
    modules, inputs, kinds = [], [], []
    for k, (setting, hw) in enumerate(_pool_cases()):
        x = make_input((1, 2) + hw, seed=k)
        modules.append(CANNMaxPool2d(**setting))
        inputs.append(x)
        kinds.append(('max', setting, hw))
        for cip in (True, False):
            if cip and _ceil_drops_window(setting, hw):
                with pytest.raises(ValueError, match='cannot be exported'):
                    export_onnx(CANNAvgPool2d(**setting), x)
                continue
            modules.append(CANNAvgPool2d(**setting, count_include_pad=cip))
            inputs.append(x)
            kinds.append((f'avg cip={cip}', setting, hw))
    model = Many(modules)
    proto = export_onnx(model, tuple(inputs))
    got = run_onnx(proto, [x.numpy() for x in inputs])
    with torch.no_grad():
        expected = model(*inputs)
    for kind, e, g in zip(kinds, expected, got):
        assert g.shape == tuple(e.shape), kind
        assert float(np.abs(e.numpy() - g).max()) <= 1e-6, kind
    pools = node_attributes(proto, 'MaxPool') + node_attributes(proto, 'AveragePool')
    same = [p for p in pools if p.get('auto_pad', 'NOTSET').startswith('SAME')]
    explicit = [p for p in pools if 'pads' in p and p.get('auto_pad') == 'NOTSET']
    n_same = sum(3 - _ceil_drops_window(s, hw) for s, hw in _pool_cases() if str(s.get('padding')).startswith('same'))
    assert len(same) == n_same and len(explicit) == len(pools) - n_same


def test_adaptive_avg_pool_export():
    cases = [((7, 9), 1), ((7, 9), 3), ((12, 12), 6), ((12, 12), 2), ((6, 10), (2, 3)),
             ((5, 7), (5, 2))]
    model = Many([CANNAdaptiveAvgPool2d(o) for _, o in cases])
    inputs = tuple(make_input((1, 3) + hw, seed=k) for k, (hw, _) in enumerate(cases))
    proto = export_onnx(model, inputs, opset=17)
    got = run_onnx(proto, [x.numpy() for x in inputs])
    with torch.no_grad():
        expected = model(*inputs)
    for case, e, g in zip(cases, expected, got):
        assert float(np.abs(e.numpy() - g).max()) <= 1e-6, case
    ops = [n.op_type for n in proto.graph.node]
    assert 'GlobalAveragePool' in ops and 'AveragePool' in ops and 'MatMul' in ops


def test_bad_opset_and_unexportable_pooling():
    x = make_input((1, 2, 8, 8))
    with pytest.raises(ValueError, match='opset'):
        export_onnx(CANNMaxPool2d(2), x, opset=16)
    with pytest.raises(ValueError, match='divisor_override'):
        export_onnx(CANNAvgPool2d(2, divisor_override=3), x)
    with pytest.raises(ValueError, match='return_indices'):
        export_onnx(CANNMaxPool2d(2, return_indices=True), x)
