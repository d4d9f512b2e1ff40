"""convert_model on real mmseg models: replacement, exactness, state, wrappers, routing."""
import copy
import math
import textwrap
import warnings

import pytest
import torch
from torch import nn
import torch.nn.functional as F

from mmseg_cann import (CANNAdaptiveAvgPool2d, CANNAvgPool2d, CANNMaxPool2d, CANNUpsample,
                        convert_model)
from mmseg_cann.convert import (cann_resize, resize_routed, restore_resize, route_resize,
                                routed_resize)
from mmseg_cann.models.registry import CANN_MODULES

from tests._helpers import run_python
from tests._helpers import build_small, seg_batch

PLAIN = (nn.Upsample, nn.MaxPool2d, nn.AvgPool2d, nn.AdaptiveAvgPool2d)
MODELS = {
    'pspnet': 'mmseg::pspnet/pspnet_r50-d8_4xb2-40k_cityscapes-512x1024.py',
    'deeplabv3plus': 'mmseg::deeplabv3plus/deeplabv3plus_r50-d8_4xb2-40k_cityscapes-512x1024.py',
    'upernet': 'mmseg::upernet/upernet_r50_4xb2-40k_cityscapes-512x1024.py',
    'fpn': 'mmseg::sem_fpn/fpn_r50_4xb2-80k_cityscapes-512x1024.py',
}


@pytest.fixture(autouse=True)
def _restore_routing():
    yield
    restore_resize()


def _plain_left(model):
    from mmseg.models.utils import Upsample as MMSegUpsample
    return [name for name, m in model.named_modules()
            if (isinstance(m, PLAIN) and not isinstance(m, CANN_MODULES))
            or type(m) is MMSegUpsample]


@pytest.mark.parametrize('name', sorted(MODELS))
def test_converted_model_is_identical_in_fp32(name):
    torch.manual_seed(0)
    model = build_small(MODELS[name])
    reference = copy.deepcopy(model)
    assert _plain_left(model)
    convert_model(model)
    assert _plain_left(model) == []
    assert resize_routed()
    report = model.cann_conversion_report
    assert report.replaced and all(new.startswith('CANN') for _, _, new in report.replaced)
    assert list(model.state_dict()) == list(reference.state_dict())

    x, samples = seg_batch(model)
    model.train()
    reference.train()
    torch.manual_seed(1)  # same dropout masks in both runs
    losses = model.loss(x, copy.deepcopy(samples))
    restore_resize()  # the reference runs mmseg's own resize
    torch.manual_seed(1)
    ref_losses = reference.loss(x, copy.deepcopy(samples))
    assert losses.keys() == ref_losses.keys()
    for key in losses:
        assert torch.equal(torch.as_tensor(losses[key]), torch.as_tensor(ref_losses[key])), key
    total = sum(v for k, v in losses.items() if 'loss' in k)
    ref_total = sum(v for k, v in ref_losses.items() if 'loss' in k)
    grads = torch.autograd.grad(total, list(model.parameters()), allow_unused=True)
    ref_grads = torch.autograd.grad(ref_total, list(reference.parameters()), allow_unused=True)
    for g, rg in zip(grads, ref_grads):
        assert (g is None and rg is None) or torch.equal(g, rg)


def test_replacements_carry_settings_and_mmseg_upsample_semantics():
    from mmseg.models.utils import Upsample as MMSegUpsample
    model = nn.Sequential(
        nn.Upsample(scale_factor=1.5, mode='bilinear', align_corners=True),
        MMSegUpsample(scale_factor=1.5, mode='bilinear'),
        MMSegUpsample(size=(9, 11), mode='nearest'),
        nn.MaxPool2d(3, 2, 1, ceil_mode=True), nn.AvgPool2d(3, 1, 1, count_include_pad=False),
        nn.AdaptiveAvgPool2d((2, 3)))
    reference = copy.deepcopy(model)
    convert_model(model, resize=False, pool_precision=dict(max='fp16', avg='fp32'),
                  upsample_precision='input')
    types = [type(m) for m in model]
    assert types == [CANNUpsample, CANNUpsample, CANNUpsample, CANNMaxPool2d, CANNAvgPool2d,
                     CANNAdaptiveAvgPool2d]
    assert model[1].recompute_scale_factor is True  # mmseg's Upsample is size-first
    assert model[3].ceil_mode and model[3].precision == 'fp16' and model[4].precision == 'fp32'
    assert model[4].count_include_pad is False and model[5].output_size == (2, 3)
    x = torch.rand(1, 2, 7, 7)
    for ours, theirs in zip(model, reference):
        if ours.precision == 'fp16':  # max pooling computed in fp16, returned in fp32
            assert torch.equal(ours(x), theirs(x.half()).float())
        else:
            assert torch.equal(ours(x), theirs(x)), type(theirs)


