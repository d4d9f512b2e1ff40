"""torchao's PT2E quantization flow, and what a quantized graph looks like.

A model converted with :func:`mmseg_cann.convert_model` should look to PyTorch's
quantization flow as its unconverted self does: under ``torch.export`` the CANN ops
record PyTorch's own aten ops wherever the standard exporters translate those exactly
(:mod:`mmseg_cann.core.standard_export`). :func:`quantize_pt2e` runs the flow
(``torch.export`` -> ``prepare_pt2e`` -> calibration -> ``convert_pt2e``, by default with
the X86 inductor quantizer and its default configuration); :func:`summarize` says which
ops the quantizer put between quantize/dequantize nodes. torchao is an optional extra
(``pip install -e .[quant]``). See docs/quantization.md ("PyTorch side").
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Iterable, Tuple

import torch
from torch import nn

_QUANTIZE = ('quantize_per_tensor', 'quantize_per_channel')
_DEQUANTIZE = ('dequantize_per_tensor', 'dequantize_per_channel')
#: bookkeeping nodes ``torch.export`` records that compute nothing
_BOOKKEEPING = ('_assert_tensor_metadata', 'lift_fresh_copy')


def _torchao():
    try:
        from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
        from torchao.quantization.pt2e.quantizer import x86_inductor_quantizer as x86
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ModuleNotFoundError(
            'the PT2E flow needs torchao (pip install -e .[quant], or torchao==0.18.0): '
            f'{exc}') from exc
    return prepare_pt2e, convert_pt2e, x86


def default_quantizer():
    """torchao's ``X86InductorQuantizer`` with its default (static, per-tensor int8
    activations, per-channel int8 weights) configuration for every op."""
    _, _, x86 = _torchao()
    return x86.X86InductorQuantizer().set_global(
        x86.get_default_x86_inductor_quantization_config())


def _as_args(value, name: str) -> tuple:
    if isinstance(value, torch.Tensor):
        return (value,)
    if isinstance(value, tuple) and all(isinstance(v, torch.Tensor) for v in value):
        return value
    raise TypeError(f'{name} must be a tensor or a tuple of tensors, got '
                    f'{type(value).__name__}')


def quantize_pt2e(model: nn.Module, example_inputs, calibration: Iterable,
                  quantizer=None) -> torch.fx.GraphModule:
    """``model`` through torchao's PT2E flow: ``torch.export.export(model,
    example_inputs).module()``, ``prepare_pt2e`` with ``quantizer`` (default:
    :func:`default_quantizer`), one forward per calibration batch, ``convert_pt2e``.

    Args:
        model: the model, in eval mode (its forward is exported as it runs now).
        example_inputs: a tensor or a tuple of tensors for the export.
        calibration: batches (tensors or tuples of tensors) run through the prepared
            model to fix the activation ranges; at least one.

    Returns:
        The quantized ``GraphModule`` (quantize/dequantize nodes around the ops the
        quantizer annotated).

    Raises:
        TypeError: ``model`` is not an ``nn.Module``, or an input is not a tensor or a
            tuple of tensors.
        ValueError: ``calibration`` is empty.
        ModuleNotFoundError: torchao is not installed.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f'model must be an nn.Module, got {type(model).__name__}')
    args = _as_args(example_inputs, 'example_inputs')
    batches = [_as_args(b, 'a calibration batch') for b in calibration]
    if not batches:
        raise ValueError('calibration must hold at least one batch (it fixes the '
                         'activation ranges)')
    prepare_pt2e, convert_pt2e, _ = _torchao()
    quantizer = default_quantizer() if quantizer is None else quantizer
    exported = torch.export.export(model, args).module()
    prepared = prepare_pt2e(exported, quantizer)
    with torch.no_grad():
        for batch in batches:
            prepared(*batch)
    return convert_pt2e(prepared)


def _op_name(node) -> str:
    target = node.target
    return getattr(target, '_opname', None) or getattr(target, '__name__', str(target))


def _is_qdq(node, names) -> bool:
    return (node.op == 'call_function' and 'quantized_decomposed' in str(node.target)
            and _op_name(node) in names)


@dataclass(frozen=True)
class QuantizedGraph:
    """What the quantizer did to a graph (:func:`summarize`)."""

    #: aten op name -> how many of its nodes read a dequantized (int8) activation
    quantized_ops: Counter
    #: activation quantize -> dequantize pairs (per-tensor quantize nodes)
    qdq_pairs: int
    #: aten op name -> count, every computing node but the quantize/dequantize ones
    ops: Counter

    def row(self) -> Tuple[str, int]:
        """``('conv2d x3, max_pool2d', pairs)``: the quantized ops, sorted, and the
        pair count (the docs' table)."""
        text = ', '.join(f'{name} x{n}' if n > 1 else name
                         for name, n in sorted(self.quantized_ops.items()))
        return text, self.qdq_pairs


def summarize(graph_module: torch.fx.GraphModule) -> QuantizedGraph:
    """The quantized ops, the quantize/dequantize pairs and the other ops of a graph
    that :func:`quantize_pt2e` (``convert_pt2e``) returned.

    An op counts as quantized when one of its inputs is a dequantize node's output (an
    int8 activation, or a per-channel int8 weight). Raises ``TypeError`` for anything
    but a ``torch.fx.GraphModule``.
    """
    if not isinstance(graph_module, torch.fx.GraphModule):
        raise TypeError(f'graph_module must be a torch.fx.GraphModule, got '
                        f'{type(graph_module).__name__}')
    quantized, ops, pairs = Counter(), Counter(), 0
    for node in graph_module.graph.nodes:
        if node.op != 'call_function':
            continue
        if _is_qdq(node, _QUANTIZE):
            if _op_name(node) == 'quantize_per_tensor':
                pairs += 1
            continue
        if _is_qdq(node, _DEQUANTIZE):
            continue
        name = _op_name(node)
        if name in _BOOKKEEPING:
            continue
        ops[name] += 1
        if any(isinstance(a, torch.fx.Node) and _is_qdq(a, _DEQUANTIZE)
               for a in node.all_input_nodes):
            quantized[name] += 1
    return QuantizedGraph(quantized, pairs, ops)
