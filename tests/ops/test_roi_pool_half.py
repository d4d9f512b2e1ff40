"""roi_pool2d on float16/bfloat16 input: the box arithmetic stays in float32, so max
pooling is the float32 result (torchvision's, tests/ops/test_roi_pool.py) rounded to the
input dtype, not torchvision's float16 kernel, whose box edges are float16 products."""
from __future__ import annotations

import pytest
import torch

from mmseg_cann.ops import roi_pool2d

BACKENDS = ('fast', 'native')


def _boxes(k, size, seed, dtype):
    """Fractional boxes in [-3, size + 3] (some partly outside, some reversed)."""
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(k, 4, generator=g) * (size + 6) - 3
    return torch.cat([torch.randint(0, 2, (k, 1), generator=g).float(), xy], 1).to(dtype)


@pytest.mark.parametrize('backend', BACKENDS)
@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
@pytest.mark.parametrize('size, scale', [((7, 7), 1.0), ((21, 13), 0.3), ((2, 9), 1 / 16),
                                         ((5, 4), 2.0)])
def test_half_max_is_the_float32_result_rounded(backend, dtype, size, scale):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 5, 17, 19, generator=g).to(dtype)
    rois = _boxes(40, round(19 / scale), 4, dtype)  # boxes in the half dtype, as torchvision
    out, index = roi_pool2d(x, rois, size, 'max', scale, return_indices=True,
                            backend=backend)
    ref, ref_index = roi_pool2d(x.float(), rois.float(), size, 'max', scale,
                                return_indices=True, backend=backend)
    assert out.dtype == dtype
    assert torch.equal(out, ref.to(dtype)) and torch.equal(index, ref_index)


@pytest.mark.parametrize('backend', BACKENDS)
@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
def test_float32_bins_where_half_bins_end_a_row_later(backend, dtype):
    """A region of 15 rows into 13 bins: float32 ``15 / 13`` ends the last bin at row
    ``ceil(13 * b) = 15`` (rows 13..14); in float16 (``b = 1.1543``, ``13 * b`` rounded
    to 15.0078) it would end at 16, one row past the box. Row 15 holds the largest
    value, so only the half-precision bins would pool it."""
    x = torch.arange(16, dtype=torch.float32).view(1, 1, 16, 1).to(dtype)
    x[0, 0, 15, 0] = 100
    rois = torch.tensor([[0, 0, 0, 0, 14]], dtype=dtype)   # rows 0..14, column 0
    out = roi_pool2d(x, rois, (13, 1), 'max', backend=backend)
    b = torch.tensor(15, dtype=torch.float32) / torch.tensor(13, dtype=torch.float32)
    for i in range(13):  # torchvision's float bins, in float32
        start = int(torch.floor(torch.tensor(i, dtype=torch.float32) * b))
        end = int(torch.ceil(torch.tensor(i + 1, dtype=torch.float32) * b))
        assert out[0, 0, i, 0] == x[0, 0, start:end, 0].max()
    assert end == 15 and not (out == 100).any()
