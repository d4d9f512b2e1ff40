"""CANNOpsHook(fuse_resize_conv=True): validated, applied by the hook, and a few training
iterations through mmengine's Runner with each rewritten head in mmseg's own configs
(random weights, synthetic DRIVE-like data), the rewritten path taken on every call."""
import types

import pytest
import torch

from mmseg_cann import CANNOpsHook
from mmseg_cann.convert import restore_resize, unwrap_model
from mmseg_cann.data import make_dataset
from mmseg_cann.utils.config import set_data_root, sync_bn_to_bn
from mmseg_cann.utils.fallbacks import fallback_counts

from tests._helpers import load_config

DEMO = 'configs/medical/unet-s5-d16_fcn_cann_1xb4-300iter_synthetic-drive-64x64.py'


@pytest.fixture(autouse=True)
def _restore_resize():
    yield
    restore_resize()


def test_option_validated_and_applied():
    from mmengine.logging import MMLogger
    from mmengine.registry import init_default_scope
    from mmseg.registry import MODELS
    with pytest.raises(TypeError, match='fuse_resize_conv'):
        CANNOpsHook(fuse_resize_conv=1)
    init_default_scope('mmseg')
    head = MODELS.build(dict(type='SegformerHead', in_channels=[8, 16], in_index=[0, 1],
                             channels=8, num_classes=3))
    runner = types.SimpleNamespace(model=torch.nn.Sequential(head),
                                   logger=MMLogger.get_current_instance())
    hook = CANNOpsHook(resize=False, fuse_resize_conv=True)
    hook.before_train(runner)
    assert hook.report.fusion.resize_conv == ['0 (SegformerHead.fusion_conv)']
    assert 'forward' in head.__dict__
    plain = types.SimpleNamespace(model=torch.nn.Sequential(
        MODELS.build(dict(type='SegformerHead', in_channels=[8, 16], in_index=[0, 1],
                          channels=8, num_classes=3))), logger=runner.logger)
    CANNOpsHook(resize=False).before_train(plain)
    assert 'forward' not in plain.model[0].__dict__


def _vit_setr(model, mla):
    """SETR with a 4-layer 64-wide ViT (mmseg's ViT-L is too large for these tests)."""
    model.backbone.update(img_size=(64, 64), embed_dims=64, num_layers=4, num_heads=4,
                          out_indices=(0, 1, 2, 3))
    if mla:
        model.neck.update(in_channels=[64] * 4, out_channels=32)
        model.decode_head.update(in_channels=(32,) * 4, mla_channels=16, channels=64)
        for aux in model.auxiliary_head:
            aux.update(in_channels=32, channels=32)
    else:
        model.decode_head.update(in_channels=64, channels=32)
        for aux in model.auxiliary_head:
            aux.update(in_channels=64, channels=32)


def _vit_dpt(model):
    """DPT with a 4-layer 64-wide ViT (mmseg's ViT-B is too large for these tests)."""
    model.backbone.update(img_size=(64, 64), embed_dims=64, num_layers=4, num_heads=4,
                          out_indices=(0, 1, 2, 3))
    model.decode_head.update(in_channels=(64,) * 4, embed_dims=64, channels=32,
                             post_process_channels=[16, 32, 64, 64])


def _uper_r18(model):
    model.backbone.depth = 18
    model.decode_head.update(in_channels=[64, 128, 256, 512], channels=32)
    model.auxiliary_head.update(in_channels=256, channels=32)


def _fpn_r18(model):
    model.backbone.depth = 18
    model.neck.update(in_channels=[64, 128, 256, 512], out_channels=32)
    model.decode_head.update(in_channels=[32] * 4, channels=32)


