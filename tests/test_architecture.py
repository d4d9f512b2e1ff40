"""The package's structure: one-way layers (import-linter), a torch-only lower half, and
imports without side effects on the process."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

from tests._helpers import REPO_ROOT, run_python

#: a meta-path wrapper that makes the OpenMMLab packages look uninstalled
_HIDE_OPENMMLAB = textwrap.dedent('''
    import sys

    HIDDEN = ('mmseg', 'mmcv', 'mmengine')


    class Hide:
        def __init__(self, inner):
            self.inner = inner

        def find_spec(self, name, path=None, target=None):
            if name.split('.')[0] in HIDDEN:
                return None
            find = getattr(self.inner, 'find_spec', None)
            return find(name, path, target) if find else None

        def __getattr__(self, name):
            return getattr(self.inner, name)


    sys.meta_path[:] = [Hide(f) for f in sys.meta_path]
''')


def test_layers_import_one_way():
    """``lint-imports`` checks the contracts in setup.cfg: a back-import fails here."""
    lint = shutil.which('lint-imports', path=os.path.dirname(sys.executable))
    assert lint is not None, 'import-linter is a test requirement (requirements/tests.txt)'
    result = subprocess.run([lint, '--no-cache'], cwd=REPO_ROOT, capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert 'Contracts: 3 kept, 0 broken.' in result.stdout, result.stdout


def test_core_and_ops_import_and_run_with_only_torch():
    script = _HIDE_OPENMMLAB + textwrap.dedent('''
        import importlib.util
        assert importlib.util.find_spec('mmseg') is None  # hidden
        import torch
        import mmseg_cann.ops as ops
        from mmseg_cann.core import geometry
        x = torch.arange(12.).reshape(1, 1, 3, 4)
        y = ops.upsample(x, scale_factor=2, mode='bilinear')
        assert torch.equal(y, torch.nn.functional.interpolate(x, scale_factor=2,
                                                              mode='bilinear'))
        assert torch.equal(ops.max_pool2d(x, 2), torch.nn.functional.max_pool2d(x, 2))
        import mmseg_cann
        up = mmseg_cann.CANNUpsample(scale_factor=2)  # a plain torch module without mmseg
        assert torch.equal(up(x), torch.nn.functional.interpolate(x, scale_factor=2))
        try:
            mmseg_cann.CANNOpsHook
        except ImportError as exc:
            assert 'mmsegmentation' in str(exc), exc
        else:
            raise AssertionError('CANNOpsHook without mmseg')
        loaded = sorted(m for m in sys.modules if m.split('.')[0] in HIDDEN)
        print('loaded:', loaded)
    ''')
    result = run_python(['-c', script])
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == 'loaded: []'


def test_import_registers_with_mmseg_and_leaves_torch_load_alone():
    script = textwrap.dedent('''
        import torch
        import mmseg_cann
        from mmseg.registry import HOOKS, MODELS
        from mmseg_cann.engine.checkpoint import mmengine_checkpoint_globals
        assert MODELS.get('CANNUpsample') is mmseg_cann.CANNUpsample
        assert HOOKS.get('CANNOpsHook') is mmseg_cann.CANNOpsHook

        def ours():
            safe = torch.serialization.get_safe_globals()
            return ([g for g in mmengine_checkpoint_globals() if g in safe]
                    + [g for g in safe if isinstance(g, tuple) and g[1] == 'builtins.getattr'])

        assert ours() == [], ours()  # torch may register its own classes; we add none
        mmseg_cann.allow_mmengine_checkpoints()
        assert len(ours()) == len(mmengine_checkpoint_globals()) + 1
        print('ok')
    ''')
    result = run_python(['-c', script])
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == 'ok'


def test_import_leaves_dynamo_and_triton_unimported():
    """``import mmseg_cann`` (and its ops, fusions and APIs) imports neither
    ``torch._dynamo`` nor Triton: a process may still set ``TRITON_INTERPRET`` (read when
    ``triton.language`` is imported) after importing the package."""
    script = textwrap.dedent('''
        import sys
        import mmseg_cann, mmseg_cann.ops, mmseg_cann.fusion, mmseg_cann.apis
        loaded = [m for m in ('torch._dynamo', 'triton', 'triton.language') if m in sys.modules]
        print(loaded)
    ''')
    result = run_python(['-c', script])
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == '[]'


def test_tools_do_not_edit_sys_path():
    tools = os.path.join(REPO_ROOT, 'tools')
    for name in sorted(os.listdir(tools)):
        if name.endswith('.py'):
            with open(os.path.join(tools, name)) as f:
                text = f.read()
            assert 'sys.path.insert' not in text and 'sys.path.append' not in text, name

