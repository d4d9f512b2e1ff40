"""The plan of a ``resize_conv2d`` call: argument checks, whether the rewrite applies,
which method runs and its figures."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Optional, Tuple

import torch

from ...core import geometry as geo
from ...core.errors import ArgumentError, InputRankError
from ...core.resize_taps import PhaseAxis, ShiftAxis, geometry_error, phase_taps_of

NAME = 'resize_conv2d'
#: dtypes the rewrite computes in (half inputs under autocast are computed in float32,
#: see :func:`mmseg_cann.ops.resize_conv.resize_conv2d`; others take the composition)
REWRITE_DTYPES = (torch.float32, torch.float64)
#: interpolation modes the rewrite takes (non-negative weights that sum to one)
REWRITE_MODES = ('nearest', 'nearest-exact', 'bilinear')
#: ``'footprint'``: one convolution per run of phases with the same low-resolution
#: footprint (no zero taps); ``'union'``: one convolution per axis pair over the union
#: of the footprints (fewer, larger convolutions with zero taps)
GROUPINGS = ('footprint', 'union')
#: how the output is computed (package doc); ``'auto'``: the phase method with the fewest
#: multiply-accumulates where an integer factor allows, else mix-resize, or the
#: composition where the chosen method has no fewer multiply-accumulates than it
METHODS = ('auto', 'mix_first', 'polyphase', 'mix_resize')
#: the methods that need an integer factor with constant phases on both axes
PHASE_METHODS = ('mix_first', 'polyphase')
#: interpolation products per output value along an axis that changes size
_AXIS_TAPS = {'nearest': 0, 'nearest-exact': 0, 'bilinear': 2}


@dataclass(frozen=True)
class ResizeConvPlan:
    """Whether the rewrite applies to a call, how, and its figures.

    Attributes:
        applies: the rewrite runs (else the composition does).
        reason: why not ('' when it applies).
        factors: per axis the integer factor ``s`` of the phase methods (None for
            ``'mix_resize'`` and where the rewrite does not apply).
        up_size: the upsampled size the composition makes.
        out_size: the convolution's output size.
        macs_direct: multiply-accumulates of the composition's convolution.
        macs_rewritten: those of the method that runs (its products, convolutions,
            border strips and, for ``'mix_resize'``, its interpolations and shifted
            sums); equal to ``macs_direct`` when it does not apply. None for symbolic
            sizes.
        method: ``'mix_first'``, ``'polyphase'`` or ``'mix_resize'`` (None when it does
            not apply).
    """

    applies: bool
    reason: str
    factors: Optional[Tuple[int, int]]
    up_size: Optional[Tuple[int, int]]
    out_size: Optional[Tuple[int, int]]
    macs_direct: Optional[int]
    macs_rewritten: Optional[int]
    method: Optional[str] = None
    #: per axis a :class:`PhaseAxis` (phase methods) or :class:`ShiftAxis` (mix_resize)
    axes: Optional[tuple] = field(default=None, repr=False, compare=False)
    #: per axis the arguments of :func:`~mmseg_cann.core.resize_taps.geometry_error`
    _geometry: tuple = field(default=(), repr=False, compare=False)
    #: the call's validated arguments (the methods read the mode)
    args: Optional['Args'] = field(default=None, repr=False, compare=False)

    @property
    def geometry_error(self) -> Tuple[float, float]:
        """Per axis, the largest row L1 distance between PyTorch's float32 interpolation
        weights and the exact ones (0.0 for nearest, copied axes and power-of-two
        factors). Computed on demand (not while an export traces)."""
        if not self._geometry:
            return 0.0, 0.0
        return tuple(geometry_error(*g) for g in self._geometry)


@dataclass(frozen=True)
class Args:
    """The validated input-independent arguments of a call."""
    upsample: geo.UpsampleArgs
    stride: Tuple[int, int]
    padding: object  # pair or 'valid'/'same'
    dilation: Tuple[int, int]
    groups: int


def check_args(size, scale_factor, mode, align_corners, stride, padding, dilation,
               groups) -> Args:
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
    return Args(up, stride_p, padding_p, dilation_p, groups)


def shape_of(value, name: str, dims: int) -> Tuple[int, ...]:
    """The shape of a tensor (or a shape given as such), checked to have ``dims`` dims."""
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


def check_shapes(in_shape, w_shape, bias, args: Args) -> None:
    """Channel, bias and emptiness checks of the shapes (``ValueError`` naming them)."""
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
        b_shape = shape_of(bias, 'bias', 1) if not isinstance(bias, torch.Tensor) else \
            tuple(bias.shape)
        if b_shape != (w_shape[0],):
            raise ArgumentError(f'{NAME}: bias must have shape ({w_shape[0]},), got '
                                f'{b_shape}')


def conv_padding(args: Args, kernel: Tuple[int, int]):
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


def make_plan(in_shape, w_shape, dtype, args: Args, grouping: str = 'footprint',
              method: str = 'auto') -> ResizeConvPlan:
    """The plan for these shapes (cached for concrete sizes)."""
    if any(geo.is_symbolic(d) for d in tuple(in_shape) + tuple(w_shape)):
        return _plan(tuple(in_shape), tuple(w_shape), dtype, args, grouping, method)
    return _cached_plan(tuple(in_shape), tuple(w_shape), dtype, args, grouping, method)


@lru_cache(maxsize=256)
def _cached_plan(in_shape, w_shape, dtype, args: Args, grouping: str,
                 method: str) -> ResizeConvPlan:
    return _plan(in_shape, w_shape, dtype, args, grouping, method)


def _plan(in_shape, w_shape, dtype, args: Args, grouping: str,
          method: str) -> ResizeConvPlan:
    symbolic = any(geo.is_symbolic(d) for d in in_shape)
    kernel = (w_shape[2], w_shape[3])
    spatial = in_shape[2:]
    spec = geo.upsample_spec(spatial, args.upsample)
    up = spec.out_size
    pads = conv_padding(args, kernel)
    eff = [d * (k - 1) + 1 for d, k in zip(args.dilation, kernel)]
    if pads is not None:
        out = tuple((u + 2 * p - e) // st + 1
                    for u, p, e, st in zip(up, pads, eff, args.stride))
        if not symbolic and any(u + 2 * p < e for u, p, e in zip(up, pads, eff)):
            raise ArgumentError(f'{NAME}: the kernel {kernel} is larger than the padded '
                                f'upsampled input {tuple(u + 2 * p for u, p in zip(up, pads))}'
                                f" (Kernel size can't be greater than actual input size)")
    else:
        out = up
    macs_direct = None if symbolic else \
        int(in_shape[0]) * w_shape[0] * w_shape[1] * kernel[0] * kernel[1] * out[0] * out[1]

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
    if not geo.is_symbolic(in_shape[0]) and int(in_shape[0]) == 0:
        return no('empty batch')
    mode, aligned = args.upsample.mode, bool(args.upsample.align_corners)
    shift = tuple(ShiftAxis(spatial[a], up[a], kernel[a], pads[a], spec.kernel_scales[a],
                            _copied(spatial[a], up[a], spec.kernel_scales[a], mode))
                  for a in range(2))
    if all(ax.identity for ax in shift):
        return no('the resize does not change the size (a plain convolution)')
    if symbolic:
        # only bilinear mix_resize is size-generic: the phase methods need concrete
        # factors, mix_resize's nearest the concrete index tables
        if method in PHASE_METHODS or mode != 'bilinear':
            return no(f'symbolic sizes: mode={mode!r}, method={method!r} need concrete '
                      "sizes (symbolic sizes take bilinear 'mix_resize')")
        return ResizeConvPlan(True, '', None, up, out, None, None, 'mix_resize', shift,
                              (), args)
    n, cout, cin = int(in_shape[0]), w_shape[0], w_shape[1]
    geometry = tuple((spatial[a], up[a], mode, aligned, spec.kernel_scales[a])
                     for a in range(2))
    candidates = {}  # method -> (macs, axes, factors)
    phase_axes, why = [], ''
    for a, name in enumerate(('H', 'W')):
        s, taps, why = phase_taps_of(mode, args.upsample.align_corners, spatial[a], up[a],
                                     spec.kernel_scales[a], name)
        if why:
            break
        phase_axes.append(PhaseAxis(spatial[a], s, taps, up[a], kernel[a], pads[a],
                                    grouping))
    if not why:
        union = tuple(replace(ax, grouping='union') for ax in phase_axes)
        factors = (phase_axes[0].s, phase_axes[1].s)
        candidates['polyphase'] = (n * cout * cin * polyphase_macs(*phase_axes),
                                   tuple(phase_axes), factors)
        candidates['mix_first'] = (n * mix_first_macs(*union, cin, cout), union, factors)
    if why or method == 'mix_resize':
        candidates['mix_resize'] = (n * mix_resize_macs(*shift, cin, cout, mode), shift,
                                    None)
    if method in PHASE_METHODS and method not in candidates:
        return no(why)
    if method == 'auto':
        # the phase methods where they apply (their products run as convolutions: on the
        # CPU mix-first beat mix-resize on every UPerHead slice although mix-resize
        # counts fewer multiply-accumulates, whose interpolations are memory-bound),
        # else mix-resize; among the phase methods the fewest multiply-accumulates,
        # polyphase on a tie (its kernels need no C_out intermediate maps)
        method = min(candidates, key=lambda m: (candidates[m][0], m != 'polyphase'))
        if candidates[method][0] >= macs_direct:
            return no(f'the rewrite would take more multiply-accumulates '
                      f'({candidates[method][0]} by {method}) than the composition '
                      f'({macs_direct})')
    macs, axes, factors = candidates[method]
    return ResizeConvPlan(True, '', factors, up, out, macs_direct, macs, method, axes,
                          geometry if mode == 'bilinear' else (), args)


def _copied(n_in, n_up, scale, mode: str) -> bool:
    """Whether PyTorch leaves an axis as it is: equal sizes mapped with ``in / out``, or
    equal sizes in legacy nearest mode, which copies whatever the scale (bilinear copies
    too: :func:`geometry.upsample_spec` gives such an axis no scale). Unknown for
    symbolic sizes: then the axis is interpolated (a copy where the sizes agree)."""
    if geo.is_symbolic(n_in) or geo.is_symbolic(n_up):
        return False
    return n_in == n_up and (scale is None or mode == 'nearest')


def not_applied(reason: str) -> ResizeConvPlan:
    """A plan that does not apply, without figures."""
    return ResizeConvPlan(False, reason, None, None, None, None, None)


# ----------------------------------------------------------------------------------
# multiply-accumulates
# ----------------------------------------------------------------------------------
def _border_macs(ah: PhaseAxis, aw: PhaseAxis) -> int:
    """Per (output channel, input channel) pair: the border rows and columns computed
    directly (a ``kH x kW`` sum each)."""
    (top, bottom), (left, right) = ah.border, aw.border
    border_rows = top + ah.n_out - bottom
    border_cols = left + aw.n_out - right
    return ah.k * aw.k * (border_rows * aw.n_out + border_cols * ah.n_out)


def polyphase_macs(ah: PhaseAxis, aw: PhaseAxis) -> int:
    """Multiply-accumulates per (output channel, input channel) pair of the polyphase
    method: the phase convolutions, then the border rows and columns."""
    total = 0
    for (q0, q1, lo, hi) in ah.groups:
        for (p0, p1, lo2, hi2) in aw.groups:
            total += (q1 - q0) * (p1 - p0) * (hi - lo + 1) * (hi2 - lo2 + 1) * \
                ah.blocks * aw.blocks
    return total + _border_macs(ah, aw)


def mix_first_macs(ah: PhaseAxis, aw: PhaseAxis, cin: int, cout: int) -> int:
    """Multiply-accumulates per sample of the mix-first method (``'union'`` axes): the
    channel mixing over the replicated low-resolution window, the per-channel phase
    convolution, the border rows and columns."""
    (_, th), (_, tw) = ah.span, aw.span
    kk = ah.k * aw.k
    mixing = cout * kk * cin * (ah.blocks + th - 1) * (aw.blocks + tw - 1)
    phases = cout * ah.s * aw.s * kk * th * tw * ah.blocks * aw.blocks
    return mixing + phases + cout * cin * _border_macs(ah, aw)


def mix_resize_macs(ah: ShiftAxis, aw: ShiftAxis, cin: int, cout: int, mode: str) -> int:
    """Multiply-accumulates per sample of the mix-resize method: the channel mixing of
    every tap at low resolution, the width interpolation of each tap's ``C_out`` maps
    and their shifted sum per kernel row, the height interpolation of each row's sum
    and the shifted sum of the rows (an axis left as it is is not interpolated)."""
    kk = ah.k * aw.k
    tw = 0 if aw.identity else _AXIS_TAPS[mode]
    th = 0 if ah.identity else _AXIS_TAPS[mode]
    mixing = cout * kk * cin * ah.n_in * aw.n_in
    width = cout * kk * ah.n_in * (aw.n_up * tw + aw.n_out)
    height = cout * ah.k * aw.n_out * (ah.n_up * th + ah.n_out)
    return mixing + width + height
