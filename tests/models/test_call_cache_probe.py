"""The call caches tried the way users break them: in-place edits of list settings,
``_``-prefixed settings behind properties, settings replaced on the class, arguments
that compare equal but differ in type, shared instances, copies, repeated application,
and context (autocast, precision policy, backend, dtype, layout) changing between calls.

Every expectation is the uncached full path or PyTorch's own module/function."""
import copy
import itertools
import pickle
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mmseg_cann import (CANNAdaptiveAvgPool2d, CANNAvgPool2d, CANNMaxPool2d, CANNUpsample, ops,
                        precision_policy, set_precision_policy)
from mmseg_cann.ops import direct
from mmseg_cann.utils import fallback_counts, reset_fallbacks
from tests._helpers import make_input


def _outcome(call):
    """The result of ``call()``, or the type of the exception it raised."""
    try:
        return call()
    except Exception as error:  # noqa: BLE001 - the outcome is compared, whatever it is
        return type(error)


def _same(a, b) -> bool:
    if isinstance(a, type) or isinstance(b, type):
        return a is b
    if isinstance(a, tuple):
        return isinstance(b, tuple) and len(a) == len(b) and all(map(_same, a, b))
    return (a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride()
            and torch.equal(a, b))


def _uncached(call):
    with direct.direct_calls_disabled():
        return _outcome(call)


# ----------------------------------------------------------------------------------
# in-place edits, `_`-prefixed settings, class attributes
# ----------------------------------------------------------------------------------
def test_in_place_edit_of_a_list_size_is_seen():
    x = make_input((1, 2, 4, 4))
    ours, theirs = CANNUpsample(size=[8, 9]), nn.Upsample(size=[8, 9])
    assert _same(ours(x), theirs(x))
    ours.size[0] = 20
    theirs.size[0] = 20
    out = ours(x)
    assert out.shape == (1, 2, 20, 9) and _same(out, theirs(x))


@pytest.mark.parametrize('attribute, value', [('kernel_size', 3), ('stride', 1),
                                              ('padding', 1), ('dilation', 2)])
def test_in_place_edit_of_pooling_lists_is_seen(attribute, value):
    x = make_input((1, 2, 9, 9))
    ours = CANNMaxPool2d([2, 2], [2, 2], [0, 0], [1, 1])
    theirs = nn.MaxPool2d([2, 2], [2, 2], [0, 0], [1, 1])
    assert _same(ours(x), theirs(x))
    getattr(ours, attribute)[0] = value
    getattr(theirs, attribute)[0] = value
    assert _same(ours(x), theirs(x))
    avg_ours, avg_theirs = CANNAvgPool2d([2, 2], precision='input'), nn.AvgPool2d([2, 2])
    assert _same(avg_ours(x), avg_theirs(x))
    avg_ours.kernel_size[1] = 3
    avg_theirs.kernel_size[1] = 3
    assert _same(avg_ours(x), avg_theirs(x))


def test_in_place_edit_of_adaptive_output_size_is_seen():
    x = make_input((1, 2, 9, 9))
    ours = CANNAdaptiveAvgPool2d([2, None], precision='input')
    theirs = nn.AdaptiveAvgPool2d([2, None])
    assert _same(ours(x), theirs(x))
    ours.output_size[1] = 4
    theirs.output_size[1] = 4
    assert _same(ours(x), theirs(x))


class _ScaledUpsample(CANNUpsample):
    """A subclass whose ``size`` is a property over ``_``-prefixed settings and a class
    attribute."""

    BASE = 4

    def __init__(self, factor):
        super().__init__(size=(8, 8))
        self._factor = factor

    @property
    def size(self):
        return (self.BASE * self._factor, self.BASE * self._factor + 1)

    @size.setter
    def size(self, value):  # nn.Upsample.__init__ assigns it
        pass


def test_underscore_settings_and_class_attributes_are_seen():
    x = make_input((1, 2, 4, 4))
    m = _ScaledUpsample(2)
    assert m(x).shape == (1, 2, 8, 9)
    m._factor = 3
    assert _same(m(x), F.interpolate(x, size=(12, 13)))
    _ScaledUpsample.BASE = 5
    try:
        assert _same(m(x), F.interpolate(x, size=(15, 16)))
    finally:
        _ScaledUpsample.BASE = 4


