"""Parity checking: every op against the float64 reference, on any device.

``tools/check_parity.py`` is the command-line front end; this module builds the case
list, runs each case on a device in a dtype, compares with the float64 reference
computed on CPU from the same (rounded) input and judges the error against documented
per-dtype tolerances.

Tolerances (absolute; inputs are drawn uniformly from [-1, 1], so one unit in the last
place at 1.0 ("ulp@1") is the natural error unit):

========  =========  ==========================================================
dtype     tolerance  why
========  =========  ==========================================================
float64   1e-12      reference and kernel differ only in summation order
float32   2e-6       PyTorch maps coordinates in float32 (about 1e-7 relative),
                     plus a rounding per tap (16 ulp@1)
float16   2e-3       one rounding of the result (<= 1 ulp@1 for |y| <= 2)
bfloat16  1.6e-2     one rounding of the result (<= 1 ulp@1 for |y| <= 2)
========  =========  ==========================================================

Bilinear and bicubic add a coordinate term: PyTorch computes source coordinates in
float32 (float64 for float64 input), so a coordinate carries an error of a few ulps of
its own magnitude, up to about ``eps * in_size``; that moves a result by at most the
coordinate error times the largest neighbour difference (2 for inputs in [-1, 1]).
The term is ``16 * eps * max(H_in, W_in)``, with ``eps`` of float32 (float64 for
float64 inputs).

Max pooling values and indices and nearest-neighbour values must match exactly.
For nearest modes the report also says which index rule the device follows:
``pytorch`` (float32 ``floorf(d * scale)``), ``exact`` (rational arithmetic), ``both``
(the rules agree for that shape) or ``neither`` (a failure). PyTorch itself follows
the float32 rule for float32/float16/bfloat16 input and double arithmetic for float64.

Average pooling is also run with ``precision='input'`` (non-quick mode): the default
policy averages fp16/bf16 in float32, which would hide a kernel that accumulates fp16 in
fp16.

On an NPU, ``plan_fn`` adds each case's plan, the kernel a max-pool call actually used (from
the indices the device returned) and, with a tracer (:class:`.npu_trace.NpuTracer`), the
kernels a profiler trace shows, checked against the plan's predictions.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable, Dict, Iterable, List, Optional, Tuple, Union

import torch

from ..backends.npu import observe_device_indices
from ..backends.npu_plan import Plan
from ..core import reference as ref
from ..ops.pooling import adaptive_avg_pool2d, avg_pool2d, max_pool2d
from ..ops.upsample import upsample
from .npu_calls import describe_observed, kernel_from_indices
from .npu_trace import NpuTracer, describe_kernels, trace_verdict

TOLERANCES: Dict[torch.dtype, float] = {
    torch.float64: 1e-12,
    torch.float32: 2e-6,
    torch.float16: 2e-3,
    torch.bfloat16: 1.6e-2,
}

#: (input H, W) -> (output H, W): the shapes that catch indexing bugs (docs/design.md 2.1)
AWKWARD_UPSAMPLE_SHAPES: List[Tuple[Tuple[int, int], Tuple[int, int]]] = [
    ((1, 1), (2, 2)), ((3, 5), (4, 7)), ((7, 7), (8, 8)), ((1, 6), (3, 13)),
    ((6, 1), (13, 3)), ((9, 11), (4, 5)), ((5, 7), (5, 7)), ((4, 3), (32, 24)),
    ((2, 3), (32, 48)), ((2, 2), (64, 64)), ((2, 2), (82, 82)), ((5, 9), (11, 17)),
]
#: typical segmentation shapes: decoder 2x steps, output head 8x, PSP-like downsampling
TYPICAL_UPSAMPLE_SHAPES = [((32, 64), (64, 128)), ((16, 32), (128, 256)), ((64, 128), (16, 32))]
SCALE_FACTORS = [1.5, 2.0, 2.3, 0.5, 8.0]
POOL_SHAPES = [(1, 1), (5, 5), (7, 9), (11, 6), (32, 64)]
POOL_CONFIGS = [
    # kernel, stride, padding, dilation, ceil_mode
    (3, 2, 1, 1, False), (3, 2, 1, 1, True), (5, 2, 2, 1, True), (2, 2, 0, 1, True),
    (3, 1, 1, 2, False), ((3, 2), (2, 1), (1, 0), 1, False),
    (3, 2, 'same', 1, False), (2, 2, 'same_lower', 1, False), (4, 3, 'same', 1, False),
    (3, 2, 'valid', 1, True),
]
ADAPTIVE_SIZES = [1, 2, 3, 6, (5, 7)]
#: average-pool configurations also run with precision='input' (non-quick mode)
INPUT_PRECISION_AVG_CONFIGS = [(3, 2, 1, 1, False), (5, 2, 2, 1, True), (2, 2, 'same', 1, False)]
INPUT_PRECISION_SHAPES = [(11, 6), (32, 64)]


@dataclasses.dataclass
class Case:
    """One parity case: an op call with fixed arguments on an input shape."""

    op: str
    variant: str
    in_shape: Tuple[int, ...]
    kwargs: dict  # the call's arguments, which the reference takes too
    exact: bool = False  # values (and indices) must match bit for bit
    op_kwargs: dict = dataclasses.field(default_factory=dict)  # op only (e.g. precision)

    @property
    def label(self) -> str:
        return f'{self.op}:{self.variant}'

    @property
    def call_kwargs(self) -> dict:
        """Every keyword argument of the op call (``kwargs`` and ``op_kwargs``)."""
        return dict(self.kwargs, **self.op_kwargs)


@dataclasses.dataclass
class Result:
    op: str
    variant: str
    shape: str
    dtype: str
    max_abs_err: float
    max_ulp_err: float
    tolerance: float
    passed: bool
    rule: str = ''
    note: str = ''
    plan: str = ''
    device_indices: str = ''  # what the device returned as max-pool indices (NPU)
    kernels: Optional[List[str]] = None  # kernels a profiler trace shows (None: untraced)
    trace: str = ''           # the trace checked against the plan: ok / MISMATCH / -


def _pool_cfg_label(k, s, p, d, cm) -> str:
    return f'k{k} s{s} p{p} d{d}' + (' ceil' if cm else '')


def build_cases(quick: bool = False) -> List[Case]:
    """The case list: every op, mode and ``align_corners`` over the shape sets."""
    cases: List[Case] = []
    up_shapes = AWKWARD_UPSAMPLE_SHAPES + ([] if quick else TYPICAL_UPSAMPLE_SHAPES)
    channels = 3
    for mode in ('nearest', 'nearest-exact', 'bilinear', 'bicubic', 'area'):
        settings = [dict()] if mode in ('nearest', 'nearest-exact', 'area') else [
            dict(align_corners=False), dict(align_corners=True),
            dict(align_corners=False, antialias=True)]
        for extra in settings:
            variant = mode + ''.join(f' {k}={v}' for k, v in extra.items())
            for (hi, wi), (ho, wo) in up_shapes:
                cases.append(Case('upsample', variant, (2, channels, hi, wi),
                                  dict(size=(ho, wo), mode=mode, **extra),
                                  exact=mode.startswith('nearest')))
            for scale in ([] if quick else SCALE_FACTORS):
                for rc in (None, True):
                    kw = dict(scale_factor=scale, mode=mode, recompute_scale_factor=rc, **extra)
                    cases.append(Case('upsample', f'{variant} scale={scale} recompute={rc}',
                                      (1, channels, 7, 5), kw, exact=mode.startswith('nearest')))
    for k, s, p, d, cm in POOL_CONFIGS:
        for hw in POOL_SHAPES:
            kw = dict(kernel_size=k, stride=s, padding=p, dilation=d, ceil_mode=cm)
            if not _pool_valid(hw, kw):
                continue
            cases.append(Case('max_pool2d', _pool_cfg_label(k, s, p, d, cm), (2, 3) + hw,
                              dict(kw, return_indices=True), exact=True))
            if d == 1:
                avg_kw = {key: v for key, v in kw.items() if key != 'dilation'}
                for cip in (True, False):
                    cases.append(Case('avg_pool2d', _pool_cfg_label(k, s, p, d, cm) +
                                      f' cip={cip}', (2, 3) + hw,
                                      dict(avg_kw, count_include_pad=cip)))
    for out in ADAPTIVE_SIZES:
        for hw in POOL_SHAPES[1:]:
            cases.append(Case('adaptive_avg_pool2d', f'out={out}', (2, 3) + hw,
                              dict(output_size=out)))
    if not quick:
        cases += _input_precision_avg_cases()
    return cases


def _input_precision_avg_cases() -> List[Case]:
    """Average pooling in the input dtype (``precision='input'``): the kernels' own
    fp16/bf16 accumulation, which the default float32 policy hides."""
    cases = []
    for k, s, p, d, cm in INPUT_PRECISION_AVG_CONFIGS:
        for hw in INPUT_PRECISION_SHAPES:
            kw = dict(kernel_size=k, stride=s, padding=p, ceil_mode=cm, count_include_pad=True)
            if _pool_valid(hw, dict(kw, dilation=d)):
                cases.append(Case('avg_pool2d', _pool_cfg_label(k, s, p, d, cm) +
                                  ' cip=True precision=input', (2, 3) + hw, kw,
                                  op_kwargs=dict(precision='input')))
    for out in (1, (5, 7)):
        cases.append(Case('adaptive_avg_pool2d', f'out={out} precision=input', (2, 3, 32, 64),
                          dict(output_size=out), op_kwargs=dict(precision='input')))
    return cases


def _pool_valid(hw, kw) -> bool:
    from ..core import geometry as geo
    try:
        geo.pool_spec(hw, geo.check_pool_args(kw['kernel_size'], kw['stride'], kw['padding'],
                                              kw['dilation'], kw['ceil_mode']))
    except ValueError:
        return False
    return True


OPS: Dict[str, Callable] = {
    'upsample': upsample, 'max_pool2d': max_pool2d, 'avg_pool2d': avg_pool2d,
    'adaptive_avg_pool2d': adaptive_avg_pool2d,
}
REFERENCES: Dict[str, Callable] = {
    'upsample': ref.upsample, 'max_pool2d': ref.max_pool2d, 'avg_pool2d': ref.avg_pool2d,
    'adaptive_avg_pool2d': ref.adaptive_avg_pool2d,
}


def tolerance(case: Case, dtype: torch.dtype) -> float:
    """The documented absolute tolerance of ``case`` in ``dtype`` (module docstring)."""
    if case.exact:
        return 0.0
    tol = TOLERANCES[dtype]
    if case.op == 'upsample' and case.kwargs['mode'] in ('bilinear', 'bicubic'):
        coord_eps = torch.finfo(torch.float64 if dtype == torch.float64 else torch.float32).eps
        tol += 16 * coord_eps * max(case.in_shape[-2:])
    return tol


def ulp_at_one(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).eps


def case_input(case: Case, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """The case's input: uniform in [-1, 1), drawn in float64 and rounded to ``dtype``."""
    gen = torch.Generator().manual_seed(seed)
    x64 = torch.rand(case.in_shape, generator=gen, dtype=torch.float64) * 2 - 1
    return x64.to(dtype)


