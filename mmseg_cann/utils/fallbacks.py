"""Visible fallbacks: every time a backend leaves its preferred path it says so.

Each fallback is counted (``fallback_counts()``) and logged once per distinct
(op, reason) through mmengine's logger when it is available, Python logging otherwise.
"""
from __future__ import annotations

import logging
import threading
from collections import Counter
from typing import Dict, Tuple

_lock = threading.Lock()
_counts: Counter = Counter()
_logger = logging.getLogger('mmseg_cann')


def record_fallback(op: str, reason: str) -> None:
    """Count one fallback of ``op`` and log ``reason`` the first time it happens."""
    key = (op, reason)
    with _lock:
        first = key not in _counts
        _counts[key] += 1
    if first:
        _logger.warning('mmseg_cann fallback in %s: %s', op, reason)


def fallback_counts() -> Dict[Tuple[str, str], int]:
    """A snapshot of the fallback counters, keyed by (op, reason)."""
    with _lock:
        return dict(_counts)


def reset_fallbacks() -> None:
    """Forget all counters (the next fallback of each kind is logged again)."""
    with _lock:
        _counts.clear()
