"""The CANN modules under tracers and compilers: ``torch.compile`` (one graph, no graph
break, fullgraph), ``torch.fx.symbolic_trace``, ``torch.export``, ``torch.jit.trace``
and ``torch.jit.script`` (one clear error). Values are compared with eager PyTorch.

Compilation uses dynamo with the ``'eager'`` backend (what breaks a graph is dynamo's
tracing, not the backend), except one small inductor test marked slow."""
import threading

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mmseg_cann import (CANNAdaptiveAvgPool2d, CANNAvgPool2d, CANNMaxPool2d, CANNUpsample, ops,
                        precision_policy, set_precision_policy)
from tests._helpers import make_input

MODULES = [
    lambda: CANNUpsample(scale_factor=2, mode='bilinear'),
    lambda: CANNUpsample(size=(5, 7), mode='nearest'),
    lambda: CANNUpsample(size=(3, 3), mode='bicubic', antialias=True),
    lambda: CANNMaxPool2d(3, 2, 1),
    lambda: CANNMaxPool2d(3, 2, 'same_lower', return_indices=True),
    lambda: CANNAvgPool2d(3, 2, 'same', count_include_pad=False),
    lambda: CANNAvgPool2d(2, divisor_override=3),
    lambda: CANNAdaptiveAvgPool2d((None, 2)),
]


def _model():
    """A small model made of CANN modules (and one convolution)."""
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), CANNMaxPool2d(3, 2, 'same'),
                         CANNUpsample(scale_factor=2, mode='bilinear'),
                         CANNAvgPool2d(2, ceil_mode=True), CANNUpsample(size=(9, 11)),
                         CANNAdaptiveAvgPool2d((3, 4))).eval()


def _equal(a, b) -> bool:
    if isinstance(a, tuple):
        return all(map(_equal, a, b))
    return a.dtype == b.dtype and torch.equal(a, b)


def _compiled(module):
    torch._dynamo.reset()
    return torch.compile(module, fullgraph=True, backend='eager')


@pytest.mark.parametrize('build', MODULES)
def test_compile_fullgraph_each_module(build):
    m = build()
    x = make_input((2, 3, 9, 11))
    assert _equal(_compiled(m)(x), m(x))


def test_model_compiles_to_one_graph():
    model, x = _model(), make_input((1, 3, 17, 15))
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(model)(x)
    assert explanation.graph_count == 1 and explanation.graph_break_count == 0, \
        explanation.break_reasons
    with torch.no_grad():
        assert _equal(_compiled(model)(x), model(x))


@pytest.mark.slow
def test_compiled_model_follows_changing_input_sizes():
    """Dynamo's automatic dynamic shapes: later sizes recompile with symbolic sizes."""
    model = nn.Sequential(CANNMaxPool2d(3, 2, 1), CANNUpsample(scale_factor=2, mode='bilinear'),
                          CANNAvgPool2d(2, ceil_mode=True), CANNUpsample(size=(9, 11)),
                          CANNMaxPool2d(2, 2, 'same'), CANNAdaptiveAvgPool2d((3, 4)))
    compiled = _compiled(model)
    with torch.no_grad():
        for shape in ((1, 3, 17, 15), (2, 3, 9, 20), (1, 3, 33, 31), (3, 3, 12, 12)):
            x = make_input(shape)
            assert _equal(compiled(x), model(x)), shape


def test_fallback_inputs_compile():
    """Inputs the ops hand to PyTorch's own function (5-D upsampling) compile too."""
    m, x = CANNUpsample(scale_factor=2), make_input((1, 2, 3, 4, 5))
    assert _equal(_compiled(m)(x), nn.Upsample(scale_factor=2)(x))