def run_case(case: Case, device: torch.device, dtype: torch.dtype, seed: int = 0,
             op_kwargs: Optional[dict] = None, tracer: Optional[NpuTracer] = None) -> Result:
    """Run one case on ``device`` in ``dtype`` and judge it against the reference.

    With a ``tracer`` the op call runs under its profiler and the kernels it ran are
    kept in ``Result.kernels``; what the device returned as max-pool indices is kept in
    ``Result.device_indices``.
    """
    x = case_input(case, dtype, seed)
    expected = REFERENCES[case.op](x.double(), **case.kwargs)
    kwargs = dict(case.call_kwargs, **(op_kwargs or {}))
    kernels = None
    with observe_device_indices() as observed:
        if tracer is None:
            out = OPS[case.op](x.to(device), **kwargs)
        else:
            out, kernels = tracer.trace(lambda: OPS[case.op](x.to(device), **kwargs), case.label)
    note = ''
    if isinstance(out, tuple):
        out, index = out
        expected, expected_index = expected
        if not torch.equal(index.cpu(), expected_index):
            note = f'indices differ at {int((index.cpu() != expected_index).sum())} positions'
    out64 = out.detach().cpu().double()
    rule = ''
    if case.op == 'upsample' and case.kwargs['mode'].startswith('nearest'):
        rule = _nearest_rule(out64, x, case)
        if rule == 'exact':
            expected = ref.upsample(x.double(), **case.kwargs, nearest_rule='exact')
        elif rule == 'neither':
            note = note or 'matches neither nearest index rule'
    err = (out64 - expected).abs()
    max_err = float(err.max()) if err.numel() else 0.0
    if math.isnan(max_err):
        max_err = math.inf
    tol = tolerance(case, dtype)
    passed = max_err <= tol and not note
    return Result(case.op, case.variant, _shape_label(case), str(dtype).replace('torch.', ''),
                  max_err, max_err / ulp_at_one(dtype), tol, passed, rule, note,
                  device_indices=', '.join(observed), kernels=kernels)


