"""Per-axis geometry of a resize followed by a convolution (``ops.resize_conv2d``).

Along one spatial axis the composition ``conv(up(x))`` upsamples ``n_in`` values to
``n_up`` and convolves with a ``k``-tap kernel and zero padding ``pad`` on both ends.
Two descriptions of an axis live here, one per family of methods:

* :class:`PhaseAxis` -- an integer factor ``s`` with constant phases: upsampled index
  ``s*I + p`` is a fixed combination of ``x[I + t]`` (``taps[p]``), so each output phase
  is a fixed linear function of a low-resolution window (the polyphase and mix-first
  methods); :func:`phase_axis` decides whether an axis has that form and says why not;
* :class:`ShiftAxis` -- any size: output ``D`` reads upsampled ``D + k - pad`` (zero
  outside ``[0, n_up)``), which is a shifted slice of the upsampled map (the mix-resize
  method); no integer factor is needed.

Exact rationals (``fractions.Fraction``) describe the phase weights; PyTorch's own float32
rule decides nearest indices and the geometry error of bilinear weights. torch and numpy
only.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from functools import lru_cache
from typing import List, Optional, Tuple

import numpy as np

from . import geometry as geo
from . import reference as ref
from .taps import linear_taps


# ----------------------------------------------------------------------------------
# integer factors with constant phases
# ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class PhaseAxis:
    """One spatial axis with an integer factor: upsampling by ``s``, then a ``k``-tap
    convolution with zero padding ``pad`` on both ends."""

    n_in: int
    s: int
    #: per input phase ``p``: ((offset t, weight), ...), u[s*I + p] = sum w * x[I + t]
    taps: Tuple[Tuple[Tuple[int, Fraction], ...], ...]
    #: upsampled size (``s * n_in``, or ``s * (n_in - 1) + 1`` for aligned corners)
    n_up: int
    k: int
    pad: int
    grouping: str = 'footprint'
    #: per output phase, the low-resolution offsets ``[lo, hi]`` it reads
    footprints: Tuple[Tuple[int, int], ...] = field(init=False, repr=False, compare=False)
    #: runs of phases computed by one convolution: ``(q0, q1, lo, hi)``
    groups: Tuple[Tuple[int, int, int, int], ...] = field(init=False, repr=False,
                                                          compare=False)

    def __post_init__(self):
        # computed once, as plain attributes (a traced call reads them; functools'
        # cached_property takes a lock, which torch.compile cannot trace)
        object.__setattr__(self, 'footprints', self._footprints())
        object.__setattr__(self, 'groups', self._groups())

    @property
    def n_out(self) -> int:
        return self.n_up + 2 * self.pad - self.k + 1

    @property
    def identity(self) -> bool:
        return self.s == 1 and self.taps == (((0, Fraction(1)),),)

    def phase_taps(self, q: int) -> dict:
        """Low-resolution coefficients of output phase ``q``: ``{(k, r): weight}`` with
        ``r`` the offset from the block index ``I`` (before edge replication)."""
        coeffs = {}
        for k in range(self.k):
            m, p = divmod(q + k - self.pad, self.s)
            for t, a in self.taps[p]:
                coeffs[(k, m + t)] = coeffs.get((k, m + t), 0) + a
        return coeffs

    def _footprints(self) -> Tuple[Tuple[int, int], ...]:
        result = []
        for q in range(self.s):
            offsets = [r for (_, r) in self.phase_taps(q)]
            result.append((min(offsets), max(offsets)))
        return tuple(result)

    def _groups(self) -> Tuple[Tuple[int, int, int, int], ...]:
        feet = self.footprints
        if self.grouping == 'union':
            return ((0, self.s, min(f[0] for f in feet), max(f[1] for f in feet)),)
        runs: List[List[int]] = []
        for q, (lo, hi) in enumerate(feet):
            if runs and (runs[-1][2], runs[-1][3]) == (lo, hi):
                runs[-1][1] = q + 1
            else:
                runs.append([q, q + 1, lo, hi])
        return tuple(tuple(r) for r in runs)  # type: ignore[misc]

    @property
    def span(self) -> Tuple[int, int]:
        """Union footprint ``(lo, taps)`` of a ``'union'`` axis (its single group)."""
        (_, _, lo, hi), = self.groups
        return lo, hi - lo + 1

    @property
    def blocks(self) -> int:
        return -(-self.n_out // self.s)

    @property
    def replicate_pad(self) -> Tuple[int, int]:
        """Edge replication (before, after) the phase convolutions need."""
        groups = self.groups
        lo = min(g[2] for g in groups)
        hi = max(g[3] for g in groups)
        return max(0, -lo), max(0, self.blocks - 1 + hi - (self.n_in - 1))

    @property
    def border(self) -> Tuple[int, int]:
        """Output rows ``[0, top)`` and ``[bottom, n_out)`` whose taps reach the zero
        padding (recomputed from strips)."""
        top = min(self.pad, self.n_out)
        bottom = max(self.n_up - self.k + self.pad + 1, top)
        return top, min(bottom, self.n_out)

    def interpolation(self, j0: int, j1: int) -> Tuple[int, int, tuple]:
        """Upsampled rows ``[j0, j1)`` clipped to ``[0, n_up)`` as tap tables: ``(a, b,
        ((indices, weights), ...))``, one ``(indices, weights)`` per tap slot, for rows
        ``[a, b)`` (the rest is the convolution's zero padding)."""
        return _interpolation(self, max(j0, 0), min(j1, self.n_up))


@lru_cache(maxsize=512)
def _interpolation(axis: PhaseAxis, a: int, b: int) -> Tuple[int, int, tuple]:
    rows = []
    for j in range(a, b):
        blk, p = divmod(j, axis.s)
        rows.append([(min(max(blk + t, 0), axis.n_in - 1), w) for t, w in axis.taps[p]])
    slots = max((len(r) for r in rows), default=0)
    tables = []
    for slot in range(slots):
        idx = tuple(r[slot][0] if slot < len(r) else r[0][0] for r in rows)
        wts = tuple(float(r[slot][1]) if slot < len(r) else 0.0 for r in rows)
        tables.append((idx, wts))
    return a, b, tuple(tables)


def phase_taps_of(mode: str, align_corners: Optional[bool], n_in: int, n_up: int,
                  scale: Optional[float], name: str):
    """``(s, taps, None)`` for an axis with an integer factor and constant phases, else
    ``(None, None, why)``. PyTorch's own index rule (float32 scale, its shortcuts)
    decides for nearest; bilinear phases are the exact half-pixel (or aligned) weights."""
    if n_up < n_in:
        return None, None, f'{name}: {n_in} -> {n_up} shrinks the axis (no integer factor)'
    if mode in geo.NEAREST_MODES:
        if n_up % n_in:
            return None, None, (f'{name}: output size {n_up} is not an integer multiple of '
                                f'the input size {n_in}')
        s = n_up // n_in
        torch_idx = ref.nearest_indices(n_in, n_up, scale, mode == 'nearest-exact')
        if any(int(i) != d // s for d, i in enumerate(torch_idx)):
            return None, None, (f"{name}: PyTorch's nearest index for {n_in} -> {n_up} "
                                f'(scale {scale}) is not floor(d / {s}) everywhere')
        return s, tuple(((0, Fraction(1)),) for _ in range(s)), None
    if n_up == n_in and (scale is None or align_corners):
        return 1, (((0, Fraction(1)),),), None  # PyTorch copies the axis
    if align_corners:
        if n_in == 1:
            return n_up, tuple(((0, Fraction(1)),) for _ in range(n_up)), None
        if (n_up - 1) % (n_in - 1):
            return None, None, (f'{name}: align_corners=True maps output d to '
                                f'd*(in-1)/(out-1); {n_in} -> {n_up} is not an aligned '
                                f'integer factor (needs out - 1 = s*(in - 1))')
        s = (n_up - 1) // (n_in - 1)
        taps = tuple(tuple((t, w) for t, w in ((0, 1 - Fraction(p, s)), (1, Fraction(p, s)))
                           if w) for p in range(s))
        return s, taps, None
    if n_up % n_in:
        return None, None, (f'{name}: output size {n_up} is not an integer multiple of the '
                            f'input size {n_in}')
    s = n_up // n_in
    if scale is not None and scale != s:
        return None, None, f'{name}: scale_factor {scale} maps with 1/{scale}, not 1/{s}'
    taps = []
    for p in range(s):
        f = Fraction(2 * p + 1, 2 * s) - Fraction(1, 2)  # source offset of phase p
        pair = ((-1, -f), (0, 1 + f)) if f < 0 else ((0, 1 - f), (1, f))
        taps.append(tuple((t, w) for t, w in pair if w))
    return s, tuple(taps), None


# ----------------------------------------------------------------------------------
# any size: shifted slices of the upsampled map
# ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class ShiftAxis:
    """One spatial axis of any size: upsampling ``n_in`` to ``n_up`` (sizes may be
    symbolic while an exporter traces), then a ``k``-tap convolution with zero padding
    ``pad``. Output ``D`` reads upsampled ``D + j - pad`` for tap ``j``."""

    n_in: object
    n_up: object
    k: int
    pad: int
    #: the user scale PyTorch maps this axis with (``1/scale``), or None (``in/out``)
    scale: Optional[float]
    #: whether the resize leaves this axis as it is (PyTorch copies it)
    identity: bool

    @property
    def n_out(self):
        return self.n_up + 2 * self.pad - self.k + 1

    def window(self, j: int) -> Tuple[int, int]:
        """For tap ``j``: ``(lead, trail)``, the zero rows before and after the slice of
        the upsampled map that tap ``j`` contributes (``lead + len + trail = n_out``):
        the slice is upsampled rows ``[max(0, j - pad), ...)`` placed at output row
        ``max(0, pad - j)``."""
        return max(0, self.pad - j), max(0, self.pad - (self.k - 1 - j))

    def slice(self, j: int) -> Tuple[int, int]:
        """For tap ``j``: the rows ``[start, end_from_last)`` of the upsampled map read,
        as a start and a count of rows left out at the end."""
        return max(0, j - self.pad), max(0, (self.k - 1 - j) - self.pad)


def geometry_error(n_in: int, n_up: int, mode: str, align_corners: bool,
                   scale: Optional[float]) -> float:
    """Largest row L1 distance between the interpolation weights PyTorch computes in
    float32 along one axis and the float64 weights of the formulas (0.0 for nearest,
    for a copied axis and where PyTorch's coordinates are exact, e.g. powers of two)."""
    if mode != 'bilinear' or (scale is None and n_in == n_up):
        return 0.0
    return _linear_geometry_error(n_in, n_up, bool(align_corners), scale)


@lru_cache(maxsize=256)
def _linear_geometry_error(n_in: int, n_up: int, align_corners: bool,
                           scale: Optional[float]) -> float:
    i0, i1, w0, w1 = (t.numpy() for t in linear_taps(n_in, n_up, align_corners, scale))
    torch_w = np.zeros((n_up, n_in))
    rows = np.arange(n_up)
    np.add.at(torch_w, (rows, i0), w0.astype(np.float64))
    np.add.at(torch_w, (rows, i1), w1.astype(np.float64))
    exact = ref.interpolation_matrix(n_in, n_up, 'bilinear', align_corners, scale).numpy()
    return float(np.abs(torch_w - exact).sum(1).max())
