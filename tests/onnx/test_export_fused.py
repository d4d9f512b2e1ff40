"""The fused ops exported as their unfused equivalents (``Resize`` + ``Add``,
``Resize`` + ``ArgMax``), checked against PyTorch's unfused computation in onnxruntime
over awkward shapes, the three fused modes and both ``align_corners`` (one graph)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mmseg_cann.ops import upsample_add, upsample_argmax
from tests._helpers import make_input

pytest.importorskip('onnxruntime')
pytest.importorskip('onnxscript')
from mmseg_cann.onnx import export_onnx  # noqa: E402
from mmseg_cann.onnx.export import run_onnx  # noqa: E402

#: (input size, output size): single pixel, coprime, H = 1, downsampling, x8, W = 1
SHAPES = [((1, 1), (2, 2)), ((3, 5), (4, 7)), ((1, 6), (3, 13)), ((9, 11), (4, 5)),
          ((4, 3), (32, 24)), ((6, 1), (13, 3))]
SETTINGS = [('nearest', None), ('nearest-exact', None), ('bilinear', False),
            ('bilinear', True)]
CASES = [(m, ac, i, o) for m, ac in SETTINGS for i, o in SHAPES]


class FusedCases(torch.nn.Module):
    """For case ``k``: ``upsample_add(coarse_k, lateral_k)`` and
    ``upsample_argmax(coarse_k, size_k)`` (fused ops, ``backend='auto'``)."""

    def forward(self, *inputs):
        outs = []
        for (mode, ac, _, out_hw), coarse, lateral in zip(CASES, inputs[0::2], inputs[1::2]):
            outs.append(upsample_add(coarse, lateral, mode, ac))
            outs.append(upsample_argmax(coarse, out_hw, mode, ac))
        return tuple(outs)


def _inputs():
    inputs = []
    for k, (_, _, in_hw, out_hw) in enumerate(CASES):
        inputs.append(make_input((1, 5) + in_hw, seed=2 * k))
        inputs.append(make_input((1, 5) + out_hw, seed=2 * k + 1))
    return tuple(inputs)


def _unfused(mode, ac, coarse, out_hw):
    return F.interpolate(coarse, size=out_hw, mode=mode, align_corners=ac)


@pytest.mark.slow
def test_fused_ops_export_as_unfused_equivalents():
    inputs = _inputs()
    proto = export_onnx(FusedCases(), inputs)
    ops = [n.op_type for n in proto.graph.node]
    assert ops.count('Resize') == len(CASES)  # one Resize shared by add and argmax
    assert ops.count('ArgMax') == len(CASES) and ops.count('Add') == len(CASES)
    assert all(n.domain in ('', 'ai.onnx') for n in proto.graph.node)
    got = run_onnx(proto, [x.numpy() for x in inputs])
    for k, (mode, ac, in_hw, out_hw) in enumerate(CASES):
        coarse, lateral = inputs[2 * k], inputs[2 * k + 1]
        with torch.no_grad():
            up = _unfused(mode, ac, coarse, out_hw)
        added, labels = got[2 * k], got[2 * k + 1]
        atol = 0.0 if mode != 'bilinear' else 2e-6  # float32 coordinate rounding
        np.testing.assert_allclose(added, (lateral + up).numpy(), rtol=0, atol=atol,
                                   err_msg=f'upsample_add {mode} ac={ac} {in_hw}->{out_hw}')
        assert labels.dtype == np.int64 and labels.shape == (1,) + tuple(out_hw)
        expected = up.argmax(1).numpy()
        # pixels whose two best classes are closer than the rounding are ties
        top2 = up.topk(2, dim=1).values
        decided = ((top2[:, 0] - top2[:, 1]) > 1e-5).numpy()
        assert decided.mean() > 0.95
        mismatch = (labels != expected) & decided
        assert not mismatch.any(), f'upsample_argmax {mode} ac={ac} {in_hw}->{out_hw}'


def test_fused_ops_eager_unchanged_after_export():
    """Outside an export the fused ops still run their fast path (no routing leak)."""
    from mmseg_cann.onnx import onnx_export_mode
    x, y = make_input((1, 3, 3, 5), seed=1), make_input((1, 3, 4, 7), seed=2)
    with onnx_export_mode():  # not tracing: export_backend() is None
        got = upsample_add(x, y)
    torch.testing.assert_close(got, y + F.interpolate(x, size=(4, 7), mode='bilinear',
                                                      align_corners=False))
