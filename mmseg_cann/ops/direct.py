"""Direct calls: the plain PyTorch call an op reduces to for one input geometry.

For a given input shape, dtype and device, in the current precision policy, most calls
of the CANN ops on CPU/CUDA end in one call of the native backend with a fixed spec (no
cast, no fallback). The ops cache that call (:func:`run_cached`) so a repeated call
skips validation, backend and precision resolution and the spec; the modules of
:mod:`mmseg_cann.models` go through the ops, with the settings they read at each call.

The rules, which make a cached call return exactly what the full path returns and never
change whether a call is accepted:

* the first call of a key runs the op's full path (its own checks, its own result);
  a direct call is stored only after it returned, and only if it recorded no fallback
  (such calls keep taking the full path, so each is counted). A call the op rejects
  stores nothing and raises every time;
* the key is the arguments by value *and* exact type, through tuples, lists and
  ``torch.Size`` (``2``, ``2.0``, ``True`` and ``numpy.int64(2)`` are four keys;
  ``[3, 3]`` and ``(3, 3)`` two), the input's shape, dtype and device kind, and the
  precision policy in force. Arguments of any other type (tensors, arrays, user
  objects) are not cached. A cached call holds its own copy of list arguments;
* nothing is cached or used while :func:`direct_state` says something else could change
  the result: autocast, ``torch.compile``/``torch.export``/ONNX tracing, tuning, inputs
  that are not plain CPU/CUDA tensors (tensor subclasses, FX proxies).
"""
from __future__ import annotations

import os
import threading
from contextlib import contextmanager
from typing import Callable, Optional

import numpy as np
import torch
import torch.nn.functional as F
from torch.overrides import handle_torch_function, has_torch_function_unary

from .. import backends
from ..backends import auto, native, tuned
from ..core import geometry as geo
from ..core.precision import get_precision_policy, resolve_compute_dtype
from ..utils.fallbacks import fallback_total

DirectCall = Callable[[torch.Tensor], torch.Tensor]


def direct_state(input):
    """A token of the state a cached direct call depends on, or None when none may be used
    now (not a plain CPU/CUDA tensor, autocast on, a compile/export trace,
    ``MMSEG_CANN_TUNE``).

    Called on every cached call, so each test is the cheapest form of the rule it stands
    for: ``type(input) is torch.Tensor`` turns away non-tensors, tensor subclasses and FX
    proxies; ``torch.compiler.is_compiling()`` comes before anything dynamo would have to
    trace; ``torch.compiler.is_exporting()`` covers mmseg_cann's own export,
    ``torch.export`` and the dynamo ONNX exporter; TorchScript tracing covers
    ``torch.jit.trace`` and the TorchScript ONNX exporter (which traces); the tuning
    switch is read only when the variable exists.
    """
    if type(input) is not torch.Tensor or _disabled or _is_compiling() \
            or not (input.is_cpu or input.is_cuda) or _any_autocast() or _is_exporting() \
            or _is_tracing():
        return None
    if _env_has(tuned.ENV_TUNE) and tuned.tuning_enabled():
        return None
    return get_precision_policy()


_disabled = 0
_disabled_lock = threading.Lock()


@contextmanager
def direct_calls_disabled():
    """Every call takes the full path inside this block (e.g. the op profiler, which
    records each call at the backend). Process-wide: other threads' calls take the full
    path meanwhile too."""
    global _disabled
    with _disabled_lock:
        _disabled += 1
    try:
        yield
    finally:
        with _disabled_lock:
            _disabled -= 1


_has_torch_function = has_torch_function_unary
_is_compiling = torch.compiler.is_compiling
_is_exporting = torch.compiler.is_exporting
_is_tracing = getattr(torch._C, '_is_tracing', None) or torch.jit.is_tracing
# autocast on any device (the private call is 1/2 of the public per-device one; the
# public one is the fallback where it is missing)
_any_autocast = getattr(torch._C, '_is_any_autocast_enabled', None) or (
    lambda: torch.is_autocast_enabled('cpu') or torch.is_autocast_enabled('cuda'))


