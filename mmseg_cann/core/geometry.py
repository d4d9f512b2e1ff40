"""Geometry of upsampling and pooling: the single source of truth.

Pure functions and small frozen specs, no tensors. Every backend, the float64
reference, the modules and the ONNX export take their output sizes, padding,
source-coordinate rules and argument validation from here, so the rules are written
exactly once.

Conventions follow PyTorch (``torch.nn.functional``):

* upsample output size is ``size`` or ``floor(in * scale_factor)``; when a user scale
  is given and ``recompute_scale_factor`` is not true, the coordinate mapping uses
  ``1 / scale_factor`` instead of ``in / out``;
* pooling output size is ``floor((in + 2p - d*(k-1) - 1) / s) + 1`` (``ceil`` with
  ``ceil_mode``, dropping a last window that would start in the right padding);
* the padding strings ``'same'``/``'same_upper'``/``'same_lower'``/``'valid'`` follow
  ONNX ``auto_pad``: output ``ceil(in / s)``, total padding
  ``max((out - 1) * s + d*(k-1) + 1 - in, 0)``, the odd cell at the end (upper) or at
  the start (lower).

Sizes may be symbolic (``torch.SymInt`` while ``torch.export`` traces with dynamic
shapes): the size rules below then build symbolic expressions and never call ``int()``
or ``bool()`` on a symbolic size (that would specialise it to the traced value). Where
a rule's outcome depends on the concrete size (PyTorch's ``ceil_mode`` window drop, a
size check that has to compare), the symbolic path builds a symbolic choice
(``torch.sym_ite``) or skips a check that only catches empty outputs; the ONNX export
refuses what ONNX cannot express for every size.
"""
from __future__ import annotations

import math
import numbers
import operator
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple, Union

from .errors import ArgumentError, UnsupportedModeError

UPSAMPLE_MODES = ('nearest', 'nearest-exact', 'bilinear', 'bicubic', 'area')
#: modes that interpolate (take ``align_corners`` and ``antialias``)
INTERPOLATING_MODES = ('bilinear', 'bicubic')
NEAREST_MODES = ('nearest', 'nearest-exact')
#: modes of the fused decoder ops (``upsample_add``, ``upsample_argmax``)
FUSED_MODES = NEAREST_MODES + ('bilinear',)
PADDING_STRINGS = ('valid', 'same', 'same_upper', 'same_lower')
#: Keys cubic-convolution coefficient used by PyTorch (and CANN) bicubic.
CUBIC_A = -0.75
#: Keys coefficient PyTorch uses for *antialiased* bicubic (as PIL does).
CUBIC_A_ANTIALIAS = -0.5

Pair = Tuple[int, int]


# ----------------------------------------------------------------------------------
# small argument helpers
# ----------------------------------------------------------------------------------
def is_symbolic(value) -> bool:
    """Whether ``value`` is a symbolic size (``torch.SymInt``, dynamic-shape tracing)."""
    if isinstance(value, (int, float, str, bool)) or value is None:
        return False
    import torch
    return isinstance(value, torch.SymInt)


def any_symbolic(values) -> bool:
    """Whether any of ``values`` is a symbolic size."""
    return any(is_symbolic(v) for v in values)


def same_sizes(a, b) -> bool:
    """Whether two sizes (or size tuples) are known to be equal without specialising a
    symbolic one: ints compare as ints, symbolic sizes by their expressions (the same
    symbols and arithmetic); an int and a symbolic size are not known to be equal, nor
    is a size that ``torch.jit.trace`` records as a tensor."""
    a = tuple(a) if isinstance(a, (tuple, list)) or hasattr(a, '__len__') else (a,)
    b = tuple(b) if isinstance(b, (tuple, list)) or hasattr(b, '__len__') else (b,)
    if len(a) != len(b):
        return False
    import torch
    for x, y in zip(a, b):
        if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
            return False  # a size jit.trace records: not fixed at its traced value
        if is_symbolic(x) or is_symbolic(y):
            if not (is_symbolic(x) and is_symbolic(y) and x.node.expr == y.node.expr):
                return False
        elif int(x) != int(y):
            return False
    return True


def size_value(value):
    """A size as a Python int, or unchanged when it is symbolic (no specialisation)."""
    return value if is_symbolic(value) else int(value)


