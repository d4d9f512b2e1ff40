"""``resize_conv2d``: an integer-factor upsample followed by a convolution, computed from
the low-resolution input.

``resize_conv2d(x, w, b, size=..., mode=..., ...)`` equals
``F.conv2d(F.interpolate(x, size=..., mode=..., align_corners=...), w, b, stride, padding,
dilation, groups)``. Where the rewrite applies (:func:`resize_conv2d_plan`) the upsampled
intermediate is never made. Per axis, output index ``D = s*I + q`` (``s`` the factor,
``q`` the output phase) of the full-resolution convolution reads upsampled positions
``s*I + q + k - P`` (``k`` the tap, ``P`` the zero padding); writing ``q + k - P = s*m +
p``, the upsampled value there is a fixed combination of low-resolution values ``x[I + m
+ t]`` (the interpolation taps of phase ``p``, with PyTorch's index clamping read as edge
replication). So each output phase ``(qh, qw)`` is a fixed linear function of a small
window of the edge-replicated low-resolution input, with coefficients
``Gh[kh, rh] Gw[kw, rw]`` per tap and low-resolution offset. Two methods compute it; the
plan takes the one with fewer multiply-accumulates (:data:`METHODS`):

* ``'mix_first'``: the channel mixing commutes with the interpolation and with the
  convolution's spatial shifts (both act on each channel alone), so each tap's
  ``C_out x C_in`` matrix is applied to the low-resolution input first (one product
  giving ``kH * kW * C_out`` maps, at ``1 / (s_h * s_w)`` of the direct convolution's
  cost), then each channel's phases are one convolution of its ``kH * kW`` maps with the
  fixed kernel ``V[(qh, qw), (kh, kw), rh, rw] = Gh[kh, rh] Gw[kw, rw]`` (interpolation
  weights only: the same for every channel, independent of ``w``);
* ``'polyphase'``: each phase is a convolution of the input with the kernel
  ``V[o, i, rh, rw] = sum_{kh, kw} w[o, i, kh, kw] Gh[kh, rh] Gw[kw, rw]``, which covers
  only the low-resolution taps that phase reads; phases with the same footprint are
  computed by one convolution (output channels ``(o, phase)``). Cheaper for few input
  channels.

The phase outputs are interleaved: written in place in eager mode, concatenated and
``F.pixel_shuffle``-d (ONNX ``DepthToSpace``) while a tracer records the op. The output
rows and columns whose taps reach the convolution's zero padding (``P`` at each end of
each axis) are recomputed directly: the upsampled rows they read (zero rows included),
interpolated along both axes as a thin strip, convolved with ``weight``.

Both are exact in real arithmetic; in floating point the sums are reordered and the
kernels' coefficients are rounded to the input dtype (bound:
:func:`resize_conv2d_error_bound`). Everything is written with differentiable torch ops
(autograd, ``gradcheck``). Calls outside the rewrite's domain run the composition itself
(the project's ``upsample``, which is ``F.interpolate``, then ``F.conv2d``).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from fractions import Fraction
from functools import lru_cache
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
#: dtypes the rewrite runs (others take the composition)
REWRITE_DTYPES = (torch.float32, torch.float64)
#: interpolation modes whose integer-factor resize has constant phases
REWRITE_MODES = ('nearest', 'nearest-exact', 'bilinear')
#: ``'footprint'``: one convolution per run of phases with the same low-resolution
#: footprint (no zero taps); ``'union'``: one convolution per axis pair over the union
#: of the footprints (fewer, larger convolutions with zero taps)
GROUPINGS = ('footprint', 'union')
#: how the output phases are computed (module doc); ``'auto'``: the one with fewer
#: multiply-accumulates
METHODS = ('auto', 'mix_first', 'polyphase')
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
    """Whether the rewrite applies to a call, how, and its figures.

    Attributes:
        applies: the rewrite runs (else the composition does).
        reason: why not ('' when it applies).
        method: ``'mix_first'`` or ``'polyphase'`` (None when it does not apply).
        factors: per axis the integer factor ``s`` (None when it does not apply).
        up_size: the upsampled size the composition makes.
        out_size: the convolution's output size.
        macs_direct: multiply-accumulates of the composition's convolution.
        macs_rewritten: those of the method that runs (its products and convolutions,
            border strips included); equal to ``macs_direct`` when it does not apply.
    """

    applies: bool
    reason: str
    factors: Optional[Tuple[int, int]]
    up_size: Optional[Tuple[int, int]]
    out_size: Optional[Tuple[int, int]]
    macs_direct: Optional[int]
    macs_rewritten: Optional[int]
    method: Optional[str] = None
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


def _make_plan(in_shape, w_shape, dtype, args: _Args, grouping: str = 'footprint',
               method: str = 'auto') -> ResizeConvPlan:
    if any(geo.is_symbolic(d) for d in tuple(in_shape) + tuple(w_shape)):
        return _not_applied('symbolic (dynamic) input sizes')
    return _plan_of(tuple(in_shape), tuple(w_shape), dtype, args, grouping, method)


@lru_cache(maxsize=256)
def _plan_of(in_shape, w_shape, dtype, args: _Args, grouping: str,
             method: str) -> ResizeConvPlan:
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

    if dtype is not None and dtype not in REWRITE_DTYPES:
        return no(f'dtype {dtype}: the rewrite runs float32 and float64')
    if args.groups != 1:
        return no(f'groups={args.groups} (the rewrite takes groups=1)')
    if args.stride != (1, 1):
        return no(f'stride={args.stride} (the rewrite takes stride 1)')
    if args.dilation != (1, 1):
        return no(f'dilation={args.dilation} (the rewrite takes dilation 1)')
    if pads is None:
        return no("padding='same' with an even kernel pads asymmetrically")
    if args.upsample.mode not in REWRITE_MODES:
        return no(f'mode={args.upsample.mode!r}: the rewrite takes {REWRITE_MODES}')
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
    n, cout, cin = int(in_shape[0]), w_shape[0], w_shape[1]
    union = tuple(replace(ax, grouping='union') for ax in axes)
    candidates = {'polyphase': (n * cout * cin * _macs(*axes), tuple(axes)),
                  'mix_first': (n * _mix_first_macs(*union, cin, cout), union)}
    if method == 'auto':
        # fewer multiply-accumulates; polyphase on a tie (its kernels need no C_out
        # intermediate maps)
        method = 'mix_first' if candidates['mix_first'][0] < candidates['polyphase'][0] \
            else 'polyphase'
    macs, chosen = candidates[method]
    return ResizeConvPlan(True, '', (axes[0].s, axes[1].s), up, out, macs_direct, macs,
                          method, chosen, tuple(errors))


def _not_applied(reason: str) -> ResizeConvPlan:
    return ResizeConvPlan(False, reason, None, None, None, None, None)


def _border_macs(ah: _Axis, aw: _Axis) -> int:
    """Per (output channel, input channel) pair: the border rows and columns computed
    directly (a ``kH x kW`` sum each)."""
    (top, bottom), (left, right) = ah.border, aw.border
    border_rows = top + ah.n_out - bottom
    border_cols = left + aw.n_out - right
    return ah.k * aw.k * (border_rows * aw.n_out + border_cols * ah.n_out)


def _macs(ah: _Axis, aw: _Axis) -> int:
    """Multiply-accumulates per (output channel, input channel) pair of the polyphase
    method: the phase convolutions, then the border rows and columns."""
    total = 0
    for (q0, q1, lo, hi) in ah.groups:
        for (p0, p1, lo2, hi2) in aw.groups:
            total += (q1 - q0) * (p1 - p0) * (hi - lo + 1) * (hi2 - lo2 + 1) * \
                ah.blocks * aw.blocks
    return total + _border_macs(ah, aw)


def _span(axis: _Axis) -> Tuple[int, int]:
    """Union footprint ``(lo, taps)`` of an axis (its single ``'union'`` group)."""
    (_, _, lo, hi), = axis.groups
    return lo, hi - lo + 1


def _mix_first_macs(ah: _Axis, aw: _Axis, cin: int, cout: int) -> int:
    """Multiply-accumulates per sample of the mix-first method (``'union'`` axes): the
    channel mixing over the replicated low-resolution window, the per-channel phase
    convolution, the border rows and columns."""
    (_, th), (_, tw) = _span(ah), _span(aw)
    kk = ah.k * aw.k
    mixing = cout * kk * cin * (ah.blocks + th - 1) * (aw.blocks + tw - 1)
    phases = cout * ah.s * aw.s * kk * th * tw * ah.blocks * aw.blocks
    return mixing + phases + cout * cin * _border_macs(ah, aw)


def resize_conv2d_plan(input, weight, bias=None, *, size=None, scale_factor=None,
                       mode: str = 'bilinear', align_corners=False, stride=1, padding=0,
                       dilation=1, groups=1, grouping: str = 'footprint',
                       method: str = 'auto') -> ResizeConvPlan:
    """Whether :func:`resize_conv2d` rewrites the call for these arguments (and why not),
    and how.

    Args:
        input: the input tensor, or its shape ``(N, C, H, W)``.
        weight: the weight tensor, or its shape ``(C_out, C_in / groups, kH, kW)``.
        bias, size, scale_factor, mode, align_corners, stride, padding, dilation, groups:
            as :func:`resize_conv2d`.
        grouping: the polyphase method's phase grouping, ``'footprint'`` (default) or
            ``'union'`` (see :data:`GROUPINGS`).
        method: ``'auto'`` (default: what :func:`resize_conv2d` runs, the method with
            fewer multiply-accumulates), ``'mix_first'`` or ``'polyphase'``.

    Returns:
        a :class:`ResizeConvPlan` (``applies``, ``reason``, ``method``, factors, sizes, MAC
        counts).

    Raises:
        TypeError, ValueError: invalid arguments (as :func:`resize_conv2d`).
    """
    args = _check_args(size, scale_factor, mode, align_corners, stride, padding, dilation,
                       groups)
    if grouping not in GROUPINGS:
        raise ValueError(f'grouping must be one of {GROUPINGS}, got {grouping!r}')
    if method not in METHODS:
        raise ValueError(f'method must be one of {METHODS}, got {method!r}')
    in_shape = _shape_of(input, 'input', 4)
    w_shape = _shape_of(weight, 'weight', 4)
    _check_shapes(in_shape, w_shape, bias, args)
    dtype = input.dtype if isinstance(input, torch.Tensor) else None
    return _make_plan(in_shape, w_shape, dtype, args, grouping, method)


def resize_conv2d_macs(input, weight, *, size=None, scale_factor=None, mode='bilinear',
                       align_corners=False, stride=1, padding=0, dilation=1, groups=1,
                       grouping: str = 'footprint', method: str = 'auto') -> Tuple[int, int]:
    """``(direct, rewritten)`` multiply-accumulates of :func:`resize_conv2d` for these
    shapes (``input``/``weight`` tensors or shapes): the composition's convolution, and
    the rewrite's products and convolutions, border strips included (the same as direct
    where the rewrite does not apply). Interpolation arithmetic is not counted."""
    plan = resize_conv2d_plan(input, weight, size=size, scale_factor=scale_factor, mode=mode,
                              align_corners=align_corners, stride=stride, padding=padding,
                              dilation=dilation, groups=groups, grouping=grouping,
                              method=method)
    return plan.macs_direct, plan.macs_rewritten


def _rounding_terms(plan: ResizeConvPlan, cin: int) -> Tuple[int, int]:
    """``(interior, border)``: the ``m`` of ``gamma(m)`` for the outputs the method
    computes and for the border rows and columns computed directly (see
    :func:`resize_conv2d_error_bound`)."""
    ah, aw = plan.axes
    kk = ah.k * aw.k
    # border strips: two interpolations (a weight rounded from its exact value, at most
    # two products and a sum, per axis), then the direct sum of cin * kk products + bias
    border = cin * kk + 1 + 6
    if plan.method == 'mix_first':
        (_, th), (_, tw) = _span(ah), _span(aw)
        # cin products + bias per mixed map; kk * th * tw terms per phase output;
        # a phase-kernel coefficient: two exact per-axis values rounded, their product
        return border, (cin + 1) + kk * th * tw + 3
    taps = max(g[3] - g[2] + 1 for g in ah.groups) * max(g[3] - g[2] + 1 for g in aw.groups)
    # cin * taps products + bias; a phase-kernel entry: its coefficient (3 roundings, as
    # above) times w, summed over kk taps
    return border, cin * taps + 1 + kk + 3


def resize_conv2d_error_bound(input: torch.Tensor, weight: torch.Tensor, bias=None, *,
                              size=None, scale_factor=None, mode: str = 'bilinear',
                              align_corners=False, padding=0,
                              method: str = 'auto') -> torch.Tensor:
    """Per output element, a bound on ``|rewritten - exact|`` (float64 tensor of the
    output's shape): ``rewritten`` the result of ``method`` (``'auto'``: what
    :func:`resize_conv2d` runs), ``exact`` the composition in exact arithmetic with exact
    interpolation weights; for a call the rewrite takes (``ValueError`` otherwise).

    With ``M = conv(up(|x|), |w|) + |b|`` (the composition of absolute values: the
    nearest and bilinear weights, and so every coefficient of both methods, are
    non-negative) and ``u`` the unit roundoff of the dtype, the result is within
    ``gamma(m) * M`` (``gamma(m) = m u / (1 - m u)``), ``m`` the roundings one output
    goes through (``kk = kH * kW``; ``Th``, ``Tw`` footprint widths):

    * mix_first: ``C_in + 1`` (a mixed map: the products and the bias) ``+ kk * Th * Tw``
      (the per-channel phase sum over the union footprint) ``+ 3`` (a coefficient);
    * polyphase: ``C_in * Th * Tw + 1`` (widest footprint) ``+ kk + 3`` (a phase-kernel
      entry: the coefficient, then a sum of ``kk`` products with ``w``);
    * border rows and columns (both methods): ``C_in * kk + 1 + 6`` (a direct sum over a
      strip interpolated along both axes).

    The composition run in the same dtype obeys the same kind of bound plus PyTorch's
    geometry error (``plan.geometry_error``; 0 for nearest and power-of-two factors):
    ``(eh + ew + eh * ew) * sum |w| * max |x|``, included here, so twice this bound holds
    between the rewritten result and the composition.
    """
    plan = resize_conv2d_plan(input, weight, bias, size=size, scale_factor=scale_factor,
                              mode=mode, align_corners=align_corners, padding=padding,
                              method=method)
    if not plan.applies:
        raise ValueError(f'{NAME}: the rewrite does not apply ({plan.reason})')
    ah, aw = plan.axes
    border, interior = _rounding_terms(plan, weight.shape[1])
    u = _UNIT_ROUNDING[input.dtype]
    m = torch.full(plan.out_size, float(border), dtype=torch.float64)
    (top, bottom), (left, right) = ah.border, aw.border
    m[top:bottom, left:right] = float(interior)
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
    the rewrite applies (:func:`resize_conv2d_plan`; the method with fewer
    multiply-accumulates runs).

    Args:
        input: ``(N, C, H, W)`` floating tensor (contiguous or channels_last).
        weight: ``(C_out, C / groups, kH, kW)`` tensor of ``input``'s dtype and device.
        bias: None or ``(C_out,)``.
        size, scale_factor: as ``F.interpolate`` (exactly one).
        mode: any ``F.interpolate`` mode; the rewrite takes ``'nearest'``,
            ``'nearest-exact'`` and ``'bilinear'``. ``align_corners`` False means "not
            set" for the nearest modes.
        align_corners: bilinear: ``False`` (half-pixel) is rewritten for
            ``out == s * in``; ``True`` for ``out - 1 == s * (in - 1)`` (the grids align;
            ``out == s * in`` is then not a constant-phase resize and runs the
            composition).
        stride, padding, dilation, groups: as ``F.conv2d`` (padding an int, a pair,
            ``'valid'`` or ``'same'``); the rewrite takes stride 1, dilation 1, groups 1
            and symmetric zero padding.

    Returns:
        ``(N, C_out, H_out, W_out)``, channels_last when the input or weight is. Where the
        rewrite runs, values are within float rounding of the composition (bound:
        :func:`resize_conv2d_error_bound`), differentiable with respect to input, weight
        and bias.

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
    if torch.compiler.is_compiling() and not torch.compiler.is_exporting():
        # torch.compile: the plan's geometry (exact rationals, NumPy coefficient tables)
        # is Python work Dynamo cannot trace; the composition compiles (export, ONNX
        # export and jit take the rewrite)
        return _composition(input, weight, bias, args)
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
    out = _run(input, weight, bias, ah, aw, plan.method)
    if is_channels_last(input) or is_channels_last(weight):
        return out.contiguous(memory_format=torch.channels_last)
    return out.contiguous()


def _run(x: torch.Tensor, w: torch.Tensor, b, ah: _Axis, aw: _Axis,
         method: str) -> torch.Tensor:
    """The convolution of the zero-padded upsampled ``x``: the output phases everywhere,
    the rows and columns that reach the zero padding replaced by a direct convolution of
    thin upsampled strips."""
    n, cout = x.shape[0], w.shape[0]
    phases = _mix_first_phases(x, w, b, ah, aw) if method == 'mix_first' else \
        _polyphase_phases(x, w, b, ah, aw)
    (top, bottom), (left, right) = ah.border, aw.border
    # upsampled rows [-P, top - P + k - 1) (zero rows included), all columns; etc.
    rows = _borders(x, w, b, ah, aw, 2, top, bottom)
    cols = _borders(x, w, b, aw, ah, 3, left, right)
    if _tracing():
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


def _tracing() -> bool:
    """Whether a tracer records the op (export, compile, jit): the assembly then takes
    the form of concatenations and ``pixel_shuffle`` (ONNX ``DepthToSpace``)."""
    return standard_export_tracing() or torch.compiler.is_compiling() or \
        torch.jit.is_tracing() or torch.jit.is_scripting()


def _assemble_traceable(phases, rows, cols, n, cout, ah: _Axis, aw: _Axis):
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


def _replicated_window(x: torch.Tensor, ah: _Axis, aw: _Axis, lo: int, th: int, lo2: int,
                       tw: int) -> torch.Tensor:
    """The edge-replicated input over the low-resolution offsets a phase group reads:
    rows ``[lo, blocks_h - 1 + lo + th)``, columns likewise (clamped indices, as
    PyTorch's interpolation clamps its source indices)."""
    ph, pw = ah.replicate_pad, aw.replicate_pad
    xr = F.pad(x, (pw[0], pw[1], ph[0], ph[1]), mode='replicate') if ph + pw != (0,) * 4 \
        else x
    return xr[:, :, lo + ph[0]:lo + ph[0] + ah.blocks + th - 1,
              lo2 + pw[0]:lo2 + pw[0] + aw.blocks + tw - 1]


def _polyphase_phases(x: torch.Tensor, w: torch.Tensor, b, ah: _Axis, aw: _Axis) -> list:
    """The phase convolutions of the edge-replicated ``x``: ``[(gh, gw, (0, C_out), y),
    ...]`` with ``y`` of shape ``(N, C_out * phases, blocks_h, blocks_w)``, channels
    ``(o, a, b)`` (exact away from the zero padding)."""
    result = []
    for gh, gw, v in _cached_kernels(w, ah, aw):
        (q0, q1, lo, hi), (p0, p1, lo2, hi2) = gh, gw
        xs = _replicated_window(x, ah, aw, lo, hi - lo + 1, lo2, hi2 - lo2 + 1)
        bias = None if b is None else b.repeat_interleave((q1 - q0) * (p1 - p0))
        result.append((gh, gw, (0, w.shape[0]), F.conv2d(xs, v, bias)))
    return result


def pointwise_conv2d(x: torch.Tensor, w: torch.Tensor, bias=None) -> torch.Tensor:
    """``F.conv2d(x, w, bias)`` for a 1x1 ``w`` (or its ``(C_out, C_in)`` matrix). On
    contiguous CPU tensors in eager mode a batched matrix product (the same sums; on the
    development CPU a 1x1 convolution of low-resolution maps ran up to half as fast);
    traced and exported calls and other devices keep the convolution (what exporters
    and the NPU planner know)."""
    if x.device.type != 'cpu' or not x.is_contiguous() or _tracing():
        return F.conv2d(x, w.reshape(w.shape[0], -1, 1, 1), bias)
    n, c, h, wd = x.shape
    # bmm of the (broadcast) weight: its result is already (N, C_out, H*W); matmul would
    # compute the transposed product and copy it back
    out = torch.bmm(w.reshape(w.shape[0], c).expand(n, -1, -1), x.view(n, c, h * wd))
    if bias is not None:
        out = out.add_(bias.view(1, -1, 1))
    return out.view(n, -1, h, wd)


@lru_cache(maxsize=128)
def _mix_first_matrix(ah: _Axis, aw: _Axis) -> np.ndarray:
    """``V[(a, b), (kh, kw), rh, rw]``: the coefficient of mixed map ``(kh, kw)`` at
    low-resolution offset ``(rh, rw)`` (from the union footprint's ``lo``) in output
    phase ``(a, b)`` (float64; products of the exact per-axis weights)."""
    (gh,), (gw,) = ah.groups, aw.groups
    t = _phase_matrix(ah, aw, gh, gw)  # ((a, b, rh, rw), (kh, kw))
    (_, th), (_, tw) = _span(ah), _span(aw)
    v = t.reshape(ah.s * aw.s, th, tw, ah.k * aw.k).transpose(0, 3, 1, 2).copy()
    v.setflags(write=False)
    return v


def _mix_first_phases(x: torch.Tensor, w: torch.Tensor, b, ah: _Axis, aw: _Axis) -> list:
    """The output phases by mixing channels first: ``z[(o, kh, kw)] = w[o, :, kh, kw] ·
    x_r`` on the edge-replicated low-resolution window ``x_r`` (the bias in the first
    tap's maps: every phase weighs each map's values with interpolation weights that sum
    to one), then per channel ``o`` one convolution of its ``kH * kW`` maps with the
    fixed kernel ``V`` (:func:`_mix_first_matrix`), giving its ``s_h * s_w`` phases.
    Eagerly, output channels go in chunks so that the mixed maps of one chunk are no
    larger than its output. ``[(gh, gw, (c0, c1), y), ...]`` as
    :func:`_polyphase_phases`."""
    (gh,), (gw,) = ah.groups, aw.groups
    (lo, th), (lo2, tw) = _span(ah), _span(aw)
    xs = _replicated_window(x, ah, aw, lo, th, lo2, tw)
    n, cin, hp, wp = xs.shape
    cout, kk, phases = w.shape[0], ah.k * aw.k, ah.s * aw.s
    v = torch.tensor(_mix_first_matrix(ah, aw), dtype=x.dtype, device=x.device)
    # rows (o, kh, kw) of the mixing matrix
    w_mix = w.reshape(cout, cin, kk).transpose(1, 2).reshape(cout * kk, cin)
    tracing = _tracing()
    if not tracing:
        xs = xs.contiguous()
    chunks = 1 if tracing else max(1, min(cout, -(-kk * hp * wp // (
        phases * ah.blocks * aw.blocks))))
    step = -(-cout // chunks)
    result = []
    for c0 in range(0, cout, step):
        c1 = min(cout, c0 + step)
        rows = w_mix[c0 * kk:c1 * kk]
        if b is None:
            z = pointwise_conv2d(xs, rows)
        elif tracing or x.device.type != 'cpu':
            z = pointwise_conv2d(xs, rows, F.pad(b[c0:c1].view(-1, 1), (0, kk - 1)).flatten())
        else:
            z = pointwise_conv2d(xs, rows)
            z.view(n, c1 - c0, kk, hp * wp)[:, :, 0].add_(b[c0:c1].view(1, -1, 1))
        y = F.conv2d(z.reshape(n * (c1 - c0), kk, hp, wp), v)
        result.append((gh, gw, (c0, c1), y.reshape(n, (c1 - c0) * phases, ah.blocks,
                                                   aw.blocks)))
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
