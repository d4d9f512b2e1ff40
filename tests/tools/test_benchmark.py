"""tools/benchmark.py: the smoke case set runs end to end and reports every column."""
from __future__ import annotations

import json

import pytest

from tests._helpers import run_python

from .conftest import import_tool


@pytest.mark.slow
def test_benchmark_smoke_cases(tmp_path):
    out = tmp_path / 'bench.json'
    result = run_python(['tools/benchmark.py', '--cases', 'smoke', '--repeats', '1',
                         '--no-compile', '--json', str(out)], timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data['device'] == 'cpu' and data['copy_gb_s'] > 0
    by_case = {}
    for row in data['rows']:
        by_case.setdefault(row['case'], []).append(row['impl'])
        assert row['ms'] > 0 and row['peak_extra_mb'] >= 0 and row['time_ratio'] > 0
    fused = ['eager', 'mmseg_cann native', 'mmseg_cann fused', 'mmseg_cann fused, torch paths']
    assert by_case['smoke_upsample_argmax'] == fused
    assert by_case['smoke_upsample_add'] == fused
    assert set(by_case) == {'smoke_bilinear2x', 'smoke_upsample_add', 'smoke_upsample_argmax',
                            'smoke_maxpool'}
    table = result.stdout
    assert '| case | implementation | median ms | x eager |' in table
    assert 'smoke_upsample_argmax | mmseg_cann fused' in table


def test_numba_workspace_is_counted_as_peak_memory(monkeypatch):
    """The argmax kernel's per-thread buffers are torch tensors: the CPU memory
    measurement sees them (2 x C x W float32 values per thread at least)."""
    import torch
    from mmseg_cann.backends import numba_cpu
    from mmseg_cann.ops.fused import upsample_argmax
    if not numba_cpu.available():
        pytest.skip('numba is not installed')
    bench = import_tool(monkeypatch, 'benchmark')
    x = torch.randn(1, 50, 16, 16)
    peak = bench.peak_extra_bytes(lambda t: upsample_argmax(t, (128, 512)), (x,),
                                  torch.device('cpu'))
    assert peak >= 2 * 50 * 512 * 4


def test_benchmark_rejects_unknown_case():
    result = run_python(['tools/benchmark.py', '--cases', 'nope'])
    assert result.returncode == 2 and "unknown case 'nope'" in result.stderr


def test_peak_extra_bytes_counts_temporaries_not_the_result(monkeypatch):
    import torch
    bench = import_tool(monkeypatch, 'benchmark')
    device = torch.device('cpu')
    x = torch.ones(1 << 18)  # 1 MiB

    def with_temporary(t):
        tmp = t * 2          # 1 MiB temporary
        return (tmp + 1).sum()

    assert bench.peak_extra_bytes(lambda t: t * 2, (x,), device) < (1 << 16)
    assert bench.peak_extra_bytes(with_temporary, (x,), device) >= (1 << 20)


def test_interleaved_times_alternate_the_implementations(monkeypatch):
    """Whole-model cases time their implementations round by round: one warm-up call
    each, then a, b, a, b, ... (a drift of the machine's speed reaches both)."""
    import torch
    bench = import_tool(monkeypatch, 'benchmark')
    calls = []
    fns = {'a': lambda: calls.append('a'), 'b': lambda: calls.append('b')}
    medians = bench.interleaved_times(fns, (), torch.device('cpu'), 3)
    assert calls == ['a', 'b'] * 4
    assert set(medians) == {'a', 'b'} and all(v >= 0 for v in medians.values())
    assert bench.CASES['resize_conv_segformer_b0_512'].interleave


def test_mac_count_separates_attention_products(monkeypatch):
    """tools/_bench_resize_conv.py counts layers (convolutions, linear layers, the
    rewrite's matrix products) and the attention's own products apart, from formulas:
    a 1x1 convolution, and self-attention over L tokens of width E (projections 4 L E^2,
    scores and weighted sum 2 L^2 E)."""
    import torch
    counter = import_tool(monkeypatch, '_bench_resize_conv')

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 8, 1)
            self.attn = torch.nn.MultiheadAttention(8, 2)

        def forward(self, x):
            t = self.conv(x).flatten(2).permute(2, 0, 1)  # (L, N, E)
            return self.attn(t, t, t)[0]

    model = Model().eval()
    x = torch.randn(1, 3, 4, 5)
    length, width = 20, 8
    macs = counter.count_macs(model, model, x)
    assert macs['layers'] == 3 * 8 * length + 4 * length * width * width
    assert macs['attention'] == 2 * length * length * width
