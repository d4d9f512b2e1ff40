"""convert_model on real mmseg models: replacement, exactness, state, wrappers, routing."""
import copy
import textwrap
import warnings

import pytest
import torch
from torch import nn

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
