"""The ``'portable'`` backend (what ``'auto'`` becomes under a standard exporter) computes
PyTorch's results eagerly too: exact for nearest and max pooling, float32 rounding for
the matrix and divisor-correction forms."""
import pytest
import torch

from mmseg_cann import ops
from tests._helpers import AWKWARD_SHAPES, UPSAMPLE_SETTINGS, make_input, setting_id


@pytest.mark.parametrize('setting', UPSAMPLE_SETTINGS, ids=setting_id)
def test_upsample_equals_native(setting):
    for (hi, wi), size in AWKWARD_SHAPES:
        x = make_input((2, 3, hi, wi))
        got = ops.upsample(x, size=size, backend='portable', **setting)
        want = ops.upsample(x, size=size, backend='native', **setting)
        atol = 0 if setting['mode'].startswith('nearest') else 1e-5
        torch.testing.assert_close(got, want, rtol=0, atol=atol)


@pytest.mark.parametrize('kwargs', [dict(kernel_size=3, stride=2, padding=1, ceil_mode=True),
                                    dict(kernel_size=4, stride=2, padding='same_lower'),
                                    dict(kernel_size=(2, 3), stride=(3, 1), padding=(1, 0),
                                         ceil_mode=True),
                                    dict(kernel_size=3, stride=4)])
def test_pooling_equals_native(kwargs):
    x = make_input((2, 3, 10, 13))
    for shape in ((2, 3, 10, 13), (3, 9, 7)):  # 4-D and 3-D
        x = make_input(shape)
        assert torch.equal(ops.max_pool2d(x, **kwargs, backend='portable'),
                           ops.max_pool2d(x, **kwargs, backend='native'))
        for extra in (dict(count_include_pad=True), dict(count_include_pad=False),
                      dict(divisor_override=5)):
            if extra.get('divisor_override') and isinstance(kwargs.get('padding'), str):
                continue
            torch.testing.assert_close(ops.avg_pool2d(x, **kwargs, **extra, backend='portable'),
                                       ops.avg_pool2d(x, **kwargs, **extra, backend='native'),
                                       rtol=0, atol=1e-6)
    labels = torch.randint(0, 19, (1, 1, 9, 9), dtype=torch.int64)  # integer max pooling
    assert torch.equal(ops.max_pool2d(labels, 3, 2, 'same', backend='portable'),
                       ops.max_pool2d(labels, 3, 2, 'same', backend='native'))


def test_adaptive_and_indices():
    x = make_input((1, 4, 10, 22))
    for out in (1, (3, 6), (None, 5)):
        torch.testing.assert_close(ops.adaptive_avg_pool2d(x, out, backend='portable'),
                                   ops.adaptive_avg_pool2d(x, out, backend='native'),
                                   rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match='return_indices.*tools/export_onnx.py'):
        ops.max_pool2d(x, 2, return_indices=True, backend='portable')
