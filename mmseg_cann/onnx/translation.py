"""ONNX translations of the ``mmseg_cann::*`` custom ops (onnxscript).

:func:`resize_attributes` and :func:`pool_attributes` are the attribute rules, pure
Python so they are unit-tested and printed by the export tool; the translation functions
only assemble nodes from them. The rules (each checked against PyTorch in onnxruntime by
``tests/onnx``):

======================  ================================================================
PyTorch                 ONNX ``Resize``
======================  ================================================================
nearest (legacy)        mode=nearest, asymmetric, nearest_mode=floor: ``floor(d / s)``
nearest-exact           mode=nearest, half_pixel, nearest_mode=round_prefer_ceil:
                        ``floor((d + 0.5) / s - 0.5 + 0.5)``
bilinear                mode=linear, half_pixel (align_corners=False) or align_corners
bicubic                 mode=cubic, cubic_coeff_a=-0.75, exclude_outside=0, same modes
antialias               only bilinear, align_corners=False, no axis shrinking (PyTorch's
                        filter is then plain bilinear): exported as bilinear; every other
                        antialias case raises (onnxruntime's antialias filter differs)
======================  ================================================================

Output sizes are given as ``sizes`` (ONNX then maps with ``in / out``, PyTorch's rule
when no user scale applies); only when :attr:`UpsampleSpec.kernel_scales` says PyTorch
maps with ``1 / scale_factor`` does the node carry ``scales`` instead (a copied axis, see
``geometry._axis_copied``, gets scale 1).
"""
from __future__ import annotations

from typing import Dict, Optional, Sequence

import numpy as np
import torch

from ..ops import geometry as geo

MIN_OPSET = 17


def resize_attributes(mode: str, align_corners: bool, antialias: bool,
                      opset: int) -> Dict[str, object]:
    """The ONNX ``Resize`` attributes reproducing PyTorch's ``mode``/``align_corners``.

    Raises ``ValueError`` for what has no exact ``Resize`` form: ``'area'`` (exported as
    adaptive average pooling) and antialias other than bilinear with
    ``align_corners=False`` (see :func:`check_exportable` for the size condition).
    """
    if mode in geo.NEAREST_MODES:
        if mode == 'nearest':
            return dict(mode='nearest', coordinate_transformation_mode='asymmetric',
                        nearest_mode='floor')
        return dict(mode='nearest', coordinate_transformation_mode='half_pixel',
                    nearest_mode='round_prefer_ceil')
    if mode not in geo.INTERPOLATING_MODES:
        raise ValueError(f'mode={mode!r} has no ONNX Resize form; area resizing is '
                         'exported as adaptive average pooling')
    if antialias and (mode != 'bilinear' or align_corners):
        raise ValueError(f'antialias=True with mode={mode!r}, align_corners={align_corners} '
                         'has no exact ONNX Resize form (onnxruntime antialias differs '
                         "from PyTorch's filter)")
    attrs: Dict[str, object] = dict(
        mode='linear' if mode == 'bilinear' else 'cubic',
        coordinate_transformation_mode='align_corners' if align_corners else 'half_pixel')
    if mode == 'bicubic':
        attrs['cubic_coeff_a'] = geo.CUBIC_A
        attrs['exclude_outside'] = 0
    return attrs


def onnx_nearest_indices(in_size: int, out_size: int, scale: Optional[float],
                         exact_mode: bool) -> np.ndarray:
    """Source indices onnxruntime's ``Resize`` computes for the nearest attributes above.

    ONNX maps with the float32 resize scale ``s`` (``out / in`` for ``sizes``, the given
    scale for ``scales``): asymmetric ``floor(d / s)``, or half-pixel
    ``round_prefer_ceil((d + 0.5) / s - 0.5)``, clamped to ``[0, in - 1]``. An axis whose
    size does not change is copied whatever the scale (measured in onnxruntime).
    """
    if in_size == out_size:
        return np.arange(out_size)
    f32 = np.float32
    s = f32(scale) if scale else f32(out_size) / f32(in_size)
    d = np.arange(out_size).astype(f32)
    if exact_mode:
        src = np.floor((d + f32(0.5)) / s - f32(0.5) + f32(0.5))
    else:
        src = np.floor(d / s)
    return np.clip(src.astype(np.int64), 0, in_size - 1)


