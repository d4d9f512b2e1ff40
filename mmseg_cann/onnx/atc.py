"""A model of how Ascend's ATC compiler reads an ONNX graph, and the ATC command line.

:func:`atc_reading` rewrites a graph the way ATC's ONNX parser reads it, into standard
ONNX that onnxruntime runs: "the graph as ATC will build it". Comparing that with
PyTorch (``verify_onnx(..., target='atc')``, ``tools/export_onnx.py --target atc
--verify``) shows whether a deployment keeps the trained model's meaning. The rules,
each with its source:

* Standard ops are registered for opset <= 18 (CANN ONNX operator list; the parser
  plugins register ``Resize`` for opsets 10-18, ``MaxPool``/``AveragePool`` 8-18).
* ``Resize`` (hicann ops-cv ``common/src/framework/resize_onnx_plugin.cpp``):
  ``nearest_mode``, ``cubic_coeff_a``, ``exclude_outside`` and ``antialias`` are not
  read. ``nearest`` becomes ``ResizeNearestNeighborV2(align_corners,
  half_pixel_centers)`` with TensorFlow semantics: ``half_pixel``/``pytorch_half_pixel``
  -> half-pixel centers (index ``floor((d + 0.5) * in/out)``), ``align_corners`` ->
  ``round(d * (in - 1)/(out - 1))``, ``asymmetric`` -> ``floor(d * in/out)``, all in
  float32 and clamped to ``[0, in - 1]`` (TensorFlow ``resize_nearest_neighbor_op.cc``).
  ``linear``/``cubic`` pass only ``mode`` and ``coordinate_transformation_mode``. A node
  with ``scales`` and no ``sizes`` gets ``sizes = int(shape * scales)``: the coordinate
  mapping then follows ``in / out``. CANN's ONNX operator docs list only nearest and
  linear for images, and ``scales``/``sizes`` must be constants (here: values that follow
  from the static input shapes, which a static compile folds).
* ``MaxPool`` (hicann ops-nn ``max_pool_onnx_plugin.cpp``): 2-D ``dilations`` are
  dropped; ``auto_pad=SAME_LOWER`` is read as ``SAME`` (upper); ``ceil_mode`` counts only
  with ``auto_pad=NOTSET``; ``VALID`` needs ``ceil_mode=0``; an ``Indices`` output or
  ``storage_order=1`` is an error. Kernel sides outside [1, 255], kernel area > 256 or
  stride > 63 run on the slow AI CPU (:func:`ai_cpu_nodes`).
* ``AveragePool`` (hicann ops-nn ``average_pool_onnx_plugin.cpp``): ``SAME_LOWER`` read as
  ``SAME``; ``ceil_mode`` only with ``NOTSET``; with ``count_include_pad=0`` a window
  entirely in padding gives 0/65504/NaN/INF (refused here).
* ATC's default ``--precision_mode`` is ``force_fp16``: nodes that average are listed in
  a ``--keep_dtype`` file (:func:`keep_dtype_nodes`) so ``avg='fp32'`` survives.

The reading needs static input shapes: a dynamic graph is read at one concrete input
size (an ATC gear) given as ``input_shapes``.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from .runtime import constant_values

ATC_MAX_OPSET = 18
#: MaxPool runs on the AI CPU outside these limits (max_pool_onnx_plugin.cpp)
AICORE_MAX_KERNEL_SIDE = 255
AICORE_MAX_KERNEL_AREA = 256
AICORE_MAX_STRIDE = 63
#: node types whose computation is an average (kept in fp32 by --keep_dtype)
AVERAGING_OPS = ('AveragePool', 'GlobalAveragePool', 'ReduceMean')


class AtcReadError(ValueError):
    """ATC's parser rejects the graph, or reads it in a way that has no defined result."""


def _attrs(node) -> Dict[str, object]:
    import onnx
    out = {}
    for a in node.attribute:
        value = onnx.helper.get_attribute_value(a)
        out[a.name] = value.decode() if isinstance(value, bytes) else value
    return out