def test_settings_replaced_on_the_class_are_seen():
    class Pool(CANNMaxPool2d):
        pass

    x = make_input((1, 2, 8, 8))
    m = Pool(2)
    first = m(x)
    assert _same(first, F.max_pool2d(x, 2))
    del m.kernel_size  # the class attribute shows through
    Pool.kernel_size = 4
    assert _same(m(x), F.max_pool2d(x, 4, 2))
    Pool.forward = lambda self, input: CANNMaxPool2d.forward(self, input) + 1
    assert _same(m(x), F.max_pool2d(x, 4, 2) + 1)


def test_a_call_leaves_the_module_unchanged():
    """Nothing is cached on the module: copies, pickles and replicas carry only settings."""
    x = make_input((1, 2, 8, 8))
    for build in (lambda: CANNUpsample(scale_factor=2, mode='bilinear'),
                  lambda: CANNMaxPool2d(3, 2, 1), lambda: CANNAvgPool2d(2),
                  lambda: CANNAdaptiveAvgPool2d(3)):
        used, fresh = build(), build()
        used(x), used(x)
        assert pickle.dumps(used) == pickle.dumps(fresh)
        assert vars(used).keys() == vars(fresh).keys()


# ----------------------------------------------------------------------------------
# functional cache: value AND type
# ----------------------------------------------------------------------------------
X = make_input((1, 2, 6, 6))
INTS = [2, 2.0, True, np.int64(2), np.int32(2), np.float64(2.0), np.bool_(True),
        torch.tensor(2), (2, 2), (2.0, 2), (2, 2.0), [2, 2], (True, 2), (np.int64(2), 2),
        torch.Size([2, 2]), 1, 1.0, (1, 1), (1.0, 1.0), [1.0, 1],
        # values marshal writes as their raw bytes: the bytes of np.int64(2) (the cache's
        # common key is the arguments' marshal bytes)
        np.uint64(2), np.int64(2).view(np.float64), np.int64(2).tobytes(),
        bytearray(np.int64(2).tobytes()), np.array(2), (np.int64(2).tobytes(), 2)]
PADS = [0, 0.0, -0.0, False, np.int64(0), np.float64(0.0), (0, 0), (0.0, 0), [0, 0],
        (False, 0), 1, 1.0, True, (1, 1), (1.0, 1), np.int64(0).tobytes(), [[0, 0]]]
FLAGS = [False, 0, None, np.bool_(False), 0.0, True, 1, np.bool_(True), 1.0, 'yes', (0,)]
SCALES = [2, 2.0, True, np.float64(2.0), np.int64(2), np.float32(2.0), (2, 2), (2.0, 2.0),
          [2.0, 2.0], (2, 2.0), torch.tensor(2.0), 1.5, (1.5, 1.5)]
SIZES = [(1, 1), (1.0, 1.0), [1, 1], (1, 1.0), 1, 1.0, True, np.int64(1), torch.Size([1, 1]),
         (True, True), (np.int64(3), 3), (3, 3), (3.0, 3)]
DIVISORS = [None, 2, 2.0, True, np.int64(2), 0, False, 0.0]
PRECISIONS = [None, 'input', 'fp32', torch.float32, 'bf16', torch.bfloat16, 1]
BACKENDS = ['auto', 'native', 'reference', 1]

