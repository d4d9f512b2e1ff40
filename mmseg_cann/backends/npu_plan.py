"""The call planner: which aten call form an op should use on a device, and why.

A pure function per op maps (validated spec from :mod:`mmseg_cann.core.geometry`, input
shape, dtype, memory format, :class:`~.npu_device.DeviceCaps`) to a frozen :class:`Plan`.
No tensors, no device: every rule is testable on a CPU. The rules are transcribed from
the sources that run on the device; each rule cites its file beside the code:

* torch_npu's op-plugin (Ascend/op-plugin ``op_plugin/ops/opapi/*KernelNpuOpApi.cpp``):
  which ``aclnn*`` entry an aten op calls and with which attributes;
* CANN's aclnn implementations (hicann ops-cv ``image/upsample_bilinear2d``,
  ``image/upsample_bicubic2d``; hicann ops-nn ``pooling/max_pool3d_with_argmax_v2``,
  ``pooling/avg_pool3_d``): which kernel such an entry reaches on which chip;
* torch_npu itself (Ascend/pytorch ``torch_npu/csrc/aten/common/TensorFactories.cpp``).

Summary (A2/A3 = Atlas A2/A3, the 910B-class chips):

Upsample (bilinear, bicubic)
    Bilinear reaches its fast ``UpsampleBilinear2d`` kernel only when the scales torch_npu
    passes give ``int(in * s) == out``, are not both 2.0 (except bf16) and the source
    step (``1/s``, or ``(in-1)/(out-1)`` with ``align_corners``) is <= 50 on both axes,
    i.e. downscaling by at most 50x; a size call passes scales 1.0 and takes the
    TransData + ``ResizeBilinearV2`` path, so it is turned into a scale call when a scale
    with the same size *and* the same coordinates exists (:func:`consistent_scales`).
    Bicubic takes its fast ``UpsampleBicubic2d`` kernel for size and scale calls alike
    when both steps are <= 40 and not both > 30. On 910A/310P/310B bilinear runs
    ``ResizeBilinearV2``, which maps with ``in/out`` and ignores scales, so a user scale
    with ``1/s != in/out`` is computed on the CPU. float64 is rejected by torch_npu
    (bilinear) or not listed (bicubic): computed on the CPU. bf16 is not supported on
    910A/310P: computed in float32.
Max pooling
    ``max_pool2d`` without indices is the composite of ``max_pool2d_with_indices``, so
    the kernel is the same with or without indices: ``aclnnMaxPool2dWithMask`` (an int8
    mask, not indices) on op-plugin 6.0.0-7.3.0, and ``aclnnMaxPool2dWithIndices`` (int32
    indices) on 26.x/master with ``TORCH_NPU_USE_COMPATIBLE_IMPL=1`` or on Ascend950.
    Indices are PyTorch's int64 indices always: taken from the device when it returns
    real indices, recomputed on the CPU otherwise. The kernels take fp16/fp32/bf16 only
    (per chip less), dilation 1 only, and no NaN/-Inf input: SAME padding is applied
    with ``finfo(dtype).min`` instead of ``-inf``; float64, dilation > 1 and unsupported
    dtypes run on the CPU; integers run in float32 when exact (``|x| < 2**24``).
Average pooling (``aclnnAvgPool2d``)
    A window covering the whole (padded) input takes a global mean (``ReduceMean``); on
    A2/A3 the Cube path (``Pooling`` on NC1HWC0, fp16 weights ``1/(kH*kW)``) needs an
    input that is not a long strip (``W/H < 2`` and ``H/W < 2``), ``kH, kW <= 255`` and
    (``kH*kW <= 255`` or both <= 20), ``divisor_override`` in [-255, 255], no
    ``ceil_mode`` and ``C < 65536``; otherwise the ``AvgPool3D`` vector path runs. fp16
    input that would reach the Cube path or the global mean is averaged in float32.
    Padding above half the kernel is applied explicitly; ``divisor_override == 0`` is a
    ValueError before any kernel.
Adaptive average pooling
    Output (1, 1) is a mean over H and W (what PyTorch's ATen does too); other sizes run
    the adaptive kernel.
Layout
    torch_npu has no channels_last tensors: ``empty`` rejects every memory format but
    Contiguous and ``clone`` ignores the requested one (TensorFactories.cpp), so on an
    NPU no plan converts layouts; the input is passed as it is.

Every NPU rule assumes the aclnn implementations run, which op-plugin's dispatch does
only with ``jit_compile=False`` and base-format inputs (Ascend/op-plugin ``codegen/gen.py``;
mmengine sets ``jit_compile=False`` when it imports torch_npu, see :mod:`.npu_device`).

Off Ascend (CPU, CUDA) every plan is the native call, so ``backend='npu'`` and
``'auto'`` behave like ``'native'`` there. A plan also names the kernels it expects in a
``torch_npu`` profiler trace (:attr:`Plan.expect`, :attr:`Plan.forbid`), which
``tools/check_parity.py --trace`` compares with what actually ran.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import NamedTuple, Optional, Sequence, Tuple

import numpy as np
import torch

from ..core import geometry as geo
from ..core.validation import INTEGER_DTYPES, is_channels_last
from .npu_device import DeviceCaps

#: ops-cv aclnn_upsample_bilinear_2d.cpp: MAX_SUPPORT_SHRINK_SCALE (largest source step)
BILINEAR_FAST_MAX_STEP = 50.0
#: ops-cv aclnn_upsample_bicubic_2d.cpp: MAX_SUPPORT_SCALE (largest source step)
BICUBIC_FAST_MAX_STEP = 40.0
#: ops-cv aclnn_upsample_bicubic_2d.cpp: MAX_SUPPORT_SCALE_DOUBLE (both steps above it)
BICUBIC_FAST_MAX_STEP_BOTH = 30.0
#: ops-nn aclnn_avgpool2d.cpp: AVGV2_KERNEL_H_MAX / AVGV2_KERNEL_W_MAX
AVG_CUBE_MAX_KERNEL = 255
#: ops-nn aclnn_avgpool2d.cpp: AVGV2_KERNEL_SIZE_H_MUL_W
AVG_CUBE_MAX_WINDOW = 255
#: ops-nn aclnn_avgpool2d.cpp: AVGV2_KERNEL_SIZE (both sides at most this also passes)
AVG_CUBE_SMALL_KERNEL = 20
#: ops-nn aclnn_avgpool2d.cpp: AVGV2_DIVISOR_OVERRIDE_MAX (and -MIN)
AVG_CUBE_MAX_DIVISOR = 255
#: ops-nn aclnn_avgpool2d.cpp: cMaxDims (channels must be below it)
AVG_CUBE_MAX_CHANNELS = 65536
#: ops-nn aclnn_avgpool2d.cpp: LONG_STRIP_MULTIPLIER
AVG_LONG_STRIP = 2
#: integers of magnitude below this are exact in float32
FP32_EXACT_INT = 2 ** 24

MEMORY_FORMATS = ('contiguous', 'channels_last', 'strided')
_AICORE_DTYPES = (torch.float16, torch.float32, torch.bfloat16)
#: generations whose bilinear resize is ResizeBilinearV2 (ops-cv: neither 910B/910_93
#: nor 910_95 takes GoResizeBilinearV2AICORE)
_RESIZE_V2_GENERATIONS = ('A1', '310P', '310B')
_CPU_KERNEL = 'CPU (PyTorch)'
_NO_CHANNELS_LAST = ('torch_npu has no channels_last tensors (TensorFactories.cpp: empty() '
                     'takes Contiguous only, clone() ignores the memory format): the input '
                     'is passed as it is')


@dataclass(frozen=True)
class Plan:
    """How to run one op call.

    Attributes:
        op: ``'upsample'``, ``'max_pool2d'``, ``'avg_pool2d'`` or ``'adaptive_avg_pool2d'``.
        call: the aten call form. Upsample: ``'native'`` (the user's own arguments),
            ``'size'`` (``size=out``), ``'scales'`` (``scale_factor=scales``,
            ``recompute_scale_factor=False``). Pooling: ``'native'`` (with explicit
            padding where needed) or ``'mean'`` (adaptive pooling to 1x1).
        kernel: the aclnn entry and kernel this call form reaches (for reports).
        scales: the explicit scales of a ``'scales'`` call.
        layout: ``'keep'``, ``'to_nchw'`` or ``'to_channels_last'``: the input is
            converted before the call and the output converted back to the input's
            memory format (tuning candidates off the NPU only).
        compute_dtype: dtype name the call computes in (None: the input dtype); the
            result is cast back to the input dtype.
        on_cpu: the call runs on the CPU and the result is moved back (a fallback).
        pad: ``'lowest'``: max pooling applies SAME/asymmetric padding itself with the
            dtype's lowest finite value instead of ``-inf`` (the NPU kernels reject -Inf).
        fallback: why the fast path is left (None when it is not); counted and logged.
        notes: further decisions worth reporting (not fallbacks).
        expect: kernel type names a profiler trace of this call must show.
        forbid: kernel type names it must not show.
    """

    op: str
    call: str = 'native'
    kernel: str = 'aten (native)'
    scales: Optional[Tuple[float, float]] = None
    layout: str = 'keep'
    compute_dtype: Optional[str] = None
    on_cpu: bool = False
    pad: Optional[str] = None
    fallback: Optional[str] = None
    notes: Tuple[str, ...] = field(default_factory=tuple)
    expect: Tuple[str, ...] = field(default_factory=tuple)
    forbid: Tuple[str, ...] = field(default_factory=tuple)

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
        if self.pad:
            parts.append(f'pad_{self.pad}')
        if self.on_cpu:
            parts.append('cpu')
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


def _layout_notes(memory_format: str, caps: DeviceCaps) -> Tuple[str, ...]:
    return (_NO_CHANNELS_LAST,) if caps.is_npu and memory_format == 'channels_last' else ()


def _cpu_plan(op: str, reasons: Sequence[str], notes: Tuple[str, ...] = ()) -> Plan:
    """A plan that runs the whole call on the CPU, with the reasons as its fallback."""
    return Plan(op, kernel=_CPU_KERNEL, on_cpu=True, fallback='; '.join(reasons), notes=notes)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace('torch.', '')


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


def passed_scales(spec: geo.UpsampleSpec) -> Tuple[Optional[float], Optional[float]]:
    """The scales ``F.interpolate`` hands to the aten kernel for ``spec``'s call.

    The user's ``scale_factor`` unless ``recompute_scale_factor=True`` (then, as for a
    size call, None); note that PyTorch passes the user scale even for an axis whose size
    does not change.
    """
    args = spec.args
    if args.scale_factor is None or args.recompute_scale_factor:
        return None, None
    return float(args.scale_factor[0]), float(args.scale_factor[1])


def _f32(value: float) -> float:
    return float(np.float32(value))


def bilinear_step(n_in: int, n_out: int, scale: float, align_corners: bool) -> float:
    """The source step ``aclnnUpsampleBilinear2d`` checks, rounded to float32 as it stores it.

    hicann ops-cv master, ``image/upsample_bilinear2d/op_host/op_api/
    aclnn_upsample_bilinear_2d.cpp``, ``GetBilinearScales``: 1 when the size does not
    change; ``(in-1)/(out-1)`` with ``align_corners`` (0 for one output pixel); else
    ``1/scale`` for a positive scale and ``in/out`` otherwise.
    """
    if n_out == n_in:
        return 1.0
    if align_corners:
        return _f32((n_in - 1) / (n_out - 1)) if n_out > 1 else 0.0
    return _f32(1.0 / scale) if scale > 0 else _f32(n_in / n_out)


def bilinear_fast_refusal(in_hw: Sequence[int], out_hw: Sequence[int],
                          scales: Tuple[float, float], align_corners: bool,
                          dtype: torch.dtype, check_shape: bool = True) -> Optional[str]:
    """Why ``aclnnUpsampleBilinear2d`` on A2/A3 leaves its fast kernel, None if it takes it.

    ``scales`` are the attribute values torch_npu passes (a size call passes 1.0:
    op-plugin ``UpsampleBilinear2dKernelNpuOpApi.cpp``, ``scales_h.value_or(1)``). A
    transcription of ops-cv master ``aclnn_upsample_bilinear_2d.cpp``: the AI-core dtype
    list, ``CheckBilinear2dScales`` and (unless ``check_shape`` is False)
    ``CheckScalesAndShapeValid``.
    """
    if dtype not in _AICORE_DTYPES:
        return f'{_dtype_name(dtype)} is not an AI-core dtype of UpsampleBilinear2d'
    scale_h, scale_w = scales
    if abs(scale_h - 2.0) < 1e-9 and abs(scale_w - 2.0) < 1e-9 and dtype != torch.bfloat16:
        return 'scales (2.0, 2.0) are excluded from the fast kernel (non-bf16)'
    if abs(scale_h) < 1e-12 or abs(scale_w) < 1e-12:
        return 'a zero scale is excluded from the fast kernel'
    mapping = (scale_h, scale_w)
    if abs(scale_h - 1.0) < 1e-9 and abs(scale_w - 1.0) < 1e-9 and tuple(out_hw) != tuple(in_hw):
        # "size(fp16&fp32) go resizeBilinearV2, size(bf16) go upsampleBilinear2d"
        if dtype != torch.bfloat16:
            return 'a size call (torch_npu passes scales 1.0) takes ResizeBilinearV2 (non-bf16)'
        mapping = (0.0, 0.0)
    steps = [bilinear_step(i, o, s, align_corners) for i, o, s in zip(in_hw, out_hw, mapping)]
    if max(steps) > BILINEAR_FAST_MAX_STEP:
        return (f'source step {max(steps):g} > {BILINEAR_FAST_MAX_STEP:g} '
                '(downscaling by more than 50x)')
    if check_shape and any(int(float(i) * s) != o for i, o, s in zip(in_hw, out_hw, scales)):
        return 'int(in * scale) != out (CheckScalesAndShapeValid)'
    return None


def bicubic_steps(in_hw: Sequence[int], out_hw: Sequence[int],
                  scales: Tuple[float, float], align_corners: bool) -> Tuple[float, float]:
    """The float32 source steps ``aclnnUpsampleBicubic2d`` checks (``CheckMaxScaleSupport``).

    hicann ops-cv master ``image/upsample_bicubic2d/op_host/op_api/
    aclnn_upsample_bicubic_2d.cpp``: ``(in-1)/(out-1)`` with ``align_corners`` (0 for one
    output pixel), else ``1/scale`` for a positive scale and ``in/out`` otherwise (a size
    call passes 0: op-plugin ``upsample_bicubic2d_opapi``, ``scales_h.value_or(0)``).
    """
    steps = []
    for n_in, n_out, scale in zip(in_hw, out_hw, scales):
        if align_corners:
            steps.append(float(np.float32(n_in - 1) / np.float32(n_out - 1)) if n_out > 1 else 0.0)
        elif scale > 0:
            steps.append(_f32(1.0 / scale))
        else:
            steps.append(float(np.float32(n_in) / np.float32(n_out)))
    return steps[0], steps[1]


def bicubic_fast_refusal(steps: Tuple[float, float]) -> Optional[str]:
    """Why ``aclnnUpsampleBicubic2d`` on A2/A3 leaves ``UpsampleBicubic2d``, None if not."""
    if max(steps) > BICUBIC_FAST_MAX_STEP:
        return f'source step {max(steps):g} > {BICUBIC_FAST_MAX_STEP:g} for bicubic'
    if min(steps) > BICUBIC_FAST_MAX_STEP_BOTH:
        return f'both source steps > {BICUBIC_FAST_MAX_STEP_BOTH:g} for bicubic'
    return None


_UPSAMPLE_ENTRIES = {'nearest': 'aclnnUpsampleNearest2d',
                     'nearest-exact': 'aclnnUpsampleNearestExact2d',
                     'bilinear': 'aclnnUpsampleBilinear2d', 'bicubic': 'aclnnUpsampleBicubic2d',
                     'area': 'aclnnAdaptiveAvgPool2d'}
_BILINEAR_FAST = dict(expect=('UpsampleBilinear2d',), forbid=('ResizeBilinearV2',))
_BILINEAR_SLOW = dict(expect=('ResizeBilinearV2',), forbid=('UpsampleBilinear2d',))


def _plan_bilinear_a2(spec: geo.UpsampleSpec, dtype: torch.dtype, caps: DeviceCaps,
                      notes: Tuple[str, ...]) -> Plan:
    """Bilinear on A2/A3: the user's call if it is fast, else a consistent scale call."""
    entry = _UPSAMPLE_ENTRIES['bilinear']
    in_hw, out_hw = spec.in_size, spec.out_size
    align = bool(spec.align_corners)
    passed = passed_scales(spec)
    size_like = passed == (None, None)
    fast = dict(_BILINEAR_FAST, kernel=f'{entry} -> UpsampleBilinear2d (fast, fp32 compute)',
                notes=notes)
    if tuple(in_hw) == tuple(out_hw):
        fast['expect'] = ()  # the fast branch returns the input itself: no kernel runs
    if size_like and dtype == torch.bfloat16 and not caps.op_plugin_26 and \
            bilinear_fast_refusal(in_hw, out_hw, (1.0, 1.0), align, dtype,
                                  check_shape=False) is None:
        # Per a reported reading of op-plugin 6.0.0-7.3.0 with the CANN releases paired
        # with torch_npu <= 2.8 (ops-cv: "size(bf16) go upsampleBilinear2d"); not
        # verifiable here: ops-cv master's CheckScalesAndShapeValid (int(in * 1.0) == out)
        # would refuse it. `tools/check_parity.py --trace` shows which kernel ran.
        return Plan('upsample', 'native', **dict(fast, notes=notes + (
            'bf16 size call: fast kernel on torch_npu <= 2.8',)))
    refusal = bilinear_fast_refusal(in_hw, out_hw, tuple(1.0 if s is None else s for s in passed),
                                     align, dtype)
    if refusal is None:
        return Plan('upsample', 'native', **fast)
    if size_like:
        scales = consistent_scales(spec)
        if scales is None:
            refusal = ('no explicit scale reproduces the size call exactly '
                       '(floor(in*s) == out with 1/s == in/out)')
        else:
            scale_refusal = bilinear_fast_refusal(in_hw, out_hw, scales, align, dtype)
            if scale_refusal is None:
                return Plan('upsample', 'scales', scales=scales, **fast)
            refusal = scale_refusal
    return Plan('upsample', 'native', f'{entry} -> TransData (NC1HWC0) + ResizeBilinearV2',
                fallback=refusal, notes=notes, **_BILINEAR_SLOW)


