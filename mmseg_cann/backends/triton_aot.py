"""The ahead-of-time compile check of the Triton kernels (``tools/device_check.py --aot``).

The interpreter (``TRITON_INTERPRET=1``) accepts code the real compiler rejects, so the
kernels are also compiled for the GPUs they target, without one: the public ops run on
CPU tensors with ``backend='triton'`` while :func:`kernels._common.launch_context`
records every launch (each candidate configuration) with the device properties of the
target, and :mod:`kernels.aot` binds each launch with Triton's own JIT binder and
compiles it for ``cuda:90`` (H100/H200) and ``hip:gfx942`` (MI300). The cases cover
every kernel x dtype (float32, float16, bfloat16) x layout (NCHW, channels_last, a
strided view with an unaligned start) x flag combination the launchers produce, size-1
dimensions and arguments equal to 1, and the int64-offset variants. Any compile error,
and any spill, fails the check. ``tools/ascend_check.py`` records the same cases with an
Ascend launch plan (:data:`TARGET_DEVICES` ``'npu'``) and compiles them with
triton-ascend; :attr:`Case.main` marks the main-path cases its loop targets distinguish.

The public ops are passed in (``ops``, the :mod:`mmseg_cann.ops` module) by the caller,
which sits above them; this module only describes the cases.
"""
from __future__ import annotations

import dataclasses
import importlib
import os
import time
from typing import Callable, Dict, Iterator, List, Optional, Sequence

import torch

#: device properties a launch is planned for, per target (H100 SXM, MI300X, and the
#: Ascend 910B3 of ``tools/ascend_check.py``: 40 vector cores, looping programs)
TARGET_DEVICES = {
    'cuda': dict(kind='cuda', cores=132, name='H100 SXM (sm_90)'),
    'hip': dict(kind='hip', cores=304, name='MI300X (gfx942)'),
    'npu': dict(kind='npu', cores=40, max_grid=65535, name='Ascend910B3'),
}
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
LAYOUTS = ('nchw', 'channels_last', 'strided')


def _kernels(name: str):
    # ``kernels/`` installs as mmseg_cann.kernels; imported by name (see backends.triton)
    return importlib.import_module(f'mmseg_cann.kernels.{name}')


@dataclasses.dataclass
class Case:
    """One call of a public op: ``run(ops)`` makes its inputs and calls it."""

    label: str
    run: Callable[[object], None]
    #: a decoder's or backbone's common form (:func:`main_path`)
    main: bool = False


# ----------------------------------------------------------------------------- inputs
def make(shape: Sequence[int], dtype: torch.dtype, layout: str,
         requires_grad: bool = False) -> torch.Tensor:
    """A tensor of ``shape`` in ``layout``: ``'nchw'`` (contiguous), ``'channels_last'``
    (4-D only) or ``'strided'``: every other element of the last axis of a larger tensor,
    starting at element 1 (non-contiguous, start not 16-byte aligned)."""
    if layout == 'strided':
        base = torch.zeros(tuple(shape[:-1]) + (2 * shape[-1] + 1,), dtype=dtype)
        x = base[..., 1::2]
    elif layout == 'channels_last':
        x = torch.zeros(shape, dtype=dtype).contiguous(memory_format=torch.channels_last)
    elif layout == 'nchw':
        x = torch.zeros(shape, dtype=dtype)
    else:
        raise ValueError(f'layout must be one of {LAYOUTS}, got {layout!r}')
    return x.requires_grad_(requires_grad)


# ------------------------------------------------------------------------------ cases
#: (input shape, output size) in every dtype x layout: odd sizes and strides
UPSAMPLE_SHAPES = [((2, 3, 5, 7), (9, 13))]
#: float32 only: 16-divisible sizes and strides over 16 programs, size-1 dimensions
#: (one program, constant sizes and strides), an 8x ratio (the backward's widest tables),
#: height-1 and width-1 inputs, downsampling, a 1x1 output
UPSAMPLE_EXTRA = [((1, 16, 16, 16), (32, 32)), ((1, 1, 1, 1), (2, 2)),
                  ((1, 2, 4, 3), (32, 24)), ((1, 2, 1, 5), (3, 10)),
                  ((1, 2, 5, 1), (10, 3)), ((1, 2, 9, 11), (4, 5)), ((1, 2, 5, 7), (1, 1))]