def _env_has(name: str) -> bool:
    """``name in os.environ`` without encoding the key on every call (a dict lookup in
    os.environ's own table, which ``os.environ`` writes through)."""
    data = getattr(os.environ, '_data', None)
    if data is None:
        return name in os.environ
    key = _ENCODED.get(name)
    if key is None:
        key = _ENCODED[name] = os.environ.encodekey(name)
    return key in data


_ENCODED: dict = {}

# ----------------------------------------------------------------------------------
# keys: value and exact type
# ----------------------------------------------------------------------------------
#: immutable argument types whose equal values behave alike in every op (within one type)
_ATOMS = frozenset([int, float, bool, str, type(None), torch.dtype] +
                   [np.dtype(code).type for code in '?bhilqpBHILQPefdg'])
#: sequences keyed item by item (a cached call gets its own copy of a list)
_CONTAINERS = frozenset([tuple, list, torch.Size])


class _Unkeyable(Exception):
    """An argument whose value cannot be keyed safely (mutable, or compared by identity)."""


def _freeze(items: tuple, types: tuple) -> tuple:
    """``items`` with every sequence replaced by its (items, item types), recursively."""
    frozen = []
    for value, kind in zip(items, types):
        if kind in _ATOMS:
            frozen.append(value)
            continue
        if kind not in _CONTAINERS:
            raise _Unkeyable
        inner = tuple(value)
        inner_types = tuple(map(type, inner))
        if not _ATOMS.issuperset(inner_types):
            inner = _freeze(inner, inner_types)
        frozen.append((inner, inner_types))
    return tuple(frozen)


def _thaw(items: tuple, types: tuple) -> tuple:
    """The inverse of :func:`_freeze`: new sequences of the original types."""
    return tuple([v if t in _ATOMS else t(_thaw(*v)) for v, t in zip(items, types)])


def call_key(args: tuple):
    """A hashable key of ``args`` by value and exact type, recursively through tuples,
    lists and ``torch.Size``; None when an argument cannot be keyed safely.

    Two argument tuples get the same key only if every item (and every item of a nested
    sequence) has the same type and an equal value.
    """
    types = tuple(map(type, args))
    if _ATOMS.issuperset(types):
        return args, types  # the common case: scalars only
    try:
        return _freeze(args, types), types
    except _Unkeyable:
        return None


def _own_args(key, args: tuple) -> tuple:
    """``args`` rebuilt from their key: a cached call must not hold the caller's lists,
    which the caller may edit later."""
    return args if key[0] is args else _thaw(*key)


#: direct calls of the functional ops, by (builder, argument key, shape, dtype, on CUDA)
_CALLS: dict = {}
MAX_CALLS = 1024


def run_cached(builder, args: tuple, input):
    """What each op does first: the result of the op of ``builder`` for
    ``(input, *args)`` (``args`` end with ``precision, backend``) through its
    ``__torch_function__`` dispatch or its cached direct call; None when neither applies
    (the caller runs its full path).

    * An input with ``__torch_function__`` handling (an FX proxy, a tensor subclass, an
      active torch function mode) is dispatched as ``torch.nn.functional`` dispatches:
      ``torch.fx.symbolic_trace`` records the op as one ``call_function`` node.
    * The first call of a key runs the op itself and returns its result (or raises its
      error); ``builder`` then derives the direct call, stored for the later calls.
    """
    # (not while exporting: torch.export's non-strict tracing is such a mode, and the op's
    # own path keeps the sizes symbolic where a dispatch would trace it again)
    if _has_torch_function(input) and not _is_exporting():
        return handle_torch_function(_OPS[builder], (input,), input, *args[:-2],
                                     precision=args[-2], backend=args[-1])
    state = direct_state(input)
    if state is None:
        return None
    arg_key = call_key(args)
    if arg_key is None:
        return None
    key = (builder, arg_key, input.shape, input.dtype, input.is_cuda)
    entry = _CALLS.get(key)
    if entry is not None and entry[0] is state:
        call = entry[1]
        return None if call is None else call(input)
    recorded = fallback_total()
    with direct_calls_disabled():
        result = _OPS[builder](input, *args[:-2], precision=args[-2], backend=args[-1])
    call = None
    if fallback_total() == recorded:
        try:
            call = builder(input, *_own_args(arg_key, args))
        except Exception:  # noqa: BLE001 - no direct call: every call takes the full path
            call = None
    if len(_CALLS) >= MAX_CALLS:
        _CALLS.clear()
    _CALLS[key] = (state, call)
    return result