def _plan_bicubic_a2(spec: geo.UpsampleSpec, dtype: torch.dtype,
                     notes: Tuple[str, ...]) -> Plan:
    """Bicubic on A2/A3: size and scale calls both reach UpsampleBicubic2d within limits."""
    entry = _UPSAMPLE_ENTRIES['bicubic']
    scales = tuple(0.0 if s is None else s for s in passed_scales(spec))
    refusal = bicubic_fast_refusal(bicubic_steps(spec.in_size, spec.out_size, scales,
                                                 bool(spec.align_corners)))
    if refusal is None:
        return Plan('upsample', 'native', f'{entry} -> UpsampleBicubic2d (fast, fp32 compute)',
                    notes=notes, expect=('UpsampleBicubic2d',), forbid=('ResizeD',))
    return Plan('upsample', 'native', f'{entry} -> Transpose (HWNC) + ResizeD', fallback=refusal,
                notes=notes, expect=('ResizeD',), forbid=('UpsampleBicubic2d',))


def _ignored_scale_axes(spec: geo.UpsampleSpec) -> Tuple[int, ...]:
    """Axes where PyTorch maps with a user ``1/s`` that differs from ``in/out``."""
    if spec.align_corners:
        return ()
    axes = []
    for axis, scale in enumerate(spec.kernel_scales):
        n_in, n_out = spec.in_size[axis], spec.out_size[axis]
        if scale is not None and not _same_step(1.0 / scale, n_in / n_out):
            axes.append(axis)
    return tuple(axes)


