"""Argument and config helpers shared by the scripts in ``tools/``.

The tools run as scripts (``python tools/NAME.py``), so Python puts this folder first on
``sys.path`` and ``from _common import ...`` finds this module without any path edits.

User mistakes (a missing config, an unreadable checkpoint, a data root without the
dataset's folders, a shape the model cannot take, an output folder that cannot be made)
raise :class:`UserError` before any work starts; :func:`run` turns it into one line on
stderr and exit code 2. Tracebacks stay for real bugs; ``--debug`` shows them for user
errors too.
"""
from __future__ import annotations

import os
import os.path as osp
import sys

#: mmseg dataset type -> tools/make_synthetic_data.py name
SYNTHETIC_NAMES = {'CityscapesDataset': 'cityscapes', 'DRIVEDataset': 'drive',
                   'STAREDataset': 'stare', 'ChaseDB1Dataset': 'chase_db1',
                   'HRFDataset': 'hrf', 'SynapseDataset': 'synapse'}
LAYOUT_DOC = 'docs/training.md#synthetic-datasets'


class UserError(Exception):
    """A mistake in what the user gave: the tool exits 2 with this one-line message."""


def add_debug(parser) -> None:
    parser.add_argument('--debug', action='store_true',
                        help='show the Python traceback of user errors too')


def run(main, prog: str) -> int:
    """``main()`` with user errors answered as ``PROG: error: MESSAGE`` and exit 2."""
    try:
        return main()
    except UserError as exc:
        if '--debug' in sys.argv[1:]:
            raise
        print(f'{prog}: error: {exc}', file=sys.stderr)
        return 2


def check_config(path: str):
    """The mmengine Config at ``path``; UserError if it is missing or cannot be read."""
    if not osp.isfile(path):
        raise UserError(f'config {path!r} does not exist (give a config file, e.g. one '
                        'under configs/)')
    from mmengine.config import Config
    try:
        return Config.fromfile(path)
    except Exception as exc:
        raise UserError(f'config {path!r} cannot be read: {type(exc).__name__}: '
                        f'{_first_line(exc)}') from exc


def check_checkpoint(path: str) -> None:
    """UserError unless ``path`` is a readable PyTorch/mmengine checkpoint (loaded with
    ``weights_only=True`` and the mmengine allow-list, memory-mapped: nothing is copied)."""
    if not osp.isfile(path):
        raise UserError(f'checkpoint {path!r} does not exist')
    import torch

    import mmseg_cann
    mmseg_cann.allow_mmengine_checkpoints()
    import zipfile
    try:  # memory-mapped where the format allows it (torch.save's zip format)
        content = torch.load(path, map_location='cpu', weights_only=True,
                             mmap=zipfile.is_zipfile(path))
    except Exception as exc:
        raise UserError(f'checkpoint {path!r} is not a PyTorch/mmengine checkpoint '
                        f'({type(exc).__name__}: {_first_line(exc)})') from exc
    if not isinstance(content, dict):
        raise UserError(f'checkpoint {path!r} holds a {type(content).__name__}, not a '
                        'state dict or an mmengine checkpoint')


def check_data(cfg, loaders=('train_dataloader', 'val_dataloader', 'test_dataloader')) -> None:
    """UserError naming the missing folders when a dataset's data_root lacks them."""
    from mmseg_cann.utils.config import leaf_datasets
    for name in loaders:
        loader = cfg.get(name)
        if not loader:
            continue
        for dataset in leaf_datasets(loader.get('dataset')):
            root = dataset.get('data_root', '') or ''
            prefix = dataset.get('data_prefix', {}) or {}
            missing = [osp.join(root, p) for p in prefix.values()
                       if p and not osp.isdir(osp.join(root, p))]
            if missing:
                kind = dataset.get('type', '?')
                synthetic = SYNTHETIC_NAMES.get(kind)
                hint = (f'; make a synthetic one with: python tools/make_synthetic_data.py '
                        f'{synthetic} {root or "DIR"}' if synthetic else '')
                raise UserError(f'{kind} data root {root!r} lacks {", ".join(missing)} '
                                f'(layout: {LAYOUT_DOC}){hint}')


