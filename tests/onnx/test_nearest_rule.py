"""The export-time check for nearest Resize: :func:`onnx_nearest_indices` must be what
onnxruntime computes, so that the refusal (PyTorch's float32 index differs) is exact.
Plain ONNX graphs, no torch export: a 1-D ramp resized along W returns its indices."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from mmseg_cann.onnx.translation import onnx_nearest_indices, resize_attributes

ort = pytest.importorskip('onnxruntime')


def ort_nearest_indices(n_in, exact_mode, *, n_out=None, scale=None):
    """Source indices onnxruntime reads for a nearest ``Resize`` of a 1-D ramp of
    ``n_in`` values, to ``n_out`` (``sizes``) or by ``scale`` (``scales``)."""
    attrs = resize_attributes('nearest-exact' if exact_mode else 'nearest', False, False, 18)
    if scale is not None:
        shape = helper.make_tensor('scales', TensorProto.FLOAT, [4], [1, 1, 1, scale])
        inputs = ['x', '', 'scales']
    else:
        shape = helper.make_tensor('sizes', TensorProto.INT64, [4], [1, 1, 1, n_out])
        inputs = ['x', '', '', 'sizes']
    node = helper.make_node('Resize', inputs, ['y'], **attrs)
    graph = helper.make_graph(
        [node], 'g', [helper.make_tensor_value_info('x', TensorProto.FLOAT, [1, 1, 1, n_in])],
        [helper.make_tensor_value_info('y', TensorProto.FLOAT, None)], [shape])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid('', 18)])
    model.ir_version = 9
    session = ort.InferenceSession(model.SerializeToString(), providers=['CPUExecutionProvider'])
    ramp = np.arange(n_in, dtype=np.float32).reshape(1, 1, 1, n_in)
    return session.run(None, {'x': ramp})[0].ravel().astype(np.int64)


@pytest.mark.parametrize('exact_mode', [False, True], ids=['nearest', 'nearest-exact'])
def test_emulated_onnx_nearest_indices_match_onnxruntime(exact_mode):
    pairs = [(i, o) for i in range(1, 9) for o in range(1, 90, 3)] + [(2, 82), (3, 100)]
    for n_in, n_out in pairs:
        got = ort_nearest_indices(n_in, exact_mode, n_out=n_out)
        np.testing.assert_array_equal(onnx_nearest_indices(n_in, n_out, None, exact_mode), got,
                                      err_msg=f'{n_in} -> {n_out}')


def test_known_pytorch_onnx_disagreement():
    from mmseg_cann.ops.reference import nearest_indices
    torch_idx = nearest_indices(2, 82, None, False)
    onnx_idx = onnx_nearest_indices(2, 82, None, False)
    assert torch_idx[41] == 0 and onnx_idx[41] == 1  # DESIGN.md 2.1's example
