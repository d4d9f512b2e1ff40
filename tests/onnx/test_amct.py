"""The model of AMCT's rules (mmseg_cann.onnx.amct) on a hand-made graph with one node
of each case of CANN's "layers that support quantization" page, its emulation in
onnxruntime against a fake-quantized convolution computed by hand, and the hand-off
files."""
from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip('onnxruntime')
import onnx  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from mmseg_cann.onnx.amct import (amct_quantizable, emulate, emulated_model,  # noqa: E402
                                  skip_layers, write_handoff)
from mmseg_cann.onnx.runtime import run_onnx  # noqa: E402


def _const(name, shape, seed=0):
    value = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return numpy_helper.from_array(value, name)


def _rules_graph():
    """X (1, 2, 4, 4) through one node per rule; the comment says what AMCT does."""
    n = helper.make_node
    nodes = [
        n('Conv', ['X', 'W', 'B'], ['c'], name='conv'),                        # yes
        n('Relu', ['c'], ['r'], name='relu'),                                  # not listed
        n('MaxPool', ['r'], ['m'], name='mp', kernel_shape=[2, 2], strides=[2, 2]),  # yes*
        n('AveragePool', ['m'], ['a'], name='ap', kernel_shape=[1, 1]),        # yes*
        n('Add', ['a', 'm'], ['s'], name='add_tensors'),                       # yes*
        n('Add', ['s', 'K'], ['s2'], name='add_const'),                        # no: a constant
        n('MatMul', ['s2', 'M2'], ['t'], name='mm_const_second'),              # yes
        n('MatMul', ['Mc', 't'], ['u'], name='mm_const_first'),                # no
        n('MatMul', ['u', 'M3'], ['v'], name='mm_3d_const'),                   # no: 3-D
        n('Flatten', ['v'], ['f'], name='flatten'),
        n('Gemm', ['f', 'G'], ['g'], name='gemm'),                             # yes
        n('Transpose', ['f'], ['ft'], name='transpose', perm=[1, 0]),
        n('Gemm', ['ft', 'G'], ['g2'], name='gemm_trans_a', transA=1),         # no: transA
        n('ConvTranspose', ['X', 'WT'], ['d1'], name='deconv'),                # yes
        n('ConvTranspose', ['X', 'WT'], ['d2'], name='deconv_dilated',
          dilations=[2, 2]),                                                   # no: dilation
    ]
    inits = [_const('W', (2, 2, 1, 1)), _const('B', (2,)), _const('K', (1,)),
             _const('M2', (2, 2)), _const('Mc', (2, 2)), _const('M3', (1, 2, 2)),
             _const('G', (8, 3)), _const('WT', (2, 2, 2, 2))]
    outputs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, shape) for o, shape in
               (('g', [1, 3]), ('g2', [1, 3]), ('d1', [1, 2, 5, 5]), ('d2', [1, 2, 6, 6]))]
    graph = helper.make_graph(nodes, 'rules', [helper.make_tensor_value_info(
        'X', TensorProto.FLOAT, [1, 2, 4, 4])], outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid('', 17)])
    onnx.checker.check_model(model)
    return model


def test_quantizable_layers_by_the_documented_rules():
    model = _rules_graph()
    assert amct_quantizable(model) == ['conv', 'mp', 'ap', 'add_tensors', 'mm_const_second',
                                       'gemm', 'deconv']
    # fp16 / mixed models: AvgPool, MaxPool and Add quantization off
    assert amct_quantizable(model, fp16=True) == ['conv', 'mm_const_second', 'gemm',
                                                  'deconv']


def test_skip_layers_are_the_float_nodes_amct_would_quantize():
    model = _rules_graph()
    rows = [dict(node='mm_const_second', op_type='MatMul', reason='r'),
            dict(node='mm_const_first', op_type='MatMul', reason='r')]
    # mm_const_first has its constant first: AMCT leaves it alone, no entry needed
    assert skip_layers(model, rows) == ['mm_const_second']
    assert skip_layers(model, rows, keep_float=['ap']) == ['ap', 'mm_const_second']


