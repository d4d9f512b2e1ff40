"""``tools/check_parity.py`` end to end, as a user runs it."""
import json

from tests._helpers import run_python


def test_cli_quick_run_writes_json(tmp_path):
    out = tmp_path / 'parity.json'
    result = run_python(['tools/check_parity.py', '--quick', '--dtype', 'float32', 'float16',
                         '--json', str(out), '--failures-only'])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert 'PARITY OK' in result.stdout
    data = json.loads(out.read_text())
    assert data['summary']['failed'] == 0 and data['summary']['total'] > 100
    assert {r['dtype'] for r in data['results']} == {'float32', 'float16'}


def test_cli_rejects_missing_devices():
    result = run_python(['tools/check_parity.py', '--device', 'npu', '--quick'])
    assert result.returncode != 0
    assert 'torch_npu' in (result.stdout + result.stderr)


def test_cli_shows_plans_for_an_assumed_chip(tmp_path):
    out = tmp_path / 'parity.json'
    result = run_python(['tools/check_parity.py', '--quick', '--dtype', 'float32',
                         '--assume-chip', 'A2', '--json', str(out)])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    header = result.stdout.splitlines()[0].split()
    assert 'plan' in header
    plans = [r['plan'] for r in json.loads(out.read_text())['results']]
    assert all(plans)
    assert any('scales (2.0, 2.0) are excluded' in p for p in plans)  # 1x1 -> 2x2 bilinear
    assert any(p.startswith('mean') for p in plans)      # adaptive pooling to 1x1
    assert any('aclnnMaxPool2dWithMask' in p for p in plans)  # what max_pool2d runs on A2


def test_cli_trace_needs_the_npu():
    result = run_python(['tools/check_parity.py', '--quick', '--trace'])
    assert result.returncode != 0
    assert '--trace needs --device npu' in result.stderr


def test_cpu_table_has_no_plan_column():
    import torch
    from mmseg_cann.analysis import parity
    cases = parity.build_cases(quick=True)[:3]
    table = parity.format_table(parity.run_all(cases, torch.device('cpu'), [torch.float32]))
    assert 'plan' not in table.splitlines()[0].split()
    with_plans = parity.run_all(cases, torch.device('cpu'), [torch.float32],
                                plan_fn=lambda case, x: 'native -> aten')
    assert 'plan' in parity.format_table(with_plans).splitlines()[0].split()
