"""Fixtures of the tool tests."""
import importlib
import sys

import pytest
import torch

from tests._helpers import REPO_ROOT

#: the demo's config (tools/demo.py), which the inference tool tests use
DEMO = 'configs/medical/unet-s5-d16_fcn_cann_1xb4-300iter_synthetic-drive-64x64.py'


@pytest.fixture(scope='module')
def checkpoint(tmp_path_factory):
    """A checkpoint of the demo model with seeded initial weights and mmseg's metadata."""
    from mmseg_cann.apis import init_model
    torch.manual_seed(0)
    model = init_model(DEMO, None, 'cpu')
    path = tmp_path_factory.mktemp('ckpt') / 'demo.pth'
    torch.save({'state_dict': model.state_dict(),
                'meta': {'dataset_meta': {'classes': ('background', 'vessel'),
                                          'palette': [[0, 0, 0], [255, 0, 0]]}}}, path)
    return str(path)


def import_tool(monkeypatch, name: str):
    """``tools/{name}.py`` imported in-process, afresh (its siblings importable as the
    tool sees them when run as a script)."""
    monkeypatch.syspath_prepend(REPO_ROOT + '/tools')
    sys.modules.pop(name, None)
    return importlib.import_module(name)


def run_tool_in_process(monkeypatch, capsys, name: str, argv) -> tuple:
    """``python tools/{name}.py ARGV`` without a new interpreter: the tool's ``main``
    through its ``run`` wrapper (user errors -> one line and exit 2; argparse's exit),
    from the repository root. Returns ``(exit status, stdout, stderr)``."""
    tool = import_tool(monkeypatch, name)
    monkeypatch.chdir(REPO_ROOT)
    monkeypatch.setattr(sys, 'argv', [f'tools/{name}.py'] + list(argv))
    capsys.readouterr()
    try:
        status = tool.run(lambda: tool.main(list(argv)), name)
    except SystemExit as exc:
        status = exc.code
    out, err = capsys.readouterr()
    return status, out, err
