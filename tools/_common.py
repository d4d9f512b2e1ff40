"""Argument and config helpers shared by the scripts in ``tools/``.

The tools run as scripts (``python tools/NAME.py``), so Python puts this folder first on
``sys.path`` and ``from _common import ...`` finds this module without any path edits.
"""
from __future__ import annotations

import os
import os.path as osp


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
    """The config at ``path`` with ``--cfg-options`` merged in; mmseg_cann imported (its
    modules and hook registered) and mmengine's checkpoint contents allow-listed for
    ``torch.load(weights_only=True)``."""
    from mmengine.config import Config

    import mmseg_cann
    mmseg_cann.allow_mmengine_checkpoints()
    cfg = Config.fromfile(path)
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
        set_data_root(cfg, args.data_root)
    if getattr(args, 'amp', False):
        wrapper = cfg.optim_wrapper.get('type', 'OptimWrapper')
        if wrapper == 'OptimWrapper':
            cfg.optim_wrapper.type = 'AmpOptimWrapper'
            cfg.optim_wrapper.loss_scale = 'dynamic'
        elif wrapper != 'AmpOptimWrapper':
            raise SystemExit(f'--amp is only supported with OptimWrapper, got {wrapper}')
    if use_cpu_optim_wrapper(cfg):
        print('no GPU/NPU here: AmpOptimWrapper replaced by OptimWrapper '
              '(the CANN precision settings still apply)')
    if use_cpu_distributed(cfg):
        print('no GPU/NPU here: distributed run on CPU processes (gloo, BN for SyncBN)')
        init_cpu_process_group()
    return cfg


def resolve_device(name: str, tool: str):
    """The torch device for ``name``, with a clear message when it is not available."""
    import torch
    if name == 'cuda' and not torch.cuda.is_available():
        raise SystemExit(f'{tool}: --device cuda requested but no CUDA device is available')
    if name == 'npu':
        try:
            import torch_npu  # noqa: F401  (registers the npu device)
        except Exception as exc:  # torch_npu fails to import without the CANN runtime
            raise SystemExit(f'{tool}: --device npu needs torch_npu and the CANN '
                             f'runtime ({type(exc).__name__}: {exc})')
        if not torch.npu.is_available():
            raise SystemExit(f'{tool}: torch_npu is installed but no NPU is available')
    return torch.device(name)
