"""The numba kernels are compiled once per machine, not once per process: a second
process loads every kernel it uses from numba's on-disk cache."""
import json
import os
import subprocess
import sys

import pytest

from mmseg_cann.backends import numba_cpu

pytestmark = pytest.mark.skipif(not numba_cpu.available(), reason='numba is not installed')

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# runs the fused ops and the 'fast' backend's kernels, then prints each used kernel's
# cache hits and misses (numba's dispatcher statistics)
SCRIPT = r'''
import json, torch
from mmseg_cann.backends import numba_kernels as k
from mmseg_cann.ops import avg_pool2d, max_pool2d, upsample
from mmseg_cann.ops.fused import upsample_add, upsample_argmax
x = torch.randn(1, 3, 8, 12)
upsample_add(x, torch.randn(1, 3, 16, 24), backend='fast')
upsample_argmax(x, (16, 24), backend='fast')
upsample(x, scale_factor=2, mode='bilinear', backend='fast')
max_pool2d(x, 3, 2, 1, backend='fast')
avg_pool2d(x, 2, backend='fast')
used = ['upsample_add_into', 'upsample_argmax_into', 'bilinear_nchw', 'max_pool_nchw',
        'avg_pool_nchw']
stats = {n: getattr(k, n).stats for n in used}
print(json.dumps({n: [sum(s.cache_hits.values()), sum(s.cache_misses.values())]
                  for n, s in stats.items()}))
'''


def _run(cache_dir):
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache_dir), PYTHONPATH=ROOT)
    out = subprocess.run([sys.executable, '-c', SCRIPT], env=env, capture_output=True,
                         text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_second_process_loads_every_kernel_from_the_disk_cache(tmp_path):
    first = _run(tmp_path)
    assert all(misses > 0 for _, misses in first.values()), first
    second = _run(tmp_path)
    assert second == {name: [1, 0] for name in second}, second
