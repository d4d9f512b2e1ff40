"""convert_model probed the way users break it: copies, pickling, DDP, state dicts,
autocast, train/eval, compiled and patched instances, CANN subclasses, the root module.

Every comparison is against a deep copy of the unconverted model, bit for bit.
"""
import copy
import io
import pickle
import textwrap

import pytest
import torch
from torch import nn

from mmseg_cann import (CANNAdaptiveAvgPool2d, CANNAvgPool2d, CANNMaxPool2d, CANNUpsample,
                        convert_model, precision_policy)
from mmseg_cann.convert import restore_resize

from tests._helpers import run_python


@pytest.fixture(autouse=True)
def _restore_routing():
    yield
    restore_resize()


def scale_output(module, args, output):
    """A forward hook that changes the output (module-level, so it pickles)."""
    return output * 2 + 1


def check_load(module, state_dict, prefix, *args):
    """A load_state_dict pre-hook, which torch calls with its module."""
    assert isinstance(module, nn.Upsample) and prefix == '5.', prefix


class CountCalls:
    """A picklable forward pre-hook counting its calls."""

    def __init__(self):
        self.calls = 0

    def __call__(self, module, args):
        self.calls += 1


def _model():
    """Conv/BN, a hooked MaxPool2d, a shared AvgPool2d, upsampling, adaptive pooling."""
    torch.manual_seed(0)
    shared = nn.AvgPool2d(3, 1, 1, count_include_pad=False)
    model = nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.BatchNorm2d(6), nn.ReLU(),
                          nn.MaxPool2d(3, 2, 1), shared, nn.Upsample(scale_factor=2,
                                                                     mode='bilinear'),
                          shared, nn.AdaptiveAvgPool2d((5, 7)))
    model[3].register_forward_hook(scale_output)
    model[5].register_forward_pre_hook(CountCalls())
    model[5].register_load_state_dict_pre_hook(check_load)
    model[3].register_buffer('seen', torch.arange(3.0))
    return model


def _converted_and_reference():
    model = _model()
    reference = copy.deepcopy(model)
    convert_model(model, resize=False)
    assert [type(model[i]) for i in (3, 4, 5, 7)] == [
        CANNMaxPool2d, CANNAvgPool2d, CANNUpsample, CANNAdaptiveAvgPool2d]
    assert model[4] is model[6]
    return model, reference


def _same(a, b):
    assert type(a) is type(b)
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b)
    else:
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y)


def _step(model, x):
    """Output, input gradient and parameter gradients of one forward/backward."""
    model.zero_grad()
    x = x.clone().requires_grad_()
    out = model(x)
    (out * torch.linspace(-1, 1, out.numel()).reshape(out.shape)).sum().backward()
    return out.detach(), x.grad, [p.grad for p in model.parameters()]


def test_copies_and_pickles_of_a_converted_model_behave_as_the_original():
    model, reference = _converted_and_reference()
    model.eval(), reference.eval()
    x = torch.rand(2, 3, 11, 13)
    model(x)  # fill the call caches before copying (they are not copied)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    copies = [copy.deepcopy(model), pickle.loads(pickle.dumps(model)),
              torch.load(io.BytesIO(buffer.getvalue()), weights_only=False)]
    for clone in copies:
        assert [type(m) for m in clone] == [type(m) for m in model]
        assert clone[4] is clone[6]
        assert len(clone[3]._forward_hooks) == 1 and len(clone[5]._forward_pre_hooks) == 1
        _same(clone(x), reference(x))
        clone.load_state_dict(reference.state_dict())  # runs check_load on clone[5]
    assert next(iter(copies[0][5]._forward_pre_hooks.values())).calls == 2


def test_state_dicts_round_trip_between_converted_and_unconverted():
    model, reference = _converted_and_reference()
    assert list(model.state_dict()) == list(reference.state_dict())
    assert 'seen' in dict(model[3].named_buffers())
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    plain = _model()
    with torch.no_grad():
        for p in reference.parameters():
            p.add_(1)
    reference.load_state_dict(torch.load(io.BytesIO(buffer.getvalue()), weights_only=True))
    model.load_state_dict(plain.state_dict(), strict=True)
    for (k1, v1), (k2, v2) in zip(model.state_dict().items(), reference.state_dict().items()):
        assert k1 == k2 and torch.equal(v1, v2)


