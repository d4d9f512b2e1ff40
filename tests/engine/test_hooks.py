"""CANNOpsHook through mmengine's Runner: converts before val/test, applies the policy."""
import os

import pytest
import torch

from mmseg_cann import CANNOpsHook, get_precision_policy
from mmseg_cann.convert import restore_resize, unwrap_model
from mmseg_cann.data import make_dataset
from mmseg_cann.models.registry import CANN_MODULES
from mmseg_cann.utils.config import set_data_root

from tests._helpers import load_config

DEMO = 'configs/medical/unet-s5-d16_fcn_cann_1xb4-300iter_synthetic-drive-64x64.py'


@pytest.fixture(autouse=True)
def _restore_resize():
    yield
    restore_resize()


def test_registered_and_validates():
    from mmseg.registry import HOOKS
    hook = HOOKS.build(dict(type='CANNOpsHook', pool_precision=dict(max='fp16')))
    assert isinstance(hook, CANNOpsHook)
    with pytest.raises(ValueError):
        CANNOpsHook(pool_precision=dict(max='fp8'))
    with pytest.raises(TypeError):
        CANNOpsHook(pool_precision='fp16')


def test_config_built_cann_modules_keep_their_settings(tmp_path):
    """A model whose config builds CANN modules with their own backend/precision keeps
    them through the hook's conversion; a backend given to the hook applies to all."""
    from types import SimpleNamespace

    from mmengine.logging import MMLogger
    from torch import nn

    from mmseg_cann import CANNMaxPool2d

    def runner():
        model = nn.Sequential(CANNMaxPool2d(2, backend='native', precision='fp16'),
                              nn.AvgPool2d(2))
        return SimpleNamespace(model=model, logger=MMLogger.get_instance('hook-test'))

    kept = runner()
    CANNOpsHook(resize=False).before_run(kept)
    assert (kept.model[0].backend, kept.model[0].precision) == ('native', 'fp16')
    assert kept.model[1].backend == 'auto'
    given = runner()
    CANNOpsHook(resize=False, backend='fast').before_run(given)
    assert [m.backend for m in given.model] == ['fast', 'fast']
    assert given.model[0].precision == 'fp16'


@pytest.mark.parametrize('mode', ['val', 'test'])
def test_converts_before_validation_and_testing(mode, tmp_path, monkeypatch):
    from mmengine.runner import Runner
    monkeypatch.setenv('NPUJITCompile', '0')  # read by mmengine as "on": the hook warns
    root = str(tmp_path / 'data')
    make_dataset('drive', root, num_train=1, num_val=2, seed=0)
    cfg = load_config(DEMO)
    set_data_root(cfg, root)
    cfg.work_dir = str(tmp_path / 'work')
    cfg.custom_hooks = [dict(type='CANNOpsHook', pool_precision=dict(max='bf16', avg='fp32'),
                             upsample_precision='fp32')]
    runner = Runner.from_cfg(cfg)
    metrics = runner.val() if mode == 'val' else runner.test()
    assert 'mDice' in metrics
    model = unwrap_model(runner.model)
    assert sum(isinstance(m, CANN_MODULES) for m in model.modules()) == 8
    policy = get_precision_policy()
    assert (policy.max, policy.avg, policy.upsample) == (torch.bfloat16, torch.float32,
                                                         torch.float32)
    log = open(os.path.join(cfg.work_dir, runner.timestamp, f'{runner.timestamp}.log')).read()
    assert log.count('mmseg_cann conversion: 8 module(s) replaced') == 1
    assert log.count("NPUJITCompile='0' turns NPU JIT compilation ON") == 1
