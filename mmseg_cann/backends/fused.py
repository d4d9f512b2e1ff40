"""Fast implementations of the fused decoder ops (``mmseg_cann.ops.fused``).

``upsample_add``
    Upsamples into a fresh tensor with PyTorch's own kernel and adds the lateral in
    place. The values are those of ``other + upsample(input)`` bit for bit; the saving
    is the second full-size allocation (on CPU a fresh tensor is filled at about a third
    of copy bandwidth because of page faults, DESIGN.md 2.4).

``upsample_argmax``
    Nearest modes: the argmax commutes with the gather, so the labels are the low
    resolution argmax gathered to full size (exact, ties included).
    Bilinear: output rows are processed in bands; for each band the needed low
    resolution rows are interpolated along W, then along H, and reduced by argmax over
    classes, so at most one band of intermediate values exists at a time. The weights
    are PyTorch's (float32 source coordinates, ``geometry`` rules) and the arithmetic
    order is that of PyTorch's NCHW CPU kernel (``(x00*w0 + x01*w1)*h0 + (...)*h1``),
    the interpolated value is rounded to the input dtype before the argmax. Large
    inputs run the band function through ``torch.compile`` (one compiled graph per
    configuration, cached), small ones eagerly.
"""
from __future__ import annotations

import types
from functools import lru_cache
from typing import List, Tuple

import torch

from ..ops import geometry as geo
from ..ops import reference as ref
from . import native

#: outputs with at least this many elements (N*C*H*W) use the compiled band function
COMPILE_MIN_ELEMENTS = 1 << 20
#: number of output-row bands of the bilinear argmax
ARGMAX_BANDS = 4


def upsample_add(input: torch.Tensor, other: torch.Tensor,
                 spec: geo.UpsampleSpec) -> torch.Tensor:
    """``other + upsample(input)`` written with one full-size allocation (not differentiable)."""
    return native.upsample(input, spec).add_(other)


@lru_cache(maxsize=256)
def linear_taps(in_size: int, out_size: int, align_corners: bool
                ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """PyTorch's bilinear taps along one axis: ``(i0, i1, w0, w1)``, shape ``(out,)``.

    Source coordinates are computed in float32 as PyTorch's kernel does
    (``step * (d + 0.5) - 0.5`` clamped at 0, or ``d * step`` with ``align_corners``;
    step from :func:`geometry.coordinate_scale`); ``i0 = min(floor(src), in - 1)``,
    ``i1 = min(i0 + 1, in - 1)``, ``w1 = clamp(src - i0, 0, 1)``, ``w0 = 1 - w1``.
    An unchanged axis is copied (``i0 = i1 = d``), as PyTorch does.
    """
    d = torch.arange(out_size, dtype=torch.float32)
    if in_size == out_size:
        idx = torch.arange(out_size)
        return idx, idx, torch.ones(out_size), torch.zeros(out_size)
    step = torch.tensor(geo.coordinate_scale(in_size, out_size, align_corners, None),
                        dtype=torch.float32)
    src = d * step if align_corners else ((d + 0.5) * step - 0.5).clamp_min(0)
    i0 = src.floor().to(torch.int64).clamp_max(in_size - 1)
    w1 = (src - i0).clamp(0, 1)
    return i0, (i0 + 1).clamp_max(in_size - 1), 1 - w1, w1


def upsample_argmax(logits: torch.Tensor, spec: geo.UpsampleSpec) -> torch.Tensor:
    """Labels of the upsampled logits, ``(N, H, W)`` int64, without full-size logits."""
    (h, w), (H, W) = spec.in_size, spec.out_size
    if spec.mode in geo.NEAREST_MODES:
        exact = spec.mode == 'nearest-exact'
        rows = torch.from_numpy(ref.nearest_indices(h, H, None, exact)).to(logits.device)
        cols = torch.from_numpy(ref.nearest_indices(w, W, None, exact)).to(logits.device)
        low = logits.argmax(1)
        return low[:, rows][:, :, cols]
    plan = _band_plan(h, H, bool(spec.align_corners))
    cw = [t.to(logits.device) for t in linear_taps(w, W, bool(spec.align_corners))]
    n = logits.shape[0]
    out = torch.empty((n, H, W), dtype=torch.int64, device=logits.device)
    if n == 0:
        return out
    big = n * logits.shape[1] * H * W >= COMPILE_MIN_ELEMENTS
    fn = _compiled_band(logits.device.type, logits.dtype) if big else _argmax_band
    for y0, r0, rows_needed, taps in plan:
        band = logits[:, :, r0:r0 + rows_needed]
        ch = [t.to(logits.device) for t in taps]
        out[:, y0:y0 + len(ch[0])] = fn(band, *ch, *cw)
    return out


def _argmax_band(x, ih0, ih1, lh0, lh1, iw0, iw1, lw0, lw1):
    """Argmax over classes of one band: ``x`` is ``(N, C, R, w)`` low resolution rows."""
    compute = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
    xf = x.to(compute)
    r = xf[..., iw0] * lw0.to(compute) + xf[..., iw1] * lw1.to(compute)
    v = r[..., ih0, :] * lh0.to(compute)[:, None] + r[..., ih1, :] * lh1.to(compute)[:, None]
    return v.to(x.dtype).argmax(1)


@lru_cache(maxsize=16)
def _compiled_band(device_type: str, dtype: torch.dtype):
    # Dynamo keeps its compiled graphs (and its recompile limit) per code object; a
    # copy of the code per (device, dtype) keeps configurations from evicting each other.
    code = _argmax_band.__code__.replace(co_name=f'_argmax_band_{device_type}_'
                                                 f'{str(dtype).replace("torch.", "")}')
    fn = types.FunctionType(code, _argmax_band.__globals__, code.co_name)
    return torch.compile(fn, dynamic=False)


@lru_cache(maxsize=64)
def _band_plan(h: int, H: int, align_corners: bool) -> List[tuple]:
    """Bands of output rows: ``(y0, r0, R, (i0, i1, w0, w1) relative to r0)``.

    Every band has the same number of output rows and of low resolution rows ``R``
    (the last band overlaps its neighbour instead of being shorter), so one compiled
    graph serves every band.
    """
    i0, i1, w0, w1 = linear_taps(h, H, align_corners)
    band = -(-H // ARGMAX_BANDS)
    starts = sorted({min(y, H - band) for y in range(0, H, band)})
    need = max(int(i1[y + band - 1]) - int(i0[y]) + 1 for y in starts)
    plan = []
    for y in starts:
        r0 = max(0, min(int(i0[y]), h - need))
        sl = slice(y, y + band)
        plan.append((y, r0, need, (i0[sl] - r0, i1[sl] - r0, w0[sl], w1[sl])))
    return plan