def _plan_resize_legacy(spec: geo.UpsampleSpec, dtype: torch.dtype, caps: DeviceCaps,
                        notes: Tuple[str, ...]) -> Plan:
    """Bilinear/bicubic on 910A, 310P and 310B (no fast AI-core kernels there)."""
    entry = _UPSAMPLE_ENTRIES[spec.mode]
    if spec.mode == 'bilinear':
        # ops-cv aclnn_upsample_bilinear_2d.cpp: GoResizeBilinearV2AICORE passes only the
        # output size to ResizeBilinearV2, which maps with in/out (or (in-1)/(out-1)).
        ignored = _ignored_scale_axes(spec)
        if ignored:
            return _cpu_plan('upsample', [
                f'ResizeBilinearV2 (the {caps.generation} bilinear kernel) ignores scales and '
                f'maps with in/out, but this call maps axis {ignored} with 1/scale'], notes)
        kernel = f'{entry} -> TransData (NC1HWC0) + ResizeBilinearV2'
        expect: Tuple[str, ...] = ('ResizeBilinearV2',)
    elif caps.generation == 'A1':
        # ops-cv aclnn_upsample_bicubic_2d.cpp: non-910B chips transpose to HWNC and run
        # ResizeD, 310P/310B UpsampleBicubic2d
        kernel, expect = f'{entry} -> Transpose (HWNC) + ResizeD', ('ResizeD',)
    else:
        kernel, expect = f'{entry} -> Transpose (HWNC) + UpsampleBicubic2d', ('UpsampleBicubic2d',)
    if dtype == torch.bfloat16:
        return Plan('upsample', 'native', kernel, compute_dtype='float32', notes=notes,
                    fallback=f'bf16 is not supported on {caps.generation}: computed in float32',
                    expect=expect)
    return Plan('upsample', 'native', kernel, notes=notes, expect=expect)


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
    notes = _layout_notes(memory_format, caps)
    kernel = _UPSAMPLE_ENTRIES[spec.mode] + ('AA' if spec.antialias else '')
    if spec.antialias or spec.mode not in geo.INTERPOLATING_MODES:
        return Plan('upsample', 'native', kernel, notes=notes)
    if dtype == torch.float64:
        # op-plugin UpsampleBilinear2dKernelNpuOpApi.cpp: TORCH_CHECK(... != Double,
        # "upsample_binlinear_2d not support torch.fp64 dtypes"); ops-cv
        # aclnn_upsample_bicubic_2d.cpp lists fp16/fp32(/bf16) only
        return _cpu_plan('upsample', [f'float64 is not supported by {kernel} on the NPU'], notes)
    if caps.a2_a3:
        if spec.mode == 'bilinear':
            return _plan_bilinear_a2(spec, dtype, caps, notes)
        return _plan_bicubic_a2(spec, dtype, notes)
    if caps.generation in _RESIZE_V2_GENERATIONS:
        return _plan_resize_legacy(spec, dtype, caps, notes)
    return Plan('upsample', 'native', kernel,
                notes=notes + (f'no planned rules for {caps.generation}',))