#: the public op of each builder (registered by :mod:`mmseg_cann.ops`, which imports both)
_OPS: dict = {}


def register_op(builder, op) -> None:
    """Make ``op`` the op whose direct calls ``builder`` derives."""
    _OPS[builder] = op


def _runs_native(input, backend: str, op: str, family: str, precision) -> bool:
    """Whether the op's full path runs the native backend on ``input`` without a cast."""
    impl = backends.get_backend(backend, op)
    if impl is auto:
        impl = auto.select(input)
    return impl is native and resolve_compute_dtype(family, precision, input.dtype) is None


def _collapse(pair):
    """An int for an equal pair: PyTorch parses one int faster than a pair, same meaning."""
    return pair[0] if pair[0] == pair[1] else pair


# The builders run after the op accepted the same arguments for an input of the same
# shape and dtype (so they do not validate), and return what the op's full path calls:
# the native backend with the spec the op computed, written as the one
# ``torch.nn.functional`` call the native backend makes for that spec where it makes one
# (tests/models/test_call_cache_probe.py compares every form with the full path). None
# where the op does something else (another backend, a cast).
def max_pool2d(input, kernel_size, stride, padding, dilation, ceil_mode, return_indices,
               precision, backend) -> Optional[DirectCall]:
    if not _runs_native(input, backend, 'max_pool2d', 'max', precision):
        return None
    args = geo.check_pool_args(kernel_size, stride, padding, dilation, ceil_mode,
                               check_padding_limit=False)
    spec = geo.pool_spec(input.shape[-2:], args)
    flag = geo.truth_flag(return_indices)
    if not spec.torch_padding_ok:
        return lambda x: native.max_pool2d(x, spec, flag)
    k, s, p, d = map(_collapse, (args.kernel, args.stride, spec.pad_begin, args.dilation))
    ceil = args.ceil_mode
    return lambda x: F.max_pool2d(x, k, s, p, d, ceil, flag)


def avg_pool2d(input, kernel_size, stride, padding, ceil_mode, count_include_pad,
               divisor_override, precision, backend) -> Optional[DirectCall]:
    if not _runs_native(input, backend, 'avg_pool2d', 'avg', precision):
        return None
    args = geo.check_pool_args(kernel_size, stride, padding, 1, ceil_mode,
                               check_padding_limit=False)
    spec = geo.pool_spec(input.shape[-2:], args)
    if not spec.torch_padding_ok:
        return lambda x: native.avg_pool2d(x, spec, count_include_pad, divisor_override)
    k, s, p = map(_collapse, (args.kernel, args.stride, spec.pad_begin))
    ceil = args.ceil_mode
    return lambda x: F.avg_pool2d(x, k, s, p, ceil, count_include_pad, divisor_override)


def adaptive_avg_pool2d(input, output_size, precision, backend) -> Optional[DirectCall]:
    if not _runs_native(input, backend, 'adaptive_avg_pool2d', 'avg', precision):
        return None
    out_hw = _collapse(geo.adaptive_output_size(input.shape[-2:], output_size))
    return lambda x: F.adaptive_avg_pool2d(x, out_hw)


def upsample(input, size, scale_factor, mode, align_corners, recompute_scale_factor,
             antialias, precision, backend) -> Optional[DirectCall]:
    if not _runs_native(input, backend, 'upsample', 'upsample', precision):
        return None
    args = geo.check_upsample_args(size, scale_factor, mode, align_corners,
                                   recompute_scale_factor, antialias)
    spec = geo.upsample_spec(input.shape[-2:], args)
    if args.antialias:  # the native backend works around CPU antialias kernel defects
        return lambda x: native.upsample(x, spec)
    call = (args.size, args.scale_factor, args.mode, args.align_corners,
            args.recompute_scale_factor)
    return lambda x: F.interpolate(x, *call)
