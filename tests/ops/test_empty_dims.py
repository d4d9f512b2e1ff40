"""Empty dimensions (N, C, H, W = 0, 3-D and other ranks) of every op and module against
real PyTorch calls: the same result shape and values, or an exception that is an instance
of PyTorch's."""
import itertools

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mmseg_cann import ops
from mmseg_cann.models import CANNAdaptiveAvgPool2d, CANNAvgPool2d, CANNMaxPool2d, CANNUpsample

from tests._helpers import compare_with_torch

SHAPES = (list(itertools.product((0, 2), (0, 3), (0, 5), (0, 6)))
          + list(itertools.product((0, 3), (0, 5), (0, 6)))
          + [(5,), (0, 5), (5, 0), (4, 5), (2, 3, 4, 5, 6), (0, 3, 4, 5, 6)])
UPSAMPLES = [dict(size=(4, 4), mode='nearest'), dict(size=(4, 4), mode='bilinear'),
             dict(size=(4, 4), mode='bicubic'), dict(scale_factor=2, mode='nearest'),
             dict(size=4), dict(size=(2, 2), mode='area'), dict(size=1, mode='area'),
             dict(size=0, mode='area'), dict(scale_factor=0.5, mode='area')]
OUTPUT_SIZES = [2, 0, (0, 2), 1, (1, None), (None, 1), (2, None)]

#: name -> (PyTorch call, our op, our module) on an input tensor
CASES = {
    'max_pool2d': (lambda x: F.max_pool2d(x, 2), lambda x: ops.max_pool2d(x, 2),
                   CANNMaxPool2d(2), nn.MaxPool2d(2)),
    'max_pool2d indices': (lambda x: F.max_pool2d(x, 2, return_indices=True),
                           lambda x: ops.max_pool2d(x, 2, return_indices=True),
                           CANNMaxPool2d(2, return_indices=True),
                           nn.MaxPool2d(2, return_indices=True)),
    'avg_pool2d': (lambda x: F.avg_pool2d(x, 2), lambda x: ops.avg_pool2d(x, 2),
                   CANNAvgPool2d(2), nn.AvgPool2d(2)),
}
for _size in OUTPUT_SIZES:
    CASES[f'adaptive_avg_pool2d {_size}'] = (
        lambda x, o=_size: F.adaptive_avg_pool2d(x, o),
        lambda x, o=_size: ops.adaptive_avg_pool2d(x, o),
        CANNAdaptiveAvgPool2d(_size), nn.AdaptiveAvgPool2d(_size))
for _kw in UPSAMPLES:
    CASES['upsample ' + ' '.join(f'{k}={v}' for k, v in _kw.items())] = (
        lambda x, kw=_kw: F.interpolate(x, **kw), lambda x, kw=_kw: ops.upsample(x, **kw),
        CANNUpsample(**_kw), nn.Upsample(**_kw))


@pytest.mark.parametrize('name', list(CASES))
def test_empty_and_odd_shapes_as_pytorch(name):
    torch_call, our_call, our_module, torch_module = CASES[name]
    problems = []
    for shape in SHAPES:
        x = torch.randn(shape, generator=torch.Generator().manual_seed(len(shape)))
        for label, call, reference in (('op', our_call, torch_call),
                                       ('module', our_module, torch_module)):
            compare_with_torch(lambda: reference(x), lambda: call(x), f'{label} {shape}',
                               problems)
    assert not problems, problems


def test_adaptive_pooling_zero_channels_and_zero_output_as_pytorch():
    """The cases of PyTorch's own tests: 3-D input with zero channels (forward and
    backward), and output_size=0 (an empty result; only the backward raises)."""
    inp = torch.ones(0, 10, 10, requires_grad=True)
    out = CANNAdaptiveAvgPool2d((5, 5))(inp)
    assert out.shape == (0, 5, 5)
    out.backward(torch.rand_like(out))
    assert torch.equal(inp.grad, torch.zeros_like(inp))
    x = torch.randn(1, 64, 10, 9, requires_grad=True)
    for call in (lambda: ops.adaptive_avg_pool2d(x, 0), lambda: CANNAdaptiveAvgPool2d(0)(x)):
        out = call()
        assert out.shape == (1, 64, 0, 0)
        with pytest.raises(RuntimeError, match='Expected grad_output to have non-zero size'):
            out.sum().backward()
