"""ONNX export of models using the CANN ops (for the Ascend ATC toolchain).

:func:`export_onnx` exports with ``torch.onnx.export(dynamo=True)`` and translates every
CANN op itself (:mod:`.translation`), so ``Resize``/``MaxPool``/``AveragePool`` nodes
carry the attributes derived from :mod:`mmseg_cann.core.geometry`. :func:`verify_onnx`
compares onnxruntime with PyTorch; :func:`node_summary` lists the Resize and pooling
nodes with their attributes.
"""
from .export import export_onnx, node_summary, verify_onnx
from .ops import onnx_export_mode
from .translation import pool_attributes, resize_attributes

__all__ = ['export_onnx', 'verify_onnx', 'node_summary', 'onnx_export_mode',
           'resize_attributes', 'pool_attributes']
