"""Config helpers shared by the tools, the demo and the tests.

* :func:`set_data_root` points every dataloader's dataset (also datasets wrapped in
  ``RepeatDataset``/``ConcatDataset``/...) at one data root;
* :func:`use_cpu_optim_wrapper` swaps ``AmpOptimWrapper`` (which asserts that a GPU or an
  NPU exists) for ``OptimWrapper`` on machines without one; the precision settings of
  the ``CANNOpsHook`` still apply;
* :func:`use_cpu_distributed` makes a distributed config run on CPU processes (gloo,
  DDP without device ids, BatchNorm instead of SyncBN, which needs a GPU);
* :func:`shrink_for_cpu` turns a full-size config into a quick CPU run: small crops and
  image scales, a few iterations, no pretrained download, no worker processes.
"""
from __future__ import annotations

from typing import Iterator, Optional, Tuple

DATALOADERS = ('train_dataloader', 'val_dataloader', 'test_dataloader')


def _datasets(dataset) -> Iterator[dict]:
    """Every dataset dict inside ``dataset``, wrappers included (depth first)."""
    if not isinstance(dataset, dict):
        return
    yield dataset
    inner = dataset.get('dataset')
    if inner is not None:
        yield from _datasets(inner)
    for child in dataset.get('datasets', []) or []:
        yield from _datasets(child)


def leaf_datasets(dataset) -> Iterator[dict]:
    """The innermost dataset dicts of ``dataset`` (inside RepeatDataset and the like)."""
    for d in _datasets(dataset):
        if 'dataset' not in d and 'datasets' not in d:
            yield d


def set_data_root(cfg, data_root: str) -> None:
    """Set ``data_root`` of every (wrapped) dataset of every dataloader in ``cfg``."""
    for name in DATALOADERS:
        loader = cfg.get(name)
        if loader is None:
            continue
        for dataset in leaf_datasets(loader.get('dataset')):
            dataset['data_root'] = data_root


def accelerator_available() -> bool:
    """Whether a CUDA GPU or an Ascend NPU can run AmpOptimWrapper here."""
    import torch
    if torch.cuda.is_available():
        return True
    try:
        import torch_npu  # noqa: F401
    except Exception:  # torch_npu fails to import without the CANN runtime
        return False
    return bool(torch.npu.is_available())


def use_cpu_optim_wrapper(cfg) -> bool:
    """Replace ``AmpOptimWrapper`` by ``OptimWrapper`` when no accelerator exists.

    Returns whether the config was changed. Only the loss-scaling wrapper is swapped:
    the ``CANNOpsHook`` precision settings of the config still apply.
    """
    wrapper = cfg.get('optim_wrapper')
    if not wrapper or wrapper.get('type') != 'AmpOptimWrapper' or accelerator_available():
        return False
    for key in ('loss_scale', 'dtype', 'use_fsdp'):
        wrapper.pop(key, None)
    wrapper['type'] = 'OptimWrapper'
    return True


def sync_bn_to_bn(node) -> int:
    """Replace every ``SyncBN`` norm config under ``node`` by ``BN``; returns the count.

    PyTorch's SyncBatchNorm runs on GPUs only; BN computes the same inference math.
    """
    count = 0
    if isinstance(node, dict):
        if node.get('type') == 'SyncBN':
            node['type'] = 'BN'
            count += 1
        for value in node.values():
            count += sync_bn_to_bn(value)
    elif isinstance(node, (list, tuple)):
        for value in node:
            count += sync_bn_to_bn(value)
    return count


