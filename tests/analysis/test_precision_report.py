"""The precision report: its table and the emulated fp16-accumulating kernel."""
import torch

from mmseg_cann.core import reference as ref
from mmseg_cann.analysis import precision_report as report

from tests._helpers import run_python


def test_ulp_matches_dtype_spacing():
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        for value in (1.0, 3.0, 100.0, 1000.0, 0.01):
            v = torch.tensor(value, dtype=dtype)
            spacing = float(torch.nextafter(v, torch.tensor(float('inf'), dtype=dtype)) - v)
            assert float(report.ulp(v.double(), dtype)) == spacing


def test_emulated_fp16_accumulation_matches_a_sequential_fp16_sum():
    gen = torch.Generator().manual_seed(0)  # a draw whose fp16 running sum rounds
    x = (torch.rand(1, 1, 4, 4, dtype=torch.float64, generator=gen) + 50).half()
    got = report.fp16_accumulating_avg_pool(x, (4, 4), (4, 4))
    acc = torch.tensor(0.0, dtype=torch.float16)
    for value in x.flatten():  # row-major, one rounding per addition
        acc = (acc.float() + value.float()).half()
    weight = torch.tensor(1 / 16, dtype=torch.float16).float()
    assert float(got) == float((acc.float() * weight).half())
    assert abs(float(got) - float(ref.avg_pool2d(x.double(), 4))) > 0


def test_rows_cover_every_setting_and_the_conclusion_holds():
    rows = report.build_rows(height=16, width=32, channels=2)
    settings = {r.setting for r in rows}
    assert settings == set(report.POLICY_VALUES) | {report.EMULATED}
    for r in rows:
        if r.setting == 'fp32' and r.op != 'upsample':
            assert r.max_ulp_err <= 1.0, r  # fp32 averaging: within one ulp
        if r.op == 'max_pool2d' and r.setting in ('input', 'fp32'):
            assert r.max_abs_err == 0.0
    table = report.format_markdown(rows)
    assert table.splitlines()[0].startswith('| op | case | input |')


def test_cli(tmp_path):
    out_md, out_json = tmp_path / 'p.md', tmp_path / 'p.json'
    result = run_python(['tools/precision_report.py', '--height', '16', '--width', '32',
                         '--markdown', str(out_md), '--json', str(out_json)])
    assert result.returncode == 0, result.stderr
    assert out_md.read_text().startswith('| op |') and out_json.stat().st_size > 100