def _default_opset(model) -> int:
    return max((o.version for o in model.opset_import if o.domain in ('', 'ai.onnx')),
               default=0)


def _static_model(model, input_shapes: Optional[Dict[str, Sequence[int]]]):
    """A copy with every graph input's shape fixed (given, or already static)."""
    import onnx
    model = onnx.ModelProto.FromString(model.SerializeToString())
    initializers = {t.name for t in model.graph.initializer}
    for inp in model.graph.input:
        if inp.name in initializers:
            continue
        dims = inp.type.tensor_type.shape.dim
        given = (input_shapes or {}).get(inp.name)
        if given is not None:
            if len(given) != len(dims):
                raise ValueError(f'input_shapes[{inp.name!r}] has {len(given)} dims, the '
                                 f'graph input {len(dims)}')
            for d, v in zip(dims, given):
                d.ClearField('dim_param')
                d.dim_value = int(v)
        elif any(not d.HasField('dim_value') for d in dims):
            raise ValueError(f'graph input {inp.name!r} has a dynamic shape: give its size '
                             f'(one ATC gear) in input_shapes')
    return model


def _input_shapes(model) -> Dict[str, Tuple[int, ...]]:
    initializers = {t.name for t in model.graph.initializer}
    return {i.name: tuple(d.dim_value for d in i.type.tensor_type.shape.dim)
            for i in model.graph.input if i.name not in initializers}


def _values(model, names: Sequence[str]) -> Dict[str, np.ndarray]:
    """Values (and shapes) of tensors ``names``: constants directly, the rest by running
    the static graph on zeros (what follows from the input shapes only)."""
    import onnx
    found = constant_values(model)
    missing = [n for n in names if n not in found]
    if missing:
        probe = onnx.ModelProto.FromString(model.SerializeToString())
        del probe.graph.output[:]
        for name in missing:
            probe.graph.output.append(onnx.helper.make_empty_tensor_value_info(name))
        from .runtime import run_onnx
        zeros = [np.zeros(shape, dtype=_input_dtype(model, name))
                 for name, shape in _input_shapes(model).items()]
        for name, value in zip(missing, run_onnx(probe, zeros)):
            found[name] = value
    return {n: found[n] for n in names}


def _input_dtype(model, name: str):
    from onnx import helper
    for i in model.graph.input:
        if i.name == name:
            return helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type)
    raise KeyError(name)


def tf_nearest_indices(in_size: int, out_size: int, align_corners: bool,
                       half_pixel_centers: bool) -> np.ndarray:
    """Source indices of TensorFlow's ``ResizeNearestNeighborV2`` (float32 arithmetic)."""
    f32 = np.float32
    d = np.arange(out_size).astype(f32)
    if align_corners and out_size > 1:
        scale = f32(in_size - 1) / f32(out_size - 1)
    elif align_corners:
        scale = f32(0)
    else:
        scale = f32(in_size) / f32(out_size)
    if half_pixel_centers:
        src = np.floor((d + f32(0.5)) * scale)
    elif align_corners:
        # roundf of the float32 product: halves away from zero (all values are >= 0)
        src = np.floor((d * scale).astype(np.float64) + 0.5)
    else:
        src = np.floor(d * scale)
    return np.clip(src.astype(np.int64), 0, in_size - 1)


class _Rewriter:
    """Collects the nodes and initializers of the read graph."""

    def __init__(self, model):
        self.model = model
        self.nodes: List = []
        self.initializers: List = []
        self._count = 0

    def constant(self, stem: str, value: np.ndarray) -> str:
        from onnx import numpy_helper
        self._count += 1
        name = f'atc_read_{stem}_{self._count}'
        self.initializers.append(numpy_helper.from_array(value, name))
        return name


