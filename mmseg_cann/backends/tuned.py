"""Tuned backend: per (op, arguments, shape, dtype, layout, device) pick the fastest
semantically equivalent call form once, remember it on disk, reuse it.

Opt in with ``backend='tuned'`` or by setting the environment variable
``MMSEG_CANN_TUNE=1`` (then ``'auto'`` tunes too). The first call of a kind times every
candidate (:func:`.npu_plan.upsample_candidates` / :func:`.npu_plan.pool_candidates`:
size call vs scale call, NCHW vs channels_last, mean vs adaptive kernel), starting with
the plan the planner picks for the device (the native call off Ascend). A candidate
whose result is not bit-identical to that first plan's (values, indices, dtype), or that
raises (a call form the device's kernels reject), is rejected, so tuning never changes
results. On an NPU there are no layout candidates (torch_npu keeps no channels_last
tensors). The winner is stored in the
:class:`~mmseg_cann.backends.tuning_cache.TuningCache` and later calls (in this and later
processes with the same device and library versions) run it without timing.
"""
from __future__ import annotations

import os
import statistics
import threading
import time
from typing import Callable, Dict, Optional, Sequence, Tuple

import torch

from ..core import geometry as geo
from .tuning_cache import TuningCache, section_key
from . import npu
from .npu_device import device_caps, synchronize
from .npu_plan import Plan, memory_format_of, pool_candidates, upsample_candidates

ENV_TUNE = 'MMSEG_CANN_TUNE'
#: timed repetitions per candidate (after one warm-up run)
TIMED_RUNS = 3

_cache_lock = threading.Lock()
_cache: Optional[TuningCache] = None
_memory: Dict[Tuple[str, str, str], Plan] = {}


def tuning_enabled() -> bool:
    """Whether ``MMSEG_CANN_TUNE`` asks ``'auto'`` to tune (``1``, ``true``, ``yes``, ``on``)."""
    return os.environ.get(ENV_TUNE, '').strip().lower() in ('1', 'true', 'yes', 'on')


def get_cache() -> TuningCache:
    """The process's cache object (reloaded when the cache path changes)."""
    global _cache
    from .tuning_cache import default_cache_path
    with _cache_lock:
        if _cache is None or _cache.path != default_cache_path():
            _cache = TuningCache()
            _memory.clear()
        return _cache


def reset_tuning_state() -> None:
    """Forget the in-process cache object and memo (the file stays)."""
    global _cache
    with _cache_lock:
        _cache = None
        _memory.clear()


def _sync(device: torch.device) -> None:
    """Wait for ``device`` (its own queue: the device is passed on)."""
    synchronize(device)


def _same(a, b) -> bool:
    if isinstance(a, tuple):
        return isinstance(b, tuple) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return (a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride()
            and torch.equal(a, b))


def _time(run: Callable[[], object], device: torch.device) -> Tuple[float, object]:
    with torch.no_grad(), npu.fallbacks_muted():
        out = run()
        times = []
        for _ in range(TIMED_RUNS):
            _sync(device)
            start = time.perf_counter()
            run()
            _sync(device)
            times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times), out


def _time_candidates(candidates: Sequence[Plan], run: Callable[[Plan], object],
                     device: torch.device) -> Tuple[Dict[str, float], Dict[str, str]]:
    """Time every candidate; returns (times in ms, rejected name -> reason).

    The first candidate that runs is the reference; a later one is rejected when its
    result differs from the reference's, and any candidate is rejected when it raises.
    Raises the first error when no candidate runs at all.
    """
    times: Dict[str, float] = {}
    rejected: Dict[str, str] = {}
    reference, first_error = None, None
    for candidate in candidates:
        try:
            elapsed, out = _time(lambda: run(candidate), device)
        except Exception as exc:  # a call form the device's kernels reject
            first_error = first_error or exc
            rejected[candidate.name] = f'raised {type(exc).__name__}: {exc}'.splitlines()[0]
            continue
        if reference is None:
            reference = out
        elif not _same(out, reference):
            rejected[candidate.name] = 'result differs from the planned call'
            continue
        times[candidate.name] = round(elapsed, 4)
    if not times:
        raise first_error
    return times, rejected


