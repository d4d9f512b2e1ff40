"""The ``'fused'`` backend: fast implementations of the fused decoder ops
(:mod:`mmseg_cann.ops.fused`); the four plain ops run natively. Not differentiable: an
input that needs a gradient takes the native (unfused) computation, counted as a fallback.

``upsample_add``
    Bilinear upsampling of float32 NCHW CPU tensors runs the numba kernel of
    :mod:`.numba_cpu`: one pass that writes ``other + upsample(input)`` into the output
    with PyTorch's arithmetic (fused multiply-adds included): bit-identical on
    decoder-sized outputs, within the last bit of the interpolation on narrow ones.
    Otherwise: upsamples into a fresh tensor with PyTorch's own kernel and adds the
    lateral in place (bit for bit the unfused values; the saving is the second
    full-size allocation: on CPU a fresh tensor is filled at about a third of copy
    bandwidth because of page faults, docs/design.md 2.4).

``upsample_argmax``
    Nearest modes: the argmax commutes with the gather, so the labels are the low
    resolution argmax gathered to full size (exact, ties included).
    Bilinear, float32 on CPU: the numba kernel of :mod:`.numba_cpu` (chunks of output
    rows in parallel; two W-interpolated low-resolution rows per chunk; a running
    argmax over classes; no full-resolution logits).
    Bilinear otherwise (other dtypes and devices, or without numba): output rows are
    processed in bands; for each band the needed low resolution rows are interpolated
    along W, then along H, and reduced by argmax over classes, so at most one band of
    intermediate values exists at a time. Bands are as large as :data:`BAND_FRACTION` of
    the unfused full-resolution logits allows (few bands: each is one compiled call, see
    :func:`_band_rows`), and the compiled band function stores its labels into the
    result (no per-band copy in Python). The weights are PyTorch's (float32 source
    coordinates, ``geometry`` rules), the interpolated value is rounded to the input
    dtype before the argmax. Large outputs run the band function through
    ``torch.compile`` (one compiled graph per configuration, cached); small ones (under
    :data:`COMPILE_MIN_ELEMENTS`) run one band eagerly.
"""
from __future__ import annotations

import types
from functools import lru_cache
from typing import Tuple

import torch

from ..core import geometry as geo
from ..core import reference as ref
from ..core.taps import linear_taps
from ..utils import record_fallback
from . import native, numba_cpu

#: run the numba CPU kernels (:mod:`.numba_cpu`) where they apply; False forces the
#: torch paths below (for comparisons and for machines where numba misbehaves)
USE_NUMBA = True
#: outputs with at least this many elements (N*C*H*W) use the compiled band function
COMPILE_MIN_ELEMENTS = 1 << 20
#: the bilinear argmax's band temporaries stay within this fraction of the unfused
#: computation's full-resolution logits (the peak-memory target is 0.1x of those)
BAND_FRACTION = 0.08
#: and a band's W-interpolated rows stay within this many bytes (measured: with 150
#: classes, 4 bands of 21 MB ran faster than 2 of 45 MB or 8 of 11 MB)
BAND_MAX_BYTES = 24 << 20


upsample = native.upsample
max_pool2d = native.max_pool2d
avg_pool2d = native.avg_pool2d
adaptive_avg_pool2d = native.adaptive_avg_pool2d