def use_cpu_distributed(cfg) -> bool:
    """Adapt a config launched with a distributed launcher to CPU-only processes.

    Without a GPU/NPU: the process group uses gloo, ``MMDistributedDataParallel`` gets
    ``device_ids=None`` (CPU modules), and ``SyncBN`` becomes ``BN`` (PyTorch's SyncBN
    runs on GPUs only). Returns whether the config was changed.
    """
    if cfg.get('launcher', 'none') == 'none' or accelerator_available():
        return False
    env_cfg = cfg.setdefault('env_cfg', {})
    env_cfg.setdefault('dist_cfg', {})['backend'] = 'gloo'
    wrapper = cfg.get('model_wrapper_cfg') or dict(type='MMDistributedDataParallel')
    wrapper['device_ids'] = None
    cfg.model_wrapper_cfg = wrapper
    sync_bn_to_bn(cfg.model)
    return True


def init_cpu_process_group() -> None:
    """Start the gloo process group of a CPU distributed run (torchrun's env:// variables).

    mmengine's ``pytorch`` launcher calls ``torch.cuda.set_device`` before creating the
    group, which fails on a CPU-only torch; the Runner skips its own initialisation when
    a group already exists.
    """
    import torch.distributed as dist
    if not dist.is_initialized():
        dist.init_process_group(backend='gloo', init_method='env://')


def _shrink_pipeline(pipeline, crop: Tuple[int, int], scale: Tuple[int, int]) -> None:
    for step in pipeline or []:
        kind = step.get('type')
        if kind in ('Resize', 'RandomResize') and 'scale' in step:
            step['scale'] = (scale[1], scale[0])  # mmcv scales are (w, h)
        if kind == 'RandomCrop':
            step['crop_size'] = crop
        if kind == 'TestTimeAug':
            for group in step.get('transforms', []):
                _shrink_pipeline(group, crop, scale)


def shrink_for_cpu(cfg, crop: Tuple[int, int], scale: Optional[Tuple[int, int]] = None,
                   iters: int = 2, batch_size: int = 2, val_interval: Optional[int] = None,
                   log_interval: int = 1) -> None:
    """Make ``cfg`` a quick CPU run of ``iters`` iterations on ``crop``-sized inputs.

    ``scale`` (H, W) replaces the resize scales of every pipeline (default: ``crop``);
    pretrained weights are disabled (nothing can be downloaded), dataloaders run in the
    main process, validation runs every ``val_interval`` iterations (default: at the end).
    """
    scale = scale or crop
    model = cfg.model
    model['pretrained'] = None
    if isinstance(model.get('backbone'), dict):
        model['backbone'].pop('init_cfg', None)
    for preprocessor in (model.get('data_preprocessor'), cfg.get('data_preprocessor')):
        # pad to the crop, unless the config pads to a size divisor instead
        if preprocessor is not None and preprocessor.get('size_divisor') is None:
            preprocessor['size'] = crop
    test_cfg = model.get('test_cfg')
    if test_cfg and test_cfg.get('mode') == 'slide':
        test_cfg['crop_size'] = crop
        test_cfg['stride'] = tuple(max(1, c * 2 // 3) for c in crop)
    for name in DATALOADERS:
        loader = cfg.get(name)
        if loader is None:
            continue
        loader['num_workers'] = 0
        loader['persistent_workers'] = False
        if name == 'train_dataloader':
            loader['batch_size'] = batch_size
        for dataset in _datasets(loader.get('dataset')):
            _shrink_pipeline(dataset.get('pipeline'), crop, scale)
            if dataset.get('type') == 'RepeatDataset':
                dataset['times'] = max(1, iters)
    for name in ('train_pipeline', 'test_pipeline'):
        _shrink_pipeline(cfg.get(name), crop, scale)
    cfg.train_cfg = dict(type='IterBasedTrainLoop', max_iters=iters,
                         val_interval=val_interval or iters)
    for scheduler in (cfg.get('param_scheduler') or []):
        if scheduler.get('by_epoch') is False or scheduler.get('type') == 'PolyLR':
            scheduler['end'] = iters
    hooks = cfg.get('default_hooks')
    if hooks:
        if 'logger' in hooks:
            hooks['logger']['interval'] = log_interval
        if 'checkpoint' in hooks:
            hooks['checkpoint']['interval'] = iters
