"""Which nodes of an exported graph int8 quantization keeps in float, and why: the one
place of the rule that :func:`mmseg_cann.onnx.quantize.quantize_model`, the AMCT
hand-off (:mod:`.amct`) and the report share.

The CANN ops export to a few node forms (:mod:`.translation` for ``target='onnx'``,
:mod:`.atc_backend` for ``target='atc'``). Under int8 quantization:

* ``MatMul`` with a constant interpolation or bin-averaging matrix (bilinear with other
  scales, bicubic, antialias, adaptive average pooling with uneven bins: ``A_h @ x`` and
  ``x @ A_w^T``; in a dynamic graph the bin matrix built from the input's size) stays
  float by default: quantized to int8 weights, a row's weights no longer sum to one (an
  interpolation then changes the mean of the map, a bin average is no longer an average).
  Its activations stay quantized (the matrix is float, the tensors around it int8), so
  the graph does not drop out of int8 around it (:func:`~.quantize.quantize_model`).
* the constant ``Mul`` that corrects an ``AveragePool``'s divisor (exclusive borders,
  ``ceil_mode`` windows, ``divisor_override``) stays float: its per-window factors are
  the exact divisors;
* ``Gather`` (nearest), ``MaxPool`` and ``Resize`` copy or interpolate values: they keep
  their input's quantization scale and zero point (no requantization step);
  :func:`scale_changes` finds any that do not;
* the ``Pad`` with the lowest float (or ``-inf``) before the ``Max`` of strided slices
  (``target='atc'``'s dilated max pooling, :func:`max_padding_nodes`) keeps its input's
  scale too: the padding value then saturates to the lowest int8 value, which a window's
  maximum never takes (every window holds an input cell). Calibrated on its own, its
  range would reach -3.4e38 and every value would quantize to the same step.

A matrix operand is recognised by its value, not by a name: a 2-D constant whose
weights for each output sum to one (rows of ``A_h`` in ``A_h @ x``, columns of
``A_w^T`` in ``x @ A_w^T``) applied to a 4-D tensor, or a matrix computed from shapes
only (the dynamic bin matrix). A model's own ``MatMul`` with learnt weights does not
pass that test.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from .atc import is_averaging_matrix, is_divisor_correction
from .runtime import constant_values

#: node types whose output keeps the input's scale and zero point under quantization
SCALE_KEEPING_OPS = ('Gather', 'MaxPool', 'Resize')
#: node types that read only the shape (or the dtype, second input of CastLike) of an input
_SHAPE_READERS = ('Shape', 'Size')
#: relative tolerance of "the weights of an output sum to one" (float32 matrices)
_SUM_RTOL = 1e-4

REASON_BINS = 'bin-averaging matrix (adaptive average pooling): int8 weights would not ' \
              'average'
REASON_INTERP = 'interpolation matrix (bilinear/bicubic/antialias): int8 weights would ' \
                'not sum to one'
REASON_DYNAMIC_BINS = 'bin-averaging matrix built from the input size (dynamic graph)'
REASON_DIVISOR = "exact divisors of the average pooling (AveragePool's correction)"
REASON_USER = 'excluded by the user (--exclude)'


def data_independent(model) -> set:
    """Names of tensors that do not depend on the graph inputs' values: constants and
    what is computed from constants and shapes only."""
    known = set(constant_values(model))
    for node in model.graph.node:  # nodes are topologically sorted in a valid graph
        if node.op_type in _SHAPE_READERS:
            known.update(node.output)
            continue
        inputs = [i for i in node.input if i]
        if node.op_type == 'CastLike':
            inputs = inputs[:1]
        if inputs and all(i in known for i in inputs):
            known.update(node.output)
    return known


def _weights_sum_to_one(matrix: np.ndarray, axis: int) -> bool:
    sums = np.asarray(matrix, dtype=np.float64).sum(axis=axis)
    return bool(np.allclose(sums, 1.0, rtol=0, atol=_SUM_RTOL))


def resize_matrix_operand(node, consts: Dict[str, np.ndarray],
                          independent: set) -> Optional[int]:
    """The index (0 or 1) of ``node``'s interpolation/bin matrix operand, or None when
    ``node`` is not the ``MatMul`` of a resize or adaptive-pool form."""
    if node.op_type != 'MatMul' or len(node.input) != 2:
        return None
    for k in (0, 1):
        name, other = node.input[k], node.input[1 - k]
        if name not in independent or other in independent:
            continue
        value = consts.get(name)
        if value is None:
            return k  # computed from shapes only: the dynamic bin matrix
        # A @ x: the rows of A weight an output; x @ B: the columns of B
        if value.ndim == 2 and _weights_sum_to_one(value, axis=1 - k):
            return k
    return None


def float_operand(node, consts: Dict[str, np.ndarray], independent: set,
                  producers: Dict[str, object],
                  quantize_resize_matrices: bool = False) -> Optional[Tuple[int, str]]:
    """``(input index, reason)`` of the operand of ``node`` that stays float by the
    rule (module docstring), or None. ``independent``: :func:`data_independent`."""
    if is_divisor_correction(node, producers):
        for k, name in enumerate(node.input):
            if name in consts:
                return k, REASON_DIVISOR
        return None
    if quantize_resize_matrices:
        return None
    k = resize_matrix_operand(node, consts, independent)
    if k is None:
        return None
    value = consts.get(node.input[k])
    return k, (REASON_DYNAMIC_BINS if value is None else
               REASON_BINS if is_averaging_matrix(value) else REASON_INTERP)


class FloatRule:
    """The rule applied to one float graph: :meth:`rows` for the report, :meth:`operand`
    for the quantizer."""

    def __init__(self, model, quantize_resize_matrices: bool = False):
        self.consts = constant_values(model)
        self.independent = data_independent(model)
        self.producers = {o: n for n in model.graph.node for o in n.output}
        self.quantize_resize_matrices = quantize_resize_matrices
        self.model = model

    def operand(self, node) -> Optional[Tuple[int, str]]:
        return float_operand(node, self.consts, self.independent, self.producers,
                             self.quantize_resize_matrices)


def float_nodes(model, quantize_resize_matrices: bool = False,
                exclude: Sequence[str] = ()) -> List[Dict[str, str]]:
    """The nodes kept in float (or whose constant operand is): ``[{node, op_type,
    reason}]`` in graph order.

    Args:
        model: the float ``onnx.ModelProto`` (nodes named: :func:`.atc.name_nodes`).
        quantize_resize_matrices: quantize the interpolation/bin matrices too (then only
            the divisor ``Mul`` and ``exclude`` stay float).
        exclude: more node names kept float (must exist; ``ValueError`` otherwise).
    """
    check_node_names(model, exclude)
    rule = FloatRule(model, quantize_resize_matrices)
    rows = []
    for node in model.graph.node:
        found = (None, REASON_USER) if node.name in exclude else rule.operand(node)
        if found:
            rows.append(dict(node=node.name, op_type=node.op_type, reason=found[1]))
    return rows


def check_node_names(model, names: Sequence[str], what: str = 'exclude') -> None:
    """``ValueError`` naming those of ``names`` that are not nodes of ``model``."""
    present = {n.name for n in model.graph.node}
    unknown = [n for n in names if n not in present]
    if unknown:
        raise ValueError(f'{what} names nodes the graph does not have: {unknown} (node '
                         'names of the exported model_fp32.onnx)')


def graph_maps(model):
    """``(producers, consumers)``: tensor name -> the node writing it, and -> the list of
    nodes reading it."""
    producers = {o: n for n in model.graph.node for o in n.output}
    consumers: Dict[str, list] = {}
    for n in model.graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    return producers, consumers


def max_padding_nodes(model) -> List[str]:
    """Names of the constant ``Pad`` nodes whose value is the lowest float32 or below
    (``-inf``): the padding of a max over windows."""
    consts = constant_values(model)
    names = []
    for node in model.graph.node:
        if node.op_type != 'Pad' or len(node.input) < 3 or node.input[2] not in consts:
            continue
        modes = [a.s for a in node.attribute if a.name == 'mode']
        value = np.asarray(consts[node.input[2]], dtype=np.float64)
        if (not modes or modes[0] == b'constant') and value.size == 1 and \
                float(value) <= float(np.finfo(np.float32).min):
            names.append(node.name)
    return names


def scale_changes(model_int8) -> List[str]:
    """The ``Gather``/``MaxPool``/``Resize`` nodes of a QDQ graph whose output is
    quantized with another scale or zero point than their input (should be none)."""
    consts = constant_values(model_int8)
    producers, consumers = graph_maps(model_int8)
    changed = []
    for node in model_int8.graph.node:
        if node.op_type not in SCALE_KEEPING_OPS:
            continue
        dq = producers.get(node.input[0])
        outs = [q for q in consumers.get(node.output[0], []) if q.op_type == 'QuantizeLinear']
        if dq is None or dq.op_type != 'DequantizeLinear' or not outs:
            continue
        for q in outs:
            for slot in (1, 2):
                a, b = consts.get(dq.input[slot]), consts.get(q.input[slot])
                if a is None or b is None or a.shape != b.shape or not np.array_equal(a, b):
                    changed.append(node.name)
                    break
            else:
                continue
            break
    return changed
