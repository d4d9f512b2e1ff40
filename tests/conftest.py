"""Fixtures shared by the test suite (helpers live in ``tests/_helpers.py``)."""
from __future__ import annotations

import os

import pytest

# ``@triton.jit`` (Triton's own ``triton.language`` helpers such as ``tl.max`` included)
# reads ``TRITON_INTERPRET`` when a function is defined, so the variable must be set
# before anything imports triton: torchao (tests/analysis/test_pt2e.py) and other test
# modules do at collection, and pytest-xdist workers collect the files in their own
# order. This root conftest is imported before every test module. The kernel tests run
# under the interpreter on the CPU (tests/kernels/conftest.py); the compile checks run in
# processes without it (tests/_compile_checks.py).
if os.environ.get('MMSEG_CANN_KERNEL_DEVICE', 'cpu') == 'cpu':
    os.environ['TRITON_INTERPRET'] = '1'


@pytest.fixture(autouse=True)
def _isolated_precision_policy():
    """Every test starts from, and leaves behind, the default precision policy."""
    from mmseg_cann.core import precision
    saved = precision.get_precision_policy()
    precision.set_precision_policy(reset=True)
    yield
    precision.restore_precision_policy(saved)


# ------------------------------------------------------------- background compile checks
_SESSION = pytest.StashKey[str]()


def _is_worker(config) -> bool:
    """Whether this process is a pytest-xdist worker."""
    return hasattr(config, 'workerinput')


def pytest_configure(config):
    """The session folder of the compile checks (tests/_compile_checks.py), made by the
    main process before pytest-xdist starts its workers, which inherit it."""
    from tests import _compile_checks
    config.stash[_SESSION] = _compile_checks.session_folder(_is_worker(config))
    if _is_worker(config):
        _share_the_cores()


def _share_the_cores() -> None:
    """In a pytest-xdist worker: use this worker's share of the cores for PyTorch (and
    numba, which follows it), and let the processes the tests start inherit it, so that
    the workers do not oversubscribe the machine."""
    import torch
    workers = int(os.environ.get('PYTEST_XDIST_WORKER_COUNT', '1'))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') \
        else (os.cpu_count() or 1)
    share = max(1, cores // max(workers, 1))
    torch.set_num_threads(share)
    os.environ['OMP_NUM_THREADS'] = str(share)


def pytest_unconfigure(config):
    from tests import _compile_checks
    session = config.stash.get(_SESSION, None)
    if session is not None and not _is_worker(config):
        _compile_checks.finish_session(session)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session, config, items):
    """Start the compile checks that the selected tests read, so they run beside the
    suite (one run per session, whichever worker process collects first)."""
    from tests import _compile_checks
    if config.option.collectonly:
        return
    for name in _compile_checks.wanted(items):
        _compile_checks.start(name, config.stash[_SESSION])


@pytest.fixture(scope='session')
def compile_check(request):
    """``compile_check(name)``: ``(CompletedProcess, report dict or None)`` of the
    compile check ``name`` of ``tests._compile_checks.CHECKS``, started in the
    background at collection (or now, if it was not)."""
    from tests import _compile_checks
    folder = request.config.stash[_SESSION]

    def get(name):
        return _compile_checks.result(_compile_checks.start(name, folder))
    return get