def _is_int(value) -> bool:
    if isinstance(value, bool):
        return False
    if is_symbolic(value):
        return True  # operator.index() would specialise it
    try:
        operator.index(value)
    except TypeError:
        return False
    return True


def _to_int(value, name: str) -> int:
    if not _is_int(value):
        raise TypeError(f'{name} must be an integer, got {value!r} '
                        f'({type(value).__name__})')
    return value if is_symbolic(value) else operator.index(value)


def int_pair(value, name: str, *, minimum: Optional[int] = None,
             allow_one: bool = True) -> Pair:
    """Normalise an int or a length-2 sequence of ints into a pair.

    ``allow_one``: a one-item sequence stands for both axes (PyTorch's pooling
    arguments); without it only an int does (``F.interpolate``'s ``size``).

    Raises ``TypeError`` for non-integers and ``ValueError`` for a wrong length or a
    value below ``minimum`` (an :class:`ArgumentError`, also a ``RuntimeError``, as
    PyTorch raises for both).
    """
    if _is_int(value):
        items = (_to_int(value, name),) * 2
    elif isinstance(value, (tuple, list)) or _is_size_like(value):
        items = tuple(_to_int(v, name) for v in _two_values(value, name, 'an int', 'ints',
                                                             allow_one))
    else:
        raise TypeError(f'{name} must be an int or a sequence of 2 ints, '
                        f'got {value!r} ({type(value).__name__})')
    if minimum is not None and any(not is_symbolic(v) and v < minimum for v in items):
        # PyTorch's wording ("stride must be greater than zero", "pad must be
        # non-negative") inside ours
        words = 'greater than zero' if minimum == 1 else 'non-negative' if minimum == 0 \
            else f'at least {minimum}'
        raise ArgumentError(f'{name} must be {words} (>= {minimum}), got {value!r}')
    return items  # type: ignore[return-value]


def _two_values(value, name: str, one: str, many: str, allow_one: bool = True) -> list:
    """The items of a sequence argument, one item repeated to two (when ``allow_one``);
    any other length is a ``ValueError`` naming ``name``."""
    values = list(value)
    if len(values) == 1 and allow_one:
        values = values * 2
    if len(values) != 2:
        one_item = ' or one' if allow_one else ''
        raise ArgumentError(f'{name} must be {one} or a sequence of 2{one_item} {many} '
                            f'(one per spatial dimension), got {len(values)} values: '
                            f'{value!r}')
    return values


def _is_size_like(value) -> bool:
    # torch.Size is a tuple subclass; numpy arrays and tensors of ints also iterate.
    return hasattr(value, '__len__') and hasattr(value, '__iter__') and not isinstance(
        value, (str, bytes))


def float_pair(value, name: str) -> Tuple[float, float]:
    """Normalise a positive finite number or a length-2 sequence of them (a sequence
    must have one number per spatial dimension, as in ``F.interpolate``)."""
    if isinstance(value, bool):
        raise TypeError(f'{name} must be a number or a sequence of 2 numbers, got {value!r}')
    if isinstance(value, numbers.Real):
        items = (float(value),) * 2
    elif isinstance(value, (tuple, list)) or _is_size_like(value):
        values = _two_values(value, name, 'a number', 'numbers', allow_one=False)
        for v in values:
            if isinstance(v, bool) or not isinstance(v, numbers.Real):
                raise TypeError(f'{name} must contain real numbers, got {v!r} '
                                f'({type(v).__name__})')
        items = tuple(float(v) for v in values)
    else:
        raise TypeError(f'{name} must be a number or a sequence of 2 numbers, '
                        f'got {value!r} ({type(value).__name__})')
    for v in items:
        if not math.isfinite(v) or v <= 0:
            raise ArgumentError(f'{name} must be finite and > 0, got {value!r}')
    return items  # type: ignore[return-value]