#: (op name, call taking one argument value, values that compare equal across types)
SWEEPS = [
    ('max_pool2d kernel_size', lambda v: ops.max_pool2d(X, v), INTS),
    ('max_pool2d stride', lambda v: ops.max_pool2d(X, 2, v), INTS),
    ('max_pool2d padding', lambda v: ops.max_pool2d(X, 3, 2, v), PADS),
    ('max_pool2d dilation', lambda v: ops.max_pool2d(X, 2, 1, 0, v), INTS),
    ('max_pool2d ceil_mode', lambda v: ops.max_pool2d(X, 4, 3, 0, 1, v), FLAGS),
    ('max_pool2d return_indices', lambda v: ops.max_pool2d(X, 2, return_indices=v), FLAGS),
    ('max_pool2d precision', lambda v: ops.max_pool2d(X, 2, precision=v), PRECISIONS),
    ('avg_pool2d kernel_size', lambda v: ops.avg_pool2d(X, v), INTS),
    ('avg_pool2d padding', lambda v: ops.avg_pool2d(X, 3, 2, v), PADS),
    ('avg_pool2d count_include_pad', lambda v: ops.avg_pool2d(X, 3, 2, 1, False, v), FLAGS),
    ('avg_pool2d divisor_override', lambda v: ops.avg_pool2d(X, 2, divisor_override=v),
     DIVISORS),
    ('avg_pool2d backend', lambda v: ops.avg_pool2d(X, 2, backend=v), BACKENDS),
    ('adaptive_avg_pool2d output_size', lambda v: ops.adaptive_avg_pool2d(X, v), INTS),
    ('upsample size', lambda v: ops.upsample(X, size=v), SIZES),
    ('upsample scale_factor', lambda v: ops.upsample(X, scale_factor=v, mode='bilinear'),
     SCALES),
    ('upsample align_corners', lambda v: ops.upsample(X, scale_factor=2, mode='bilinear',
                                                      align_corners=v), FLAGS),
    ('upsample recompute_scale_factor',
     lambda v: ops.upsample(X, scale_factor=1.5, recompute_scale_factor=v), FLAGS),
]


@pytest.mark.parametrize('name, call, values', SWEEPS, ids=[s[0] for s in SWEEPS])
def test_acceptance_never_depends_on_call_history(name, call, values):
    """Every ordered pair of type-confusable values: the second call's outcome (result or
    exception type) after the first is the uncached outcome, as in a fresh process."""
    expected = [_uncached(lambda: call(v)) for v in values]
    for (i, first), (j, second) in itertools.permutations(enumerate(values), 2):
        direct._CALLS.clear()
        _outcome(lambda: call(first))
        got = _outcome(lambda: call(second))
        assert _same(got, expected[j]), (name, first, second, got, expected[j])


def test_max_pool2d_float_kernel_raises_after_int_kernel():
    x = make_input((1, 1, 4, 4))
    with pytest.raises(TypeError):
        F.max_pool2d(x, 2.0)  # PyTorch's verdict
    assert ops.max_pool2d(x, 2).shape == (1, 1, 2, 2)
    with pytest.raises(TypeError):
        ops.max_pool2d(x, 2.0)


def test_float_size_raises_after_int_size():
    x = make_input((1, 1, 4, 4))
    with pytest.raises(TypeError):
        F.interpolate(x, size=(1.0, 1.0))
    assert ops.upsample(x, size=(1, 1)).shape == (1, 1, 1, 1)
    with pytest.raises(TypeError):
        ops.upsample(x, size=(1.0, 1.0))


def test_cached_call_holds_its_own_list_copy():
    x = make_input((1, 1, 8, 8))
    kernel = [2, 2]
    ops.max_pool2d(x, kernel)
    kernel[0] = 4  # the caller reuses its list
    assert _same(ops.max_pool2d(x, [2, 2]), F.max_pool2d(x, [2, 2]))
    assert _same(ops.max_pool2d(x, kernel), F.max_pool2d(x, [4, 2]))


def test_common_calls_are_cached():
    """The cache is used for what the models call (not silently bypassed)."""
    x = make_input((1, 2, 8, 8))
    calls = [lambda: ops.upsample(x, size=x.shape[-2:], mode='bilinear', align_corners=False),
             lambda: ops.upsample(x, scale_factor=2, mode='nearest'),
             lambda: ops.max_pool2d(x, 3, 2, 1), lambda: ops.avg_pool2d(x, (3, 3), 2, 1),
             lambda: ops.adaptive_avg_pool2d(x, (2, 3)),
             lambda: CANNMaxPool2d(3, 2, 'same')(x)]
    for call in calls:
        direct._CALLS.clear()
        first = call()
        (entry,) = direct._CALLS.values()
        assert entry[1] is not None
        assert _same(call(), first)


def _python_calls(call):
    """The Python functions ``call()`` runs, as ``(file, name)``."""
    seen = []

    def profile(frame, event, arg):
        if event == 'call':
            seen.append((frame.f_code.co_filename, frame.f_code.co_name))
    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return seen


