"""ROI pooling benchmark cases (``tools/benchmark.py``) and the torchvision comparison.

The workload: a ``(2, 256, 64, 64)`` float32 map and 512 boxes of random sizes (sides 2
to 48 cells, inside the map, seeded), pooled to 7x7 with ``spatial_scale=1``.

* In ``tools/benchmark.py`` (cases ``roi_*``): ``roi_pool2d`` against the per-ROI loop of
  ``F.adaptive_{max,avg}_pool2d`` over the boxes' slices (the eager baseline), forward and
  forward + backward.
* ``torchvision.ops.roi_pool`` (the reference of ``mode='max'``) cannot run in the
  project's environment, so ``python tools/_bench_roi.py`` times it in the side
  virtualenv (``make oracle``; ``tools/torchvision_oracle.py --bench``) on the same
  inputs with the same number of threads, times ``roi_pool2d`` here, and prints both
  and their ratio (the baselines of both modes too). ``--threads 1 --clock cpu`` is the
  fair setting on a shared machine (torchvision's CPU kernel is single-threaded anyway).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

from mmseg_cann.ops.roi_pool import roi_pool2d

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ORACLE_PYTHON = os.path.join(REPO_ROOT, '.venv-torchvision', 'bin', 'python')
SHAPE, K, OUT = (2, 256, 64, 64), 512, (7, 7)


def make_inputs(device='cpu', shape=SHAPE, k=K, seed=0):
    """``(x, rois)``: a random map and ``k`` boxes of random sizes inside it."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g)
    h, w = shape[-2:]
    sides = torch.randint(2, 49, (k, 2), generator=g)
    x1 = (torch.rand(k, generator=g) * (w - sides[:, 0] + 1)).floor()
    y1 = (torch.rand(k, generator=g) * (h - sides[:, 1] + 1)).floor()
    batch = torch.randint(0, shape[0], (k,), generator=g).float()
    rois = torch.stack([batch, x1, y1, x1 + sides[:, 0] - 1, y1 + sides[:, 1] - 1], 1)
    return x.to(device), rois.to(device)


def adaptive_loop(x, rois, mode):
    """The per-ROI loop: adaptive pooling of each box's slice (boxes inside the map)."""
    pool = F.adaptive_max_pool2d if mode == 'max' else F.adaptive_avg_pool2d
    boxes = rois.long().tolist()
    return torch.stack([pool(x[b, :, y1:y2 + 1, x1:x2 + 1], OUT)
                        for b, x1, y1, x2, y2 in boxes])


def _train(fn):
    def step(x, rois, grad):
        with torch.enable_grad():
            fn(x, rois).backward(grad)
        g, x.grad = x.grad, None
        return g
    return step


def cases(Case):
    """The benchmark cases, built with ``tools/benchmark.py``'s ``Case``."""
    def make(d):
        return make_inputs(d)

    def make_train(d):
        x, rois = make_inputs(d)
        return x.requires_grad_(), rois, torch.randn((K, SHAPE[1]) + OUT)

    out = []
    for mode in ('max', 'avg'):
        def ours(x, rois, mode=mode):
            return roi_pool2d(x, rois, OUT, mode)

        def loop(x, rois, mode=mode):
            return adaptive_loop(x, rois, mode)
        out.append(Case(f'roi_{mode}_512', make, loop, {'mmseg_cann roi_pool2d': ours},
                        compile=False))
        out.append(Case(f'roi_{mode}_512_fwd_bwd', make_train, _train(loop),
                        {'mmseg_cann roi_pool2d': _train(ours)}, compile=False))
    return out


#: what the timings read: wall time, or this process's CPU time (``--clock cpu``: with
#: one thread, the time the op itself computed, whatever else the machine runs)
CLOCK = {'wall': time.perf_counter, 'cpu': time.process_time}
_clock = [time.perf_counter]