def _nearest_rule(out64: torch.Tensor, x: torch.Tensor, case: Case) -> str:
    matches = []
    for rule in ('pytorch', 'exact'):
        candidate = ref.upsample(x.double(), **case.kwargs, nearest_rule=rule)
        matches.append(torch.equal(candidate, out64))
    return {(True, True): 'both', (True, False): 'pytorch', (False, True): 'exact',
            (False, False): 'neither'}[tuple(matches)]


def _shape_label(case: Case) -> str:
    shape = 'x'.join(map(str, case.in_shape))
    if case.op == 'upsample':
        kw = case.kwargs
        target = kw.get('size') or f'*{kw.get("scale_factor")}'
        if isinstance(target, tuple):
            target = 'x'.join(map(str, target))
        return f'{shape}->{target}'
    return shape


PlanFn = Callable[[Case, torch.Tensor], Union[Plan, str]]


def _fill_plan(result: Result, plan: Union[Plan, str], device: torch.device) -> None:
    """The plan column and, with a trace, the verdict of the trace against the plan.

    On an NPU a max-pool plan is described with the kernel the device's indices reveal
    (``kernel_from_indices``), not the planner's prediction.
    """
    if isinstance(plan, str):
        result.plan = plan
        return
    observed = result.device_indices.split(', ') if result.device_indices else []
    on_npu = device.type == 'npu'
    result.plan = describe_observed(plan, observed) if on_npu else plan.describe()
    if result.kernels is not None:
        verdict = trace_verdict(plan.expect, plan.forbid, result.kernels)
        if on_npu and plan.op == 'max_pool2d' and kernel_from_indices(observed):
            # the indices dtype names the entry that ran; the trace checks the kernel
            verdict += f' ({kernel_from_indices(observed).split(" (")[0]})'
        result.trace = verdict