def check_shape(shape, multiple=None, what: str = '--shape') -> None:
    """UserError unless H, W are positive (and multiples of ``multiple``)."""
    if any(int(v) < 1 for v in shape):
        raise UserError(f'{what} must be positive, got {" ".join(str(v) for v in shape)}')
    if multiple and any(int(v) % multiple for v in shape):
        raise UserError(f'{what} {" ".join(str(v) for v in shape)}: this model needs sides '
                        f'divisible by {multiple}')


def required_multiple(model_cfg):
    """The multiple input sides must have for ``model_cfg``'s backbone, or None.

    mmseg's UNet asserts it (``UNet._check_input_divisible``): one factor 2 per stage
    with a stride of 2 or a downsampling before it.
    """
    backbone = model_cfg.get('backbone', {}) or {}
    if backbone.get('type') != 'UNet':
        return None
    stages = backbone.get('num_stages', 5)
    strides = backbone.get('strides', (1, 1, 1, 1, 1))
    downsamples = backbone.get('downsamples', (True, True, True, True))
    rate = 1
    for i in range(1, stages):
        if strides[i] == 2 or downsamples[i - 1]:
            rate *= 2
    return rate


def check_output(path: str, what: str) -> str:
    """Create the folder ``path`` will be written in; UserError if that fails."""
    folder = osp.dirname(osp.abspath(path))
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as exc:
        raise UserError(f'{what} {path!r}: cannot create folder {folder!r} '
                        f'({exc.strerror})') from exc
    if not os.access(folder, os.W_OK):
        raise UserError(f'{what} {path!r}: folder {folder!r} is not writable')
    return path


def check_output_dir(path: str, what: str) -> str:
    """Create the folder ``path``; UserError if that fails."""
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise UserError(f'{what} {path!r}: cannot create it ({exc.strerror})') from exc
    if not os.access(path, os.W_OK):
        raise UserError(f'{what} {path!r} is not writable')
    return path


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else ''


def add_cfg_options(parser) -> None:
    """``--cfg-options key=value ...`` with mmengine's ``DictAction`` (as mmseg's tools)."""
    from mmengine.config import DictAction
    parser.add_argument('--cfg-options', nargs='+', action=DictAction, metavar='KEY=VALUE',
                        help='override settings in the config, key=value (mmengine syntax)')


def add_runner_args(parser) -> None:
    """Options shared by tools/train.py and tools/test.py."""
    parser.add_argument('--data-root', help='dataset root for every dataloader')
    add_cfg_options(parser)
    parser.add_argument('--launcher', choices=['none', 'pytorch', 'slurm', 'mpi'],
                        default='none', help='job launcher')
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)


def parse_runner_args(parser, argv=None):
    """Parse, and export LOCAL_RANK for launchers that pass --local-rank."""
    args = parser.parse_args(argv)
    if 'LOCAL_RANK' not in os.environ:
        os.environ['LOCAL_RANK'] = str(args.local_rank)
    return args


def load_config(path: str, cfg_options=None):
    """The config at ``path`` (checked: :func:`check_config`) with ``--cfg-options``
    merged in; mmseg_cann imported (its modules and hook registered) and mmengine's
    checkpoint contents allow-listed for ``torch.load(weights_only=True)``."""
    import mmseg_cann
    mmseg_cann.allow_mmengine_checkpoints()
    cfg = check_config(path)
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    return cfg


def build_runner_config(args):
    """The config with train.py's / test.py's command line applied."""
    from mmseg_cann.utils.config import (init_cpu_process_group, set_data_root,
                                         use_cpu_distributed, use_cpu_optim_wrapper)

    cfg = load_config(args.config, args.cfg_options)
    cfg.launcher = args.launcher
    if args.work_dir is not None:
        cfg.work_dir = args.work_dir
    elif cfg.get('work_dir', None) is None:
        cfg.work_dir = osp.join('./work_dirs', osp.splitext(osp.basename(args.config))[0])
    if getattr(args, 'data_root', None):
        if not osp.isdir(args.data_root):
            raise UserError(f'--data-root {args.data_root!r} does not exist')
        set_data_root(cfg, args.data_root)
    if getattr(args, 'amp', False):
        wrapper = cfg.optim_wrapper.get('type', 'OptimWrapper')
        if wrapper == 'OptimWrapper':
            cfg.optim_wrapper.type = 'AmpOptimWrapper'
            cfg.optim_wrapper.loss_scale = 'dynamic'
        elif wrapper != 'AmpOptimWrapper':
            raise UserError(f'--amp needs an OptimWrapper in the config, got {wrapper}')
    if use_cpu_optim_wrapper(cfg):
        print('no GPU/NPU here: AmpOptimWrapper replaced by OptimWrapper '
              '(the CANN precision settings still apply)')
    if use_cpu_distributed(cfg):
        print('no GPU/NPU here: distributed run on CPU processes (gloo, BN for SyncBN)')
        init_cpu_process_group()
    return cfg


