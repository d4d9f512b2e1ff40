"""Which CANN kernels an NPU call actually ran, from a ``torch_npu`` profiler trace, and
whether that is what its plan predicted.

``tools/check_parity.py --device npu --trace`` runs every case under
``torch_npu.profiler.profile(activities=[ProfilerActivity.NPU])`` with
``tensorboard_trace_handler(dir)`` (one directory per case), reads the kernel types the
trace lists (:func:`read_kernel_names`) and compares them with the plan's
:attr:`~mmseg_cann.backends.npu_plan.Plan.expect` / ``forbid`` names
(:func:`trace_verdict`), so a user's first NPU run verifies the planner: for example a
bilinear plan that predicts ``UpsampleBilinear2d`` while the trace shows ``TransData`` and
``ResizeBilinearV2`` is flagged.

The torch_npu profiler writes, per run, ``<dir>/<worker>_<time>_ascend_pt/
ASCEND_PROFILER_OUTPUT/`` with ``kernel_details.csv`` (one row per kernel executed on the
NPU; its ``Type`` column is the op type, ``Name`` the task name) and ``trace_view.json``
(Chrome trace; device tasks live in the process named ``Ascend Hardware``). Both are read
by the same function whether they come from a real run or from a test.
"""
from __future__ import annotations

import csv
import glob
import importlib
import json
import os
import re
from typing import Callable, List, Optional, Sequence, Tuple, TypeVar

from ..backends.npu_device import synchronize, torch_npu_module

T = TypeVar('T')

OUTPUT_DIR = 'ASCEND_PROFILER_OUTPUT'
KERNEL_DETAILS = 'kernel_details.csv'
TRACE_VIEW = 'trace_view.json'
#: process name of the device tasks in trace_view.json
DEVICE_PROCESS = 'Ascend Hardware'


def _output_dirs(trace_dir: str) -> List[str]:
    """The ``ASCEND_PROFILER_OUTPUT`` folders under ``trace_dir``, newest first."""
    found = glob.glob(os.path.join(trace_dir, '**', OUTPUT_DIR), recursive=True)
    if os.path.basename(os.path.normpath(trace_dir)) == OUTPUT_DIR:
        found.append(trace_dir)
    return sorted(set(found), key=os.path.getmtime, reverse=True)


def _unique(names: Sequence[str]) -> List[str]:
    seen, result = set(), []
    for name in names:
        if name and name not in seen:
            seen.add(name)
            result.append(name)
    return result


def _kernels_from_csv(path: str) -> List[str]:
    """Kernel types from ``kernel_details.csv`` (``Type``, else ``Name``), in run order."""
    with open(path, newline='', encoding='utf-8-sig') as f:
        rows = list(csv.DictReader(f))
    if not rows:
        return []
    column = 'Type' if 'Type' in rows[0] else 'Name'
    if column not in rows[0]:
        raise ValueError(f'{path} has neither a Type nor a Name column: {sorted(rows[0])}')
    return _unique([str(row[column]).strip() for row in rows])


def _kernels_from_trace_view(path: str) -> List[str]:
    """Names of the complete events of the ``Ascend Hardware`` process in a Chrome trace."""
    with open(path, encoding='utf-8') as f:
        data = json.load(f)
    events = data.get('traceEvents', []) if isinstance(data, dict) else data
    device_pids = {e.get('pid') for e in events
                   if e.get('ph') == 'M' and e.get('name') == 'process_name'
                   and e.get('args', {}).get('name') == DEVICE_PROCESS}
    return _unique([str(e.get('name', '')) for e in events
                    if e.get('ph') == 'X' and e.get('pid') in device_pids])


def read_kernel_names(trace_dir: str) -> List[str]:
    """The kernels a torch_npu profiler run under ``trace_dir`` executed on the NPU.

    Reads the newest ``ASCEND_PROFILER_OUTPUT``: ``kernel_details.csv`` when present,
    else ``trace_view.json``. Returns kernel types in order of first appearance.

    Raises:
        FileNotFoundError: no profiler output under ``trace_dir``.
    """
    for folder in _output_dirs(trace_dir):
        details = os.path.join(folder, KERNEL_DETAILS)
        if os.path.isfile(details):
            return _kernels_from_csv(details)
        view = os.path.join(folder, TRACE_VIEW)
        if os.path.isfile(view):
            return _kernels_from_trace_view(view)
    raise FileNotFoundError(f'no {OUTPUT_DIR}/{KERNEL_DETAILS} or {TRACE_VIEW} under '
                            f'{trace_dir}')


def _ran(name: str, kernels: Sequence[str]) -> bool:
    """Whether kernel type ``name`` is among ``kernels`` (case-insensitive; a task name
    such as ``aclnnUpsampleBilinear2d_UpsampleBilinear2d`` contains its type)."""
    wanted = name.lower()
    return any(wanted in kernel.lower() for kernel in kernels)


def trace_verdict(expect: Sequence[str], forbid: Sequence[str], kernels: Sequence[str]) -> str:
    """``'ok'`` when every expected kernel ran and no forbidden one did, else
    ``'MISMATCH: ...'`` naming the difference (``'-'`` when nothing was predicted)."""
    if not expect and not forbid:
        return '-'
    missing = [name for name in expect if not _ran(name, kernels)]
    unwanted = [name for name in forbid if _ran(name, kernels)]
    if not missing and not unwanted:
        return 'ok'
    parts = ([f'expected {", ".join(missing)}'] if missing else []) + (
        [f'ran {", ".join(unwanted)}'] if unwanted else [])
    return 'MISMATCH: ' + '; '.join(parts)


def _safe(label: str) -> str:
    return re.sub(r'[^A-Za-z0-9_.-]+', '_', label).strip('_')[:80] or 'case'


class NpuTracer:
    """Runs calls under the torch_npu profiler, one trace directory per call.

    Args:
        out_dir: where the per-call trace directories go.
        device: the device to synchronise before the profiler stops (None: none).
        profiler: the profiler module (default ``torch_npu.profiler``); it must provide
            ``profile``, ``ProfilerActivity.NPU`` and ``tensorboard_trace_handler``.
    """

    def __init__(self, out_dir: str, device=None, profiler=None) -> None:
        if profiler is None:
            if torch_npu_module() is None:
                raise RuntimeError('--trace needs torch_npu (its profiler records the kernels)')
            profiler = importlib.import_module('torch_npu.profiler')
        self.out_dir = out_dir
        self.device = device
        self.profiler = profiler
        self._count = 0

    def trace(self, run: Callable[[], T], label: str) -> Tuple[T, List[str]]:
        """``run()`` under the profiler; returns its result and the kernels it ran."""
        self._count += 1
        case_dir = os.path.join(self.out_dir, f'{self._count:05d}_{_safe(label)}')
        with self.profiler.profile(
                activities=[self.profiler.ProfilerActivity.NPU],
                on_trace_ready=self.profiler.tensorboard_trace_handler(case_dir)):
            out = run()
            if self.device is not None:
                synchronize(self.device)
        return out, read_kernel_names(case_dir)


def describe_kernels(kernels: Sequence[str], limit: Optional[int] = 6) -> str:
    """The kernel list as one table cell (``'A, B, +3'`` beyond ``limit``)."""
    shown = list(kernels) if limit is None else list(kernels)[:limit]
    text = ', '.join(shown)
    if limit is not None and len(kernels) > limit:
        text += f', +{len(kernels) - limit}'
    return text or '(none)'
