"""The domain of a dynamic export (``mmseg_cann.onnx.dynamic_domain``): the sizes where the
model's size branches went as traced. Inside, the graph is exact; outside, the package's
runners refuse the run with a ``ValueError`` naming the input, its size and the guard
(never an onnxruntime error or wrong values); a dim the guards pin to the traced size is
refused at export."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

pytest.importorskip('onnxruntime')
pytest.importorskip('onnxscript')
import onnx  # noqa: E402

from mmseg_cann.onnx import check_dynamic_domain, export_onnx, verify_onnx  # noqa: E402
from mmseg_cann.onnx.dynamic_domain import (METADATA_KEY, DomainInput,  # noqa: E402
                                            DynamicDomain, attach_domain, input_sources,
                                            pinned_dims, read_domain)
from mmseg_cann.onnx.runtime import run_onnx  # noqa: E402

#: float32 rounding of these small models (PyTorch vs onnxruntime)
ATOL = 1e-5


class ResizeBack(torch.nn.Module):
    """Halve, double, and resize back to the input size only when the sizes differ: at
    an even traced size the graph has no second resize, PyTorch takes it at odd sizes."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(2, 2, 3, 2, 1)

    def forward(self, x):
        y = F.interpolate(self.conv(x), scale_factor=2, mode='bilinear')
        if y.shape != x.shape:
            y = F.interpolate(y, size=x.shape[2:], mode='bilinear')
        return x + y


class BatchBranch(torch.nn.Module):
    def forward(self, x):
        if x.shape[0] == 1:
            return x * 2
        return x * 3


class BatchIntoChannels(torch.nn.Module):
    """Folds the batch into the channels with a fixed count (valid for batch 1 only)."""

    def forward(self, x):
        return x.reshape(1, 2, x.shape[2], x.shape[3]) * 2


