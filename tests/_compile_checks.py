"""The two compile checks that take minutes the first time, run in the background.

``tools/device_check.py --aot`` (every Triton kernel variant compiled for sm_90 and
gfx942; minutes on a cold Triton cache) and ``tools/ascend_check.py`` (the same variants
through triton-ascend's front end, in ``.venv-ascend``) are separate processes whose
reports a few tests read. ``tests/conftest.py`` starts each one when the session's
selected tests include a test that reads it (:attr:`Check.fixture`), right after
collection, so it compiles beside the rest of the suite instead of before the tests
that read it; the fixture of those tests waits for it (:func:`result`). A check that
was not started (a test selected in a way the collection hook did not see) starts when
its result is asked for. Output goes to files (a pipe could fill while nobody reads it).
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Callable, Dict, List, Optional

from tests._helpers import REPO_ROOT

ASCEND_VENV = os.path.join(REPO_ROOT, '.venv-ascend')
ASCEND_PYTHON = os.path.join(ASCEND_VENV, 'bin', 'python')
ASCEND_FAILED = os.path.join(ASCEND_VENV, 'install-failed.txt')
ASCEND_STAMP = os.path.join(ASCEND_VENV, '.mmseg-cann-installed')


def ascend_skip_reason() -> Optional[str]:
    """Why the Ascend check cannot run here (``make`` could not install triton-ascend,
    or ``.venv-ascend`` is not made), or None."""
    if os.path.isfile(ASCEND_FAILED):
        with open(ASCEND_FAILED) as f:
            tail = f.read().strip().splitlines()
        return ('triton-ascend could not be installed in .venv-ascend: '
                + (' | '.join(tail[-3:]) or 'no pip output'))
    if not (os.path.isfile(ASCEND_STAMP) and os.access(ASCEND_PYTHON, os.X_OK)):
        return '.venv-ascend is not made (make side-envs)'
    return None


def _env(*drop: str) -> Dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in drop}


@dataclasses.dataclass
class Check:
    """A compile check: its command (given the JSON report's path), environment, time
    limit, the test module and fixture that read it, and why it cannot run here."""

    module: str                       # the reading test module, relative to the repo
    fixture: str                      # the fixture of that module that reads the report
    argv: Callable[[str], List[str]]
    env: Callable[[], Dict[str, str]]
    timeout: float
    skip_reason: Callable[[], Optional[str]] = lambda: None


CHECKS = {
    # real @triton.jit: without the interpreter that the kernel tests switch on
    'aot': Check('tests/tools/test_device_check.py', 'aot',
                 lambda out: [sys.executable, os.path.join(REPO_ROOT, 'tools',
                                                           'device_check.py'),
                              '--aot', '--json', out],
                 lambda: _env('TRITON_INTERPRET'), timeout=1800),
    'ascend': Check('tests/kernels/test_ascend_check.py', 'report',
                    lambda out: [ASCEND_PYTHON, os.path.join(REPO_ROOT, 'tools',
                                                             'ascend_check.py'),
                                 '--json', out, '--workers', '2'],
                    lambda: _env('TRITON_INTERPRET', 'PYTHONPATH'), timeout=1800,
                    skip_reason=ascend_skip_reason),
}


@dataclasses.dataclass
class Running:
    """A started check: its process, files and start time."""

    name: str
    process: subprocess.Popen
    folder: str
    started: float

    @property
    def report_path(self) -> str:
        return os.path.join(self.folder, 'report.json')


def start(name: str) -> Running:
    """Start check ``name`` of :data:`CHECKS` in the background."""
    check = CHECKS[name]
    folder = tempfile.mkdtemp(prefix=f'mmseg-cann-{name}-')
    with open(os.path.join(folder, 'stdout'), 'w') as out, \
            open(os.path.join(folder, 'stderr'), 'w') as err:
        process = subprocess.Popen(check.argv(os.path.join(folder, 'report.json')),
                                   cwd=REPO_ROOT, env=check.env(), stdout=out, stderr=err,
                                   text=True, start_new_session=True)
    return Running(name, process, folder, time.monotonic())


def wanted(items) -> List[str]:
    """The checks that the selected test ``items`` read and that can run here."""
    names = []
    for name, check in CHECKS.items():
        path = os.path.join(REPO_ROOT, check.module)
        if check.skip_reason() is None and any(
                str(item.path) == path and check.fixture in getattr(item, 'fixturenames', ())
                for item in items):
            names.append(name)
    return names


def result(running: Running):
    """Wait for ``running``; ``(CompletedProcess, report dict or None)``. Past the check's
    time limit (counted from its start) the process is killed and TimeoutExpired raised."""
    check = CHECKS[running.name]
    left = check.timeout - (time.monotonic() - running.started)
    try:
        running.process.wait(timeout=max(left, 1.0))
    except subprocess.TimeoutExpired:
        stop(running)
        raise
    with open(os.path.join(running.folder, 'stdout')) as f:
        stdout = f.read()
    with open(os.path.join(running.folder, 'stderr')) as f:
        stderr = f.read()
    report = None
    if os.path.isfile(running.report_path):
        with open(running.report_path) as f:
            report = json.load(f)
    proc = subprocess.CompletedProcess(running.process.args, running.process.returncode,
                                       stdout, stderr)
    return proc, report


def stop(running: Running) -> None:
    """Kill ``running`` if it still runs (with its compile workers: its own process
    group), remove its files."""
    if running.process.poll() is None:
        os.killpg(running.process.pid, signal.SIGKILL)
        running.process.wait()
    shutil.rmtree(running.folder, ignore_errors=True)
