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


def test_jit_script_is_refused_with_a_message():
    with pytest.raises(RuntimeError, match='torch.jit.script'):
        torch.jit.script(CANNRoIPool2d(2))


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
