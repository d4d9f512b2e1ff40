"""The package as a user installs it: sdist -> wheel -> ``pip install --no-deps --target``,
then used from a folder outside the repository (the repository not on ``sys.path``):
list and copy a shipped config, inherit it in a user config, and train 2 iterations plus
a validation with mmseg's own ``tools/train.py`` (``Config.fromfile`` + ``Runner``), then
test the checkpoint with the package's ``.mim/tools/test.py`` as openmim runs it."""
import email
import glob
import os
import subprocess
import sys
import zipfile

import pytest

from tests._helpers import REPO_ROOT

pytestmark = pytest.mark.slow

DEMO = 'medical/unet-s5-d16_fcn_cann_1xb4-300iter_synthetic-drive-64x64.py'


def _run(args, cwd, env=None, timeout=600):
    proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, f'{args} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}'
    return proc.stdout


@pytest.fixture(scope='module')
def built(tmp_path_factory):
    """(sdist path, wheel path, install target) built from the repository."""
    out = tmp_path_factory.mktemp('dist')
    _run([sys.executable, 'setup.py', '-q', 'sdist', '-d', str(out)], REPO_ROOT)
    (sdist,) = glob.glob(str(out / 'mmseg_cann-*.tar.gz')) or glob.glob(
        str(out / 'mmseg-cann-*.tar.gz'))
    # the wheel is built from the sdist, so the sdist must carry everything it needs
    _run([sys.executable, '-m', 'pip', 'wheel', '-q', '--no-deps', '--no-build-isolation',
          sdist, '-w', str(out)], str(out))
    (wheel,) = glob.glob(str(out / 'mmseg_cann-*.whl'))
    target = out / 'site'
    _run([sys.executable, '-m', 'pip', 'install', '-q', '--no-deps', '--target',
          str(target), wheel], str(out))
    return sdist, wheel, target


def _repo_files(folder, pattern):
    root = os.path.join(REPO_ROOT, folder)
    return sorted(os.path.relpath(p, root).replace(os.sep, '/')
                  for p in glob.glob(os.path.join(root, '**', pattern), recursive=True)
                  if '__pycache__' not in p)


def test_wheel_carries_every_config_tool_and_the_license(built):
    _, wheel, _ = built
    names = zipfile.ZipFile(wheel).namelist()
    for folder, pattern in (('configs', '*.py'), ('configs', '*.md'), ('tools', '*.py')):
        expected = _repo_files(folder, pattern)
        assert expected, folder
        missing = [f for f in expected if f'mmseg_cann/.mim/{folder}/{f}' not in names]
        assert not missing, f'{folder} files missing from the wheel: {missing}'
    assert any(n.endswith('.dist-info/LICENSE') or '/licenses/LICENSE' in n for n in names)
    assert 'mmseg_cann/kernels/upsample.py' in names
    assert 'mmseg_cann/configs/__main__.py' in names


def test_wheel_metadata_matches_the_requirement_files(built):
    _, wheel, _ = built
    with zipfile.ZipFile(wheel) as zf:
        meta_name = next(n for n in zf.namelist() if n.endswith('.dist-info/METADATA'))
        meta = email.message_from_bytes(zf.read(meta_name))
    from packaging.requirements import Requirement
    declared = {Requirement(r).name.lower(): Requirement(r).specifier
                for r in meta.get_all('Requires-Dist') if 'extra ==' not in r}
    with open(os.path.join(REPO_ROOT, 'requirements', 'runtime.txt')) as f:
        runtime = [Requirement(line.split('#')[0].strip()) for line in f
                   if line.split('#')[0].strip()]
    for req in runtime + [Requirement('torch>=2.1'), Requirement('mmcv>=2.0.0rc4,<2.2.0')]:
        assert declared.get(req.name.lower()) == req.specifier, (req, declared)
    assert len(declared) == len(runtime) + 2, declared
    assert meta['Requires-Python'] == '>=3.9'
    assert meta['License'] == 'Apache-2.0'


