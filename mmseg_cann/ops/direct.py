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
  ``[3, 3]`` and ``(3, 3)`` two; the common form is the arguments' ``marshal`` bytes,
  see :data:`_CALLS`), the input's shape, dtype and device kind, and the
  precision policy in force. Arguments of any other type (tensors, arrays, user
  objects) are not cached. A cached call holds its own copy of list arguments;
* nothing is cached or used while something else could change the result (the rules
  in :func:`run_cached`): autocast, ``torch.compile``/``torch.export``/ONNX tracing,
  tuning, inputs that are not plain CPU/CUDA tensors (tensor subclasses, FX proxies).
"""
from __future__ import annotations

import marshal
import os
import threading
from contextlib import contextmanager
from typing import Callable, Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch.overrides import handle_torch_function, has_torch_function_unary

from .. import backends
from ..backends import auto, native, tuned
from ..core import geometry as geo
from ..core.precision import eager_precision_policy, resolve_compute_dtype
from ..utils.fallbacks import fallback_total

#: ``(function, arguments)``: the call ``function(input, *arguments)``
DirectCall = Tuple[Callable[..., torch.Tensor], tuple]


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


def _tune_key():
    """The tuning switch's name and the table to look it up in: ``os.environ``'s own
    table with the name encoded once (``key in os.environ._data`` is ``name in
    os.environ`` without encoding the name on every call; ``os.environ`` writes through
    to that table, which it keeps for the life of the process), or ``os.environ``
    itself where it has no such table."""
    encode = getattr(os.environ, 'encodekey', None)
    table = getattr(os.environ, '_data', None)
    if encode is None or table is None:
        return tuned.ENV_TUNE, os.environ
    return encode(tuned.ENV_TUNE), table


_TUNE_KEY, _ENVIRON = _tune_key()

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
    sequence) has the same type and an equal value. (:func:`run_cached` makes the
    scalars-only key itself, without calling this.)
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


#: argument type tuples seen to hold scalars only (:data:`_ATOMS`): a repeated call's
#: check is one set lookup, not a scan of the types
_SCALAR_SIGNATURES: set = set()


def _scalar_signature(types: tuple) -> bool:
    """Whether ``types`` are all :data:`_ATOMS` (remembered when they are)."""
    if not _ATOMS.issuperset(types):
        return False
    _SCALAR_SIGNATURES.add(types)
    return True


# The common key: the arguments written by ``marshal`` (one C call). ``marshal.dumps``
# writes an exact int, float, bool, str, None, tuple or list under a code of its own type
# and with its whole value (a float's eight bytes), and its format is a prefix code: equal
# bytes parse into the same codes and values. What it writes of other types (a numpy
# scalar or any object with the buffer protocol as raw bytes, or complex, bytes, sets...)
# uses codes those seven never use. So a key is *stored* in this form only when every
# argument, through tuples and lists, has one of the seven exact types; a later call whose
# bytes are equal has then the same types and values, and nothing is checked per call.
# Other arguments (numpy scalars, dtypes, ``torch.Size``, objects marshal refuses) are
# keyed by :func:`call_key`.
_dumps, _loads = marshal.dumps, marshal.loads
_MARSHAL_VERSION = 2  # floats as their eight bytes; from 3 on, bytes depend on refcounts
_MARSHAL_EXACT = frozenset([int, float, bool, str, type(None), tuple, list])


def _marshal_exact(args) -> bool:
    """Whether every item of ``args``, through tuples and lists, has one of
    :data:`_MARSHAL_EXACT`'s exact types (only after ``marshal.dumps(args)`` succeeded:
    no cycles)."""
    for item in args:
        kind = type(item)
        if kind not in _MARSHAL_EXACT:
            return False
        if (kind is tuple or kind is list) and not _marshal_exact(item):
            return False
    return True


#: direct calls of the functional ops, by (builder, the arguments' marshal bytes, shape,
#: dtype, on CUDA) or, for other arguments, (builder, their :func:`call_key`, shape, dtype,
#: on CUDA): five items against six, the two forms never compare equal. Each entry is
#: (precision policy, direct call or None).
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
    * No cached call is used or stored while something else could change the result:
      ``type(input) is torch.Tensor`` turns away non-tensors, tensor subclasses and FX
      proxies; ``torch.compiler.is_compiling()`` comes before anything dynamo would have
      to trace; then inputs that are not on a CPU or CUDA device, autocast on any device,
      ``torch.compiler.is_exporting()`` (mmseg_cann's own export, ``torch.export``, the
      dynamo ONNX exporter), TorchScript tracing (``torch.jit.trace`` and the TorchScript
      ONNX exporter), ``MMSEG_CANN_TUNE`` (read only when the variable exists). An
      entry is used only under the precision policy it was made under.
    * The first call of a key runs the op itself and returns its result (or raises its
      error); ``builder`` then derives the direct call, stored for the later calls.

    Every cached call passes through here, so each step is the cheapest form of its rule
    (C functions, no Python helper of this package but the policy's), and a direct call
    is stored as ``(function, arguments)`` and made as ``function(input, *arguments)``:
    nothing of its own between the op and the ATen function (a C function for the common
    geometries). tests/models/test_call_cache_probe.py counts the Python functions a
    cached call runs.
    """
    # (not while exporting: torch.export's non-strict tracing is such a mode, and the op's
    # own path keeps the sizes symbolic where a dispatch would trace it again)
    if _has_torch_function(input) and not _is_exporting():
        return handle_torch_function(_OPS[builder], (input,), input, *args[:-2],
                                     precision=args[-2], backend=args[-1])
    if type(input) is not torch.Tensor or _disabled or _is_compiling():
        return None
    cuda = input.is_cuda
    if not (cuda or input.is_cpu) or _any_autocast() or _is_exporting() or _is_tracing():
        return None
    if _TUNE_KEY in _ENVIRON and tuned.tuning_enabled():
        return None
    try:
        blob = _dumps(args, _MARSHAL_VERSION)
    except ValueError:  # an argument marshal refuses (a dtype, a user object, a cycle)
        blob = None
    if blob is not None:
        key = (builder, blob, input.shape, input.dtype, cuda)
        entry = _CALLS.get(key)
        if entry is not None and entry[0] is eager_precision_policy():
            call = entry[1]
            return None if call is None else call[0](input, *call[1])
        owned = _loads(blob) if _marshal_exact(args) else None  # the cached call's own copy
    if blob is None or owned is None:
        types = (*map(type, args),)
        if types in _SCALAR_SIGNATURES or _scalar_signature(types):  # call_key's common case
            key = (builder, args, types, input.shape, input.dtype, cuda)
        else:
            arg_key = call_key(args)
            if arg_key is None:
                return None
            key = (builder, arg_key[0], types, input.shape, input.dtype, cuda)
        entry = _CALLS.get(key)
        if entry is not None and entry[0] is eager_precision_policy():
            call = entry[1]
            return None if call is None else call[0](input, *call[1])
        owned = _own_args(key[1:3], args)
    state = eager_precision_policy()
    recorded = fallback_total()
    with direct_calls_disabled():
        result = _OPS[builder](input, *args[:-2], precision=args[-2], backend=args[-1])
    call = None
    if fallback_total() == recorded:
        try:
            call = builder(input, *owned)
        except Exception:  # noqa: BLE001 - no direct call: every call takes the full path
            call = None
    if len(_CALLS) >= MAX_CALLS:
        _CALLS.clear()
        _SCALAR_SIGNATURES.clear()
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
# the native backend with the spec the op computed, written as the ATen function that
# the one ``torch.nn.functional`` call the native backend makes for that spec ends in
# (its Python wrapper only dispatches and fills in defaults, which the op has done)
# where it makes one (tests/models/test_call_cache_probe.py compares every form with
# the full path). None where the op does something else (another backend, a cast).
_max_pool2d = torch.max_pool2d  # F.max_pool2d(return_indices=False)
_max_pool2d_with_indices = torch._C._nn.max_pool2d_with_indices  # return_indices=True
_avg_pool2d = F.avg_pool2d  # ATen's own function
_adaptive_avg_pool2d = torch._C._nn.adaptive_avg_pool2d  # F's, output size filled in