def test_options_and_idempotence():
    model = nn.Sequential(nn.Upsample(scale_factor=2), nn.MaxPool2d(2))
    convert_model(model, upsample=False, resize=False)
    assert type(model[0]) is nn.Upsample and type(model[1]) is CANNMaxPool2d
    assert not resize_routed()
    convert_model(model, pooling=False, resize=False)
    assert type(model[0]) is CANNUpsample
    again = convert_model(model, resize=False)
    assert again is model and model.cann_conversion_report.replaced == []


def test_bad_arguments():
    with pytest.raises(TypeError, match='nn.Module'):
        convert_model('model')
    with pytest.raises(ValueError, match='pool_precision'):
        convert_model(nn.Sequential(nn.MaxPool2d(2)), pool_precision=dict(mean='fp16'))
    with pytest.raises(ValueError, match='precision'):
        convert_model(nn.Sequential(nn.MaxPool2d(2)), pool_precision=dict(max='fp64'))
    with pytest.raises(TypeError, match='pool_precision'):
        convert_model(nn.Sequential(nn.MaxPool2d(2)), pool_precision='fp16')


def test_resize_routing_and_undo():
    import mmseg.models.decode_heads.psp_head as psp_head
    import mmseg.models.utils as mmseg_utils
    original = mmseg_utils.resize
    names = route_resize()
    assert 'mmseg.models.decode_heads.psp_head' in names and len(names) >= 30
    assert psp_head.resize is cann_resize and mmseg_utils.resize is cann_resize
    assert route_resize() == names  # idempotent
    restored = restore_resize()
    assert restored == names and psp_head.resize is original and not resize_routed()
    with routed_resize():
        assert psp_head.resize is cann_resize
    assert psp_head.resize is original


def test_cann_resize_matches_mmseg_resize_and_warns_the_same():
    from mmseg.models.utils.wrappers import resize
    x = torch.rand(1, 3, 5, 7)
    for kwargs in [dict(size=(9, 13), mode='bilinear', align_corners=False),
                   dict(scale_factor=2, mode='nearest'),
                   dict(size=torch.Size([10, 14]), mode='bilinear', align_corners=True)]:
        with warnings.catch_warnings(record=True) as ours:
            warnings.simplefilter('always')
            got = cann_resize(x, **kwargs)
        with warnings.catch_warnings(record=True) as theirs:
            warnings.simplefilter('always')
            expected = resize(x, **kwargs)
        assert torch.equal(got, expected)
        assert [str(w.message) for w in ours] == [str(w.message) for w in theirs]


def test_checkpoints_load_both_ways(tmp_path):
    torch.manual_seed(0)
    converted = convert_model(build_small(MODELS['pspnet']), resize=False)
    plain = build_small(MODELS['pspnet'])
    torch.save(converted.state_dict(), tmp_path / 'converted.pth')
    torch.save(plain.state_dict(), tmp_path / 'plain.pth')
    into_plain = build_small(MODELS['pspnet'])
    into_plain.load_state_dict(torch.load(tmp_path / 'converted.pth'), strict=True)
    into_converted = convert_model(build_small(MODELS['pspnet']), resize=False)
    into_converted.load_state_dict(torch.load(tmp_path / 'plain.pth'), strict=True)
    for source, target in ((converted, into_plain), (plain, into_converted)):
        for (k1, v1), (k2, v2) in zip(source.state_dict().items(), target.state_dict().items()):
            assert k1 == k2 and torch.equal(v1, v2)


