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

import math
from typing import Dict, Optional, Sequence, Tuple

import numpy as np
import torch

from ..core import geometry as geo

MIN_OPSET = 17
#: a dynamic export's size-independent checks cover every input size up to this
DYNAMIC_SIZE_LIMIT = 8192


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
    from ..core.reference import nearest_indices
    if spec.mode in geo.NEAREST_MODES:
        exact = spec.mode == 'nearest-exact'
        for axis, name in enumerate(('height', 'width')):
            n_in, n_out, scale = spec.in_size[axis], spec.out_size[axis], spec.kernel_scales[axis]
            torch_idx = nearest_indices(n_in, n_out, scale, exact)
            onnx_idx = onnx_nearest_indices(
                n_in, n_out, None if scale is None else onnx_axis_scale(spec, axis), exact)
            if not np.array_equal(torch_idx, onnx_idx):
                d = int(np.flatnonzero(torch_idx != onnx_idx)[0])
                raise ValueError(
                    f'{spec.mode!r} resize of {name} {n_in} -> {n_out} cannot be exported '
                    f'exactly: PyTorch reads source index {torch_idx[d]} for output {d} '
                    f'(float32 index arithmetic) where ONNX Resize reads {onnx_idx[d]}; '
                    f'use sizes where both agree or mode="nearest-exact"')
    for axis, scale in enumerate(spec.kernel_scales):
        if scale is not None:
            bad = _output_size_mismatch(np.array([spec.in_size[axis]]),
                                        onnx_axis_scale(spec, axis))
            if bad is not None:
                raise ValueError(
                    f'{spec.mode!r} resize by scale_factor={scale} of size {bad[0]} cannot '
                    f'be exported exactly: PyTorch gives output {bad[1]} = floor(n * scale) '
                    f'but ONNX Resize {bad[2]} (float32 scale); pass size=... or '
                    'recompute_scale_factor=True')
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


def onnx_axis_scale(spec: geo.UpsampleSpec, axis: int) -> float:
    """The ``Resize`` scale of ``axis`` for a resize PyTorch maps with ``1 / scale``.

    The user scale, except where legacy ``nearest`` takes one of PyTorch's shortcuts
    (``out == in`` copies, ``out == 2 * in`` repeats every input twice, whatever the
    scale): scale 1 or 2 reproduce them in ONNX (onnxruntime copies an axis only when
    the whole tensor keeps its shape, so a kept axis needs scale 1).
    """
    scale = spec.kernel_scales[axis]
    if spec.mode == 'nearest' and not geo.is_symbolic(spec.in_size[axis]):
        n_in, n_out = spec.in_size[axis], spec.out_size[axis]
        if n_out == n_in:
            return 1.0
        if n_out == 2 * n_in:
            return 2.0
    return float(scale)


def scale_output_size_mismatch(scale: float, limit: int = DYNAMIC_SIZE_LIMIT
                               ) -> Optional[Tuple[int, int, int]]:
    """First input size ``n <= limit`` whose ``Resize`` output size for ``scales``
    differs from PyTorch's ``floor(n * scale)`` (double), as ``(n, pytorch, onnx)``.

    ONNX computes the size from the float32 scale: onnxruntime as a float32 product,
    the ONNX shape inference as ``floor(n * float32(scale))`` in double; both must
    agree with PyTorch (e.g. scale 0.7: PyTorch gives 7 for n = 10, the shape
    inference 6). None when every size agrees.
    """
    return _output_size_mismatch(np.arange(1, limit + 1), scale)


def _output_size_mismatch(n: np.ndarray, scale: float) -> Optional[Tuple[int, int, int]]:
    """First of the sizes ``n`` whose ONNX output size for ``scale`` is not PyTorch's."""
    torch_out = np.floor(n.astype(np.float64) * scale).astype(np.int64)
    s32 = np.float32(scale)
    ort_out = np.floor(n.astype(np.float32) * s32).astype(np.int64)
    infer_out = np.floor(n.astype(np.float64) * np.float64(s32)).astype(np.int64)
    bad = np.flatnonzero((torch_out != ort_out) | (torch_out != infer_out))
    if not bad.size:
        return None
    i = int(bad[0])
    return int(n[i]), int(torch_out[i]), int(ort_out[i] if ort_out[i] != torch_out[i]
                                             else infer_out[i])


