"""mmcv's PSAMask in an export (:mod:`mmseg_cann.onnx.mmcv_ops`): the portable form is the
kernel's result bit for bit, and a PSANet head exports as a compact graph -- fixed or
dynamic -- that onnxruntime runs exactly at other sizes, where the kernel traced element by
element gave thousands of nodes for the traced size only."""
from __future__ import annotations

import collections
import itertools

import numpy as np
import pytest
import torch

pytest.importorskip('onnxruntime')
pytest.importorskip('onnxscript')
mmcv_ops = pytest.importorskip('mmcv.ops')
from mmseg_cann.onnx import check_dynamic_domain, export_onnx  # noqa: E402
from mmseg_cann.onnx.export import dynamic_dims, run_onnx  # noqa: E402
from mmseg_cann.onnx.mmcv_ops import portable_mmcv_ops, psa_mask  # noqa: E402

#: mask sizes (odd, even, 1x1, wider than tall) and map sizes (the mask covering the map,
#: and maps larger than the mask: entries outside the window are zero)
MASKS = [(5, 5), (13, 13), (3, 7), (4, 6), (1, 1), (2, 3)]
MAPS = [(1, 1), (4, 4), (3, 5), (7, 2), (9, 11)]


@pytest.mark.parametrize('psa_type', ['collect', 'distribute'])
def test_psa_mask_is_mmcvs_bit_for_bit(psa_type):
    g = torch.Generator().manual_seed(0)
    for (hm, wm), (h, w) in itertools.product(MASKS, MAPS):
        x = torch.randn(2, hm * wm, h, w, generator=g)
        expected = mmcv_ops.PSAMask(psa_type, (hm, wm))(x)
        assert torch.equal(psa_mask(x, psa_type, (hm, wm)), expected), (hm, wm, h, w)
    # batch 0, float64, and negative values (a zero fill must be +0.0, as mmcv's)
    for x in [torch.randn(0, 9, 4, 5), torch.randn(1, 9, 4, 5, dtype=torch.float64),
              -torch.rand(1, 9, 4, 5)]:
        expected = mmcv_ops.PSAMask(psa_type, (3, 3))(x)
        got = psa_mask(x, psa_type, (3, 3))
        assert got.dtype == expected.dtype and torch.equal(got, expected), x.shape
        assert torch.equal(got.signbit(), expected.signbit())


def test_psa_mask_refuses_what_mmcv_does_not_take():
    with pytest.raises(ValueError, match='channels'):
        psa_mask(torch.zeros(1, 24, 4, 4), 'collect', (5, 5))
    with pytest.raises(ValueError, match='psa_type'):
        psa_mask(torch.zeros(1, 25, 4, 4), 'bi-direction', (5, 5))
    with pytest.raises(ValueError, match='4-D tensor'):
        psa_mask(torch.zeros(25, 4, 4), 'collect', (5, 5))


class Head(torch.nn.Module):
    def __init__(self, head):
        super().__init__()
        self.head = head

    def forward(self, x):
        return self.head([x])


def _psa_head(psa_type='bi-direction'):
    from mmseg.models.decode_heads import PSAHead
    torch.manual_seed(0)
    return Head(PSAHead(in_channels=16, channels=8, num_classes=3, mask_size=(13, 13),
                        psa_type=psa_type, in_index=0)).eval()


def _feature(hw, seed):
    return torch.randn((1, 16) + hw, generator=torch.Generator().manual_seed(seed))


def _max_error(proto, model, x):
    with torch.no_grad():
        expected = model(x).numpy()
    got = run_onnx(proto, [x.numpy()])[0]
    assert got.shape == expected.shape
    return float(np.abs(got - expected).max())


@pytest.mark.slow
@pytest.mark.parametrize('psa_type', ['bi-direction', 'collect'])
def test_psa_head_dynamic_export_is_compact_and_exact(psa_type):
    model = _psa_head(psa_type)
    proto = export_onnx(model, _feature((16, 16), 0), dynamic=True)
    ops = collections.Counter(n.op_type for n in proto.graph.node)
    # the kernel traced element by element: (8*8)**2 copies per mask at this size
    assert len(proto.graph.node) < 300 and 'ScatterElements' not in ops, ops
    assert all(isinstance(d, str) for d in dynamic_dims(proto)[0][2:])
    psamasks = [m for m in model.modules() if isinstance(m, mmcv_ops.PSAMask)]
    assert psamasks and all('forward' not in vars(m) for m in psamasks)  # restored
    # maps 6x10 and 14x14 after the head's shrink by 2 (14x14: the 13x13 mask window
    # leaves entries out)
    for k, hw in enumerate([(12, 20), (28, 28)]):
        x = _feature(hw, k + 1)
        check_dynamic_domain(proto, [tuple(x.shape)])
        assert _max_error(proto, model, x) <= 1e-5, hw
    # PSAHead branches on the map's parity (odd height and width: align_corners=True):
    # outside the traced branch the graph is refused at that size
    with pytest.raises(ValueError, match='outside the sizes'):
        check_dynamic_domain(proto, [(1, 16, 15, 17)])


