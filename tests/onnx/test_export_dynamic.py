"""Dynamic-shape export (``export_onnx(dynamic=True)``): one graph, run in onnxruntime at
several input sizes (awkward ones included, never only the traced size) and compared with
PyTorch and the float64 reference; the size-dependent rules are refused with a clear
``ValueError``. Many cases share one multi-input graph (one export costs seconds)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from mmseg_cann import CANNAdaptiveAvgPool2d, CANNAvgPool2d, CANNMaxPool2d, CANNUpsample
from mmseg_cann.ops import adaptive_avg_pool2d, geometry as geo, upsample
from tests._helpers import make_input

pytest.importorskip('onnxruntime')
pytest.importorskip('onnxscript')
from mmseg_cann.onnx import export_onnx  # noqa: E402
from mmseg_cann.onnx.export import dynamic_dims, run_onnx  # noqa: E402
from mmseg_cann.onnx.translation import (check_dynamic_upsample,  # noqa: E402
                                         scale_output_size_mismatch)
from tests._helpers import Many  # noqa: E402
from tests._helpers import ort_nearest_indices  # noqa: E402

#: the traced size of every input; the graph is then run at the RUNTIME_SIZES
TRACED = (5, 7)
#: runtime (H, W): H or W = 1, coprime, odd, square, larger than traced, tiny
RUNTIME_SIZES = [(1, 6), (3, 5), (7, 7), (9, 11), (2, 2), (6, 1), (13, 4), (16, 10)]


class ResizeLike(torch.nn.Module):
    """``upsample(x, size=other.shape[-2:])``: mmseg's resize-to-another-tensor pattern."""

    def __init__(self, **kwargs):
        super().__init__()
        self.kwargs = kwargs

    def forward(self, x, other):
        return upsample(x, size=other.shape[-2:], **self.kwargs)


def _run_at_sizes(model, n_inputs, rounds, channels=2, runtime_sizes=None, valid=None):
    """Export ``model`` with dynamic shapes at TRACED, then yield, per round, the
    input sizes, the inputs (input ``i`` of round ``r`` has size
    ``runtime_sizes[(i + r) % len]``, default RUNTIME_SIZES; batch 1 or 2), the PyTorch
    outputs and the onnxruntime outputs. ``valid(i, hw)`` may replace a size PyTorch
    rejects for input ``i`` (e.g. a downscale to an empty output)."""
    runtime_sizes = runtime_sizes or RUNTIME_SIZES
    traced = tuple(make_input((1, channels) + TRACED, seed=i) for i in range(n_inputs))
    proto = export_onnx(model, traced, dynamic=True)
    for dims in dynamic_dims(proto):
        assert all(isinstance(d, str) for d in (dims[0], dims[2], dims[3])), dims
    for r in range(rounds):
        sizes = [runtime_sizes[(i + r) % len(runtime_sizes)] for i in range(n_inputs)]
        if valid is not None:
            sizes = [valid(i, hw) for i, hw in enumerate(sizes)]
        inputs = tuple(make_input((1 + r % 2, channels) + hw, seed=10 * r + i)
                       for i, hw in enumerate(sizes))
        with torch.no_grad():
            expected = model(*inputs)
        expected = (expected,) if isinstance(expected, torch.Tensor) else expected
        yield sizes, inputs, expected, run_onnx(proto, [x.numpy() for x in inputs])


def _tolerance(mode, sizes):
    """As the fixed-shape tests (inputs up to 9 pixels): nearest copies (exact);
    interpolation differs by the float32 rounding of the source coordinate (ONNX
    divides by the scale, PyTorch multiplies by its inverse), a few ulps of the
    coordinate, so the bound grows linearly with the largest input size."""
    if mode in geo.NEAREST_MODES:
        return 0.0
    grow = max(1.0, max(max(hw) for hw in sizes) / 9)
    return (1e-5 if mode == 'bicubic' else 2e-6) * grow


#: (module kwargs) resizing a dynamic input by a scale: ONNX Resize ``scales``
#: (PyTorch's 1/scale rule) or, with recompute_scale_factor, in-graph ``sizes``
SCALE_CASES = (
    [dict(mode=m, align_corners=ac, scale_factor=s) for m in ('bilinear', 'bicubic')
     for ac in (False, True) for s in (2, 0.5, (1.5, 3), 2.5, (0.6, 1.75))]
    + [dict(mode=m, align_corners=ac, scale_factor=s, recompute_scale_factor=True)
       for m in ('bilinear', 'bicubic') for ac in (False, True) for s in (1.5, (0.7, 2.2))]
    + [dict(mode='nearest', scale_factor=s) for s in (2, 3, 0.5, (1.5, 2.5), 8)]
    + [dict(mode='nearest-exact', scale_factor=s) for s in (2, 3, 0.5, (3, 0.25), 8)]
    + [dict(mode='nearest-exact', scale_factor=(0.6, 2.2)),
       dict(mode='bilinear', scale_factor=2, antialias=True),
       dict(mode='bilinear', scale_factor=(1, 2))])


