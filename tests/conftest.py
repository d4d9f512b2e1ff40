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
