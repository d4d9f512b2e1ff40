"""torchao's PT2E flow (``prepare_pt2e``/``convert_pt2e``, X86 inductor quantizer) sees a
model converted with ``convert_model`` as it sees the unconverted one: the same
quantized ops, the same quantize/dequantize pairs, the same labels. Under
``torch.export`` the CANN ops record PyTorch's aten ops wherever the standard exporters
translate them exactly (``mmseg_cann/core/standard_export.py``); where they do not (here
only the Sequential's 3-bin adaptive pooling of a 32x32 map) the test states the exact
difference. docs/quantization.md ("PyTorch side") has the table these tests print
(``-s``)."""
from __future__ import annotations

import copy
import warnings
from collections import Counter

import pytest
import torch
from torch import nn

pytest.importorskip('torchao')

from mmseg_cann import convert_model, restore_resize  # noqa: E402
from mmseg_cann.analysis.pt2e import quantize_pt2e, summarize  # noqa: E402

#: the ops that would show a portable form (a resize or bin average as matrix products)
PORTABLE_OPS = ('matmul', 'index_select', 't')


def _sequential():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Upsample(scale_factor=2, mode='bilinear'),
                         nn.Conv2d(8, 8, 3, padding=1), nn.AdaptiveAvgPool2d(3),
                         nn.Conv2d(8, 4, 1)).eval()


class _Logits(nn.Module):
    """An mmseg segmentor's ``mode='tensor'`` forward (the decode head's logits)."""

    def __init__(self, segmentor):
        super().__init__()
        self.segmentor = segmentor

    def forward(self, x):
        return self.segmentor(x, mode='tensor')


def _both(model, hw):
    """The quantized unconverted and converted models, the float model's output and
    the test input: calibration on 4 seeded standard-normal batches."""
    gen = torch.Generator().manual_seed(1)
    example = torch.randn(1, 3, hw, hw, generator=gen)
    calibration = [torch.randn(1, 3, hw, hw, generator=gen) for _ in range(4)]
    test_input = torch.randn(1, 3, hw, hw, generator=gen)  # the export fixed batch 1
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        # the unconverted model first: convert_model routes mmseg's resize process-wide
        q_nn = quantize_pt2e(model, (example,), calibration)
        try:
            converted = convert_model(copy.deepcopy(model))
            q_cann = quantize_pt2e(converted, (example,), calibration)
        finally:
            restore_resize()
    with torch.no_grad():
        return q_nn, q_cann, model(test_input), test_input


def _input_scales(graph_module, op):
    """The scales of the per-tensor dequantize nodes read by each ``op`` node, in order."""
    scales = []
    for node in graph_module.graph.nodes:
        if node.op == 'call_function' and getattr(node.target, '_opname', '') == op:
            scales += [float(a.args[1]) for a in node.all_input_nodes
                       if 'dequantize_per_tensor' in str(a.target)]
    return scales


def _report(name, hw, s_nn, s_cann, labels_agree):
    for label, s in (('nn', s_nn), ('converted', s_cann)):
        ops, pairs = s.row()
        print(f'| {name} {hw}x{hw} | {label} | {ops} | {pairs} | '
              f'{"yes" if labels_agree else "no"} |')


def _assert_same_graph(q_nn, q_cann):
    s_nn, s_cann = summarize(q_nn), summarize(q_cann)
    assert s_cann.quantized_ops == s_nn.quantized_ops, (s_nn.row(), s_cann.row())
    assert s_cann.qdq_pairs == s_nn.qdq_pairs
    assert s_cann.ops == s_nn.ops, (s_nn.ops, s_cann.ops)
    assert not set(PORTABLE_OPS) & set(s_cann.ops)
    return s_nn, s_cann


def test_sequential_divisible_bins_same_graph_same_outputs():
    """At 36x36 every op has its exact aten form: the same graph, so the quantized
    outputs are bit for bit the same (same ops, same weights, same calibration)."""
    model, hw = _sequential(), 36
    q_nn, q_cann, _, x = _both(model, hw)
    s_nn, s_cann = _assert_same_graph(q_nn, q_cann)
    assert s_nn.quantized_ops == Counter(conv2d=3, max_pool2d=1, upsample_bilinear2d=1,
                                         adaptive_avg_pool2d=1)
    assert s_nn.qdq_pairs == 6
    with torch.no_grad():
        a, b = q_nn(x), q_cann(x)
    assert torch.equal(a, b)
    _report('Sequential', hw, s_nn, s_cann, True)