def test_policy_and_settings_changed_after_compiling_take_effect():
    x = make_input((1, 2, 8, 8))
    plain, in_bf16 = F.avg_pool2d(x, 2), F.avg_pool2d(x.bfloat16(), 2).float()
    assert not torch.equal(plain, in_bf16)
    m = CANNAvgPool2d(2)
    compiled = _compiled(m)
    assert _equal(compiled(x), plain)
    set_precision_policy(pool_precision=dict(avg='bf16'))  # process-wide
    assert _equal(compiled(x), in_bf16)
    set_precision_policy(reset=True)
    assert _equal(compiled(x), plain)
    with precision_policy(pool_precision=dict(avg='bf16')):  # a context of this thread
        assert _equal(compiled(x), in_bf16)
        seen = []
        other = threading.Thread(target=lambda: seen.append(compiled(x)))
        other.start()
        other.join()
        assert _equal(seen[0], plain)  # not another thread's
    assert _equal(compiled(x), plain)
    m.precision = 'bf16'  # a module setting
    assert _equal(compiled(x), in_bf16)
    m.precision = None
    m.kernel_size = 4
    assert _equal(compiled(x), F.avg_pool2d(x, 4, 2))


def test_in_place_edit_after_compiling_takes_effect():
    x = make_input((1, 2, 4, 4))
    m = CANNUpsample(size=[8, 9])
    compiled = _compiled(m)
    assert compiled(x).shape == (1, 2, 8, 9)
    m.size[0] = 20
    assert _equal(compiled(x), F.interpolate(x, size=(20, 9)))


@pytest.mark.slow
def test_inductor_compiles_a_model():
    model, x = _model(), make_input((1, 3, 17, 15))
    torch._dynamo.reset()
    with torch.no_grad():
        compiled = torch.compile(model, fullgraph=True)
        torch.testing.assert_close(compiled(x), model(x))


def test_fx_symbolic_trace_calls_the_ops():
    model, x = _model(), make_input((1, 3, 17, 15))
    traced = torch.fx.symbolic_trace(model)
    targets = [n.target for n in traced.graph.nodes if n.op == 'call_function']
    assert targets == [ops.max_pool2d, ops.upsample, ops.avg_pool2d, ops.upsample,
                       ops.adaptive_avg_pool2d]
    with torch.no_grad():
        assert _equal(traced(x), model(x))
    # the traced graph calls the ops at run time: the policy applies then
    pool = torch.fx.symbolic_trace(CANNAvgPool2d(2))
    with precision_policy(pool_precision=dict(avg='bf16')):
        assert _equal(pool(x), F.avg_pool2d(x.bfloat16(), 2).float())


@pytest.mark.parametrize('build', MODULES)
def test_fx_each_module(build):
    m = build()
    x = make_input((2, 3, 9, 11))
    assert _equal(torch.fx.symbolic_trace(m)(x), m(x))


def test_functional_ops_fx_trace_from_user_code():
    class Head(nn.Module):
        def forward(self, x):
            return ops.upsample(ops.max_pool2d(x, 2), scale_factor=2, mode='bilinear')

    x = make_input((1, 2, 8, 8))
    traced = torch.fx.symbolic_trace(Head())
    assert _equal(traced(x), Head()(x))


def test_tensor_subclasses_keep_their_type_as_in_torch():
    class Tagged(torch.Tensor):
        pass

    x = make_input((1, 2, 8, 8)).as_subclass(Tagged)
    assert type(ops.max_pool2d(x, 2)) is type(F.max_pool2d(x, 2)) is Tagged
    assert type(CANNUpsample(scale_factor=2)(x)) is type(nn.Upsample(scale_factor=2)(x))


def test_torch_export():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), CANNMaxPool2d(3, 2, 'same'),
                          CANNAvgPool2d(2), CANNUpsample(scale_factor=2)).eval()
    x = make_input((1, 3, 17, 15))
    exported = torch.export.export(model, (x,))
    with torch.no_grad():
        assert _equal(exported.module()(x), model(x))


def test_jit_trace():
    model, x = _model(), make_input((1, 3, 17, 15))
    with torch.no_grad():
        traced = torch.jit.trace(model, (x,))
        assert _equal(traced(x), model(x))


@pytest.mark.parametrize('build', MODULES)
def test_jit_script_raises_one_clear_error(build):
    with pytest.raises(RuntimeError, match=r'torch\.jit\.script.*torch\.compile'):
        torch.jit.script(build())
    with pytest.raises(RuntimeError, match='torch.fx.symbolic_trace'):
        torch.jit.script(nn.Sequential(nn.ReLU(), build()))