def run_all(cases: Iterable[Case], device: torch.device, dtypes: Iterable[torch.dtype],
            op_kwargs: Optional[dict] = None, plan_fn: Optional[PlanFn] = None,
            tracer: Optional[NpuTracer] = None) -> List[Result]:
    """Run every case in every dtype.

    ``plan_fn(case, input)`` returns the case's plan (a :class:`Plan`, or a string for
    the column as it is), called with the case's actual input on ``device``; with a
    ``tracer`` every call is traced and checked against its plan.
    """
    results = []
    for dtype in dtypes:
        for i, case in enumerate(cases):
            try:
                results.append(run_case(case, device, dtype, seed=i, op_kwargs=op_kwargs,
                                        tracer=tracer))
                if plan_fn is not None:
                    _fill_plan(results[-1], plan_fn(case, case_input(case, dtype, i).to(device)),
                               device)
            except (RuntimeError, NotImplementedError) as exc:  # kernel missing on device
                results.append(Result(case.op, case.variant, _shape_label(case),
                                      str(dtype).replace('torch.', ''), math.inf, math.inf,
                                      TOLERANCES[dtype], False,
                                      note=f'{type(exc).__name__}: {exc}'.splitlines()[0]))
    return results


def format_table(results: List[Result], failures_only: bool = False) -> str:
    """The results as a text table; ``plan``, ``kernels`` and ``trace`` columns appear
    when any result has them. ``failures_only`` keeps failing rows and trace mismatches."""
    with_plan = any(r.plan for r in results)
    with_trace = any(r.kernels is not None for r in results)
    header = ('op', 'variant', 'shape', 'dtype', 'max abs err', 'ulp@1', 'tol', 'rule') + (
        ('plan',) if with_plan else ()) + (('kernels', 'trace') if with_trace else ()) + (
        'result',)
    rows = [header]
    for r in results:
        if failures_only and r.passed and not r.trace.startswith('MISMATCH'):
            continue
        rows.append((r.op, r.variant, r.shape, r.dtype, f'{r.max_abs_err:.3g}',
                     f'{r.max_ulp_err:.3g}', f'{r.tolerance:.3g}', r.rule) +
                    ((r.plan,) if with_plan else ()) +
                    ((describe_kernels(r.kernels or []), r.trace) if with_trace else ()) +
                    ('pass' if r.passed else f'FAIL {r.note}'.strip(),))
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(header))]
    lines = ['  '.join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, '  '.join('-' * w for w in widths))
    return '\n'.join(lines)


def summarize(results: List[Result]) -> Dict[str, object]:
    by_group: Dict[str, Dict[str, float]] = {}
    for r in results:
        g = by_group.setdefault(f'{r.op}/{r.dtype}', {'cases': 0, 'failed': 0, 'max_abs_err': 0.0})
        g['cases'] += 1
        g['failed'] += int(not r.passed)
        g['max_abs_err'] = max(g['max_abs_err'], r.max_abs_err)
    rules = sorted({r.rule for r in results if r.rule})
    return {'total': len(results), 'failed': sum(not r.passed for r in results),
            'groups': by_group, 'nearest_rules_seen': rules,
            'traced': sum(r.kernels is not None for r in results),
            'trace_mismatches': sum(r.trace.startswith('MISMATCH') for r in results)}