#: name -> (mmseg config, model overrides, the sites the report lists)
RUNS = {
    'segformer': ('mmseg::segformer/segformer_mit-b0_8xb2-160k_ade20k-512x512.py', None,
                  ['decode_head (SegformerHead.fusion_conv)']),
    'segnext_ham': ('mmseg::segnext/segnext_mscan-t_1xb16-adamw-160k_ade20k-512x512.py',
                    None, ['decode_head (LightHamHead.squeeze)']),
    'hrnet_fcn': ('mmseg::hrnet/fcn_hr18_4xb2-40k_cityscapes-512x1024.py', None,
                  ['decode_head (FCNHead.convs[0])']),
    'unet_interp': (DEMO, None, [f'backbone.decoder.{i}.upsample (InterpConv.interp_upsample[1])'
                                 for i in range(4)]),
    'upernet': ('mmseg::upernet/upernet_r50_4xb2-40k_cityscapes-512x1024.py', _uper_r18,
                ['decode_head (UPerHead.fpn_bottleneck)']),
    'dpt': ('mmseg::dpt/dpt_vit-b16_8xb2-160k_ade20k-512x512.py', _vit_dpt,
            [f'decode_head.fusion_blocks.{i} (FeatureFusionBlock.project)' for i in range(4)]),
    'sem_fpn': ('mmseg::sem_fpn/fpn_r50_4xb2-80k_cityscapes-512x1024.py', _fpn_r18,
                ['decode_head (FPNHead.cls_seg)']),
    'setr_mla': ('mmseg::setr/setr_vit-l_mla_8xb1-80k_cityscapes-768x768.py',
                 lambda m: _vit_setr(m, True), ['decode_head (SETRMLAHead.cls_seg)']),
    'setr_pup': ('mmseg::setr/setr_vit-l_pup_8xb1-80k_cityscapes-768x768.py',
                 lambda m: _vit_setr(m, False),
                 ['decode_head (SETRUPHead.cls_seg)'] +
                 [f'auxiliary_head.{i} (SETRUPHead.cls_seg)' for i in range(3)]),
}


def _heads(model):
    heads = [model.decode_head] + (list(model.auxiliary_head)
                                   if isinstance(model.get('auxiliary_head'), list) else
                                   [model.auxiliary_head] if model.get('auxiliary_head')
                                   else [])
    return heads


def _runner_cfg(name, tmp_path, fuse=True, iters=3, val_interval=1000):
    """The demo's config and data with the model of ``RUNS[name]`` (2 classes), trained
    ``iters`` iterations; ``CANNOpsHook(fuse_resize_conv=fuse)``."""
    base, overrides, _ = RUNS[name]
    root = str(tmp_path / 'data')
    make_dataset('drive', root, num_train=2, num_val=1, seed=0)
    cfg = load_config(DEMO)
    set_data_root(cfg, root)
    if base != DEMO:
        model = load_config(base).model
        model.pretrained = None
        model.backbone.pop('init_cfg', None)
        sync_bn_to_bn(model)
        for head in _heads(model):
            head.num_classes = 2
        if overrides is not None:
            overrides(model)
        model.data_preprocessor = cfg.model.data_preprocessor
        model.test_cfg = dict(mode='whole')
        cfg.model = model
    cfg.work_dir = str(tmp_path / f'work-{fuse}')
    cfg.train_cfg = dict(type='IterBasedTrainLoop', max_iters=iters, val_interval=val_interval)
    cfg.param_scheduler = []
    cfg.default_hooks.logger.interval = 1
    cfg.custom_hooks = [dict(type='CANNOpsHook', fuse_resize_conv=fuse)]
    cfg.randomness = dict(seed=0)
    return cfg


def _new_fallbacks(before):
    after = fallback_counts()
    return {k: v - before.get(k, 0) for k, v in after.items()
            if k[0] in ('fuse_resize_conv', 'resize_conv2d') and v != before.get(k, 0)}


