"""tools/device_check.py: the ahead-of-time compile check of every Triton kernel variant
(sm_90 and gfx942, no GPU needed) and the device measurements' skip without a device.

The check compiles 1,256 variants, minutes on 2 cores the first time and seconds later
(Triton's on-disk cache, ``TRITON_CACHE_DIR``, keyed by the kernel source hash and the
variant); it runs in the background from the start of the session
(tests/_compile_checks.py)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests._helpers import REPO_ROOT

pytest.importorskip('triton')

TOOL = os.path.join(REPO_ROOT, 'tools', 'device_check.py')
KERNELS = {'upsample_fwd_kernel', 'upsample_argmax_kernel', 'bilinear_bwd_kernel',
           'max_pool_kernel', 'avg_pool_kernel'}


def run_tool(*args, timeout=1200):
    """The tool in a fresh process without the interpreter (the kernel tests set
    TRITON_INTERPRET=1 in this one; compiled kernels need real ``@triton.jit``)."""
    env = {k: v for k, v in os.environ.items() if k != 'TRITON_INTERPRET'}
    return subprocess.run([sys.executable, TOOL, *args], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope='module')
def aot(compile_check):
    """The full check, run once (started in the background when the session began,
    tests/_compile_checks.py): ``(process, report)``."""
    proc, report = compile_check('aot')
    assert report is not None, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc, report


def test_aot_check_compiles_every_variant_without_spills(aot):
    proc, report = aot
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert report['ok']
    failed = [r for r in report['results'] if r['error'] is not None]
    spilled = [r for r in report['results'] if r['spills']]
    assert not failed and not spilled, (failed + spilled)[:3]
    compiled = {(r['target'], r['kernel']) for r in report['results']}
    assert {k for t, k in compiled if t == 'cuda:90'} == KERNELS
    # ROCm: compiled where this Triton build can, else skipped with its reason
    assert {k for t, k in compiled if t == 'hip:gfx942'} == KERNELS \
        or report['skipped'].get('hip:gfx942')
    assert '| cuda:90 | upsample_fwd_kernel |' in proc.stdout  # the table


def test_aot_check_compiles_the_int64_variants(aot):
    _, report = aot
    for kernel in KERNELS:
        metas = [r['meta'] for r in report['results']
                 if r['kernel'] == kernel and r['target'] == 'cuda:90']
        assert any('INT64=True' in m for m in metas) and any('INT64=False' in m
                                                             for m in metas), kernel


def test_avg_pool_with_divisor_override_1_compiles(aot):
    """The launch used to pass divisor_override=1 as an int, which the binder turns into
    a constant (``'int' object has no attribute 'to'``); it is a float now."""
    _, report = aot
    hits = [r for r in report['results'] if r['kernel'] == 'avg_pool_kernel'
            and "'divisor_override': 1}" in (r['case'] or '')]
    assert hits and all(r['error'] is None for r in hits)
    assert all('override=' not in r['meta'] for r in hits)  # not a constant


def test_aot_check_of_selected_cases_and_its_errors():
    proc = run_tool('--aot', '--targets', 'cuda', '--cases', 'no such case')
    assert proc.returncode != 0 and 'no case label contains' in proc.stderr
    proc = run_tool('--aot', '--workers', '0')
    assert proc.returncode == 2 and '--workers' in proc.stderr
    proc = run_tool()
    assert proc.returncode == 2 and 'one of the arguments --aot --device' in proc.stderr


def test_device_cuda_skips_cleanly_without_a_gpu():
    import torch
    if torch.cuda.is_available():
        pytest.skip('a CUDA device is present: the measurements run there')
    proc = run_tool('--device', 'cuda', timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert 'skipped: no CUDA device is available' in proc.stdout


@pytest.mark.slow
def test_device_run_end_to_end_on_cpu_under_the_interpreter(tmp_path):
    """What a GPU/NPU machine runs, on the CPU: parity, the kernel tests (interpreter),
    the benchmark, one JSON summary with the headline figures."""
    out = tmp_path / 'device.json'
    proc = run_tool('--device', 'cpu', '--quick', '--json', str(out), timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads(out.read_text())
    assert summary['ok'] and summary['parity']['failed'] == 0 and summary['parity']['total']
    assert summary['kernel_tests']['returncode'] == 0
    assert ' passed' in summary['kernel_tests']['summary']
    rows = summary['benchmark']['rows']
    assert {r['impl'] for r in rows} >= {'eager', 'mmseg_cann fused'}
    assert 'smoke_upsample_add' in summary['benchmark']['headline']
    assert 'device_check: passed' in proc.stdout


def test_device_json_records_the_skip(tmp_path):
    import torch
    if torch.cuda.is_available():
        pytest.skip('a CUDA device is present')
    out = tmp_path / 'skip.json'
    proc = run_tool('--device', 'cuda', '--json', str(out), timeout=300)
    assert proc.returncode == 0
    assert json.loads(out.read_text())['skipped'] == 'no CUDA device is available'


BROKEN = '''
import triton
import triton.language as tl


@triton.jit
def scale_kernel(x_ptr, s, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs) / s.to(tl.float32))
'''

PROBE = '''
import sys, torch
sys.path.insert(0, sys.argv[1])
import broken_kernel
from mmseg_cann.kernels import aot
for s in (3, 1):
    v = aot.bind(broken_kernel.scale_kernel, (torch.zeros(16), s), dict(BLOCK=16),
                 aot.TARGETS['cuda'])
    r = aot.compile_variant(v)
    print(s, 'ERROR' if r.error else 'OK', r.registers, (r.error or '').splitlines()[:1])
'''


def test_aot_compile_catches_what_only_a_real_launch_specialises(tmp_path):
    """An int argument equal to 1 becomes a constant in a real launch (the interpreter
    never specialises): ``s.to(...)`` then fails to compile, as ``avg_pool_kernel`` did
    with ``divisor_override=1``; the check binds like a launch and reports it."""
    (tmp_path / 'broken_kernel.py').write_text(BROKEN)
    env = {k: v for k, v in os.environ.items() if k != 'TRITON_INTERPRET'}
    proc = subprocess.run([sys.executable, '-c', PROBE, str(tmp_path)], cwd=REPO_ROOT,
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith('3 OK') and lines[1].startswith('1 ERROR'), proc.stdout


USAGE_PROBE = '''
import json, os, sys, torch
from mmseg_cann.kernels import aot
from triton.runtime.cache import get_cache_manager
v = aot.bind(aot._probe_kernel, (torch.zeros(64), 64), dict(BLOCK=64), aot.TARGETS['cuda'])
first = aot.compile_variant(v)               # cold: usage from Triton's own ptxas log
(entry,) = os.listdir(os.environ['TRITON_CACHE_DIR'])
record = os.path.join(os.environ['TRITON_CACHE_DIR'], entry, aot.USAGE_FILE)
stored = json.load(open(record))
with open(record, 'w') as f:
    json.dump([999, 7], f)
second = aot.compile_variant(v)              # cache hit: the record, no ptxas
os.remove(record)
third = aot.compile_variant(v)               # cache hit without a record: ptxas -v again
print(json.dumps(dict(first=[first.registers, first.spills], stored=stored,
                      second=[second.registers, second.spills],
                      third=[third.registers, third.spills],
                      rewritten=json.load(open(record)), errors=[first.error, third.error])))
'''


def test_cuda_usage_comes_from_tritons_ptxas_log_and_is_recorded_in_its_cache(tmp_path):
    """One ptxas run per variant: the usage is parsed from the log of Triton's own ptxas
    call and stored in the kernel's cache entry, which a cache hit reads (a planted
    record shows it is read); without a record, ptxas -v runs as before."""
    env = {k: v for k, v in os.environ.items() if k != 'TRITON_INTERPRET'}
    env['TRITON_CACHE_DIR'] = str(tmp_path / 'cache')
    proc = subprocess.run([sys.executable, '-c', USAGE_PROBE], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out['errors'] == [None, None]
    assert out['first'] == out['stored'] == out['third'] == out['rewritten']
    assert out['first'][0] > 0 and out['first'][1] == 0
    assert out['second'] == [999, 7]


def test_compile_checks_start_for_the_tests_that_read_them():
    """tests/_compile_checks.py: a check starts in the background when a selected test
    uses its fixture in its module, not for other tests of the module."""
    import types

    from tests import _compile_checks

    def item(module, *fixtures):
        return types.SimpleNamespace(path=os.path.join(REPO_ROOT, module),
                                     fixturenames=list(fixtures))
    module = _compile_checks.CHECKS['aot'].module
    assert _compile_checks.wanted([item(module, 'aot', 'tmp_path')]) == ['aot']
    assert _compile_checks.wanted([item(module, 'tmp_path'),
                                   item('tests/tools/test_infer.py', 'aot')]) == []