def upsample_candidates(spec: geo.UpsampleSpec, shape: Sequence[int], dtype: torch.dtype,
                        memory_format: str, caps: Optional[DeviceCaps] = None
                        ) -> Tuple[Plan, ...]:
    """Every call form that computes ``spec`` with the same semantics (for tuning).

    The native call; the size call when the spec maps with ``in/out``; the scale call
    when :func:`consistent_scales` finds one; off an NPU each in the input's layout and
    in the other 4-D layout (NCHW <-> channels_last). On an NPU there are no layout
    forms: torch_npu keeps no channels_last tensors.
    """
    forms = [Plan('upsample')]
    if spec.mode in geo.INTERPOLATING_MODES and not spec.antialias:
        if all(s is None for s in spec.kernel_scales) and spec.args.size is None:
            forms.append(Plan('upsample', 'size'))
        scales = consistent_scales(spec)
        if scales is not None and spec.args.scale_factor is None:
            forms.append(Plan('upsample', 'scales', scales=scales))
    if caps is not None and caps.is_npu:
        return tuple(forms)
    other = 'to_nchw' if memory_format == 'channels_last' else 'to_channels_last'
    return tuple(forms) + tuple(replace(p, layout=other) for p in forms)


# ----------------------------------------------------------------------------------
# max pooling
# ----------------------------------------------------------------------------------
def max_pool_kernel(spec: geo.PoolSpec, caps: DeviceCaps) -> Tuple[str, Tuple[str, ...]]:
    """The aclnn entry and kernel torch_npu's ``max_pool2d_with_indices`` runs, and the
    kernel type a trace shows.

    Which entry: :attr:`DeviceCaps.max_pool_returns_indices`. Which kernel: hicann
    ops-nn master ``pooling/max_pool3d_with_argmax_v2/op_host/op_api/
    aclnn_max_pool2d_with_indices.cpp``: WithMask on 910B/910_93 with a kernel other
    than 1x1 reshapes to 3-D and runs MaxPool3DWithArgmaxV2, otherwise MaxPoolWithArgmaxV1
    on NC1HWC0; WithIndices runs MaxPool3DWithArgmaxV2 (MaxPoolWithArgmaxV3 on 950).
    """
    if caps.max_pool_returns_indices:
        if caps.generation == '950':
            return ('aclnnMaxPool2dWithIndices -> MaxPoolWithArgmaxV3 (int32 indices)',
                    ('MaxPoolWithArgmaxV3',))
        return ('aclnnMaxPool2dWithIndices -> MaxPool3DWithArgmaxV2 (int32 indices)',
                ('MaxPool3DWithArgmaxV2',))
    if caps.a2_a3 and tuple(spec.kernel) != (1, 1):
        return ('aclnnMaxPool2dWithMask -> MaxPool3DWithArgmaxV2 (int8 mask)',
                ('MaxPool3DWithArgmaxV2',))
    return ('aclnnMaxPool2dWithMask -> TransData (NC1HWC0) + MaxPoolWithArgmaxV1 (int8 mask)',
            ('MaxPoolWithArgmaxV1',))