def check_exportable(spec: geo.UpsampleSpec, opset: int) -> None:
    """Raise ``ValueError`` where ONNX ``Resize`` (as onnxruntime computes it) cannot
    reproduce PyTorch for ``spec`` (static sizes):

    * nearest modes whose PyTorch float32 index (``reference.nearest_indices``) differs
      from ONNX's (:func:`onnx_nearest_indices`), e.g. legacy nearest 2 -> 82;
    * antialiasing, except bilinear with ``align_corners=False`` that does not shrink
      any axis (PyTorch's filter is then plain bilinear, exported without antialias):
      onnxruntime's antialias filter differs from PyTorch's (measured up to 0.19 on
      [-1, 1) inputs), and PyTorch's align_corners antialias has no ONNX form;
    * bicubic with a user scale applied to an axis whose size does not change
      (PyTorch maps it with ``1 / scale``; onnxruntime copies it).
    """
    from ..ops.reference import nearest_indices
    if spec.mode in geo.NEAREST_MODES:
        exact = spec.mode == 'nearest-exact'
        for axis, name in enumerate(('height', 'width')):
            n_in, n_out, scale = spec.in_size[axis], spec.out_size[axis], spec.kernel_scales[axis]
            torch_idx = nearest_indices(n_in, n_out, scale, exact)
            onnx_idx = onnx_nearest_indices(n_in, n_out, scale, exact)
            if not np.array_equal(torch_idx, onnx_idx):
                d = int(np.flatnonzero(torch_idx != onnx_idx)[0])
                raise ValueError(
                    f'{spec.mode!r} resize of {name} {n_in} -> {n_out} cannot be exported '
                    f'exactly: PyTorch reads source index {torch_idx[d]} for output {d} '
                    f'(float32 index arithmetic) where ONNX Resize reads {onnx_idx[d]}; '
                    f'use sizes where both agree or mode="nearest-exact"')
    if spec.antialias:
        shrinks = any(o < i for i, o in zip(spec.in_size, spec.out_size))
        if spec.mode != 'bilinear' or spec.align_corners or shrinks:
            raise ValueError(
                f'antialias=True with mode={spec.mode!r}, align_corners={spec.align_corners} '
                f'resizing {spec.in_size} -> {spec.out_size} cannot be exported exactly: ONNX '
                "Resize's antialias filter (onnxruntime) differs from PyTorch's; only "
                'bilinear upsampling with align_corners=False (where antialias has no '
                'effect) is exported')
    if spec.mode == 'bicubic' and not spec.align_corners:
        for axis in range(2):
            if spec.kernel_scales[axis] is not None and spec.in_size[axis] == spec.out_size[axis] \
                    and spec.kernel_scales[axis] != 1.0:
                raise ValueError(
                    f'bicubic scale_factor={spec.kernel_scales[axis]} keeping axis size '
                    f'{spec.in_size[axis]} cannot be exported exactly: PyTorch maps it '
                    'with 1/scale but ONNX Resize copies it; pass size=... or '
                    'recompute_scale_factor=True')


def pool_attributes(kernel: Sequence[int], stride: Sequence[int], padding: str,
                    pads: Sequence[int], ceil_mode: bool,
                    dilation: Sequence[int] = (1, 1)) -> Dict[str, object]:
    """``MaxPool``/``AveragePool`` attributes: ``auto_pad`` for SAME, else explicit pads.

    ``pads`` are PyTorch's (top, left, bottom, right) = ONNX's (begin..., end...).
    ``ceil_mode`` is kept for explicit padding (SAME has an exact output size).
    """
    attrs: Dict[str, object] = dict(kernel_shape=list(kernel), strides=list(stride))
    if padding in ('same_upper', 'same_lower'):
        attrs['auto_pad'] = padding.upper()
    else:
        attrs['pads'] = list(pads)
        attrs['ceil_mode'] = int(ceil_mode)
    if tuple(dilation) != (1, 1):
        attrs['dilations'] = list(dilation)
    return attrs


def _opset(version: int):
    if version < MIN_OPSET:
        raise ValueError(f'opset must be >= {MIN_OPSET}, got {version}')
    import onnxscript
    found = getattr(onnxscript, f'opset{version}', None)
    if found is None:
        raise ValueError(f'onnxscript {onnxscript.__version__} has no opset {version}')
    return found


