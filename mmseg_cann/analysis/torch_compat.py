"""Drop-in exactness judged by PyTorch's own tests: routing, a pytest plugin, the comparison.

:func:`install` replaces, for the rest of the process, torch's 2-D pooling and
upsampling entry points with mmseg_cann's and routes to them exactly the calls the CANN
ops cover; every other call runs torch's original:

* ``torch.nn.functional.interpolate``: 4-D tensor input in one of
  ``geometry.UPSAMPLE_MODES`` runs ``ops.upsample``;
* ``F.max_pool2d`` (both ``return_indices`` forms), ``F.max_pool2d_with_indices``,
  ``F.avg_pool2d``, ``F.adaptive_avg_pool2d``: 3-D or 4-D tensor input runs the op of
  the same name in ``mmseg_cann.ops``;
* ``torch.nn.Upsample``: built as ``CANNUpsample`` when ``mode`` is one of those modes
  (``nn.Upsample`` itself otherwise); ``nn.UpsamplingNearest2d`` and
  ``nn.UpsamplingBilinear2d``: built as ``CANNUpsample`` (nearest; bilinear with
  ``align_corners=True``); their calls on 4-D input run the CANN module;
* ``nn.MaxPool2d``, ``nn.AvgPool2d``, ``nn.AdaptiveAvgPool2d``: built as the CANN
  module of the same name; their calls on 3-D/4-D input run it.

``F.upsample``, ``F.upsample_nearest`` and ``F.upsample_bilinear`` keep torch's own
wrappers: they call ``interpolate`` through the ``torch.nn.functional`` namespace, so
their covered calls reach the routed ``interpolate``. ``torch.max_pool2d``,
``torch._C._nn.*`` and the 1-D/3-D functions and modules stay torch's. A replaced
module called on an input it does not cover runs the original module's ``forward``.
Calls made from inside an mmseg_cann op (its native fallbacks) always run torch's
originals. Routed and passed-through calls are counted (:data:`COUNTS`).

Loaded as a pytest plugin (``-p mmseg_cann.analysis.torch_compat``) the module adds
``--torch-compat={plain,patched}`` (``patched`` installs the routing before collection),
``--torch-compat-match FILE=REGEX`` (run only the tests of FILE whose name matches),
drops tests named for CUDA, and with ``--torch-compat-record PATH`` writes each test's
outcome, first error line and number of routed calls to ``PATH.<pid>.json``.
:func:`compare` turns a plain and a patched record into the figures ``tools/torch_compat.py``
prints. The module imports ``mmseg_cann`` by absolute name only, so the tool can load a
copy of it against another checkout's package.
"""
from __future__ import annotations

import collections
import contextlib
import inspect
import json
import os
import re
import threading

import torch
import torch.nn.functional as F
from torch import nn

#: names replaced in ``torch.nn.functional`` and ``torch.nn``
FUNCTIONAL_NAMES = ('interpolate', 'max_pool2d', 'max_pool2d_with_indices', 'avg_pool2d',
                    'adaptive_avg_pool2d')
MODULE_NAMES = ('Upsample', 'UpsamplingNearest2d', 'UpsamplingBilinear2d', 'MaxPool2d',
                'AvgPool2d', 'AdaptiveAvgPool2d')
#: input ranks the CANN ops cover
POOL_RANKS = (3, 4)
UPSAMPLE_RANKS = (4,)

#: ('routed' | 'native', name) -> calls since the last reset
COUNTS = collections.Counter()
_ORIGINALS: dict = {}
_state = threading.local()


def _upsample_modes():
    from mmseg_cann.core import geometry
    return tuple(geometry.UPSAMPLE_MODES)


@contextlib.contextmanager
def _ours():
    """Mark the calls made while an mmseg_cann op runs: they use torch's originals."""
    _state.depth = getattr(_state, 'depth', 0) + 1
    try:
        yield
    finally:
        _state.depth -= 1


def _nested() -> bool:
    return getattr(_state, 'depth', 0) > 0


def _is_input(x, ranks) -> bool:
    return isinstance(x, torch.Tensor) and x.dim() in ranks


def _dispatch(name, covered, ours, args, kwargs):
    """Run ``ours`` when the call is covered (and not made from inside an mmseg_cann op),
    torch's original otherwise."""
    if not _nested() and covered:
        COUNTS['routed', name] += 1
        with _ours():
            return ours()
    if not _nested():
        COUNTS['native', name] += 1
    return _ORIGINALS['F.' + name](*args, **kwargs)


