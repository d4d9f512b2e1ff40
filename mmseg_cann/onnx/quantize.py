"""Calibrated int8 post-training quantization of an exported graph with onnxruntime.

:func:`quantize_model` runs onnxruntime's own tooling -- ``quant_pre_process`` (shape
inference, constant folding, BatchNorm folded into the convolutions), then
``quantize_static`` in QDQ format with symmetric per-channel int8 weights and per-tensor
int8 activations calibrated on the given inputs -- with the CANN op forms handled by the
rule of :mod:`.quant_rules`.

Interpolation and bin-averaging matrices stay float without leaving int8 around them.
onnxruntime's ``nodes_to_exclude`` keeps such a ``MatMul`` float but also leaves its
input and output unquantized, and onnxruntime quantizes a data-movement node
(``Resize``, ``MaxPool``, ``AveragePool``, ``Gather``, ``Slice``...) only when its input is
already quantized, so the float stretch spreads to the nodes around it. Here the
``MatMul`` is quantized as onnxruntime does by default and its matrix operand is then put
back in float (:func:`_restore_float_operands`): the activations keep their calibrated
quantize/dequantize pairs, the matrix is the exported float32 constant, bit for bit.
"""
from __future__ import annotations

import os
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Union

import numpy as np

from .atc import name_nodes
from .dynamic_domain import attach_domain, check_dynamic_domain, read_domain
from .quant_rules import (REASON_USER, FloatRule, check_node_names, float_nodes,
                          graph_maps, max_padding_nodes, scale_changes)

#: calibration methods: CLI name -> onnxruntime CalibrationMethod member
METHODS = {'minmax': 'MinMax', 'percentile': 'Percentile', 'entropy': 'Entropy'}
#: activation types: name -> onnxruntime QuantType member (weights are always int8)
ACTIVATION_TYPES = {'int8': 'QInt8', 'uint8': 'QUInt8'}
#: node types whose inputs from this index on are parameters (indices, sizes, pads...)
_PARAMETER_INPUTS = {'Resize': 1, 'Gather': 1, 'Pad': 1, 'Slice': 1, 'Reshape': 1,
                     'Split': 1, 'Squeeze': 1, 'Unsqueeze': 1, 'TopK': 1}


@dataclass
class QuantizationResult:
    """What :func:`quantize_model` made.

    Attributes:
        model: the int8 QDQ ``onnx.ModelProto``.
        float_nodes: ``[{node, op_type, reason}]`` kept in float (:mod:`.quant_rules`).
        quantized: node count per op type that runs on int8 inputs and outputs.
        calibration: ``{images, method, activation_type}``.
        prepared: the float graph the quantizer saw (after ``quant_pre_process``; its
            tensor names are the int8 graph's, for :func:`.quant_eval.lossy_nodes`).
    """

    model: object
    float_nodes: List[Dict[str, str]]
    quantized: Dict[str, int]
    calibration: Dict[str, object] = field(default_factory=dict)
    prepared: object = None


def _check_arguments(calibration, method, exclude,
                     activation_type) -> List[Dict[str, np.ndarray]]:
    if method not in METHODS:
        raise ValueError(f'method must be one of {sorted(METHODS)}, got {method!r}')
    if activation_type not in ACTIVATION_TYPES:
        raise ValueError(f'activation_type must be one of {sorted(ACTIVATION_TYPES)}, got '
                         f'{activation_type!r}')
    if isinstance(exclude, str) or not all(isinstance(n, str) for n in exclude):
        raise TypeError(f'exclude must be a sequence of node names (str), got {exclude!r}')
    if isinstance(calibration, (np.ndarray, str)) or not isinstance(calibration, Iterable):
        raise TypeError('calibration must be a sequence of input arrays (N, C, H, W) or of '
                        f'{{input name: array}} dicts, got {type(calibration).__name__}')
    batches = list(calibration)
    if not batches:
        raise ValueError('calibration must hold at least one input (got none)')
    return batches


def _feeds(batches, input_names: Sequence[str]) -> List[Dict[str, np.ndarray]]:
    feeds = []
    for k, item in enumerate(batches):
        if isinstance(item, Mapping):
            feed = {name: np.ascontiguousarray(item[name], dtype=np.float32)
                    for name in input_names}
        else:
            if len(input_names) != 1:
                raise ValueError(f'calibration[{k}]: the graph has inputs {input_names}; '
                                 'give {input name: array} dicts')
            feed = {input_names[0]: np.ascontiguousarray(item, dtype=np.float32)}
        if any(a.ndim != 4 for a in feed.values()):
            raise ValueError(f'calibration[{k}]: inputs must be (N, C, H, W) arrays, got '
                             f'shapes {[a.shape for a in feed.values()]}')
        feeds.append(feed)
    return feeds


