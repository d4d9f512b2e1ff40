"""Ascend int8 through AMCT: which layers AMCT quantizes, the hand-off files for a CANN
machine, and an onnxruntime emulation of AMCT's rules (AMCT itself needs CANN).

AMCT's rules for ONNX graphs, from CANN's documentation "layers that support
quantization" (支持量化的层及约束), as this module models them:

* quantized: ``Conv``; ``Gemm`` with ``transA`` false; ``ConvTranspose`` with dilation 1;
  ``MatMul`` whose second input is a 2-D constant; ``AveragePool``; ``MaxPool`` and
  ``Add`` on tensors only (an ``Add`` of a constant is not);
* with fp16 or mixed fp16/fp32 models the quantization of ``AveragePool``, ``MaxPool``
  and ``Add`` is off;
* ``create_quant_config(config_file, model_file, skip_layers=[...], batch_num=...,
  activation_offset=...)`` keeps the named layers in float.

AMCT quantizes the inputs of those layers (activations with an offset, weights per
channel) and dequantizes after them. :func:`emulate` reproduces that in onnxruntime
(``quantize_static`` restricted to the layers, no requantization of outputs, calibrated
on the same inputs): an emulation of the documented rules, not AMCT; the accuracy on the
NPU is for AMCT and ATC to show.

So the constant interpolation / bin-averaging ``MatMul``\\ s of ``x @ A_w^T`` form would be
quantized (their second input is the constant matrix) unless skipped; those of
``A_h @ x`` form have the constant first and are not. :func:`skip_layers` lists the
nodes that the rule of :mod:`.quant_rules` keeps float (and the averaging nodes the
precision policy keeps in fp32, when given) that AMCT would quantize.
"""
from __future__ import annotations

import json
import os
import shlex
from typing import Dict, List, Optional, Sequence

import numpy as np

from .runtime import constant_values

#: AMCT-quantizable op types of an ONNX graph (CANN's "layers that support quantization")
AMCT_OPS = ('Conv', 'Gemm', 'ConvTranspose', 'MatMul', 'AveragePool', 'MaxPool', 'Add')
#: turned off for fp16 / mixed-precision models
AMCT_FP32_ONLY_OPS = ('AveragePool', 'MaxPool', 'Add')


def _attr(node, name, default):
    import onnx
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def amct_quantizable(model, fp16: bool = False) -> List[str]:
    """Names of the nodes AMCT quantizes by its documented rules (module docstring).

    Args:
        model: an ``onnx.ModelProto`` (nodes named).
        fp16: the model is fp16 or mixed fp16/fp32 (AvgPool/MaxPool/Add quantization off).
    """
    consts = constant_values(model)
    names = []
    for node in model.graph.node:
        op = node.op_type
        if op not in AMCT_OPS or (fp16 and op in AMCT_FP32_ONLY_OPS):
            continue
        if op == 'Gemm' and _attr(node, 'transA', 0):
            continue
        if op == 'ConvTranspose' and any(d != 1 for d in _attr(node, 'dilations', [])):
            continue
        if op == 'MatMul' and not (len(node.input) > 1 and node.input[1] in consts
                                   and consts[node.input[1]].ndim == 2):
            continue
        if op == 'Add' and any(i in consts for i in node.input):
            continue
        names.append(node.name)
    return names


def skip_layers(model, float_rows: Sequence[Dict[str, str]],
                keep_float: Sequence[str] = (), fp16: bool = False) -> List[str]:
    """The ``skip_layers`` of AMCT's config: the nodes of ``float_rows``
    (:func:`.quant_rules.float_nodes`) and ``keep_float`` that AMCT would quantize."""
    wanted = {r['node'] for r in float_rows} | set(keep_float)
    return [n for n in amct_quantizable(model, fp16) if n in wanted]


def emulated_model(model, calibration: Sequence[np.ndarray], layers: Sequence[str]):
    """``model`` with ``layers`` fake-quantized as AMCT does -- the inputs of those layers
    only (int8 activations with an offset, symmetric per-channel int8 weights, int32
    biases), no requantization of their outputs -- calibrated (min/max) on
    ``calibration``: a QDQ ``onnx.ModelProto`` that onnxruntime runs."""
    import tempfile

    import onnx
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    from .quantize import calibration_reader, graph_inputs
    name = graph_inputs(model)[0]
    if not layers:
        return model

    op_types = sorted({n.op_type for n in model.graph.node})
    with tempfile.TemporaryDirectory() as tmp:
        source, target = os.path.join(tmp, 'fp32.onnx'), os.path.join(tmp, 'amct.onnx')
        onnx.save(model, source)
        quantize_static(source, target, calibration_reader([{name: x} for x in calibration]),
                        quant_format=QuantFormat.QDQ,
                        per_channel=True, activation_type=QuantType.QInt8,
                        weight_type=QuantType.QInt8, nodes_to_quantize=list(layers),
                        extra_options={'ActivationSymmetric': False, 'WeightSymmetric': True,
                                       'ForceQuantizeNoInputCheck': True,
                                       'OpTypesToExcludeOutputQuantization': op_types})
        return onnx.load(target)