#: argmax (input shape, size): a decoder's 19 classes; float32 only: 1 and 3 classes,
#: 2x, height-1 and width-1 inputs, downsampling, a 1x1 output
ARGMAX_SHAPES = [((1, 19, 4, 6), (32, 48))]
ARGMAX_EXTRA = [((1, 1, 3, 3), (5, 5)), ((2, 3, 5, 7), (9, 13)), ((1, 19, 8, 12), (16, 24)),
                ((1, 3, 1, 5), (3, 10)), ((1, 3, 5, 1), (10, 3)), ((1, 3, 9, 11), (4, 5)),
                ((1, 3, 5, 7), (1, 1))]
#: the pooling window of ResNet stems, odd sizes, in every dtype x layout
POOL_CASES = [((2, 3, 9, 11), dict(kernel_size=3, stride=2, padding=1))]
#: float32 only: aligned sizes (avg_down shortcuts), a (C, H, W) input, further window
#: grids (stride 1, size-1 kernels, SAME, ceil mode, dilation)
POOL_EXTRA = [((1, 16, 16, 16), dict(kernel_size=2, stride=2)),
              ((3, 7, 9), dict(kernel_size=3, stride=2, padding=1)),
              ((2, 3, 9, 11), dict(kernel_size=(1, 3), stride=1, padding=(0, 1))),
              ((2, 3, 9, 11), dict(kernel_size=1, stride=1)),
              ((2, 3, 9, 11), dict(kernel_size=3, stride=2, padding='same')),
              ((2, 3, 9, 11), dict(kernel_size=3, stride=2, padding=1, ceil_mode=True)),
              ((2, 3, 9, 11), dict(kernel_size=3, stride=2, padding=1, dilation=2)),
              ((2, 3, 1, 9), dict(kernel_size=3, stride=2, padding=1)),
              ((2, 3, 9, 1), dict(kernel_size=3, stride=2, padding=1)),
              ((2, 3, 1, 1), dict(kernel_size=3, stride=2, padding=1)),
              ((2, 3, 3, 3), dict(kernel_size=3, stride=2)),
              ((2, 3, 9, 11), dict(kernel_size=3, stride=3))]

#: the pooling windows of the main path (ResNet stems, avg_down shortcuts)
MAIN_WINDOWS = (dict(kernel_size=3, stride=2, padding=1), dict(kernel_size=2, stride=2))


def main_path(layout: str, shape=None, size=None, window=None) -> bool:
    """Whether a case is a common form of a decoder or backbone: NCHW, and a 2x upsample
    (``shape`` to ``size``) or a k3s2p1 / k2s2 pooling ``window``."""
    if layout != 'nchw':
        return False
    if window is not None:
        return window in MAIN_WINDOWS
    return tuple(size) == tuple(2 * d for d in shape[-2:])


def _tag(dtype, layout) -> str:
    return f"{str(dtype).replace('torch.', '')}/{layout}"


def _upsample(ops, x, size, mode, grad_layout=None):
    kw = dict(mode=mode, align_corners=False) if mode == 'bilinear' else dict(mode=mode)
    y = ops.upsample(x, size=size, backend='triton', precision='input', **kw)
    if x.requires_grad:
        torch.autograd.grad(y, x, make(y.shape, y.dtype, grad_layout))


def upsample_cases(dtype, layout, shapes, argmax_shapes, backward=True) -> Iterator[Case]:
    """For each shape: forward (nearest/bilinear), upsample_add (``other`` in the
    output's layout, or strided) and (``backward``) the bilinear backward with the
    gradient in ``layout``; for each argmax shape: upsample_argmax (nearest/bilinear)."""
    tag = _tag(dtype, layout)
    others = dict.fromkeys(('nchw' if layout == 'channels_last' else layout, 'strided'))
    for shape, size in shapes:
        main = main_path(layout, shape, size)
        for mode in ('nearest', 'bilinear'):
            yield Case(f'upsample {mode} {shape}->{size} {tag}',
                       lambda ops, s=shape, z=size, m=mode: _upsample(
                           ops, make(s, dtype, layout), z, m), main)
            for other in others:
                yield Case(f'upsample_add {mode} {shape}->{size} {tag} other={other}',
                           lambda ops, s=shape, z=size, m=mode, o=other: ops.upsample_add(
                               make(s, dtype, layout), make(s[:2] + z, dtype, o), mode=m,
                               backend='triton'), main and other == layout)
        if backward:
            yield Case(f'upsample bilinear backward {shape}->{size} {tag}',
                       lambda ops, s=shape, z=size: _upsample(
                           ops, make(s, dtype, layout, True), z, 'bilinear', layout))
    for shape, size in argmax_shapes:
        for mode in ('nearest', 'bilinear'):
            yield Case(f'upsample_argmax {mode} {shape}->{size} {tag}',
                       lambda ops, s=shape, z=size, m=mode: ops.upsample_argmax(
                           make(s, dtype, layout), z, mode=m, backend='triton'),
                       main_path(layout, shape, size))