def _max_pool_float_rule(dtype: torch.dtype, caps: DeviceCaps
                         ) -> Tuple[Optional[str], Optional[str]]:
    """(CPU reason, float32 reason) for a floating dtype on ``caps``; both None if fine.

    ops-nn ``aclnn_max_pool2d_with_indices.cpp``, ``GetDtypeSupportListBySocVersion`` and
    ``GetCastDtypeForMask``; ``aclnnMaxPool2dWithMask.md``: 910/910A takes fp16/fp32 but
    computes fp32 in fp16 (values rounded), 310P takes float only, 310B none;
    WithIndices takes no dtype on 910A/310P.
    """
    if dtype == torch.float64:
        return 'float64: the max-pooling kernels take fp16/fp32/bf16 only', None
    generation = caps.generation
    if caps.max_pool_returns_indices and generation not in ('A2', 'A3', '950'):
        return f'aclnnMaxPool2dWithIndices supports no dtype on {generation}', None
    if generation == 'A1' and dtype in (torch.float32, torch.bfloat16):
        return (f'910A computes {_dtype_name(dtype)} max pooling in float16 '
                '(GetCastDtypeForMask), which changes values'), None
    if generation == '310P' and dtype in (torch.float16, torch.bfloat16):
        return None, f'310P max pooling takes float32 only: {_dtype_name(dtype)} runs in float32'
    if generation == '310B':
        return 'aclnnMaxPool2dWithMask is not implemented on 310B', None
    return None, None