def _arg(args, kwargs, index, name, default=None):
    return args[index] if len(args) > index else kwargs.get(name, default)


def interpolate(*args, **kwargs):
    """``F.interpolate``; 4-D input in a CANN mode runs ``mmseg_cann.ops.upsample``."""
    from mmseg_cann import ops
    mode = _arg(args, kwargs, 3, 'mode', 'nearest')
    covered = (_is_input(_arg(args, kwargs, 0, 'input'), UPSAMPLE_RANKS)
               and isinstance(mode, str) and mode in _upsample_modes())
    return _dispatch('interpolate', covered, lambda: ops.upsample(*args, **kwargs),
                     args, kwargs)


def max_pool2d(*args, **kwargs):
    """``F.max_pool2d``; 3-D/4-D input runs ``mmseg_cann.ops.max_pool2d``."""
    from mmseg_cann import ops
    covered = _is_input(_arg(args, kwargs, 0, 'input'), POOL_RANKS)
    return _dispatch('max_pool2d', covered, lambda: ops.max_pool2d(*args, **kwargs),
                     args, kwargs)


def max_pool2d_with_indices(*args, **kwargs):
    """``F.max_pool2d_with_indices`` (always returns indices); 3-D/4-D input runs
    ``mmseg_cann.ops.max_pool2d(..., return_indices=True)``."""
    from mmseg_cann import ops
    try:
        bound = inspect.signature(_ORIGINALS['F.max_pool2d_with_indices']).bind(*args, **kwargs)
    except TypeError:
        bound = None
    covered = bound is not None and _is_input(bound.arguments.get('input'), POOL_RANKS)

    def ours():
        bound.apply_defaults()
        a = bound.arguments
        return ops.max_pool2d(a['input'], a['kernel_size'], a['stride'], a['padding'],
                              a['dilation'], a['ceil_mode'], True)
    return _dispatch('max_pool2d_with_indices', covered, ours, args, kwargs)


def avg_pool2d(*args, **kwargs):
    """``F.avg_pool2d``; 3-D/4-D input runs ``mmseg_cann.ops.avg_pool2d``."""
    from mmseg_cann import ops
    covered = _is_input(_arg(args, kwargs, 0, 'input'), POOL_RANKS)
    return _dispatch('avg_pool2d', covered, lambda: ops.avg_pool2d(*args, **kwargs),
                     args, kwargs)


def adaptive_avg_pool2d(*args, **kwargs):
    """``F.adaptive_avg_pool2d``; 3-D/4-D input runs ``mmseg_cann.ops.adaptive_avg_pool2d``."""
    from mmseg_cann import ops
    covered = _is_input(_arg(args, kwargs, 0, 'input'), POOL_RANKS)
    return _dispatch('adaptive_avg_pool2d', covered,
                     lambda: ops.adaptive_avg_pool2d(*args, **kwargs), args, kwargs)


def _routed_module(cann_cls, name, ranks):
    """A subclass of ``cann_cls`` whose calls on other input ranks run ``nn.<name>``'s
    original ``forward``. Its repr shows the CANN name, as a converted model's would."""
    original = getattr(nn, name)

    def forward(self, input):
        if not _nested() and _is_input(input, ranks):
            COUNTS['routed', name] += 1
            with _ours():
                return cann_cls.forward(self, input)
        if not _nested():
            COUNTS['native', name] += 1
        return original.forward(self, input)

    cls = type('Routed' + name, (cann_cls,), {'forward': forward, '__module__': __name__})
    cls.__name__ = cann_cls.__name__
    return cls


def _build_modules() -> dict:
    """The routed module classes, built from the CANN modules importable now."""
    from mmseg_cann.models import (CANNAdaptiveAvgPool2d, CANNAvgPool2d, CANNMaxPool2d,
                                   CANNUpsample)
    upsample = _routed_module(CANNUpsample, 'Upsample', UPSAMPLE_RANKS)
    original_upsample = nn.Upsample

    def new_upsample(cls, *args, **kwargs):
        mode = _arg(args, kwargs, 2, 'mode', 'nearest')
        if cls is upsample and not (isinstance(mode, str) and mode in _upsample_modes()):
            return original_upsample(*args, **kwargs)
        return object.__new__(cls)
    upsample.__new__ = staticmethod(new_upsample)

    def fixed_mode(name, **mode):
        def __init__(self, size=None, scale_factor=None):
            upsample.__init__(self, size, scale_factor, **mode)
        cls = type('Routed' + name, (upsample,), {'__init__': __init__, '__module__': __name__})
        cls.__name__ = CANNUpsample.__name__
        return cls

    return {'Upsample': upsample,
            'UpsamplingNearest2d': fixed_mode('UpsamplingNearest2d', mode='nearest'),
            'UpsamplingBilinear2d': fixed_mode('UpsamplingBilinear2d', mode='bilinear',
                                               align_corners=True),
            'MaxPool2d': _routed_module(CANNMaxPool2d, 'MaxPool2d', POOL_RANKS),
            'AvgPool2d': _routed_module(CANNAvgPool2d, 'AvgPool2d', POOL_RANKS),
            'AdaptiveAvgPool2d': _routed_module(CANNAdaptiveAvgPool2d, 'AdaptiveAvgPool2d',
                                                POOL_RANKS)}