class NoBranch(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(2, 3, 3, 1, 1)

    def forward(self, x):
        y = F.relu(self.conv(x))
        return F.interpolate(y, scale_factor=2, mode='bilinear') * 0.5 + 1


class ImageAndFeats(torch.nn.Module):
    """An image and ``*feats`` (as the model sweep's ``ModelAndHead``), with a branch on
    the second map's size."""

    def forward(self, image, *feats):
        out = feats[1]
        if out.shape[2] != feats[0].shape[2]:
            out = F.interpolate(out, size=feats[0].shape[2:], mode='bilinear')
        return image.mean(), feats[0] + out


def _torch(model, *inputs):
    with torch.no_grad():
        out = model(*inputs)
    return [t.numpy() for t in (out if isinstance(out, tuple) else (out,))]


def _max_error(model, proto, *inputs):
    got = run_onnx(proto, [t.numpy() for t in inputs])
    return max(float(np.abs(g - e).max()) for g, e in zip(got, _torch(model, *inputs)))


@pytest.fixture(scope='module')
def resize_back():
    torch.manual_seed(0)
    model = ResizeBack().eval()
    return model, export_onnx(model, torch.randn(1, 2, 8, 8), dynamic=True)


def test_domain_states_the_branch(resize_back):
    _, proto = resize_back
    domain = read_domain(proto)
    assert [i.name for i in domain.inputs] == ['input']
    assert domain.inputs[0].source == "L['x']"
    assert sorted(axis for g in domain.guards for axis in (2, 3)
                  if f"L['x'].size()[{axis}]" in g) == [2, 3]
    assert all('input.shape[' in c for c in domain.conditions())


@pytest.mark.parametrize('shape', [(1, 2, 8, 8), (1, 2, 8, 12), (2, 2, 2, 4), (3, 2, 16, 6)])
def test_inside_the_domain_exact(resize_back, shape):
    model, proto = resize_back
    x = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    assert _max_error(model, proto, x) <= ATOL
    (r,) = verify_onnx(proto, model, [x])
    assert r['max_abs'] <= ATOL


@pytest.mark.parametrize('shape, axis', [((1, 2, 7, 7), 2), ((2, 2, 6, 9), 3),
                                         ((1, 2, 5, 8), 2)])
def test_outside_the_domain_refused(resize_back, shape, axis):
    model, proto = resize_back
    x = torch.randn(shape)
    for run in (lambda: run_onnx(proto, [x.numpy()]), lambda: verify_onnx(proto, model, [x]),
                lambda: check_dynamic_domain(proto, {'input': shape})):
        with pytest.raises(ValueError, match='outside the sizes this dynamic graph holds') as e:
            run()
        assert "input 'input'" in str(e.value) and str(shape) in str(e.value)
        assert f'input.shape[{axis}]' in str(e.value) and 'dynamic=False' in str(e.value)


def test_outside_the_domain_the_graph_is_wrong(resize_back):
    """Without its domain the graph runs the traced branch at an odd size: onnxruntime
    fails or differs from PyTorch (what the refusal prevents)."""
    model, proto = resize_back
    bare = onnx.ModelProto.FromString(proto.SerializeToString())
    del bare.metadata_props[:]
    x = torch.randn(1, 2, 7, 7)
    try:
        error = _max_error(model, bare, x)
    except Exception:  # noqa: BLE001 - onnxruntime rejects the shapes
        return
    assert error > ATOL


def test_domain_round_trip(resize_back, tmp_path):
    _, proto = resize_back
    path = tmp_path / 'resize_back.onnx'
    onnx.save(proto, str(path))
    loaded = onnx.load(str(path))
    assert read_domain(loaded) == read_domain(proto)
    check_dynamic_domain(loaded, [(2, 2, 10, 4)])
    with pytest.raises(ValueError, match=r'\(1, 2, 9, 4\)'):
        check_dynamic_domain(loaded, [(1, 2, 9, 4)])


@pytest.mark.parametrize('module, guard', [
    (BatchBranch(), "guard input.shape[0] == 1"), (BatchIntoChannels(), None)])
def test_batch_pinned_by_the_model_refused(module, guard):
    with pytest.raises(ValueError, match='came out with fixed batch') as e:
        export_onnx(module.eval(), torch.randn(1, 2, 8, 8), dynamic=True)
    assert "input 'input'" in str(e.value) and 'dynamic=False' in str(e.value)
    if guard is not None:
        assert guard in str(e.value)


def test_without_branches_every_size():
    torch.manual_seed(0)
    model = NoBranch().eval()
    proto = export_onnx(model, torch.randn(1, 2, 5, 7), dynamic=True)
    # what it states excludes empty inputs at most (``1 < 3*H*W``)
    for n in (1, 2, 3):
        for h in range(1, 17):
            for w in range(1, 17):
                check_dynamic_domain(proto, [(n, 2, h, w)])
    for k, shape in enumerate([(1, 2, 1, 1), (2, 2, 3, 8), (1, 2, 5, 7), (3, 2, 16, 9),
                               (1, 2, 33, 2), (2, 2, 64, 48)]):
        check_dynamic_domain(proto, [shape])
        x = torch.randn(shape, generator=torch.Generator().manual_seed(k))
        assert _max_error(model, proto, x) <= ATOL, shape


def test_var_positional_inputs_named_as_torch_names_them():
    model = ImageAndFeats().eval()
    inputs = (torch.randn(1, 3, 8, 8), torch.randn(1, 2, 8, 8), torch.randn(1, 2, 8, 8))
    assert input_sources(model.forward, inputs) == [
        "L['image']", "L['feats'][0]", "L['feats'][1]"]
    proto = export_onnx(model, inputs, dynamic=True, input_names=('image', 'f0', 'f1'))
    domain = read_domain(proto)
    assert [i.source for i in domain.inputs] == input_sources(model.forward, inputs)
    assert any("L['feats'][1].size()[2]" in g for g in domain.guards), domain.guards
    shapes = [(1, 3, 4, 4), (1, 2, 6, 5), (1, 2, 6, 5)]
    got = run_onnx(proto, [torch.randn(s).numpy() for s in shapes])
    assert got[1].shape == (1, 2, 6, 5)
    with pytest.raises(ValueError, match=r"inputs 'f0' of shape \(1, 2, 6, 5\), "
                                         r"'f1' of shape \(1, 2, 3, 5\)"):
        run_onnx(proto, [torch.randn(s).numpy() for s in
                         [(1, 3, 4, 4), (1, 2, 6, 5), (1, 2, 3, 5)]])


def _domain(guards, ranges=((0, None), (2, 2), (0, None), (0, None))):
    return DynamicDomain((DomainInput('input', "L['x']", tuple(ranges)),), tuple(guards))


def test_pinned_dims_from_guards_and_ranges():
    traced = {"L['x']": [1, 2, 8, 8]}
    assert pinned_dims(_domain(["L['x'].size()[0] <= 1", "L['x'].size()[0] == 1"]),
                       traced) == [(0, 0, ["guard L['x'].size()[0] <= 1", "guard L['x'].size()[0] == 1"])]
    # pinned through a product (BatchIntoChannels' reshape)
    product = ("2*L['x'].size()[3]*L['x'].size()[2]*L['x'].size()[0] == "
               "2*L['x'].size()[3]*L['x'].size()[2]")
    assert [p[:2] for p in pinned_dims(_domain([product]), traced)] == [(0, 0)]
    assert pinned_dims(_domain([], ((1, 1), (2, 2), (0, None), (0, None))), traced) == \
        [(0, 0, ['range [1, 1]'])]
    # narrowed, not pinned: a minimum, a multiple, a relation between two dims
    assert pinned_dims(_domain(["L['x'].size()[2] >= 8", "L['x'].size()[3] % 4 == 0",
                                "L['x'].size()[2] == L['x'].size()[3]"]), traced) == []


def test_ranges_and_unreadable_guards_refused_at_run():
    proto = onnx.ModelProto()
    attach_domain(proto, _domain(["L['x'].stride()[0] == 1"],
                                 ((1, 2), (2, 2), (33, None), (0, None))))
    with pytest.raises(ValueError, match=r"its batch 3 is outside 1 to 2"):
        check_dynamic_domain(proto, [(3, 2, 40, 40)])
    with pytest.raises(ValueError, match=r"its height 32 is outside at least 33"):
        check_dynamic_domain(proto, [(1, 2, 32, 40)])
    with pytest.raises(ValueError, match='cannot be checked'):
        check_dynamic_domain(proto, [(1, 2, 40, 40)])
    with pytest.raises(ValueError, match=r"shapes must name the graph inputs \['input'\]"):
        check_dynamic_domain(proto, {'x': (1, 2, 40, 40)})


def test_metadata_not_a_domain_refused():
    proto = onnx.ModelProto()
    proto.metadata_props.add(key=METADATA_KEY, value='{"format": 1}')
    with pytest.raises(ValueError, match='not a dynamic domain written by mmseg_cann'):
        read_domain(proto)
    check_dynamic_domain(onnx.ModelProto(), [(1, 2, 3, 4)])  # no domain: nothing to check
