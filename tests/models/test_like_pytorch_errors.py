"""Invalid calls fail like PyTorch's: where PyTorch raises ``RuntimeError`` ours raises
:class:`mmseg_cann.ArgumentError`, which is a ``RuntimeError`` and a ``ValueError``; and
what PyTorch checks only when a module runs is checked when ours runs."""
import pytest
import torch
from torch import nn

from mmseg_cann import (ArgumentError, CANNAdaptiveAvgPool2d, CANNAvgPool2d, CANNMaxPool2d,
                        CANNUpsample, convert_model, ops)

X14 = torch.rand(1, 4, 14, 14)

#: (PyTorch call, the same call on mmseg_cann): PyTorch raises RuntimeError for each
CASES = [
    ('avg kernel larger than input', lambda: nn.AvgPool2d(49, stride=(16, 20))(X14),
     lambda: CANNAvgPool2d(49, stride=(16, 20))(X14)),
    ('max kernel larger than input', lambda: nn.MaxPool2d(49)(X14),
     lambda: CANNMaxPool2d(49)(X14)),
    ('padding above half the kernel', lambda: nn.MaxPool2d(2, padding=2)(X14),
     lambda: CANNMaxPool2d(2, padding=2)(X14)),
    ('avg padding above half the kernel', lambda: nn.AvgPool2d(3, padding=2)(X14),
     lambda: CANNAvgPool2d(3, padding=2)(X14)),
    ('empty upsample size', lambda: nn.functional.interpolate(X14, size=(0, 4)),
     lambda: ops.upsample(X14, size=(0, 4))),
    ('zero kernel', lambda: nn.functional.max_pool2d(X14, 0),
     lambda: ops.max_pool2d(X14, 0)),
    ('zero stride', lambda: nn.functional.avg_pool2d(X14, 2, 0),
     lambda: ops.avg_pool2d(X14, 2, 0)),
    ('zero divisor', lambda: nn.functional.avg_pool2d(X14, 2, divisor_override=0),
     lambda: ops.avg_pool2d(X14, 2, divisor_override=0)),
    ('2-D input to pooling', lambda: nn.functional.max_pool2d(X14[0, 0], 2),
     lambda: ops.max_pool2d(X14[0, 0], 2)),
    ('empty channels', lambda: nn.functional.max_pool2d(torch.rand(1, 0, 4, 4), 2),
     lambda: ops.max_pool2d(torch.rand(1, 0, 4, 4), 2)),
]


@pytest.mark.parametrize('name, theirs, ours', CASES, ids=[c[0] for c in CASES])
def test_runtime_errors_are_caught_like_pytorchs(name, theirs, ours):
    with pytest.raises(RuntimeError):
        theirs()
    with pytest.raises(RuntimeError) as caught:
        ours()
    assert isinstance(caught.value, ValueError) and isinstance(caught.value, ArgumentError)
    assert str(caught.value)  # a message naming what is wrong


def test_modules_pytorch_builds_are_built_and_fail_when_run():
    """nn.MaxPool2d(2, padding=2) builds and fails in forward: so does ours, and
    convert_model converts a model holding such a never-used layer."""
    model = nn.Sequential(nn.MaxPool2d(2, padding=2), nn.AvgPool2d(3, padding=2), nn.Identity())
    convert_model(model, resize=False)
    assert isinstance(model[0], CANNMaxPool2d) and isinstance(model[1], CANNAvgPool2d)
    assert model.cann_conversion_report.kept == []
    with pytest.raises(RuntimeError, match='padding'):
        model(X14)


def test_converter_keeps_modules_it_cannot_build():
    """Settings torch builds but fails on when run, in a form the CANN modules refuse
    (a str kernel) or would read differently (a padding string, ONNX auto_pad for us):
    kept, so the model still fails as it did."""
    model = nn.Sequential(nn.MaxPool2d('3'), nn.Upsample(scale_factor=2),
                          nn.MaxPool2d(3, padding='same'), nn.AvgPool2d(3, padding='valid'))
    convert_model(model, resize=False)
    assert [type(m) for m in model] == [nn.MaxPool2d, CANNUpsample, nn.MaxPool2d, nn.AvgPool2d]
    kept = {path: reason for path, _, reason in model.cann_conversion_report.kept}
    assert set(kept) == {'0', '2', '3'} and 'kernel_size' in kept['0']
    assert 'auto_pad' in kept['2'] and 'auto_pad' in kept['3']
    assert 'kept' in str(model.cann_conversion_report)
    for module in model[2:]:
        with pytest.raises(TypeError):
            module(X14)


def test_converter_converts_pools_whose_values_fail_when_run():
    """A zero kernel builds in torch and fails when run: converted, it still does."""
    model = nn.Sequential(nn.MaxPool2d(0), nn.AvgPool2d(2, stride=0))
    convert_model(model, resize=False)
    assert isinstance(model[0], CANNMaxPool2d) and isinstance(model[1], CANNAvgPool2d)
    for module in model:
        with pytest.raises(RuntimeError):
            module(X14)


def test_lraspp_head_on_a_small_map_raises_runtime_error_after_conversion():
    """mmseg's own test: LRASPPHead's image pool (AvgPool2d(49, stride=(16, 20))) on a
    14x14 map raises RuntimeError; converted, it still does."""
    from mmseg.models.decode_heads import LRASPPHead
    head = LRASPPHead(in_channels=(4, 4, 16), channels=16, in_index=(0, 1, 2), num_classes=19,
                      input_transform='multiple_select', init_cfg=None)
    feats = [torch.rand(1, 4, 56, 56), torch.rand(1, 4, 28, 28), torch.rand(1, 16, 14, 14)]
    with pytest.raises(RuntimeError):
        head(feats)
    convert_model(head, resize=False)
    assert any(isinstance(m, CANNAvgPool2d) for m in head.modules())
    with pytest.raises(RuntimeError):
        head(feats)
    with pytest.raises(ValueError):
        head(feats)


def test_adaptive_output_size_zero():
    """PyTorch builds it and its forward returns an empty map (only backward raises)."""
    x = torch.ones(1, 64, 8, 8)
    out = CANNAdaptiveAvgPool2d(0)(x)
    expected = torch.nn.AdaptiveAvgPool2d(0)(x)
    assert out.shape == expected.shape == (1, 64, 0, 0) and out.dtype == expected.dtype
    with pytest.raises(ValueError):
        CANNAdaptiveAvgPool2d(-1)
