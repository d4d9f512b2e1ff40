"""tools/train.py and tools/test.py end to end, as a user runs them (synthetic DRIVE)."""
import glob
import json
import os

import pytest

from tests._helpers import run_python

DEMO = 'configs/medical/unet-s5-d16_fcn_cann_1xb4-300iter_synthetic-drive-64x64.py'
SHORT = ['train_cfg.max_iters=4', 'train_cfg.val_interval=4',
         'default_hooks.checkpoint.interval=2', 'param_scheduler.0.end=4',
         'default_hooks.logger.interval=1', 'randomness.seed=0']


@pytest.fixture(scope='module')
def drive_root(tmp_path_factory):
    root = tmp_path_factory.mktemp('drive')
    result = run_python(['tools/make_synthetic_data.py', 'drive', str(root), '--num-train', '4',
                         '--num-val', '2'])
    assert result.returncode == 0, result.stderr
    assert len(os.listdir(root / 'images' / 'training')) == 4
    return str(root)


def _losses(work_dir):
    """Training losses logged by rank 0 (vis_data/scalars.json), one per iteration."""
    path = sorted(glob.glob(os.path.join(work_dir, '*', 'vis_data', 'scalars.json')))[-1]
    rows = [json.loads(line) for line in open(path)]
    return [(r['iter'], r['loss']) for r in rows if 'loss' in r]


@pytest.mark.slow
def test_train_resume_and_test(drive_root, tmp_path):
    work = str(tmp_path / 'work')
    result = run_python(['tools/train.py', DEMO, '--work-dir', work, '--data-root', drive_root,
                         '--cfg-options'] + SHORT)
    assert result.returncode == 0, result.stderr[-3000:]
    assert os.path.exists(os.path.join(work, 'iter_4.pth'))
    log = result.stdout + result.stderr
    assert 'mmseg_cann conversion: 8 module(s) replaced' in log and 'mDice' in log

    # resume from the latest checkpoint and train two more iterations
    more = [o if not o.startswith('train_cfg.max_iters') else 'train_cfg.max_iters=6'
            for o in SHORT]
    result = run_python(['tools/train.py', DEMO, '--work-dir', work, '--data-root', drive_root,
                         '--resume', '--cfg-options'] + more)
    assert result.returncode == 0, result.stderr[-3000:]
    log = result.stdout + result.stderr
    assert 'resumed' in log.lower() and os.path.exists(os.path.join(work, 'iter_6.pth'))
    assert [i for i, _ in _losses(work)][-2:] == [5, 6]

    out, show = str(tmp_path / 'pred'), str(tmp_path / 'show')
    result = run_python(['tools/test.py', DEMO, os.path.join(work, 'iter_6.pth'),
                         '--work-dir', str(tmp_path / 'test'), '--data-root', drive_root,
                         '--out', out, '--show-dir', show])
    assert result.returncode == 0, result.stderr[-3000:]
    assert 'mDice' in result.stdout + result.stderr
    assert len(glob.glob(os.path.join(out, '*.png'))) == 2
    assert len(glob.glob(os.path.join(show, '**', '*.png'), recursive=True)) == 2


@pytest.mark.slow
def test_two_process_gloo_training_matches_unconverted(drive_root, tmp_path):
    """torchrun, 2 processes: the converted model logs the same losses as the plain one."""
    runs = {}
    for name, extra in (('cann', []), ('plain', ['custom_hooks=[]'])):
        work = str(tmp_path / name)
        result = run_python(['-m', 'torch.distributed.run', '--nproc-per-node', '2',
                             '--master-port', str(29500 + (os.getpid() + len(name)) % 1000),
                             'tools/train.py', DEMO, '--launcher', 'pytorch', '--work-dir', work,
                             '--data-root', drive_root, '--cfg-options'] + SHORT + extra)
        assert result.returncode == 0, result.stderr[-4000:]
        log = result.stdout + result.stderr
        assert ('mmseg_cann conversion' in log) == (name == 'cann')
        assert 'gloo' in log or 'distributed' in log.lower()
        runs[name] = _losses(work)
    assert len(runs['cann']) == 4
    assert runs['cann'] == runs['plain']