def needs_grad(*tensors: torch.Tensor) -> bool:
    """Whether autograd would record an op on ``tensors``."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def unfused_for_grad(op: str, backend: str, *tensors: torch.Tensor) -> bool:
    """True (and a recorded fallback) when a non-differentiable ``backend`` must leave
    ``op`` to the native computation because an input needs a gradient."""
    if not needs_grad(*tensors):
        return False
    record_fallback(op, f'the {backend!r} backend is not differentiable; inputs that '
                        'need a gradient use the native (unfused) computation')
    return True


def upsample_add(input: torch.Tensor, other: torch.Tensor,
                 spec: geo.UpsampleSpec) -> torch.Tensor:
    """``other + upsample(input)`` written with one full-size allocation (not differentiable)."""
    if unfused_for_grad('upsample_add', 'fused', input, other):
        return native.upsample_add(input, other, spec)
    if numba_add_applies(spec, input, other):
        out = torch.empty_like(other, memory_format=torch.contiguous_format)
        numba_cpu.upsample_add_into(input.numpy(), other.numpy(), out.numpy(),
                                    *_numpy_taps(spec))
        return out
    return native.upsample(input, spec).add_(other)


def numba_add_applies(spec: geo.UpsampleSpec, input: torch.Tensor,
                      other: torch.Tensor) -> bool:
    """Whether ``upsample_add`` runs the numba kernel: :func:`_numba_kernel_applies`, and
    an upsampling on both axes (the decoder case; the kernel's chunk buffers assume it)."""
    return (all(o >= i for i, o in zip(spec.in_size, spec.out_size))
            and _numba_kernel_applies('upsample_add', spec, input, other))


def _numba_kernel_applies(op: str, spec: geo.UpsampleSpec, *tensors: torch.Tensor) -> bool:
    """Whether :mod:`.numba_cpu` runs this call: bilinear, C-contiguous NCHW float32 CPU
    tensors (PyTorch computes float64 coordinates for float64 input; the taps here are
    float32), numba installed and not switched off (:data:`USE_NUMBA`), and not a child
    forked after the kernels ran (:func:`numba_cpu.forked_after_use`, counted as a
    fallback)."""
    if not (USE_NUMBA and spec.mode == 'bilinear' and not spec.antialias
            and all(t.device.type == 'cpu' and t.dtype == torch.float32
                    and t.is_contiguous() for t in tensors)
            and numba_cpu.available()):
        return False
    if numba_cpu.forked_after_use():
        record_fallback(op, 'numba kernels are not used in a process forked after '
                        'they ran (GNU OpenMP is not fork-safe); the torch path runs')
        return False
    return True


def _numpy_taps(spec: geo.UpsampleSpec):
    """Row and column taps of ``spec`` as NumPy arrays (int64 indices, float32 weights)."""
    align = bool(spec.align_corners)
    return tuple(tuple(t.numpy() for t in linear_taps(i, o, align))
                 for i, o in zip(spec.in_size, spec.out_size))


def upsample_argmax(logits: torch.Tensor, spec: geo.UpsampleSpec) -> torch.Tensor:
    """Labels of the upsampled logits, ``(N, H, W)`` int64, without full-size logits."""
    if unfused_for_grad('upsample_argmax', 'fused', logits):
        return native.upsample_argmax(logits, spec)
    (h, w), (H, W) = spec.in_size, spec.out_size
    if spec.mode in geo.NEAREST_MODES:
        exact = spec.mode == 'nearest-exact'
        rows = torch.from_numpy(ref.nearest_indices(h, H, None, exact)).to(logits.device)
        cols = torch.from_numpy(ref.nearest_indices(w, W, None, exact)).to(logits.device)
        low = logits.argmax(1)
        return low[:, rows][:, :, cols]
    n, c = logits.shape[:2]
    align = bool(spec.align_corners)
    out = torch.empty((n, H, W), dtype=torch.int64, device=logits.device)
    if n == 0:
        return out
    dense = logits.contiguous()  # a copy only for channels_last (low resolution)
    if _numba_kernel_applies('upsample_argmax', spec, dense):
        numba_cpu.upsample_argmax_into(dense.numpy(), out.numpy(), *_numpy_taps(spec))
        return out
    big = n * c * H * W >= COMPILE_MIN_ELEMENTS
    rows = _band_rows(n, c, h, w, H, W, logits.element_size()) if big else H
    plan = _band_plan(h, H, align, rows)
    cw = [t.to(logits.device) for t in linear_taps(w, W, align)]
    fn = _compiled_band(logits.device.type, logits.dtype) if big else _argmax_band_into
    for y0, r0, rows_needed, taps in plan:
        ch = [t.to(logits.device) for t in taps]
        fn(out[:, y0:y0 + len(ch[0])], logits[:, :, r0:r0 + rows_needed], *ch, *cw)
    return out


def _argmax_band(x, ih0, ih1, lh0, lh1, iw0, iw1, lw0, lw1):
    """Argmax over classes of one band: ``x`` is ``(N, C, R, w)`` low resolution rows."""
    compute = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
    xf = x.to(compute)
    r = xf[..., iw0] * lw0.to(compute) + xf[..., iw1] * lw1.to(compute)
    v = r[..., ih0, :] * lh0.to(compute)[:, None] + r[..., ih1, :] * lh1.to(compute)[:, None]
    return v.to(x.dtype).argmax(1)


def _argmax_band_into(out, x, ih0, ih1, lh0, lh1, iw0, iw1, lw0, lw1) -> None:
    """:func:`_argmax_band` written into ``out`` (``(N, rows, W)`` int64, a view of the
    result). Compiled, the copy is the store of the argmax kernel: no band temporary."""
    out.copy_(_argmax_band(x, ih0, ih1, lh0, lh1, iw0, iw1, lw0, lw1))


@lru_cache(maxsize=16)
def _compiled_band(device_type: str, dtype: torch.dtype):
    # Dynamo keeps its compiled graphs (and its recompile limit) per code object; a
    # copy of the code per (device, dtype) keeps configurations from evicting each other.
    code = _argmax_band_into.__code__.replace(
        co_name=f'_argmax_band_{device_type}_{str(dtype).replace("torch.", "")}')
    fn = types.FunctionType(code, _argmax_band_into.__globals__, code.co_name)
    return torch.compile(fn, dynamic=False)


def _band_rows(n: int, c: int, h: int, w: int, H: int, W: int, itemsize: int) -> int:
    """Output rows per band: the most that keep one band's temporaries (the float32
    W-interpolated low resolution rows, ``R = rows*h/H + 2`` of ``N*C*W`` values, and
    the band's int64 labels) within :data:`BAND_FRACTION` of the full-resolution logits
    the unfused computation makes (``N*C*H*W`` values of ``itemsize`` bytes), and the
    W-interpolated rows within :data:`BAND_MAX_BYTES`.

    As few bands as the memory budget allows: each band is one compiled call whose
    parallel loops end in a barrier, and on a CPU shared with other processes every
    barrier waits for a descheduled thread (docs/fused_ops.md, "Why the banded path is slow").
    """
    budget = BAND_FRACTION * n * c * H * W * itemsize
    per_low_row, per_out_row = 4 * n * c * W, 8 * n * W
    rows = (budget - 2 * per_low_row) / (per_low_row * h / H + per_out_row)
    rows = min(rows, (BAND_MAX_BYTES / per_low_row - 2) * H / h)
    return int(min(H, max(1, rows)))


@lru_cache(maxsize=256)
def _band_plan(h: int, H: int, align_corners: bool, band: int) -> Tuple[tuple, ...]:
    """Bands of ``band`` output rows: ``(y0, r0, R, (i0, i1, w0, w1) relative to r0)``.

    Every band has the same number of output rows and of low resolution rows ``R``
    (the last band overlaps its neighbour instead of being shorter, writing the same
    labels twice), so one compiled graph serves every band.
    """
    i0, i1, w0, w1 = linear_taps(h, H, align_corners)
    starts = sorted({min(y, H - band) for y in range(0, H, band)})
    need = max(int(i1[y + band - 1]) - int(i0[y]) + 1 for y in starts)
    plan = []
    for y in starts:
        r0 = max(0, min(int(i0[y]), h - need))
        sl = slice(y, y + band)
        plan.append((y, r0, need, (i0[sl] - r0, i1[sl] - r0, w0[sl], w1[sl])))
    return tuple(plan)