def test_converts_inside_ddp(tmp_path):
    """A real DDP wrapper (gloo, one rank) in a subprocess: gloo's process-group
    teardown can block when run inside the test process after other tests."""
    script = textwrap.dedent(f'''
        import os, torch, torch.distributed as dist
        from torch import nn
        from torch.nn.parallel import DistributedDataParallel
        from mmseg_cann import CANNMaxPool2d, CANNUpsample, convert_model
        dist.init_process_group('gloo', init_method='file://{tmp_path}/pg', rank=0,
                                world_size=1)
        model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.MaxPool2d(2), nn.Upsample(scale_factor=2))
        ddp = DistributedDataParallel(model)
        assert convert_model(ddp, resize=False) is ddp
        assert type(ddp.module[1]) is CANNMaxPool2d and type(ddp.module[2]) is CANNUpsample
        out = ddp(torch.rand(1, 3, 9, 9))
        out.sum().backward()
        print('shape', tuple(out.shape), flush=True)
        os._exit(0)  # skip gloo's teardown
    ''')
    result = run_python(['-c', script], timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert 'shape (1, 4, 6, 6)' in result.stdout


# ----------------------------------------------------------------------------------
# membership, per-module state, re-conversion and sharing
# ----------------------------------------------------------------------------------
class MaxPool2dSame(nn.MaxPool2d):
    """timm's dynamic-SAME max pool: pads in ``forward`` from the input size (registered
    padding 0), so its output is ceil(in / stride)."""

    def __init__(self, kernel_size, stride):
        super().__init__((kernel_size, kernel_size), (stride, stride), (0, 0), (1, 1))

    def forward(self, x):
        pads = []
        for size, k, s in zip(x.shape[-2:], self.kernel_size, self.stride):
            pad = max((math.ceil(size / s) - 1) * s + k - size, 0)
            pads.append((pad // 2, pad - pad // 2))
        (top, bottom), (left, right) = pads
        x = F.pad(x, (left, right, top, bottom), value=-float('inf'))
        return F.max_pool2d(x, self.kernel_size, self.stride, (0, 0), self.dilation,
                            self.ceil_mode)


class TaggedMaxPool2d(nn.MaxPool2d):
    """A subclass that keeps ``forward`` (it may change anything else)."""

    def extra_repr(self):
        return 'tagged, ' + super().extra_repr()


def test_only_exact_known_classes_are_replaced():
    from mmcv.cnn import MaxPool2d as MMCVMaxPool2d
    from mmseg.models.utils import Upsample as MMSegUpsample
    # torch's Upsampling*2d only fix nn.Upsample's settings: converted like it
    for cls in (nn.UpsamplingBilinear2d, nn.UpsamplingNearest2d):
        assert set(cls.__dict__) == {'__module__', '__doc__', '__init__'}
    patched = nn.AvgPool2d(2)
    patched.forward = lambda x: nn.AvgPool2d.forward(patched, x) * 2
    model = nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1), MaxPool2dSame(3, 2), TaggedMaxPool2d(3, 1, 1),
        patched, nn.UpsamplingBilinear2d(scale_factor=2), nn.UpsamplingNearest2d(size=(20, 17)),
        MMSegUpsample(scale_factor=1.5, mode='bilinear'), MMCVMaxPool2d(2, ceil_mode=True),
        nn.AdaptiveAvgPool2d((5, 4)))
    reference = copy.deepcopy(model)
    x = torch.rand(1, 3, 33, 29)
    convert_model(model, resize=False)
    assert [type(m) for m in model] == [
        nn.Conv2d, MaxPool2dSame, TaggedMaxPool2d, nn.AvgPool2d, CANNUpsample, CANNUpsample,
        CANNUpsample, MMCVMaxPool2d, CANNAdaptiveAvgPool2d]
    assert model[3] is patched
    kept = {path: (kind, reason) for path, kind, reason in model.cann_conversion_report.kept}
    assert kept == {
        '1': ('MaxPool2dSame', 'subclass of nn.MaxPool2d that overrides forward'),
        '2': ('TaggedMaxPool2d',
              'subclass of nn.MaxPool2d; only the exact known classes are converted'),
        '3': ('AvgPool2d', 'forward is set on the instance'),
        '7': ('MaxPool2d', 'subclass of nn.MaxPool2d that overrides forward')}
    assert 'MaxPool2dSame kept (subclass of nn.MaxPool2d that overrides forward)' in str(
        model.cann_conversion_report)
    assert model[:2](x).shape == (1, 4, 17, 15)  # dynamic SAME, not 16 x 14
    out, expected = x, x
    for ours, theirs in zip(model, reference):
        out, expected = ours(out), theirs(expected)
        assert torch.equal(out, expected), type(theirs)


def _hooked_model(log):
    """Conv -> MaxPool2d -> Upsample with every kind of hook on the two modules replaced;
    the handles are returned. Hooks that return values change the module's input/output."""
    torch.manual_seed(0)
    pool, up = nn.MaxPool2d(2), nn.Upsample(scale_factor=2, mode='bilinear')
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), pool, up)

    def rec(tag):
        return lambda *args: log.append(tag)

    handles = [
        pool.register_forward_pre_hook(lambda m, args: (args[0] * 2,)),
        pool.register_forward_pre_hook(
            lambda m, args, kwargs: log.append(('pre_kwargs', sorted(kwargs))), with_kwargs=True),
        pool.register_forward_hook(lambda m, args, out: out + 1),
        up.register_forward_hook(lambda m, args, kwargs, out: log.append(('kwargs', out.shape)),
                                 with_kwargs=True),
        pool.register_forward_hook(rec('always'), always_call=True),
        pool.register_full_backward_hook(
            lambda m, grad_in, grad_out: log.append(('backward', grad_in[0].shape))),
        up.register_full_backward_pre_hook(lambda m, grad_out: (grad_out[0] * 3,)),
        pool.register_state_dict_pre_hook(rec('state_dict_pre')),
        pool.register_state_dict_post_hook(rec('state_dict_post')),
        up.register_load_state_dict_pre_hook(rec('load_pre')),
        up.register_load_state_dict_post_hook(rec('load_post')),
    ]
    return model, handles


