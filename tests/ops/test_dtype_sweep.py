"""Every input dtype of every op and module against real PyTorch calls on the CPU.

A dtype PyTorch takes gives PyTorch's result bit for bit (dtype, values, layout); a dtype
it rejects raises an exception that is an instance of PyTorch's (``NotImplementedError``
for "not implemented for 'Short'", ``RuntimeError`` for the integer mean), and also a
``TypeError`` naming the dtype. uint8 bilinear/bicubic is PyTorch's own arithmetic on
every backend.
"""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mmseg_cann import ops
from mmseg_cann.core.errors import UnsupportedDtypeError
from mmseg_cann.models import CANNAdaptiveAvgPool2d, CANNAvgPool2d, CANNMaxPool2d, CANNUpsample
from mmseg_cann.utils import fallback_counts, reset_fallbacks

from .._helpers import AWKWARD_SHAPES, make_input, setting_id

DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.bool,
          torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64]
LAYOUTS = ['contiguous', 'channels_last']

UPSAMPLES = [dict(size=(7, 9), mode='nearest'), dict(size=(7, 9), mode='nearest-exact'),
             dict(scale_factor=1.7, mode='nearest'),
             dict(size=(7, 9), mode='bilinear'), dict(size=(7, 9), mode='bilinear',
                                                      align_corners=True),
             dict(size=(7, 9), mode='bicubic'), dict(scale_factor=0.6, mode='bicubic'),
             dict(size=(3, 2), mode='bilinear', antialias=True),
             dict(size=(3, 2), mode='bicubic', antialias=True),
             dict(size=(3, 3), mode='area'), dict(size=1, mode='area')]
#: (PyTorch call, our op call, PyTorch module, our module)
POOLS = {
    'max_pool2d': (lambda x: F.max_pool2d(x, 2, 1, 1, return_indices=True),
                   lambda x: ops.max_pool2d(x, 2, 1, 1, return_indices=True),
                   nn.MaxPool2d(2, 1, 1, return_indices=True),
                   CANNMaxPool2d(2, 1, 1, return_indices=True)),
    'avg_pool2d': (lambda x: F.avg_pool2d(x, 3, 2, 1, True, False),
                   lambda x: ops.avg_pool2d(x, 3, 2, 1, True, False),
                   nn.AvgPool2d(3, 2, 1, True, False), CANNAvgPool2d(3, 2, 1, True, False)),
    'avg_pool2d divisor': (lambda x: F.avg_pool2d(x, 2, divisor_override=-3),
                           lambda x: ops.avg_pool2d(x, 2, divisor_override=-3),
                           nn.AvgPool2d(2, divisor_override=-3),
                           CANNAvgPool2d(2, divisor_override=-3)),
    'adaptive_avg_pool2d': (lambda x: F.adaptive_avg_pool2d(x, 3),
                            lambda x: ops.adaptive_avg_pool2d(x, 3),
                            nn.AdaptiveAvgPool2d(3), CANNAdaptiveAvgPool2d(3)),
    'adaptive_avg_pool2d 1x1': (lambda x: F.adaptive_avg_pool2d(x, 1),
                                lambda x: ops.adaptive_avg_pool2d(x, 1),
                                nn.AdaptiveAvgPool2d(1), CANNAdaptiveAvgPool2d(1)),
}


def _input(dtype, layout, shape=(2, 3, 5, 6)):
    x = ((torch.rand(shape, generator=torch.Generator().manual_seed(1)) - 0.3) * 300)
    x = x.to(dtype)
    return x.contiguous(memory_format=torch.channels_last) if layout == 'channels_last' else x


def _check(expected_call, our_call):
    try:
        expected, error = expected_call(), None
    except Exception as exc:  # noqa: BLE001 - the contract is PyTorch's outcome
        expected, error = None, exc
    if error is not None:
        with pytest.raises(type(error)) as info:
            our_call()
        if isinstance(error, NotImplementedError):
            assert isinstance(info.value, (UnsupportedDtypeError, NotImplementedError))
            assert 'not implemented' in str(info.value)
        return
    got = our_call()
    expected = expected if isinstance(expected, tuple) else (expected,)
    got = got if isinstance(got, tuple) else (got,)
    for a, b in zip(expected, got):
        assert a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride()
        assert torch.equal(a, b) or torch.equal(a.isnan(), b.isnan()) and torch.equal(
            a.nan_to_num(), b.nan_to_num())


def _documented_deviation(dtype, kw) -> bool:
    """PyTorch has no CPU fp16/bf16 antialias kernel; ours computes it in float32
    (docs/semantics.md)."""
    return kw.get('antialias') and dtype in (torch.float16, torch.bfloat16)


@pytest.mark.parametrize('layout', LAYOUTS)
@pytest.mark.parametrize('dtype', DTYPES, ids=str)
@pytest.mark.parametrize('kw', UPSAMPLES, ids=lambda kw: '-'.join(f'{k}={v}' for k, v in kw.items()))
def test_upsample_dtypes_as_pytorch(kw, dtype, layout):
    if _documented_deviation(dtype, kw):
        pytest.skip('documented: computed in float32 where PyTorch has no CPU kernel')
    x = _input(dtype, layout)
    _check(lambda: F.interpolate(x, **kw), lambda: ops.upsample(x, **kw))
    _check(lambda: F.interpolate(x, **kw), lambda: CANNUpsample(**kw)(x))


@pytest.mark.parametrize('layout', LAYOUTS)
@pytest.mark.parametrize('dtype', DTYPES, ids=str)
@pytest.mark.parametrize('name', list(POOLS))
def test_pooling_dtypes_as_pytorch(name, dtype, layout):
    torch_call, our_call, torch_module, our_module = POOLS[name]
    x = _input(dtype, layout)
    _check(lambda: torch_call(x), lambda: our_call(x))
    _check(lambda: torch_module(x), lambda: our_module(x))


