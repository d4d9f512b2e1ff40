"""The triton-ascend compile check (``tools/ascend_check.py``) in the side virtualenv
``.venv-ascend``: every recorded kernel variant compiles for the Ascend 910B3 through
the ``ttadapter`` stage, and its loads and stores lower to block accesses (no
element-at-a-time ``ExtractedLoadOrStore`` loops on the main path, at most two
elsewhere).

Skipped, with the recorded reason, where ``make`` could not install triton-ascend
(``.venv-ascend/install-failed.txt``), or where the virtualenv was not made (``make
side-envs``; ``make test`` makes it). The check runs in the background from the start of
the session (tests/_compile_checks.py).
"""
from __future__ import annotations

import os
import subprocess

import pytest

from tests import _compile_checks

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PYTHON = _compile_checks.ASCEND_PYTHON
skip_reason = _compile_checks.ascend_skip_reason


@pytest.fixture(scope='module')
def report(compile_check):
    """The check's JSON report (the check started in the background when the session
    began, tests/_compile_checks.py), with its exit status and output."""
    reason = skip_reason()
    if reason is not None:
        pytest.skip(reason)
    proc, data = compile_check('ascend')
    assert data is not None, proc.stdout[-3000:] + proc.stderr[-3000:]
    data['returncode'], data['stdout'] = proc.returncode, proc.stdout
    return data


#: what an NPU launches for every case of the list: the row kernels
KERNELS = {'upsample_fwd_rows_kernel', 'upsample_argmax_rows_kernel',
           'bilinear_bwd_rows_kernel', 'max_pool_rows_kernel', 'avg_pool_rows_kernel'}


@pytest.mark.slow
def test_every_variant_compiles_for_ascend(report):
    failed = [f"{r['kernel']} [{r['meta']}] {r['case']}: {r['error']}"
              for r in report['results'] if r['error'] is not None]
    assert not failed, '\n'.join(failed)
    assert {row['kernel'] for row in report['summary']} == KERNELS
    assert report['target'] == 'npu:Ascend910B3' and report['triton'].startswith('3.2')


@pytest.mark.slow
def test_size_one_inputs_and_one_pixel_outputs_compile(report):
    """Width-1 and height-1 inputs and 1x1 outputs reach every kernel (each size
    specialised to a constant where it is 1) and compile."""
    def cases(kernel, text):
        return [r for r in report['results']
                if r['kernel'] == kernel and any(text in c for c in r['cases'])]
    for kernel in KERNELS:
        pool = 'pool' in kernel
        for text in ((', 9, 1)', ', 1, 9)', ', 1, 1)') if pool
                     else ('5, 1)->', ', 1, 5)->', '->(1, 1)')):
            found = cases(kernel, text)
            if kernel == 'bilinear_bwd_rows_kernel' and text == '->(1, 1)':
                found = cases(kernel, '(1, 1, 1, 1)->')  # a 1x1 input
            assert found, (kernel, text)
            assert all(r['error'] is None for r in found), found


@pytest.mark.slow
def test_main_path_variants_have_no_discrete_access(report):
    """NCHW 2x upsampling (forward, add, argmax) and k3s2p1 / k2s2 pooling: every load
    and store is a block access."""
    main = [r for r in report['results'] if r['main']]
    assert {r['kernel'] for r in main} == KERNELS - {'bilinear_bwd_rows_kernel'}
    loops = [f"{r['kernel']} [{r['meta']}] {r['case']}: {r['discrete_loops']}"
             for r in main if r['discrete_loops'] != 0]
    assert not loops, '\n'.join(loops)


@pytest.mark.slow
def test_other_variants_have_at_most_two_discrete_loops(report):
    over = [f"{r['kernel']} [{r['meta']}] {r['case']}: {r['discrete_loops']}"
            for r in report['results'] if not r['main'] and r['error'] is None
            and r['discrete_loops'] > 2]
    assert not over, '\n'.join(over)
    assert report['returncode'] == 0 and report['ok'], report['stdout'][-3000:]


def test_skip_reason_reads_the_recorded_pip_error(tmp_path, monkeypatch):
    """A failed install is a skip carrying pip's last lines, never a failure."""
    failed = tmp_path / 'install-failed.txt'
    failed.write_text('Collecting triton-ascend==3.2.0\nERROR: No matching distribution '
                      'found for triton-ascend==3.2.0\nexit status 1\n')
    monkeypatch.setattr(_compile_checks, 'ASCEND_FAILED', str(failed))
    reason = skip_reason()
    assert reason.startswith('triton-ascend could not be installed')
    assert 'No matching distribution' in reason and 'exit status 1' in reason
    monkeypatch.setattr(_compile_checks, 'ASCEND_FAILED', str(tmp_path / 'absent'))
    monkeypatch.setattr(_compile_checks, 'ASCEND_STAMP', str(tmp_path / 'absent'))
    assert skip_reason() == '.venv-ascend is not made (make side-envs)'


def test_root_that_is_not_a_source_tree_is_a_usage_error(tmp_path):
    reason = skip_reason()
    if reason is not None:
        pytest.skip(reason)
    proc = subprocess.run([PYTHON, os.path.join(REPO, 'tools', 'ascend_check.py'),
                           '--root', str(tmp_path)], capture_output=True, text=True,
                          cwd=REPO, timeout=120)
    assert proc.returncode == 2 and 'not an mmseg-cann source tree' in proc.stderr