def _run(model, x):
    x = x.clone().requires_grad_()
    out = model(x)
    (out * torch.arange(out.numel()).reshape(out.shape)).sum().backward()
    return out.detach(), x.grad, model.state_dict()


def test_hooks_move_to_the_replacement_and_their_handles_still_remove_them():
    log, ref_log = [], []
    model, handles = _hooked_model(log)
    reference, ref_handles = _hooked_model(ref_log)
    convert_model(model, resize=False)
    assert type(model[1]) is CANNMaxPool2d and type(model[2]) is CANNUpsample
    x = torch.rand(2, 3, 10, 12)
    for (ours, theirs) in zip(_run(model, x), _run(reference, x)):
        if isinstance(ours, dict):
            assert list(ours) == list(theirs)
        else:
            assert torch.equal(ours, theirs)
    model.load_state_dict(model.state_dict())
    reference.load_state_dict(reference.state_dict())
    assert log == ref_log and 'always' in log and 'load_post' in log
    # always_call: the hook runs when forward raises
    for pool in (reference[1], model[1]):
        with pytest.raises(RuntimeError):
            pool(torch.rand(1, 1, 1, 1))  # output size too small
    assert log == ref_log and log[-1] == 'always'
    for handle in handles + ref_handles:
        handle.remove()
    log.clear(), ref_log.clear()
    for (ours, theirs) in zip(_run(model, x), _run(reference, x)):
        if not isinstance(ours, dict):
            assert torch.equal(ours, theirs)
    model.load_state_dict(model.state_dict())
    assert log == [] and ref_log == []
    for hooks in ('_forward_hooks', '_forward_pre_hooks', '_backward_hooks',
                  '_backward_pre_hooks', '_state_dict_hooks', '_state_dict_pre_hooks',
                  '_load_state_dict_pre_hooks', '_load_state_dict_post_hooks'):
        assert not getattr(model[1], hooks) and not getattr(model[2], hooks), hooks


def test_instance_state_moves_to_the_replacement():
    """Training flag, attributes and parameters/buffers/submodules set on the instance."""
    def build():
        torch.manual_seed(0)
        model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.MaxPool2d(2),
                              nn.Upsample(scale_factor=2))
        model.train()
        model[2].eval()
        model[2].tag = 'stem pool'
        model[2].register_buffer('seen', torch.zeros(2))
        model[2].register_buffer('scratch', torch.ones(1), persistent=False)
        model[3].scale = nn.Parameter(torch.ones(1))
        model[3].extra = nn.Identity()
        return model
    model, reference = build(), build()
    convert_model(model, resize=False)
    pool, up = model[2], model[3]
    assert type(pool) is CANNMaxPool2d and type(up) is CANNUpsample
    assert model.training and not pool.training and up.training
    assert pool.tag == 'stem pool' and torch.equal(pool.seen, torch.zeros(2))
    assert list(model.state_dict()) == list(reference.state_dict())
    assert [n for n, _ in model.named_parameters()] == [
        n for n, _ in reference.named_parameters()]
    assert [n for n, _ in model.named_modules()] == [n for n, _ in reference.named_modules()]
    model.load_state_dict(reference.state_dict(), strict=True)
    reference.load_state_dict(model.state_dict(), strict=True)
    x = torch.rand(2, 3, 9, 9)
    assert torch.equal(model(x), reference(x))


