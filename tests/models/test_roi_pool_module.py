"""CANNRoIPool2d: built from configs through mmseg's MODELS, the op's results, settings
checked when built, copies, and what mmcv's RoI ops do on a CPU (why the op exists)."""
from __future__ import annotations

import copy
import pickle

import pytest
import torch
import torch.nn.functional as F

from mmseg_cann.models import CANNRoIPool2d
from mmseg_cann.ops import roi_pool2d

X = torch.randn(2, 4, 12, 12, generator=torch.Generator().manual_seed(0))
ROIS = torch.tensor([[0., 0, 0, 7, 5], [1, 2, 3, 11, 11], [0, 4, 4, 4, 9]])


def test_built_from_a_config_in_mmseg_and_root_registries():
    from mmengine.registry import MODELS as ROOT
    from mmseg.registry import MODELS
    cfg = dict(type='CANNRoIPool2d', output_size=(3, 2), spatial_scale=0.5, mode='avg',
               precision='fp32', backend='native')
    for registry in (MODELS, ROOT):
        module = registry.build(cfg)
        assert isinstance(module, CANNRoIPool2d)
        rois = ROIS.clone()
        rois[:, 1:] *= 2
        assert torch.equal(module(X, rois), roi_pool2d(X, ROIS, (3, 2), 'avg'))


@pytest.mark.parametrize('mode', ['max', 'avg'])
def test_forward_is_the_op_and_matches_adaptive_pooling(mode):
    module = CANNRoIPool2d(3, mode=mode)
    out = module(X, ROIS)
    pool = F.adaptive_max_pool2d if mode == 'max' else F.adaptive_avg_pool2d
    ref = torch.stack([pool(X[b, :, y1:y2 + 1, x1:x2 + 1], 3)
                       for b, x1, y1, x2, y2 in ROIS.long().tolist()])
    assert torch.equal(out, ref)
    assert torch.equal(out, roi_pool2d(X, ROIS, 3, mode))


def test_return_indices_and_gradients():
    module = CANNRoIPool2d(2, return_indices=True)
    x = X.clone().requires_grad_()
    out, index = module(x, ROIS)
    assert index.dtype == torch.int64 and index.shape == out.shape
    out.sum().backward()
    assert x.grad is not None and float(x.grad.sum()) == out.numel()


@pytest.mark.parametrize('kwargs, exc', [
    (dict(output_size=0), ValueError), (dict(output_size='7'), TypeError),
    (dict(output_size=7, spatial_scale=-1.0), ValueError),
    (dict(output_size=7, mode='sum'), ValueError),
    (dict(output_size=7, mode='avg', return_indices=True), ValueError),
    (dict(output_size=7, precision='fp64'), ValueError),
    (dict(output_size=7, backend='tuned'), ValueError),
])
def test_settings_are_checked_when_built(kwargs, exc):
    with pytest.raises(exc):
        CANNRoIPool2d(**kwargs)


def test_repr_copies_and_no_state():
    module = CANNRoIPool2d((7, 5), 1 / 16, 'avg', precision='fp32', backend='fast')
    assert repr(module) == ("CANNRoIPool2d(output_size=(7, 5), spatial_scale=0.0625, "
                            "mode='avg', precision='fp32', backend='fast')")
    assert module.state_dict() == {}
    boxes = torch.cat([ROIS[:, :1], ROIS[:, 1:] * 16], 1)
    for clone in (copy.deepcopy(module), pickle.loads(pickle.dumps(module))):
        assert torch.equal(clone(X, boxes), module(X, boxes))
    module.mode = 'max'  # settings are read at every call
    assert torch.equal(module(X, boxes), roi_pool2d(X, boxes, (7, 5), 'max', 1 / 16))


def test_jit_script_is_refused_with_a_message_naming_what_works():
    with pytest.raises(RuntimeError, match='torch.jit.script') as error:
        torch.jit.script(CANNRoIPool2d(2))
    message = str(error.value)
    # each path named here is tested below, with other boxes than the ones traced
    for path in ('torch.jit.trace', 'torch.export.export', 'torch.compile',
                 'fullgraph=True', 'torch.fx.symbolic_trace'):
        assert path in message


class _Head(torch.nn.Module):
    """Features (a convolution: its output needs a gradient) -> ROI pooling -> scores."""

    def __init__(self, mode, return_indices=False):
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(4, 3, 3, padding=1)
        self.pool = CANNRoIPool2d((3, 2), 0.5, mode, return_indices)

    def forward(self, x, rois):
        pooled = self.pool(self.conv(x), rois)
        if self.pool.return_indices:  # a setting, not the result's type: FX traces this
            return pooled[0].flatten(1).sum(1), pooled[1]
        return pooled.flatten(1).sum(1)


def _boxes(k, seed):
    """``k`` boxes (image coordinates, scale 0.5): some partly outside, some reversed."""
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(k, 4, generator=g) * 30 - 3
    return torch.cat([torch.randint(0, 2, (k, 1), generator=g).float(), xy], 1)


