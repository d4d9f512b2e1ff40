"""Benchmark cases of tools/benchmark.py: int8 against fp32 in onnxruntime (CPU, one
thread), the graphs of tools/quantize.py.

Each case exports a shipped config's model (seeded initialisation, ``--target atc``, as
``tools/quantize.py`` does), quantizes it with 4 seeded random calibration inputs and
times, in alternation in one process (``interleave``): the fp32 graph (the baseline
column), ``mmseg_cann.onnx.quantize_model`` (interpolation / bin matrices float, the
default), the same with the matrices quantized (onnxruntime's defaults) and onnxruntime's
``nodes_to_exclude`` of the float-rule nodes (the naive way: the graph drops out of int8
around them) and ``quantize_model`` with uint8 activations (onnxruntime's u8s8 kernels,
which need no VNNI). The ``eager`` column is the fp32 graph; the model sizes go to stderr.
"""
from __future__ import annotations

import os
import sys
import tempfile

import numpy as np

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: (case name, config, input (H, W))
MODELS = [
    ('int8_ort_demo_unet',
     'configs/medical/unet-s5-d16_fcn_cann_1xb4-300iter_synthetic-drive-64x64.py', (96, 96)),
    ('int8_ort_pspnet_r50_256x512',
     'configs/cityscapes/pspnet_r50-d8_cann_4xb2-40k_cityscapes-512x1024.py', (256, 512)),
    ('int8_ort_deeplabv3plus_r50_256x512',
     'configs/cityscapes/deeplabv3plus_r50-d8_cann_4xb2-40k_cityscapes-512x1024.py',
     (256, 512)),
]
CALIBRATION_IMAGES = 4


def _session(proto):
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    return ort.InferenceSession(proto.SerializeToString(), options,
                                providers=['CPUExecutionProvider'])


def _naive(proto, inputs, rows):
    """onnxruntime's quantize_static with the rule's nodes in ``nodes_to_exclude``."""
    import onnx
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    from mmseg_cann.onnx.quantize import calibration_reader
    name = proto.graph.input[0].name

    with tempfile.TemporaryDirectory() as tmp:
        onnx.save(proto, os.path.join(tmp, 'a.onnx'))
        quant_pre_process(os.path.join(tmp, 'a.onnx'), os.path.join(tmp, 'b.onnx'),
                          skip_symbolic_shape=True)
        quantize_static(os.path.join(tmp, 'b.onnx'), os.path.join(tmp, 'c.onnx'),
                        calibration_reader([{name: x} for x in inputs]),
                        quant_format=QuantFormat.QDQ, per_channel=True,
                        activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                        nodes_to_exclude=[r['node'] for r in rows])
        return onnx.load(os.path.join(tmp, 'c.onnx'))


def _case(Case, name, config, hw):
    import torch
    state = {}

    def make(device):
        from export_onnx import build_model

        from mmseg_cann.onnx import export_onnx, quantize_model
        from mmseg_cann.onnx.atc import name_nodes
        from mmseg_cann.onnx.calibration import random_inputs
        model = build_model(os.path.join(REPO_ROOT, config))
        proto = export_onnx(model, torch.randn((1, 3) + hw), target='atc')
        name_nodes(proto)
        inputs = random_inputs(CALIBRATION_IMAGES, hw)
        ours = quantize_model(proto, inputs)
        graphs = {'fp32': proto, 'int8': ours.model,
                  'int8, matrices quantized': quantize_model(
                      proto, inputs, quantize_resize_matrices=True).model,
                  'int8, naive nodes_to_exclude': _naive(proto, inputs, ours.float_nodes),
                  'int8, uint8 activations': quantize_model(
                      proto, inputs, activation_type='uint8').model}
        state['sessions'] = {k: _session(g) for k, g in graphs.items()}
        print(f'{name} model sizes: ' + ', '.join(
            f'{k} {g.ByteSize() / 1e6:.2f} MB' for k, g in graphs.items()),
            file=sys.stderr, flush=True)
        state['name'] = proto.graph.input[0].name
        return (np.random.default_rng(1).standard_normal((1, 3) + hw).astype(np.float32),)

    def runner(key):
        def run(x):
            return state['sessions'][key].run(None, {state['name']: x})[0]
        return run

    case = Case(name, make, runner('fp32'),
                {f'onnxruntime {k}': runner(k) for k in
                 ('int8', 'int8, matrices quantized', 'int8, naive nodes_to_exclude',
                  'int8, uint8 activations')},
                compile=False, interleave=True)
    return case


def cases(Case):
    """The int8 cases, built with tools/benchmark.py's ``Case``."""
    return [_case(Case, name, config, hw) for name, config, hw in MODELS]