def max_pool2d(input, kernel_size, stride, padding, dilation, ceil_mode, return_indices,
               precision, backend) -> Optional[DirectCall]:
    if not _runs_native(input, backend, 'max_pool2d', 'max', precision):
        return None
    args = geo.check_pool_args(kernel_size, stride, padding, dilation, ceil_mode,
                               check_padding_limit=False)
    spec = geo.pool_spec(input.shape[-2:], args)
    flag = geo.truth_flag(return_indices)
    if not spec.torch_padding_ok:
        return native.max_pool2d, (spec, flag)
    call = _max_pool2d_with_indices if flag else _max_pool2d
    k, s, p, d = map(_collapse, (args.kernel, args.stride, spec.pad_begin, args.dilation))
    return call, (k, s, p, d, args.ceil_mode)


def avg_pool2d(input, kernel_size, stride, padding, ceil_mode, count_include_pad,
               divisor_override, precision, backend) -> Optional[DirectCall]:
    if not _runs_native(input, backend, 'avg_pool2d', 'avg', precision):
        return None
    args = geo.check_pool_args(kernel_size, stride, padding, 1, ceil_mode,
                               check_padding_limit=False)
    spec = geo.pool_spec(input.shape[-2:], args)
    if not spec.torch_padding_ok:
        return native.avg_pool2d, (spec, count_include_pad, divisor_override)
    k, s, p = map(_collapse, (args.kernel, args.stride, spec.pad_begin))
    return _avg_pool2d, (k, s, p, args.ceil_mode, count_include_pad, divisor_override)


def adaptive_avg_pool2d(input, output_size, precision, backend) -> Optional[DirectCall]:
    if not _runs_native(input, backend, 'adaptive_avg_pool2d', 'avg', precision):
        return None
    return _adaptive_avg_pool2d, (
        _collapse(geo.adaptive_output_size(input.shape[-2:], output_size)),)


def upsample(input, size, scale_factor, mode, align_corners, recompute_scale_factor,
             antialias, precision, backend) -> Optional[DirectCall]:
    if not _runs_native(input, backend, 'upsample', 'upsample', precision):
        return None
    args = geo.check_upsample_args(size, scale_factor, mode, align_corners,
                                   recompute_scale_factor, antialias)
    spec = geo.upsample_spec(input.shape[-2:], args)
    if args.antialias:  # the native backend works around CPU antialias kernel defects
        return native.upsample, (spec,)
    return F.interpolate, (args.size, args.scale_factor, args.mode, args.align_corners,
                           args.recompute_scale_factor)
