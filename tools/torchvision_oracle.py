"""Run ``torchvision.ops.roi_pool`` on cases from a .pt file (the oracle of roi_pool2d).

Runs in the side virtualenv ``.venv-torchvision`` (``make oracle``): torchvision's
wheels need their own torch build, which the project's environment cannot hold.

Usage::

    .venv-torchvision/bin/python tools/torchvision_oracle.py CASES.pt RESULTS.pt
    .venv-torchvision/bin/python tools/torchvision_oracle.py --bench CASES.pt RESULTS.pt

``CASES.pt`` holds ``{'cases': [dict(input=, rois=, output_size=(h, w),
spatial_scale=, grad=None or a tensor), ...]}``. For each case RESULTS.pt gets
``dict(output=, argmax=, grad_input=)`` from ``torch.ops.torchvision.roi_pool`` (values
and the int32 argmax, -1 where nothing was pooled) and, when ``grad`` is given, the input
gradient of ``(output * grad).sum()`` through ``torchvision.ops.roi_pool``'s autograd.
With ``--bench`` each case is also timed (median of ``repeat`` runs, forward and forward
+ backward, ``threads`` torch threads as given in the case; ``clock='cpu'``: process CPU
time instead of wall time) into ``fwd_s``/``fwd_bwd_s``.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torchvision
from torchvision.ops import roi_pool


def _median_time(fn, repeat: int, clock=time.perf_counter) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeat):
        start = clock()
        fn()
        times.append(clock() - start)
    return statistics.median(times)


def run_case(case: dict, bench: bool) -> dict:
    x, rois = case['input'], case['rois']
    size, scale = tuple(case['output_size']), float(case['spatial_scale'])
    out, argmax = torch.ops.torchvision.roi_pool(x, rois, scale, size[0], size[1])
    result = dict(output=out, argmax=argmax, grad_input=None)
    grad = case.get('grad')
    if grad is not None:
        xg = x.detach().clone().requires_grad_(True)
        (roi_pool(xg, rois, size, scale) * grad).sum().backward()
        result['grad_input'] = xg.grad
    if bench:
        torch.set_num_threads(int(case.get('threads', torch.get_num_threads())))
        repeat = int(case.get('repeat', 10))
        clock = time.process_time if case.get('clock') == 'cpu' else time.perf_counter
        with torch.no_grad():
            result['fwd_s'] = _median_time(lambda: roi_pool(x, rois, size, scale), repeat,
                                           clock)
        xg = x.detach().clone().requires_grad_(True)
        go = torch.ones((rois.shape[0], x.shape[1]) + size, dtype=x.dtype)

        def forward_backward():
            roi_pool(xg, rois, size, scale).backward(go)
            xg.grad = None
        result['fwd_bwd_s'] = _median_time(forward_backward, repeat, clock)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('cases')
    parser.add_argument('results')
    parser.add_argument('--bench', action='store_true', help='also time each case')
    args = parser.parse_args()
    cases = torch.load(args.cases)['cases']
    results = [run_case(case, args.bench) for case in cases]
    torch.save(dict(results=results, torch=str(torch.__version__),
                    torchvision=str(torchvision.__version__)), args.results)


if __name__ == '__main__':
    main()
