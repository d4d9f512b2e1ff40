"""Config helpers: data roots through wrappers, CPU optimizer wrapper, CPU distributed."""
from mmengine.config import Config

from mmseg_cann.utils.config import (set_data_root, shrink_for_cpu, use_cpu_distributed,
                                     use_cpu_optim_wrapper)

from tests._helpers import load_config


def test_set_data_root_reaches_wrapped_datasets():
    cfg = Config(dict(
        train_dataloader=dict(dataset=dict(type='RepeatDataset', times=2, dataset=dict(
            type='ConcatDataset', datasets=[dict(type='A', data_root='x'),
                                            dict(type='B', data_root='y')]))),
        val_dataloader=dict(dataset=dict(type='C', data_root='z')),
        test_dataloader=dict(dataset=dict(type='C', data_root='z'))))
    set_data_root(cfg, '/data/new')
    inner = cfg.train_dataloader.dataset.dataset.datasets
    assert [d.data_root for d in inner] == ['/data/new', '/data/new']
    assert cfg.val_dataloader.dataset.data_root == '/data/new'
    assert 'data_root' not in cfg.train_dataloader.dataset  # wrappers untouched


def test_cpu_optim_wrapper_swap():
    cfg = load_config('configs/cityscapes/pspnet_r50-d8_cann_4xb2-amp-40k_cityscapes-512x1024.py')
    assert cfg.optim_wrapper.type == 'AmpOptimWrapper'
    assert use_cpu_optim_wrapper(cfg)
    assert cfg.optim_wrapper.type == 'OptimWrapper' and 'loss_scale' not in cfg.optim_wrapper
    assert cfg.optim_wrapper.optimizer.type == 'SGD'
    assert not use_cpu_optim_wrapper(cfg)  # nothing left to swap
    hook = cfg.custom_hooks[0]
    assert hook.pool_precision == dict(max='fp16', avg='fp32')  # precision still applies


def test_cpu_distributed_and_shrink():
    cfg = load_config('configs/medical/unet-s5-d16_fcn_cann_4xb4-40k_stare-128x128.py')
    assert not use_cpu_distributed(cfg)  # not launched distributed
    cfg.launcher = 'pytorch'
    assert use_cpu_distributed(cfg)
    assert cfg.env_cfg.dist_cfg.backend == 'gloo' and cfg.model_wrapper_cfg.device_ids is None
    assert 'SyncBN' not in str(cfg.model)
    shrink_for_cpu(cfg, crop=(32, 32), scale=(48, 48), iters=3)
    assert cfg.train_cfg.max_iters == 3 and cfg.model.test_cfg.crop_size == (32, 32)
    train = cfg.train_dataloader
    assert train.num_workers == 0 and train.dataset.times == 3
    steps = {s['type']: s for s in train.dataset.dataset.pipeline}
    assert steps['RandomCrop']['crop_size'] == (32, 32)
    assert steps['RandomResize']['scale'] == (48, 48)
