"""``quantize_model`` and the rule of ``mmseg_cann.onnx.quant_rules`` on every node form
the CANN ops export to, for both targets: which nodes keep float constants, that those
constants stay the exported float32 values, that the int8 graph does not drop out of
int8 around them, and bad arguments."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from mmseg_cann import CANNAdaptiveAvgPool2d, CANNAvgPool2d, CANNMaxPool2d, CANNUpsample

pytest.importorskip('onnxruntime')
pytest.importorskip('onnxscript')
import onnx  # noqa: E402
from onnx import numpy_helper  # noqa: E402

from mmseg_cann.onnx import export_onnx, quantize_model  # noqa: E402
from mmseg_cann.onnx.atc import name_nodes  # noqa: E402
from mmseg_cann.onnx.quant_rules import (REASON_BINS, REASON_DIVISOR,  # noqa: E402
                                         REASON_DYNAMIC_BINS, REASON_INTERP, float_nodes,
                                         max_padding_nodes, scale_changes)
from mmseg_cann.onnx.quantize import quantized_op_counts  # noqa: E402
from mmseg_cann.onnx.runtime import constant_values, run_onnx  # noqa: E402


class EveryForm(nn.Module):
    """One of each CANN op form on a 3x32x32 input, with convolutions between them.

    Sizes: conv 32x32 -> max pool 2 -> 16x16 -> bilinear x1.7 -> 27x27 (a user scale
    whose 1/1.7 is not 16/27: interpolation matrices for ATC) -> bicubic to 30x30 ->
    antialiased bilinear to 20x20 (ATC only) -> adaptive 6 bins of 20 (uneven: bin matrices) and
    adaptive 1 (global) and 4 (5 each: an even AveragePool) -> exclusive-border average
    pool 3/2/1 of 20x20 (ATC: divisor Mul) -> nearest x2 (ATC: Gather) -> dilated max
    pool -> a Linear over the channels (a learnt MatMul that must stay quantized)."""

    def __init__(self, antialias=True):
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1)
        self.mp = CANNMaxPool2d(2)
        self.bilinear = CANNUpsample(scale_factor=1.7, mode='bilinear', align_corners=False)
        self.bicubic = CANNUpsample(size=(30, 30), mode='bicubic', align_corners=False)
        # ONNX Resize's antialias filter is not PyTorch's: the onnx target refuses it
        self.aa = CANNUpsample(size=(20, 20), mode='bilinear', antialias=antialias)
        self.bins6, self.bins1 = CANNAdaptiveAvgPool2d(6), CANNAdaptiveAvgPool2d(1)
        self.bins4 = CANNAdaptiveAvgPool2d(4)
        self.c2 = nn.Conv2d(8, 8, 1)
        self.avg = CANNAvgPool2d(3, 2, 1, count_include_pad=False)
        self.nearest = CANNUpsample(scale_factor=2, mode='nearest')
        self.dilated = CANNMaxPool2d(3, 1, 1, dilation=2)
        self.linear = nn.Linear(8, 4)

    def forward(self, x):
        y = self.mp(torch.relu(self.c1(x)))
        y = self.aa(self.bicubic(self.bilinear(y)))
        pooled = self.c2(self.bins6(y)).mean((2, 3), keepdim=True) + self.bins1(y) + \
            self.bins4(y).amax((2, 3), keepdim=True)
        y = self.nearest(self.avg(y + pooled))
        y = self.dilated(y)
        return self.linear(y.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


#: the constants kept float, by hand from the forms above (docstring of EveryForm and
#: of mmseg_cann.onnx.atc_backend / translation): target -> {reason: node count}
EXPECTED = {
    # ATC: bilinear x1.7, bicubic and antialias as two MatMuls each; 6 uneven bins as
    # two; the exclusive-border average's divisor Mul
    'atc': {REASON_INTERP: 6, REASON_BINS: 2, REASON_DIVISOR: 1},
    # ONNX: Resize nodes carry the interpolation; AveragePool(count_include_pad=0) the
    # exclusive average; only the 6 uneven bins are MatMuls
    'onnx': {REASON_BINS: 2},
}


def _calibration(n=4, shape=(1, 3, 32, 32)):
    return [np.random.default_rng(i).standard_normal(shape).astype(np.float32)
            for i in range(n)]


def _model(target):
    torch.manual_seed(0)
    return EveryForm(antialias=target == 'atc').eval()


@pytest.fixture(scope='module')
def model():
    return _model('atc')


@pytest.fixture(scope='module', params=['onnx', 'atc'])
def exported(request):
    proto = export_onnx(_model(request.param), torch.randn(1, 3, 32, 32),
                        target=request.param)
    name_nodes(proto)
    return request.param, proto


def _by_reason(rows):
    counts = {}
    for r in rows:
        counts[r['reason']] = counts.get(r['reason'], 0) + 1
    return counts


def test_rule_on_every_form(exported):
    target, proto = exported
    rows = float_nodes(proto)
    assert _by_reason(rows) == EXPECTED[target]
    # the Linear's learnt MatMul is not among them
    consts = constant_values(proto)
    learnt = [n.name for n in proto.graph.node if n.op_type == 'MatMul' and any(
        i in consts and consts[i].shape == (8, 4) for i in n.input)]
    assert len(learnt) == 1 and learnt[0] not in {r['node'] for r in rows}
    assert float_nodes(proto, quantize_resize_matrices=True) == [
        r for r in rows if r['reason'] == REASON_DIVISOR]


def test_int8_graph_keeps_the_float_constants_and_stays_int8(exported):
    target, proto = exported
    model = _model(target)
    result = quantize_model(proto, _calibration())
    q = result.model
    consts = constant_values(q)
    original = constant_values(proto)
    nodes = {n.name: n for n in q.graph.node}
    producers = {o: n for n in q.graph.node for o in n.output}
    for row in result.float_nodes:
        node = nodes[row['node']]
        floats = [i for i in node.input if i in consts]
        # the exported float32 constant, bit for bit; the activation comes dequantized
        assert len(floats) == 1 and consts[floats[0]].dtype == np.float32
        assert np.array_equal(consts[floats[0]], original[floats[0]])
        data = [i for i in node.input if i not in consts]
        assert all(producers[i].op_type == 'DequantizeLinear' for i in data), row
    # the learnt Linear is an int8 MatMul (a Gemm once quant_pre_process fused its bias
    # Add); every Conv is int8
    assert result.quantized.get('MatMul', 0) + result.quantized.get('Gemm', 0) == 1
    assert result.quantized['Conv'] == 2
    # data movement after a float-constant node stays int8 with the input's scale
    assert scale_changes(q) == []
    if target == 'atc':
        assert result.quantized.get('Gather') == 2       # the nearest x2 after the Mul
        # the dilated max pool's lowest-float padding keeps its input's scale (else its
        # calibrated range reaches -3.4e38 and the output is one flat value)
        (pad,) = max_padding_nodes(proto)
        scales = [c for c in q.graph.node if c.op_type in ('QuantizeLinear',
                                                          'DequantizeLinear')]
        into = next(c for c in scales if c.output[0] == nodes[pad].input[0])
        out = next(c for c in scales if c.input[0] == nodes[pad].output[0])
        assert consts[into.input[1]] == consts[out.input[1]]
        assert consts[into.input[2]] == consts[out.input[2]]
    assert result.quantized.get('MaxPool', 0) >= 1
    # close to the float model (random weights, 4 calibration inputs)
    x = _calibration(1)[0]
    with torch.no_grad():
        expected = model(torch.from_numpy(x)).numpy()
    got = run_onnx(q, [x])[0]
    assert np.abs(got - expected).max() < 0.1 * np.abs(expected).max()


def test_naive_exclusion_drops_out_of_int8(model):
    """What onnxruntime's nodes_to_exclude does: the Gathers after the divisor Mul and
    the data movement after the matrices fall back to float. quantize_model keeps them
    int8 (the test above)."""
    import os
    import tempfile

    from onnxruntime.quantization import QuantFormat, quantize_static

    from mmseg_cann.onnx.quantize import calibration_reader
    proto = export_onnx(model, torch.randn(1, 3, 32, 32), target='atc')
    name_nodes(proto)
    rows = float_nodes(proto)
    calib = _calibration()

    with tempfile.TemporaryDirectory() as tmp:
        onnx.save(proto, os.path.join(tmp, 'a.onnx'))
        quantize_static(os.path.join(tmp, 'a.onnx'), os.path.join(tmp, 'b.onnx'),
                        calibration_reader([{'input': x} for x in calib]),
                        quant_format=QuantFormat.QDQ, per_channel=True,
                        nodes_to_exclude=[r['node'] for r in rows])
        naive = quantized_op_counts(onnx.load(os.path.join(tmp, 'b.onnx')))
    assert naive.get('Gather', 0) == 0
    ours = quantize_model(proto, calib).quantized
    assert ours['Gather'] == 2


def test_quantize_resize_matrices_quantizes_them(exported):
    target, proto = exported
    result = quantize_model(proto, _calibration(), quantize_resize_matrices=True)
    consts = constant_values(result.model)
    matrices = {r['node'] for r in float_nodes(proto) if r['op_type'] == 'MatMul'}
    for node in result.model.graph.node:
        if node.name in matrices:
            assert not any(i in consts and consts[i].dtype == np.float32 and consts[i].ndim == 2
                           for i in node.input), node.name
    assert [r['reason'] for r in result.float_nodes] == (
        [REASON_DIVISOR] if target == 'atc' else [])


def test_dynamic_bin_matrices_stay_float(model):
    proto = export_onnx(model.bins6, torch.randn(1, 8, 20, 20), dynamic=True)
    name_nodes(proto)
    rows = float_nodes(proto)
    assert [r['reason'] for r in rows] == [REASON_DYNAMIC_BINS] * 2
    x = np.random.default_rng(0).standard_normal((1, 8, 20, 20)).astype(np.float32)
    y = np.random.default_rng(1).standard_normal((1, 8, 23, 17)).astype(np.float32)
    result = quantize_model(proto, [x, y])
    # the bin matrices are computed in float, for each size: the error is the rounding of
    # the quantized input, of the intermediate product and of the output, half a step
    # each, and each step is at most the input's (averages stay inside the input range)
    step = (max(x.max(), y.max()) - min(x.min(), y.min(), 0)) / 255
    for z in (x, y):
        got = run_onnx(result.model, [z])[0]
        expected = torch.nn.functional.adaptive_avg_pool2d(torch.from_numpy(z), 6).numpy()
        assert np.abs(got - expected).max() <= 1.5 * step * (1 + 1e-4)


def test_user_exclude(exported):
    target, proto = exported
    conv = next(n.name for n in proto.graph.node if n.op_type == 'Conv')
    result = quantize_model(proto, _calibration(2), exclude=[conv])
    assert {'node': conv, 'op_type': 'Conv', 'reason': 'excluded by the user (--exclude)'} \
        in result.float_nodes
    assert result.quantized['Conv'] == 1


@pytest.mark.parametrize('kwargs, error, words', [
    (dict(method='max'), ValueError, ['method', 'minmax']),
    (dict(activation_type='int4'), ValueError, ['activation_type', 'uint8']),
    (dict(exclude='node'), TypeError, ['exclude', 'sequence']),
    (dict(exclude=['no_such_node']), ValueError, ['exclude', 'no_such_node']),
    (dict(calibration=[]), ValueError, ['calibration', 'at least one']),
    (dict(calibration=np.zeros((1, 3, 32, 32), np.float32)), TypeError, ['calibration']),
    (dict(calibration=[np.zeros((3, 32, 32), np.float32)]), ValueError, ['(N, C, H, W)']),
    (dict(model_fp32=42), TypeError, ['model_fp32']),
])
def test_bad_arguments(exported, kwargs, error, words):
    _, proto = exported
    call = dict(model_fp32=proto, calibration=_calibration(1))
    call.update(kwargs)
    with pytest.raises(error) as info:
        quantize_model(call.pop('model_fp32'), call.pop('calibration'), **call)
    assert all(w in str(info.value) for w in words), str(info.value)


def test_uint8_activations(exported):
    target, proto = exported
    result = quantize_model(proto, _calibration(), activation_type='uint8')
    q = result.model
    consts = constant_values(q)
    points = [consts[n.input[2]] for n in q.graph.node if n.op_type == 'QuantizeLinear']
    assert points and all(p.dtype == np.uint8 for p in points)
    assert scale_changes(q) == [] and result.quantized['Conv'] == 2
    assert result.calibration['activation_type'] == 'uint8'
    x = _calibration(1)[0]
    with torch.no_grad():
        expected = _model(target)(torch.from_numpy(x)).numpy()
    got = run_onnx(q, [x])[0]
    assert np.abs(got - expected).max() < 0.1 * np.abs(expected).max()


def test_written_file(tmp_path, exported):
    _, proto = exported
    path = tmp_path / 'int8.onnx'
    result = quantize_model(proto, _calibration(1), path)
    saved = onnx.load(str(path))
    assert len(saved.graph.node) == len(result.model.graph.node)
    weights = [numpy_helper.to_array(t) for t in saved.graph.initializer]
    assert any(w.dtype == np.int8 for w in weights)


def test_lossy_nodes_rank_real_losses_and_leave_out_zero_activations():
    """A branch that is zero on every input (a convolution with zero weights and bias, as
    mmseg's ResNets start the last norm layer of each residual branch) has no signal to
    lose; onnxruntime's ratio for it is 0/0, reported as 0 dB, which would put it first.
    The ranking leaves it out and keeps the activations that carry a signal."""
    from mmseg_cann.onnx.quant_eval import lossy_nodes

    class WithDeadBranch(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.live = nn.Conv2d(3, 4, 3, padding=1)
            self.dead = nn.Conv2d(3, 4, 3, padding=1)
            nn.init.zeros_(self.dead.weight)
            nn.init.zeros_(self.dead.bias)
            self.head = nn.Conv2d(4, 2, 1)

        def forward(self, x):
            return self.head(self.live(x) + self.dead(x))

    proto = export_onnx(WithDeadBranch().eval(), torch.randn(1, 3, 16, 16))
    result = quantize_model(proto, _calibration(2, (1, 3, 16, 16)))
    rows = lossy_nodes(result.prepared, result.model, _calibration(2, (1, 3, 16, 16)), top=10)
    assert rows and all(np.isfinite(r['qdq_sqnr']) and r['qdq_sqnr'] > 10 for r in rows), rows
    producers = {o: n.name for n in result.prepared.graph.node for o in n.output}
    dead = [n.output[0] for n in result.prepared.graph.node
            if n.op_type == 'Conv' and not np.any(constant_values(result.prepared)[n.input[1]])]
    assert dead and not {producers[t] for t in dead} & {r['node'] for r in rows}


def test_logit_stats_weigh_the_error_against_the_float_margins():
    """Near ties, the agreement off them and the logits' SQNR, on logits made by hand: one
    class at zero, the other at margins 0.1, 0.5, 1 and 2 over four pixels."""
    from mmseg_cann.onnx.quant_eval import LogitStats
    ref = np.zeros((1, 2, 1, 4))
    ref[0, 1, 0] = [0.1, 0.5, 1.0, 2.0]
    # an error of 0.3 on the closest pixel flips it; RMS error sqrt(0.09 / 8) = 0.106, so
    # that pixel (margin 0.1) is the one near tie and the other three agree
    got = ref.copy()
    got[0, 1, 0, 0] -= 0.3
    stats = LogitStats()
    stats.add(ref, got)
    summary = stats.summary()
    assert summary['near_tie_pixels'] == 25.0
    assert summary['label_agreement_clear'] == 100.0
    assert summary['logits_sqnr_db'] == round(10 * np.log10((0.01 + 0.25 + 1 + 4) / 0.09), 2)
    # an error of 2.5 on the widest margin flips a clear pixel: RMS sqrt(6.34 / 8) = 0.89
    # makes margins 0.1 and 0.5 near ties, and one of the two clear pixels disagrees
    got[0, 0, 0, 3] += 2.5
    stats = LogitStats()
    stats.add(ref.astype(np.float32), got.astype(np.float32))
    summary = stats.summary()
    assert summary['near_tie_pixels'] == 50.0
    assert summary['label_agreement_clear'] == 50.0
    exact = LogitStats()
    exact.add(ref, ref)
    assert exact.summary() == dict(logits_sqnr_db=float('inf'), near_tie_pixels=0.0,
                                   label_agreement_clear=100.0)
    with pytest.raises(ValueError, match='logits must be'):
        LogitStats().add(ref, got[:, :, :, :2])
    with pytest.raises(ValueError, match='no logits'):
        LogitStats().summary()
