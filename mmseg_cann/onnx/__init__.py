"""ONNX export of models using the CANN ops, for onnxruntime and for Ascend's ATC.

:func:`export_onnx` exports with ``torch.onnx.export(dynamo=True)`` and translates every
CANN op itself: ``target='onnx'`` writes ``Resize``/``MaxPool``/``AveragePool`` nodes whose
attributes derive from :mod:`mmseg_cann.core.geometry` (:mod:`.translation`);
``target='atc'`` only forms whose meaning ATC's parser keeps (:mod:`.atc_backend`).
:func:`verify_onnx` compares onnxruntime with PyTorch (with ``target='atc'`` on the graph
as ATC reads it, :func:`atc_reading`); :func:`node_summary` lists the Resize and pooling
nodes with their attributes. A dynamic graph states the input sizes it holds for in its
metadata; :func:`check_dynamic_domain` checks shapes against them (the package's runners
do so before every run). :func:`quantize_model` quantizes an exported graph to int8
with onnxruntime, keeping the interpolation/averaging constants float
(:mod:`.quant_rules`).
"""
from .atc import AtcReadError, atc_command, atc_reading, keep_dtype_nodes
from .dynamic_domain import check_dynamic_domain
from .export import export_onnx, node_summary, verify_onnx
from .ops import onnx_export_mode
from .quantize import QuantizationResult, quantize_model
from .translation import pool_attributes, resize_attributes

__all__ = ['export_onnx', 'verify_onnx', 'node_summary', 'onnx_export_mode',
           'resize_attributes', 'pool_attributes', 'atc_reading', 'AtcReadError',
           'atc_command', 'keep_dtype_nodes', 'quantize_model', 'QuantizationResult',
           'check_dynamic_domain']
