"""Visible fallbacks: every time a backend leaves its preferred path it says so.

Each fallback is counted and logged once per call site: the first time a given
(op, reason) happens at a given site it is logged through Python logging (logger
``'mmseg_cann'``, which mmengine's logger shows), later occurrences are only counted.
The call site is the first stack frame outside ``mmseg_cann`` (``file:line``, i.e. the
model code that called the op), or the ``site`` the caller names.

* ``fallback_counts()`` -> ``{(op, reason): count}`` summed over sites;
* ``fallback_sites()`` -> ``{(op, reason, site): count}``;
* ``reset_fallbacks()`` forgets both (the next fallback of each kind is logged again).

Calls inside a ``torch.compile``'d graph are not counted (the graph runs without
Python); tracing it records nothing either.
"""
from __future__ import annotations

import logging
import os
import sys
import threading
from collections import Counter
from typing import Dict, Optional, Tuple

import torch

_lock = threading.Lock()
_counts: Counter = Counter()
_site_counts: Counter = Counter()
#: every fallback ever recorded in this process (never reset): lets a caller tell
#: whether a call recorded one
_total = 0
_logger = logging.getLogger('mmseg_cann')
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_SKIP_DIRS = (_PACKAGE_DIR + os.sep,
              os.path.join(os.path.dirname(os.path.abspath(torch.__file__)), 'nn') + os.sep)


def call_site(depth_limit: int = 64) -> str:
    """``file:line`` of the first frame outside mmseg_cann and torch.nn (the caller)."""
    frame = sys._getframe(1)
    for _ in range(depth_limit):
        if frame is None:
            break
        filename = os.path.abspath(frame.f_code.co_filename)
        if not filename.startswith(_SKIP_DIRS):
            return f'{filename}:{frame.f_lineno}'
        frame = frame.f_back
    return '<unknown>'


def record_fallback(op: str, reason: str, site: Optional[str] = None) -> None:
    """Count one fallback of ``op`` and log ``reason`` the first time at this call site."""
    global _total
    if torch.compiler.is_compiling():
        return
    site = site if site is not None else call_site()
    key = (op, reason, site)
    with _lock:
        _total += 1
        first = key not in _site_counts
        _site_counts[key] += 1
        _counts[(op, reason)] += 1
    if first:
        _logger.warning('mmseg_cann fallback in %s at %s: %s', op, site, reason)


def fallback_total() -> int:
    """How many fallbacks this process has recorded (:func:`reset_fallbacks` keeps it)."""
    return _total


def fallback_counts() -> Dict[Tuple[str, str], int]:
    """A snapshot of the fallback counters, keyed by (op, reason)."""
    with _lock:
        return dict(_counts)


def fallback_sites() -> Dict[Tuple[str, str, str], int]:
    """A snapshot of the counters per call site, keyed by (op, reason, site)."""
    with _lock:
        return dict(_site_counts)


def reset_fallbacks() -> None:
    """Forget all counters (the next fallback of each kind is logged again)."""
    with _lock:
        _counts.clear()
        _site_counts.clear()
