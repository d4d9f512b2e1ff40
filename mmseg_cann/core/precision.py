"""Precision policy: the dtype upsampling and pooling compute in.

Three op families have an entry each:

``max``
    max pooling. Exact in any floating dtype (it only compares), default ``'input'``.
``avg``
    average and adaptive average pooling. Summing many fp16/bf16 values loses bits,
    so the default is ``'fp32'``: compute in float32, return the input dtype.
``upsample``
    interpolation. Each output mixes at most 16 inputs, default ``'input'``.

An entry is ``'fp32'``, ``'fp16'``, ``'bf16'`` (or the matching ``torch`` dtype), or
``None``/``'input'`` (compute in the input dtype). The computation runs in the chosen
dtype and the result is returned in the dtype the replaced PyTorch op would return in
the same context (the input dtype, also under ``torch.autocast``); gradients flow back
through the same casts. Two inputs are never cast: integer inputs (max pooling of
label maps) and float64 inputs (references and ``gradcheck``), which always compute in
their own dtype.

Where a setting comes from, most specific first:

1. the ``precision=`` argument of an op or module (``'input'`` forces the input dtype);
2. the innermost active :func:`precision_policy` context (per thread / async task);
3. the process-wide policy of :func:`set_precision_policy` (defaults above).

Under ``torch.compile`` the policy is read while the graph is traced, and the graph is
guarded on it: a policy changed later (process-wide or by a context) recompiles on the
next call. Compiled code sees the contexts of its thread; the per-async-task separation
of contexts holds in eager code only (dynamo cannot read a ``ContextVar``).
"""
from __future__ import annotations

import contextvars
import threading
from contextlib import contextmanager
from dataclasses import dataclass, fields, replace
from typing import Callable, Dict, Mapping, Optional, Union

import torch

FAMILIES = ('max', 'avg', 'upsample')
_NAMES: Dict[str, Optional[torch.dtype]] = {
    'input': None,
    'fp32': torch.float32, 'float32': torch.float32,
    'fp16': torch.float16, 'float16': torch.float16, 'half': torch.float16,
    'bf16': torch.bfloat16, 'bfloat16': torch.bfloat16,
}
_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_SHORT = {torch.float32: 'fp32', torch.float16: 'fp16', torch.bfloat16: 'bf16', None: 'input'}

PrecisionLike = Union[None, str, torch.dtype]


def normalize_precision(value: PrecisionLike, name: str = 'precision') -> Optional[torch.dtype]:
    """Map a precision setting to a compute dtype (``None`` means the input dtype).

    Accepts ``None``, ``'input'``, ``'fp32'``, ``'fp16'``, ``'bf16'`` (and the long
    names ``'float32'``, ``'float16'``, ``'half'``, ``'bfloat16'``) or one of
    ``torch.float32``, ``torch.float16``, ``torch.bfloat16``.
    """
    if value is None:
        return None
    if isinstance(value, torch.dtype):
        if value not in _DTYPES:
            raise ValueError(f'{name} must be one of torch.float32, torch.float16, '
                             f'torch.bfloat16, got {value}')
        return value
    if isinstance(value, str):
        key = value.lower()
        if key not in _NAMES:
            raise ValueError(f"{name} must be None, 'input', 'fp32', 'fp16', 'bf16' or a "
                             f'torch dtype, got {value!r}')
        return _NAMES[key]
    raise TypeError(f"{name} must be None, 'input', 'fp32', 'fp16', 'bf16' or a torch "
                    f'dtype, got {value!r} ({type(value).__name__})')


def precision_name(dtype: Optional[torch.dtype]) -> str:
    """Short name of a compute dtype (``'fp32'``, ..., ``'input'``)."""
    return _SHORT[dtype]


