"""What the two phase methods (:mod:`.polyphase`, :mod:`.mix_first`) share: the phase
coefficient tables, the edge-replicated low-resolution window, the interleaving of the
output phases and the border rows and columns computed directly from thin strips.

Per axis, output index ``D = s*I + q`` (``s`` the factor, ``q`` the output phase) of the
full-resolution convolution reads upsampled positions ``s*I + q + k - P`` (``k`` the tap,
``P`` the zero padding); writing ``q + k - P = s*m + p``, the upsampled value there is a
fixed combination of low-resolution values ``x[I + m + t]`` (the interpolation taps of
phase ``p``, with PyTorch's index clamping read as edge replication). So each output
phase ``(qh, qw)`` is a fixed linear function of a small window of the edge-replicated
low-resolution input, with coefficients ``Gh[kh, rh] Gw[kw, rw]`` per tap and offset.
The output rows and columns whose taps reach the convolution's zero padding (``P`` at
each end of each axis) are recomputed directly: the upsampled rows they read (zero rows
included), interpolated along both axes as a thin strip, convolved with ``weight``.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Callable, List

import numpy as np
import torch
import torch.nn.functional as F

from ...core.resize_taps import PhaseAxis
from ._common import tracing


@lru_cache(maxsize=512)
def phase_matrix(ah: PhaseAxis, aw: PhaseAxis, gh: tuple, gw: tuple) -> np.ndarray:
    """``T[(a, b, rh, rw), (kh, kw)]``: the coefficient of tap ``(kh, kw)`` of the
    convolution in low-resolution offset ``(rh, rw)`` of output phase ``(a, b)`` of the
    phase group ``gh`` x ``gw`` (float64; products of the exact per-axis weights)."""
    (q0, q1, lo, hi), (p0, p1, lo2, hi2) = gh, gw
    mh = np.zeros((q1 - q0, ah.k, hi - lo + 1))
    for q in range(q0, q1):
        for (k, r), c in ah.phase_taps(q).items():
            mh[q - q0, k, r - lo] = float(c)
    mw = np.zeros((p1 - p0, aw.k, hi2 - lo2 + 1))
    for q in range(p0, p1):
        for (k, r), c in aw.phase_taps(q).items():
            mw[q - p0, k, r - lo2] = float(c)
    t = np.einsum('akr,bls->abrskl', mh, mw).reshape(-1, ah.k * aw.k)
    t.setflags(write=False)
    return t


def replicated_window(x: torch.Tensor, ah: PhaseAxis, aw: PhaseAxis, lo: int, th: int,
                      lo2: int, tw: int) -> torch.Tensor:
    """The edge-replicated input over the low-resolution offsets a phase group reads:
    rows ``[lo, blocks_h - 1 + lo + th)``, columns likewise (clamped indices, as
    PyTorch's interpolation clamps its source indices)."""
    ph, pw = ah.replicate_pad, aw.replicate_pad
    xr = F.pad(x, (pw[0], pw[1], ph[0], ph[1]), mode='replicate') if ph + pw != (0,) * 4 \
        else x
    return xr[:, :, lo + ph[0]:lo + ph[0] + ah.blocks + th - 1,
              lo2 + pw[0]:lo2 + pw[0] + aw.blocks + tw - 1]


def run_phases(x: torch.Tensor, w: torch.Tensor, b, ah: PhaseAxis, aw: PhaseAxis,
               phases_of: Callable) -> torch.Tensor:
    """The convolution of the zero-padded upsampled ``x``: the output phases of
    ``phases_of(x, w, b, ah, aw)`` (``[(gh, gw, (c0, c1), y), ...]``) everywhere, the rows
    and columns that reach the zero padding replaced by a direct convolution of thin
    upsampled strips."""
    n, cout = x.shape[0], w.shape[0]
    phases = phases_of(x, w, b, ah, aw)
    (top, bottom), (left, right) = ah.border, aw.border
    # upsampled rows [-P, top - P + k - 1) (zero rows included), all columns; etc.
    rows = _borders(x, w, b, ah, aw, 2, top, bottom)
    cols = _borders(x, w, b, aw, ah, 3, left, right)
    if tracing():
        return _assemble_traceable(phases, rows, cols, n, cout, ah, aw)
    # one pass: every phase group and border strip written into its place
    out = x.new_empty((n, cout, ah.blocks, ah.s, aw.blocks, aw.s))
    for (q0, q1, _, _), (p0, p1, _, _), (c0, c1), y in phases:
        out[:, c0:c1, :, q0:q1, :, p0:p1] = y.view(
            n, c1 - c0, q1 - q0, p1 - p0, ah.blocks, aw.blocks).permute(0, 1, 4, 2, 5, 3)
    out = out.view(n, cout, ah.blocks * ah.s, aw.blocks * aw.s)[:, :, :ah.n_out, :aw.n_out]
    for part, (start, end) in zip(rows, ((0, top), (bottom, ah.n_out))):
        if part is not None:
            out[:, :, start:end] = part
    for part, (start, end) in zip(cols, ((0, left), (right, aw.n_out))):
        if part is not None:
            out[:, :, :, start:end] = part
    return out


def _assemble_traceable(phases, rows, cols, n, cout, ah: PhaseAxis, aw: PhaseAxis):
    grid: List[List[torch.Tensor]] = []
    for (q0, q1, _, _), (p0, p1, _, _), _, y in phases:
        y = y.view(n, cout, q1 - q0, p1 - p0, ah.blocks, aw.blocks)
        if p0 == 0:
            grid.append([])
        grid[-1].append(y)
    y = torch.cat([torch.cat(r, 3) if len(r) > 1 else r[0] for r in grid], 2) \
        if len(grid) > 1 else (torch.cat(grid[0], 3) if len(grid[0]) > 1 else grid[0][0])
    if ah.s == aw.s:
        y = F.pixel_shuffle(y.reshape(n, cout * ah.s * aw.s, ah.blocks, aw.blocks), ah.s)
    else:
        y = y.permute(0, 1, 4, 2, 5, 3).reshape(n, cout, ah.blocks * ah.s,
                                                aw.blocks * aw.s)
    (top, bottom), (left, right) = ah.border, aw.border
    y = y[:, :, :ah.n_out, :aw.n_out]
    if rows != [None, None]:
        y = torch.cat([t for t in (rows[0], y[:, :, top:bottom], rows[1]) if t is not None],
                      2)
    if cols != [None, None]:
        y = torch.cat([t for t in (cols[0], y[:, :, :, left:right], cols[1])
                       if t is not None], 3)
    return y


def _borders(x, w, b, along: PhaseAxis, other: PhaseAxis, dim: int, first: int,
             last: int) -> list:
    """Output rows (``dim`` 2) or columns (``dim`` 3) ``[0, first)`` and
    ``[last, n_out)``, computed directly: the upsampled rows they read along ``dim``
    (zero rows included), upsampled fully along the other axis, convolved (both strips
    in one convolution when their shapes agree). ``[first_part or None, last_part or
    None]``."""
    spans = [(-along.pad, first - along.pad + along.k - 1) if first else None,
             (last - along.pad, along.n_out - along.pad + along.k - 1)
             if last < along.n_out else None]
    strips = [None if span is None else
              _strip(_strip(x, along, dim, *span), other, 5 - dim, 0, other.n_up)
              for span in spans]
    padding = (0, other.pad) if dim == 2 else (other.pad, 0)
    if all(t is not None for t in strips) and strips[0].shape == strips[1].shape:
        both = F.conv2d(torch.cat(strips), w, b, 1, padding)
        return list(both.split(x.shape[0]))
    return [None if t is None else F.conv2d(t, w, b, 1, padding) for t in strips]


def _strip(x: torch.Tensor, axis: PhaseAxis, dim: int, j0: int, j1: int) -> torch.Tensor:
    """Upsampled rows ``[j0, j1)`` of ``x`` along ``dim`` (zero outside ``[0, n_up)``:
    the convolution's padding), the other axis unchanged."""
    a, b, tables = axis.interpolation(j0, j1)
    shape = [1, 1, 1, 1]
    shape[dim] = b - a
    rows = None
    for idx, wts in tables:
        term = x.index_select(dim, torch.tensor(idx, device=x.device)) * \
            torch.tensor(wts, dtype=x.dtype, device=x.device).view(shape)
        rows = term if rows is None else rows + term
    if rows is None:  # every row is padding
        size = list(x.shape)
        size[dim] = 0
        rows = x.new_zeros(size)
    pad = [0, 0, 0, 0]
    pad[2 * (3 - dim)] = a - j0
    pad[2 * (3 - dim) + 1] = j1 - b
    return F.pad(rows, pad) if any(pad) else rows