def atc_reading(model, input_shapes: Optional[Dict[str, Sequence[int]]] = None):
    """The graph as ATC's ONNX parser reads it (rules in the module docstring).

    Args:
        model: an ``onnx.ModelProto``.
        input_shapes: concrete shapes for dynamic graph inputs (one ATC gear).

    Returns:
        a new ``ModelProto`` that onnxruntime runs.

    Raises:
        AtcReadError: the parser rejects the graph or reads it without a defined result.
    """
    import onnx
    opset = _default_opset(model)
    if opset > ATC_MAX_OPSET:
        raise AtcReadError(f'opset {opset}: ATC registers the standard ONNX ops up to opset '
                           f'{ATC_MAX_OPSET}; export with opset <= {ATC_MAX_OPSET}')
    static = _static_model(model, input_shapes)
    inferred = onnx.shape_inference.infer_shapes(static, strict_mode=True, data_prop=True)
    shapes = {}
    for vi in list(inferred.graph.value_info) + list(inferred.graph.input) + \
            list(inferred.graph.output):
        dims = vi.type.tensor_type.shape.dim
        if dims and all(d.HasField('dim_value') for d in dims):
            shapes[vi.name] = tuple(d.dim_value for d in dims)
    resize_inputs = [n for node in static.graph.node if node.op_type == 'Resize'
                     for n in node.input[2:] if n]
    values = _values(static, resize_inputs) if resize_inputs else {}
    out = _Rewriter(static)
    for node in static.graph.node:
        if node.op_type == 'Resize':
            _read_resize(node, shapes, values, out)
        elif node.op_type == 'MaxPool':
            _read_max_pool(node, out)
        elif node.op_type == 'AveragePool':
            _read_avg_pool(node, shapes, out)
        else:
            out.nodes.append(node)
    graph = static.graph
    del graph.node[:]
    graph.node.extend(out.nodes)
    graph.initializer.extend(out.initializers)
    onnx.checker.check_model(static)
    return static


def _shape_of(name: str, shapes) -> Tuple[int, ...]:
    if name not in shapes:
        raise AtcReadError(f'the shape of {name!r} is not static; ATC compiles static '
                           'shapes (give the gear in input_shapes)')
    return shapes[name]


def _read_resize(node, shapes, values, out: _Rewriter) -> None:
    import onnx
    attrs = _attrs(node)
    mode = attrs.get('mode', 'nearest')
    ctm = attrs.get('coordinate_transformation_mode', 'half_pixel')
    x = node.input[0]
    in_shape = _shape_of(x, shapes)
    sizes = node.input[3] if len(node.input) > 3 and node.input[3] else None
    scales = node.input[2] if len(node.input) > 2 and node.input[2] else None
    if sizes is not None:
        out_shape = tuple(int(v) for v in values[sizes])
    elif scales is not None:
        # scales without sizes: sizes = int(shape * scales), the scale itself is lost
        out_shape = tuple(int(n * float(s)) for n, s in zip(in_shape, values[scales]))
    else:
        raise AtcReadError(f'Resize {node.name!r} has neither scales nor sizes')
    if mode == 'cubic':
        raise AtcReadError(f'Resize {node.name!r}: mode=cubic; CANN documents only nearest '
                           'and linear Resize for images (export with target="atc", which '
                           'writes bicubic as MatMul)')
    if mode == 'nearest':
        if ctm not in ('half_pixel', 'pytorch_half_pixel', 'align_corners', 'asymmetric'):
            raise AtcReadError(f'Resize {node.name!r}: nearest with '
                               f'coordinate_transformation_mode={ctm!r} has no '
                               'ResizeNearestNeighborV2 reading')
        half_pixel = ctm in ('half_pixel', 'pytorch_half_pixel')
        current = x
        for axis in (2, 3):
            idx = tf_nearest_indices(in_shape[axis], out_shape[axis], ctm == 'align_corners',
                                     half_pixel)
            if np.array_equal(idx, np.arange(in_shape[axis])) and \
                    in_shape[axis] == out_shape[axis]:
                continue
            target = node.output[0] if axis == 3 else f'{node.output[0]}_atc_rows'
            out.nodes.append(onnx.helper.make_node(
                'Gather', [current, out.constant('nearest_index', idx)], [target],
                axis=axis, name=f'{node.name}_atc_gather{axis}'))
            current = target
        if current != node.output[0]:
            out.nodes.append(onnx.helper.make_node('Identity', [current], [node.output[0]],
                                                   name=f'{node.name}_atc_identity'))
        return
    # linear: only mode and coordinate_transformation_mode are read, sizes constant
    out.nodes.append(onnx.helper.make_node(
        'Resize', [x, '', '', out.constant('sizes', np.array(out_shape, dtype=np.int64))],
        list(node.output), name=node.name, mode=mode, coordinate_transformation_mode=ctm))