def emulate(model, calibration: Sequence[np.ndarray], layers: Sequence[str],
            check: Optional[Sequence[np.ndarray]] = None) -> Dict[str, float]:
    """:func:`emulated_model` against ``model`` on ``check`` (default: the calibration
    inputs): ``{layers, label_agreement, max_abs}``, the agreement of the channel argmax
    in percent of pixels."""
    from .runtime import run_onnx
    emulated = emulated_model(model, calibration, layers)
    same = total = 0
    max_abs = 0.0
    for x in list(calibration if check is None else check):
        a, b = run_onnx(model, [x])[0], run_onnx(emulated, [x])[0]
        same += int((a.argmax(1) == b.argmax(1)).sum())
        total += a.shape[0] * a.shape[2] * a.shape[3]
        max_abs = max(max_abs, float(np.abs(a - b).max()))
    return dict(layers=len(layers), label_agreement=100.0 * same / total, max_abs=max_abs)


def write_handoff(model, calibration: Sequence[np.ndarray], folder: str, soc: str,
                  *, model_file: str = '../model_fp32.onnx',
                  float_rows: Sequence[Dict[str, str]] = (), keep_float: Sequence[str] = (),
                  keep_dtype_file: Optional[str] = None) -> Dict[str, object]:
    """Write what AMCT takes on a CANN machine into ``folder``:

    * ``calibration/NNNN.bin``: the calibration inputs as raw float32 (C order), with
      ``calibration/shape.json`` (shape, dtype, input name, files);
    * ``quantize_amct.py``: ``amct_onnx`` calls (``create_quant_config`` with
      ``skip_layers``, ``quantize_model``, calibration on the .bin files,
      ``save_model``); ``config.json`` is written by AMCT there;
    * ``commands.sh``: that script, then ``atc`` on AMCT's deploy model for ``soc``.

    Paths in the files are relative to ``folder`` (``model_file``: the float graph).
    Returns the ``amct`` section of the report (``config``, ``skip_layers``,
    ``would_quantize``, ``commands``).
    """
    from .quantize import graph_inputs
    os.makedirs(os.path.join(folder, 'calibration'), exist_ok=True)
    name = graph_inputs(model)[0]
    files = []
    for k, x in enumerate(calibration):
        file = f'{k:04d}.bin'
        np.ascontiguousarray(x, dtype=np.float32).tofile(os.path.join(folder, 'calibration',
                                                                      file))
        files.append(file)
    n, c, h, w = (int(v) for v in np.asarray(calibration[0]).shape)
    with open(os.path.join(folder, 'calibration', 'shape.json'), 'w') as f:
        json.dump(dict(input=name, shape=[n, c, h, w], dtype='float32', files=files), f,
                  indent=2)
    skip = skip_layers(model, float_rows, keep_float)
    would = amct_quantizable(model)
    with open(os.path.join(folder, 'quantize_amct.py'), 'w') as f:
        f.write(_SCRIPT.format(model=model_file, skip=json.dumps(skip, indent=4),
                               batches=len(files), name=name, shape=[n, c, h, w]))
    atc = ['atc', '--framework=5', '--model=result/model_deploy_model.onnx',
           '--output=model_int8', f'--soc_version={soc}', f'--input_shape={name}:{n},{c},{h},{w}']
    if keep_dtype_file:
        atc.append(f'--keep_dtype={keep_dtype_file}')
    commands = ['python3 quantize_amct.py', ' '.join(shlex.quote(p) for p in atc)]
    with open(os.path.join(folder, 'commands.sh'), 'w') as f:
        f.write('#!/bin/sh\n# On a machine with CANN (AMCT for ONNX and ATC), in this '
                'folder.\nset -e\n' + '\n'.join(commands) + '\n')
    return dict(folder=folder, config='config.json (written by quantize_amct.py)',
                skip_layers=skip, would_quantize=dict(
                    without_skip=len(would), with_skip=len(would) - len(skip)),
                commands=commands)


_SCRIPT = '''"""AMCT post-training quantization of {model} (written by tools/quantize.py).

Run on a machine with CANN's AMCT for ONNX (amct_onnx); not run where it was written.
"""
import glob
import json
import os

import amct_onnx as amct
import numpy as np
import onnxruntime as ort

HERE = os.path.dirname(os.path.abspath(__file__))
MODEL = os.path.join(HERE, {model!r})
# the interpolation / bin-averaging constants and the averaging nodes kept in float
SKIP_LAYERS = {skip}

with open(os.path.join(HERE, 'calibration', 'shape.json')) as f:
    meta = json.load(f)
batches = [np.fromfile(os.path.join(HERE, 'calibration', name), dtype=np.float32)
           .reshape(meta['shape']) for name in meta['files']]

config = os.path.join(HERE, 'config.json')
modified = os.path.join(HERE, 'modified_model.onnx')
record = os.path.join(HERE, 'record.txt')
amct.create_quant_config(config_file=config, model_file=MODEL, skip_layers=SKIP_LAYERS,
                         batch_num={batches}, activation_offset=True)
amct.quantize_model(config_file=config, model_file=MODEL, modified_onnx_file=modified,
                    record_file=record)
session = ort.InferenceSession(modified, amct.AMCT_SO)
for batch in batches:  # calibration: one run per batch
    session.run(None, {{meta['input']: batch}})
amct.save_model(modified_onnx_file=modified, record_file=record,
                save_path=os.path.join(HERE, 'result', 'model'))
'''
