"""Shared fixtures and helpers for the test suite."""
from __future__ import annotations

import os
import sys

import pytest
import torch

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: (input H, W) -> (output H, W) shapes that catch indexing bugs (DESIGN.md 2.1)
AWKWARD_SHAPES = [
    ((1, 1), (2, 2)),      # single pixel
    ((3, 5), (4, 7)),      # coprime, uneven weights
    ((7, 7), (8, 8)),
    ((1, 6), (3, 13)),     # H = 1
    ((6, 1), (13, 3)),     # W = 1
    ((9, 11), (4, 5)),     # downsampling, odd sizes
    ((5, 7), (5, 7)),      # identity
    ((4, 3), (32, 24)),    # x8
    ((2, 3), (32, 48)),    # x16
    ((2, 2), (64, 64)),    # x32
    ((2, 2), (82, 82)),    # float32 nearest index differs from exact math
]
UPSAMPLE_SETTINGS = [
    dict(mode='nearest'), dict(mode='nearest-exact'), dict(mode='area'),
    dict(mode='bilinear', align_corners=False), dict(mode='bilinear', align_corners=True),
    dict(mode='bicubic', align_corners=False), dict(mode='bicubic', align_corners=True),
    dict(mode='bilinear', antialias=True), dict(mode='bicubic', antialias=True),
    dict(mode='bilinear', align_corners=True, antialias=True),
]
MEMORY_FORMATS = ['contiguous', 'channels_last', 'strided']


def setting_id(setting: dict) -> str:
    return '-'.join(f'{v}' if k == 'mode' else f'{k}={v}' for k, v in setting.items())


def make_input(shape, dtype=torch.float32, memory_format='contiguous', seed=0):
    """Uniform [-1, 1) input in the requested layout (``strided``: a non-contiguous view)."""
    gen = torch.Generator().manual_seed(seed)
    if memory_format == 'strided':
        n, c, h, w = shape
        base = torch.rand((n, c, h, 2 * w), generator=gen, dtype=torch.float64) * 2 - 1
        x = base.to(dtype)[..., ::2]
        assert not x.is_contiguous()
        return x
    x = (torch.rand(shape, generator=gen, dtype=torch.float64) * 2 - 1).to(dtype)
    if memory_format == 'channels_last':
        x = x.contiguous(memory_format=torch.channels_last)
    return x


def run_python(args, **kwargs):
    """Run a Python subprocess from the repository root with this interpreter."""
    import subprocess
    env = dict(os.environ)
    env.setdefault('PYTHONUNBUFFERED', '1')
    return subprocess.run([sys.executable] + list(args), cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, **kwargs)


@pytest.fixture(autouse=True)
def _isolated_precision_policy():
    """Every test starts from, and leaves behind, the default precision policy."""
    from mmseg_cann import precision
    saved = precision.get_precision_policy()
    precision.set_precision_policy(reset=True)
    yield
    precision.restore_precision_policy(saved)