def choose(op: str, key: str, x: torch.Tensor, candidates: Sequence[Plan],
           run: Callable[[Plan], object]) -> Plan:
    """The cached best plan for ``key``, timing ``candidates`` on ``x`` on a miss.

    ``candidates[0]`` is the reference: others must reproduce its result bit for bit.
    Candidates that raise are rejected (and recorded with the error).
    """
    caps = device_caps(x.device)
    cache = get_cache()
    section = section_key(caps.name)
    memo_key = (cache.path, section, key)
    plan = _memory.get(memo_key)
    if plan is not None:
        return plan
    by_name = {p.name: p for p in candidates}
    entry = cache.get(section, key)
    if entry is not None and entry.get('plan') in by_name:
        plan = by_name[entry['plan']]
    else:
        times, rejected = _time_candidates(candidates, run, x.device)
        best = min(times, key=times.get)
        plan = by_name[best]
        cache.put(section, key, {'op': op, 'plan': best, 'times_ms': times,
                                 'rejected': sorted(rejected), 'rejected_why': rejected})
    _memory[memo_key] = plan
    return plan


def _key(op: str, x: torch.Tensor, *parts) -> str:
    return '|'.join([op, 'x'.join(map(str, x.shape)), str(x.dtype).replace('torch.', ''),
                     memory_format_of(x)] + [repr(p) for p in parts])


def _planned_first(plan: Plan, forms: Sequence[Plan]) -> Tuple[Plan, ...]:
    return (plan,) + tuple(p for p in forms if p.name != plan.name)


def _pool_forms(planned: Plan, op: str, input: torch.Tensor, out_size=None) -> Tuple[Plan, ...]:
    """The pooling candidates besides the planned call (none for a CPU fallback or 3-D)."""
    if planned.on_cpu or input.dim() != 4:
        return ()
    return pool_candidates(op, memory_format_of(input), out_size, device_caps(input.device))


def upsample(input: torch.Tensor, spec: geo.UpsampleSpec) -> torch.Tensor:
    """Run the fastest equivalent upsample call form (tuned once per key)."""
    planned = npu.plan_for('upsample', input, spec)
    candidates = _planned_first(planned, () if planned.on_cpu else upsample_candidates(
        spec, tuple(input.shape), input.dtype, memory_format_of(input),
        device_caps(input.device)))
    plan = choose('upsample', _key('upsample', input, spec), input, candidates,
                  lambda p: npu.execute_upsample(p, input, spec))
    return npu.execute_upsample(plan, input, spec)


def max_pool2d(input: torch.Tensor, spec: geo.PoolSpec, return_indices: bool = False):
    """Run the fastest equivalent max-pool call form (tuned once per key)."""
    planned = npu.plan_for('max_pool2d', input, spec, return_indices=return_indices)
    candidates = _planned_first(planned, _pool_forms(planned, 'max_pool2d', input))
    plan = choose('max_pool2d', _key('max_pool2d', input, spec, return_indices), input,
                  candidates, lambda p: npu.execute_max_pool2d(p, input, spec, return_indices))
    return npu.execute_max_pool2d(plan, input, spec, return_indices)


def avg_pool2d(input: torch.Tensor, spec: geo.PoolSpec, count_include_pad: bool = True,
               divisor_override: Optional[int] = None) -> torch.Tensor:
    """Run the fastest equivalent average-pool call form (tuned once per key)."""
    planned = npu.plan_for('avg_pool2d', input, spec, count_include_pad=count_include_pad,
                           divisor_override=divisor_override)
    candidates = _planned_first(planned, _pool_forms(planned, 'avg_pool2d', input))
    plan = choose('avg_pool2d', _key('avg_pool2d', input, spec, count_include_pad,
                                     divisor_override), input, candidates,
                  lambda p: npu.execute_avg_pool2d(p, input, spec, count_include_pad,
                                                   divisor_override))
    return npu.execute_avg_pool2d(plan, input, spec, count_include_pad, divisor_override)


def adaptive_avg_pool2d(input: torch.Tensor, output_size) -> torch.Tensor:
    """Run the fastest equivalent adaptive-average-pool call form (tuned once per key)."""
    out_hw = tuple(output_size)
    planned = npu.plan_for('adaptive_avg_pool2d', input, out_size=out_hw)
    candidates = _planned_first(planned, _pool_forms(planned, 'adaptive_avg_pool2d', input,
                                                     out_hw))
    plan = choose('adaptive_avg_pool2d', _key('adaptive_avg_pool2d', input, out_hw), input,
                  candidates, lambda p: npu.execute_adaptive_avg_pool2d(p, input, out_hw))
    return npu.execute_adaptive_avg_pool2d(plan, input, out_hw)
