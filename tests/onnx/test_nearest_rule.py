"""The export-time check for nearest Resize: :func:`onnx_nearest_indices` must be what
onnxruntime computes, so that the refusal (PyTorch's float32 index differs) is exact.
Plain ONNX graphs, no torch export: a 1-D ramp resized along W returns its indices."""
from __future__ import annotations

import numpy as np
import pytest

from mmseg_cann.onnx.translation import onnx_nearest_indices
from tests._helpers import ort_nearest_indices

pytest.importorskip('onnxruntime')


@pytest.mark.parametrize('exact_mode', [False, True], ids=['nearest', 'nearest-exact'])
def test_emulated_onnx_nearest_indices_match_onnxruntime(exact_mode):
    pairs = [(i, o) for i in range(1, 9) for o in range(1, 90, 3)] + [(2, 82), (3, 100)]
    for n_in, n_out in pairs:
        got = ort_nearest_indices(n_in, exact_mode, n_out=n_out)
        np.testing.assert_array_equal(onnx_nearest_indices(n_in, n_out, None, exact_mode), got,
                                      err_msg=f'{n_in} -> {n_out}')


def test_known_pytorch_onnx_disagreement():
    from mmseg_cann.core.reference import nearest_indices
    torch_idx = nearest_indices(2, 82, None, False)
    onnx_idx = onnx_nearest_indices(2, 82, None, False)
    assert torch_idx[41] == 0 and onnx_idx[41] == 1  # docs/design.md 2.1's example
