"""ROI pooling in ONNX: ``mode='max'`` exports as ``MaxRoiPool``, which onnxruntime runs
with roi_pool2d's values bit for bit (and the ATC reading keeps); ``mode='avg'`` is
refused with a message."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from mmseg_cann.models import CANNRoIPool2d
from mmseg_cann.onnx import ops as onnx_ops
from mmseg_cann.onnx.atc import atc_reading
from mmseg_cann.onnx.export import export_onnx
from mmseg_cann.onnx.runtime import run_onnx
from mmseg_cann.ops import roi_pool2d

OPSET = 17


class Head(torch.nn.Module):
    """Features -> ROI pooling -> a per-box score (a graph around the op)."""

    def __init__(self, mode='max', **kwargs):
        super().__init__()
        self.pool = CANNRoIPool2d((3, 4), 0.5, mode, **kwargs)

    def forward(self, x, rois):
        return self.pool(x * 2, rois) + 1


def _export(model, x, rois, target='onnx'):
    return export_onnx(model, (x, rois), opset=OPSET, input_names=['input', 'rois'],
                       target=target)


def _inputs(seed, k=24):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 5, 11, 13, generator=g)
    xy = torch.rand(k, 4, generator=g) * 34 - 4   # image coordinates, scale 0.5
    b = torch.randint(0, 2, (k, 1), generator=g).float()
    return x, torch.cat([b, xy], 1)


def test_max_exports_as_max_roi_pool_and_runs_in_onnxruntime():
    x, rois = _inputs(0)
    proto = _export(Head(), x, rois)
    nodes = [n for n in proto.graph.node if n.op_type == 'MaxRoiPool']
    assert len(nodes) == 1
    attrs = {a.name: a for a in nodes[0].attribute}
    assert list(attrs['pooled_shape'].ints) == [3, 4]
    assert attrs['spatial_scale'].f == 0.5
    for seed in (0, 1, 2):  # other boxes (same count) at run time
        x, rois = _inputs(seed)
        (got,) = run_onnx(proto, [x.numpy(), rois.numpy()])
        want = roi_pool2d(x * 2, rois, (3, 4), 'max', 0.5) + 1
        np.testing.assert_array_equal(got, want.numpy())


def test_atc_target_exports_max_roi_pool_and_its_reading_keeps_it():
    x, rois = _inputs(3)
    read = atc_reading(_export(Head(), x, rois, target='atc'))
    assert [n.op_type for n in read.graph.node].count('MaxRoiPool') == 1
    (got,) = run_onnx(read, [x.numpy(), rois.numpy()])
    np.testing.assert_array_equal(got, (roi_pool2d(x * 2, rois, (3, 4), 'max', 0.5) + 1)
                                  .numpy())


def test_eager_custom_op_equals_the_op():
    x, rois = _inputs(4)
    assert torch.equal(onnx_ops._roi_max_pool_op(x, rois, [3, 4], 0.5),
                       roi_pool2d(x, rois, (3, 4), 'max', 0.5))


@pytest.mark.parametrize('kwargs, words', [(dict(mode='avg'), "mode='avg'"),
                                           (dict(return_indices=True), 'return_indices')])
def test_avg_and_indices_are_refused(kwargs, words):
    class WithIndices(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.pool = CANNRoIPool2d((3, 4), 0.5, **kwargs)

        def forward(self, x, rois):
            out = self.pool(x, rois)
            return out[0] if isinstance(out, tuple) else out
    x, rois = _inputs(5)
    with pytest.raises(ValueError, match=words.replace('(', r'\(')):
        _export(WithIndices(), x, rois)
