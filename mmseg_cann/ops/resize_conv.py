"""``resize_conv2d``: an integer-factor upsample followed by a convolution, computed as a
polyphase convolution on the low-resolution input.

``resize_conv2d(x, w, b, size=..., mode=..., ...)`` equals
``F.conv2d(F.interpolate(x, size=..., mode=..., align_corners=...), w, b, stride, padding,
dilation, groups)``. Where the rewrite applies (:func:`resize_conv2d_plan`) the upsampled
intermediate is never made:

* per axis, output index ``D = s*I + q`` (``s`` the factor, ``q`` the phase) of the
  full-resolution convolution reads upsampled positions ``s*I + q + k - P`` (``k`` the
  tap, ``P`` the zero padding); writing ``q + k - P = s*m + p``, the upsampled value there
  is a fixed combination of low-resolution values ``x[I + m + t]`` (the interpolation taps
  of phase ``p``, with PyTorch's index clamping read as edge replication). So each output
  phase ``(qh, qw)`` is a small convolution of the edge-replicated low-resolution input
  with the kernel ``V[o, i, rh, rw] = sum_{kh, kw} w[o, i, kh, kw] Gh[kh, rh] Gw[kw, rw]``,
  which covers only the low-resolution taps that phase reads;
* phases with the same footprint are computed by one convolution (output channels
  ``(o, phase)``, kernel over exactly that footprint) and interleaved: written in place
  in eager mode, concatenated and ``F.pixel_shuffle``-d (ONNX ``DepthToSpace``) while a
  tracer records the op;
* the output rows and columns whose taps reach the convolution's zero padding (``P`` at
  each end of each axis) are recomputed directly: the upsampled rows they read (zero rows
  included), interpolated along both axes as a thin strip, convolved with ``weight``.

The combination is exact in real arithmetic; in floating point the sums are reordered and
the phase kernels are rounded to the input dtype (bound:
:func:`resize_conv2d_error_bound`). Everything is written with differentiable torch ops
(autograd, ``gradcheck``). Calls outside the rewrite's domain run the composition itself
(the project's ``upsample``, which is ``F.interpolate``, then ``F.conv2d``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from functools import cached_property, lru_cache
from typing import List, Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.weak import WeakIdKeyDictionary

from ..core import geometry as geo
from ..core import reference as ref
from ..core.errors import ArgumentError, InputRankError
from ..core.export_mode import standard_export_tracing
from ..core.taps import linear_taps
from ..core.validation import FLOATING_DTYPES, check_dtype, check_tensor, is_channels_last
from .upsample import upsample

NAME = 'resize_conv2d'
#: dtypes the polyphase path runs (others take the composition)
POLYPHASE_DTYPES = (torch.float32, torch.float64)
#: interpolation modes whose integer-factor resize has constant phases
POLYPHASE_MODES = ('nearest', 'nearest-exact', 'bilinear')
#: ``'footprint'``: one convolution per run of phases with the same low-resolution
#: footprint (no zero taps); ``'union'``: one convolution per axis pair over the union
#: of the footprints (fewer, larger convolutions with zero taps)
GROUPINGS = ('footprint', 'union')
_UNIT_ROUNDING = {torch.float32: 2.0 ** -24, torch.float64: 2.0 ** -53}


# ----------------------------------------------------------------------------------
# per-axis geometry
# ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Axis:
    """One spatial axis of the rewrite: upsampling by ``s``, then a ``k``-tap convolution
    with zero padding ``pad`` on both ends."""

    n_in: int
    s: int
    #: per input phase ``p``: ((offset t, weight), ...), u[s*I + p] = sum w * x[I + t]
    taps: Tuple[Tuple[Tuple[int, Fraction], ...], ...]
    #: upsampled size (``s * n_in``, or ``s * (n_in - 1) + 1`` for aligned corners)
    n_up: int
    k: int
    pad: int
    grouping: str = 'footprint'

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

    @cached_property
    def footprints(self) -> Tuple[Tuple[int, int], ...]:
        """Per output phase, the low-resolution offsets ``[lo, hi]`` it reads."""
        result = []
        for q in range(self.s):
            offsets = [r for (_, r) in self.phase_taps(q)]
            result.append((min(offsets), max(offsets)))
        return tuple(result)

    @cached_property
    def groups(self) -> Tuple[Tuple[int, int, int, int], ...]:
        """Runs of phases computed by one convolution: ``(q0, q1, lo, hi)``."""
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
def _interpolation(axis: _Axis, a: int, b: int) -> Tuple[int, int, tuple]:
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


def _axis_reason(mode: str, align_corners: Optional[bool], n_in: int, n_up: int,
                 scale: Optional[float], name: str):
    """``(s, taps, None)`` for an axis with constant phases, else ``(None, None, why)``."""
    if mode in geo.NEAREST_MODES:
        if n_up % n_in:
            return None, None, (f'{name}: output size {n_up} is not an integer multiple of '
                                f'the input size {n_in}')
        s = n_up // n_in
        # PyTorch's own index rule (float32 scale, its shortcuts) decides
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


@lru_cache(maxsize=256)
def _geometry_error(n_in: int, n_up: int, align_corners: bool, scale: Optional[float],
                    s: int, taps) -> float:
    """Largest row L1 distance between PyTorch's float32 bilinear weights and the exact
    phase weights along one axis (0 where PyTorch's coordinates are exact, e.g. powers
    of two)."""
    i0, i1, w0, w1 = (t.numpy() for t in linear_taps(n_in, n_up, align_corners, scale))
    torch_w = np.zeros((n_up, n_in))
    rows = np.arange(n_up)
    np.add.at(torch_w, (rows, i0), w0.astype(np.float64))
    np.add.at(torch_w, (rows, i1), w1.astype(np.float64))
    exact = np.zeros((n_up, n_in))
    for j in range(n_up):
        blk, p = divmod(j, s)
        for t, w in taps[p]:
            exact[j, min(max(blk + t, 0), n_in - 1)] += float(w)
    return float(np.abs(torch_w - exact).sum(1).max())


# ----------------------------------------------------------------------------------
# the plan
# ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class ResizeConvPlan:
    """Whether the polyphase path applies to a call, and its figures.

    Attributes:
        applies: the polyphase path runs (else the composition does).
        reason: why not ('' when it applies).
        factors: per axis the integer factor ``s`` (None when it does not apply).
        up_size: the upsampled size the composition makes.
        out_size: the convolution's output size.
        macs_direct: multiply-accumulates of the composition's convolution.
        macs_polyphase: those of the polyphase path (phase convolutions and border
            strips); equal to ``macs_direct`` when it does not apply.
    """

    applies: bool
    reason: str
    factors: Optional[Tuple[int, int]]
    up_size: Optional[Tuple[int, int]]
    out_size: Optional[Tuple[int, int]]
    macs_direct: Optional[int]
    macs_polyphase: Optional[int]
    axes: Optional[Tuple[_Axis, _Axis]] = field(default=None, repr=False, compare=False)
    _geometry: tuple = field(default=(), repr=False, compare=False)

    @property
    def geometry_error(self) -> Tuple[float, float]:
        """Per axis, the largest row L1 distance between PyTorch's float32 interpolation
        weights and the exact ones the phases use (0.0 for nearest and for power-of-two
        factors). Computed on demand (not while an export traces)."""
        return tuple(_geometry_error(*g) if g else 0.0 for g in self._geometry) \
            if self._geometry else (0.0, 0.0)


@dataclass(frozen=True)
class _Args:
    upsample: geo.UpsampleArgs
    stride: Tuple[int, int]
    padding: object  # pair or 'valid'/'same'
    dilation: Tuple[int, int]
    groups: int


def _check_args(size, scale_factor, mode, align_corners, stride, padding, dilation,
                groups) -> _Args:
    """Validate the input-independent arguments (``ValueError``/``TypeError`` naming them)."""
    if mode in geo.NEAREST_MODES + ('area',) and align_corners is False:
        align_corners = None  # the default False means "not set" for non-interpolating modes
    up = geo.check_upsample_args(size, scale_factor, mode, align_corners)
    stride_p = geo.int_pair(stride, 'stride', minimum=1)
    dilation_p = geo.int_pair(dilation, 'dilation', minimum=1)
    if isinstance(padding, str):
        if padding not in ('valid', 'same'):
            raise ValueError(f"padding must be an int, a pair of ints, 'valid' or 'same', "
                             f'got {padding!r}')
        if padding == 'same' and stride_p != (1, 1):
            raise ValueError("padding='same' is not supported for strided convolutions "
                             f'(stride={stride!r})')
        padding_p: object = padding
    else:
        padding_p = geo.int_pair(padding, 'padding', minimum=0)
    if isinstance(groups, bool) or not isinstance(groups, int):
        raise TypeError(f'groups must be a positive int, got {groups!r}')
    if groups < 1:
        raise ValueError(f'groups must be a positive int, got {groups!r}')
    return _Args(up, stride_p, padding_p, dilation_p, groups)


def _shape_of(value, name: str, dims: int) -> Tuple[int, ...]:
    if isinstance(value, torch.Tensor):
        shape = tuple(value.shape)
    elif isinstance(value, (tuple, list, torch.Size)):
        shape = tuple(value)
        if not all(isinstance(d, int) and not isinstance(d, bool) or geo.is_symbolic(d)
                   for d in shape):
            raise TypeError(f'{name} must be a tensor or a shape of ints, got {value!r}')
    else:
        raise TypeError(f'{name} must be a torch.Tensor (or a shape for the plan), '
                        f'got {type(value).__name__}')
    if len(shape) != dims:
        raise InputRankError(f'{NAME}: {name} must be {dims}-D, got shape {shape}')
    return shape


def _check_shapes(in_shape, w_shape, bias, args: _Args) -> None:
    if any(isinstance(d, int) and d == 0 for d in in_shape[1:]):
        raise ArgumentError(f'{NAME}: input channel and spatial dimensions must be '
                            f'non-empty, got shape {in_shape}')
    if any(d < 1 for d in w_shape if isinstance(d, int)):
        raise ArgumentError(f'{NAME}: weight dimensions must be non-empty, got {w_shape}')
    c = in_shape[1]
    if isinstance(c, int) and c != w_shape[1] * args.groups:
        raise ArgumentError(f'{NAME}: weight {w_shape} with groups={args.groups} takes '
                            f'{w_shape[1] * args.groups} input channels, input has {c}')
    if w_shape[0] % args.groups:
        raise ArgumentError(f'{NAME}: weight out_channels {w_shape[0]} is not divisible '
                            f'by groups={args.groups}')
    if bias is not None:
        b_shape = _shape_of(bias, 'bias', 1) if not isinstance(bias, torch.Tensor) else \
            tuple(bias.shape)
        if b_shape != (w_shape[0],):
            raise ArgumentError(f'{NAME}: bias must have shape ({w_shape[0]},), got '
                                f'{b_shape}')


def _conv_padding(args: _Args, kernel: Tuple[int, int]):
    """Symmetric padding pair, or None where PyTorch pads asymmetrically ('same' with
    an even dilated kernel)."""
    if args.padding == 'valid':
        return 0, 0
    if args.padding == 'same':
        total = [d * (k - 1) for d, k in zip(args.dilation, kernel)]
        if any(t % 2 for t in total):
            return None
        return total[0] // 2, total[1] // 2
    return args.padding


def _make_plan(in_shape, w_shape, dtype, args: _Args, grouping: str) -> ResizeConvPlan:
    if any(geo.is_symbolic(d) for d in tuple(in_shape) + tuple(w_shape)):
        return _not_applied('symbolic (dynamic) input sizes')
    return _plan_of(tuple(in_shape), tuple(w_shape), dtype, args, grouping)


@lru_cache(maxsize=256)
def _plan_of(in_shape, w_shape, dtype, args: _Args, grouping: str) -> ResizeConvPlan:
    kernel = (w_shape[2], w_shape[3])
    spatial = in_shape[2:]
    spec = geo.upsample_spec(spatial, args.upsample)
    up = spec.out_size
    pads = _conv_padding(args, kernel)
    eff = [d * (k - 1) + 1 for d, k in zip(args.dilation, kernel)]
    if pads is not None:
        out = tuple((u + 2 * p - e) // st + 1
                    for u, p, e, st in zip(up, pads, eff, args.stride))
        if any(u + 2 * p < e for u, p, e in zip(up, pads, eff)):
            raise ArgumentError(f'{NAME}: the kernel {kernel} is larger than the padded '
                                f'upsampled input {tuple(u + 2 * p for u, p in zip(up, pads))}'
                                f" (Kernel size can't be greater than actual input size)")
    else:
        out = up
    macs_direct = int(in_shape[0]) * w_shape[0] * w_shape[1] * kernel[0] * kernel[1] * \
        out[0] * out[1]

    def no(reason):
        return ResizeConvPlan(False, reason, None, up, out, macs_direct, macs_direct)

    if dtype is not None and dtype not in POLYPHASE_DTYPES:
        return no(f'dtype {dtype}: the polyphase path runs float32 and float64')
    if args.groups != 1:
        return no(f'groups={args.groups} (the polyphase path takes groups=1)')
    if args.stride != (1, 1):
        return no(f'stride={args.stride} (the polyphase path takes stride 1)')
    if args.dilation != (1, 1):
        return no(f'dilation={args.dilation} (the polyphase path takes dilation 1)')
    if pads is None:
        return no("padding='same' with an even kernel pads asymmetrically")
    if args.upsample.mode not in POLYPHASE_MODES:
        return no(f'mode={args.upsample.mode!r}: the polyphase path takes '
                  f'{POLYPHASE_MODES} (bicubic phases need more taps than the direct '
                  f'convolution)')
    if int(in_shape[0]) == 0:
        return no('empty batch')
    axes, errors = [], []
    for a, name in enumerate(('H', 'W')):
        s, taps, why = _axis_reason(args.upsample.mode, args.upsample.align_corners,
                                    spatial[a], up[a], spec.kernel_scales[a], name)
        if why:
            return no(why)
        axes.append(_Axis(spatial[a], s, taps, up[a], kernel[a], pads[a], grouping))
        errors.append((spatial[a], up[a], bool(args.upsample.align_corners),
                       spec.kernel_scales[a], s, taps)
                      if args.upsample.mode == 'bilinear' and s > 1 else ())
    if all(ax.identity for ax in axes):
        return no('the resize does not change the size (a plain convolution)')
    macs = int(in_shape[0]) * w_shape[0] * w_shape[1] * _macs(axes[0], axes[1])
    return ResizeConvPlan(True, '', (axes[0].s, axes[1].s), up, out, macs_direct, macs,
                          tuple(axes), tuple(errors))


def _not_applied(reason: str) -> ResizeConvPlan:
    return ResizeConvPlan(False, reason, None, None, None, None, None)


def _macs(ah: _Axis, aw: _Axis) -> int:
    """Multiply-accumulates per (output channel, input channel) pair of :func:`_run`:
    the phase convolutions, then the border rows and columns computed directly."""
    total = 0
    for (q0, q1, lo, hi) in ah.groups:
        for (p0, p1, lo2, hi2) in aw.groups:
            total += (q1 - q0) * (p1 - p0) * (hi - lo + 1) * (hi2 - lo2 + 1) * \
                ah.blocks * aw.blocks
    (top, bottom), (left, right) = ah.border, aw.border
    border_rows = top + ah.n_out - bottom
    border_cols = left + aw.n_out - right
    return total + ah.k * aw.k * (border_rows * aw.n_out + border_cols * ah.n_out)


def resize_conv2d_plan(input, weight, bias=None, *, size=None, scale_factor=None,
                       mode: str = 'bilinear', align_corners=False, stride=1, padding=0,
                       dilation=1, groups=1, grouping: str = 'footprint') -> ResizeConvPlan:
    """Whether :func:`resize_conv2d` takes the polyphase path for these arguments, and why
    not.

    Args:
        input: the input tensor, or its shape ``(N, C, H, W)``.
        weight: the weight tensor, or its shape ``(C_out, C_in / groups, kH, kW)``.
        bias, size, scale_factor, mode, align_corners, stride, padding, dilation, groups:
            as :func:`resize_conv2d`.
        grouping: ``'footprint'`` (default) or ``'union'`` (see :data:`GROUPINGS`).

    Returns:
        a :class:`ResizeConvPlan` (``applies``, ``reason``, factors, sizes, MAC counts).

    Raises:
        TypeError, ValueError: invalid arguments (as :func:`resize_conv2d`).
    """
    args = _check_args(size, scale_factor, mode, align_corners, stride, padding, dilation,
                       groups)
    if grouping not in GROUPINGS:
        raise ValueError(f'grouping must be one of {GROUPINGS}, got {grouping!r}')
    in_shape = _shape_of(input, 'input', 4)
    w_shape = _shape_of(weight, 'weight', 4)
    _check_shapes(in_shape, w_shape, bias, args)
    dtype = input.dtype if isinstance(input, torch.Tensor) else None
    return _make_plan(in_shape, w_shape, dtype, args, grouping)


def resize_conv2d_macs(input, weight, *, size=None, scale_factor=None, mode='bilinear',
                       align_corners=False, stride=1, padding=0, dilation=1, groups=1,
                       grouping: str = 'footprint') -> Tuple[int, int]:
    """``(direct, polyphase)`` multiply-accumulates of :func:`resize_conv2d` for these
    shapes (``input``/``weight`` tensors or shapes): the composition's convolution, and
    the polyphase path's phase convolutions plus border strips (the same as direct where
    the polyphase path does not apply). Interpolation arithmetic is not counted."""
    plan = resize_conv2d_plan(input, weight, size=size, scale_factor=scale_factor, mode=mode,
                              align_corners=align_corners, stride=stride, padding=padding,
                              dilation=dilation, groups=groups, grouping=grouping)
    return plan.macs_direct, plan.macs_polyphase


def resize_conv2d_error_bound(input: torch.Tensor, weight: torch.Tensor, bias=None, *,
                              size=None, scale_factor=None, mode: str = 'bilinear',
                              align_corners=False, padding=0) -> torch.Tensor:
    """Per output element, a bound on ``|resize_conv2d(...) - exact|`` (float64 tensor of
    the output's shape), ``exact`` being the composition in exact arithmetic with exact
    interpolation weights, for a call the polyphase path takes (``ValueError`` otherwise).

    With ``M = conv(up(|x|), |w|) + |b|`` (the composition of absolute values: the
    nearest and bilinear weights are non-negative), ``u`` the unit roundoff of the dtype,
    ``kk = kH * kW`` and ``n = C_in * max(kk, Th * Tw) + 1`` the most terms in one
    output's sum (``Th``, ``Tw`` the widest phase footprint; the bias is one term), the
    result is within ``gamma(n + kk + 4) * M`` (``gamma(m) = m u / (1 - m u)``):
    ``n`` roundings of the sum, ``kk + 1`` of a phase-kernel entry (an exact float64
    coefficient rounded to the dtype, then a sum of at most ``kk`` products), or, for the
    border outputs, 4 of the two interpolations of a strip value. The composition run in
    the same dtype obeys the same bound plus PyTorch's geometry error
    (``plan.geometry_error``; 0 for nearest and power-of-two factors):
    ``(eh + ew + eh * ew) * sum |w| * max |x|``, included here, so twice this bound holds
    between the polyphase result and the composition.
    """
    plan = resize_conv2d_plan(input, weight, bias, size=size, scale_factor=scale_factor,
                              mode=mode, align_corners=align_corners, padding=padding)
    if not plan.applies:
        raise ValueError(f'{NAME}: the polyphase path does not apply ({plan.reason})')
    ah, aw = plan.axes
    taps = max(ah.k * aw.k, max(g[3] - g[2] + 1 for g in ah.groups) *
               max(g[3] - g[2] + 1 for g in aw.groups))
    kk = ah.k * aw.k
    m = weight.shape[1] * taps + 1 + kk + 4
    u = _UNIT_ROUNDING[input.dtype]
    x_abs = input.detach().double().abs()
    w_abs = weight.detach().double().abs()
    interp = dict(mode=mode) if mode in geo.NEAREST_MODES else \
        dict(mode=mode, align_corners=align_corners)
    magnitude = F.conv2d(F.interpolate(x_abs, size=plan.up_size, **interp), w_abs,
                         None if bias is None else bias.detach().double().abs(),
                         padding=(ah.pad, aw.pad))
    eh, ew = plan.geometry_error
    geometry = (eh + ew + eh * ew) * float(x_abs.max()) * w_abs.sum((1, 2, 3))
    return magnitude * (m * u / (1 - m * u)) + geometry.view(1, -1, 1, 1)


# ----------------------------------------------------------------------------------
# the op
# ----------------------------------------------------------------------------------
def resize_conv2d(input: torch.Tensor, weight: torch.Tensor, bias=None, *, size=None,
                  scale_factor=None, mode: str = 'bilinear', align_corners=False, stride=1,
                  padding=0, dilation=1, groups=1) -> torch.Tensor:
    """``F.conv2d(F.interpolate(input, size, scale_factor, mode, align_corners), weight,
    bias, stride, padding, dilation, groups)`` without the upsampled intermediate where
    the polyphase rewrite applies (:func:`resize_conv2d_plan`).

    Args:
        input: ``(N, C, H, W)`` floating tensor (contiguous or channels_last).
        weight: ``(C_out, C / groups, kH, kW)`` tensor of ``input``'s dtype and device.
        bias: None or ``(C_out,)``.
        size, scale_factor: as ``F.interpolate`` (exactly one).
        mode: any ``F.interpolate`` mode; the polyphase path takes ``'nearest'``,
            ``'nearest-exact'`` and ``'bilinear'``. ``align_corners`` False means "not
            set" for the nearest modes.
        align_corners: bilinear: ``False`` (half-pixel) takes the polyphase path for
            ``out == s * in``; ``True`` for ``out - 1 == s * (in - 1)`` (the grids align;
            ``out == s * in`` is then not a constant-phase resize and runs the
            composition).
        stride, padding, dilation, groups: as ``F.conv2d`` (padding an int, a pair,
            ``'valid'`` or ``'same'``); the polyphase path takes stride 1, dilation 1,
            groups 1 and symmetric zero padding.

    Returns:
        ``(N, C_out, H_out, W_out)``, channels_last when the input or weight is. Where the
        polyphase path runs, values are within float rounding of the composition (bound:
        :func:`error_bound`), differentiable with respect to input, weight and bias.

    Raises:
        TypeError, ValueError: invalid arguments, naming the argument, before any work.
    """
    args = _check_args(size, scale_factor, mode, align_corners, stride, padding, dilation,
                       groups)
    check_tensor(input, NAME)
    if not isinstance(weight, torch.Tensor):
        raise TypeError(f'{NAME}: weight must be a torch.Tensor, got {type(weight).__name__}')
    if bias is not None and not isinstance(bias, torch.Tensor):
        raise TypeError(f'{NAME}: bias must be None or a torch.Tensor, got '
                        f'{type(bias).__name__}')
    in_shape = _shape_of(input, 'input', 4)
    w_shape = _shape_of(weight, 'weight', 4)
    check_dtype(input, NAME, FLOATING_DTYPES, 'conv2d')
    for name, t in (('weight', weight), ('bias', bias)):
        if t is not None and (t.dtype != input.dtype or t.device != input.device):
            raise TypeError(f'{NAME}: {name} must have the dtype and device of input '
                            f'({input.dtype} on {input.device}), got {t.dtype} on '
                            f'{t.device}')
    _check_shapes(in_shape, w_shape, bias, args)
    plan = _make_plan(in_shape, w_shape, input.dtype, args, 'footprint')
    if not plan.applies:
        return _composition(input, weight, bias, args)
    return _apply(input, weight, bias, plan)


def _composition(input, weight, bias, args: _Args) -> torch.Tensor:
    up = args.upsample
    resized = upsample(input, size=up.size, scale_factor=up.scale_factor, mode=up.mode,
                       align_corners=up.align_corners)
    return F.conv2d(resized, weight, bias, args.stride, args.padding, args.dilation,
                    args.groups)


def _apply(input, weight, bias, plan: ResizeConvPlan) -> torch.Tensor:
    ah, aw = plan.axes
    out = _run(input, weight, bias, ah, aw)
    if is_channels_last(input) or is_channels_last(weight):
        return out.contiguous(memory_format=torch.channels_last)
    return out.contiguous()


def _run(x: torch.Tensor, w: torch.Tensor, b, ah: _Axis, aw: _Axis) -> torch.Tensor:
    """The convolution of the zero-padded upsampled ``x``: the phase convolutions
    everywhere, the rows and columns that reach the zero padding replaced by a direct
    convolution of thin upsampled strips."""
    n, cout = x.shape[0], w.shape[0]
    phases = _phases(x, w, b, ah, aw)
    (top, bottom), (left, right) = ah.border, aw.border
    # upsampled rows [-P, top - P + k - 1) (zero rows included), all columns; etc.
    rows = _borders(x, w, b, ah, aw, 2, top, bottom)
    cols = _borders(x, w, b, aw, ah, 3, left, right)
    if _tracing():
        return _assemble_traceable(phases, rows, cols, n, cout, ah, aw)
    # one pass: every phase group and border strip written into its place
    out = x.new_empty((n, cout, ah.blocks, ah.s, aw.blocks, aw.s))
    for (q0, q1, _, _), (p0, p1, _, _), y in phases:
        out[:, :, :, q0:q1, :, p0:p1] = y.view(n, cout, q1 - q0, p1 - p0, ah.blocks,
                                               aw.blocks).permute(0, 1, 4, 2, 5, 3)
    out = out.view(n, cout, ah.blocks * ah.s, aw.blocks * aw.s)[:, :, :ah.n_out, :aw.n_out]
    for part, (start, end) in zip(rows, ((0, top), (bottom, ah.n_out))):
        if part is not None:
            out[:, :, start:end] = part
    for part, (start, end) in zip(cols, ((0, left), (right, aw.n_out))):
        if part is not None:
            out[:, :, :, start:end] = part
    return out


def _tracing() -> bool:
    """Whether a tracer records the op (export, compile, jit): the assembly then takes
    the form of concatenations and ``pixel_shuffle`` (ONNX ``DepthToSpace``)."""
    return standard_export_tracing() or torch.compiler.is_compiling() or \
        torch.jit.is_tracing() or torch.jit.is_scripting()


def _assemble_traceable(phases, rows, cols, n, cout, ah: _Axis, aw: _Axis):
    grid: List[List[torch.Tensor]] = []
    for (q0, q1, _, _), (p0, p1, _, _), y in phases:
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


def _borders(x, w, b, along: _Axis, other: _Axis, dim: int, first: int, last: int) -> list:
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


def _strip(x: torch.Tensor, axis: _Axis, dim: int, j0: int, j1: int) -> torch.Tensor:
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


@lru_cache(maxsize=512)
def _phase_matrix(ah: _Axis, aw: _Axis, gh: tuple, gw: tuple) -> np.ndarray:
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


def _phase_kernels(w: torch.Tensor, ah: _Axis, aw: _Axis) -> list:
    """Per phase group ``(gh, gw)``, the kernel ``(C_out * phases, C_in, Th, Tw)``
    (output channels ordered ``(o, a, b)``): ``[(gh, gw, kernel), ...]``."""
    cout, cin = w.shape[:2]
    # (o, kh*kw, i): one batched product per group gives (o, a, b, rh, rw, i)
    wt = w.reshape(cout, cin, ah.k * aw.k).transpose(1, 2)
    kernels = []
    for gh in ah.groups:
        for gw in aw.groups:
            t = torch.tensor(_phase_matrix(ah, aw, gh, gw), dtype=w.dtype, device=w.device)
            th, tw = gh[3] - gh[2] + 1, gw[3] - gw[2] + 1
            v = torch.matmul(t, wt).view(cout * (gh[1] - gh[0]) * (gw[1] - gw[0]), th, tw,
                                         cin)
            # contiguous (OIHW): oneDNN rounds less accurately with channels_last kernels
            kernels.append((gh, gw, v.permute(0, 3, 1, 2).contiguous()))
    return kernels


def _phases(x: torch.Tensor, w: torch.Tensor, b, ah: _Axis, aw: _Axis) -> list:
    """The phase convolutions of the edge-replicated ``x``: ``[(gh, gw, y), ...]`` with
    ``y`` of shape ``(N, C_out * phases, blocks_h, blocks_w)``, channels ``(o, a, b)``
    (exact away from the zero padding)."""
    ph, pw = ah.replicate_pad, aw.replicate_pad
    xr = F.pad(x, (pw[0], pw[1], ph[0], ph[1]), mode='replicate') if ph + pw != (0,) * 4 \
        else x
    result = []
    for gh, gw, v in _cached_kernels(w, ah, aw):
        (q0, q1, lo, hi), (p0, p1, lo2, hi2) = gh, gw
        xs = xr[:, :, lo + ph[0]:lo + ph[0] + ah.blocks + hi - lo,
                lo2 + pw[0]:lo2 + pw[0] + aw.blocks + hi2 - lo2]
        bias = None if b is None else b.repeat_interleave((q1 - q0) * (p1 - p0))
        result.append((gh, gw, F.conv2d(xs, v, bias)))
    return result


# Phase kernels of weights that need no gradient (inference), kept while the weight lives
# and is unchanged. Keyed on the weight's base tensor (a slice of a parameter, as
# ``torch.split(conv.weight, ...)`` gives, is a new view each call) and on the view's
# place in it; an in-place update bumps the shared ``_version`` and ``.data =`` changes
# the pointer: both drop the base's entries.
_KERNEL_CACHE = WeakIdKeyDictionary()
_MAX_VIEWS = 8


def _cached_kernels(w: torch.Tensor, ah: _Axis, aw: _Axis):
    if (torch.is_grad_enabled() and w.requires_grad) or torch.compiler.is_compiling() \
            or torch.compiler.is_exporting() or w.is_inference() \
            or type(w) not in (torch.Tensor, torch.nn.Parameter):
        # inference tensors have no version counter: nothing tells when they change
        return _phase_kernels(w, ah, aw)
    base = w if w._base is None else w._base
    state = (w._version, base.data_ptr(), base.dtype, base.device)
    key = (ah, aw, w.storage_offset(), tuple(w.shape), tuple(w.stride()))
    entry = _KERNEL_CACHE.get(base)
    if entry is None or entry[0] != state:
        entry = (state, {})
        _KERNEL_CACHE[base] = entry
    views = entry[1]
    if key not in views:
        if len(views) >= _MAX_VIEWS:
            views.pop(next(iter(views)))
        views[key] = _phase_kernels(w.detach(), ah, aw)
    return views[key]