def _conv_graph():
    """y = conv1x1(x) with two output channels, weights 0.5 and -0.25, biases 0.1, -0.2."""
    w = numpy_helper.from_array(np.array([0.5, -0.25], np.float32).reshape(2, 1, 1, 1), 'W')
    b = numpy_helper.from_array(np.array([0.1, -0.2], np.float32), 'B')
    graph = helper.make_graph(
        [helper.make_node('Conv', ['x', 'W', 'B'], ['y'], name='conv')], 'conv',
        [helper.make_tensor_value_info('x', TensorProto.FLOAT, [1, 1, 2, 2])],
        [helper.make_tensor_value_info('y', TensorProto.FLOAT, [1, 2, 2, 2])], [w, b])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid('', 17)])


def test_emulation_against_hand_computed_fake_quantization():
    calib = np.array([-1.0, 0.5, 1.5, 2.0], np.float32).reshape(1, 1, 2, 2)
    check = np.array([0.3, -0.7, 1.234, 1.9], np.float32).reshape(1, 1, 2, 2)
    # activation with an offset: range [-1, 2] over 256 steps, zero point -128 + 1/step
    step = 3.0 / 255
    zero = round(-128 + 1.0 / step)                                  # -43
    assert zero == -43
    xq = (np.clip(np.round(check / step) + zero, -128, 127) - zero) * step
    # symmetric per-channel weights: |w| / 127 per channel, so w itself comes back
    w, b = np.array([0.5, -0.25]), np.array([0.1, -0.2])
    w_step = np.abs(w) / 127
    wq = np.round(w / w_step) * w_step
    # int32 bias at the product of the steps
    b_step = step * w_step
    bq = np.round(b / b_step) * b_step
    expected = xq[0, 0][None] * wq[:, None, None] + bq[:, None, None]
    got = run_onnx(emulated_model(_conv_graph(), [calib], ['conv']), [check])[0][0]
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-6)
    # not the float result: the fake quantization is there
    assert np.abs(got - (check[0, 0][None] * w[:, None, None] + b[:, None, None])).max() > 1e-3
    # no layers: the model itself
    assert emulate(_conv_graph(), [calib], [])['label_agreement'] == 100.0


def test_handoff_files(tmp_path):
    model = _rules_graph()
    calib = [np.random.default_rng(i).standard_normal((1, 2, 4, 4)).astype(np.float32)
             for i in range(3)]
    rows = [dict(node='mm_const_second', op_type='MatMul', reason='r')]
    section = write_handoff(model, calib, str(tmp_path / 'amct'), 'Ascend310P3',
                            float_rows=rows, keep_dtype_file='../m.keep_dtype.txt')
    meta = json.loads((tmp_path / 'amct' / 'calibration' / 'shape.json').read_text())
    assert meta == dict(input='X', shape=[1, 2, 4, 4], dtype='float32',
                        files=['0000.bin', '0001.bin', '0002.bin'])
    for k, x in enumerate(calib):
        back = np.fromfile(tmp_path / 'amct' / 'calibration' / meta['files'][k],
                           dtype=np.float32).reshape(meta['shape'])
        assert np.array_equal(back, x)
    script = (tmp_path / 'amct' / 'quantize_amct.py').read_text()
    compile(script, 'quantize_amct.py', 'exec')
    assert "'mm_const_second'" in script.replace('"', "'") and 'batch_num=3' in script
    assert section['skip_layers'] == ['mm_const_second']
    assert section['would_quantize'] == dict(without_skip=7, with_skip=6)
    commands = (tmp_path / 'amct' / 'commands.sh').read_text()
    assert '--soc_version=Ascend310P3' in commands and '--input_shape=X:1,2,4,4' in commands
    assert '--keep_dtype=../m.keep_dtype.txt' in commands