def _read_max_pool(node, out: _Rewriter) -> None:
    import onnx
    attrs = _attrs(node)
    if len(node.output) > 1 and node.output[1]:
        raise AtcReadError(f'MaxPool {node.name!r} has an Indices output: an error in ATC')
    if attrs.get('storage_order', 0) == 1:
        raise AtcReadError(f'MaxPool {node.name!r}: storage_order=1 is an error in ATC')
    read = _pool_attrs_as_read(node, attrs)
    read.pop('dilations', None)  # 2-D dilations are dropped
    read.pop('storage_order', None)
    out.nodes.append(onnx.helper.make_node('MaxPool', [node.input[0]], [node.output[0]],
                                           name=node.name, **read))


def _pool_attrs_as_read(node, attrs) -> Dict[str, object]:
    read = dict(attrs)
    auto_pad = read.get('auto_pad', 'NOTSET')
    if auto_pad == 'SAME_LOWER':
        read['auto_pad'] = 'SAME_UPPER'  # read as SAME
    if auto_pad == 'VALID' and read.get('ceil_mode', 0):
        raise AtcReadError(f'{node.op_type} {node.name!r}: auto_pad=VALID with ceil_mode=1 '
                           'is rejected by ATC')
    if auto_pad != 'NOTSET':
        read.pop('ceil_mode', None)  # only counts with NOTSET
    return read


def _read_avg_pool(node, shapes, out: _Rewriter) -> None:
    import onnx
    attrs = _attrs(node)
    read = _pool_attrs_as_read(node, attrs)
    if not read.get('count_include_pad', 0) and _has_all_padding_window(node, read, shapes):
        raise AtcReadError(f'AveragePool {node.name!r}: count_include_pad=0 with a window '
                           'entirely in padding has no defined result in ATC (0, 65504, '
                           'NaN or INF)')
    out.nodes.append(onnx.helper.make_node('AveragePool', [node.input[0]], [node.output[0]],
                                           name=node.name, **read))