def calibration_reader(feeds: Iterable[Dict[str, np.ndarray]]):
    """An onnxruntime ``CalibrationDataReader`` over ``feeds`` ({input name: array})."""
    from onnxruntime.quantization import CalibrationDataReader

    class _Reader(CalibrationDataReader):
        def __init__(self):
            self._items = iter(list(feeds))

        def get_next(self):
            return next(self._items, None)
    return _Reader()


def graph_inputs(model) -> List[str]:
    """Names of the graph's inputs that are not initializers."""
    initializers = {t.name for t in model.graph.initializer}
    return [i.name for i in model.graph.input if i.name not in initializers]


def quantize_model(model_fp32, calibration, path: Optional[Union[str, os.PathLike]] = None,
                   *, method: str = 'minmax', exclude: Sequence[str] = (),
                   quantize_resize_matrices: bool = False, activation_type: str = 'int8',
                   preprocess: bool = True) -> QuantizationResult:
    """Quantize an exported float graph to int8 (QDQ) with onnxruntime.

    Args:
        model_fp32: the float ``onnx.ModelProto`` (e.g. from
            :func:`mmseg_cann.onnx.export_onnx`), or a path to it. Unnamed nodes are
            named (:func:`.atc.name_nodes`) so that reports and ``exclude`` refer to them.
        calibration: the calibration inputs: ``(N, C, H, W)`` float32 arrays (one graph
            input) or ``{input name: array}`` dicts, at least one. Give the tensors the
            model sees (the dataset through the test pipeline and the data preprocessor).
        path: where to write the int8 ``.onnx`` (or None).
        method: calibration of the activation ranges: ``'minmax'``, ``'percentile'``
            (99.999th) or ``'entropy'``.
        exclude: names of more nodes kept in float.
        quantize_resize_matrices: quantize the interpolation / bin-averaging matrices
            too (onnxruntime's default behaviour; see :mod:`.quant_rules`).
        activation_type: ``'int8'`` (as AMCT) or ``'uint8'`` (what onnxruntime's
            documentation advises for x86 CPUs: its u8s8 kernels need no VNNI), both
            per tensor with a zero point.
        preprocess: run onnxruntime's ``quant_pre_process`` first.

    Returns:
        a :class:`QuantizationResult`.

    Raises:
        TypeError, ValueError: bad arguments (before any work).
    """
    import onnx
    from onnxruntime.quantization import (CalibrationMethod, QuantFormat, QuantType,
                                          quantize_static)
    from onnxruntime.quantization.shape_inference import quant_pre_process

    batches = _check_arguments(calibration, method, exclude, activation_type)
    if isinstance(model_fp32, (str, os.PathLike)):
        model_fp32 = onnx.load(os.fspath(model_fp32))
    elif not isinstance(model_fp32, onnx.ModelProto):
        raise TypeError(f'model_fp32 must be an onnx.ModelProto or a path, got '
                        f'{type(model_fp32).__name__}')
    model = onnx.ModelProto.FromString(model_fp32.SerializeToString())
    name_nodes(model)
    check_node_names(model, exclude)  # before any work
    feeds = _feeds(batches, graph_inputs(model))
    for feed in feeds:  # a dynamic graph calibrated only where it holds
        check_dynamic_domain(model, {n: a.shape for n, a in feed.items()})

    with tempfile.TemporaryDirectory() as tmp:
        source = os.path.join(tmp, 'model.onnx')
        onnx.save(model, source)
        if preprocess:
            prepared = os.path.join(tmp, 'prepared.onnx')
            # onnx shape inference (static and dynamic CNN graphs need no symbolic pass,
            # which fails on some of them) and the ORT graph optimisations
            quant_pre_process(source, prepared, skip_symbolic_shape=True)
            source = prepared
        prepared_model = onnx.load(source)
        name_nodes(prepared_model)
        present = {n.name for n in prepared_model.graph.node}
        # a node the pre-processing fused away (a BatchNormalization into its Conv) is
        # no longer there to exclude
        kept = float_nodes(prepared_model, quantize_resize_matrices,
                           [n for n in exclude if n in present])
        # the rule's nodes are quantized (their activations calibrated) and their
        # constant operand restored to float afterwards; the user's are left out
        restore = [r['node'] for r in kept if r['reason'] != REASON_USER]
        skip = [r['node'] for r in kept if r['reason'] == REASON_USER]
        onnx.save(prepared_model, source)
        target = os.path.join(tmp, 'int8.onnx')
        quantize_static(
            source, target, calibration_reader(feeds), quant_format=QuantFormat.QDQ, per_channel=True,
            activation_type=getattr(QuantType, ACTIVATION_TYPES[activation_type]),
            weight_type=QuantType.QInt8, nodes_to_exclude=skip,
            calibrate_method=getattr(CalibrationMethod, METHODS[method]),
            extra_options={'WeightSymmetric': True, 'ActivationSymmetric': False})
        quantized = onnx.load(target)
    _restore_float_operands(quantized, prepared_model, restore, quantize_resize_matrices)
    _share_input_scale(quantized, max_padding_nodes(prepared_model))
    changed = scale_changes(quantized)
    if changed:  # onnxruntime's Direct8Bit quantizers share the input's parameters
        raise RuntimeError(f'quantization requantized the outputs of {changed}')
    domain = read_domain(model)
    if domain is not None:  # the int8 graph holds where the float one does
        attach_domain(quantized, domain)
    onnx.checker.check_model(quantized)
    if path is not None:
        onnx.save(quantized, os.fspath(path))
    return QuantizationResult(
        quantized, list(kept) + [dict(node=n, op_type='?', reason=REASON_USER)
                                        for n in exclude if n not in present],
        quantized_op_counts(quantized),
        dict(images=len(feeds), method=method, activation_type=activation_type),
        prepared_model)


