"""Direct calls: the plain PyTorch call an op reduces to for one input geometry.

For a given input shape, dtype and device, in the current precision policy, most calls
of the CANN ops on CPU/CUDA end in exactly one ``torch.nn.functional`` call with fixed
arguments (the native backend, no cast). The builders here validate the arguments as
the op does, decide whether that is the case, and return the call, or None. The modules
cache these per input geometry (:mod:`mmseg_cann.models`) so a repeated call costs
little more than the ``torch.nn`` module it replaces; the cache is used only while
:func:`direct_state` says nothing else could change the result (no autocast, no
tracing or export, no tuning, the same precision policy).
"""
from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from ..backends import tuned
from ..core import geometry as geo
from ..core.precision import get_precision_policy, resolve_compute_dtype
from ..core.validation import INTEGER_DTYPES, check_divisor_override, check_input

DirectCall = Callable[[torch.Tensor], torch.Tensor]
_DEVICES = ('cpu', 'cuda')


def direct_state(input: torch.Tensor):
    """A token of the state a cached direct call depends on, or None when none may be used
    now (autocast on, a compile/export trace, ``MMSEG_CANN_TUNE``).

    Called on every module call, so each test is the cheapest form of the rule it
    stands for: ``torch.compiler.is_exporting()`` covers mmseg_cann's own export and
    ``torch.export``; the TorchScript ONNX exporter is asked only once ``torch.onnx`` is
    loaded; the tuning switch is read only when the variable exists.
    """
    if _disabled or not (input.is_cpu or input.is_cuda) or _any_autocast() \
            or _is_compiling() or _is_exporting():
        return None
    onnx = sys.modules.get('torch.onnx')
    if onnx is not None and onnx.is_in_onnx_export():
        return None
    if _env_has(tuned.ENV_TUNE) and tuned.tuning_enabled():
        return None
    return get_precision_policy()


_disabled = 0


@contextmanager
def direct_calls_disabled():
    """Every call takes the full path inside this block (e.g. the op profiler, which
    records each call at the backend)."""
    global _disabled
    _disabled += 1
    try:
        yield
    finally:
        _disabled -= 1


_is_compiling = torch.compiler.is_compiling
_is_exporting = torch.compiler.is_exporting
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


#: direct calls of the functional ops, by (builder, arguments, shape, dtype)
_CALLS: dict = {}
MAX_CALLS = 1024


def run_cached(builder, args: tuple, input):
    """The result of the cached direct call of ``builder(input, *args)``, or None when
    there is none (the caller then runs the full op, which also raises for bad input).

    Arguments that cannot be hashed (lists) simply take the full path.
    """
    try:
        key = (builder, args, input.shape, input.dtype)
        state = direct_state(input)
        entry = _CALLS.get(key)
    except (AttributeError, TypeError):  # not a tensor, or unhashable arguments
        return None
    if state is None:
        return None
    if entry is None or entry[0] is not state:
        try:
            entry = (state, builder(input, *args))
        except (TypeError, ValueError):  # the full op raises it
            return None
        if len(_CALLS) >= MAX_CALLS:
            _CALLS.clear()
        _CALLS[key] = entry
    call = entry[1]
    return None if call is None else call(input)


def _native_here(input: torch.Tensor, backend: str, family: str, precision) -> bool:
    return (backend in ('auto', 'native') and input.device.type in _DEVICES
            and resolve_compute_dtype(family, precision, input.dtype) is None)


# Each builder validates exactly as its op does (a failed check returns no direct call,
# so the op itself raises), then decides.
def max_pool2d(input, kernel_size, stride, padding, dilation, ceil_mode, return_indices,
               precision, backend) -> Optional[DirectCall]:
    check_input(input, 'max_pool2d', ranks=(3, 4), integer_dtypes=INTEGER_DTYPES)
    if not isinstance(return_indices, bool) or not _native_here(input, backend, 'max',
                                                                precision):
        return None
    args = geo.check_pool_args(kernel_size, stride, padding, dilation, ceil_mode)
    spec = geo.pool_spec(input.shape[-2:], args)
    if not spec.torch_padding_ok:
        return None
    # the arguments as given (an int costs PyTorch less than a pair); strings resolved
    p = spec.pad_begin if isinstance(padding, str) else padding
    return lambda x: F.max_pool2d(x, kernel_size, stride, p, dilation, ceil_mode,
                                  return_indices)


def avg_pool2d(input, kernel_size, stride, padding, ceil_mode, count_include_pad,
               divisor_override, precision, backend) -> Optional[DirectCall]:
    check_input(input, 'avg_pool2d', ranks=(3, 4))
    check_divisor_override(divisor_override)
    if not isinstance(count_include_pad, bool) or not _native_here(input, backend, 'avg',
                                                                   precision):
        return None
    args = geo.check_pool_args(kernel_size, stride, padding, 1, ceil_mode)
    spec = geo.pool_spec(input.shape[-2:], args)
    if not spec.torch_padding_ok:
        return None
    p = spec.pad_begin if isinstance(padding, str) else padding
    return lambda x: F.avg_pool2d(x, kernel_size, stride, p, ceil_mode, count_include_pad,
                                  divisor_override)


def adaptive_avg_pool2d(input, output_size, precision, backend) -> Optional[DirectCall]:
    check_input(input, 'adaptive_avg_pool2d', ranks=(3, 4))
    if not _native_here(input, backend, 'avg', precision):
        return None
    geo.adaptive_output_size(input.shape[-2:], output_size)  # the op's checks
    return lambda x: F.adaptive_avg_pool2d(x, output_size)


def upsample(input, size, scale_factor, mode, align_corners, recompute_scale_factor,
             antialias, precision, backend) -> Optional[DirectCall]:
    check_input(input, 'upsample', ranks=(4,), integer_dtypes=(torch.uint8,))
    if antialias or not _native_here(input, backend, 'upsample', precision):
        return None  # antialias: the native backend works around CPU kernel defects
    args = geo.check_upsample_args(size, scale_factor, mode, align_corners,
                                   recompute_scale_factor, antialias)
    geo.upsample_spec(input.shape[-2:], args)  # the size checks of the op
    if input.dtype == torch.uint8 and args.mode not in geo.NEAREST_MODES:
        return None  # the op raises: leave it to the full path
    kw = dict(size=args.size, scale_factor=args.scale_factor, mode=args.mode,
              align_corners=args.align_corners,
              recompute_scale_factor=args.recompute_scale_factor)
    return lambda x: F.interpolate(x, **kw)
