"""The on-disk cache of tuning results (a JSON file under the user cache directory).

Location: ``$MMSEG_CANN_TUNING_CACHE`` if set, else
``$XDG_CACHE_HOME/mmseg_cann/tuning.json`` (``~/.cache/mmseg_cann/tuning.json`` when
``XDG_CACHE_HOME`` is unset).

Layout::

    {"format": 1,
     "sections": {"<device name>|torch=2.13.0|mmseg_cann=0.1.0|torch_npu=-": {
         "<op key>": {"plan": "<Plan.name>", "times_ms": {...}, "rejected": [...]}}}}

A section is keyed by the device name and the library versions, so results measured
with other versions are never reused: when a section is written, the sections of the
same device with other versions are dropped (invalidated). A file that is not valid
JSON or has the wrong structure is reported with a warning and rebuilt from scratch.
Writes go to a temporary file that replaces the cache atomically.
"""
from __future__ import annotations

import json
import os
import tempfile
import threading
import warnings
from typing import Dict, Optional

import torch

FORMAT = 1
ENV_CACHE_FILE = 'MMSEG_CANN_TUNING_CACHE'


def default_cache_path() -> str:
    """The cache file path (see the module docstring)."""
    explicit = os.environ.get(ENV_CACHE_FILE)
    if explicit:
        return explicit
    base = os.environ.get('XDG_CACHE_HOME') or os.path.join(os.path.expanduser('~'), '.cache')
    return os.path.join(base, 'mmseg_cann', 'tuning.json')


def library_versions() -> Dict[str, str]:
    """Versions a tuning result depends on: torch, mmseg_cann, torch_npu (or '-').

    With torch_npu, also whether ``TORCH_NPU_USE_COMPATIBLE_IMPL=1`` is set: it changes
    the kernels torch_npu 26.x runs (e.g. max pooling with indices), so results
    measured with and without it are kept apart.
    """
    from .npu_device import ENV_COMPATIBLE_IMPL, torch_npu_module
    from ..version import __version__
    npu = torch_npu_module()
    versions = {'torch': torch.__version__, 'mmseg_cann': __version__,
                'torch_npu': getattr(npu, '__version__', '-') if npu is not None else '-'}
    if npu is not None:
        versions['compatible_impl'] = os.environ.get(ENV_COMPATIBLE_IMPL, '').strip() or '-'
    return versions


def section_key(device_name: str, versions: Optional[Dict[str, str]] = None) -> str:
    """``'<device>|torch=...|mmseg_cann=...|torch_npu=...'``."""
    versions = versions if versions is not None else library_versions()
    return '|'.join([device_name] + [f'{k}={versions[k]}' for k in sorted(versions)])


class TuningCache:
    """Load/store tuning results in one JSON file.

    Attributes:
        path: the file.
        rebuilt: True when the file existed but was corrupt and is being rebuilt.
        invalidated: sections dropped because their versions differ.
    """

    def __init__(self, path: Optional[str] = None) -> None:
        self.path = path or default_cache_path()
        self.rebuilt = False
        self.invalidated = 0
        self._lock = threading.Lock()
        self._data = self._load()

    def _fresh(self) -> dict:
        return {'format': FORMAT, 'sections': {}}

    def _load(self) -> dict:
        if not os.path.exists(self.path):
            return self._fresh()
        try:
            with open(self.path) as f:
                data = json.load(f)
            if not isinstance(data, dict) or data.get('format') != FORMAT or \
                    not isinstance(data.get('sections'), dict) or \
                    not all(isinstance(v, dict) for v in data['sections'].values()):
                raise ValueError('unexpected structure')
            return data
        except (OSError, ValueError) as exc:  # JSONDecodeError is a ValueError
            warnings.warn(f'mmseg_cann tuning cache {self.path} is unreadable or corrupt '
                          f'({type(exc).__name__}: {exc}); rebuilding it')
            self.rebuilt = True
            return self._fresh()

    def get(self, section: str, key: str) -> Optional[dict]:
        """The stored entry for ``key`` in ``section``, or None."""
        with self._lock:
            entry = self._data['sections'].get(section, {}).get(key)
            return dict(entry) if isinstance(entry, dict) else None

    def put(self, section: str, key: str, entry: dict) -> None:
        """Store ``entry`` and write the file (dropping stale sections of this device)."""
        device = section.split('|', 1)[0]
        with self._lock:
            sections = self._data['sections']
            for other in [s for s in sections if s != section and s.split('|', 1)[0] == device]:
                del sections[other]
                self.invalidated += 1
            sections.setdefault(section, {})[key] = entry
            self._write()

    def _write(self) -> None:
        directory = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix='.tuning-', suffix='.json', dir=directory)
        with os.fdopen(fd, 'w') as f:
            json.dump(self._data, f, indent=1, sort_keys=True)
        os.replace(tmp, self.path)

    def sections(self) -> Dict[str, dict]:
        with self._lock:
            return json.loads(json.dumps(self._data['sections']))
