"""The CANN modules: drop-in behaviour, statelessness, copying, repr and validation."""
import copy
import pickle

import pytest
import torch
from torch import nn

from mmseg_cann import (CANNAdaptiveAvgPool2d, CANNAvgPool2d, CANNMaxPool2d, CANNUpsample)

from tests._helpers import make_input

PAIRS = [
    (CANNUpsample(scale_factor=2, mode='bilinear', align_corners=False),
     nn.Upsample(scale_factor=2, mode='bilinear', align_corners=False)),
    (CANNUpsample(size=(9, 5), mode='nearest'), nn.Upsample(size=(9, 5), mode='nearest')),
    (CANNUpsample(scale_factor=1.5, mode='bicubic', recompute_scale_factor=True),
     nn.Upsample(scale_factor=1.5, mode='bicubic', recompute_scale_factor=True)),
    (CANNMaxPool2d(3, 2, 1), nn.MaxPool2d(3, 2, 1)),
    (CANNMaxPool2d(3, 2, 1, return_indices=True, ceil_mode=True),
     nn.MaxPool2d(3, 2, 1, return_indices=True, ceil_mode=True)),
    (CANNAvgPool2d(3, 2, 1, precision='input'), nn.AvgPool2d(3, 2, 1)),
    (CANNAvgPool2d(2, 2, 0, True, False, 3, precision='input'),
     nn.AvgPool2d(2, 2, 0, True, False, 3)),
    (CANNAdaptiveAvgPool2d((2, 3), precision='input'), nn.AdaptiveAvgPool2d((2, 3))),
]


@pytest.mark.parametrize('pair', PAIRS, ids=lambda p: repr(p[0]))
def test_module_equals_torch_module(pair):
    ours, theirs = pair
    assert isinstance(ours, type(theirs))
    for dtype in (torch.float32, torch.float16):
        x = make_input((2, 3, 7, 8), dtype).requires_grad_(dtype == torch.float32)
        got, expected = ours(x), theirs(x)
        if isinstance(got, tuple):
            assert all(torch.equal(a, b) for a, b in zip(got, expected))
        else:
            assert torch.equal(got, expected)
            if x.requires_grad:
                g1, = torch.autograd.grad(got.sum(), x)
                g2, = torch.autograd.grad(expected.sum(), x)
                assert torch.equal(g1, g2)


@pytest.mark.parametrize('module', [p[0] for p in PAIRS] + [
    CANNMaxPool2d(2, padding='same', precision='fp16', backend='reference')], ids=repr)
def test_stateless_copyable_picklable(module):
    assert module.state_dict() == {}
    assert list(module.parameters()) == [] and list(module.buffers()) == []
    x = make_input((1, 2, 6, 6), torch.float32)
    out = module(x)
    out = out[0] if isinstance(out, tuple) else out
    for clone in (copy.deepcopy(module), pickle.loads(pickle.dumps(module))):
        again = clone(x)
        assert torch.equal(again[0] if isinstance(again, tuple) else again, out)
        assert repr(clone) == repr(module)


def test_repr_shows_settings():
    assert repr(CANNUpsample(scale_factor=2, mode='bilinear', align_corners=True)) == \
        "CANNUpsample(scale_factor=2.0, mode='bilinear', align_corners=True)"
    text = repr(CANNMaxPool2d(3, 2, 'same_lower', precision=torch.float16))
    assert "padding=same_lower" in text and "precision='fp16'" in text
    text = repr(CANNAvgPool2d(3, precision='fp32', backend='reference'))
    assert "precision='fp32'" in text and "backend='reference'" in text
    assert "antialias=True" in repr(CANNUpsample(size=4, mode='bicubic', antialias=True))


def test_padding_strings_in_modules():
    x = make_input((1, 2, 7, 7), torch.float32)
    assert CANNMaxPool2d(2, 2, 'same')(x).shape == (1, 2, 4, 4)
    assert CANNAvgPool2d(3, 2, 'same_lower')(x).shape == (1, 2, 4, 4)


@pytest.mark.parametrize('build, exc', [
    (lambda: CANNUpsample(), ValueError),
    (lambda: CANNUpsample(size=4, mode='nearest', align_corners=True), ValueError),
    (lambda: CANNUpsample(scale_factor=0), ValueError),
    (lambda: CANNUpsample(size=4, precision='fp64'), ValueError),
    (lambda: CANNUpsample(size=4, backend='compiled'), ValueError),  # not a backend
    (lambda: CANNMaxPool2d('2'), TypeError),
    (lambda: CANNAvgPool2d(2, divisor_override=1.5), TypeError),
    (lambda: CANNAvgPool2d(2, padding='full'), ValueError),
    (lambda: CANNAdaptiveAvgPool2d(-1), ValueError),  # 0 is PyTorch's empty output
    (lambda: CANNAdaptiveAvgPool2d('2'), TypeError),
])
def test_constructor_validates(build, exc):
    with pytest.raises(exc):
        build()


@pytest.mark.parametrize('name, kwargs', [
    ('MaxPool2d', dict(kernel_size=2, stride=0)),
    ('MaxPool2d', dict(kernel_size=0)),
    ('MaxPool2d', dict(kernel_size=2, padding=2)),
    ('AvgPool2d', dict(kernel_size=2, stride=0)),
    ('AvgPool2d', dict(kernel_size=2, divisor_override=0)),
])
def test_out_of_range_pool_values_fail_when_run_as_in_pytorch(name, kwargs):
    """PyTorch builds these modules and raises RuntimeError when they run (its own
    test_pooling_zero_stride builds one outside assertRaises): ours too."""
    import mmseg_cann
    x = make_input((1, 2, 6, 6), torch.float32)
    torch_module = getattr(torch.nn, name)(**kwargs)
    ours = getattr(mmseg_cann, f'CANN{name}')(**kwargs)
    with pytest.raises(RuntimeError):
        torch_module(x)
    with pytest.raises(RuntimeError):
        ours(x)


@pytest.mark.parametrize('backend', ['npu', 'tuned'])
def test_modules_accept_the_npu_and_tuned_backends(backend, tmp_path, monkeypatch):
    monkeypatch.setenv('MMSEG_CANN_TUNING_CACHE', str(tmp_path / 'tune.json'))
    x = make_input((1, 2, 7, 7), torch.float32)
    assert torch.equal(CANNUpsample(size=(14, 21), mode='bilinear', backend=backend)(x),
                       CANNUpsample(size=(14, 21), mode='bilinear')(x))
    assert torch.equal(CANNMaxPool2d(3, 2, 1, backend=backend)(x), CANNMaxPool2d(3, 2, 1)(x))