def _check_bool(value, name: str, *, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if not isinstance(value, bool):
        accepted = 'None, True or False' if allow_none else 'True or False'
        raise TypeError(f'{name} must be {accepted}, got {value!r}')


def truth_flag(value) -> bool:
    """A flag PyTorch reads by truth value (``if flag:``), such as ``return_indices`` of
    ``F.max_pool2d`` or ``antialias`` of ``F.interpolate``: any value is accepted and
    counts as ``bool(value)`` (so ``1``, ``np.bool_(True)`` and ``'yes'`` are true)."""
    return bool(value)


# ----------------------------------------------------------------------------------
# upsampling
# ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class UpsampleArgs:
    """Validated, input-independent upsample arguments (what a module stores)."""

    size: Optional[Pair]
    scale_factor: Optional[Tuple[float, float]]
    mode: str
    align_corners: Optional[bool]
    recompute_scale_factor: Optional[bool]
    antialias: bool


def check_upsample_args(size=None, scale_factor=None, mode='nearest', align_corners=None,
                        recompute_scale_factor=None, antialias=False) -> UpsampleArgs:
    """Validate the input-independent upsample arguments.

    Mirrors the rules of ``F.interpolate`` for 4-D input, in its order, and raises
    ``ValueError`` or ``TypeError`` naming the argument and what is accepted. As in
    PyTorch, ``antialias`` and ``recompute_scale_factor`` are read by truth value,
    ``align_corners`` must be None or a bool, a ``size``/``scale_factor`` sequence has
    one entry per spatial dimension, and ``'area'`` (adaptive average pooling) takes an
    output size of 0. A mode PyTorch has no 4-D kernel for raises
    :class:`UnsupportedModeError` (a ``ValueError`` and PyTorch's
    ``NotImplementedError``).
    """
    if mode in ('nearest', 'area', 'nearest-exact') and align_corners is not None:
        raise ValueError(f'align_corners can only be set for the interpolating modes '
                         f'{INTERPOLATING_MODES}, got mode={mode!r}; leave it None '
                         '(align_corners option can only be set with the interpolating '
                         'modes: linear | bilinear | bicubic | trilinear)')
    if size is not None and scale_factor is not None:
        raise ValueError('only one of size or scale_factor may be given (got both)')
    if size is None and scale_factor is None:
        raise ValueError('either size or scale_factor must be given (got neither)')
    try:
        norm_size = None if size is None else int_pair(
            size, 'size', minimum=0 if mode == 'area' else 1, allow_one=False)
    except TypeError as exc:  # with F.interpolate's wording inside, as its tests match it
        types = ([type(v) for v in size] if isinstance(size, (tuple, list))
                 else type(size))
        raise TypeError(f'{exc} (expected size to be one of int or Tuple[int] or '
                        f'Tuple[int, int], but got size with types {types})') from None
    norm_scale = None if scale_factor is None else float_pair(scale_factor, 'scale_factor')
    recompute = None if recompute_scale_factor is None else truth_flag(recompute_scale_factor)
    if recompute and norm_size is not None:
        raise ValueError('recompute_scale_factor=True is not meaningful with an explicit '
                         'size; pass scale_factor instead')
    antialias = truth_flag(antialias)
    if antialias and mode not in INTERPOLATING_MODES:
        raise ValueError(f'antialias=True is only supported for modes {INTERPOLATING_MODES}, '
                         f'got mode={mode!r}')
    if not isinstance(mode, str) or mode not in UPSAMPLE_MODES:
        raise UnsupportedModeError(f'mode must be one of {UPSAMPLE_MODES} for 4-D input, '
                                   f'got {mode!r}')
    _check_bool(align_corners, 'align_corners', allow_none=True)
    if mode in INTERPOLATING_MODES and align_corners is None:
        align_corners = False
    return UpsampleArgs(norm_size, norm_scale, mode, align_corners, recompute, antialias)


@dataclass(frozen=True)
class UpsampleSpec:
    """A fully resolved upsample: sizes and the scales used for coordinate mapping."""

    args: UpsampleArgs
    in_size: Pair
    out_size: Pair
    #: per axis, the user scale the kernel maps with (``1/scale``), or None (``in/out``)
    kernel_scales: Tuple[Optional[float], Optional[float]]

    @property
    def mode(self) -> str:
        return self.args.mode

    @property
    def align_corners(self) -> Optional[bool]:
        return self.args.align_corners

    @property
    def antialias(self) -> bool:
        return self.args.antialias


def upsample_output_size(in_size: int, scale: float) -> int:
    """``floor(in * scale)`` computed in double precision, as PyTorch does.

    A symbolic ``in_size`` gives a symbolic size in integer arithmetic where that is
    exact: a scale ``p / 2**m`` with a small numerator (0.5, 0.25, 1.5, 2, ...) makes
    ``in * scale`` exact in double precision for every size below 2**32, so
    ``floor(in * scale) == (in * p) // 2**m`` (``in * k`` for an integral scale, provably
    equal to other ``k * n`` sizes). Other scales give ``floor(in * scale)`` on a symbolic
    float, which torch.export evaluates less reliably.
    """
    if is_symbolic(in_size):
        num, den = float(scale).as_integer_ratio()  # den is a power of two
        if num < _EXACT_NUMERATOR_LIMIT:
            return in_size * num if den == 1 else (in_size * num) // den
        return math.floor(in_size * scale)
    return math.floor(float(in_size) * scale)


#: ``n * num`` stays below 2**53 (exact in double) for every size ``n < 2**32``
_EXACT_NUMERATOR_LIMIT = 2 ** 21


def scale_keeps_size(scale: float, min_size: int = 1) -> Optional[bool]:
    """Whether ``floor(n * scale) == n`` for every size ``n >= min_size`` (True), for
    none of them (False), or only for some (None: the answer depends on the size).

    ``scale == 1`` keeps every size, ``scale < 1`` shrinks every size and so does
    ``scale >= 1 + 1 / min_size`` grow every size; in between, small sizes are kept.
    """
    if scale == 1.0:
        return True
    if scale < 1.0 or scale * min_size >= min_size + 1:
        return False
    return None


def upsample_spec(in_size: Sequence[int], args: UpsampleArgs) -> UpsampleSpec:
    """Resolve output sizes and kernel scales for an input of spatial size ``in_size``."""
    in_hw = (size_value(in_size[0]), size_value(in_size[1]))
    if args.size is not None:
        return UpsampleSpec(args, in_hw, args.size, (None, None))
    scales = args.scale_factor
    out = tuple(upsample_output_size(i, s) for i, s in zip(in_hw, scales))
    # 'area' is adaptive average pooling, which takes an empty output size
    if args.mode != 'area' and any(not is_symbolic(o) and o < 1 for o in out):
        raise ArgumentError(f'scale_factor={scales} gives an empty output {out} for input '
                            f'size {in_hw}; the output size floor(in * scale) must be >= 1 '
                            f'(Input and output sizes should be greater than 0)')
    if args.recompute_scale_factor or args.mode == 'area':
        kernel_scales = (None, None)
    else:
        kernel_scales = tuple(None if _axis_copied(args, i, o, s) else s
                              for i, o, s in zip(in_hw, out, scales))
    return UpsampleSpec(args, in_hw, out, kernel_scales)  # type: ignore[arg-type]


def _axis_copied(args: UpsampleArgs, in_size: int, out_size: int, scale: float) -> bool:
    """Whether PyTorch copies an axis whose size does not change, ignoring the scale.

    PyTorch's CPU kernels for bilinear (with or without antialiasing) and antialiased
    bicubic skip an axis whose output size equals its input size, whatever the user
    scale; legacy nearest shortcuts ``out == in`` (see ``reference.nearest_indices``);
    plain bicubic and nearest-exact map such an axis with ``1 / scale`` like any other.
    """
    copies = args.mode == 'bilinear' or (args.mode == 'bicubic' and args.antialias)
    if is_symbolic(in_size) or is_symbolic(out_size):
        # decided by the scale alone where it can be (scale 1); a size-dependent answer
        # (1 < scale < 2) keeps the scale: the ONNX export refuses such scales, see
        # mmseg_cann.onnx.translation.check_dynamic_upsample
        return copies and scale_keeps_size(scale) is True
    return in_size == out_size and copies


def coordinate_scale(in_size: int, out_size: int, align_corners: bool,
                     scale: Optional[float]) -> float:
    """The step between consecutive source coordinates (``area_pixel_compute_scale``).

    ``align_corners=True``: ``(in - 1) / (out - 1)`` (0 when ``out == 1``); otherwise
    ``1 / scale`` when a user scale applies, else ``in / out``.
    """
    if align_corners:
        return (in_size - 1) / (out_size - 1) if out_size > 1 else 0.0
    if scale is not None and scale > 0:
        return 1.0 / scale
    return in_size / out_size


def linear_source_coordinate(dst: int, step: float, align_corners: bool, cubic: bool) -> float:
    """Source coordinate of output index ``dst`` for linear and cubic modes.

    ``align_corners``: ``dst * step``; half-pixel: ``(dst + 0.5) * step - 0.5``, clamped
    at 0 for linear modes (cubic keeps the negative value and clamps its taps).
    """
    if align_corners:
        return dst * step
    src = (dst + 0.5) * step - 0.5
    return src if cubic or src >= 0 else 0.0


def adaptive_bin(index: int, in_size: int, out_size: int) -> Tuple[int, int]:
    """``[start, end)`` input range of adaptive-average bin ``index`` (area mode)."""
    start = (index * in_size) // out_size
    end = -((-(index + 1) * in_size) // out_size)
    return start, end


def keys_cubic(x: float, a: float) -> float:
    """The Keys cubic-convolution kernel with coefficient ``a`` at distance ``x``."""
    x = abs(x)
    if x <= 1.0:
        return ((a + 2) * x - (a + 3)) * x * x + 1
    if x < 2.0:
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    return 0.0


def cubic_weights(t: float, a: float = CUBIC_A) -> Tuple[float, float, float, float]:
    """Keys cubic-convolution weights of the taps at offsets -1, 0, 1, 2 for fraction t."""
    return keys_cubic(t + 1, a), keys_cubic(t, a), keys_cubic(1 - t, a), keys_cubic(2 - t, a)


def antialias_filter(x: float, mode: str) -> float:
    """The antialiasing filter: triangle (bilinear) or Keys a=-0.5 (bicubic)."""
    x = abs(x)
    if mode == 'bilinear':
        return 1.0 - x if x < 1.0 else 0.0
    return keys_cubic(x, CUBIC_A_ANTIALIAS)


def antialias_support(step: float, mode: str) -> float:
    """Half-width of the antialiasing filter in input pixels."""
    interp_size = 2 if mode == 'bilinear' else 4
    return interp_size * 0.5 * step if step >= 1.0 else interp_size * 0.5


# ----------------------------------------------------------------------------------
# pooling
# ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class PoolArgs:
    """Validated, input-independent pooling arguments (what a module stores)."""

    kernel: Pair
    stride: Pair
    #: explicit symmetric padding, or one of PADDING_STRINGS
    padding: Union[Pair, str]
    dilation: Pair
    ceil_mode: bool


@dataclass(frozen=True)
class PoolSpec:
    """A fully resolved pooling window grid for one input size."""

    args: PoolArgs
    in_size: Pair
    out_size: Pair
    pad_begin: Pair
    pad_end: Pair

    @property
    def kernel(self) -> Pair:
        return self.args.kernel

    @property
    def stride(self) -> Pair:
        return self.args.stride

    @property
    def dilation(self) -> Pair:
        return self.args.dilation

    @property
    def symmetric(self) -> bool:
        return self.pad_begin == self.pad_end

    @property
    def torch_padding_ok(self) -> bool:
        """Whether PyTorch's pooling ops take this padding directly (symmetric, <= k/2)."""
        return self.symmetric and all(p <= k // 2 for p, k in zip(self.pad_begin, self.kernel))


def effective_kernel(kernel: int, dilation: int) -> int:
    return dilation * (kernel - 1) + 1


def pool_output_size(in_size: int, kernel: int, stride: int, pad: int, dilation: int,
                     ceil_mode: bool) -> int:
    """PyTorch's pooling output size for symmetric padding ``pad``."""
    numerator = in_size + 2 * pad - effective_kernel(kernel, dilation) + (
        stride - 1 if ceil_mode else 0)
    out = numerator // stride + 1
    if ceil_mode and is_symbolic(in_size):
        if not ceil_mode_may_drop(kernel, stride, pad, dilation):
            return out
        # size-dependent: a symbolic choice, no guard (the ONNX export refuses it)
        import torch
        return torch.sym_ite((out - 1) * stride >= in_size + pad, out - 1, out)
    if ceil_mode and (out - 1) * stride >= in_size + pad:
        out -= 1  # the last window must start inside the input or the left padding
    return out


def ceil_mode_may_drop(kernel: int, stride: int, pad_end: int, dilation: int = 1) -> bool:
    """Whether ``ceil_mode``'s last window can start in the end padding for some input
    size (PyTorch then drops it; ONNX's ``ceil_mode`` output size keeps it).

    The ceil-mode window count is ``ceil((n + pb + pe - ek) / s) + 1``, so the last
    window starts at most ``n + pe - ek + s - 1`` (input coordinates): inside the input
    for every ``n`` exactly when ``pe <= ek - s``. Independent of ``n`` and of the
    begin padding: decidable for a dynamic size.
    """
    return pad_end >= effective_kernel(kernel, dilation) - stride + 1


def same_padding(in_size: int, kernel: int, stride: int, dilation: int,
                 lower: bool) -> Tuple[int, int, int]:
    """ONNX ``auto_pad`` SAME: returns ``(pad_begin, pad_end, out)`` for one axis."""
    out = -(-in_size // stride)
    total = (out - 1) * stride + effective_kernel(kernel, dilation) - in_size
    if is_symbolic(in_size):
        # total >= ek - s: never negative when the kernel spans the stride
        if effective_kernel(kernel, dilation) < stride:
            import torch
            total = torch.sym_max(total, 0)
    else:
        total = max(total, 0)
    small, large = total // 2, total - total // 2
    return (large, small, out) if lower else (small, large, out)


def check_pool_args(kernel_size, stride=None, padding=0, dilation=1,
                    ceil_mode=False, *, check_padding_limit: bool = True) -> PoolArgs:
    """Validate input-independent pooling arguments (PyTorch's rules).

    ``check_padding_limit=False`` skips the "padding at most half the kernel" rule, which
    PyTorch's modules check only when they run (the CANN modules do the same: their
    forward calls the ops, which check it).
    """
    kernel = int_pair(kernel_size, 'kernel_size', minimum=1)
    if stride is None or (isinstance(stride, (tuple, list)) and len(stride) == 0):
        stride_pair = kernel
    else:
        stride_pair = int_pair(stride, 'stride', minimum=1)
    dilation_pair = int_pair(dilation, 'dilation', minimum=1)
    _check_bool(ceil_mode, 'ceil_mode')
    if isinstance(padding, str):
        pad = padding.lower()
        if pad not in PADDING_STRINGS:
            raise ValueError(f'padding must be an int, a pair of ints or one of '
                             f'{PADDING_STRINGS}, got {padding!r}')
        norm_padding: Union[Pair, str] = 'same_upper' if pad == 'same' else pad
    else:
        norm_padding = int_pair(padding, 'padding', minimum=0)
    args = PoolArgs(kernel, stride_pair, norm_padding, dilation_pair, ceil_mode)
    if check_padding_limit:
        check_padding_limit_of(args)
    return args


def check_padding_limit_of(args: PoolArgs) -> None:
    """PyTorch's rule for explicit padding: at most half the kernel (``p <= k // 2``).

    PyTorch checks it with the input's shape, after the rank (``avg_pool2d`` of a 2-D
    tensor raises its ``IndexError`` first), so the ops call this after their input
    checks.
    """
    if isinstance(args.padding, str):
        return
    for p, k in zip(args.padding, args.kernel):
        if p > k // 2:
            raise ArgumentError(f'padding must be at most half the kernel size '
                                f'(pad <= kernel_size // 2), got padding={args.padding} '
                                f'for kernel_size={args.kernel} (pad should be smaller '
                                f'than or equal to half of kernel size)')


def pool_spec(in_size: Sequence[int], args: PoolArgs) -> PoolSpec:
    """Resolve padding and output size of a pooling grid for ``in_size`` (H, W).

    Accepts exactly the geometries PyTorch accepts: the only size rule is an output of
    at least one window per axis (``ceil_mode`` windows may run past the padded input,
    as long as they start inside the input or the left padding). An empty output
    raises :class:`ArgumentError` with PyTorch's "Output size is too small".
    """
    in_hw = (size_value(in_size[0]), size_value(in_size[1]))
    begin, end, out = [], [], []
    for axis in range(2):
        n, k, s, d = in_hw[axis], args.kernel[axis], args.stride[axis], args.dilation[axis]
        if isinstance(args.padding, str) and args.padding.startswith('same'):
            b, e, o = same_padding(n, k, s, d, lower=args.padding == 'same_lower')
        else:
            p = 0 if args.padding == 'valid' else args.padding[axis]  # type: ignore[index]
            b = e = p
            o = pool_output_size(n, k, s, p, d, args.ceil_mode)
        begin.append(b)
        end.append(e)
        out.append(o)
    if any(not is_symbolic(o) and o < 1 for o in out):
        raise ArgumentError(_empty_pool_message(in_hw, tuple(out), args, begin, end))
    return PoolSpec(args, in_hw, tuple(out), tuple(begin), tuple(end))  # type: ignore[arg-type]


def _empty_pool_message(in_hw, out_hw, args: PoolArgs, begin, end) -> str:
    padded = tuple(n + b + e for n, b, e in zip(in_hw, begin, end))
    extent = tuple(effective_kernel(k, d) for k, d in zip(args.kernel, args.dilation))
    why = ''
    if any(x > p for x, p in zip(extent, padded)):
        why = (f': kernel_size={args.kernel} with dilation={args.dilation} is larger than '
               f'the padded input {padded}')
    return (f'pooling input {in_hw} with kernel_size={args.kernel}, stride={args.stride}, '
            f'padding={args.padding!r}, dilation={args.dilation} gives an empty output '
            f'{out_hw}{why} (Given input size: ({in_hw[0]}x{in_hw[1]}). Calculated output '
            f'size: ({out_hw[0]}x{out_hw[1]}). Output size is too small)')


def avg_divisor(out_index: int, in_size: int, kernel: int, stride: int, pad_begin: int,
                pad_end: int, count_include_pad: bool) -> int:
    """Per-axis factor of the average-pool divisor (PyTorch's border rule).

    A window spans ``[o*s - pad_begin, o*s - pad_begin + k)``, cut at ``in + pad_end``;
    with ``count_include_pad`` the cut window counts, otherwise only input cells.
    """
    start = out_index * stride - pad_begin
    end = min(start + kernel, in_size + pad_end)
    if count_include_pad:
        return end - start
    return min(end, in_size) - max(start, 0)


def first_valid_tap(out_index: int, in_size: int, stride: int, pad_begin: int,
                    dilation: int) -> int:
    """First in-bounds input index of a max-pool window (PyTorch's default argmax)."""
    start = out_index * stride - pad_begin
    if start < 0:
        start += -(-(-start) // dilation) * dilation
    return start


def adaptive_output_size(in_size: Sequence[int], output_size) -> Pair:
    """Normalise ``output_size`` of adaptive pooling (a None entry keeps the input size).

    As ``F.adaptive_avg_pool2d``: an int, or a sequence of two entries (ints or None);
    entries may be 0 (an empty output). Raises ``TypeError`` for other types and
    :class:`ArgumentError` (``ValueError`` and PyTorch's ``RuntimeError``) for a wrong
    length or a negative size.
    """
    if output_size is None:
        raise TypeError('output_size must be an int or a pair (entries may be None), got None')
    if isinstance(output_size, int) and not isinstance(output_size, bool) or \
            is_symbolic(output_size):
        values = [output_size, output_size]
    elif isinstance(output_size, (tuple, list)) or (
            _is_size_like(output_size) and not hasattr(output_size, 'dtype')):
        values = list(output_size)
        if len(values) != 2:
            raise ArgumentError(f'output_size must be an int or a pair, got {output_size!r} '
                                f'(adaptive_avg_pool2d: output_size must be 2)')
    else:
        raise TypeError(f'output_size must be an int or a pair of ints/None, '
                        f'got {output_size!r} ({type(output_size).__name__})')
    result = []
    for v, n in zip(values, in_size):
        if v is None:
            result.append(size_value(n))
            continue
        v = _to_int(v, 'output_size')
        if not is_symbolic(v) and v < 0:
            raise ArgumentError(f'output_size must be >= 0, got {output_size!r} '
                                f'(elements of output_size must be greater than or equal '
                                f'to 0)')
        result.append(v)
    return tuple(result)  # type: ignore[return-value]


def check_adaptive_output_size(output_size) -> None:
    """Static check of an adaptive pooling ``output_size`` (None entries allowed)."""
    adaptive_output_size((1, 1), output_size)