def pool_cases(dtype, layout, cases) -> Iterator[Case]:
    """max_pool2d (with indices) and avg_pool2d (count_include_pad, divisor_override
    None/1/5) for each ``(shape, window)`` of ``cases``."""
    tag = _tag(dtype, layout)
    for shape, kw in cases:
        if len(shape) == 3 and layout == 'channels_last':
            continue  # a memory format of 4-D tensors
        main = main_path(layout, window=kw)
        yield Case(f'max_pool2d {shape} {kw} {tag}',
                   lambda ops, s=shape, k=kw: ops.max_pool2d(
                       make(s, dtype, layout), **k, return_indices=True, backend='triton',
                       precision='input'), main)
        if kw.get('dilation', 1) != 1:
            continue  # avg pooling has no dilation
        for options in (dict(), dict(count_include_pad=False), dict(divisor_override=1),
                        dict(divisor_override=5)):
            yield Case(f'avg_pool2d {shape} {kw} {options} {tag}',
                       lambda ops, s=shape, k=kw, o=options: ops.avg_pool2d(
                           make(s, dtype, layout), **k, **o, backend='triton',
                           precision='input'), main)


def all_cases() -> List[Case]:
    """Every case of the check with 32-bit offsets (docs/fused_ops.md, Triton kernels)."""
    cases = []
    for dtype in DTYPES:
        for layout in LAYOUTS:
            cases += upsample_cases(dtype, layout, UPSAMPLE_SHAPES, ARGMAX_SHAPES)
            cases += pool_cases(dtype, layout, POOL_CASES)
    for layout in LAYOUTS:
        cases += upsample_cases(torch.float32, layout, UPSAMPLE_EXTRA, ARGMAX_EXTRA)
        cases += pool_cases(torch.float32, layout, POOL_EXTRA)
    return cases


def int64_cases() -> List[Case]:
    """The cases recorded again with 64-bit offsets forced: every kernel and flag in
    float16, NCHW and channels_last (the offset arithmetic depends on neither dtype nor
    strides)."""
    cases = []
    for layout in ('nchw', 'channels_last'):
        cases += upsample_cases(torch.float16, layout, UPSAMPLE_SHAPES, ARGMAX_SHAPES)
        cases += pool_cases(torch.float16, layout, POOL_CASES)
    return cases


# ---------------------------------------------------------------------------- driving
@dataclasses.dataclass
class Recorded:
    """The launches one case made (every candidate configuration)."""

    case: str
    launches: list
    main: bool = False


def record(ops, cases: Sequence[Case], props, int64: bool = False) -> List[Recorded]:
    """Run ``cases`` through the public ``ops`` with launches recorded for a device
    like ``props`` (:class:`kernels._common.DeviceProps`); ``int64`` forces 64-bit
    offsets."""
    common = _kernels('_common')
    out = []
    for case in cases:
        launches = []
        with common.launch_context(props, index_limit=1 if int64 else common.INT32_LIMIT,
                                   record=launches):
            case.run(ops)
        if not launches:
            raise RuntimeError(f'case {case.label!r} launched no kernel')
        out.append(Recorded(case.label + (' [int64]' if int64 else ''), launches,
                            case.main and not int64))
    return out


@dataclasses.dataclass
class Report:
    """The check's outcome: per target, its results (or why it was skipped)."""

    results: list = dataclasses.field(default_factory=list)   # kernels.aot.Result
    skipped: Dict[str, str] = dataclasses.field(default_factory=dict)
    launches: Dict[str, int] = dataclasses.field(default_factory=dict)
    cases: int = 0
    first_case: Dict[str, str] = dataclasses.field(default_factory=dict)  # key -> case
    seconds: float = 0.0

    @property
    def failures(self) -> list:
        return [r for r in self.results if r.error is not None]

    @property
    def spilling(self) -> list:
        return [r for r in self.results if r.spills]

    @property
    def ok(self) -> bool:
        return not self.failures and not self.spilling and bool(self.results)