def translation_table(opset: int) -> Dict[object, object]:
    """``custom_translation_table`` for ``torch.onnx.export(dynamo=True)`` at ``opset``."""
    op = _opset(opset)

    def spatial_sizes(x, out_size):
        batch_channels = op.Shape(x, start=0, end=2)
        if all(isinstance(v, int) for v in out_size):
            hw = op.Constant(value_ints=[int(v) for v in out_size])
        else:  # dynamic sizes arrive as int64 scalars
            hw = op.Concat(*[op.Reshape(v, op.Constant(value_ints=[1])) if not isinstance(
                v, int) else op.Constant(value_ints=[v]) for v in out_size], axis=0)
        return op.Concat(batch_channels, hw, axis=0)

    def upsample(x, out_size, kernel_scales, in_size, mode, align_corners, antialias):
        attrs = resize_attributes(mode, align_corners == 1, bool(antialias), opset)
        if any(s > 0 for s in kernel_scales):
            scales = op.Constant(value_floats=[1.0, 1.0] + [
                float(s) if s > 0 else 1.0 for s in kernel_scales])
            return op.Resize(x, None, scales, None, **attrs)
        return op.Resize(x, None, None, spatial_sizes(x, out_size), **attrs)

    def max_pool(x, kernel, stride, padding, pads, dilation, ceil_mode):
        attrs = pool_attributes(kernel, stride, padding, pads, ceil_mode, dilation)
        values, _ = op.MaxPool(x, **attrs)  # the unused indices output is pruned
        return values

    def avg_pool(x, kernel, stride, padding, pads, ceil_mode, count_include_pad):
        attrs = pool_attributes(kernel, stride, padding, pads, ceil_mode)
        return op.AveragePool(x, count_include_pad=int(count_include_pad), **attrs)

    def adaptive(x, in_size, out_size):
        return adaptive_avg_pool(op, opset, x, in_size, out_size)

    from . import ops as _registers_custom_ops  # noqa: F401
    ops = torch.ops.mmseg_cann
    return {ops.upsample.default: upsample, ops.max_pool2d.default: max_pool,
            ops.avg_pool2d.default: avg_pool, ops.adaptive_avg_pool2d.default: adaptive}


def adaptive_avg_pool(op, opset: int, x, in_size, out_size):
    """Adaptive average pooling as ONNX nodes.

    ``GlobalAveragePool`` for output (1, 1); ``AveragePool`` with kernel = stride =
    ``in / out`` when both axes divide evenly (PyTorch's bins are then these windows);
    otherwise ``MatMul`` with constant bin-averaging matrices, ``A_h @ x @ A_w^T`` (the
    same means up to float32 rounding of ``1 / count``). Needs static input sizes unless
    the output is (1, 1).
    """
    out_h, out_w = (int(v) for v in out_size)
    if (out_h, out_w) == (1, 1):
        return op.GlobalAveragePool(x)
    if not all(isinstance(v, int) for v in in_size):
        raise ValueError(f'adaptive average pooling to {tuple(out_size)} needs a static '
                         'input size to be exported (its bins depend on it); export with '
                         'fixed shapes, or use output size 1')
    in_h, in_w = (int(v) for v in in_size)
    if in_h % out_h == 0 and in_w % out_w == 0:
        kernel = [in_h // out_h, in_w // out_w]
        return op.AveragePool(x, kernel_shape=kernel, strides=kernel)
    # (out_h, in_h) @ x @ (in_w, out_w): row k of a matrix averages bin k
    from onnx.numpy_helper import from_array
    rows = op.Constant(value=from_array(_bin_matrix(in_h, out_h)))
    cols = op.Constant(value=from_array(np.ascontiguousarray(_bin_matrix(in_w, out_w).T)))
    return op.MatMul(op.MatMul(rows, x), cols)


def _bin_matrix(n_in: int, n_out: int):
    """``(n_out, n_in)`` float32 matrix whose row ``i`` averages adaptive bin ``i``."""
    m = np.zeros((n_out, n_in), dtype=np.float32)
    for i in range(n_out):
        start, end = geo.adaptive_bin(i, n_in, n_out)
        m[i, start:end] = 1.0 / (end - start)
    return m
