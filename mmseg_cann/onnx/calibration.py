"""The tensors a model really sees, for calibration and evaluation of a quantized graph:
a config's dataset through its test pipeline and the segmentor's data preprocessor.

The exported graph has a fixed input size, so the test pipeline's ``Resize`` is set to
that size (``keep_ratio=False``); the data preprocessor then normalises (and pads, where
the config pads to a size divisor). The samples keep mmseg's metadata (``ori_shape``,
``img_shape``, padding), so predictions go back to the original image size through the
segmentor's own ``postprocess_result`` and mmseg's ``IoUMetric`` scores them as
``tools/test.py`` would.
"""
from __future__ import annotations

import copy
from typing import Iterator, List, Optional, Tuple

import numpy as np

#: dataloaders a split name refers to
SPLITS = ('train', 'val', 'test')


def test_pipeline(cfg) -> list:
    """The config's test pipeline (``test_pipeline``, else the val dataset's)."""
    pipeline = cfg.get('test_pipeline')
    if pipeline is None:
        pipeline = cfg.val_dataloader.dataset.get('pipeline')
    if not pipeline:
        raise ValueError('the config has no test_pipeline (nor a val dataset pipeline)')
    return list(pipeline)


def fixed_test_size(cfg) -> Optional[Tuple[int, int]]:
    """``(H, W)`` of the test pipeline's ``Resize`` when it has one fixed scale, else
    None (mmcv scales are ``(w, h)``)."""
    try:
        pipeline = test_pipeline(cfg)
    except (ValueError, AttributeError, KeyError):
        return None
    for step in pipeline:
        if step.get('type') == 'Resize':
            scale = step.get('scale')
            if isinstance(scale, (tuple, list)) and len(scale) == 2 and \
                    all(isinstance(v, int) for v in scale):
                return int(scale[1]), int(scale[0])
            return None
    return None


def split_dataset_config(cfg, split: str) -> dict:
    """The (innermost) dataset of ``{split}_dataloader`` with the test pipeline."""
    from ..utils.config import leaf_datasets
    if split not in SPLITS:
        raise ValueError(f'split must be one of {SPLITS}, got {split!r}')
    loader = cfg.get(f'{split}_dataloader')
    leaves = list(leaf_datasets(loader.get('dataset'))) if loader else []
    if not leaves:
        raise ValueError(f'the config has no {split}_dataloader dataset')
    dataset = copy.deepcopy(dict(leaves[0]))
    dataset['pipeline'] = test_pipeline(cfg)
    return dataset


def _at_size(pipeline: list, shape: Tuple[int, int]) -> list:
    steps = []
    for step in pipeline:
        step = dict(step)
        if step.get('type') == 'Resize':
            step.update(scale=(int(shape[1]), int(shape[0])), keep_ratio=False)
        steps.append(step)
    return steps


def spread_indices(length: int, count: int) -> List[int]:
    """``count`` indices spread evenly over ``range(length)`` (all when count >= length)."""
    if count >= length:
        return list(range(length))
    return sorted({int(round(v)) for v in np.linspace(0, length - 1, count)})


def build_dataset(cfg, split: str, shape: Tuple[int, int]):
    """The split's dataset with the test pipeline resizing to ``shape`` ``(H, W)``
    (mmseg's default scope initialised)."""
    from mmseg.registry import DATASETS
    config = split_dataset_config(cfg, split)
    config['pipeline'] = _at_size(config['pipeline'], shape)
    return DATASETS.build(config)


def dataset_batches(dataset, count: int, shape: Tuple[int, int],
                    data_preprocessor) -> Iterator[Tuple[np.ndarray, list]]:
    """Up to ``count`` images of ``dataset`` (:func:`build_dataset`), spread over it, one
    at a time: ``(inputs (1, 3, H, W) float32, data_samples)``.

    Args:
        dataset: an mmseg dataset whose pipeline resizes to ``shape``.
        count: how many images (>= 1).
        shape: ``(H, W)`` of the graph's input.
        data_preprocessor: the segmentor's ``SegDataPreProcessor``.
    """
    import torch
    from mmengine.dataset import pseudo_collate
    if count < 1:
        raise ValueError(f'count must be >= 1, got {count}')
    for index in spread_indices(len(dataset), count):
        with torch.no_grad():
            data = data_preprocessor(pseudo_collate([dataset[index]]), False)
        inputs = data['inputs']
        if tuple(inputs.shape[2:]) != tuple(shape):
            raise ValueError(f'the data preprocessor gives inputs of {tuple(inputs.shape[2:])}, '
                             f'the graph takes {tuple(shape)} (a size divisor that the '
                             'shape is not a multiple of?)')
        yield inputs.numpy().astype(np.float32), data['data_samples']


def random_inputs(count: int, shape: Tuple[int, int], seed: int = 0) -> List[np.ndarray]:
    """``count`` seeded standard-normal ``(1, 3, H, W)`` float32 inputs."""
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((1, 3) + tuple(shape)).astype(np.float32)
            for _ in range(count)]