def run_check(ops, targets: Sequence[str] = ('cuda', 'hip'), workers: Optional[int] = None,
              cases: Optional[Sequence[Case]] = None,
              wide_cases: Optional[Sequence[Case]] = None) -> Report:
    """Record every case for each target, bind and compile each distinct variant.

    ``ops``: the :mod:`mmseg_cann.ops` module; ``targets``: keys of
    :data:`kernels.aot.TARGETS`; ``workers``: compile processes (default: the CPU
    count, at most 4); ``cases``/``wide_cases``: override :func:`all_cases` /
    :func:`int64_cases`. A target this machine cannot compile for is skipped with its
    reason in :attr:`Report.skipped`.
    """
    if os.environ.get('TRITON_INTERPRET') == '1':
        raise RuntimeError('the ahead-of-time check compiles real kernels: run it in a '
                           'process without TRITON_INTERPRET=1')
    aot, common = _kernels('aot'), _kernels('_common')
    aot.check_triton()
    unknown = [t for t in targets if t not in aot.TARGETS]
    if unknown or not targets:
        raise ValueError(f'targets must be a non-empty subset of {sorted(aot.TARGETS)}, '
                         f'got {list(targets)!r}')
    start = time.perf_counter()
    cases = all_cases() if cases is None else list(cases)
    wide_cases = int64_cases() if wide_cases is None else list(wide_cases)
    report = Report(cases=len(cases) + len(wide_cases))
    variants, bind_errors = {}, []
    for name in targets:
        target = aot.TARGETS[name]
        reason = aot.unavailable_reason(target)
        if reason is not None:
            report.skipped[aot.target_name(target)] = reason
            continue
        props = common.DeviceProps(**TARGET_DEVICES[name])
        recorded = record(ops, cases, props) + record(ops, wide_cases, props, int64=True)
        report.launches[aot.target_name(target)] = sum(len(r.launches) for r in recorded)
        for rec in recorded:
            for item in rec.launches:
                try:
                    variant = aot.bind(item.kernel, item.args, item.kwargs, target)
                except Exception as e:  # noqa: BLE001 - a launch that cannot bind fails
                    key = f'{rec.case} (binding)'
                    bind_errors.append(aot.Result(
                        item.kernel.__name__, aot.target_name(target), key,
                        error=f'binding failed: {type(e).__name__}: {e}'))
                    report.first_case[key] = rec.case
                    continue
                variants.setdefault(variant.key, variant)
                report.first_case.setdefault(variant.key, rec.case)
    if workers is None:
        workers = min(4, os.cpu_count() or 1)
    report.results = aot.compile_all(variants.values(), workers) + bind_errors
    report.seconds = time.perf_counter() - start
    return report


# ----------------------------------------------------------------------------- report
def summary_rows(report: Report) -> List[dict]:
    """One row per (target, kernel): variants, max registers, spilling variants, failed
    compilations."""
    rows: Dict[tuple, dict] = {}
    for r in report.results:
        row = rows.setdefault((r.target, r.kernel), dict(
            target=r.target, kernel=r.kernel, variants=0, max_registers=0, spills=0,
            failures=0))
        row['variants'] += 1
        if r.error is not None:
            row['failures'] += 1
        else:
            row['max_registers'] = max(row['max_registers'], r.registers)
            row['spills'] += int(bool(r.spills))
    return [rows[k] for k in sorted(rows)]


def format_report(report: Report) -> str:
    """The AOT table and the failures, as printed by ``tools/device_check.py --aot``."""
    lines = ['| target | kernel | variants | max registers | spills | failures |',
             '|---|---|---|---|---|---|']
    for row in summary_rows(report):
        lines.append(f"| {row['target']} | {row['kernel']} | {row['variants']} | "
                     f"{row['max_registers']} | {row['spills']} | {row['failures']} |")
    for target, reason in report.skipped.items():
        lines.append(f'| {target} | skipped: {reason.splitlines()[0]} | | | | |')
    launches = ', '.join(f'{t}: {n}' for t, n in report.launches.items())
    lines.append('')
    lines.append(f'{report.cases} cases, launches recorded ({launches}), '
                 f'{len(report.results)} distinct compilations, '
                 f'{len(report.failures)} failed, {len(report.spilling)} spilling, '
                 f'{report.seconds:.1f} s (registers: per thread on CUDA, VGPRs on ROCm)')
    for r in report.failures + report.spilling:
        what = r.error if r.error is not None else f'spills: {r.spills}'
        lines.append(f'\n{r.target} {r.kernel} [{r.meta}]\n  first case: '
                     f'{report.first_case.get(r.key)}\n  {what}')
    return '\n'.join(lines)


def report_json(report: Report) -> dict:
    """The report as JSON-serialisable data."""
    return dict(ok=report.ok, cases=report.cases, launches=report.launches,
                seconds=report.seconds, skipped=report.skipped,
                summary=summary_rows(report),
                results=[dict(dataclasses.asdict(r), case=report.first_case.get(r.key))
                         for r in report.results])
