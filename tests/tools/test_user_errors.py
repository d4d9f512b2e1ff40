"""The tools answer user mistakes with exit code 2 and one line on stderr that names the
argument or path and what is expected -- no traceback (``--debug`` shows it) -- before any
work starts; and tools/env_check.py describes the environment."""
from __future__ import annotations

import json
import os

import pytest
import torch

from tests._helpers import run_python

from .conftest import run_tool_in_process

UNET = 'configs/medical/unet-s5-d16_fcn_cann_4xb4-40k_drive-64x64.py'
PSP = 'configs/cityscapes/pspnet_r50-d8_cann_4xb2-40k_cityscapes-512x1024.py'


@pytest.fixture(scope='module')
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp('mistakes')
    (root / 'empty').mkdir()
    (root / 'corrupt.pth').write_text('not a checkpoint')
    torch.save([1, 2, 3], root / 'list.pth')
    return root


def _mistakes(f):
    return [
        (['tools/train.py', 'nope.py'], ["config 'nope.py' does not exist"]),
        (['tools/train.py', UNET, '--data-root', str(f / 'empty')],
         ['lacks', 'images/training', 'tools/make_synthetic_data.py drive',
          'docs/training.md']),
        (['tools/train.py', UNET, '--data-root', str(f / 'missing')],
         ['--data-root', 'does not exist']),
        (['tools/test.py', UNET, str(f / 'missing.pth')], ['checkpoint', 'does not exist']),
        (['tools/test.py', UNET, str(f / 'corrupt.pth')],
         ['checkpoint', 'not a PyTorch/mmengine checkpoint']),
        (['tools/test.py', UNET, str(f / 'list.pth')], ['checkpoint', 'holds a list']),
        (['tools/export_onnx.py', PSP, '--shape', '0', '64', '--out', str(f / 'a.onnx')],
         ['--shape must be positive']),
        (['tools/profile_ops.py', UNET, '--shape', '63', '64'], ['divisible by 16']),
        (['tools/export_onnx.py', UNET, '--shape', '64', '64', '--out', '/proc/none/a.onnx'],
         ['--out', 'cannot create folder']),
        (['tools/infer.py', UNET, str(f / 'corrupt.pth'), str(f / 'nothing.png'),
          '--out-dir', str(f / 'out')], ["input", "nothing.png", 'does not exist']),
        (['tools/check_parity.py', '--json', '/proc/none/p.json'], ['--json']),
        (['tools/make_synthetic_data.py', 'drive', '/proc/none'], ['OUT_DIR']),
        (['tools/profile_ops.py', UNET, '--device', 'tpu'], ['invalid choice', "'tpu'"]),
    ]


@pytest.mark.parametrize('index', range(13))
def test_mistake_gets_exit_2_and_one_line(files, index, monkeypatch, capsys):
    """Through each tool's own entry in this process (``main`` under its ``run``
    wrapper, as ``python tools/X.py`` runs it; a new interpreter per case would cost more
    than the checks); test_debug_shows_the_traceback runs a tool as a command line."""
    args, words = _mistakes(files)[index]
    tool = os.path.splitext(os.path.basename(args[0]))[0]
    status, out, err = run_tool_in_process(monkeypatch, capsys, tool, args[1:])
    assert status == 2, (args, out[-2000:], err[-2000:])
    assert 'Traceback' not in err, err
    last = err.strip().splitlines()[-1]
    for word in words:
        assert word in last, (word, last)
    if index == 3:  # the checkpoint is checked before any dataset is touched
        assert 'images' not in err


def test_debug_shows_the_traceback():
    result = run_python(['tools/train.py', 'nope.py', '--debug'], timeout=300)
    assert result.returncode != 0 and 'Traceback' in result.stderr
    assert 'UserError' in result.stderr


def test_env_check_flags_false_looking_npu_jit_compile(tmp_path):
    env = dict(os.environ, NPUJITCompile='False', TASK_QUEUE_ENABLE='2',
               ASCEND_RT_VISIBLE_DEVICES='0')
    out = tmp_path / 'env.json'
    import subprocess
    import sys
    from tests._helpers import REPO_ROOT
    result = subprocess.run([sys.executable, 'tools/env_check.py', '--json', str(out)],
                            cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr  # warnings only
    text = result.stdout
    for name in ('torch', 'torch_npu', 'mmcv', 'mmengine', 'mmseg', 'mmseg_cann', 'numba',
                 'triton', 'onnxruntime', 'CANN toolkit', 'device cpu', 'device npu',
                 'env TASK_QUEUE_ENABLE', 'env ASCEND_RT_VISIBLE_DEVICES'):
        assert name in text, name
    assert "WARNING: NPUJITCompile='False' turns NPU JIT compilation ON" in text
    report = json.loads(out.read_text())
    assert report['ok'] is True and report['environment']['NPUJITCompile'] == 'False'
    assert any('NPUJITCompile' in f['message'] for f in report['findings'])
    same = run_python(['-m', 'mmseg_cann.env_check'], timeout=300)
    assert same.returncode == 0 and 'mmseg_cann' in same.stdout


def test_env_check_rules():
    from mmseg_cann import env_check
    from mmseg_cann.utils.environment import npu_jit_compile_warning
    for value in ('0', 'False', 'false', 'off', 'no'):
        assert npu_jit_compile_warning({'NPUJITCompile': value})
    for value in ('1', 'True', ''):
        assert npu_jit_compile_warning({'NPUJITCompile': value}) is None
    assert npu_jit_compile_warning({}) is None
    report = env_check.Report(packages={'mmseg': 'not installed', 'mmcv': 'not installed',
                                        'torch': '2.13.0', 'torch_npu': 'not installed'})
    env_check._findings(report, {})
    assert not report.ok and len(report.findings) == 2
    report = env_check.Report(packages={'mmseg': '1.2.2', 'mmcv': '2.1.0', 'torch': '2.13.0',
                                        'torch_npu': '2.1.0.post6'})
    env_check._findings(report, {'TASK_QUEUE_ENABLE': '0'})
    messages = ' '.join(f.message for f in report.findings)
    assert 'another torch' in messages and 'TASK_QUEUE_ENABLE=0' in messages


def test_cann_version_from_the_toolkit_folder(tmp_path):
    from mmseg_cann.env_check import cann_version
    (tmp_path / 'version.cfg').write_text('# toolkit\nversion=8.0.RC2\n')
    assert cann_version({'ASCEND_TOOLKIT_HOME': str(tmp_path)}).startswith('8.0.RC2')
    assert cann_version({}).startswith('not found')
