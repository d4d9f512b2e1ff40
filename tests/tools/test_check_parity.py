"""``tools/check_parity.py`` end to end, as a user runs it."""
import json

from ..conftest import run_python


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