def max_pool_data_checks(spec: geo.PoolSpec, return_indices: bool, dtype: torch.dtype,
                         caps: DeviceCaps) -> Tuple[bool, bool]:
    """``(needs_finite, needs_range)``: which input checks (each a reduction and a device
    sync) the plan depends on.

    The NaN/-Inf check matters only where the device can return real indices, since the
    indices of a mask kernel are recomputed on the CPU anyway; the range check only for
    int32/int64 input, which runs in float32 when ``|x| < 2**24``.
    """
    if not caps.is_npu or caps.generation == 'npu-unknown':
        return False, False
    needs_range = dtype in (torch.int32, torch.int64)
    plan = plan_max_pool2d(spec, return_indices, (1, 1) + tuple(spec.in_size), dtype,
                           'contiguous', caps, finite=True, int_fits_fp32=True)
    needs_finite = (return_indices and caps.max_pool_returns_indices and not plan.on_cpu
                    and dtype.is_floating_point)
    return needs_finite, needs_range


def plan_max_pool2d(spec: geo.PoolSpec, return_indices: bool, shape: Sequence[int],
                    dtype: torch.dtype, memory_format: str, caps: DeviceCaps, *,
                    finite: Optional[bool] = None,
                    int_fits_fp32: Optional[bool] = None) -> Plan:
    """Plan a max-pool call.

    Args:
        spec: ``geometry.pool_spec`` of the call.
        return_indices: whether PyTorch-format int64 indices are wanted.
        shape, dtype, memory_format, caps: as :func:`plan_upsample`.
        finite: whether the input holds no NaN and no -Inf (consulted only where the
            device returns real indices; None means unknown, planned as if it might).
        int_fits_fp32: for int32/int64 input, whether ``|x| < 2**24`` (None: unknown).
    """
    _check_common(shape, dtype, memory_format, caps)
    if not caps.is_npu:
        return Plan('max_pool2d')
    notes = _layout_notes(memory_format, caps)
    if caps.generation == 'npu-unknown':
        return Plan('max_pool2d', notes=notes + ('unknown chip: no planned rules',))
    cpu_reasons, compute, compute_reason = [], None, None
    kernel_dtype = dtype
    if dtype in INTEGER_DTYPES:
        if dtype in (torch.int32, torch.int64) and int_fits_fp32 is not True:
            cpu_reasons.append('integer input with |x| >= 2**24 (or an unknown range) is not '
                               'exact in float32, and the kernels take no integers')
        else:
            kernel_dtype = torch.float32
            compute = 'float32'
            compute_reason = ('integer max pooling runs in float32 (the kernels take no '
                              'integers; exact for |x| < 2**24)')
    if not cpu_reasons:
        cpu_reason, f32_reason = _max_pool_float_rule(kernel_dtype, caps)
        if cpu_reason:
            cpu_reasons.append(cpu_reason)
        elif f32_reason:
            compute, compute_reason = 'float32', f32_reason
    if spec.dilation != (1, 1) and caps.generation != '950':
        # ops-nn aclnn_max_pool2d_with_indices.cpp, CheckShape: "dilation only support 1"
        cpu_reasons.append(f'the max-pooling kernels take dilation 1 only, got {spec.dilation}')
    if return_indices and caps.max_pool_returns_indices and finite is not True:
        cpu_reasons.append('input may hold NaN/-Inf, unsupported by aclnnMaxPool2dWithIndices'
                           if finite is None else
                           'input holds NaN/-Inf, unsupported by aclnnMaxPool2dWithIndices')
    if cpu_reasons:
        return _cpu_plan('max_pool2d', cpu_reasons, notes)
    kernel, expect = max_pool_kernel(spec, caps)
    pad = None
    if not spec.torch_padding_ok:
        # ops-nn aclnnMaxPool2dWithMask.md, constraints: NaN/-Inf input unsupported on
        # every chip; finfo.min padding gives PyTorch's values and indices for finite input
        pad = 'lowest'
        notes += ('SAME/asymmetric padding applied with finfo(dtype).min, not -inf (the '
                  'kernels reject -Inf input): exact for finite inputs',)
    if return_indices and not caps.max_pool_returns_indices:
        notes += ('the device returns an int8 mask, not indices: PyTorch indices are '
                  'recomputed on the CPU',)
    return Plan('max_pool2d', kernel=kernel, compute_dtype=compute, pad=pad,
                fallback=compute_reason, notes=notes, expect=expect)


