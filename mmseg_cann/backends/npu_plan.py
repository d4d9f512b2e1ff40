"""The call planner: which aten call form an op should use on a device, and why.

A pure function per op maps (validated spec from :mod:`mmseg_cann.core.geometry`, input
shape, dtype, memory format, :class:`~.npu_device.DeviceCaps`) to a frozen :class:`Plan`.
No tensors, no device: every rule is testable on a CPU. The rules (docs/design.md 2.3, from
the CANN operator docs and torch_npu's op-plugin) on Ascend 910B-class chips (A2/A3):

Upsample (bilinear, bicubic; ``aclnnUpsampleBilinear2d``/``aclnnUpsampleBicubic2d``)
    The fast fp32-compute kernel runs only when explicit scales are passed with
    ``floor(in * scale) == out``, no scale is exactly 2.0 (except bf16) and every scale
    is <= 50 (<= 40 for bicubic); otherwise a TransData (NC1HWC0) path runs. A size call
    (mmseg's ``resize(size=...)``) is turned into a scale call only when a scale exists
    that gives the same output size *and* the same source coordinates as PyTorch's size
    call (``1/scale == in/out`` in float32 and float64, see :func:`consistent_scales`);
    a call with user scales keeps them (PyTorch maps with ``1/scale``). NCHW and NHWC
    inputs are both accepted. Nearest, nearest-exact, area and antialiased calls keep
    the user's call.
Max pooling
    NCHW only (channels_last input is converted). ``return_indices`` must give PyTorch's
    int64 flat indices: torch_npu's default ``max_pool2d_with_indices`` returns an int8
    mask (``aclnnMaxPool2dWithMask``); true indices need ``aclnnMaxPool2dWithIndices``
    (A2/A3 only, dilation 1, no NaN/-Inf in the input, so no ``-inf``-padded SAME
    windows). Outside those limits the indices are computed on the CPU (a fallback).
Average pooling (``aclnnAvgPool2d``)
    NCHW only. Rejects padding > kernel/2 (such padding is applied explicitly, as for
    asymmetric SAME padding) and ``divisor_override == 0`` (a ValueError here). Its Cube
    path keeps fp16 with an fp16 weight ``1/(kH*kW)``, which rounds differently from
    PyTorch's fp32 accumulation, so fp16 input is averaged in fp32 whenever the Cube
    path would be taken; the Cube path is skipped for ``ceil_mode``, strip windows
    (a kernel side of 1) and kernels > 255, whose vector path sums in fp32.
Adaptive average pooling
    Output (1, 1) is a mean over H and W (what PyTorch's ATen does too); other sizes run
    the adaptive kernel, which transposes to channels-last internally.

Off Ascend (CPU, CUDA, other NPUs without documented fast paths) every plan is the
native call, so ``backend='npu'`` and ``'auto'`` behave like ``'native'`` there.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Optional, Sequence, Tuple

import numpy as np
import torch

from ..core import geometry as geo
from ..core.validation import is_channels_last
from .npu_device import DeviceCaps

#: largest scale the fast bilinear kernel takes (effective scale <= 50)
BILINEAR_FAST_MAX_SCALE = 50.0
#: bicubic above 40x falls back
BICUBIC_FAST_MAX_SCALE = 40.0
#: kernels larger than this leave aclnnAvgPool2d's Cube path
AVG_CUBE_MAX_KERNEL = 255

MEMORY_FORMATS = ('contiguous', 'channels_last', 'strided')


@dataclass(frozen=True)
class Plan:
    """How to run one op call.

    Attributes:
        op: ``'upsample'``, ``'max_pool2d'``, ``'avg_pool2d'`` or ``'adaptive_avg_pool2d'``.
        call: the aten call form. Upsample: ``'native'`` (the user's own arguments),
            ``'size'`` (``size=out``), ``'scales'`` (``scale_factor=scales``,
            ``recompute_scale_factor=False``). Pooling: ``'native'`` (with explicit
            padding where needed) or ``'mean'`` (adaptive pooling to 1x1).
        kernel: the kernel/path this call form reaches on the device (for reports).
        scales: the explicit scales of a ``'scales'`` call.
        layout: ``'keep'``, ``'to_nchw'`` or ``'to_channels_last'``: the input is
            converted before the call and the output converted back to the input's
            memory format.
        compute_dtype: dtype name the call computes in (None: the input dtype); the
            result is cast back to the input dtype.
        indices_on_cpu: max pooling with indices runs on the CPU (a fallback).
        fallback: why the fast path is left (None when it is not); counted and logged.
        notes: further decisions worth reporting (not fallbacks).
    """

    op: str
    call: str = 'native'
    kernel: str = 'aten (native)'
    scales: Optional[Tuple[float, float]] = None
    layout: str = 'keep'
    compute_dtype: Optional[str] = None
    indices_on_cpu: bool = False
    fallback: Optional[str] = None
    notes: Tuple[str, ...] = field(default_factory=tuple)

    @property
    def name(self) -> str:
        """Short identifier of the call form (stable; used as the tuning cache value)."""
        parts = [self.call]
        if self.scales is not None and self.call == 'scales':
            parts.append('x'.join(repr(s) for s in self.scales))
        if self.layout != 'keep':
            parts.append(self.layout)
        if self.compute_dtype:
            parts.append(self.compute_dtype)
        if self.indices_on_cpu:
            parts.append('indices_on_cpu')
        return ':'.join(parts)

    def describe(self) -> str:
        """One line for tables: call form, kernel and fallback reason."""
        text = f'{self.name} -> {self.kernel}'
        if self.fallback:
            text += f' [fallback: {self.fallback}]'
        return text


def memory_format_of(x: torch.Tensor) -> str:
    """``'contiguous'``, ``'channels_last'`` (unambiguously NHWC strides) or ``'strided'``."""
    if is_channels_last(x):
        return 'channels_last'
    return 'contiguous' if x.is_contiguous() else 'strided'


def _check_common(shape: Sequence[int], dtype: torch.dtype, memory_format: str,
                  caps: DeviceCaps) -> None:
    if memory_format not in MEMORY_FORMATS:
        raise ValueError(f'memory_format must be one of {MEMORY_FORMATS}, got {memory_format!r}')
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f'dtype must be a torch.dtype, got {dtype!r}')
    if not isinstance(caps, DeviceCaps):
        raise TypeError(f'caps must be a DeviceCaps, got {type(caps).__name__}')
    if len(shape) not in (3, 4):
        raise ValueError(f'shape must be (C, H, W) or (N, C, H, W), got {tuple(shape)}')


# ----------------------------------------------------------------------------------
# upsample
# ----------------------------------------------------------------------------------
def _same_step(a: float, b: float) -> bool:
    """Two coordinate steps are equal in float64 and after rounding to float32."""
    return a == b and np.float32(a) == np.float32(b)


def consistent_scales(spec: geo.UpsampleSpec) -> Optional[Tuple[float, float]]:
    """Explicit scales that reproduce ``spec`` exactly through a scale call, or None.

    Per axis the scale ``s`` must give the same output size (``floor(in * s) == out``,
    in double precision as PyTorch computes it) and the same coordinate step as the
    mapping ``spec`` uses (``geometry.coordinate_scale``): with ``align_corners=True``
    any such ``s`` does (the step is ``(in-1)/(out-1)``); otherwise ``1/s`` must equal
    the spec's step both in float64 and in float32 (PyTorch computes ``1.0/s`` in
    double and the size call's ``in/out`` in the op-math type). A user scale is kept as
    it is. Axes that PyTorch copies (bilinear ``out == in``) get 1.0.
    """
    if spec.antialias or spec.mode not in geo.INTERPOLATING_MODES:
        return None
    result = []
    for axis in range(2):
        n_in, n_out = spec.in_size[axis], spec.out_size[axis]
        user = spec.kernel_scales[axis]
        if user is not None:
            result.append(float(user))
            continue
        if spec.args.scale_factor is not None and not spec.args.recompute_scale_factor \
                and spec.mode == 'bilinear' and n_in == n_out:
            result.append(1.0)  # an axis PyTorch copies whatever the user scale
            continue
        target = geo.coordinate_scale(n_in, n_out, bool(spec.align_corners), None)
        found = None
        first = n_out / n_in
        for s in (first, math.nextafter(first, math.inf), math.nextafter(first, 0.0)):
            if math.floor(float(n_in) * s) != n_out:
                continue
            step = geo.coordinate_scale(n_in, n_out, bool(spec.align_corners), s)
            if spec.align_corners or _same_step(step, target):
                # float32 size-call step is float(in)/float(out), computed in float32
                if not spec.align_corners and \
                        np.float32(1.0 / s) != np.float32(n_in) / np.float32(n_out):
                    continue
                found = s
                break
        if found is None:
            return None
        result.append(found)
    return tuple(result)  # type: ignore[return-value]


def plan_upsample(spec: geo.UpsampleSpec, shape: Sequence[int], dtype: torch.dtype,
                  memory_format: str, caps: DeviceCaps) -> Plan:
    """Plan an upsample call (see the module docstring for the rules).

    Args:
        spec: the resolved call (``geometry.upsample_spec``).
        shape: input shape ``(N, C, H, W)``.
        dtype: the dtype the call computes in (after the precision policy).
        memory_format: ``'contiguous'``, ``'channels_last'`` or ``'strided'``.
        caps: the device (:func:`~.npu_device.device_caps` or ``DeviceCaps.npu(...)``).
    """
    _check_common(shape, dtype, memory_format, caps)
    if not isinstance(spec, geo.UpsampleSpec):
        raise TypeError(f'spec must be an UpsampleSpec, got {type(spec).__name__}')
    if not caps.is_npu:
        return Plan('upsample')
    kernel = {'nearest': 'aclnnUpsampleNearest2d', 'nearest-exact': 'aclnnUpsampleNearestExact2d',
              'bilinear': 'aclnnUpsampleBilinear2d', 'bicubic': 'aclnnUpsampleBicubic2d',
              'area': 'aclnnAdaptiveAvgPool2d'}[spec.mode]
    if spec.antialias:
        kernel += 'AA'
    if spec.antialias or spec.mode not in geo.INTERPOLATING_MODES:
        return Plan('upsample', 'native', kernel)
    if not caps.a2_a3:
        return Plan('upsample', 'native', kernel,
                    notes=(f'no documented fast path for {caps.generation}',))
    user_scales = any(s is not None for s in spec.kernel_scales)
    scales = consistent_scales(spec)
    reasons = []
    if scales is None:
        reasons.append('no explicit scale reproduces the size call exactly '
                       '(floor(in*s) == out with 1/s == in/out)')
    else:
        if dtype != torch.bfloat16 and 2.0 in scales:
            reasons.append('scale exactly 2.0 is excluded from the fast kernel (non-bf16)')
        limit = BILINEAR_FAST_MAX_SCALE if spec.mode == 'bilinear' else BICUBIC_FAST_MAX_SCALE
        if max(scales) > limit:
            reasons.append(f'scale {max(scales):g} > {limit:g} for {spec.mode}')
    if reasons:
        call = 'native' if user_scales else 'size'
        return Plan('upsample', call, kernel + ' via TransData (NC1HWC0)',
                    fallback='; '.join(reasons))
    call = 'native' if user_scales else 'scales'
    return Plan('upsample', call, kernel + ' fast fp32-compute path',
                scales=scales if call == 'scales' else None)


def upsample_candidates(spec: geo.UpsampleSpec, shape: Sequence[int], dtype: torch.dtype,
                        memory_format: str) -> Tuple[Plan, ...]:
    """Every call form that computes ``spec`` with the same semantics (for tuning).

    The native call; the size call when the spec maps with ``in/out``; the scale call
    when :func:`consistent_scales` finds one; each in the input's layout and in the
    other 4-D layout (NCHW <-> channels_last).
    """
    forms = [Plan('upsample')]
    if spec.mode in geo.INTERPOLATING_MODES and not spec.antialias:
        if all(s is None for s in spec.kernel_scales) and spec.args.size is None:
            forms.append(Plan('upsample', 'size'))
        scales = consistent_scales(spec)
        if scales is not None and spec.args.scale_factor is None:
            forms.append(Plan('upsample', 'scales', scales=scales))
    other = 'to_nchw' if memory_format == 'channels_last' else 'to_channels_last'
    return tuple(forms) + tuple(replace(p, layout=other) for p in forms)


# ----------------------------------------------------------------------------------
# pooling
# ----------------------------------------------------------------------------------
def _nchw_layout(memory_format: str, caps: DeviceCaps) -> Tuple[str, Tuple[str, ...]]:
    if caps.is_npu and memory_format == 'channels_last':
        return 'to_nchw', ('pooling kernels take NCHW only: channels_last input converted',)
    return 'keep', ()


def plan_max_pool2d(spec: geo.PoolSpec, return_indices: bool, shape: Sequence[int],
                    dtype: torch.dtype, memory_format: str, caps: DeviceCaps, *,
                    finite: Optional[bool] = None) -> Plan:
    """Plan a max-pool call.

    Args:
        spec: ``geometry.pool_spec`` of the call.
        return_indices: whether PyTorch-format int64 indices are wanted.
        shape, dtype, memory_format, caps: as :func:`plan_upsample`.
        finite: whether the input holds no NaN/-Inf (only consulted for indices on an
            NPU; None means unknown, planned as if it might).
    """
    _check_common(shape, dtype, memory_format, caps)
    if not caps.is_npu:
        return Plan('max_pool2d')
    layout, notes = _nchw_layout(memory_format, caps)
    if not return_indices:
        return Plan('max_pool2d', kernel='aclnnMaxPool2d', layout=layout, notes=notes)
    reasons = []
    if not caps.a2_a3:
        reasons.append(f'aclnnMaxPool2dWithIndices needs an A2/A3 chip, not {caps.generation}')
    if spec.dilation != (1, 1):
        reasons.append(f'aclnnMaxPool2dWithIndices supports dilation 1 only, got {spec.dilation}')
    if not spec.torch_padding_ok:
        reasons.append('explicit -inf padding (SAME/asymmetric) is unsupported by '
                       'aclnnMaxPool2dWithIndices')
    if finite is not True:
        reasons.append('input may hold NaN/-Inf, unsupported by aclnnMaxPool2dWithIndices'
                       if finite is None else
                       'input holds NaN/-Inf, unsupported by aclnnMaxPool2dWithIndices')
    if reasons:
        return Plan('max_pool2d', kernel='CPU max_pool2d_with_indices', layout=layout,
                    indices_on_cpu=True, fallback='; '.join(reasons), notes=notes)
    return Plan('max_pool2d', kernel='aclnnMaxPool2dWithIndices (int64 indices)',
                layout=layout, notes=notes)


def is_strip_window(kernel: Tuple[int, int]) -> bool:
    """A 1xK or Kx1 window (strip pooling), which leaves aclnnAvgPool2d's Cube path."""
    return min(kernel) == 1 and max(kernel) > 1


def plan_avg_pool2d(spec: geo.PoolSpec, count_include_pad: bool, divisor_override,
                    shape: Sequence[int], dtype: torch.dtype, memory_format: str,
                    caps: DeviceCaps) -> Plan:
    """Plan an average-pool call (``divisor_override == 0`` raises ValueError)."""
    _check_common(shape, dtype, memory_format, caps)
    if divisor_override is not None and int(divisor_override) == 0:
        raise ValueError('divisor_override must be None or a non-zero int, got 0 '
                         '(aclnnAvgPool2d and PyTorch reject it)')
    if not caps.is_npu:
        return Plan('avg_pool2d')
    layout, notes = _nchw_layout(memory_format, caps)
    fallback = None
    if any(2 * p > k for p, k in zip(spec.pad_begin + spec.pad_end, spec.kernel * 2)):
        fallback = 'aclnnAvgPool2d rejects padding > kernel/2: padded explicitly'
    elif not spec.symmetric:
        notes += ('asymmetric SAME padding applied explicitly',)
    skip = []
    if spec.args.ceil_mode:
        skip.append('ceil_mode')
    if is_strip_window(spec.kernel):
        skip.append('strip window')
    if max(spec.kernel) > AVG_CUBE_MAX_KERNEL:
        skip.append(f'kernel > {AVG_CUBE_MAX_KERNEL}')
    if not caps.a2_a3:
        return Plan('avg_pool2d', kernel='aclnnAvgPool2d', layout=layout, fallback=fallback,
                    notes=notes)
    if skip:
        return Plan('avg_pool2d', kernel='aclnnAvgPool2d vector path (fp32 sums)',
                    layout=layout, fallback=fallback,
                    notes=notes + (f'Cube path skipped: {", ".join(skip)}',))
    if dtype == torch.float16:
        return Plan('avg_pool2d', kernel='aclnnAvgPool2d Cube path in fp32', layout=layout,
                    compute_dtype='float32', fallback=fallback,
                    notes=notes + ('fp16 Cube path would round with an fp16 weight '
                                   '1/(kH*kW): averaging in fp32 like PyTorch',))
    return Plan('avg_pool2d', kernel='aclnnAvgPool2d Cube path', layout=layout,
                fallback=fallback, notes=notes)


def plan_adaptive_avg_pool2d(out_size: Tuple[int, int], shape: Sequence[int],
                             dtype: torch.dtype, memory_format: str,
                             caps: DeviceCaps) -> Plan:
    """Plan adaptive average pooling to ``out_size`` (1x1 is a mean over H, W)."""
    _check_common(shape, dtype, memory_format, caps)
    if not caps.is_npu:
        return Plan('adaptive_avg_pool2d')
    if tuple(out_size) == (1, 1):
        return Plan('adaptive_avg_pool2d', 'mean', 'ReduceMean over (H, W)')
    return Plan('adaptive_avg_pool2d', kernel='aclnnAdaptiveAvgPool2d',
                notes=('the kernel transposes to channels-last internally',))


def pool_candidates(op: str, memory_format: str, out_size=None) -> Tuple[Plan, ...]:
    """Semantically equivalent pooling call forms (for tuning): layouts, and the mean."""
    other = 'to_nchw' if memory_format == 'channels_last' else 'to_channels_last'
    forms = [Plan(op)]
    if op == 'adaptive_avg_pool2d' and tuple(out_size) == (1, 1):
        forms.append(Plan(op, 'mean'))
    return tuple(forms) + tuple(replace(p, layout=other) for p in forms)
