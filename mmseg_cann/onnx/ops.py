"""Export backend: the CANN ops as ``mmseg_cann::*`` custom ops while exporting.

While ``torch.export`` traces a model (``torch.onnx.export(..., dynamo=True)``, the
default of torch 2.13), the ``'auto'`` backend resolves to this module (see
:func:`mmseg_cann.backends.get_backend`). Each op becomes one custom op carrying the
resolved geometry from :mod:`mmseg_cann.core.geometry` -- output size, the scales PyTorch
maps with, SAME/explicit pads -- so :mod:`mmseg_cann.onnx.translation` writes ONNX nodes
with exactly the attributes the geometry prescribes instead of whatever a generic
decomposition of ``F.interpolate`` would give.

The functions have the backend signatures of :mod:`mmseg_cann.backends.native`; the fused
ops (``upsample_add``, ``upsample_argmax``) export as their unfused equivalents.
Outside tracing the custom ops compute with the native backend, so a traced graph also
runs eagerly.
"""
from __future__ import annotations

import sys
from typing import Dict, List, Optional

import torch

from ..backends import native, roi_npu
from ..core import geometry as geo
from ..core import roi as roi_rules
from ..core.export_mode import DEFAULT_OPSET, current_opset, export_mode
from .translation import check_dynamic_upsample, check_exportable, onnx_axis_scale

#: ``align_corners`` is passed as an int: -1 (None), 0 or 1
_AC = {None: -1, False: 0, True: 1}


@torch.library.custom_op('mmseg_cann::upsample', mutates_args=())
def _upsample_op(x: torch.Tensor, out_size: List[int], kernel_scales: List[float],
                 in_size: List[int], mode: str, align_corners: int,
                 antialias: bool) -> torch.Tensor:
    """Resize ``x`` (N, C, H, W) to ``out_size``; ``kernel_scales`` 0 means ``in/out``."""
    ac = None if align_corners < 0 else bool(align_corners)
    if any(s > 0 for s in kernel_scales):
        # an axis without a kernel scale is a copied axis: scale 1 reproduces it
        scales = [s if s > 0 else 1.0 for s in kernel_scales]
        return torch.nn.functional.interpolate(x, scale_factor=scales, mode=mode,
                                               align_corners=ac, antialias=antialias)
    return torch.nn.functional.interpolate(x, size=list(out_size), mode=mode,
                                           align_corners=ac, antialias=antialias)


@_upsample_op.register_fake
def _(x, out_size, kernel_scales, in_size, mode, align_corners, antialias):
    return x.new_empty((x.shape[0], x.shape[1], out_size[0], out_size[1]))


@torch.library.custom_op('mmseg_cann::upsample_by_scale', mutates_args=())
def _upsample_scale_op(x: torch.Tensor, scale_factor: List[float], onnx_scales: List[float],
                       map_with_scale: bool, mode: str, align_corners: int,
                       antialias: bool) -> torch.Tensor:
    """Resize ``x`` (N, C, H, W) of any (dynamic) size by ``scale_factor``.

    Output ``floor(in * scale)`` per axis. ``map_with_scale``: PyTorch maps coordinates
    with ``1 / scale`` (ONNX ``Resize`` with ``onnx_scales``, which equal the user scales
    except where PyTorch copies an axis); otherwise with ``in / out`` (the sizes are
    computed in the graph in double precision, as PyTorch does, and passed as ``sizes``).
    """
    ac = None if align_corners < 0 else bool(align_corners)
    return torch.nn.functional.interpolate(
        x, scale_factor=list(scale_factor), mode=mode, align_corners=ac,
        recompute_scale_factor=not map_with_scale, antialias=antialias)


@_upsample_scale_op.register_fake
def _(x, scale_factor, onnx_scales, map_with_scale, mode, align_corners, antialias):
    out = [geo.upsample_output_size(n, s) for n, s in zip(x.shape[-2:], scale_factor)]
    return x.new_empty((x.shape[0], x.shape[1], out[0], out[1]))


@torch.library.custom_op('mmseg_cann::max_pool2d', mutates_args=())
def _max_pool_op(x: torch.Tensor, kernel: List[int], stride: List[int], padding: str,
                 pads: List[int], dilation: List[int], ceil_mode: bool) -> torch.Tensor:
    """Max pooling; ``padding`` is a SAME string or ``'explicit'`` with ``pads`` (t, l, b, r)."""
    return native.max_pool2d(x, _pool_spec(x, kernel, stride, padding, pads, dilation,
                                           ceil_mode))


@_max_pool_op.register_fake
def _(x, kernel, stride, padding, pads, dilation, ceil_mode):
    spec = _pool_spec(x, kernel, stride, padding, pads, dilation, ceil_mode)
    return x.new_empty((x.shape[0], x.shape[1]) + spec.out_size)