def _has_all_padding_window(node, attrs, shapes) -> bool:
    """Whether some window of an explicit-padding AveragePool covers no input cell."""
    if attrs.get('auto_pad', 'NOTSET') != 'NOTSET':
        return False  # SAME/VALID windows always start inside the input
    in_shape = _shape_of(node.input[0], shapes)
    kernel, strides = attrs['kernel_shape'], attrs.get('strides', [1, 1])
    pads = attrs.get('pads', [0, 0, 0, 0])
    for axis in range(2):
        n, k, s, pb, pe = in_shape[2 + axis], kernel[axis], strides[axis], pads[axis], \
            pads[axis + 2]
        span = n + pb + pe - k
        count = (-(-span // s) if attrs.get('ceil_mode', 0) else span // s) + 1
        for o in range(count):
            start = o * s - pb
            if start + k <= 0 or start >= n:
                return True
    return False


def ai_cpu_nodes(model) -> List[str]:
    """One line per node that ATC runs on the AI CPU (slow), with the reason."""
    lines = []
    for node in model.graph.node:
        if node.op_type != 'MaxPool':
            continue
        attrs = _attrs(node)
        kernel, strides = attrs.get('kernel_shape', []), attrs.get('strides', [1, 1])
        reasons = []
        if any(k < 1 or k > AICORE_MAX_KERNEL_SIDE for k in kernel):
            reasons.append(f'kernel side outside [1, {AICORE_MAX_KERNEL_SIDE}]')
        if int(np.prod(kernel)) > AICORE_MAX_KERNEL_AREA:
            reasons.append(f'kernel area {int(np.prod(kernel))} > {AICORE_MAX_KERNEL_AREA}')
        if any(s > AICORE_MAX_STRIDE for s in strides):
            reasons.append(f'stride > {AICORE_MAX_STRIDE}')
        if reasons:
            lines.append(f'MaxPool {node.name} (kernel {kernel}, strides {strides}): AI CPU '
                         f'path ({"; ".join(reasons)})')
    return lines


def is_averaging_matrix(value: np.ndarray) -> bool:
    """A 2-D constant whose rows (or columns) each average a set of inputs: non-negative,
    equal non-zero entries summing to 1 (adaptive bins, area resizing, 2x means)."""
    if value.ndim != 2 or value.size == 0 or (value < 0).any():
        return False
    for m in (value, value.T):
        ok = True
        for row in m:
            nz = row[row != 0]
            if nz.size == 0 or not np.allclose(nz, nz[0]) or not np.isclose(nz.sum(), 1.0):
                ok = False
                break
        if ok:
            return True
    return False


def keep_dtype_nodes(model) -> List[str]:
    """Names of the nodes that average: ``AveragePool``, ``GlobalAveragePool``,
    ``ReduceMean``, ``MatMul`` with an averaging constant (adaptive bins, area), and the
    constant ``Mul`` that corrects an ``AveragePool``'s divisor. Listing them in ATC's
    ``--keep_dtype`` file keeps them in fp32 under ``force_fp16``."""
    consts = constant_values(model)
    producers = {o: n for n in model.graph.node for o in n.output}
    names = []
    for node in model.graph.node:
        if node.op_type in AVERAGING_OPS:
            names.append(node.name)
        elif node.op_type == 'MatMul' and any(
                i in consts and is_averaging_matrix(consts[i]) for i in node.input):
            names.append(node.name)
        elif is_divisor_correction(node, producers):
            names.append(node.name)
    return names


def is_divisor_correction(node, producers) -> bool:
    """Whether ``node`` is the ``Mul`` that corrects an ``AveragePool``'s divisor (the
    portable and atc forms of exclusive borders, ceil windows and ``divisor_override``).
    ``producers``: tensor name -> the node that writes it."""
    return node.op_type == 'Mul' and any(
        producers.get(i) is not None and producers[i].op_type == 'AveragePool'
        for i in node.input)


def name_nodes(model) -> None:
    """Give every unnamed node a unique name (ATC's --keep_dtype refers to names)."""
    used = {n.name for n in model.graph.node if n.name}
    for i, node in enumerate(model.graph.node):
        if not node.name:
            name = f'{node.op_type}_{i}'
            while name in used:
                name += '_'
            node.name = name
            used.add(name)


def atc_command(model_path: str, output: str, soc_version: str, input_name: str,
                shape: Sequence[int], *, keep_dtype_file: Optional[str] = None,
                gears: Optional[Sequence[Tuple[int, int]]] = None) -> str:
    """The ``atc`` command line that compiles ``model_path`` for ``soc_version``.

    ``gears``: ``(H, W)`` pairs for ``--dynamic_image_size`` (2-100 gears; the input
    shape then has -1 for H and W). ATC takes either gears or ``--input_shape`` ranges,
    not both.
    """
    n, c, h, w = (int(v) for v in shape)
    parts = ['atc', '--framework=5', f'--model={model_path}', f'--output={output}',
             f'--soc_version={soc_version}']
    if gears:
        if not 2 <= len(gears) <= 100:
            raise ValueError(f'--dynamic_image_size takes 2 to 100 gears, got {len(gears)}')
        parts.append(f'--input_shape={input_name}:{n},{c},-1,-1')
        parts.append('--dynamic_image_size=' + ';'.join(f'{gh},{gw}' for gh, gw in gears))
    else:
        parts.append(f'--input_shape={input_name}:{n},{c},{h},{w}')
    if keep_dtype_file:
        parts.append(f'--keep_dtype={keep_dtype_file}')
    return ' '.join(parts)
