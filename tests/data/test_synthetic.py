"""Synthetic datasets: the real layout, read by mmseg's own dataset classes."""
import os

import numpy as np
import pytest
from mmengine.registry import init_default_scope

from mmseg_cann.data import DATASETS, make_dataset

from tests._helpers import load_config

CONFIG_OF = {
    'cityscapes': 'configs/cityscapes/pspnet_r50-d8_cann_4xb2-40k_cityscapes-512x1024.py',
    'drive': 'configs/medical/unet-s5-d16_fcn_cann_4xb4-40k_drive-64x64.py',
    'stare': 'configs/medical/unet-s5-d16_fcn_cann_4xb4-40k_stare-128x128.py',
    'chase_db1': 'configs/medical/unet-s5-d16_fcn_cann_4xb4-40k_chase-db1-128x128.py',
    'hrf': 'configs/medical/unet-s5-d16_fcn_cann_4xb4-40k_hrf-256x256.py',
    'synapse': 'configs/medical/unet-s5-d16_fcn_cann_4xb4-40k_synapse-224x224.py',
}


def _leaf(dataset_cfg):
    while 'dataset' in dataset_cfg:
        dataset_cfg = dataset_cfg['dataset']
    return dataset_cfg


@pytest.mark.parametrize('name', sorted(DATASETS))
def test_mmseg_reads_the_layout(name, tmp_path):
    import cv2
    from mmseg.registry import DATASETS as MMSEG_DATASETS
    init_default_scope('mmseg')
    written = make_dataset(name, str(tmp_path), num_train=3, num_val=2, seed=1)
    cfg = load_config(CONFIG_OF[name])
    for loader, count in (('train_dataloader', 3), ('val_dataloader', 2)):
        dataset_cfg = dict(_leaf(cfg[loader]['dataset']))
        dataset_cfg.update(data_root=str(tmp_path), pipeline=[])
        dataset = MMSEG_DATASETS.build(dataset_cfg)
        assert len(dataset) == count
        for info in dataset:
            assert os.path.exists(info['img_path']) and os.path.exists(info['seg_map_path'])
            label = cv2.imread(info['seg_map_path'], cv2.IMREAD_UNCHANGED)
            classes = set(np.unique(label)) - {255}
            assert label.ndim == 2 and max(classes) < DATASETS[name].num_classes
            assert len(classes) >= 2  # every sample has foreground
    assert sum(len(v) for v in written.values()) == 5


def test_same_seed_same_files(tmp_path):
    a = make_dataset('drive', str(tmp_path / 'a'), 2, 1, seed=3)
    b = make_dataset('drive', str(tmp_path / 'b'), 2, 1, seed=3)
    for pa, pb in zip(a['training'], b['training']):
        assert open(pa, 'rb').read() == open(pb, 'rb').read()


@pytest.mark.parametrize('kwargs', [dict(name='ade20k'), dict(num_train=0),
                                    dict(size=(8, 8)), dict(num_val=True)])
def test_bad_arguments(kwargs, tmp_path):
    args = dict(name='drive', out_dir=str(tmp_path))
    args.update(kwargs)
    with pytest.raises(ValueError):
        make_dataset(**args)