@torch.library.custom_op('mmseg_cann::avg_pool2d', mutates_args=())
def _avg_pool_op(x: torch.Tensor, kernel: List[int], stride: List[int], padding: str,
                 pads: List[int], ceil_mode: bool, count_include_pad: bool) -> torch.Tensor:
    """Average pooling; arguments as ``max_pool2d`` (dilation 1)."""
    return native.avg_pool2d(x, _pool_spec(x, kernel, stride, padding, pads, [1, 1],
                                           ceil_mode), count_include_pad)


@_avg_pool_op.register_fake
def _(x, kernel, stride, padding, pads, ceil_mode, count_include_pad):
    spec = _pool_spec(x, kernel, stride, padding, pads, [1, 1], ceil_mode)
    return x.new_empty((x.shape[0], x.shape[1]) + spec.out_size)


@torch.library.custom_op('mmseg_cann::adaptive_avg_pool2d', mutates_args=())
def _adaptive_op(x: torch.Tensor, in_size: List[int], out_size: List[int]) -> torch.Tensor:
    """Adaptive average pooling to ``out_size``; ``in_size`` -1 marks a dynamic axis."""
    return torch.nn.functional.adaptive_avg_pool2d(x, out_size)


@_adaptive_op.register_fake
def _(x, in_size, out_size):
    return x.new_empty((x.shape[0], x.shape[1], out_size[0], out_size[1]))