def close_distributed() -> None:
    """Destroy the default process group where this run created one (torchrun runs), so
    gloo's threads are joined before the interpreter exits: left to the exit handlers
    they can abort a rank ('terminate called without an active exception')."""
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def resolve_device(name: str):
    """The torch device for ``name``, with a clear message when it is not available."""
    import torch
    if name == 'cuda' and not torch.cuda.is_available():
        raise UserError('--device cuda requested but no CUDA device is available')
    if name == 'npu':
        try:
            import torch_npu  # noqa: F401  (registers the npu device)
        except Exception as exc:  # torch_npu fails to import without the CANN runtime
            raise UserError(f'--device npu needs torch_npu and the CANN runtime '
                            f'({type(exc).__name__}: {_first_line(exc)}); see '
                            'tools/env_check.py') from exc
        if not torch.npu.is_available():
            raise UserError('torch_npu is installed but no NPU is available (see '
                            'tools/env_check.py)')
    return torch.device(name)


def build_segmentor(base: str, overrides=None):
    """An mmseg segmentor from config ``base`` (``mmseg::...`` or a path) for benchmarks:
    ``SyncBN`` as ``BN``, no pretrained download, ``overrides(cfg)`` applied, mmseg's
    seeded initialisation (its per-parameter log lines silenced), in eval mode."""
    import tempfile

    import torch
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    from mmseg.registry import MODELS

    from mmseg_cann.utils.config import sync_bn_to_bn
    with tempfile.TemporaryDirectory() as tmp:
        path = osp.join(tmp, 'cfg.py')
        with open(path, 'w') as f:
            f.write(f"_base_ = '{base}'\n")
        cfg = Config.fromfile(path)
    init_default_scope('mmseg')
    sync_bn_to_bn(cfg.model)
    cfg.model.pretrained = None
    cfg.model.backbone.pop('init_cfg', None)
    if overrides is not None:
        overrides(cfg)
    torch.manual_seed(0)
    model = MODELS.build(cfg.model)
    quiet_init_weights(model)
    return model.eval()


def quiet_init_weights(model) -> None:
    """``model.init_weights()`` without mmengine's per-parameter info log."""
    import logging

    from mmengine.logging import MMLogger
    logger = MMLogger.get_current_instance()
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        model.init_weights()
    finally:
        logger.setLevel(level)


def random_seg_samples(hw, num_classes: int, count: int, generator, device='cpu') -> list:
    """``count`` mmseg ``SegDataSample``s of size ``hw`` with uniformly random labels."""
    import torch
    from mmengine.structures import PixelData
    from mmseg.structures import SegDataSample
    hw = tuple(hw)
    samples = []
    for _ in range(count):
        sample = SegDataSample(metainfo=dict(img_shape=hw, ori_shape=hw, pad_shape=hw))
        sample.gt_sem_seg = PixelData(data=torch.randint(
            0, num_classes, (1,) + hw, generator=generator).to(device))
        samples.append(sample)
    return samples


def sgd_step(model, optim, x, samples):
    """One training step of an mmseg segmentor: ``model.loss``, the sum of its loss
    terms, backward, ``optim.step()``; the detached loss (autograd on)."""
    import torch
    with torch.enable_grad():
        losses = model.loss(x, samples)
        loss = sum(v for k, v in losses.items() if 'loss' in k)
        optim.zero_grad()
        loss.backward()
        optim.step()
    return loss.detach()
