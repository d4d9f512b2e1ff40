"""Fixtures shared by the test suite (helpers live in ``tests/_helpers.py``)."""
from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _isolated_precision_policy():
    """Every test starts from, and leaves behind, the default precision policy."""
    from mmseg_cann.core import precision
    saved = precision.get_precision_policy()
    precision.set_precision_policy(reset=True)
    yield
    precision.restore_precision_policy(saved)


# ------------------------------------------------------------- background compile checks
_RUNNING = pytest.StashKey[dict]()


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session, config, items):
    """Start the compile checks that the selected tests read (tests/_compile_checks.py),
    so they run beside the suite."""
    from tests import _compile_checks
    running = config.stash.setdefault(_RUNNING, {})
    if config.option.collectonly:
        return
    for name in _compile_checks.wanted(items):
        running.setdefault(name, _compile_checks.start(name))


def pytest_sessionfinish(session):
    from tests import _compile_checks
    for running in session.config.stash.get(_RUNNING, {}).values():
        _compile_checks.stop(running)


@pytest.fixture(scope='session')
def compile_check(request):
    """``compile_check(name)``: ``(CompletedProcess, report dict or None)`` of the
    compile check ``name`` of ``tests._compile_checks.CHECKS``, started in the
    background at collection (or now, if it was not)."""
    from tests import _compile_checks
    running = request.config.stash.setdefault(_RUNNING, {})

    def get(name):
        if name not in running:
            running[name] = _compile_checks.start(name)
        return _compile_checks.result(running[name])
    return get