@pytest.fixture(scope='module')
def user_env(built):
    """Environment for a user's process: the installed wheel first on the path, the
    repository nowhere on it."""
    _, _, target = built
    env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}
    env['PYTHONPATH'] = str(target)
    env['PYTHONNOUSERSITE'] = '1'
    return env


def test_configs_are_listed_and_copied_from_the_installed_package(built, user_env, tmp_path):
    _, _, target = built
    where = _run([sys.executable, '-c', 'import mmseg_cann, mmseg_cann.configs as c; '
                  'print(mmseg_cann.__file__); print(c.config_root())'], str(tmp_path), user_env)
    module_file, root = where.split()
    assert module_file.startswith(str(target)) and root.startswith(str(target)), where
    listed = _run([sys.executable, '-m', 'mmseg_cann.configs', 'list'], str(tmp_path), user_env)
    names = {line for line in listed.splitlines() if not line.startswith('#')}
    assert names == set(_repo_files('configs', '*.py')) - {'_base_/cann_runtime.py'}
    out = _run([sys.executable, '-m', 'mmseg_cann.configs', 'copy',
                os.path.basename(DEMO), 'configs'], str(tmp_path), user_env)
    for rel in (DEMO, 'medical/unet-s5-d16_fcn_cann_4xb4-40k_drive-64x64.py',
                '_base_/cann_runtime.py'):
        assert (tmp_path / 'configs' / rel).is_file(), out
    # a mistake is one line and exit code 2
    bad = subprocess.run([sys.executable, '-m', 'mmseg_cann.configs', 'path', 'unet-drive'],
                         cwd=str(tmp_path), env=user_env, capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.count('\n') == 1, bad.stderr


def test_a_user_config_inheriting_a_shipped_one_trains_with_mmsegs_own_tool(
        built, user_env, tmp_path):
    _run([sys.executable, '-m', 'mmseg_cann.configs', 'copy', DEMO, 'configs'],
         str(tmp_path), user_env)
    _run([sys.executable, '-c', "from mmseg_cann.data import make_dataset; "
          "make_dataset('drive', 'data/my_drive', num_train=2, num_val=1, size=(64, 64))"],
         str(tmp_path), user_env)
    (tmp_path / 'my_config.py').write_text(
        f"_base_ = ['./configs/{DEMO}']\n"
        "data_root = 'data/my_drive'\n"
        "train_dataloader = dict(batch_size=2, dataset=dict(times=1, dataset=dict(\n"
        "    data_root=data_root)))\n"
        "val_dataloader = dict(dataset=dict(data_root=data_root))\n"
        "test_dataloader = val_dataloader\n"
        "train_cfg = dict(max_iters=2, val_interval=2)\n"
        "default_hooks = dict(logger=dict(interval=1), checkpoint=dict(interval=2))\n"
        "param_scheduler = []\n")
    mmseg_train = _run([sys.executable, '-c', 'import mmseg, os; print(os.path.join('
                        'os.path.dirname(mmseg.__file__), ".mim", "tools", "train.py"))'],
                       str(tmp_path), user_env).strip()
    assert os.path.isfile(mmseg_train), mmseg_train
    log = _run([sys.executable, mmseg_train, 'my_config.py', '--work-dir', 'work'],
               str(tmp_path), user_env)
    log += ''.join(open(p).read() for p in glob.glob(str(tmp_path / 'work' / '*' / '*.log')))
    assert 'mmseg_cann conversion' in log, log[-3000:]  # the CANNOpsHook ran
    assert 'mIoU' in log, log[-3000:]                   # the validation ran
    assert (tmp_path / 'work' / 'iter_2.pth').is_file()
    # what `mim test mmseg_cann my_config.py --checkpoint ...` runs: the package's own
    # test tool from .mim/tools, next to its shared helpers
    ours = os.path.join(str(built[2]), 'mmseg_cann', '.mim', 'tools', 'test.py')
    log = _run([sys.executable, ours, 'my_config.py', 'work/iter_2.pth', '--launcher', 'none',
                '--work-dir', 'work_test'], str(tmp_path), user_env)
    log += ''.join(open(p).read() for p in glob.glob(str(tmp_path / 'work_test' / '*' / '*.log')))
    assert 'mIoU' in log, log[-3000:]
