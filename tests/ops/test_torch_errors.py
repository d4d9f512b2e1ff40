"""Argument handling and error types against real PyTorch calls, and the message texts
PyTorch's own tests (``test/nn/test_pooling.py``, the interpolate tests of
``test/test_nn.py``) match."""
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mmseg_cann import ops
from mmseg_cann.core.errors import ArgumentError
from mmseg_cann.models import CANNAdaptiveAvgPool2d, CANNAvgPool2d, CANNMaxPool2d

X = torch.randn(1, 2, 5, 6)

#: (description, PyTorch call, our call): same result, or an exception of PyTorch's type
SAME_OUTCOME = [
    ('avg_pool2d of a 2-D tensor (IndexError)', lambda: F.avg_pool2d(torch.ones(4, 4), 2),
     lambda: ops.avg_pool2d(torch.ones(4, 4), 2)),
    ('avg_pool2d of a 2-D tensor, padding above half the kernel (IndexError first)',
     lambda: F.avg_pool2d(torch.ones(4, 4), 2, padding=2),
     lambda: ops.avg_pool2d(torch.ones(4, 4), 2, padding=2)),
    ('avg_pool2d of a 5-D tensor', lambda: F.avg_pool2d(torch.ones(1, 1, 1, 4, 4), 2),
     lambda: ops.avg_pool2d(torch.ones(1, 1, 1, 4, 4), 2)),
    ('max_pool2d of a 2-D tensor', lambda: F.max_pool2d(torch.ones(4, 4), 2),
     lambda: ops.max_pool2d(torch.ones(4, 4), 2)),
    ('max_pool2d, float kernel and wrong rank (TypeError first)',
     lambda: F.max_pool2d(torch.ones(4, 4), 2.5), lambda: ops.max_pool2d(torch.ones(4, 4), 2.5)),
    ('max_pool2d of bool, bad padding', lambda: F.max_pool2d(X.bool(), 2, padding=2),
     lambda: ops.max_pool2d(X.bool(), 2, padding=2)),
    ('adaptive_avg_pool2d of a 2-D tensor to 2', lambda: F.adaptive_avg_pool2d(X[0, 0], 2),
     lambda: ops.adaptive_avg_pool2d(X[0, 0], 2)),
    ('adaptive_avg_pool2d of a 2-D tensor to 1 (a mean)',
     lambda: F.adaptive_avg_pool2d(X[0, 0], 1), lambda: ops.adaptive_avg_pool2d(X[0, 0], 1)),
    ('adaptive_avg_pool2d of a 2-D tensor to (1, 1)',
     lambda: F.adaptive_avg_pool2d(X[0, 0], (1, 1)),
     lambda: ops.adaptive_avg_pool2d(X[0, 0], (1, 1))),
    ('adaptive_avg_pool2d of a 5-D tensor to 1', lambda: F.adaptive_avg_pool2d(X[None], 1),
     lambda: ops.adaptive_avg_pool2d(X[None], 1)),
    ('adaptive_avg_pool2d of a 1-D tensor', lambda: F.adaptive_avg_pool2d(torch.ones(3), 1),
     lambda: ops.adaptive_avg_pool2d(torch.ones(3), 1)),
    ('adaptive_avg_pool2d, output_size of one entry', lambda: F.adaptive_avg_pool2d(X, (2,)),
     lambda: ops.adaptive_avg_pool2d(X, (2,))),
    ('adaptive_avg_pool2d, negative output_size', lambda: F.adaptive_avg_pool2d(X, -1),
     lambda: ops.adaptive_avg_pool2d(X, -1)),
    ('adaptive_avg_pool2d, output_size True', lambda: F.adaptive_avg_pool2d(X, True),
     lambda: ops.adaptive_avg_pool2d(X, True)),
    ('adaptive_avg_pool2d of int32 to 1 (the mean raises)',
     lambda: F.adaptive_avg_pool2d(X.int(), 1), lambda: ops.adaptive_avg_pool2d(X.int(), 1)),
    ('adaptive_avg_pool2d of complex to 1 (a mean)',
     lambda: F.adaptive_avg_pool2d(X.cfloat(), 1),
     lambda: ops.adaptive_avg_pool2d(X.cfloat(), 1)),
    ('interpolate, mode linear on 4-D (NotImplementedError)',
     lambda: F.interpolate(X, size=4, mode='linear'),
     lambda: ops.upsample(X, size=4, mode='linear')),
    ('interpolate, unknown mode', lambda: F.interpolate(X, size=4, mode='cubic'),
     lambda: ops.upsample(X, size=4, mode='cubic')),
    ('interpolate, align_corners=1 with nearest (ValueError before TypeError)',
     lambda: F.interpolate(X, size=4, align_corners=1),
     lambda: ops.upsample(X, size=4, align_corners=1)),
    ('interpolate, align_corners=1 with bilinear',
     lambda: F.interpolate(X, size=4, mode='bilinear', align_corners=1),
     lambda: ops.upsample(X, size=4, mode='bilinear', align_corners=1)),
    ('interpolate, antialias=1', lambda: F.interpolate(X, size=3, mode='bilinear', antialias=1),
     lambda: ops.upsample(X, size=3, mode='bilinear', antialias=1)),
    ('interpolate, antialias with nearest', lambda: F.interpolate(X, size=3, antialias=1),
     lambda: ops.upsample(X, size=3, antialias=1)),
    ('interpolate, recompute_scale_factor=1',
     lambda: F.interpolate(X, scale_factor=1.5, mode='bilinear', recompute_scale_factor=1),
     lambda: ops.upsample(X, scale_factor=1.5, mode='bilinear', recompute_scale_factor=1)),
    ('interpolate, recompute_scale_factor=0',
     lambda: F.interpolate(X, scale_factor=1.5, recompute_scale_factor=0),
     lambda: ops.upsample(X, scale_factor=1.5, recompute_scale_factor=0)),
    ('interpolate, size of one entry', lambda: F.interpolate(X, size=(3,)),
     lambda: ops.upsample(X, size=(3,))),
    ('interpolate, scale_factor of one entry', lambda: F.interpolate(X, scale_factor=[2.0]),
     lambda: ops.upsample(X, scale_factor=[2.0])),
    ('interpolate, zero size', lambda: F.interpolate(X, size=(0, 3)),
     lambda: ops.upsample(X, size=(0, 3))),
    ('interpolate, scale giving an empty output', lambda: F.interpolate(X, scale_factor=0.1),
     lambda: ops.upsample(X, scale_factor=0.1)),
    ('interpolate area, zero size', lambda: F.interpolate(X, size=(0, 3), mode='area'),
     lambda: ops.upsample(X, size=(0, 3), mode='area')),
    ('interpolate area, scale giving an empty output',
     lambda: F.interpolate(X, scale_factor=0.1, mode='area'),
     lambda: ops.upsample(X, scale_factor=0.1, mode='area')),
    ('interpolate of a 3-D tensor', lambda: F.interpolate(X[0], size=4),
     lambda: ops.upsample(X[0], size=4)),
    ('interpolate of a 3-D tensor, linear', lambda: F.interpolate(X[0], size=4, mode='linear'),
     lambda: ops.upsample(X[0], size=4, mode='linear')),
    ('interpolate of a 3-D tensor, bilinear',
     lambda: F.interpolate(X[0], size=4, mode='bilinear'),
     lambda: ops.upsample(X[0], size=4, mode='bilinear')),
    ('interpolate of a 5-D tensor, pair size', lambda: F.interpolate(X[None], size=(4, 4)),
     lambda: ops.upsample(X[None], size=(4, 4))),
    ('interpolate of a 5-D tensor, trilinear',
     lambda: F.interpolate(X[None], scale_factor=2, mode='trilinear'),
     lambda: ops.upsample(X[None], scale_factor=2, mode='trilinear')),
    ('interpolate, lanczos', lambda: F.interpolate(X, size=3, mode='lanczos', antialias=True),
     lambda: ops.upsample(X, size=3, mode='lanczos', antialias=True)),
    ('max_pool2d, stride 0', lambda: F.max_pool2d(X, 2, 0), lambda: ops.max_pool2d(X, 2, 0)),
    ('avg_pool2d, kernel of three entries', lambda: F.avg_pool2d(X, (2, 2, 2)),
     lambda: ops.avg_pool2d(X, (2, 2, 2))),
    ('avg_pool2d, divisor_override 0', lambda: F.avg_pool2d(X, 2, divisor_override=0),
     lambda: ops.avg_pool2d(X, 2, divisor_override=0)),
]