# ----------------------------------------------------------------------------------
# average pooling
# ----------------------------------------------------------------------------------
class AvgKernelCall(NamedTuple):
    """What ``native.avg_pool2d`` hands to ``aclnnAvgPool2d`` for a call."""

    in_hw: Tuple[int, int]
    padding: Tuple[int, int]
    ceil_mode: bool
    divisor: int          # 0 means "no override", as op-plugin passes it
    dtype: torch.dtype


def avg_kernel_call(spec: geo.PoolSpec, count_include_pad: bool, divisor_override,
                    shape: Sequence[int], dtype: torch.dtype) -> AvgKernelCall:
    """The kernel call ``native.avg_pool2d`` makes: symmetric padding <= k/2 is passed on;
    other padding is applied explicitly first (then the kernel sees padding 0, no
    ``ceil_mode``, and for SAME without ``count_include_pad`` window sums in float32 for
    fp16/bf16 with divisor 1)."""
    h, w = int(shape[-2]), int(shape[-1])
    if spec.torch_padding_ok:
        return AvgKernelCall((h, w), tuple(spec.pad_begin), bool(spec.args.ceil_mode),
                             int(divisor_override or 0), dtype)
    (top, left), (bottom, right) = spec.pad_begin, spec.pad_end
    padded = (h + top + bottom, w + left + right)
    if divisor_override is not None or count_include_pad:
        return AvgKernelCall(padded, (0, 0), False, int(divisor_override or 0), dtype)
    sums_dtype = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    return AvgKernelCall(padded, (0, 0), False, 1, sums_dtype)


def avg_pool_path(call: AvgKernelCall, kernel: Tuple[int, int], out_hw: Tuple[int, int],
                  channels: int, caps: DeviceCaps) -> Tuple[str, Tuple[str, ...]]:
    """``('global' | 'cube' | 'vector' | 'aicpu', reasons the Cube path is skipped)``.

    hicann ops-nn master ``pooling/avg_pool3_d/op_api/aclnn_avgpool2d.cpp``:
    ``CheckGlobalPool`` (kernel == input H, W and no padding) -> ReduceMean; on
    910B/910_93 the Cube path (``BuildAvgPoolGraph``) needs ``!CheckNeedChangeTo3D`` (not
    a long strip), ``CheckAvgPool``, no ``ceilMode`` and ``C < cMaxDims``, else
    ``BuildAvgPool2dTo3dGraph`` (AvgPool3D); other chips take the Cube path when
    ``CheckAvgPool`` passes, else AI CPU.
    """
    (h, w), (kh, kw) = call.in_hw, kernel
    if (h, w) == (kh, kw) and call.padding == (0, 0):
        return 'global', ()
    reasons = []
    if kh > AVG_CUBE_MAX_KERNEL or kw > AVG_CUBE_MAX_KERNEL:
        reasons.append(f'kernel side > {AVG_CUBE_MAX_KERNEL}')
    small = kh * kw <= AVG_CUBE_MAX_WINDOW or (kh <= AVG_CUBE_SMALL_KERNEL and
                                              kw <= AVG_CUBE_SMALL_KERNEL)
    if not small and (caps.a2_a3 or (out_hw[0] != 1 and out_hw[1] == 1)):
        reasons.append(f'kH*kW > {AVG_CUBE_MAX_WINDOW} with a side > {AVG_CUBE_SMALL_KERNEL}')
    if abs(call.divisor) > AVG_CUBE_MAX_DIVISOR:
        reasons.append(f'divisor_override outside [-{AVG_CUBE_MAX_DIVISOR}, '
                       f'{AVG_CUBE_MAX_DIVISOR}]')
    if not caps.a2_a3:
        return ('aicpu' if reasons else 'cube'), tuple(reasons)
    if w // h >= AVG_LONG_STRIP or h // w >= AVG_LONG_STRIP:
        reasons.append('long-strip input (W/H >= 2 or H/W >= 2)')
    if call.ceil_mode:
        reasons.append('ceil_mode')
    if channels >= AVG_CUBE_MAX_CHANNELS:
        reasons.append(f'C >= {AVG_CUBE_MAX_CHANNELS}')
    return ('vector' if reasons else 'cube'), tuple(reasons)