@pytest.mark.parametrize('build', [lambda: CANNMaxPool2d(3, 2, 1),
                                   lambda: CANNMaxPool2d(3, 2, 1, return_indices=True),
                                   lambda: CANNAvgPool2d(3, 2, 1),
                                   lambda: CANNAdaptiveAvgPool2d(2),
                                   lambda: CANNUpsample(scale_factor=2, mode='bilinear')])
def test_a_cached_call_runs_few_python_functions(build):
    """The per-call overhead, counted instead of timed: a cached module call with scalar
    settings runs its forward, the cache lookup and the policy lookup of this package,
    then the ATen function (pooling) or ``F.interpolate`` (upsampling) with no wrapper of
    its own. (Sequence settings add the keying of :func:`direct.call_key`.)"""
    m, x = build(), make_input((1, 8, 4, 4))
    expected = m(x)
    calls = _python_calls(lambda: m(x))
    ours = [name for path, name in calls if 'mmseg_cann' in path]
    assert ours == ['forward', 'run_cached', 'eager_precision_policy'], calls
    functional = [name for path, name in calls if path.endswith('nn/functional.py')]
    assert functional == (['interpolate'] if isinstance(m, CANNUpsample) else [])
    assert _same(m(x), expected)


# ----------------------------------------------------------------------------------
# shared instances, copies, repeated application
# ----------------------------------------------------------------------------------
def test_shared_instance_and_repeated_application():
    shared, theirs = CANNMaxPool2d(2, ceil_mode=True), nn.MaxPool2d(2, ceil_mode=True)
    ours_model = nn.Sequential(shared, nn.Identity(), shared, shared)
    theirs_model = nn.Sequential(theirs, nn.Identity(), theirs, theirs)
    for shape in ((1, 2, 17, 13), (2, 1, 8, 8), (1, 2, 17, 13)):
        x = make_input(shape)
        assert _same(ours_model(x), theirs_model(x))
    up, nn_up = CANNUpsample(scale_factor=1.5, mode='bicubic'), nn.Upsample(scale_factor=1.5,
                                                                          mode='bicubic')
    x = make_input((1, 2, 5, 7))
    assert _same(up(up(up(x))), nn_up(nn_up(nn_up(x))))


def test_copies_give_identical_results():
    x = make_input((1, 2, 9, 9))
    for m in (CANNUpsample(size=[5, 6], mode='bilinear'), CANNMaxPool2d([3, 3], 2, 1),
              CANNAvgPool2d(3, 2, 'same', count_include_pad=False)):
        out = m(x)
        for clone in (copy.deepcopy(m), pickle.loads(pickle.dumps(m))):
            assert _same(clone(x), out) and _same(clone(x), m(x))


# ----------------------------------------------------------------------------------
# context changing between calls
# ----------------------------------------------------------------------------------
def test_autocast_toggled_between_calls():
    x = make_input((1, 2, 8, 8))
    pairs = [(CANNUpsample(scale_factor=2, mode='bilinear'),
              nn.Upsample(scale_factor=2, mode='bilinear')),
             (CANNMaxPool2d(2), nn.MaxPool2d(2)),
             (CANNAdaptiveAvgPool2d(3, precision='input'), nn.AdaptiveAvgPool2d(3))]
    for ours, theirs in pairs:
        for enabled in (False, True, False, True):
            with torch.autocast('cpu', dtype=torch.bfloat16, enabled=enabled):
                assert _same(ours(x), theirs(x))


def test_policy_changed_between_calls():
    x = make_input((1, 2, 8, 8))
    m = CANNAvgPool2d(2)
    plain = F.avg_pool2d(x, 2)
    in_bf16 = F.avg_pool2d(x.bfloat16(), 2).float()
    assert not torch.equal(plain, in_bf16)
    assert _same(m(x), plain)
    with precision_policy(pool_precision=dict(avg='bf16')):
        assert _same(m(x), in_bf16)
    assert _same(m(x), plain)
    set_precision_policy(pool_precision=dict(avg='bf16'))
    assert _same(m(x), in_bf16)
    m.precision = 'fp32'  # the module's setting wins over the policy
    assert _same(m(x), plain)
    set_precision_policy(reset=True)
    m.precision = 'bf16'
    assert _same(m(x), in_bf16)