def _outcome(call):
    try:
        return call(), None
    except Exception as exc:  # noqa: BLE001 - compared with PyTorch's
        return None, exc


@pytest.mark.parametrize('case', SAME_OUTCOME, ids=[c[0] for c in SAME_OUTCOME])
def test_same_outcome_as_pytorch(case):
    _, torch_call, our_call = case
    expected, error = _outcome(torch_call)
    got, our_error = _outcome(our_call)
    if error is not None:
        assert isinstance(our_error, type(error)), (error, our_error)
        return
    assert our_error is None, (expected, our_error)
    expected = expected if isinstance(expected, tuple) else (expected,)
    got = got if isinstance(got, tuple) else (got,)
    for a, b in zip(expected, got):
        assert a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)


@pytest.mark.parametrize('flag', [0, 1, 2, 1.0, None, 'a', np.bool_(True), np.bool_(False),
                                  torch.tensor(True)], ids=repr)
def test_return_indices_is_read_by_truth_value(flag):
    """``F.max_pool2d`` (and so ``nn.MaxPool2d``) dispatches on ``bool(return_indices)``."""
    expected = F.max_pool2d(X, 2, return_indices=flag)
    for got in (ops.max_pool2d(X, 2, return_indices=flag),
                CANNMaxPool2d(2, return_indices=flag)(X)):
        assert type(got) is type(expected)
        got = got if isinstance(got, tuple) else (got,)
        expected_items = expected if isinstance(expected, tuple) else (expected,)
        assert all(torch.equal(a, b) for a, b in zip(expected_items, got))