@pytest.mark.slow
def test_dynamic_upsample_by_scale_matches_pytorch():
    model = Many([CANNUpsample(**kw) for kw in SCALE_CASES])

    def valid(i, hw):  # a downscale of a tiny size is empty (PyTorch raises)
        scales = geo.float_pair(SCALE_CASES[i]['scale_factor'], 'scale_factor')
        return tuple(n if math.floor(n * s) >= 1 else math.ceil(1 / s)
                     for n, s in zip(hw, scales))

    for sizes, inputs, expected, got in _run_at_sizes(model, len(SCALE_CASES), rounds=4,
                                                      valid=valid):
        for kw, hw, x, e, g in zip(SCALE_CASES, sizes, inputs, expected, got):
            assert g.shape == tuple(e.shape), (kw, hw)
            err = float(np.abs(e.numpy() - g).max())
            assert err <= _tolerance(kw['mode'], [hw]), (kw, hw, err)
            if kw['mode'] in geo.NEAREST_MODES:  # and the float64 reference agrees
                ref = upsample(x.double(), **kw, backend='reference')
                np.testing.assert_array_equal(ref.float().numpy(), g, err_msg=str((kw, hw)))


#: resizes to a size: another tensor's (dynamic) size, or a fixed size
SIZE_CASES = [dict(mode=m, align_corners=ac) for m in ('bilinear', 'bicubic')
              for ac in (False, True)]


class SizeModels(torch.nn.Module):
    """Input ``2k`` resized to the size of input ``2k + 1`` (case ``k``), then each
    fixed-size case (bilinear/bicubic to 4 x 9, area to 3 x 2) on the last input."""

    def __init__(self):
        super().__init__()
        self.like = torch.nn.ModuleList([ResizeLike(**kw) for kw in SIZE_CASES])
        self.fixed = torch.nn.ModuleList(
            [CANNUpsample(size=(4, 9), **kw) for kw in SIZE_CASES]
            + [CANNUpsample(size=(3, 2), mode='area')])

    def forward(self, *inputs):
        out = [m(inputs[2 * k], inputs[2 * k + 1]) for k, m in enumerate(self.like)]
        return tuple(out + [m(inputs[-1]) for m in self.fixed])


@pytest.mark.slow
def test_dynamic_upsample_to_size_matches_pytorch():
    model = SizeModels()
    n_inputs = 2 * len(SIZE_CASES) + 1
    modes = [kw['mode'] for kw in SIZE_CASES] * 2 + ['area']
    for sizes, inputs, expected, got in _run_at_sizes(model, n_inputs, rounds=4):
        for k, (mode, e, g) in enumerate(zip(modes, expected, got)):
            assert g.shape == tuple(e.shape), (k, sizes)
            err = float(np.abs(e.numpy() - g).max())
            tol = 1e-6 if mode == 'area' else _tolerance(mode, sizes)
            assert err <= tol, (k, sizes, err)