def test_backend_changed_between_calls():
    x = make_input((1, 2, 7, 9))
    m = CANNUpsample(size=(11, 5), mode='bicubic', align_corners=True)
    native = m(x)
    m.backend = 'reference'
    with direct.direct_calls_disabled():
        expected = ops.upsample(x, size=(11, 5), mode='bicubic', align_corners=True,
                                backend='reference')
    assert _same(m(x), expected) and not torch.equal(expected, native)
    m.backend = 'auto'
    assert _same(m(x), native)


def test_dtype_and_layout_changed_between_calls():
    pairs = [(CANNUpsample(scale_factor=2, mode='bilinear'),
              nn.Upsample(scale_factor=2, mode='bilinear')),
             (CANNMaxPool2d(3, 2, 1, return_indices=True),
              nn.MaxPool2d(3, 2, 1, return_indices=True)),
             (CANNAvgPool2d(3, 2, 1, precision='input'), nn.AvgPool2d(3, 2, 1)),
             (CANNAdaptiveAvgPool2d(3, precision='input'), nn.AdaptiveAvgPool2d(3))]
    inputs = [make_input((1, 3, 8, 8), dtype, layout)
              for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float32)
              for layout in ('contiguous', 'channels_last', 'strided', 'contiguous')]
    for ours, theirs in pairs:
        for x in inputs:
            assert _same(ours(x), theirs(x)), (ours, x.dtype, x.stride())
            meta = _flat(ours(x.to('meta')))  # another device between two calls
            assert [(t.shape, t.dtype, t.device, t.stride()) for t in meta] == \
                [(t.shape, t.dtype, t.device, t.stride()) for t in _flat(theirs(x.to('meta')))]


def _flat(out):
    return out if isinstance(out, tuple) else (out,)


def test_a_fallback_is_counted_on_every_call():
    x = make_input((1, 2, 3, 4, 5))
    m = CANNUpsample(scale_factor=2)
    reset_fallbacks()
    for _ in range(3):
        assert _same(m(x), nn.Upsample(scale_factor=2)(x))
    assert sum(n for (op, _), n in fallback_counts().items() if op == 'upsample') == 3
    # a fallback inside the backend (no fp16 antialias kernel on CPU) too
    half = make_input((1, 2, 8, 8), torch.float16)
    reset_fallbacks()
    for _ in range(3):
        ops.upsample(half, size=(3, 3), mode='bilinear', antialias=True)
    assert sum(n for (op, _), n in fallback_counts().items() if op == 'upsample') == 3


# ----------------------------------------------------------------------------------
# inputs the ops do not cover: the replaced module's own call
# ----------------------------------------------------------------------------------
@pytest.mark.parametrize('settings', [dict(scale_factor=2), dict(size=7),
                                      dict(scale_factor=1.5, mode='nearest-exact'),
                                      dict(size=3, mode='area'),
                                      dict(scale_factor=(2, 3), mode='bilinear')],
                         ids=lambda s: '-'.join(map(str, s.values())))
@pytest.mark.parametrize('shape', [(2, 3, 5), (1, 2, 3, 4, 5)], ids=['3d', '5d'])
def test_other_ranks_behave_as_nn_upsample(settings, shape):
    from mmseg_cann import convert_model
    x = make_input((1,) + shape)[0] if len(shape) == 3 else make_input(shape)
    converted = convert_model(nn.Sequential(nn.Upsample(**settings)), resize=False)
    assert isinstance(converted[0], CANNUpsample)
    expected = _outcome(lambda: nn.Upsample(**settings)(x))
    for module in (CANNUpsample(**settings), converted):
        reset_fallbacks()
        got = _outcome(lambda: module(x))
        assert _same(got, expected)
        if not isinstance(expected, type):
            assert sum(n for (op, _), n in fallback_counts().items() if op == 'upsample') == 1