def _restore_float_operands(quantized, prepared, names: Sequence[str],
                            quantize_resize_matrices: bool) -> None:
    """Give the nodes ``names`` their float constant operand back (the one the rule of
    :mod:`.quant_rules` names), dropping the quantize/dequantize nodes and int8
    initializers that no longer feed anything. Their activation input and output keep
    onnxruntime's calibrated QDQ pairs."""
    from onnx import numpy_helper
    if not names:
        return
    rule = FloatRule(prepared, quantize_resize_matrices)
    original = {n.name: n for n in prepared.graph.node}
    graph = quantized.graph
    have = {t.name for t in graph.initializer}
    for node in graph.node:
        if node.name not in names:
            continue
        source = original[node.name]
        k, _ = rule.operand(source)
        name = source.input[k]
        node.input[k] = name
        if name in rule.consts and name not in have:
            graph.initializer.append(numpy_helper.from_array(rule.consts[name], name))
            have.add(name)
    _prune(quantized)


def _share_input_scale(quantized, names: Sequence[str]) -> None:
    """Quantize the outputs of the nodes ``names`` with their input's scale and zero
    point (the values of the output's quantization initializers are overwritten, so the
    nodes that share them, e.g. the slices after a padding, follow)."""
    from onnx import numpy_helper
    if not names:
        return
    graph = quantized.graph
    producers = {o: n for n in graph.node for o in n.output}
    initializers = {t.name: t for t in graph.initializer}
    for node in graph.node:
        if node.name not in names:
            continue
        dq = producers.get(node.input[0])
        if dq is None or dq.op_type != 'DequantizeLinear':
            continue
        for q in graph.node:
            if q.op_type != 'QuantizeLinear' or q.input[0] != node.output[0]:
                continue
            for slot in (1, 2):
                source, target = initializers[dq.input[slot]], initializers[q.input[slot]]
                target.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(source),
                                                        target.name))


def _prune(model) -> None:
    """Remove nodes and initializers that no graph output depends on."""
    graph = model.graph
    needed = {o.name for o in graph.output}
    keep = []
    for node in reversed(list(graph.node)):
        if any(o in needed for o in node.output):
            keep.append(node)
            needed.update(i for i in node.input if i)
    keep.reverse()
    del graph.node[:]
    graph.node.extend(keep)
    initializers = [t for t in graph.initializer if t.name in needed]
    del graph.initializer[:]
    graph.initializer.extend(initializers)


def quantized_op_counts(model_int8) -> Dict[str, int]:
    """Per op type, the nodes of a QDQ graph that onnxruntime runs on int8 data: all their
    data inputs (weights and biases included; not indices, sizes or pads) come from
    ``DequantizeLinear`` and their output goes to ``QuantizeLinear``. A node whose
    float constant was kept (:mod:`.quant_rules`) is not counted."""
    producers, consumers = graph_maps(model_int8)
    counts: Counter = Counter()
    for node in model_int8.graph.node:
        if node.op_type in ('QuantizeLinear', 'DequantizeLinear'):
            continue
        data = [i for i in node.input[:_PARAMETER_INPUTS.get(node.op_type)] if i]
        from_dq = all(producers.get(i) is not None and
                      producers[i].op_type == 'DequantizeLinear' for i in data)
        outs = consumers.get(node.output[0], [])
        if from_dq and outs and all(c.op_type == 'QuantizeLinear' for c in outs):
            counts[node.op_type] += 1
    return dict(sorted(counts.items()))