def nearest_exact_tie(scale: float, limit: int = DYNAMIC_SIZE_LIMIT) -> Optional[int]:
    """First output index ``d < limit * scale`` whose ``nearest-exact`` source coordinate
    ``(d + 0.5) / scale`` is within float32 rounding (relative 1e-6) of an integer, or
    None. There PyTorch's ``floorf((d + 0.5) * float(1 / scale))`` and ONNX's
    ``round_prefer_ceil((d + 0.5) / scale - 0.5)`` can land on either side depending on
    the order of float32 operations (onnxruntime's own order could not be emulated
    exactly: 8 of 102 measured (size, scale) cases differ from every emulation tried), so
    a dynamic export accepts only tie-free scales. A power-of-two scale is exact in
    float32 and never ambiguous.
    """
    if math.frexp(scale)[0] == 0.5:
        return None
    d = np.arange(int(math.floor(limit * scale)), dtype=np.float64)
    x = (d + 0.5) / scale
    near = np.abs(x - np.round(x)) <= 1e-6 * np.maximum(x, 1.0)
    hits = np.flatnonzero(near)
    return int(hits[0]) if hits.size else None


def check_dynamic_upsample(spec: geo.UpsampleSpec) -> None:
    """Raise ``ValueError`` where a resize of a dynamic (symbolic) size cannot be
    exported so that ONNX ``Resize`` reproduces PyTorch for every input size.

    Refused, each because the rule depends on the concrete size:

    * ``nearest``/``nearest-exact`` mapped with ``in / out`` (a given size,
      ``recompute_scale_factor=True``): PyTorch's float32 index ``floor(d * in/out)``
      differs from ONNX's for some size pairs (e.g. 2 -> 82); a fixed 1x1 input (index
      0 everywhere) is exported;
    * antialiasing, unless a bilinear ``align_corners=False`` upsampling by scales
      >= 1 (never shrinks: plain bilinear);
    * ``area`` by a scale factor (its bins follow the runtime sizes of both sides);
    * a user scale in (1, 1.5), which keeps sizes >= 2 below ``1 / (scale - 1)``:
      PyTorch copies or maps such an axis by mode, onnxruntime copies only when the
      whole tensor keeps its shape;
    * legacy ``nearest`` with a scale in (2, 2.5) (PyTorch's ``out == 2 * in``
      shortcut applies to small sizes only);
    * a scale whose ONNX output size differs from ``floor(n * scale)`` for some
      ``n <= DYNAMIC_SIZE_LIMIT`` (:func:`scale_output_size_mismatch`);
    * legacy ``nearest`` with a scale whose float32 index rule differs from ONNX's for
      some output index below ``DYNAMIC_SIZE_LIMIT * scale``; ``nearest-exact`` with a
      scale whose source coordinate hits a rounding tie (:func:`nearest_exact_tie`).
    """
    args = spec.args
    where = (f'{args.mode!r} resize of a dynamic input size '
             f'({"size=" + str(tuple(args.size)) if args.size is not None else "scale_factor=" + str(args.scale_factor)})')
    fixed = 'export with fixed shapes (dynamic=False)'
    if args.mode == 'area':
        if args.scale_factor is not None:
            raise ValueError(f'{where} cannot be exported: area resizing by a scale '
                             f'averages bins of size-dependent extent; give size=... '
                             f'or {fixed}')
        return
    by_size = args.scale_factor is None or args.recompute_scale_factor
    # a 1x1 input (a global pool spread back, as mmseg's APCHead does) reads index 0 at
    # every output index and size, in PyTorch and in ONNX alike
    one_pixel = all(not geo.is_symbolic(n) and n == 1 for n in spec.in_size)
    if args.mode in geo.NEAREST_MODES and by_size and not one_pixel:
        raise ValueError(f'{where} cannot be exported: PyTorch computes the {args.mode} '
                         'index with the float32 ratio in/out, which differs from ONNX '
                         "Resize's for some sizes (e.g. 2 -> 82); use a scale_factor "
                         f'without recompute_scale_factor, mode="bilinear", or {fixed}')
    if args.antialias and not (args.mode == 'bilinear' and not args.align_corners
                               and not by_size and min(args.scale_factor) >= 1.0):
        raise ValueError(f'{where} with antialias=True cannot be exported: whether and '
                         "how it filters depends on the sizes and ONNX Resize's "
                         f"antialias differs from PyTorch's; use antialias=False or {fixed}")
    if by_size:
        return
    for scale in args.scale_factor:
        if geo.scale_keeps_size(scale, min_size=2) is None:  # 1 < scale < 1.5
            raise ValueError(f'{where} cannot be exported: scale {scale} keeps small sizes '
                             'unchanged (floor(n * scale) == n for 2 <= n < '
                             f'{1 / (scale - 1):.4g}), where PyTorch and ONNX Resize treat '
                             'the axis differently; use recompute_scale_factor=True, '
                             f'a scale >= 1.5, or {fixed}')
        # floor(n * scale) == 2n for some n >= 2 (size 1 reads its one pixel anyway)
        if args.mode == 'nearest' and 2.0 < scale < 2.5:
            raise ValueError(f'{where} cannot be exported: PyTorch repeats every input '
                             f'twice when floor(n * {scale}) == 2n (small n), ONNX does '
                             f'not; use scale 2, recompute_scale_factor=True, or {fixed}')
        bad = scale_output_size_mismatch(scale)
        if bad is not None:
            raise ValueError(f'{where} cannot be exported: for input size {bad[0]} PyTorch '
                             f'gives output {bad[1]} = floor(n * {scale}) but ONNX Resize '
                             f'{bad[2]} (float32 scale); use recompute_scale_factor=True, '
                             f'size=..., or {fixed}')
        if args.mode == 'nearest-exact':
            d = nearest_exact_tie(scale)
            if d is not None:
                raise ValueError(
                    f'{where} cannot be exported: output index {d} maps to the source '
                    f'coordinate (d + 0.5) / {scale} = {(d + 0.5) / scale:.9g}, at a rounding '
                    'tie, where the float32 order of operations decides the index (PyTorch '
                    'multiplies by 1/scale, ONNX runtimes divide); use a power-of-two scale, '
                    f'a scale without ties (e.g. 3), or {fixed}')
        if args.mode == 'nearest':
            from ..core.reference import nearest_indices
            exact = False
            n = DYNAMIC_SIZE_LIMIT
            out = geo.upsample_output_size(n, scale)
            torch_idx = nearest_indices(n, out, scale, exact)
            onnx_idx = onnx_nearest_indices(n, out, scale, exact)
            if not np.array_equal(torch_idx, onnx_idx):
                d = int(np.flatnonzero(torch_idx != onnx_idx)[0])
                raise ValueError(f'{where} cannot be exported: at output index {d} '
                                 f'PyTorch reads source {torch_idx[d]} (float32 '
                                 f'arithmetic), ONNX Resize {onnx_idx[d]}; use another '
                                 f'scale, mode="nearest-exact", or {fixed}')


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
    """The ONNX translation of each ``mmseg_cann::*`` custom op at ``opset``, keyed by op
    name (:mod:`.export` keys them by the registered ops of :mod:`.ops`)."""
    import onnx
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

    def upsample_by_scale(x, scale_factor, onnx_scales, map_with_scale, mode, align_corners,
                          antialias):
        attrs = resize_attributes(mode, align_corners == 1, bool(antialias), opset)
        if map_with_scale:
            scales = op.Constant(value_floats=[1.0, 1.0] + [float(v) for v in onnx_scales])
            return op.Resize(x, None, scales, None, **attrs)
        # floor(in * scale) in double precision, as PyTorch computes it
        hw = op.Cast(op.Shape(x, start=2, end=4), to=onnx.TensorProto.DOUBLE)
        factors = op.Constant(value=onnx.helper.make_tensor(
            'scale_factor', onnx.TensorProto.DOUBLE, [2], [float(v) for v in scale_factor]))
        out_hw = op.Cast(op.Floor(op.Mul(hw, factors)), to=onnx.TensorProto.INT64)
        sizes = op.Concat(op.Shape(x, start=0, end=2), out_hw, axis=0)
        return op.Resize(x, None, None, sizes, **attrs)

    def max_pool(x, kernel, stride, padding, pads, dilation, ceil_mode):
        attrs = pool_attributes(kernel, stride, padding, pads, ceil_mode, dilation)
        values, _ = op.MaxPool(x, **attrs)  # the unused indices output is pruned
        return values

    def avg_pool(x, kernel, stride, padding, pads, ceil_mode, count_include_pad):
        attrs = pool_attributes(kernel, stride, padding, pads, ceil_mode)
        return op.AveragePool(x, count_include_pad=int(count_include_pad), **attrs)

    def adaptive(x, in_size, out_size):
        return adaptive_avg_pool(op, opset, x, in_size, out_size)

    return {'upsample': upsample, 'upsample_by_scale': upsample_by_scale,
            'max_pool2d': max_pool, 'avg_pool2d': avg_pool, 'adaptive_avg_pool2d': adaptive}