#: (description, call, the regex PyTorch's own test matches)
PYTORCH_MESSAGES = [
    ('test_MaxPool_zero_batch_dim', lambda: CANNMaxPool2d(3, stride=2)(torch.randn(1, 0, 50, 32)),
     'Expected'),
    ('test_AvgPool2d_empty', lambda: CANNAvgPool2d(3, stride=2)(torch.randn(16, 0, 20, 32)),
     '3D or 4D'),
    ('test_pooling_zero_stride (max)', lambda: ops.max_pool2d(torch.ones(1, 2, 4, 4), 2, 0),
     'stride should not be zero|stride must be greater than zero'),
    ('test_pooling_zero_stride (avg)', lambda: ops.avg_pool2d(torch.ones(1, 2, 4, 4), 2, 0),
     'stride should not be zero|stride must be greater than zero'),
    ('test_pool_invalid_size (max)',
     lambda: ops.max_pool2d(torch.ones(1, 1, 4, 4), 3, stride=2, padding=0, dilation=2),
     'too small|smaller than'),
    ('test_pool_invalid_size (avg)', lambda: ops.avg_pool2d(torch.ones(1, 1, 4, 4), 6, 2, 0),
     'too small|smaller than'),
    ('test_adaptive_pooling_no_suppot_input',
     lambda: CANNAdaptiveAvgPool2d((2, 2))(torch.ones(4, 4, 4, dtype=torch.int16)),
     'not implemented'),
    ('test_upsamplingBiMode2d_nonsupported_dtypes (nearest)',
     lambda: ops.upsample(torch.ones(1, 3, 32, 32, dtype=torch.int16), (12, 12)),
     'not implemented for'),
    ('test_upsamplingBiMode2d_nonsupported_dtypes (bicubic)',
     lambda: ops.upsample(torch.ones(1, 3, 32, 32, dtype=torch.int32), (12, 12), mode='bicubic'),
     'not implemented for'),
    ('empty adaptive input', lambda: ops.adaptive_avg_pool2d(torch.ones(1, 3, 0, 4), 2),
     'Expected input to have non-zero size for non-batch dimensions'),
    ('padding above half the kernel', lambda: ops.max_pool2d(X, 2, padding=2),
     'pad should be smaller than or equal to half of kernel size'),
]


@pytest.mark.parametrize('case', PYTORCH_MESSAGES, ids=[c[0] for c in PYTORCH_MESSAGES])
def test_messages_hold_pytorchs_wording(case):
    _, call, pattern = case
    with pytest.raises(RuntimeError) as info:
        call()
    assert re.search(pattern, str(info.value)), str(info.value)
    assert isinstance(info.value, (ValueError, TypeError))  # and ours: naming the argument


def test_ceil_mode_output_rule_of_pytorchs_pooling_shape_test():
    """``test_pooling_shape``: ceil_mode with a last window in the padding, and the
    1x1 kernel with stride 2 (gh-45357)."""
    for kw, shape in ((dict(kernel_size=1, stride=2, padding=0, ceil_mode=True), (1, 1, 3, 3)),
                      (dict(kernel_size=2, stride=2, padding=1, ceil_mode=False), (1, 1, 2, 3)),
                      (dict(kernel_size=2, stride=2, padding=1, ceil_mode=True), (1, 1, 2, 3))):
        x = torch.randn(1, 1, 5, 6) if kw['kernel_size'] == 1 else torch.randn(1, 1, 3, 4)
        for op in (ops.max_pool2d, ops.avg_pool2d):
            assert op(x, **kw).shape == shape
    y = ops.max_pool2d(torch.randn(1, 1, 6, 7), 1, stride=(2, 2), padding=0, ceil_mode=True)
    assert y.shape == (1, 1, 3, 4)


def test_argument_errors_are_value_errors_and_runtime_errors():
    with pytest.raises(ArgumentError):
        ops.max_pool2d(X, 7)
    assert issubclass(ArgumentError, ValueError) and issubclass(ArgumentError, RuntimeError)
    # the modules take PyTorch's module behaviour for a deferred check
    with pytest.raises(RuntimeError):
        CANNAvgPool2d(3, padding=2)(X)
    with pytest.raises(RuntimeError):
        nn.AvgPool2d(3, padding=2)(X)
