#!/usr/bin/env python
"""Run PyTorch's own pooling/upsampling tests on plain torch and with mmseg_cann routed in.

    python tools/torch_compat.py --tests PYTORCH/test

runs ``nn/test_pooling.py`` (all tests) and the upsampling/interpolate tests of
``test_nn.py`` (names matching ``upsampl|interpolat``, any case) twice on CPU: once on
plain torch, once with torch's 2-D pooling/upsampling functions and modules replaced by
mmseg_cann's (the calls routed are listed in mmseg_cann/analysis/torch_compat.py and
docs/compatibility.md). It prints the tests selected, those passing on plain torch, those
whose outcome changes when patched grouped by cause, and writes a JSON.

The test files are not in the torch wheel: take them from a PyTorch source checkout of
the installed torch's version (``git checkout v<version>``; ``--tests`` is its ``test/``
folder). They import ``torch.testing._internal``, which needs ``expecttest`` and
``hypothesis``. ``--mmseg-cann ROOT`` measures the ``mmseg_cann`` package under ROOT
(another checkout) instead of this checkout's.
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import importlib.util
import json
import os
import os.path as osp
import re
import shlex
import shutil
import subprocess
import sys
import time

from _common import UserError, add_debug, run

#: the checkout this script sits in (in an installed package it sits in mmseg_cann/.mim)
PLUGIN_NAME = '_torch_compat_plugin'
DEFAULT_FILES = ('nn/test_pooling.py', 'test_nn.py')
DEFAULT_MATCH = ('test_nn.py=(?i)upsampl|interpolat',)
NEEDED = ('pytest',)
INI = '[pytest]\naddopts =\npython_files = test_*.py\n'


def _tests_dir(path: str, files) -> str:
    for candidate in (path, osp.join(path, 'test')):
        if all(osp.isfile(osp.join(candidate, f)) for f in files):
            return osp.abspath(candidate)
    missing = [f for f in files if not osp.isfile(osp.join(path, f))]
    raise UserError(f'--tests {path!r} lacks {", ".join(missing)}: give the test/ folder of '
                    'a PyTorch source checkout (see docs/compatibility.md)')


def _analysis():
    """``mmseg_cann.analysis.torch_compat`` of the installed package (this checkout's,
    with the editable install)."""
    from mmseg_cann.analysis import torch_compat
    return torch_compat


def _mmseg_root(given: str | None, analysis) -> str:
    """The folder whose ``mmseg_cann`` the patched run imports."""
    if not given:
        return osp.dirname(osp.dirname(osp.dirname(osp.abspath(analysis.__file__))))
    if not osp.isfile(osp.join(given, 'mmseg_cann', '__init__.py')):
        raise UserError(f'--mmseg-cann {given!r} has no mmseg_cann/__init__.py')
    return osp.abspath(given)


def _check_packages(workers: int) -> None:
    needed = NEEDED + (('xdist',) if workers > 1 else ())
    missing = [{'xdist': 'pytest-xdist'}.get(m, m) for m in needed
               if importlib.util.find_spec(m) is None]
    if missing:
        raise UserError(f'needs {", ".join(missing)} (pip install {" ".join(missing)})')


def _check_collection(record: dict) -> None:
    """UserError for a test file that cannot be imported for a missing package (PyTorch's
    tests import expecttest and hypothesis through torch.testing._internal)."""
    for nodeid, error in record['collect_errors'].items():
        found = re.search(r"No module named '([\w.]+)'", error)
        if found:
            package = found.group(1).split('.')[0]
            raise UserError(f'{nodeid} cannot be imported: {error} '
                            f'(pip install {package})')


def _sha(path: str) -> str:
    with open(path, 'rb') as f:
        return hashlib.sha256(f.read()).hexdigest()[:12]


def _prepare(work: str, plugin_source: str) -> str:
    """The plugin copy and the pytest ini under ``work``; returns the plugin folder."""
    plugin_dir = osp.join(work, 'plugin')
    os.makedirs(plugin_dir, exist_ok=True)
    shutil.copyfile(plugin_source, osp.join(plugin_dir, PLUGIN_NAME + '.py'))
    with open(osp.join(work, 'pytest.ini'), 'w') as f:
        f.write(INI)
    return plugin_dir


def run_pytest(mode: str, tests: str, files, match, work: str, mmseg_root: str,
               plugin_source: str, workers: int, extra) -> tuple:
    """Run the selected tests once in ``mode`` ('plain' or 'patched') with a copy of
    ``plugin_source`` as the pytest plugin; returns (record path, exit code, seconds).
    The log goes to ``work/MODE.log``."""
    record = osp.join(work, 'records', mode)
    os.makedirs(osp.dirname(record), exist_ok=True)
    for name in os.listdir(osp.dirname(record)):
        if name.startswith(mode + '.'):
            os.remove(osp.join(osp.dirname(record), name))
    plugin_dir = _prepare(work, plugin_source)
    cmd = [sys.executable, '-m', 'pytest', '-c', osp.join(work, 'pytest.ini'),
           '--rootdir', tests, '-p', 'no:cacheprovider', '-p', PLUGIN_NAME,
           f'--torch-compat={mode}', f'--torch-compat-record={record}', '-q', '-rN']
    cmd += [f'--torch-compat-match={m}' for m in match]
    if workers > 1:
        cmd += ['-n', str(workers)]
    cmd += list(extra) + [osp.join(tests, f) for f in files]
    env = dict(os.environ, CUDA_VISIBLE_DEVICES='', PYTORCH_TESTING_DEVICE_ONLY_FOR='cpu',
               PYTHONDONTWRITEBYTECODE='1',
               PYTHONPATH=os.pathsep.join([plugin_dir, mmseg_root]
                                          + [p for p in [os.environ.get('PYTHONPATH')] if p]))
    start = time.time()
    with open(osp.join(work, mode + '.log'), 'w') as log:
        log.write(' '.join(shlex.quote(c) for c in cmd) + '\n')
        log.flush()
        code = subprocess.call(cmd, cwd=tests, env=env, stdout=log, stderr=subprocess.STDOUT)
    return record, code, time.time() - start


def _log_tail(work: str, mode: str, lines: int = 15) -> str:
    with open(osp.join(work, mode + '.log')) as f:
        return ''.join(f.readlines()[-lines:])


def format_summary(result: dict, examples: int) -> str:
    """The printed report of :func:`mmseg_cann.analysis.torch_compat.compare`'s figures."""
    plain = ', '.join(f'{n} {k}' for k, n in sorted(result['plain_outcomes'].items()))
    out = [f'tests selected:               {result["selected"]} (plain torch: {plain})',
           f'passing on plain torch:       {result["passing_plain"]}',
           f'changed outcome when patched: {result["changed"]} of {result["passing_plain"]}',
           f'routed calls (passing tests): {result["routed_calls"]} in '
           f'{result["tests_routing"]} tests']
    if result['causes']:
        out.append('causes (most frequent first):')
    for group in result['causes']:
        out.append(f'  {group["count"]:5d}  {group["cause"]}')
        for name in group['examples'][:examples]:
            out.append(f'         {name}')
    if result['other_changes']:
        out.append(f'other outcome changes (tests not passing on plain torch): '
                   f'{len(result["other_changes"])}')
    for mode, errors in result['collect_errors'].items():
        for nodeid, error in errors.items():
            out.append(f'collection error ({mode}): {nodeid}: {error}')
    return '\n'.join(out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--tests', required=True, metavar='DIR',
                        help="a PyTorch checkout's test/ folder (or the checkout)")
    parser.add_argument('--file', action='append', metavar='PATH',
                        help=f'test file under DIR (repeatable; default: {DEFAULT_FILES})')
    parser.add_argument('--match', action='append', metavar='FILE=REGEX',
                        help='in FILE run only tests whose name matches REGEX (repeatable; '
                             f'default: {DEFAULT_MATCH})')
    parser.add_argument('--mmseg-cann', metavar='ROOT',
                        help='folder holding the mmseg_cann package to measure '
                             '(default: this checkout)')
    parser.add_argument('--workers', type=int, default=None,
                        help='pytest-xdist workers (default: 2 with pytest-xdist, else 1)')
    parser.add_argument('--work', default=osp.join('.cache', 'torch-compat'),
                        help='folder for logs and records (default: %(default)s)')
    parser.add_argument('--out', help='JSON result (default: WORK/result.json)')
    parser.add_argument('--skip-plain', action='store_true',
                        help='reuse the plain-torch record of the previous run in WORK')
    parser.add_argument('--pytest-args', default='', help='extra pytest arguments (one string)')
    parser.add_argument('--examples', type=int, default=3,
                        help='test names printed per cause (default: %(default)s)')
    add_debug(parser)
    args = parser.parse_args(argv)

    files = tuple(args.file or DEFAULT_FILES)
    match = tuple(args.match or DEFAULT_MATCH)
    for spec in match:
        if '=' not in spec:
            raise UserError(f'--match {spec!r}: expected FILE=REGEX')
    tests = _tests_dir(args.tests, files)
    torch_compat = _analysis()
    mmseg_root = _mmseg_root(args.mmseg_cann, torch_compat)
    workers = args.workers or (2 if importlib.util.find_spec('xdist') else 1)
    if workers < 1:
        raise UserError(f'--workers must be at least 1, got {workers}')
    _check_packages(workers)
    work = osp.abspath(args.work)
    os.makedirs(work, exist_ok=True)
    out_path = args.out or osp.join(work, 'result.json')

    import torch

    runs = {}
    for mode in ('plain', 'patched'):
        if mode == 'plain' and args.skip_plain:
            record = osp.join(work, 'records', 'plain')
            if not torch_compat.load_record(record)['tests']:
                raise UserError(f'--skip-plain: no plain record in {work}')
            runs[mode] = {'record': record, 'exit_code': None, 'seconds': 0.0}
            continue
        print(f'running {mode} ... (log: {osp.join(work, mode + ".log")})', flush=True)
        record, code, seconds = run_pytest(mode, tests, files, match, work, mmseg_root,
                                           torch_compat.__file__, workers,
                                           shlex.split(args.pytest_args))
        _check_collection(torch_compat.load_record(record))
        if code not in (0, 1):
            raise UserError(f'pytest ({mode}) exited {code}:\n{_log_tail(work, mode)}')
        runs[mode] = {'record': record, 'exit_code': code, 'seconds': round(seconds, 1)}

    plain = torch_compat.load_record(runs['plain']['record'])
    patched = torch_compat.load_record(runs['patched']['record'])
    result = torch_compat.compare(plain, patched, examples=max(args.examples, 10))
    meta = {'date': datetime.datetime.now().isoformat(timespec='seconds'),
            'torch': torch.__version__, 'torch_git': torch.version.git_version,
            'tests_dir': tests, 'files': {f: _sha(osp.join(tests, f)) for f in files},
            'match': list(match), 'mmseg_cann_root': mmseg_root, 'workers': workers,
            'runs': runs}
    print(f'torch {torch.__version__}; mmseg_cann from {mmseg_root}; tests in {tests} '
          f'({", ".join(f"{f} {h}" for f, h in meta["files"].items())})')
    print(format_summary(result, args.examples))
    with open(out_path, 'w') as f:
        json.dump({'meta': meta, **result}, f, indent=1)
    print(f'written: {out_path}')
    return 0


if __name__ == '__main__':
    sys.exit(run(main, 'torch_compat'))