def installed() -> bool:
    """Whether :func:`install` is in effect."""
    return bool(_ORIGINALS)


def install() -> None:
    """Replace the names listed in the module docstring (idempotent)."""
    if installed():
        return
    import mmseg_cann.models  # noqa: F401  (the CANN classes subclass torch's originals)
    for name in FUNCTIONAL_NAMES:
        _ORIGINALS['F.' + name] = getattr(F, name)
    for name in MODULE_NAMES:
        _ORIGINALS['nn.' + name] = getattr(nn, name)
    modules = _build_modules()
    globals().update({cls.__qualname__: cls for cls in modules.values()})
    for name in FUNCTIONAL_NAMES:
        setattr(F, name, globals()[name])
    for name, cls in modules.items():
        setattr(nn, name, cls)


def uninstall() -> None:
    """Put torch's originals back."""
    for key, value in _ORIGINALS.items():
        owner, name = key.split('.', 1)
        setattr(F if owner == 'F' else nn, name, value)
    _ORIGINALS.clear()


# --- pytest plugin -------------------------------------------------------------------------

_RECORD: dict = {'tests': {}, 'collect_errors': {}}


def pytest_addoption(parser):
    group = parser.getgroup('torch-compat', 'mmseg_cann drop-in check')
    group.addoption('--torch-compat', choices=('plain', 'patched'), default='plain',
                    help='patched: route torch 2-D pooling/upsampling to mmseg_cann')
    group.addoption('--torch-compat-record', default=None, metavar='PATH',
                    help='write outcomes to PATH.<pid>.json')
    group.addoption('--torch-compat-match', action='append', default=[], metavar='FILE=REGEX',
                    help='in FILE run only tests whose name matches REGEX (repeatable)')


def pytest_configure(config):
    if config.getoption('--torch-compat') == 'patched':
        install()


def pytest_unconfigure(config):
    uninstall()


def _is_cuda_test(name: str) -> bool:
    return 'cuda' in name.lower() and '_cpu' not in name


def select(items, rules):
    """Split ``items`` (objects with ``name`` and ``fspath``/``path``) into (kept,
    deselected): CUDA-named tests are dropped; in a file with a rule only the names
    matching it are kept. ``rules`` maps a file name to a compiled regex."""
    kept, dropped = [], []
    for item in items:
        path = getattr(item, 'path', None) or getattr(item, 'fspath', '')
        rule = rules.get(os.path.basename(str(path)))
        ok = not _is_cuda_test(item.name) and (rule is None or rule.search(item.name))
        (kept if ok else dropped).append(item)
    return kept, dropped


def pytest_collection_modifyitems(session, config, items):
    rules = {}
    for spec in config.getoption('--torch-compat-match'):
        file, _, regex = spec.partition('=')
        rules[file] = re.compile(regex)
    kept, dropped = select(items, rules)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def pytest_runtest_setup(item):
    COUNTS.clear()


def pytest_runtest_teardown(item, nextitem):
    routed = sum(n for (kind, _), n in COUNTS.items() if kind == 'routed')
    entry = _RECORD['tests'].setdefault(item.nodeid, {})
    entry['routed'] = routed


def error_line(longrepr) -> str:
    """The first line of a failure: ``ExceptionType: message``."""
    crash = getattr(longrepr, 'reprcrash', None)
    text = crash.message if crash is not None else str(longrepr or '')
    lines = text.strip().splitlines()
    return lines[0].strip() if lines else ''


_RANK = {'passed': 0, 'xpassed': 1, 'skipped': 2, 'xfailed': 2, 'failed': 3, 'error': 3}