def _median(fn, repeat):
    fn()
    times = []
    for _ in range(repeat):
        start = _clock[0]()
        fn()
        times.append(_clock[0]() - start)
    return statistics.median(times)


def _ours_times(x, rois, mode, repeat):
    with torch.no_grad():
        fwd = _median(lambda: roi_pool2d(x, rois, OUT, mode), repeat)
    xg = x.clone().requires_grad_()
    grad = torch.ones((K, SHAPE[1]) + OUT)

    def step():
        roi_pool2d(xg, rois, OUT, mode).backward(grad)
        xg.grad = None
    return fwd, _median(step, repeat)


def _loop_times(x, rois, mode, repeat):
    with torch.no_grad():
        fwd = _median(lambda: adaptive_loop(x, rois, mode), repeat)
    xg = x.clone().requires_grad_()
    grad = torch.ones((K, SHAPE[1]) + OUT)

    def step():
        adaptive_loop(xg, rois, mode).backward(grad)
        xg.grad = None
    return fwd, _median(step, repeat)


def torchvision_times(x, rois, threads, repeat, clock='wall'):
    """``(forward s, forward + backward s)`` of ``torchvision.ops.roi_pool`` in the side
    virtualenv, or None where it is not installed."""
    if not os.path.exists(ORACLE_PYTHON):
        return None
    with tempfile.TemporaryDirectory() as tmp:
        cases_path, results_path = os.path.join(tmp, 'c.pt'), os.path.join(tmp, 'r.pt')
        torch.save(dict(cases=[dict(input=x, rois=rois, output_size=OUT, spatial_scale=1.0,
                                    threads=threads, repeat=repeat, clock=clock)]),
                   cases_path)
        subprocess.run([ORACLE_PYTHON, os.path.join(REPO_ROOT, 'tools',
                                                    'torchvision_oracle.py'),
                        '--bench', cases_path, results_path], check=True)
        result = torch.load(results_path)['results'][0]
    return result['fwd_s'], result['fwd_bwd_s']


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--threads', type=int, default=torch.get_num_threads())
    parser.add_argument('--repeat', type=int, default=10)
    parser.add_argument('--clock', choices=sorted(CLOCK), default='wall',
                        help="'cpu': process CPU time (with --threads 1, robust to other "
                             'load on the machine)')
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    _clock[0] = CLOCK[args.clock]
    x, rois = make_inputs()
    # the baselines first, then ours (whose numba thread pool then exists)
    loops = {mode: _loop_times(x, rois, mode, args.repeat) for mode in ('max', 'avg')}
    tv = torchvision_times(x, rois, args.threads, args.repeat, args.clock)
    rows = []
    for mode in ('max', 'avg'):
        ours = _ours_times(x, rois, mode, args.repeat)
        rows.append((mode, 'per-ROI adaptive loop', loops[mode], ours))
        if mode == 'max' and tv is not None:
            rows.append((mode, 'torchvision.ops.roi_pool 0.29.1', tv, ours))
    print(f'threads={args.threads}, {args.clock} clock, input {SHAPE}, {K} ROIs, output '
          f'{OUT}, median of {args.repeat}')
    print('| mode | baseline | baseline fwd ms | ours fwd ms | ratio | baseline fwd+bwd ms '
          '| ours fwd+bwd ms | ratio |')
    print('|---|---|---:|---:|---:|---:|---:|---:|')
    for mode, name, base, ours in rows:
        print(f'| {mode} | {name} | {base[0] * 1e3:.1f} | {ours[0] * 1e3:.1f} | '
              f'{ours[0] / base[0]:.2f} | {base[1] * 1e3:.1f} | {ours[1] * 1e3:.1f} | '
              f'{ours[1] / base[1]:.2f} |')
    if tv is None:
        print(f'torchvision: {ORACLE_PYTHON} not found (make oracle)')
    return 0


if __name__ == '__main__':
    sys.exit(main())
