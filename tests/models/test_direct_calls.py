"""Cached direct calls (mmseg_cann.ops.direct): the modules and functional ops give the
full path's results, and the cache steps aside whenever the state could change them."""
import copy
import pickle

import pytest
import torch
import torch.nn.functional as F

from mmseg_cann import (CANNAdaptiveAvgPool2d, CANNAvgPool2d, CANNMaxPool2d, CANNUpsample, ops,
                        precision_policy, set_precision_policy)
from mmseg_cann.ops import direct
from tests._helpers import make_input

MODULES = [
    lambda: CANNUpsample(scale_factor=2, mode='bilinear'),
    lambda: CANNUpsample(size=(5, 7), mode='nearest'),
    lambda: CANNUpsample(scale_factor=1.5, mode='bicubic', align_corners=True),
    lambda: CANNUpsample(size=(3, 3), mode='bilinear', antialias=True),
    lambda: CANNMaxPool2d(3, 2, 1),
    lambda: CANNMaxPool2d(3, 2, 1, return_indices=True, ceil_mode=True),
    lambda: CANNMaxPool2d(4, 2, 'same_lower'),
    lambda: CANNAvgPool2d(3, 2, 1, count_include_pad=False),
    lambda: CANNAvgPool2d(2, divisor_override=3),
    lambda: CANNAdaptiveAvgPool2d((None, 2)),
]


def _full(module, x):
    with direct.direct_calls_disabled():
        return module(x)


def _same(a, b):
    if isinstance(a, tuple):
        return all(_same(p, q) for p, q in zip(a, b))
    return a.dtype == b.dtype and torch.equal(a, b) and a.stride() == b.stride()


@pytest.mark.parametrize('build', MODULES)
@pytest.mark.parametrize('shape, dtype', [((2, 3, 9, 11), torch.float32),
                                          ((2, 3, 9, 11), torch.float16),
                                          ((3, 9, 11), torch.float32)])
def test_cached_calls_equal_the_full_path(build, shape, dtype):
    module = build()
    if isinstance(module, CANNUpsample) and len(shape) == 3:
        pytest.skip('upsample takes 4-D input')
    x = make_input(shape, dtype) if len(shape) == 4 else make_input((1,) + shape, dtype)[0]
    first, second = module(x), module(x)  # the second call is the cached one
    assert _same(first, _full(module, x)) and _same(second, first)


def test_functional_ops_cached_equal_full_path():
    x = make_input((1, 4, 6, 7))
    calls = [lambda: ops.upsample(x, scale_factor=2, mode='bilinear'),
             lambda: ops.max_pool2d(x, 3, 2, 1, return_indices=True),
             lambda: ops.avg_pool2d(x, 3, 2, 1, divisor_override=2),
             lambda: ops.adaptive_avg_pool2d(x, 3)]
    for call in calls:
        cached = (call(), call())
        with direct.direct_calls_disabled():
            full = call()
        assert _same(cached[0], full) and _same(cached[1], full)
    # list arguments are keyed by value and type too
    assert torch.equal(ops.max_pool2d(x, [3, 3], [2, 2], [1, 1]), F.max_pool2d(x, 3, 2, 1))


def test_policy_change_is_seen():
    x = make_input((1, 4, 8, 8))
    m = CANNMaxPool2d(2)
    m(x)
    with precision_policy(pool_precision=dict(max='bf16')):  # computes in bf16
        inside = m(x)
        assert torch.equal(inside, F.max_pool2d(x.bfloat16(), 2).float())
    set_precision_policy(pool_precision=dict(max='fp16'))
    assert torch.equal(m(x), F.max_pool2d(x.half(), 2).float())
    set_precision_policy(reset=True)
    assert torch.equal(m(x), F.max_pool2d(x, 2))


def test_autocast_attribute_changes_and_errors():
    x = make_input((1, 4, 8, 8))
    m = CANNUpsample(scale_factor=2, mode='bilinear')
    m(x)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        assert m(x).dtype == torch.nn.Upsample(scale_factor=2, mode='bilinear')(x).dtype
    m.scale_factor = 3.0  # a changed setting is another key
    assert m(x).shape[-1] == 24
    p = CANNMaxPool2d(2, padding=2)  # PyTorch checks padding when the module runs
    with pytest.raises(RuntimeError, match='padding'):
        p(x)
    with pytest.raises(RuntimeError, match='padding'):
        p(x)
    with pytest.raises(TypeError):
        CANNMaxPool2d(2)([1, 2])


def test_tuning_and_copies(monkeypatch, tmp_path):
    x = make_input((1, 4, 8, 8))
    m = CANNUpsample(scale_factor=2, mode='bilinear')
    m(x)
    monkeypatch.setenv('MMSEG_CANN_TUNE', '1')
    monkeypatch.setenv('MMSEG_CANN_TUNING_CACHE', str(tmp_path / 'tune.json'))
    assert torch.equal(m(x), F.interpolate(x, scale_factor=2, mode='bilinear'))
    assert (tmp_path / 'tune.json').exists()  # 'auto' tuned instead of the cached call
    clone = pickle.loads(pickle.dumps(m))
    assert torch.equal(clone(x), m(x))
    assert torch.equal(copy.deepcopy(m)(x), m(x))
