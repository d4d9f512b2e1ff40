"""Errors of reduced-precision upsampling and pooling against a float64 reference.

Builds the table behind docs/precision.md (``tools/precision_report.py``):
for fp16 and bf16 inputs, each op is computed under every precision setting and, for
average pooling, by an emulated fp16-accumulating kernel (a running sum rounded to
fp16 after every addition, then multiplied by an fp16 weight ``1/(kH*kW)``, which is
what a kernel that keeps fp16 throughout produces). Errors are measured against the
float64 reference of the same (already rounded) input, in absolute terms and in units
in the last place (ulps) of the output dtype at the reference value.

Inputs carry a large common offset (``offset + U[0, 1)``) because that is where fp16
sums lose bits fastest: every partial sum is large, so every addition rounds.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Dict, List, Optional

import torch

from ..ops import adaptive_avg_pool2d, avg_pool2d, max_pool2d, upsample
from ..core import reference as ref

POLICY_VALUES = ('input', 'fp32', 'fp16', 'bf16')
EMULATED = 'fp16-accumulate (emulated)'


@dataclasses.dataclass
class Row:
    op: str
    case: str
    dtype: str
    setting: str
    max_abs_err: float
    max_ulp_err: float


MANTISSA_BITS = {torch.float16: 10, torch.bfloat16: 7, torch.float32: 23, torch.float64: 52}


def ulp(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Spacing of ``dtype`` at each (float64) value: one unit in the last place."""
    mag = values.double().abs().clamp_min(torch.finfo(dtype).smallest_normal)
    return torch.pow(2.0, torch.floor(torch.log2(mag)) - MANTISSA_BITS[dtype])


def error_in_ulps(result: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype):
    """``(max abs error, max error in ulps of dtype at the expected value)``."""
    err = (result.double() - expected).abs()
    return float(err.max()), float((err / ulp(expected, dtype)).max())


def fp16_accumulating_avg_pool(x: torch.Tensor, kernel, stride) -> torch.Tensor:
    """Average pooling that keeps fp16 throughout (emulation of an fp16 Cube path)."""
    kh, kw = kernel
    sh, sw = stride
    n, c, h, w = x.shape
    oh, ow = (h - kh) // sh + 1, (w - kw) // sw + 1
    acc = torch.zeros((n, c, oh, ow), dtype=torch.float16)
    for i in range(kh):
        for j in range(kw):
            tap = x[:, :, i:i + (oh - 1) * sh + 1:sh, j:j + (ow - 1) * sw + 1:sw]
            acc = (acc.float() + tap.float()).half()  # one fp16 rounding per addition
    weight = torch.tensor(1.0 / (kh * kw), dtype=torch.float16)
    return (acc.float() * weight.float()).half()


def _avg_cases(height: int, width: int) -> List[dict]:
    cases = [dict(name=f'avg {k}x{k} s1', kernel=(k, k), stride=(1, 1)) for k in (3, 7, 15)]
    cases.append(dict(name=f'avg global {height}x{width}', kernel=(height, width),
                      stride=(height, width)))
    return cases


def build_rows(height: int = 64, width: int = 128, channels: int = 4, offset: float = 100.0,
               seed: int = 0, dtypes=(torch.float16, torch.bfloat16)) -> List[Row]:
    """Measure every op / dtype / setting combination; returns the table rows."""
    rows: List[Row] = []
    gen = torch.Generator().manual_seed(seed)
    base = torch.rand((1, channels, height, width), generator=gen, dtype=torch.float64)
    small = torch.rand((1, channels, height // 8, width // 8), generator=gen,
                       dtype=torch.float64) * 2 - 1
    for dtype in dtypes:
        name = str(dtype).replace('torch.', '')
        x = (base + offset).to(dtype)
        x64 = x.double()
        ops: Dict[str, Callable] = {}
        for case in _avg_cases(height, width):
            ops[('avg_pool2d', case['name'])] = (
                lambda t, c=case, **kw: avg_pool2d(t, c['kernel'], c['stride'], **kw),
                lambda t, c=case: ref.avg_pool2d(t, c['kernel'], c['stride']), case)
        for bins in (1, 2, 3, 6):
            ops[('adaptive_avg_pool2d', f'pyramid bin {bins}x{bins}')] = (
                lambda t, b=bins, **kw: adaptive_avg_pool2d(t, b, **kw),
                lambda t, b=bins: ref.adaptive_avg_pool2d(t, b), None)
        ops[('max_pool2d', 'max 3x3 s2 p1')] = (
            lambda t, **kw: max_pool2d(t, 3, 2, 1, **kw),
            lambda t: ref.max_pool2d(t, 3, 2, 1), None)
        for (op, label), (fn, ref_fn, avg_case) in ops.items():
            expected = ref_fn(x64)
            for setting in POLICY_VALUES:
                got = fn(x, precision=setting)
                rows.append(Row(op, label, name, setting, *error_in_ulps(got, expected, dtype)))
            if avg_case is not None and dtype == torch.float16:
                got = fp16_accumulating_avg_pool(x, avg_case['kernel'], avg_case['stride'])
                rows.append(Row(op, label, name, EMULATED, *error_in_ulps(got, expected, dtype)))
        xs = small.to(dtype)
        for factor in (2, 8):
            expected = ref.upsample(xs.double(), scale_factor=factor, mode='bilinear')
            for setting in POLICY_VALUES:
                got = upsample(xs, scale_factor=factor, mode='bilinear', precision=setting)
                rows.append(Row('upsample', f'bilinear x{factor}', name, setting,
                                *error_in_ulps(got, expected, dtype)))
    return rows


def format_markdown(rows: List[Row]) -> str:
    """Markdown table: one line per (op, case, dtype), one column per setting (ulps)."""
    settings: List[str] = list(POLICY_VALUES) + [EMULATED]
    grouped: Dict[tuple, Dict[str, Row]] = {}
    for r in rows:
        grouped.setdefault((r.op, r.case, r.dtype), {})[r.setting] = r
    header = '| op | case | input | ' + ' | '.join(settings) + ' |'
    lines = [header, '|' + '---|' * (3 + len(settings))]
    for (op, case, dtype), by_setting in grouped.items():
        cells = []
        for s in settings:
            r: Optional[Row] = by_setting.get(s)
            cells.append('' if r is None else f'{r.max_ulp_err:.2f}')
        lines.append(f'| {op} | {case} | {dtype} | ' + ' | '.join(cells) + ' |')
    return '\n'.join(lines)