def test_sequential_32x32_differs_exactly_at_the_non_divisible_adaptive_pool():
    """At 32x32 the 3-bin adaptive average of a 32x32 map has no exact standard export
    (the TorchScript exporter refuses bins that do not divide the input), so the
    converted model keeps the bin matrices there: one quantized op and one pair fewer,
    two matmuls and a transpose instead of adaptive_avg_pool2d; everything else equal.

    Outputs: the layers before the pool are the same graph. The unconverted model
    rounds the pool's input to int8 (scale ``s1``; an average keeps that error below
    ``s1 / 2``), then the last convolution's input (``s2``); the converted one only the
    last convolution's input (``s3``). So the inputs of the last (1x1) convolution
    differ by at most ``(s1 + s2 + s3) / 2`` (plus the float32 rounding of the two
    averaging forms, below 1e-6 here), and its output by that times its largest
    absolute row of dequantized weights (symmetric per-channel int8: each weight within
    half a step, ``max|w_row| / 254``, of the float one)."""
    model, hw = _sequential(), 32
    q_nn, q_cann, _, x = _both(model, hw)
    s_nn, s_cann = summarize(q_nn), summarize(q_cann)
    assert s_nn.quantized_ops - s_cann.quantized_ops == Counter(adaptive_avg_pool2d=1)
    assert not s_cann.quantized_ops - s_nn.quantized_ops
    assert (s_nn.qdq_pairs, s_cann.qdq_pairs) == (6, 5)
    assert s_cann.ops['matmul'] == 2 and s_cann.ops['t'] == 1
    assert 'adaptive_avg_pool2d' not in s_cann.ops
    for op in ('conv2d', 'relu', 'max_pool2d', 'upsample_bilinear2d'):
        assert s_cann.ops[op] == s_nn.ops[op], op
    with torch.no_grad():
        a, b = q_nn(x), q_cann(x)
    assert torch.equal(a.argmax(1), b.argmax(1))
    (s1,) = _input_scales(q_nn, 'adaptive_avg_pool2d')
    s2, s3 = _input_scales(q_nn, 'conv2d')[-1], _input_scales(q_cann, 'conv2d')[-1]
    weight = model[6].weight.detach().flatten(1)
    rows = weight.abs().sum(1) + weight.shape[1] * weight.abs().amax(1) / 254
    bound = ((s1 + s2 + s3) / 2 + 1e-6) * float(rows.max())
    assert float((a - b).abs().max()) <= bound
    _report('Sequential', hw, s_nn, s_cann, True)


def _mmseg_case(name, hw):
    pytest.importorskip('mmseg')
    from tests._model_sweep import build_base_model
    model = _Logits(build_base_model(name)).eval()
    q_nn, q_cann, _, x = _both(model, hw)
    s_nn, s_cann = _assert_same_graph(q_nn, q_cann)
    with torch.no_grad():
        a, b = q_nn(x), q_cann(x)
    # the same graph, weights and calibration: the same numbers
    assert torch.equal(a, b)
    _report(name, hw, s_nn, s_cann, True)
    return s_nn


@pytest.mark.slow
def test_unet_same_quantized_graph():
    """mmseg's UNet (fcn_unet_s5-d16): four max pools, four 2x bilinear upsamplings."""
    s = _mmseg_case('fcn_unet_s5-d16', 64)
    assert s.ops['upsample_bilinear2d'] == 4 and s.ops['max_pool2d'] == 4
    assert s.quantized_ops['max_pool2d'] == 4


@pytest.mark.slow
def test_pspnet_same_quantized_graph():
    """mmseg's PSPNet head on the UNet backbone (pspnet_unet_s5-d16) at 48x48: the
    pyramid pooling's 1, 2, 3 and 6 bins divide 48, and its upsamplings back to 48
    (x48, x24, x16, x8) are integral. (The ResNet PSPNet does not get this far: see
    test_a_module_called_twice_stops_torchaos_quantizer.)"""
    s = _mmseg_case('pspnet_unet_s5-d16', 48)
    assert s.ops['adaptive_avg_pool2d'] == 4 and s.quantized_ops['adaptive_avg_pool2d'] == 4
    assert s.ops['upsample_bilinear2d'] == 8


def test_a_module_called_twice_stops_torchaos_quantizer():
    """What stops the ResNet models (mmseg's BasicBlock/Bottleneck call one ``ReLU``
    module twice) before any CANN op plays a part: torchao 0.18's X86 quantizer groups
    both calls into one partition and raises, on the unconverted model."""

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 3, 3, padding=1)
            self.relu = nn.ReLU()

        def forward(self, x):
            return self.relu(self.conv(self.relu(x)) + x)

    x = torch.randn(1, 3, 8, 8)
    with pytest.raises(ValueError, match='more than one output node'):
        quantize_pt2e(Block().eval(), (x,), [x])


def test_bad_input():
    x = torch.randn(1, 3, 8, 8)
    with pytest.raises(TypeError, match='nn.Module'):
        quantize_pt2e(lambda t: t, (x,), [x])
    with pytest.raises(TypeError, match='example_inputs'):
        quantize_pt2e(nn.ReLU(), [x], [x])
    with pytest.raises(TypeError, match='calibration batch'):
        quantize_pt2e(nn.ReLU(), (x,), [x.numpy()])
    with pytest.raises(ValueError, match='at least one batch'):
        quantize_pt2e(nn.ReLU(), (x,), [])
    with pytest.raises(TypeError, match='GraphModule'):
        summarize(nn.ReLU())