@pytest.mark.parametrize('mode', ['train', 'eval'])
def test_train_and_eval_modes_and_autocast(mode):
    model, reference = _converted_and_reference()
    getattr(model, mode)(), getattr(reference, mode)()
    assert [m.training for m in model.modules()] == [m.training for m in reference.modules()]
    x = torch.rand(2, 3, 11, 13)
    _same(_step(model, x), _step(reference, x))
    # PyTorch's own dtypes: the default policy averages low precision in float32
    with precision_policy(dict(max='input', avg='input'), 'input'), \
            torch.autocast('cpu', dtype=torch.bfloat16):
        ours, theirs = _step(model, x), _step(reference, x)
    assert ours[0].dtype == torch.bfloat16
    _same(ours, theirs)


def test_mode_set_on_one_module_survives_and_later_switches_reach_the_replacement():
    model = _model().train()
    model[3].eval()
    reference = copy.deepcopy(model)
    convert_model(model, resize=False)
    assert model.training and not model[3].training and model[5].training
    x = torch.rand(2, 3, 11, 13)
    _same(_step(model, x), _step(reference, x))
    model.eval()
    assert not any(m.training for m in model.modules())


def test_root_module_cann_subclasses_and_patched_instances_are_reported():
    report = convert_model(nn.MaxPool2d(2), resize=False).cann_conversion_report
    assert report.kept == [('', 'MaxPool2d', 'the model itself: convert a module that holds it')]
    assert '<root>: MaxPool2d kept' in str(report)
    root = convert_model(CANNMaxPool2d(2), resize=False, backend='fast')
    assert root.backend == 'fast'
    assert root.cann_conversion_report.updated == [('', 'CANNMaxPool2d',
                                                    "backend 'auto' -> 'fast'")]

    class MyCANNPool(CANNMaxPool2d):
        pass

    compiled, repr_patched = nn.MaxPool2d(2), nn.Upsample(scale_factor=2)
    compiled.compile()  # torch.compile in place: the compiled call is the old module's
    repr_patched.extra_repr = lambda: 'patched'
    model = nn.Sequential(MyCANNPool(2), compiled, repr_patched, nn.MaxPool2d(2))
    convert_model(model, resize=False, backend='fast')
    assert model[0].backend == 'auto' and model[1] is compiled and model[2] is repr_patched
    assert type(model[3]) is CANNMaxPool2d and model[3].backend == 'fast'
    report = model.cann_conversion_report
    assert report.kept == [
        ('0', 'MyCANNPool', 'subclass of CANNMaxPool2d; only the exact known classes are '
                            'converted'),
        ('1', 'MaxPool2d', 'compiled in place (Module.compile)'),
        ('2', 'Upsample', 'extra_repr is set on the instance')]
    text = str(report)
    assert text.splitlines()[0] == ('mmseg_cann conversion: 1 module(s) replaced, 3 kept, '
                                    'resize routed in 0 mmseg module(s)')
    # modules of a kind not converted are neither replaced nor listed
    convert_model(model, resize=False, pooling=False, backend='native')
    assert [p for p, _, _ in model.cann_conversion_report.kept] == ['2']
    assert model[3].backend == 'fast'


def test_converts_inside_and_under_ddp_like_the_unconverted_model(tmp_path):
    """DDP (gloo, one rank) in a subprocess: convert a DDP-wrapped model, and wrap a
    converted one; both give the unconverted model's outputs and gradients."""
    script = textwrap.dedent(f'''
        import copy, os, torch, torch.distributed as dist
        from torch import nn
        from torch.nn.parallel import DistributedDataParallel as DDP
        from mmseg_cann import CANNMaxPool2d, convert_model
        dist.init_process_group('gloo', init_method='file://{tmp_path}/pg', rank=0,
                                world_size=1)
        calls = []
        def build():
            torch.manual_seed(0)
            pool = nn.MaxPool2d(2)
            model = nn.Sequential(nn.Conv2d(3, 4, 3), pool, nn.Upsample(scale_factor=2),
                                  pool)
            pool.register_forward_hook(lambda m, a, out: calls.append(1) or out * 2)
            return model
        def step(model, x):
            model.zero_grad()
            out = model(x)
            out.square().sum().backward()
            return [out.detach()] + [p.grad for p in model.parameters()]
        x = torch.rand(2, 3, 17, 17)
        expected = step(build(), x)
        inside = DDP(build())
        assert convert_model(inside, resize=False) is inside
        under = DDP(convert_model(build(), resize=False))
        for ddp in (inside, under):
            assert type(ddp.module[1]) is CANNMaxPool2d and ddp.module[1] is ddp.module[3]
            got = step(ddp, x)
            assert all(torch.equal(a, b) for a, b in zip(got, expected))
        assert len(calls) == 6, calls
        print('ddp ok', flush=True)
        os._exit(0)  # skip gloo's teardown
    ''')
    result = run_python(['-c', script], timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert 'ddp ok' in result.stdout