class CeilDivisionSizes(torch.nn.Module):
    """Sizes written as ceiling divisions, ``-((-n) // k)``: torch's size algebra writes
    strided-conv chains this way (ICNet), so the graph's integer ``//`` must floor as
    Python does for negative operands (ONNX ``Div`` truncates)."""

    def forward(self, x):
        h, w = x.shape[-2:]
        return upsample(x, size=(-((-h) // 4), -(w // -3)), mode='bilinear')


def test_dynamic_sizes_with_negative_floor_division():
    for sizes, inputs, expected, got in _run_at_sizes(CeilDivisionSizes(), 1, rounds=8):
        h, w = sizes[0]
        assert got[0].shape[-2:] == (math.ceil(h / 4), math.ceil(w / 3)), sizes
        err = float(np.abs(expected[0].numpy() - got[0]).max())
        assert err <= _tolerance('bilinear', sizes), (sizes, err)


#: pooling settings whose ONNX form is exact for every size (ceil_mode ones only where
#: PyTorch's last-window rule cannot apply: padding <= effective kernel - stride)
POOL_SETTINGS = [
    dict(kernel_size=3, stride=2, padding=1),
    dict(kernel_size=3, stride=2, padding=1, ceil_mode=True),
    dict(kernel_size=5, stride=2, padding=2, ceil_mode=True),
    dict(kernel_size=2, stride=2, ceil_mode=True),
    dict(kernel_size=(3, 2), stride=(2, 1), padding=(1, 0), ceil_mode=True),
    dict(kernel_size=3, stride=2, padding='valid', ceil_mode=True),
    dict(kernel_size=3, stride=2, padding='same'),
    dict(kernel_size=4, stride=3, padding='same_lower'),
    dict(kernel_size=(3, 2), stride=1, padding='same_upper'),
]
#: every runtime size is at least the largest kernel (PyTorch rejects smaller inputs)
POOL_SIZES = [(5, 5), (7, 9), (10, 13), (6, 8), (9, 5), (16, 11)]


@pytest.mark.slow
def test_dynamic_pooling_matches_pytorch():
    modules, kinds = [], []
    for setting in POOL_SETTINGS:
        modules.append(CANNMaxPool2d(**setting))
        kinds.append(('max', setting))
        for cip in (True, False):
            modules.append(CANNAvgPool2d(**setting, count_include_pad=cip))
            kinds.append((f'avg cip={cip}', setting))
    model = Many(modules)
    dropped = 0
    for sizes, inputs, expected, got in _run_at_sizes(model, len(modules), rounds=3,
                                                                runtime_sizes=POOL_SIZES):
        for kind, hw, e, g in zip(kinds, sizes, expected, got):
            assert g.shape == tuple(e.shape), (kind, hw)
            assert float(np.abs(e.numpy() - g).max()) <= 1e-6, (kind, hw)
            setting = kind[1]
            if setting.get('ceil_mode') and not isinstance(setting.get('padding'), str):
                k = geo.int_pair(setting['kernel_size'], 'k')
                s = geo.int_pair(setting['stride'], 's')
                p = geo.int_pair(setting.get('padding', 0), 'p')
                dropped += any(math.ceil((n + 2 * q - kk) / ss) != (n + 2 * q - kk) // ss
                               for n, kk, ss, q in zip(hw, k, s, p))
    assert dropped  # some runtime sizes do round up (ceil differs from floor)


@pytest.mark.slow
def test_dynamic_adaptive_avg_pool_pyramid_bins():
    """PSPNet's pyramid bins 1, 2, 3, 6 (and a non-square one) for any input size,
    divisible or not: bin-averaging matrices built in the graph from the runtime size."""
    bins = [1, 2, 3, 6, (2, 5)]
    model = Many([CANNAdaptiveAvgPool2d(b) for b in bins])
    sizes_seen = set()
    for sizes, inputs, expected, got in _run_at_sizes(model, len(bins), rounds=len(RUNTIME_SIZES),
                                                      channels=3):
        for b, hw, x, e, g in zip(bins, sizes, inputs, expected, got):
            assert g.shape == tuple(e.shape), (b, hw)
            assert float(np.abs(e.numpy() - g).max()) <= 1e-6, (b, hw)
            ref = adaptive_avg_pool2d(x.double(), b, backend='reference')
            assert float(np.abs(ref.numpy() - g).max()) <= 1e-6, (b, hw)
            sizes_seen.add((geo.int_pair(b, 'b'), hw))
    # non-divisible input sizes (bins of unequal, overlapping extent) were covered
    assert any(h % bh or w % bw for (bh, bw), (h, w) in sizes_seen)


def test_dynamic_pooling_graph_is_one_node_per_op():
    x = make_input((1, 2) + TRACED)
    proto = export_onnx(Many([CANNMaxPool2d(3, 2, 1, ceil_mode=True)]), (x,), dynamic=True)
    ops = [n.op_type for n in proto.graph.node]
    assert ops == ['MaxPool']
    proto = export_onnx(Many([CANNAdaptiveAvgPool2d(1)]), (x,), dynamic=True)
    assert [n.op_type for n in proto.graph.node] == ['GlobalAveragePool']


# ----------------------------------------------------------------------------------
# refusals: rules that depend on the concrete size
# ----------------------------------------------------------------------------------
class ForcesSize(torch.nn.Module):
    """Model code that turns the height into a Python int (specialises it)."""

    def forward(self, x):
        return upsample(x, size=(int(x.shape[2]) * 2, 5), mode='bilinear')


class BatchGroupedConv(torch.nn.Module):
    """DMHead's per-sample filters: one depthwise 1x1 filter per sample and channel, as a
    grouped convolution whose ``groups`` is batch x channels (an ONNX attribute)."""

    def forward(self, x):
        n, c, h, w = x.shape
        filters = x.mean((2, 3)).reshape(n * c, 1, 1, 1)
        out = torch.nn.functional.conv2d(x.reshape(1, n * c, h, w), filters, groups=n * c)
        return out.reshape(n, c, h, w)


REFUSED = [
    (ResizeLike(mode='nearest'), 2, 'float32 ratio in/out'),
    (CANNUpsample(scale_factor=1.5, mode='nearest-exact', recompute_scale_factor=True), 1,
     'float32 ratio in/out'),
    (CANNUpsample(scale_factor=1.2, mode='bilinear'), 1, 'keeps small sizes unchanged'),
    (CANNUpsample(scale_factor=2.2, mode='nearest'), 1, 'repeats every input twice'),
    (CANNUpsample(scale_factor=0.7, mode='bilinear'), 1, 'input size 10 PyTorch gives output 7'),
    (CANNUpsample(scale_factor=0.6, mode='nearest'), 1, 'float32 arithmetic'),
    (CANNUpsample(scale_factor=1.5, mode='nearest-exact'), 1, 'rounding tie'),
    (ResizeLike(mode='bilinear', antialias=True), 2, 'antialias'),
    (CANNUpsample(scale_factor=0.5, mode='area'), 1, 'area resizing by a scale'),
    (CANNMaxPool2d(2, 2, 1, ceil_mode=True), 1, 'depends on the size'),
    (CANNAvgPool2d(4, 3, 2, ceil_mode=True), 1, "depends on the size"),
    (CANNAdaptiveAvgPool2d((None, 3)), 1, 'depends on the dynamic input'),
    (CANNMaxPool2d(1, 3, 'same'), 1, 'kernel smaller than the stride'),
    (ForcesSize(), 1, 'came out with fixed height'),
    (BatchGroupedConv(), 1, r'aten.conv2d.default cannot be exported .*attribute \(group\)'),
]


@pytest.mark.parametrize('module,n_inputs,message', REFUSED,
                         ids=[f'{type(m).__name__}-{i}' for i, (m, _, _) in enumerate(REFUSED)])
def test_size_dependent_rules_are_refused(module, n_inputs, message):
    inputs = tuple(make_input((1, 2) + TRACED, seed=i) for i in range(n_inputs))
    with pytest.raises(ValueError, match=message) as info:
        export_onnx(module.eval(), inputs, dynamic=True)
    text = str(info.value)
    # says what to do instead
    assert 'fixed shapes' in text or 'dynamic=False' in text or 'fixed input sizes' in text
    # and the same module exports with fixed shapes where ONNX can express it
    if message in ('keeps small sizes unchanged', 'repeats every input twice', 'area'):
        export_onnx(module.eval(), inputs)


def test_batch_grouped_conv_exports_with_fixed_shapes():
    """The refused attribute is a constant in a fixed-shape graph, which is exact."""
    x = make_input((2, 3) + TRACED)
    proto = export_onnx(BatchGroupedConv().eval(), (x,))
    with torch.no_grad():
        expected = BatchGroupedConv()(x)
    got = run_onnx(proto, [x.numpy()])[0]
    assert float(np.abs(got - expected.numpy()).max()) <= 1e-6


# ----------------------------------------------------------------------------------
# the size-independent decisions (geometry's: tests/ops/test_geometry_symbolic.py)
# ----------------------------------------------------------------------------------
def test_scale_output_size_rule():
    assert scale_output_size_mismatch(0.7) == (10, 7, 6)
    for scale in (2.0, 0.5, 1.5, 2.5, 0.25, 8.0, 1.75, 0.6):
        assert scale_output_size_mismatch(scale) is None, scale


def test_check_dynamic_upsample_passes_exact_cases():
    for kw in SCALE_CASES:
        args = geo.check_upsample_args(**kw)
        check_dynamic_upsample(geo.upsample_spec((5, 7), args))


def test_static_nearest_shortcut_axes():
    """Fixed shapes: legacy nearest copies an axis whose size is kept and repeats every
    input twice at out == 2 * in, whatever the scale; ONNX Resize needs scale 1 / 2
    there (onnxruntime copies an axis only when the whole tensor keeps its shape)."""
    cases = [((10, 3), (0.5, 1.2)), ((2, 5), (0.5, 2.1)), ((4, 6), (2.2, 1.1))]
    model = Many([CANNUpsample(scale_factor=s, mode='nearest') for _, s in cases])
    inputs = tuple(make_input((1, 2) + hw, seed=i) for i, (hw, _) in enumerate(cases))
    proto = export_onnx(model, inputs)
    with torch.no_grad():
        expected = model(*inputs)
    for case, e, g in zip(cases, expected, run_onnx(proto, [x.numpy() for x in inputs])):
        np.testing.assert_array_equal(e.numpy(), g, err_msg=str(case))


class FusedDecoder(torch.nn.Module):
    """FPN-style ``upsample_add(coarse, lateral)`` then ``upsample_argmax`` of the sum to
    the image size: both sizes come from other (dynamic) tensors."""

    def __init__(self, align_corners):
        super().__init__()
        self.ac = align_corners

    def forward(self, coarse, lateral, image):
        from mmseg_cann.ops import upsample_add, upsample_argmax
        merged = upsample_add(coarse, lateral, 'bilinear', self.ac)
        return merged, upsample_argmax(merged, image.shape[-2:], 'bilinear', self.ac)


@pytest.mark.parametrize('align_corners', [False, True])
def test_dynamic_fused_ops_export_as_unfused(align_corners):
    model = FusedDecoder(align_corners).eval()
    traced = (make_input((1, 4, 5, 7)), make_input((1, 4, 9, 13), seed=1),
              make_input((1, 3, 33, 50), seed=2))
    proto = export_onnx(model, traced, dynamic=True)
    for sizes in [((3, 4), (6, 8), (24, 31)), ((7, 2), (13, 3), (50, 12)),
                  ((1, 5), (2, 9), (16, 64))]:
        inputs = tuple(make_input((2, c) + hw, seed=k)
                       for k, (c, hw) in enumerate(zip((4, 4, 3), sizes)))
        with torch.no_grad():
            merged, labels = model(*inputs)
        got_merged, got_labels = run_onnx(proto, [x.numpy() for x in inputs])
        assert float(np.abs(merged.numpy() - got_merged).max()) <= _tolerance(
            'bilinear', sizes[:2]), sizes
        assert got_labels.dtype == np.int64 and got_labels.shape == tuple(labels.shape)
        # labels equal wherever the two best classes are further apart than the rounding
        up = upsample(merged, size=sizes[2], mode='bilinear', align_corners=align_corners)
        top2 = up.topk(2, dim=1).values
        decided = ((top2[:, 0] - top2[:, 1]) > 1e-5).numpy()
        assert decided.mean() > 0.95
        assert not ((got_labels != labels.numpy()) & decided).any(), sizes


def test_emulated_scale_nearest_indices_match_onnxruntime():
    """The dynamic legacy-nearest check models onnxruntime's index for ``scales``
    (:func:`onnx_nearest_indices` with a scale, ``floor(d / scale)`` in float32); it
    must be what onnxruntime does, including for the refused scales 0.6 and 0.3."""
    from mmseg_cann.onnx.translation import onnx_nearest_indices
    for scale in (0.3, 0.6, 1.5, 1.75, 2.5, 3.0, 8.0, 0.15, 4.7):
        for n_in in (7, 40, 333, 2049):
            n_out = geo.upsample_output_size(n_in, scale)
            got = ort_nearest_indices(n_in, False, scale=scale)
            np.testing.assert_array_equal(onnx_nearest_indices(n_in, n_out, scale, False),
                                          got, err_msg=f'{n_in} x {scale}')


def test_nearest_exact_ties_are_what_differs():
    """Where onnxruntime's nearest-exact index for ``scales`` differs from PyTorch's,
    the source coordinate is at a rounding tie, so refusing tied scales
    (:func:`nearest_exact_tie`) covers every difference; tie-free scales agree."""
    from mmseg_cann.onnx.translation import nearest_exact_tie
    from mmseg_cann.core.reference import nearest_indices
    differing = 0
    for scale in (0.3, 0.6, 1.5, 1.75, 2.5, 3.0, 0.1, 0.9, 2.9, 3.3, 0.15, 0.55, 0.25, 8.0):
        tie = nearest_exact_tie(scale)
        for n_in in (7, 40, 333, 2049):
            n_out = geo.upsample_output_size(n_in, scale)
            got = ort_nearest_indices(n_in, True, scale=scale)
            want = nearest_indices(n_in, n_out, scale, True)
            if not np.array_equal(got, want):
                differing += 1
                d = int(np.flatnonzero(got != want)[0])
                assert tie is not None and tie <= d, (scale, n_in, d)
            if tie is None:
                np.testing.assert_array_equal(got, want, err_msg=f'{n_in} x {scale}')
    assert differing  # the refused cases are real


def test_static_scale_whose_onnx_output_size_differs_is_refused():
    # floor(10 * 0.7) is 7 in PyTorch (double) but 6 in ONNX's shape inference
    with pytest.raises(ValueError, match='cannot be exported exactly'):
        export_onnx(CANNUpsample(scale_factor=0.7, mode='bilinear'), make_input((1, 2, 10, 10)))