PAIRS = [(lambda: CANNMaxPool2d(2), lambda: nn.MaxPool2d(2)),
         (lambda: CANNMaxPool2d(2, return_indices=True),
          lambda: nn.MaxPool2d(2, return_indices=True)),
         (lambda: CANNAvgPool2d(2, precision='input'), lambda: nn.AvgPool2d(2)),
         (lambda: CANNAdaptiveAvgPool2d(2, precision='input'), lambda: nn.AdaptiveAvgPool2d(2)),
         (lambda: CANNUpsample(scale_factor=2), lambda: nn.Upsample(scale_factor=2)),
         (lambda: CANNUpsample(scale_factor=2, mode='bilinear'),
          lambda: nn.Upsample(scale_factor=2, mode='bilinear'))]
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.uint8,
          torch.int8, torch.int16, torch.int32, torch.int64, torch.bool, torch.complex64]


@pytest.mark.parametrize('ours, theirs', PAIRS)
def test_modules_accept_what_torch_modules_accept(ours, theirs):
    """Every rank and dtype: the module runs exactly when torch's runs, with its values."""
    for shape in ((4, 4), (2, 4, 4), (1, 2, 4, 4), (1, 2, 4, 4, 4)):
        for dtype in DTYPES:
            x = (torch.rand(shape, generator=torch.Generator().manual_seed(0)) * 10).to(dtype)
            expected = _outcome(lambda: theirs()(x))
            got = _outcome(lambda: ours()(x))
            if isinstance(expected, type):
                assert isinstance(got, type), (shape, dtype)
            else:
                assert _same(got, expected), (shape, dtype)


# ----------------------------------------------------------------------------------
# the cached call is the full path's call, for every geometry
# ----------------------------------------------------------------------------------
def _check_cached_equals_full(call):
    expected = _uncached(call)
    direct._CALLS.clear()
    first, second = _outcome(call), _outcome(call)  # the second one is the cached call
    assert _same(first, expected) and _same(second, expected)


@pytest.mark.parametrize('layout', ['contiguous', 'channels_last'])
def test_cached_pooling_equals_full_path_on_small_geometries(layout):
    for h, k, s, p, d, ceil in itertools.product(range(1, 7), (1, 2, 3), (1, 2, 3), (0, 1),
                                                 (1, 2), (False, True)):
        x = make_input((1, 2, h, 5), memory_format=layout)
        _check_cached_equals_full(lambda: ops.max_pool2d(x, k, s, p, d, ceil, True))
        if d == 1:
            _check_cached_equals_full(lambda: ops.avg_pool2d(x, k, s, p, ceil, p == 0))
    for padding in ('same', 'same_lower', 'valid'):
        x = make_input((1, 2, 7, 6), memory_format=layout)
        _check_cached_equals_full(lambda: ops.max_pool2d(x, 3, 2, padding, 2, False, True))
        _check_cached_equals_full(lambda: ops.avg_pool2d(x, 4, 3, padding, False, False))


@pytest.mark.parametrize('layout', ['contiguous', 'channels_last'])
def test_cached_upsample_equals_full_path(layout):
    settings = [dict(mode='nearest'), dict(mode='nearest-exact'), dict(mode='area'),
                dict(mode='bilinear'), dict(mode='bilinear', align_corners=True),
                dict(mode='bicubic'), dict(mode='bilinear', antialias=True),
                dict(mode='bicubic', antialias=True)]
    for (h, w), (oh, ow) in [((1, 1), (2, 2)), ((3, 5), (4, 7)), ((9, 11), (4, 1)),
                             ((5, 7), (5, 7))]:
        for dtype in (torch.float32, torch.float16, torch.uint8):
            x = make_input((1, 3, h, w), memory_format=layout)
            x = (x * 100 + 100).to(dtype) if dtype == torch.uint8 else x.to(dtype)
            for setting in settings:
                _check_cached_equals_full(lambda: ops.upsample(x, size=(oh, ow), **setting))
                _check_cached_equals_full(
                    lambda: ops.upsample(x, scale_factor=1.7, **setting))
    x = make_input((1, 2, 7, 9), memory_format=layout)
    for output_size in (1, (2, 3), (None, 4), (7, 9), (8, 10)):
        _check_cached_equals_full(lambda: ops.adaptive_avg_pool2d(x, output_size))