@pytest.mark.slow
def test_psa_head_fixed_export_is_compact_and_exact():
    model = _psa_head()
    x = _feature((24, 20), 0)
    proto = export_onnx(model, x)
    assert len(proto.graph.node) < 300
    assert _max_error(proto, model, x) <= 1e-5


def test_portable_mmcv_ops_leaves_a_module_without_psamask_alone():
    model = torch.nn.Conv2d(1, 1, 1)
    with portable_mmcv_ops(model):
        assert 'forward' not in vars(model)


def test_portable_mmcv_ops_patches_mmcvs_forward_only():
    """A subclass overriding ``forward`` and an instance with its own ``forward`` keep
    their code; a shared instance is patched once and restored; hooks still run."""
    class Scaled(mmcv_ops.PSAMask):
        def forward(self, input):
            return 2 * super().forward(input)

    plain, scaled, own = (mmcv_ops.PSAMask('collect', (3, 3)), Scaled('collect', (3, 3)),
                          mmcv_ops.PSAMask('collect', (3, 3)))
    own.forward = lambda input: input
    model = torch.nn.ModuleList([plain, scaled, own, plain])
    calls = []
    plain.register_forward_hook(lambda *args: calls.append(1))
    x = torch.randn(1, 9, 4, 4)
    with portable_mmcv_ops(model):
        assert 'forward' in vars(plain)
        assert 'forward' not in vars(scaled) and vars(own)['forward'](x) is x
        assert torch.equal(plain(x), psa_mask(x, 'collect', (3, 3)))
        assert torch.equal(scaled(x), 2 * mmcv_ops.PSAMask('collect', (3, 3))(x))
    assert calls == [1]
    assert 'forward' not in vars(plain) and 'forward' in vars(own)


class _PSAMaskOnly(torch.nn.Module):
    def __init__(self, psa_type='collect', mask_size=(5, 5)):
        super().__init__()
        self.psa = mmcv_ops.PSAMask(psa_type, mask_size)

    def forward(self, x):
        return self.psa(x)


#: what a fixed-shape PSAMask export may hold: the gather and, on maps too large for the
#: exporter's optimiser to fold the index into a constant, the index's integer arithmetic
PSA_FIXED_OPS = {'Reshape', 'Pad', 'GatherElements', 'Transpose', 'And', 'Cast', 'Mul', 'Add',
                 'Sub', 'Unsqueeze', 'Expand'}


@pytest.mark.parametrize('psa_type', ['collect', 'distribute'])
def test_psa_mask_exports_to_ops_atc_parses(psa_type):
    """Fixed shape (what ``--target atc`` compiles): the zero-channel pad, one
    GatherElements and integer arithmetic; no select (``Where``) in either form."""
    model = _PSAMaskOnly(psa_type)
    for hw in [(8, 8), (32, 32)]:  # the index folded into a constant, then not
        x = torch.randn((1, 25) + hw)
        proto = export_onnx(model, x)
        fixed = collections.Counter(n.op_type for n in proto.graph.node)
        assert set(fixed) <= PSA_FIXED_OPS and fixed['GatherElements'] == 1, (hw, fixed)
        with torch.no_grad():
            assert np.array_equal(run_onnx(proto, [x.numpy()])[0], model(x).numpy()), hw
    x = torch.randn(1, 25, 8, 8)
    dynamic = export_onnx(model, x, dynamic=True)
    assert 'Where' not in {n.op_type for n in dynamic.graph.node}
    for hw in [(3, 5), (11, 9)]:
        y = torch.randn((1, 25) + hw)
        with torch.no_grad():
            assert np.array_equal(run_onnx(dynamic, [y.numpy()])[0], model(y).numpy()), hw