@pytest.mark.slow
@pytest.mark.parametrize('name', sorted(RUNS))
def test_runner_trains_rewritten_heads(name, tmp_path):
    from mmengine.runner import Runner
    runner = Runner.from_cfg(_runner_cfg(name, tmp_path))
    before = dict(fallback_counts())
    runner.train()
    report = unwrap_model(runner.model).cann_conversion_report.fusion
    assert report.resize_conv == RUNS[name][2], report
    assert _new_fallbacks(before) == {}  # every call took the rewritten path
    loss = runner.message_hub.get_scalar('train/loss').current()
    assert torch.isfinite(torch.as_tensor(loss))


def _train_losses(cfg):
    from mmengine.runner import Runner
    runner = Runner.from_cfg(cfg)
    runner.train()
    values, _ = runner.message_hub.get_scalar('train/loss').data
    return runner, [float(v) for v in values]


@pytest.mark.slow
@pytest.mark.parametrize('name', ['upernet', 'segformer'])
def test_amp_training_fused_like_unfused(name, tmp_path, monkeypatch):
    """mmengine's AmpOptimWrapper (bf16 autocast on the CPU; its GPU/NPU check told the
    CPU will do) trains the rewritten head: every call takes the rewrite (no
    composition), and the losses of each iteration are those of the unfused model within
    bf16 rounding (from the same initialisation and data)."""
    from mmengine.optim.optimizer import amp_optimizer_wrapper
    monkeypatch.setattr(amp_optimizer_wrapper, 'is_cuda_available', lambda: True)
    losses = {}
    for fuse in (False, True):
        cfg = _runner_cfg(name, tmp_path, fuse=fuse)
        cfg.optim_wrapper = dict(type='AmpOptimWrapper', dtype='bfloat16',
                                 optimizer=cfg.optim_wrapper.optimizer)
        before = dict(fallback_counts())
        runner, losses[fuse] = _train_losses(cfg)
        if fuse:
            assert _new_fallbacks(before) == {}
            last = unwrap_model(runner.model).cann_conversion_report.fusion.last_calls()
            assert last and not any('composition' in m for ran in last.values()
                                    for m in ran), last
    assert len(losses[True]) == len(losses[False]) == 3
    for fused, plain in zip(losses[True], losses[False]):
        # logits rounded to bf16 (2^-8 relative) by either path: a few roundings apart
        assert abs(fused - plain) <= 4 * 2.0 ** -8 * abs(plain), losses


def _compare_with_unfused_hook():
    """A hook that, after each validation iteration, runs the same batch through an
    unfused copy of the model as it is then (EMA weights swapped in): the same labels,
    logits within float32 rounding of the unfused ones."""
    import copy

    from mmengine.hooks import Hook

    from mmseg_cann.fusion import unfuse_model

    class CompareWithUnfused(Hook):
        compared = 0

        def after_val_iter(self, runner, batch_idx, data_batch=None, outputs=None):
            reference = copy.deepcopy(unwrap_model(runner.model))
            unfuse_model(reference)
            with torch.no_grad():
                expected = reference.val_step(data_batch)
            for got, want in zip(outputs, expected):
                logits, ref = got.seg_logits.data, want.seg_logits.data
                assert torch.equal(got.pred_sem_seg.data, want.pred_sem_seg.data)
                assert (logits - ref).abs().max() <= 1e-4 * ref.abs().max()
            self.compared += 1
    return CompareWithUnfused()


@pytest.mark.slow
@pytest.mark.parametrize('name', ['upernet'])
def test_ema_validation_sees_swapped_weights(name, tmp_path):
    """mmengine's EMAHook swaps the averaged weights in and out through ``.data.copy_``
    before and after each validation: with two validations, the second after training
    changed the weights, the rewritten model's results are those of an unfused copy with
    the same weights (nothing derived from the weights outlives them)."""
    from mmengine.runner import Runner
    cfg = _runner_cfg(name, tmp_path, iters=4, val_interval=2)
    cfg.custom_hooks.append(dict(type='EMAHook', momentum=0.5))
    runner = Runner.from_cfg(cfg)
    compare = _compare_with_unfused_hook()
    runner.register_hook(compare, priority='LOWEST')
    runner.train()
    assert compare.compared == 2  # one validation image, two validations