def _pool_spec(x, kernel, stride, padding, pads, dilation, ceil_mode) -> geo.PoolSpec:
    """The spec of a node's arguments (explicit pads may be asymmetric, see above)."""
    if padding != 'explicit':
        args = geo.PoolArgs(tuple(kernel), tuple(stride), padding, tuple(dilation), ceil_mode)
        return geo.pool_spec(x.shape[-2:], args)
    args = geo.PoolArgs(tuple(kernel), tuple(stride), (0, 0), tuple(dilation), ceil_mode)
    in_hw = tuple(geo.size_value(v) for v in x.shape[-2:])
    out = []
    for axis in range(2):
        span = (in_hw[axis] + pads[axis] + pads[axis + 2]
                - geo.effective_kernel(kernel[axis], dilation[axis]))
        out.append((-(-span // stride[axis]) if ceil_mode else span // stride[axis]) + 1)
    return geo.PoolSpec(args, in_hw, tuple(out), (pads[0], pads[1]), (pads[2], pads[3]))


def _padding_fields(spec: geo.PoolSpec, counts_padding: bool = False):
    """``(padding, pads, ceil_mode)`` for the ONNX node.

    ONNX's ``ceil_mode`` output size lacks PyTorch's rule that the last window starts
    inside the input or left padding. Where the two differ, the node gets
    ``ceil_mode=0`` and just enough extra end padding for PyTorch's output size: padded
    cells never win a max and are not counted by an average that excludes padding; an
    average that counts padding (``counts_padding``) would count them, so it raises.
    """
    padding = spec.args.padding
    if isinstance(padding, str) and padding.startswith('same'):
        if geo.any_symbolic(spec.in_size) and any(
                geo.effective_kernel(k, d) < s
                for k, s, d in zip(spec.kernel, spec.stride, spec.dilation)):
            raise ValueError(
                f'pooling with padding={padding!r}, kernel_size={spec.kernel}, '
                f'stride={spec.stride} on a dynamic input size cannot be exported: with a '
                'kernel smaller than the stride the SAME padding is 0 or negative '
                "depending on the size, and onnxruntime's auto_pad rejects negative "
                'padding; use fixed input sizes (dynamic=False) or a kernel >= stride')
        # auto_pad computes the pads from the runtime size (they may be symbolic here)
        return padding, [0, 0, 0, 0], False
    pads = list(spec.pad_begin) + list(spec.pad_end)
    if not spec.args.ceil_mode:
        return 'explicit', pads, False
    if geo.any_symbolic(spec.in_size):
        for axis in range(2):
            k, st, d, pe = (spec.kernel[axis], spec.stride[axis], spec.dilation[axis],
                            pads[axis + 2])
            if geo.ceil_mode_may_drop(k, st, pe, d):
                raise ValueError(
                    f'pooling with kernel_size={spec.kernel}, stride={spec.stride}, '
                    f'padding={spec.args.padding}, dilation={spec.dilation}, ceil_mode=True '
                    'on a dynamic input size cannot be exported: whether PyTorch drops the '
                    'last window (it must start inside the input or the left padding) '
                    'depends on the size, ONNX ceil_mode keeps it (end padding >= '
                    f'effective kernel - stride + 1 = {geo.effective_kernel(k, d) - st + 1}); '
                    'use fixed input sizes (dynamic=False), ceil_mode=False or a smaller '
                    'padding')
        # never size-dependent here: ONNX's ceil_mode output size is PyTorch's
        return 'explicit', pads, True
    ends = []
    for axis in range(2):
        n, k, s, d = (spec.in_size[axis], spec.kernel[axis], spec.stride[axis],
                      spec.dilation[axis])
        span = n + pads[axis] + pads[axis + 2] - geo.effective_kernel(k, d)
        onnx_out = -(-span // s) + 1
        ends.append(None if onnx_out == spec.out_size[axis] else
                    (spec.out_size[axis] - 1) * s + geo.effective_kernel(k, d) - n - pads[axis])
    if all(e is None for e in ends):
        return 'explicit', pads, True
    if counts_padding:
        raise ValueError(
            f'avg_pool2d with ceil_mode=True, count_include_pad=True on input '
            f'{spec.in_size} (kernel {spec.kernel}, stride {spec.stride}, padding '
            f'{spec.pad_begin}) cannot be exported exactly: ONNX ceil_mode adds a window '
            'that PyTorch drops; use count_include_pad=False or ceil_mode=False')
    for axis, end in enumerate(ends):
        if end is not None:
            pads[axis + 2] = end
    return 'explicit', pads, False


# ----------------------------------------------------------------------------------
# backend interface
# ----------------------------------------------------------------------------------
def upsample(input: torch.Tensor, spec: geo.UpsampleSpec) -> torch.Tensor:
    """The upsample custom op for ``spec`` (``mode='area'`` is adaptive average pooling).

    With symbolic (dynamic) sizes: a resize by ``scale_factor`` becomes
    ``mmseg_cann::upsample_by_scale`` (scales or in-graph sizes), a resize to a given
    size (possibly another tensor's symbolic size) the ``sizes`` form; rules that depend
    on the concrete size are refused by :func:`check_dynamic_upsample`.
    """
    if geo.any_symbolic(spec.in_size + tuple(spec.out_size)):
        check_dynamic_upsample(spec)
        if spec.mode == 'area':
            return adaptive_avg_pool2d(input, spec.out_size)
        args = spec.args
        if args.scale_factor is not None:
            map_with_scale = not (args.recompute_scale_factor or all(
                s is None for s in spec.kernel_scales))
            onnx_scales = [1.0 if k is None else float(k) for k in spec.kernel_scales]
            return _upsample_scale_op(input, list(args.scale_factor), onnx_scales,
                                      map_with_scale, spec.mode, _AC[spec.align_corners],
                                      False)
        return _upsample_op(input, list(spec.out_size), [0.0, 0.0], [0, 0], spec.mode,
                            _AC[spec.align_corners], False)
    if spec.mode == 'area':
        return adaptive_avg_pool2d(input, spec.out_size)
    check_exportable(spec, current_opset())
    scales = [0.0 if s is None else onnx_axis_scale(spec, axis)
              for axis, s in enumerate(spec.kernel_scales)]
    return _upsample_op(input, list(spec.out_size), scales, list(spec.in_size), spec.mode,
                        _AC[spec.align_corners], spec.antialias)


def max_pool2d(input: torch.Tensor, spec: geo.PoolSpec, return_indices: bool = False):
    """The max-pool custom op; ``return_indices`` has no exportable form."""
    if return_indices:
        raise ValueError('max_pool2d with return_indices=True cannot be exported to ONNX '
                         'by mmseg_cann (ONNX MaxPool indices are not PyTorch flat '
                         'indices); export the model without return_indices')
    padding, pads, ceil_mode = _padding_fields(spec)
    return _max_pool_op(input, list(spec.kernel), list(spec.stride), padding, pads,
                        list(spec.dilation), ceil_mode)


def avg_pool2d(input: torch.Tensor, spec: geo.PoolSpec, count_include_pad: bool = True,
               divisor_override: Optional[int] = None) -> torch.Tensor:
    """The average-pool custom op; ``divisor_override`` has no ONNX form."""
    if divisor_override is not None:
        raise ValueError(f'avg_pool2d with divisor_override={divisor_override} cannot be '
                         'exported to ONNX (AveragePool has no divisor attribute); use '
                         'divisor_override=None')
    padding, pads, ceil_mode = _padding_fields(spec, count_include_pad)
    return _avg_pool_op(input, list(spec.kernel), list(spec.stride), padding, pads,
                        ceil_mode, count_include_pad)


def adaptive_avg_pool2d(input: torch.Tensor, output_size) -> torch.Tensor:
    """The adaptive average-pool custom op (a dynamic input needs a fixed output size)."""
    if geo.any_symbolic(output_size):
        raise ValueError(f'adaptive average pooling to a size that depends on the dynamic '
                         f'input ({tuple(output_size)}) cannot be exported; give a fixed '
                         'output size or export with fixed shapes')
    # -1 marks a dynamic axis (its bins are built in the graph from the runtime size)
    in_size = [-1 if geo.is_symbolic(v) else int(v) for v in input.shape[-2:]]
    return _adaptive_op(input, in_size, [int(v) for v in output_size])


def upsample_add(input: torch.Tensor, other: torch.Tensor,
                 spec: geo.UpsampleSpec) -> torch.Tensor:
    """The fused op as its unfused equivalent: the upsample custom op (ONNX ``Resize``)
    then ``Add``, ``other + upsample(input)`` as PyTorch computes it."""
    return other + upsample(input, spec)


def upsample_argmax(logits: torch.Tensor, spec: geo.UpsampleSpec) -> torch.Tensor:
    """The fused op as ``Resize`` then ``ArgMax`` over channels (int64 ``(N, H, W)``;
    ties take the first index in both PyTorch and ONNX)."""
    return upsample(logits, spec).argmax(1)


def upsample_sizes_op(x: torch.Tensor, out_size: List[int], mode: str,
                      align_corners: bool) -> torch.Tensor:
    """A ``Resize`` to constant ``sizes``, coordinates mapped with ``in / out``."""
    return _upsample_op(x, list(out_size), [0.0, 0.0], [0, 0], mode, _AC[align_corners],
                        False)


def max_pool_op(x: torch.Tensor, kernel: List[int], stride: List[int], padding: str,
                pads: List[int], dilation: List[int], ceil_mode: bool) -> torch.Tensor:
    """A ``MaxPool`` node with exactly these attributes (see :func:`_padding_fields`)."""
    return _max_pool_op(x, kernel, stride, padding, pads, dilation, ceil_mode)


@torch.library.custom_op('mmseg_cann::roi_max_pool', mutates_args=())
def _roi_max_pool_op(x: torch.Tensor, rois: torch.Tensor, pooled: List[int],
                     spatial_scale: float) -> torch.Tensor:
    """Max ROI pooling (ONNX ``MaxRoiPool``): ``roi_pool2d(mode='max')``'s values."""
    bins = roi_rules.roi_bins(rois, spatial_scale, pooled, x.shape[-2:], 'max')
    return roi_npu.pool_aten(x, bins, 'max', False)


@_roi_max_pool_op.register_fake
def _(x, rois, pooled, spatial_scale):
    return x.new_empty((rois.shape[0], x.shape[1], pooled[0], pooled[1]))


def roi_pool2d(input: torch.Tensor, rois: torch.Tensor, output_size, mode: str,
               spatial_scale: float, return_indices: bool = False) -> torch.Tensor:
    """ROI pooling while exporting: ``mode='max'`` becomes ONNX ``MaxRoiPool`` (the same
    region and bin rules: C ``round`` of ``coord * spatial_scale`` in float, float bins,
    empty bins 0; onnxruntime's CPU kernel equals ``roi_pool2d`` bit for bit in float32);
    ``mode='avg'`` and ``return_indices`` have no ONNX form and are refused."""
    if return_indices:
        raise ValueError('roi_pool2d with return_indices=True cannot be exported to ONNX '
                         '(MaxRoiPool has no indices output)')
    if mode != 'max':
        raise ValueError("roi_pool2d(mode='avg') cannot be exported to ONNX exactly: ONNX has "
                         'no average ROI pooling over integer regions (MaxRoiPool is max '
                         'only; RoiAlign samples bilinearly); export with mode='
                         "'max' or keep the average pooling outside the exported graph")
    if rois.dtype != input.dtype:
        rois = rois.to(input.dtype)  # MaxRoiPool takes X and rois of one type
    return _roi_max_pool_op(input, rois, [int(v) for v in output_size], float(spatial_scale))


def roi_translation_table(opset: int) -> Dict[object, object]:
    """``custom_translation_table`` entries for the ROI custom op at ``opset``
    (merged into :func:`mmseg_cann.onnx.export.export_onnx`'s table)."""
    from .translation import _opset
    op = _opset(opset)

    def roi_max_pool(x, rois, pooled, spatial_scale):
        return op.MaxRoiPool(x, rois, pooled_shape=[int(v) for v in pooled],
                             spatial_scale=float(spatial_scale))
    return {torch.ops.mmseg_cann.roi_max_pool.default: roi_max_pool}


def onnx_export_mode(opset: int = DEFAULT_OPSET):
    """Within this block, ``backend='auto'`` ops traced by ``torch.export`` become the
    ``mmseg_cann::*`` custom ops of this module. Eager calls are untouched."""
    return export_mode(sys.modules[__name__], opset)