@dataclass(frozen=True)
class PrecisionPolicy:
    """Compute dtype per op family (``None`` = the input dtype)."""

    max: Optional[torch.dtype] = None
    avg: Optional[torch.dtype] = torch.float32
    upsample: Optional[torch.dtype] = None

    def updated(self, pool_precision: Optional[Mapping[str, PrecisionLike]] = None,
                upsample_precision: PrecisionLike = None,
                *, set_upsample: bool = False) -> 'PrecisionPolicy':
        """A copy with the entries given in the config form replaced.

        ``pool_precision`` is a mapping with keys ``'max'`` and/or ``'avg'``;
        ``upsample_precision`` replaces the upsample entry when it is not None (or when
        ``set_upsample`` is true, so that ``None`` can reset it to ``'input'``).
        """
        changes = {}
        if pool_precision is not None:
            if not isinstance(pool_precision, Mapping):
                raise TypeError(f"pool_precision must be a dict like dict(max='fp16', "
                                f"avg='fp32'), got {pool_precision!r}")
            unknown = set(pool_precision) - {'max', 'avg'}
            if unknown:
                raise ValueError(f"pool_precision accepts the keys 'max' and 'avg', got "
                                 f'{sorted(unknown)}')
            for key, value in pool_precision.items():
                changes[key] = normalize_precision(value, f'pool_precision[{key!r}]')
        if upsample_precision is not None or set_upsample:
            changes['upsample'] = normalize_precision(upsample_precision, 'upsample_precision')
        return replace(self, **changes)

    def to_config(self) -> dict:
        """The config form: ``dict(pool_precision=dict(max=..., avg=...),
        upsample_precision=...)``."""
        return dict(pool_precision=dict(max=precision_name(self.max),
                                        avg=precision_name(self.avg)),
                    upsample_precision=precision_name(self.upsample))

    def __repr__(self) -> str:
        entries = ', '.join(f'{f.name}={precision_name(getattr(self, f.name))!r}'
                            for f in fields(self))
        return f'PrecisionPolicy({entries})'


DEFAULT_POLICY = PrecisionPolicy()
_global_lock = threading.Lock()
_global_policy = DEFAULT_POLICY
_context_policy: contextvars.ContextVar[Optional[PrecisionPolicy]] = contextvars.ContextVar(
    'mmseg_cann_precision_policy', default=None)
# the innermost context's policy per thread, kept beside the ContextVar: what compiled code
# reads (dynamo traces thread-local attributes and guards on them; not ContextVar.get)
_thread_policy = threading.local()
_is_compiling = torch.compiler.is_compiling


def get_precision_policy() -> PrecisionPolicy:
    """The policy in force here: the innermost context's, else the process-wide one."""
    if _is_compiling():
        policy = getattr(_thread_policy, 'policy', None)
        return policy if policy is not None else _global_policy
    return eager_precision_policy()


def eager_precision_policy() -> PrecisionPolicy:
    """:func:`get_precision_policy` in code that is not being compiled (a caller that has
    checked ``torch.compiler.is_compiling()`` already: the call caches of the ops)."""
    policy = _context_policy.get()
    return policy if policy is not None else _global_policy


def set_precision_policy(pool_precision: Optional[Mapping[str, PrecisionLike]] = None,
                         upsample_precision: PrecisionLike = None, *,
                         reset: bool = False) -> PrecisionPolicy:
    """Set the process-wide policy; returns the previous one.

    Only the entries given change; ``reset=True`` starts from the defaults
    (``max='input'``, ``avg='fp32'``, ``upsample='input'``).
    Example: ``set_precision_policy(pool_precision=dict(max='fp16', avg='fp32'))``.
    """
    global _global_policy
    with _global_lock:
        previous = _global_policy
        base = DEFAULT_POLICY if reset else previous
        _global_policy = base.updated(pool_precision, upsample_precision)
        return previous


def restore_precision_policy(policy: PrecisionPolicy) -> None:
    """Install ``policy`` as the process-wide policy (e.g. one returned earlier)."""
    global _global_policy
    if not isinstance(policy, PrecisionPolicy):
        raise TypeError(f'policy must be a PrecisionPolicy, got {type(policy).__name__}')
    with _global_lock:
        _global_policy = policy


@contextmanager
def precision_policy(pool_precision: Optional[Mapping[str, PrecisionLike]] = None,
                     upsample_precision: PrecisionLike = None):
    """Override entries of the policy inside a ``with`` block (nests; per thread/task).

    Example::

        with mmseg_cann.precision_policy(pool_precision=dict(max='fp16', avg='fp32')):
            logits = model(images)
    """
    policy = get_precision_policy().updated(pool_precision, upsample_precision)
    token = _context_policy.set(policy)
    outer = getattr(_thread_policy, 'policy', None)
    _thread_policy.policy = policy
    try:
        yield policy
    finally:
        _context_policy.reset(token)
        _thread_policy.policy = outer