def outcome_of(report) -> tuple:
    """(outcome, error line) of one setup/call/teardown report."""
    xfail = hasattr(report, 'wasxfail')
    if report.passed:
        return ('xpassed' if xfail else 'passed'), ''
    if report.skipped:
        return ('xfailed' if xfail else 'skipped'), ''
    kind = 'failed' if report.when == 'call' else 'error'
    return kind, error_line(report.longrepr)


def pytest_runtest_logreport(report):
    outcome, error = outcome_of(report)
    if report.when != 'call' and outcome == 'passed':
        outcome = None
    entry = _RECORD['tests'].setdefault(report.nodeid, {})
    if outcome and _RANK[outcome] >= _RANK.get(entry.get('outcome'), -1):
        entry['outcome'], entry['error'] = outcome, error


def pytest_collectreport(report):
    if report.failed:
        _RECORD['collect_errors'][report.nodeid] = error_line(report.longrepr)


def pytest_sessionfinish(session):
    path = session.config.getoption('--torch-compat-record')
    if path:
        with open(f'{path}.{os.getpid()}.json', 'w') as f:
            json.dump(_RECORD, f)


# --- comparison ----------------------------------------------------------------------------

def load_record(path: str) -> dict:
    """Merge the ``PATH.<pid>.json`` files of one run (controller and workers)."""
    folder, base = os.path.split(os.path.abspath(path))
    merged = {'tests': {}, 'collect_errors': {}}
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else ():
        if not (name.startswith(base + '.') and name.endswith('.json')):
            continue
        with open(os.path.join(folder, name)) as f:
            part = json.load(f)
        merged['collect_errors'].update(part['collect_errors'])
        for nodeid, entry in part['tests'].items():
            into = merged['tests'].setdefault(nodeid, {})
            if 'outcome' in entry:
                into.update(outcome=entry['outcome'], error=entry.get('error', ''))
            if entry.get('routed'):
                into['routed'] = max(into.get('routed', 0), entry['routed'])
    return merged


def cause(entry: dict | None, collect_errors: dict) -> str:
    """A test's cause of failure for grouping: outcome and first error line, digits
    replaced by ``#``."""
    if not entry or 'outcome' not in entry:
        first = next(iter(collect_errors.values()), '') if collect_errors else ''
        return 'not run' + (f' (collection error: {first})' if first else '')
    text = entry['outcome'] + (': ' + entry['error'] if entry.get('error') else '')
    return re.sub(r'\d+', '#', text)


def compare(plain: dict, patched: dict, examples: int = 5) -> dict:
    """Figures of a plain and a patched record: tests selected, passing on plain torch,
    changed when patched (grouped by cause, most frequent first), routed calls."""
    p_tests, q_tests = plain['tests'], patched['tests']
    selected = sorted(nodeid for nodeid, e in {**q_tests, **p_tests}.items()
                      if 'outcome' in p_tests.get(nodeid, {}) or 'outcome' in e)
    passing = [t for t in selected if p_tests.get(t, {}).get('outcome') == 'passed']
    changed = [t for t in passing if q_tests.get(t, {}).get('outcome') != 'passed']
    groups = collections.defaultdict(list)
    for t in changed:
        groups[cause(q_tests.get(t), patched['collect_errors'])].append(t)
    passing_set = set(passing)
    other = [t for t in selected if t not in passing_set
             and p_tests.get(t, {}).get('outcome') != q_tests.get(t, {}).get('outcome')]
    return {
        'selected': len(selected),
        'plain_outcomes': dict(collections.Counter(
            p_tests.get(t, {}).get('outcome', 'not run') for t in selected)),
        'passing_plain': len(passing),
        'changed': len(changed),
        'unchanged_passing': len(passing) - len(changed),
        'tests_routing': sum(1 for t in passing if q_tests.get(t, {}).get('routed')),
        'routed_calls': sum(q_tests.get(t, {}).get('routed', 0) for t in passing),
        'causes': [{'cause': key, 'count': len(names), 'examples': names[:examples],
                    'first_error': (q_tests.get(names[0]) or {}).get('error', '')}
                   for key, names in sorted(groups.items(), key=lambda kv: -len(kv[1]))],
        'changed_tests': changed,
        'other_changes': {t: [p_tests.get(t, {}).get('outcome'), q_tests.get(t, {}).get('outcome')]
                          for t in other},
        'collect_errors': {'plain': plain['collect_errors'],
                           'patched': patched['collect_errors']},
    }