def _graphs(head):
    """``name -> graph`` of ``head`` made with ROIS-like boxes (3 of them)."""
    boxes = _boxes(3, 0)
    with torch.no_grad():
        traced = torch.jit.trace(head, (X, boxes))
    exported = torch.export.export(head, (X, boxes),
                                   dynamic_shapes=({}, {0: torch.export.Dim('k')}))
    torch._dynamo.reset()
    compiled = torch.compile(head, fullgraph=True, backend='eager')
    return {'torch.jit.trace': traced, 'torch.export.export': exported.module(),
            'torch.compile(fullgraph=True)': compiled,
            'torch.fx.symbolic_trace': torch.fx.symbolic_trace(head)}


def _same(a, b):
    if isinstance(a, tuple):
        return len(a) == len(b) and all(map(_same, a, b))
    return a.dtype == b.dtype and torch.equal(a, b)


@pytest.mark.parametrize('mode, return_indices', [('max', False), ('avg', False),
                                                  ('max', True)])
def test_graphs_read_the_boxes_when_they_run(mode, return_indices):
    """Every graph the jit.script message names gives the eager values for other boxes
    (and another number of them) than those it was made with."""
    head = _Head(mode, return_indices)
    for name, graph in _graphs(head).items():
        for k, seed in ((3, 0), (5, 1), (1, 2)):
            boxes = _boxes(k, seed)
            with torch.no_grad():
                assert _same(graph(X, boxes), head(X, boxes)), (name, k)


@pytest.mark.parametrize('name', ['torch.jit.trace', 'torch.export.export', 'torch.compile'])
def test_graphs_hold_one_call_of_the_registered_op(name):
    head, boxes = _Head('avg'), _boxes(3, 0)
    if name == 'torch.jit.trace':
        with torch.no_grad():
            traced = torch.jit.trace(head, (X, boxes))
        kinds = [n.kind() for n in traced.inlined_graph.nodes()]
        assert kinds.count('mmseg_cann::roi_pool2d') == 1
    elif name == 'torch.export.export':
        graph = torch.export.export(head, (X, boxes)).graph
        targets = [n.target for n in graph.nodes if n.op == 'call_function']
        assert targets.count(torch.ops.mmseg_cann.roi_pool2d.default) == 1
    else:
        torch._dynamo.reset()
        with torch.no_grad():
            explanation = torch._dynamo.explain(head)(X, boxes)
        assert explanation.graph_count == 1 and explanation.graph_break_count == 0


@pytest.mark.parametrize('mode', ['max', 'avg'])
def test_training_under_torch_compile_runs_the_op_eagerly(mode):
    """An input that needs a gradient: the op runs between graphs, the gradients are the
    eager ones; fullgraph=True refuses (dynamo's Unsupported) rather than drop them."""
    head, boxes = _Head(mode), _boxes(6, 3)
    head(X, boxes).sum().backward()
    expected = [p.grad.clone() for p in head.parameters()]
    head.zero_grad()
    torch._dynamo.reset()
    torch.compile(head, backend='eager')(X, boxes).sum().backward()
    assert all(torch.equal(p.grad, e) for p, e in zip(head.parameters(), expected))
    torch._dynamo.reset()
    with pytest.raises(Exception, match='disable'):
        torch.compile(head, fullgraph=True, backend='eager')(X, boxes)


def test_backward_through_an_inference_graph_raises_a_message():
    head, boxes = _Head('max'), _boxes(3, 0)
    traced = torch.jit.trace(head, (X, boxes))
    with pytest.raises(RuntimeError, match='gradient of ROI pooling recorded'):
        traced(X, boxes).sum().backward()


def test_mmcv_roi_ops_on_cpu():
    """mmcv's RoIPool has no CPU kernel; RoIAlign samples bilinearly (other values)."""
    from mmcv.ops import RoIAlign, RoIPool
    x = torch.arange(36.).view(1, 1, 6, 6)
    rois = torch.tensor([[0., 0, 0, 3, 3]])
    with pytest.raises(RuntimeError, match='implementation for device cpu not found'):
        RoIPool(2, 1.0)(x, rois)
    align = RoIAlign(2, 1.0, sampling_ratio=0, pool_mode='avg', aligned=False)(x, rois)
    ours = CANNRoIPool2d(2, mode='avg')(x, rois)
    assert ours.flatten().tolist() == [3.5, 5.5, 15.5, 17.5]
    assert not torch.equal(align, ours)


def test_torch_compile_runs_the_op_eagerly_inside_a_graph():
    module = CANNRoIPool2d(3, mode='avg')

    def f(x, rois):
        return module(x * 2, rois) + 1
    assert torch.equal(torch.compile(f)(X, ROIS), f(X, ROIS))


def test_fx_symbolic_trace_records_one_call_of_the_op():
    class Head(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.pool = CANNRoIPool2d(3, mode='avg')

        def forward(self, x, rois):
            return self.pool(x, rois).flatten(1)
    traced = torch.fx.symbolic_trace(Head())
    targets = [n.target for n in traced.graph.nodes if n.op == 'call_function']
    assert roi_pool2d in targets
    assert torch.equal(traced(X, ROIS), Head()(X, ROIS))