@pytest.mark.parametrize('dtype', [torch.int8, torch.int16, torch.int32, torch.int64,
                                   torch.bool], ids=str)
def test_unsupported_dtype_error_names_dtype_and_accepted(dtype):
    """int16 nearest upsampling, integer adaptive pooling: the error is PyTorch's type
    (NotImplementedError, a RuntimeError) and a TypeError naming the input dtype and the
    accepted dtypes."""
    x = _input(dtype, 'contiguous')
    for call in (lambda: ops.upsample(x, size=4), lambda: ops.adaptive_avg_pool2d(x, 2),
                 lambda: ops.upsample(x, size=4, mode='bilinear')):
        with pytest.raises(UnsupportedDtypeError) as info:
            call()
        assert isinstance(info.value, NotImplementedError)
        assert isinstance(info.value, RuntimeError) and isinstance(info.value, TypeError)
        message = str(info.value)
        assert str(dtype) in message and 'accepted dtypes' in message and 'float32' in message


UINT8_SETTINGS = [dict(mode='bilinear'), dict(mode='bilinear', align_corners=True),
                  dict(mode='bicubic'), dict(mode='bicubic', align_corners=True),
                  dict(mode='bilinear', antialias=True), dict(mode='bicubic', antialias=True)]


@pytest.mark.parametrize('setting', UINT8_SETTINGS, ids=setting_id)
@pytest.mark.parametrize('layout', ['contiguous', 'channels_last', 'strided'])
def test_uint8_interpolation_is_pytorchs_bit_for_bit(setting, layout):
    """uint8 bilinear/bicubic, with and without antialias, returns uint8 exactly as
    PyTorch on the CPU: every awkward shape, size and scale calls, output width 1."""
    shapes = AWKWARD_SHAPES + [((9, 7), (4, 1)), ((9, 7), (1, 3))]
    for (h, w), (oh, ow) in shapes:
        if layout == 'strided':  # a view of every other column
            x = (make_input((2, 3, h, 2 * w)) * 127 + 128).to(torch.uint8)[..., ::2]
        else:
            x = (make_input((2, 3, h, w), memory_format=layout) * 127 + 128).to(torch.uint8)
        for kw in (dict(size=(oh, ow)), dict(scale_factor=(oh / h, ow / w))):
            expected = F.interpolate(x, **kw, **setting)
            assert expected.dtype == torch.uint8
            for got in (ops.upsample(x, **kw, **setting), CANNUpsample(**kw, **setting)(x)):
                assert got.dtype == torch.uint8 and got.stride() == expected.stride()
                assert torch.equal(got, expected), ((h, w), kw, setting)


@pytest.mark.parametrize('backend', ['reference', 'portable', 'npu', 'tuned', 'fast',
                                     'triton'])
def test_uint8_interpolation_falls_back_to_native_on_every_backend(backend, tmp_path,
                                                                    monkeypatch):
    """No other backend reproduces PyTorch's uint8 fixed-point arithmetic: each runs the
    native op and says so (a recorded fallback); the result is PyTorch's."""
    monkeypatch.setenv('MMSEG_CANN_TUNING_CACHE', str(tmp_path / 'tuning.json'))
    x = (make_input((1, 3, 7, 5)) * 127 + 128).to(torch.uint8)
    for setting in UINT8_SETTINGS:
        reset_fallbacks()
        got = ops.upsample(x, size=(4, 11), backend=backend, **setting)
        assert torch.equal(got, F.interpolate(x, size=(4, 11), **setting))
        assert any(op == 'upsample' and 'uint8' in reason
                   for op, reason in fallback_counts()), fallback_counts()
    for backend in ('native', 'auto', 'fused'):  # PyTorch's op already: no fallback
        reset_fallbacks()
        ops.upsample(x, size=(4, 11), mode='bilinear', backend=backend)
        assert not fallback_counts()


def test_int64_average_pooling_truncates_as_pytorch():
    """PyTorch's int64 average: integer sums, C++ division (towards zero), on every
    backend (SAME padding included, where the divisor counts input cells)."""
    x = torch.randint(-50, 50, (2, 3, 7, 6), generator=torch.Generator().manual_seed(3))
    for backend in ('auto', 'reference', 'portable', 'npu'):
        for kw in (dict(kernel_size=3, stride=2, padding=1, count_include_pad=False),
                   dict(kernel_size=2, divisor_override=-3), dict(kernel_size=3, ceil_mode=True)):
            assert torch.equal(ops.avg_pool2d(x, backend=backend, **kw), F.avg_pool2d(x, **kw))
    same = ops.avg_pool2d(x, 3, 2, 'same', count_include_pad=False)
    exact = ops.avg_pool2d(x.double(), 3, 2, 'same', count_include_pad=False)
    assert same.dtype == torch.int64 and torch.equal(same, exact.trunc().long())
    assert torch.equal(ops.avg_pool2d(x, 3, 2, 'same', count_include_pad=False,
                                      backend='reference'), same)


def test_integer_max_pooling_exact_beyond_float64():
    """The reference compares integers as integers: int64 values above 2**53 keep their
    maximum and index exactly."""
    big = 2 ** 62
    x = torch.tensor([[[[big, big + 1], [big - 1, big + 3]]]])
    expected = F.max_pool2d(x, 2, return_indices=True)
    for backend in ('reference', 'portable', 'auto'):
        got = ops.max_pool2d(x, 2, return_indices=backend != 'portable', backend=backend)
        got = got if isinstance(got, tuple) else (got, expected[1])
        assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