def size_arithmetic_table(opset: int) -> Dict[object, object]:
    """Translations of the Python integer operators torch.export records for symbolic
    sizes, where the exporter's own are wrong for some sizes.

    ``operator.floordiv``: the exporter emits ONNX ``Div``, which truncates toward zero;
    Python floors. They differ for negative quotients, and torch's size algebra writes
    ``ceil(a / b)`` as ``-((-a) // b)`` (ICNet's ``1 + (-1 + H // 2) // 2`` chains), so
    the truncating form gives a map one pixel too small at some sizes. Here: ``Div``
    minus one where the remainder is non-zero and the signs differ (torch's own
    ``floor_divide`` rule).
    """
    import operator
    op = _opset(opset)

    def floordiv(a, b):
        truncated = op.Div(a, b)
        signs_differ = op.Xor(op.Less(a, op.CastLike(0, a)), op.Less(b, op.CastLike(0, b)))
        inexact = op.Not(op.Equal(op.Mul(truncated, b), a))
        return op.Sub(truncated, op.CastLike(op.And(signs_differ, inexact), truncated))
    return {operator.floordiv: floordiv}


def adaptive_avg_pool(op, opset: int, x, in_size, out_size):
    """Adaptive average pooling as ONNX nodes.

    ``GlobalAveragePool`` for output (1, 1); with static input sizes, ``AveragePool``
    with kernel = stride = ``in / out`` when both axes divide evenly (PyTorch's bins are
    then these windows); otherwise ``MatMul`` with bin-averaging matrices,
    ``A_h @ x @ A_w^T`` (the same means up to float32 rounding of ``1 / count``):
    constants for a static axis, built in the graph from the runtime size for a dynamic
    one (``in_size`` -1, see :func:`bin_matrix_nodes`).
    """
    out_h, out_w = (int(v) for v in out_size)
    if (out_h, out_w) == (1, 1):
        return op.GlobalAveragePool(x)
    in_h, in_w = (int(v) for v in in_size)
    static = in_h > 0 and in_w > 0
    if static and in_h % out_h == 0 and in_w % out_w == 0:
        kernel = [in_h // out_h, in_w // out_w]
        return op.AveragePool(x, kernel_shape=kernel, strides=kernel)
    # (out_h, in_h) @ x @ (in_w, out_w): row k of a matrix averages bin k
    from onnx.numpy_helper import from_array
    if in_h > 0:
        rows = op.Constant(value=from_array(_bin_matrix(in_h, out_h)))
    else:
        rows = bin_matrix_nodes(op, x, 2, out_h)
    if in_w > 0:
        cols = op.Constant(value=from_array(np.ascontiguousarray(_bin_matrix(in_w, out_w).T)))
    else:
        cols = op.Transpose(bin_matrix_nodes(op, x, 3, out_w), perm=[1, 0])
    return op.MatMul(op.MatMul(rows, x), cols)


def bin_matrix_nodes(op, x, axis: int, n_out: int):
    """ONNX nodes for the ``(n_out, n)`` bin-averaging matrix of ``x``'s runtime size
    ``n`` along ``axis``: row ``i`` is ``1 / (end - start)`` on input
    ``[start, end)``, ``start = floor(i * n / n_out)``, ``end = ceil((i + 1) * n / n_out)``
    (:func:`mmseg_cann.core.geometry.adaptive_bin`, in int64 arithmetic; ``Div`` of
    non-negative integers is floor division)."""
    n = op.Shape(x, start=axis, end=axis + 1)                      # [1] int64
    i = op.Constant(value_ints=list(range(n_out)))
    i = op.Unsqueeze(i, op.Constant(value_ints=[1]))               # [n_out, 1]
    k = op.Constant(value_ints=[n_out])
    start = op.Div(op.Mul(i, n), k)
    end = op.Div(op.Sub(op.Add(op.Mul(op.Add(i, op.Constant(value_ints=[1])), n), k),
                        op.Constant(value_ints=[1])), k)
    j = op.Range(op.Constant(value_int=0), op.Squeeze(n, op.Constant(value_ints=[0])),
                 op.Constant(value_int=1))                         # [n]
    inside = op.And(op.GreaterOrEqual(j, start), op.Less(j, end))  # [n_out, n]
    count = op.CastLike(op.Sub(end, start), x)
    return op.Div(op.CastLike(inside, x), count)


def _bin_matrix(n_in: int, n_out: int):
    """``(n_out, n_in)`` float32 matrix whose row ``i`` averages adaptive bin ``i``."""
    m = np.zeros((n_out, n_in), dtype=np.float32)
    for i in range(n_out):
        start, end = geo.adaptive_bin(i, n_in, n_out)
        m[i, start:end] = 1.0 / (end - start)
    return m