def resolve_compute_dtype(family: str, precision: PrecisionLike,
                          input_dtype: torch.dtype) -> Optional[torch.dtype]:
    """The dtype an op of ``family`` computes in for this input, or None (no cast).

    ``precision`` is the op/module argument (None defers to the policy).
    """
    if family not in FAMILIES:
        raise ValueError(f'family must be one of {FAMILIES}, got {family!r}')
    explicit = normalize_precision(precision)
    if precision is not None:
        chosen = explicit
    else:
        chosen = getattr(get_precision_policy(), family)
    if chosen is None or not input_dtype.is_floating_point or input_dtype == torch.float64:
        return None
    return None if chosen == input_dtype else chosen


# ----------------------------------------------------------------------------------
# running an op under the policy
# ----------------------------------------------------------------------------------
_autocast_dtype_cache: Dict[tuple, torch.dtype] = {}


def autocast_output_dtype(key: str, probe: Callable[[torch.Tensor], torch.Tensor],
                          input: torch.Tensor) -> torch.dtype:
    """The dtype the native PyTorch op returns for ``input`` in the current context.

    Without autocast this is the input dtype. Under ``torch.autocast`` the answer depends
    on the op's autocast list for the device, so it is measured once on a tiny tensor
    (``probe`` runs the native op) and cached per (op, device, autocast dtype, dtype).
    """
    device_type = input.device.type
    if not input.dtype.is_floating_point or not _autocast_enabled(device_type):
        return input.dtype
    cache_key = (key, device_type, torch.get_autocast_dtype(device_type), input.dtype)
    dtype = _autocast_dtype_cache.get(cache_key)
    if dtype is None:
        tiny = torch.zeros((1, 1, 4, 4), dtype=input.dtype, device=input.device)
        with torch.no_grad():
            out = probe(tiny)
        dtype = (out[0] if isinstance(out, tuple) else out).dtype
        _autocast_dtype_cache[cache_key] = dtype
    return dtype


def autocast_lower_dtype(device_type: str) -> Optional[torch.dtype]:
    """The dtype ``torch.autocast`` runs its lower-precision ops (convolutions, matrix
    products) in on ``device_type``, or None where autocast is off there."""
    return torch.get_autocast_dtype(device_type) if _autocast_enabled(device_type) else None


def autocast_cast(tensor: Optional[torch.Tensor], dtype: torch.dtype):
    """``tensor`` as autocast hands it to a lower-precision op: floating tensors other
    than float64 cast to ``dtype`` (autocast's ``cached_cast`` rule), others unchanged."""
    if tensor is None or not tensor.is_floating_point() or tensor.dtype == torch.float64:
        return tensor
    return tensor.to(dtype)


def _autocast_enabled(device_type: str) -> bool:
    try:
        return torch.is_autocast_enabled(device_type)
    except (RuntimeError, TypeError):  # device types without autocast support
        return False


def run_with_precision(family: str, precision: PrecisionLike, input: torch.Tensor,
                       compute: Callable[[torch.Tensor], torch.Tensor], *, probe_key: str,
                       probe: Callable[[torch.Tensor], torch.Tensor]):
    """Run ``compute(input)`` in the policy's dtype and return the PyTorch output dtype.

    ``compute`` may return a tensor or a ``(values, indices)`` tuple; only values are cast.
    """
    compute_dtype = resolve_compute_dtype(family, precision, input.dtype)
    out_dtype = autocast_output_dtype(probe_key, probe, input)
    if compute_dtype is None and out_dtype == input.dtype:
        return compute(input)
    device_type = input.device.type
    if compute_dtype is None:
        compute_dtype = out_dtype
    if _autocast_enabled(device_type):
        with torch.autocast(device_type, enabled=False):
            result = compute(input.to(compute_dtype))
    else:
        result = compute(input.to(compute_dtype))
    if isinstance(result, tuple):
        return (result[0].to(out_dtype),) + tuple(result[1:])
    return result.to(out_dtype)