_AVG_KERNELS = {
    'global': ('aclnnAvgPool2d -> ReduceMean (global mean)', ('ReduceMean',), ()),
    'cube': ('aclnnAvgPool2d -> TransData (NC1HWC0) + Pooling (Cube)', ('Pooling',),
             ('AvgPool3D',)),
    'vector': ('aclnnAvgPool2d -> AvgPool3D (vector)', ('AvgPool3D',), ('Pooling',)),
    'aicpu': ('aclnnAvgPool2d -> AvgPool (AI CPU)', (), ('Pooling',)),
}


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
    notes = _layout_notes(memory_format, caps)
    if caps.generation == 'npu-unknown':
        return Plan('avg_pool2d', kernel='aclnnAvgPool2d',
                    notes=notes + ('unknown chip: no planned rules',))
    if dtype == torch.float64:
        # per a reported reading of ops-nn: aclnnAvgPool2d lists no float64
        return _cpu_plan('avg_pool2d', ['float64 is not supported by aclnnAvgPool2d'], notes)
    fallbacks = []
    if any(2 * p > k for p, k in zip(spec.pad_begin + spec.pad_end, spec.kernel * 2)):
        # op-plugin AvgPool2dKernelNpuOpApi.cpp: "pad should be smaller than or equal to
        # half of kernel size"; ops-nn CheckPaddingValidAvgPool2D
        fallbacks.append('aclnnAvgPool2d rejects padding > kernel/2: padded explicitly')
    elif not spec.symmetric:
        notes += ('asymmetric SAME padding applied explicitly',)
    compute = None
    if dtype == torch.bfloat16 and not caps.a2_a3:
        compute = 'float32'
        fallbacks.append(f'bf16 is not supported on {caps.generation}: computed in float32')
    call = avg_kernel_call(spec, count_include_pad, divisor_override, shape,
                           torch.float32 if compute else dtype)
    channels = int(shape[-3])
    path, skipped = avg_pool_path(call, tuple(spec.kernel), tuple(spec.out_size), channels, caps)
    kernel, expect, forbid = _AVG_KERNELS[path]
    if skipped:
        notes += (f'Cube path skipped: {", ".join(skipped)}',)
    # fp16 -> fp32 helps only where the Cube has fp32 (A2/A3; ops-nn IsCubeSupportFp32)
    if call.dtype == torch.float16 and (path == 'global' or (path == 'cube' and caps.a2_a3)):
        compute = 'float32'
        notes += ({'cube': 'fp16 on the Cube path rounds with an fp16 weight 1/(kH*kW) (ops-nn '
                           'GenWeightDynamic)',
                   'global': 'the fp16 global mean (ReduceMean) keeps fp16 (ops-nn '
                             'ProcessDataTypeConvert); its accumulation is not documented'}[path]
                  + ': averaged in float32 like PyTorch',)
    if path == 'cube' and not caps.a2_a3 and (compute == 'float32' or call.dtype == torch.float32):
        notes += (f'{caps.generation} has no fp32 Cube (ops-nn ProcessDataTypeConvert, '
                  'IsCubeSupportFp32): fp32 is cast to fp16 or rejected, depending on '
                  "op-plugin's cube_math_type",)
    return Plan('avg_pool2d', kernel=kernel, compute_dtype=compute,
                fallback='; '.join(fallbacks) or None, notes=notes, expect=expect, forbid=forbid)


# ----------------------------------------------------------------------------------
# adaptive average pooling and tuning candidates
# ----------------------------------------------------------------------------------
def plan_adaptive_avg_pool2d(out_size: Tuple[int, int], shape: Sequence[int],
                             dtype: torch.dtype, memory_format: str,
                             caps: DeviceCaps) -> Plan:
    """Plan adaptive average pooling to ``out_size`` (1x1 is a mean over H, W)."""
    _check_common(shape, dtype, memory_format, caps)
    if not caps.is_npu:
        return Plan('adaptive_avg_pool2d')
    notes = _layout_notes(memory_format, caps)
    if tuple(out_size) == (1, 1):
        return Plan('adaptive_avg_pool2d', 'mean', 'ReduceMean over (H, W)', notes=notes,
                    expect=('ReduceMean',))
    return Plan('adaptive_avg_pool2d', kernel='aclnnAdaptiveAvgPool2d',
                notes=notes + ('the kernel transposes to channels-last internally',))


def pool_candidates(op: str, memory_format: str, out_size=None,
                    caps: Optional[DeviceCaps] = None) -> Tuple[Plan, ...]:
    """Semantically equivalent pooling call forms (for tuning): layouts, and the mean.

    On an NPU there are no layout forms (torch_npu keeps no channels_last tensors) and
    the plain native max/avg call is not offered (the planner's plan, which the tuner
    always times first, is the form that respects the kernels' limits).
    """
    forms = [Plan(op)]
    if op == 'adaptive_avg_pool2d' and out_size is not None and tuple(out_size) == (1, 1):
        forms.append(Plan(op, 'mean'))
    if caps is not None and caps.is_npu:
        return tuple(forms) if op == 'adaptive_avg_pool2d' else ()
    other = 'to_nchw' if memory_format == 'channels_last' else 'to_channels_last'
    return tuple(forms) + tuple(replace(p, layout=other) for p in forms)