def test_reconversion_applies_the_settings_given_and_only_those():
    model = nn.Sequential(nn.MaxPool2d(3, 1, 1), nn.Upsample(scale_factor=2, mode='bilinear'),
                          nn.AvgPool2d(2), CANNMaxPool2d(3, 1, 1, precision='fp16'),
                          CANNUpsample(scale_factor=2, backend='native'))
    convert_model(model, resize=False)
    report = model.cann_conversion_report
    assert len(report.replaced) == 3 and report.updated == []
    assert model[3].precision == 'fp16' and model[4].backend == 'native'  # built explicitly
    x = torch.rand(1, 2, 6, 6)
    model(x)  # the modules' call caches are filled

    convert_model(model, resize=False, backend='fast')
    assert [m.backend for m in model] == ['fast'] * 5
    assert model[3].precision == 'fp16'
    report = model.cann_conversion_report
    assert report.replaced == [] and [p for p, _, _ in report.updated] == ['0', '1', '2', '3', '4']
    assert dict((p, c) for p, _, c in report.updated)['4'] == "backend 'native' -> 'fast'"
    assert "CANNUpsample updated (backend 'native' -> 'fast')" in str(report)

    convert_model(model, resize=False, pool_precision=dict(avg='fp16'),
                  upsample_precision='fp16')
    assert [m.precision for m in model] == [None, 'fp16', 'fp16', 'fp16', 'fp16']
    assert [p for p, _, _ in model.cann_conversion_report.updated] == ['1', '2', '4']
    for module, fresh in ((model[2], CANNAvgPool2d(2, precision='fp16', backend='fast')),
                          (model[1], CANNUpsample(scale_factor=2, mode='bilinear',
                                                  precision='fp16', backend='fast'))):
        assert torch.equal(module(x), fresh(x))  # the new setting is what runs
    convert_model(model, resize=False, pooling=False, backend='auto')
    assert [m.backend for m in model] == ['fast', 'auto', 'fast', 'fast', 'auto']
    convert_model(model, resize=False, pooling=False, backend='auto')
    assert model.cann_conversion_report.updated == []


def test_shared_module_becomes_one_shared_replacement():
    pool = nn.MaxPool2d(2)
    calls = []
    pool.register_forward_hook(lambda m, args, out: calls.append(out.shape))
    branch = nn.Sequential(pool, pool)  # used twice in one Sequential
    model = nn.Sequential(branch, nn.Sequential(nn.Identity(), pool),
                          nn.ModuleDict({'p': pool}))
    convert_model(model, resize=False)
    new = model[0][0]
    assert type(new) is CANNMaxPool2d
    assert model[0][1] is new and model[1][1] is new and model[2]['p'] is new
    assert model.cann_conversion_report.replaced == [('0.0', 'MaxPool2d', 'CANNMaxPool2d')]
    x = torch.rand(1, 1, 8, 8)
    assert torch.equal(model[1](model[0](x)), pool(pool(pool(x))))
    assert len(calls) == 6  # three calls through the replacement, three through `pool`


def test_converting_twice_is_converting_once():
    shared = nn.AvgPool2d(2)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), shared, MaxPool2dSame(3, 2), shared,
                          nn.Upsample(scale_factor=3), CANNMaxPool2d(2, backend='native'))
    once = convert_model(copy.deepcopy(model), resize=False)
    twice = convert_model(convert_model(copy.deepcopy(model), resize=False), resize=False)
    assert repr(once) == repr(twice)
    assert [type(m) for m in once] == [type(m) for m in twice]
    assert twice[1] is twice[3] and once[1] is once[3]
    first, second = once.cann_conversion_report, twice.cann_conversion_report
    assert second.replaced == [] and second.updated == [] and second.kept == first.kept
    x = torch.rand(1, 3, 33, 29)
    assert torch.equal(once(x), model(x)) and torch.equal(twice(x), model(x))
