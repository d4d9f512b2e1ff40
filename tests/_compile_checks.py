"""The two compile checks that take minutes the first time, run in the background.

``tools/device_check.py --aot`` (every Triton kernel variant compiled for sm_90 and
gfx942; minutes on a cold Triton cache) and ``tools/ascend_check.py`` (the same variants
through triton-ascend's front end, in ``.venv-ascend``) are separate processes whose
reports a few tests read. ``tests/conftest.py`` starts each one when the session's
selected tests include a test that reads it (:attr:`Check.fixture`), right after
collection, so it compiles beside the rest of the suite instead of before the tests
that read it; the fixture of those tests waits for it (:func:`result`). A check that
was not started (a test selected in a way the collection hook did not see) starts when
its result is asked for.

One run of each check serves the whole session, also when pytest-xdist runs the tests
in several worker processes: the checks live in a session folder (:func:`session_folder`:
made by the main process, handed to the workers in :data:`FOLDER_ENV`), the first
process to create a check's subfolder starts it, and everyone reads its files: the
output (files, as a pipe could fill while nobody reads it), the report, and the exit
status, which a shell wrapper writes when the command ends. The main process kills what
still runs and removes the folder at the end of the session (:func:`finish_session`).
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


#: the environment variable that hands the session folder to pytest-xdist's workers
FOLDER_ENV = 'MMSEG_CANN_COMPILE_CHECKS'


def session_folder(is_worker: bool) -> str:
    """The folder of this session's checks: a new one in the main process (exported in
    :data:`FOLDER_ENV`, which the worker processes inherit), the main process's in a
    pytest-xdist worker."""
    if is_worker:
        return os.environ[FOLDER_ENV]
    folder = tempfile.mkdtemp(prefix='mmseg-cann-checks-')
    os.environ[FOLDER_ENV] = folder
    return folder


@dataclasses.dataclass
class Running:
    """A check of this session, started by this process or another: its folder."""

    name: str
    folder: str

    def path(self, name: str) -> str:
        return os.path.join(self.folder, name)

    @property
    def report_path(self) -> str:
        return self.path('report.json')


#: the checks this process started (kept so that the objects live as long as the session)
_STARTED: Dict[str, subprocess.Popen] = {}


def start(name: str, session: str) -> Running:
    """Start check ``name`` of :data:`CHECKS` in the background, unless another process
    of the session did (the first to create the check's folder starts it)."""
    check = CHECKS[name]
    running = Running(name, os.path.join(session, name))
    try:
        os.mkdir(running.folder)
    except FileExistsError:
        return running
    # the exit status goes to a file (read by every process); the start time too, which
    # the time limit counts from
    argv = ['sh', '-c', '"$@"; echo $? > "$0.tmp" && mv "$0.tmp" "$0"', running.path('rc'),
            *check.argv(running.report_path)]
    with open(running.path('stdout'), 'w') as out, open(running.path('stderr'), 'w') as err:
        process = _STARTED[name] = subprocess.Popen(argv, cwd=REPO_ROOT, env=check.env(), stdout=out,
                                   stderr=err, text=True, start_new_session=True)
    _write(running.path('started'), f'{process.pid} {time.time()}')
    return running


def _write(path: str, text: str) -> None:
    """Write ``text`` so that a reader sees all of it or no file."""
    with open(path + '.tmp', 'w') as f:
        f.write(text)
    os.replace(path + '.tmp', path)


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
    argv = check.argv(running.report_path)
    while not os.path.isfile(running.path('rc')):
        started = _started(running)
        if started is not None and time.time() - started[1] > check.timeout:
            _kill(started[0])
            raise subprocess.TimeoutExpired(argv, check.timeout)
        time.sleep(0.5)
    with open(running.path('rc')) as f:
        returncode = int(f.read())
    with open(running.path('stdout')) as f:
        stdout = f.read()
    with open(running.path('stderr')) as f:
        stderr = f.read()
    report = None
    if os.path.isfile(running.report_path):
        with open(running.report_path) as f:
            report = json.load(f)
    return subprocess.CompletedProcess(argv, returncode, stdout, stderr), report


def _started(running: Running):
    """``(pid, start time)`` of a check, or None before its starter recorded it."""
    try:
        with open(running.path('started')) as f:
            pid, started = f.read().split()
    except FileNotFoundError:
        return None
    return int(pid), float(started)


def _kill(pid: int) -> None:
    """Kill a check with its compile workers (its own process group)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def finish_session(session: str) -> None:
    """Kill the session's checks that still run, remove their files (main process)."""
    for name in CHECKS:
        running = Running(name, os.path.join(session, name))
        started = _started(running) if os.path.isdir(running.folder) else None
        if started is not None and not os.path.isfile(running.path('rc')):
            _kill(started[0])
    shutil.rmtree(session, ignore_errors=True)
