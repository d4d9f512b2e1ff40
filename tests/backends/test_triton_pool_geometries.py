"""The Triton pooling kernels (interpreter) on the ceil-mode geometries whose last window
runs past the padded input, against real PyTorch calls.

Triton reads ``TRITON_INTERPRET`` when a kernel is defined, so the check runs in a
subprocess that sets it first.
"""
import importlib.util

import pytest

from .._helpers import run_python

SCRIPT = r'''
import itertools, os
os.environ['TRITON_INTERPRET'] = '1'
import torch
import torch.nn.functional as F
from mmseg_cann import ops
checked, bad = 0, []
for h, k, s, p, d in itertools.product((1, 2, 6), range(2, 5), range(1, 4), range(0, 2),
                                       range(1, 4)):
    w = 7 - h
    if min(h, w) + 2 * p >= d * (k - 1) + 1:
        continue  # every window inside the padded input: not the case under test
    x = torch.randint(-3, 4, (1, 2, h, w), generator=torch.Generator().manual_seed(h)).float()
    try:
        want = F.max_pool2d(x, k, s, p, d, True, True)
    except RuntimeError:
        continue
    got = ops.max_pool2d(x, k, s, p, d, True, True, backend='triton')
    checked += 1
    if not (torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])):
        bad.append(('max', h, w, k, s, p, d))
    if d == 1:
        for cip in (False, True):
            if not torch.equal(ops.avg_pool2d(x, k, s, p, True, cip, backend='triton'),
                               F.avg_pool2d(x, k, s, p, True, cip)):
                bad.append(('avg', h, w, k, s, p, cip))
print('CHECKED', checked, 'BAD', bad)
'''


@pytest.mark.skipif(importlib.util.find_spec('triton') is None, reason='needs triton')
def test_triton_pooling_on_windows_past_the_padded_input():
    result = run_python(['-c', SCRIPT], timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    line = [ln for ln in result.stdout.splitlines() if ln.startswith('CHECKED')][-1]
    assert line.endswith('BAD []'), line
    assert int(line.split()[1]) > 10, line
