"""``export_onnx(target='atc')``: graphs whose meaning survives ATC's reading, and the
model of that reading (:mod:`mmseg_cann.onnx.atc`), which must catch what changes."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from mmseg_cann import CANNAdaptiveAvgPool2d, CANNAvgPool2d, CANNMaxPool2d, CANNUpsample
from mmseg_cann.core import geometry as geo
from tests._helpers import (AWKWARD_SHAPES, UPSAMPLE_SETTINGS, Many, make_input, setting_id,
                            POOL_INPUTS, POOL_SETTINGS, valid_pool_cases)

pytest.importorskip('onnxruntime')
pytest.importorskip('onnxscript')
import onnx  # noqa: E402
from onnx import TensorProto, helper  # noqa: E402

from mmseg_cann.onnx import (AtcReadError, atc_command, atc_reading, export_onnx,  # noqa: E402
                             keep_dtype_nodes)
from mmseg_cann.onnx.atc import ai_cpu_nodes, name_nodes, tf_nearest_indices  # noqa: E402
from mmseg_cann.onnx.atc_backend import resize_form  # noqa: E402
from mmseg_cann.onnx.export import run_onnx  # noqa: E402

#: output size 1 as well as the awkward shapes
SIZE_SHAPES = AWKWARD_SHAPES + [((5, 4), (1, 1)), ((9, 9), (1, 3))]
#: user scale factors: integer and non-integer ratios, downscaling, a kept axis
SCALE_CASES = [((7, 7), 1.5), ((7, 9), 1.7), ((3, 5), 2), ((9, 11), 0.6),
               ((5, 7), (1.1, 1.0)), ((2, 2), 41), ((6, 5), 2.5)]


def _atol(x: torch.Tensor, exact: bool) -> float:
    """Exact for value-copying ops; float32 rounding (1e-5, as issued) of the input scale
    for the interpolation/averaging forms."""
    return 0.0 if exact else 1e-5 * max(1.0, float(x.abs().max()))


def _run_as_atc(proto, inputs):
    read = atc_reading(proto)
    return run_onnx(read, [x.numpy() for x in inputs])


def _check_atc(modules, inputs, exact):
    model = Many(modules)
    proto = export_onnx(model, inputs, target='atc')
    got = _run_as_atc(proto, inputs)
    with torch.no_grad():
        expected = model(*inputs)
    for x, e, g, m in zip(inputs, expected, got, modules):
        assert g.shape == tuple(e.shape), m
        err = float(np.abs(e.numpy() - g).max()) if e.numel() else 0.0
        assert err <= _atol(x, exact(m)), (m, tuple(x.shape), err)
    return proto


def _upsample_cases():
    cases = [(i, dict(size=o)) for i, o in SIZE_SHAPES]
    for i, s in SCALE_CASES:
        cases += [(i, dict(scale_factor=s)), (i, dict(scale_factor=s, recompute_scale_factor=True))]
    return cases


@pytest.mark.slow
@pytest.mark.parametrize('setting', UPSAMPLE_SETTINGS, ids=setting_id)
def test_upsample_atc_export_equals_pytorch_as_atc_reads_it(setting):
    """Every case, including those the standard target refuses (2 -> 82 nearest,
    antialias, bicubic on a kept axis)."""
    cases = _upsample_cases()
    modules = [CANNUpsample(**setting, **kw) for _, kw in cases]
    inputs = tuple(make_input((1, 2) + i, seed=k) for k, (i, _) in enumerate(cases))
    proto = _check_atc(modules, inputs, lambda m: m.mode in geo.NEAREST_MODES)
    ops = {n.op_type for n in proto.graph.node}
    assert ops.isdisjoint({'Shape'}), ops  # constant sizes in a static graph
    if setting['mode'] != 'bilinear' or setting.get('antialias'):
        assert 'Resize' not in ops, ops  # only linear Resize reaches ATC


@pytest.mark.slow
@pytest.mark.parametrize('kind', ['max', 'avg_include', 'avg_exclude', 'avg_override'])
def test_pooling_atc_export_equals_pytorch_as_atc_reads_it(kind):
    modules, inputs = [], []
    for setting, hw in valid_pool_cases(POOL_SETTINGS, POOL_INPUTS):
        if kind == 'max':
            modules.append(CANNMaxPool2d(**setting))
        else:
            extra = dict(avg_include=dict(count_include_pad=True),
                         avg_exclude=dict(count_include_pad=False),
                         avg_override=dict(divisor_override=3))[kind]
            if kind == 'avg_override' and isinstance(setting.get('padding'), str):
                continue
            modules.append(CANNAvgPool2d(**setting, **extra))
        inputs.append(make_input((1, 2) + hw, seed=len(inputs)))
    _check_atc(modules, tuple(inputs), lambda m: isinstance(m, CANNMaxPool2d))


def test_dilated_max_pool_and_adaptive_bins():
    modules = [CANNMaxPool2d(3, 2, 1, dilation=2, ceil_mode=True),
               CANNMaxPool2d((2, 3), 1, (1, 0), dilation=(3, 2)),
               CANNAdaptiveAvgPool2d((3, 6)), CANNAdaptiveAvgPool2d(1),
               CANNAdaptiveAvgPool2d((2, 3))]
    inputs = (make_input((1, 2, 10, 11)), make_input((1, 2, 9, 8), seed=1),
              make_input((1, 2, 10, 22), seed=2), make_input((1, 2, 7, 5), seed=3),
              make_input((1, 2, 8, 9), seed=4))
    proto = _check_atc(modules, inputs, lambda m: isinstance(m, CANNMaxPool2d))
    for node in proto.graph.node:  # ATC drops dilations: none may reach it
        assert all(a.name != 'dilations' for a in node.attribute), node


def test_fused_ops_export_for_atc():
    class Fused(torch.nn.Module):
        def forward(self, low, lateral, logits):
            from mmseg_cann.ops import upsample_add, upsample_argmax
            return (upsample_add(low, lateral, align_corners=False),
                    upsample_argmax(logits, (33, 47), mode='nearest'))

    low, lateral, logits = make_input((1, 4, 5, 7)), make_input((1, 4, 10, 14), seed=1), \
        make_input((1, 5, 6, 9), seed=2)
    proto = export_onnx(Fused(), (low, lateral, logits), target='atc')
    added, labels = _run_as_atc(proto, (low, lateral, logits))
    expected = Fused()(low, lateral, logits)
    assert float(np.abs(added - expected[0].numpy()).max()) <= 1e-5
    np.testing.assert_array_equal(labels, expected[1].numpy())


#: cases where today's standard export changes meaning under ATC's reading
#: (measured: SAME_LOWER max 1.87, exclude-pad average 0.70, bilinear 1.7 -> 1.15)
CHANGED_BY_ATC = [
    ('max same_lower', CANNMaxPool2d(4, 2, padding='same_lower'), (1, 2, 9, 11)),
    ('avg same_lower exclude-pad', CANNAvgPool2d(4, 2, padding='same_lower',
                                                 count_include_pad=False), (1, 2, 9, 11)),
    ('bilinear scale 1.7', CANNUpsample(scale_factor=1.7, mode='bilinear'), (1, 2, 7, 9)),
    ('nearest scale 1.7', CANNUpsample(scale_factor=1.7, mode='nearest'), (1, 2, 7, 9)),
    ('bicubic', CANNUpsample(size=(13, 17), mode='bicubic'), (1, 2, 7, 9)),
    ('dilated max', CANNMaxPool2d(3, 2, 1, dilation=2), (1, 2, 10, 11)),
]


@pytest.mark.parametrize('name, module, shape', CHANGED_BY_ATC, ids=[c[0] for c in CHANGED_BY_ATC])
def test_atc_reading_catches_what_the_standard_export_loses(name, module, shape):
    x = make_input(shape)
    standard = export_onnx(module, x)  # target='onnx': exact in onnxruntime ...
    np.testing.assert_allclose(run_onnx(standard, [x.numpy()])[0], module(x).numpy(),
                               rtol=0, atol=1e-5)
    try:  # ... but not as ATC reads it
        (got,) = _run_as_atc(standard, (x,))
    except AtcReadError:
        return
    expected = module(x).numpy()
    assert got.shape != expected.shape or float(np.abs(got - expected).max()) > 1e-3
    # and the ATC target keeps the meaning
    (fixed,) = _run_as_atc(export_onnx(module, x, target='atc'), (x,))
    np.testing.assert_allclose(fixed, expected, rtol=0, atol=1e-5)


def test_resize_forms():
    def form(in_hw, **kw):
        return resize_form(geo.upsample_spec(in_hw, geo.check_upsample_args(**kw)))

    assert form((7, 7), size=(14, 14), mode='bilinear') == 'resize_linear'
    assert form((7, 7), scale_factor=2, mode='bilinear') == 'resize_linear'  # 1/2 == 7/14
    assert form((7, 9), scale_factor=1.7, mode='bilinear') == 'matmul'  # 1/1.7 != 7/11
    assert form((7, 9), scale_factor=1.7, mode='bilinear',
                recompute_scale_factor=True) == 'resize_linear'
    assert form((7, 9), size=(3, 4), mode='bilinear', antialias=True) == 'matmul'
    assert form((7, 9), size=(3, 4), mode='bicubic') == 'matmul'
    assert form((2, 2), size=(82, 82), mode='nearest') == 'gather'


# ------------------------------------------------------------ the reading itself
def _graph(node, inputs, outputs, initializers=(), opset=18):
    graph = helper.make_graph([node], 'g', inputs, outputs, list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid('', opset)])
    model.ir_version = 9
    return model


def _x(shape):
    return helper.make_tensor_value_info('x', TensorProto.FLOAT, list(shape))


def _y():
    return helper.make_tensor_value_info('y', TensorProto.FLOAT, ['n', 'c', 'h', 'w'])


def test_tf_nearest_index_rules():
    # hand-computed from TensorFlow's ResizeNearestNeighbor formulas
    np.testing.assert_array_equal(tf_nearest_indices(2, 4, False, True), [0, 0, 1, 1])
    np.testing.assert_array_equal(tf_nearest_indices(3, 7, False, False), [0, 0, 0, 1, 1, 2, 2])
    np.testing.assert_array_equal(tf_nearest_indices(3, 5, True, False), [0, 1, 1, 2, 2])
    np.testing.assert_array_equal(tf_nearest_indices(4, 2, False, True), [1, 3])
    np.testing.assert_array_equal(tf_nearest_indices(5, 1, True, False), [0])


@pytest.mark.parametrize('ctm, expected', [
    ('asymmetric', [0, 0, 0, 1, 1, 2, 2]),          # floor(d * 3/7)
    ('half_pixel', [0, 0, 1, 1, 1, 2, 2]),          # floor((d + 0.5) * 3/7)
    ('align_corners', [0, 0, 1, 1, 1, 2, 2]),       # round(d * 2/6)
])
def test_nearest_resize_is_read_with_tensorflow_rules(ctm, expected):
    sizes = helper.make_tensor('sizes', TensorProto.INT64, [4], [1, 1, 1, 7])
    node = helper.make_node('Resize', ['x', '', '', 'sizes'], ['y'], mode='nearest',
                            coordinate_transformation_mode=ctm, nearest_mode='ceil')
    model = _graph(node, [_x((1, 1, 1, 3))], [_y()], [sizes])
    ramp = np.arange(3, dtype=np.float32).reshape(1, 1, 1, 3)
    (got,) = run_onnx(atc_reading(model), [ramp])
    np.testing.assert_array_equal(got.ravel(), expected)


def test_scales_become_sizes_and_lose_the_scale():
    scales = helper.make_tensor('scales', TensorProto.FLOAT, [4], [1, 1, 1, 1.7])
    node = helper.make_node('Resize', ['x', '', 'scales'], ['y'], mode='linear',
                            coordinate_transformation_mode='half_pixel')
    model = _graph(node, [_x((1, 1, 1, 7))], [_y()], [scales])
    read = atc_reading(model)
    resize = [n for n in read.graph.node if n.op_type == 'Resize'][0]
    assert resize.input[2] == '' and resize.input[3]
    sizes = {t.name: onnx.numpy_helper.to_array(t) for t in read.graph.initializer}
    np.testing.assert_array_equal(sizes[resize.input[3]], [1, 1, 1, 11])  # int(7 * 1.7)
    ramp = np.arange(7, dtype=np.float32).reshape(1, 1, 1, 7)
    (as_atc,) = run_onnx(read, [ramp])
    (as_onnx,) = run_onnx(model, [ramp])
    assert as_atc.shape == as_onnx.shape and not np.allclose(as_atc, as_onnx)


def test_pool_attributes_as_atc_reads_them():
    node = helper.make_node('MaxPool', ['x'], ['y'], kernel_shape=[3, 3], strides=[2, 2],
                            auto_pad='SAME_LOWER', dilations=[2, 2])
    read = atc_reading(_graph(node, [_x((1, 1, 9, 9))], [_y()]))
    attrs = {a.name: helper.get_attribute_value(a) for a in read.graph.node[0].attribute}
    assert attrs['auto_pad'] == b'SAME_UPPER' and 'dilations' not in attrs
    node = helper.make_node('AveragePool', ['x'], ['y'], kernel_shape=[2, 2], strides=[2, 2],
                            auto_pad='SAME_UPPER', ceil_mode=1)
    read = atc_reading(_graph(node, [_x((1, 1, 5, 5))], [_y()]))
    attrs = {a.name: helper.get_attribute_value(a) for a in read.graph.node[0].attribute}
    assert 'ceil_mode' not in attrs  # counts only with auto_pad=NOTSET


@pytest.mark.parametrize('make, words', [
    (lambda: _graph(helper.make_node('MaxPool', ['x'], ['y', 'i'], kernel_shape=[2, 2]),
                    [_x((1, 1, 4, 4))], [_y(), helper.make_tensor_value_info(
                        'i', TensorProto.INT64, ['n', 'c', 'h', 'w'])]), 'Indices'),
    (lambda: _graph(helper.make_node('MaxPool', ['x'], ['y'], kernel_shape=[2, 2],
                                     storage_order=1), [_x((1, 1, 4, 4))], [_y()]),
     'storage_order'),
    (lambda: _graph(helper.make_node('MaxPool', ['x'], ['y'], kernel_shape=[2, 2],
                                     auto_pad='VALID', ceil_mode=1), [_x((1, 1, 5, 5))],
                    [_y()]), 'VALID'),
    (lambda: _graph(helper.make_node('AveragePool', ['x'], ['y'], kernel_shape=[2, 2],
                                     pads=[0, 0, 2, 0], count_include_pad=0),
                    [_x((1, 1, 4, 4))], [_y()]), 'entirely in padding'),
    (lambda: _graph(helper.make_node('Relu', ['x'], ['y']), [_x((1, 1, 2, 2))], [_y()],
                    opset=19), 'opset 19'),
])
def test_what_atc_rejects(make, words):
    with pytest.raises(AtcReadError, match=words):
        atc_reading(make())


def test_dynamic_graph_is_read_at_a_gear():
    x = make_input((1, 2, 6, 8))
    proto = export_onnx(CANNUpsample(scale_factor=2, mode='bilinear'), x, dynamic=True)
    with pytest.raises(ValueError, match='input_shapes'):
        atc_reading(proto)
    for shape in ((1, 2, 6, 8), (1, 2, 10, 12)):
        y = make_input(shape, seed=3)
        read = atc_reading(proto, {'input': shape})
        (got,) = run_onnx(read, [y.numpy()])
        np.testing.assert_allclose(got, CANNUpsample(scale_factor=2, mode='bilinear')(y),
                                   rtol=0, atol=1e-5)


def test_atc_target_refuses_dynamic_shapes_and_high_opsets():
    x = make_input((1, 2, 6, 8))
    with pytest.raises(ValueError, match='fixed shapes'):
        export_onnx(CANNUpsample(scale_factor=2), x, target='atc', dynamic=True)
    with pytest.raises(ValueError, match='<= 18'):
        export_onnx(CANNUpsample(scale_factor=2), x, target='atc', opset=19)
    with pytest.raises(ValueError, match='target must be one of'):
        export_onnx(CANNUpsample(scale_factor=2), x, target='tensorrt')
    with pytest.raises(ValueError, match='return_indices'):
        export_onnx(CANNMaxPool2d(2, return_indices=True), x, target='atc')


# ---------------------------------------------------- keep_dtype, AI CPU, command line
def test_keep_dtype_lists_the_averaging_nodes_only():
    class Head(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.pools = torch.nn.ModuleList([CANNAdaptiveAvgPool2d(1), CANNAdaptiveAvgPool2d(3),
                                              CANNAvgPool2d(3, 2, 1, count_include_pad=False)])
            self.up = CANNUpsample(size=(20, 24), mode='bilinear', align_corners=True)

        def forward(self, x):
            return [p(x) for p in self.pools] + [self.up(x)]

    x = make_input((1, 2, 10, 11))
    proto = export_onnx(Head(), x, target='atc')
    name_nodes(proto)
    keep = keep_dtype_nodes(proto)
    by_name = {n.name: n.op_type for n in proto.graph.node}
    kinds = sorted(by_name[k] for k in keep)
    assert kinds.count('GlobalAveragePool') + kinds.count('ReduceMean') == 1, kinds
    assert kinds.count('MatMul') == 2 and 'AveragePool' in kinds and 'Mul' in kinds, kinds
    # the bilinear upsample (align_corners: unequal weights) is not an average
    upsample_nodes = [n.name for n in proto.graph.node
                      if n.op_type in ('Resize', 'MatMul') and n.name not in keep]
    assert upsample_nodes, by_name


def test_ai_cpu_warnings_and_command_line():
    node = helper.make_node('MaxPool', ['x'], ['y'], kernel_shape=[16, 17], strides=[64, 1])
    lines = ai_cpu_nodes(_graph(node, [_x((1, 1, 80, 80))], [_y()]))
    assert len(lines) == 1 and 'kernel area 272 > 256' in lines[0] and 'stride > 63' in lines[0]
    cmd = atc_command('m.onnx', 'm', 'Ascend910B', 'input', (1, 3, 64, 128),
                      keep_dtype_file='m.keep_dtype.txt')
    assert cmd == ('atc --framework=5 --model=m.onnx --output=m --soc_version=Ascend910B '
                   '--input_shape=input:1,3,64,128 --keep_dtype=m.keep_dtype.txt')
    gears = atc_command('m.onnx', 'm', 'Ascend310P3', 'input', (1, 3, 64, 128),
                        gears=[(64, 128), (128, 256)])
    assert '--input_shape=input:1,3,-1,-1 --dynamic_image_size=64,128;128,256' in gears
    with pytest.raises(ValueError, match='2 to 100 gears'):
        atc_command('m.onnx', 'm', 'Ascend910B', 'input', (1, 3, 8, 8), gears=[(8, 8)])
