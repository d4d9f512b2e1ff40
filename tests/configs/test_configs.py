"""Every shipped config: loads, builds, converts and trains 2 iterations + validation.

Runs through mmengine's Runner on synthetic data in each dataset's real layout, with
small crops (the model architectures are the configs' own). AMP configs run with the
optimizer wrapper swapped (AmpOptimWrapper needs a GPU/NPU); their precision settings
still apply.
"""
import glob
import os

import pytest
import torch
from torch import nn

from mmseg_cann import get_precision_policy
from mmseg_cann.convert import resize_routed, restore_resize, unwrap_model
from mmseg_cann.data import make_dataset
from mmseg_cann.models.registry import CANN_MODULES
from mmseg_cann.utils.config import set_data_root, shrink_for_cpu, use_cpu_optim_wrapper

from tests._helpers import REPO_ROOT, load_config

CONFIGS = sorted(os.path.relpath(p, REPO_ROOT) for p in
                 glob.glob(os.path.join(REPO_ROOT, 'configs', '*', '*.py'))
                 if '_base_' not in p)
#: dataset key in the file name -> (synthetic dataset, image size, crop)
DATASET_OF = {
    'cityscapes': ('cityscapes', (64, 128), (64, 128)),
    'drive': ('drive', (64, 64), (64, 64)),
    'stare': ('stare', (64, 64), (64, 64)),
    'chase-db1': ('chase_db1', (64, 64), (64, 64)),
    'hrf': ('hrf', (64, 64), (64, 64)),
    'synapse': ('synapse', (64, 64), (64, 64)),
}


def _dataset_of(config):
    for key, value in DATASET_OF.items():
        if key in os.path.basename(config):
            return value
    raise AssertionError(f'no dataset known for {config}')


@pytest.fixture(scope='module')
def data_roots(tmp_path_factory):
    roots = {}
    for name, size, _ in set(DATASET_OF.values()):
        root = str(tmp_path_factory.mktemp(name))
        make_dataset(name, root, num_train=2, num_val=1, seed=0, size=size)
        roots[name] = root
    return roots


@pytest.fixture(autouse=True)
def _restore_resize():
    yield
    restore_resize()


def test_every_dataset_and_variant_is_shipped():
    names = [os.path.basename(c) for c in CONFIGS]
    for algo in ('pspnet_r50-d8', 'deeplabv3plus_r50-d8', 'upernet_r50'):
        for schedule in ('40k', 'amp-40k'):
            assert f'{algo}_cann_4xb2-{schedule}_cityscapes-512x1024.py' in names
    for data in ('drive-64x64', 'stare-128x128', 'chase-db1-128x128', 'hrf-256x256',
                 'synapse-224x224'):
        for schedule in ('40k', 'amp-40k'):
            assert f'unet-s5-d16_fcn_cann_4xb4-{schedule}_{data}.py' in names


@pytest.mark.slow
@pytest.mark.parametrize('config', CONFIGS)
def test_config_trains_validates_and_is_converted(config, data_roots, tmp_path):
    from mmengine.runner import Runner
    from mmseg.models.utils import Upsample as MMSegUpsample

    cfg = load_config(config)
    assert cfg.custom_imports['imports'] == ['mmseg_cann']
    hooks = [h for h in cfg.custom_hooks if h['type'] == 'CANNOpsHook']
    assert len(hooks) == 1
    amp = '-amp-' in os.path.basename(config)
    assert (cfg.optim_wrapper.type == 'AmpOptimWrapper') == amp
    dataset, size, crop = _dataset_of(config)
    set_data_root(cfg, data_roots[dataset])
    assert use_cpu_optim_wrapper(cfg) == (amp and not torch.cuda.is_available())
    shrink_for_cpu(cfg, crop=crop, scale=size, iters=2, batch_size=2)
    cfg.work_dir = str(tmp_path)

    runner = Runner.from_cfg(cfg)
    runner.train()  # 2 iterations, then validation

    model = unwrap_model(runner.model)
    plain = [n for n, m in model.named_modules()
             if (isinstance(m, (nn.Upsample, nn.MaxPool2d, nn.AvgPool2d, nn.AdaptiveAvgPool2d))
                 and not isinstance(m, CANN_MODULES)) or type(m) is MMSegUpsample]
    assert plain == []
    assert any(isinstance(m, CANN_MODULES) for m in model.modules())
    assert model.cann_conversion_report.replaced
    assert resize_routed()
    policy = get_precision_policy()
    assert policy.max == (torch.float16 if amp else None) and policy.avg == torch.float32
    metric = 'val/mIoU' if 'cityscapes' in config else None
    scalars = runner.message_hub.log_scalars
    assert any(k.startswith('val/') for k in scalars), sorted(scalars)
    if metric:
        assert 0.0 <= scalars[metric].current() <= 100.0
    assert os.path.exists(os.path.join(str(tmp_path), 'iter_2.pth'))
