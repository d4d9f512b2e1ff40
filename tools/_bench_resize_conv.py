"""Benchmark cases of ``fuse_resize_conv`` (``tools/benchmark.py`` runs them) and the
multiply-accumulate counts per site.

Each case builds one of mmseg's own models from its config (random weights, ``SyncBN`` built
as ``BN``, batch 1, CPU) and times it unrewritten ("eager") against a deep copy rewritten
by :func:`mmseg_cann.fusion.fuse_resize_conv`, in one process, the two timed in
alternation (a drift of a shared machine's speed reaches both); ``tools/benchmark.py``
reports the ratios of time and of peak extra memory. Resize routing stays off (both
models run mmseg's own ``resize``).

Usage::

    python tools/benchmark.py --cases resize_conv_segformer_b0_512 ... --no-compile
    python tools/_bench_resize_conv.py [--models segformer_b0 ...] [--json OUT]
    NUMBA_NUM_THREADS=1 python tools/_bench_resize_conv.py --cpu-time 5
    python tools/_bench_resize_conv.py --slices 5

The second form prints the multiply-accumulates (MACs) of one forward pass, whole model,
decode head and the rewritten site, unrewritten and rewritten, counted from the aten calls
(:func:`count_macs`: convolutions, linear layers and matrix products with
``torch.utils.flop_counter``'s formulas, MACs = FLOPs / 2; interpolation and element-wise
ops are not counted). The attention's own products (those inside
``nn.MultiheadAttention`` calls, beyond its linear projections) are counted apart: the
whole model is given without them and with them. The head is the whole model minus
``extract_feat`` (backbone and neck); the unrewritten site is its convolution's count; a
rewritten site's convolutions run inside its head's ``forward``, so its count is the
rewritten head's minus what the head spends outside the site (the same in both models).
The third form measures one-thread process CPU time instead (robust on a machine shared
with other work, where multi-threaded wall time is not; :func:`cpu_time_ratios`); the
fourth the same for each resized slice of UPerHead's bottleneck and each method of
``resize_conv2d`` (:func:`slice_times`).
"""
from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from typing import List

import torch
from _common import build_segmentor, random_seg_samples, sgd_step

from mmseg_cann.fusion import fuse_resize_conv

#: name -> (mmseg config, input (H, W), the site's module path in the unrewritten model)
MODELS = {
    'segformer_b0': ('mmseg::segformer/segformer_mit-b0_8xb2-160k_ade20k-512x512.py',
                     (512, 512), 'decode_head.fusion_conv'),
    'segformer_b2': ('mmseg::segformer/segformer_mit-b2_8xb1-160k_cityscapes-1024x1024.py',
                     (1024, 1024), 'decode_head.fusion_conv'),
    'upernet_r50': ('mmseg::upernet/upernet_r50_4xb2-40k_cityscapes-512x1024.py',
                    (512, 1024), 'decode_head.fpn_bottleneck'),
    # whole-image inference at sizes that are not multiples of 32: mix-resize slices
    'upernet_r50_500x750': ('mmseg::upernet/upernet_r50_4xb2-40k_cityscapes-512x1024.py',
                            (500, 750), 'decode_head.fpn_bottleneck'),
    'upernet_r50_97x131': ('mmseg::upernet/upernet_r50_4xb2-40k_cityscapes-512x1024.py',
                           (97, 131), 'decode_head.fpn_bottleneck'),
}


def build(base: str, train: bool = False):
    """(unrewritten, rewritten) segmentors of mmseg config ``base``: random weights
    (seeded), ``SyncBN`` as ``BN``, no pretrained download; eval mode unless ``train``."""
    model = build_segmentor(base)
    model.train(train)
    fused = copy.deepcopy(model)
    report = fuse_resize_conv(fused)
    if not report.resize_conv:
        raise RuntimeError(f'no site rewritten in {base}: {report}')
    return model, fused


def _image(hw, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn((1, 3) + tuple(hw), generator=g)


def forward_case(case_cls, name: str, model: str, repeats: int = 3):
    """One forward pass (``mode='tensor'``: the decoder's logits) of ``MODELS[model]``."""
    base, hw, _ = MODELS[model]
    state = {}

    def make(device):
        plain, fused = build(base)
        state.update(plain=plain.to(device), fused=fused.to(device))
        return (_image(hw).to(device),)

    def run(key):
        def forward(x):
            with torch.no_grad():
                return state[key](x, mode='tensor')
        return forward
    return case_cls(name, make, run('plain'), {'fuse_resize_conv': run('fused')},
                    compile=False, repeats=repeats, interleave=True)


def train_step_case(case_cls, name: str, model: str, num_classes: int = 150,
                    repeats: int = 3):
    """One training step (forward, loss, backward, SGD step) at batch 1 of random labels."""
    base, hw, _ = MODELS[model]
    state = {}

    def make(device):
        plain, fused = build(base, train=True)
        state.update(plain=plain.to(device), fused=fused.to(device))
        state['optim'] = {k: torch.optim.SGD(state[k].parameters(), lr=1e-4)
                          for k in ('plain', 'fused')}
        g = torch.Generator().manual_seed(1)
        state['samples'] = random_seg_samples(hw, num_classes, 1, g, device)
        return (_image(hw).to(device),)

    def run(key):
        def step(x):
            return sgd_step(state[key], state['optim'][key], x, state['samples'])
        return step
    return case_cls(name, make, run('plain'), {'fuse_resize_conv': run('fused')},
                    compile=False, repeats=repeats, interleave=True)


def cases(case_cls) -> list:
    """The benchmark cases (``tools/benchmark.py`` passes its ``Case`` class)."""
    return [
        forward_case(case_cls, 'resize_conv_segformer_b0_512', 'segformer_b0', repeats=5),
        forward_case(case_cls, 'resize_conv_segformer_b2_1024', 'segformer_b2', repeats=3),
        forward_case(case_cls, 'resize_conv_upernet_r50_512x1024', 'upernet_r50', repeats=2),
        forward_case(case_cls, 'resize_conv_upernet_r50_500x750', 'upernet_r50_500x750',
                     repeats=2),
        forward_case(case_cls, 'resize_conv_upernet_r50_97x131', 'upernet_r50_97x131',
                     repeats=5),
        train_step_case(case_cls, 'resize_conv_train_segformer_b0_512', 'segformer_b0', repeats=8),
    ]


#: the aten ops counted: convolutions, linear layers, matrix products (the rewrite's 1x1
#: products run as ``bmm`` on the CPU)
COUNTED = ('convolution', 'addmm', 'mm', 'bmm', 'baddbmm')
#: the attention's own products: matrix products inside these modules' calls
ATTENTION = (torch.nn.MultiheadAttention,)


def count_macs(model, fn, *args) -> dict:
    """MACs of ``fn(*args)`` (no gradient) from the aten calls it makes (FLOP formulas of
    ``torch.utils.flop_counter``; MACs = FLOPs / 2): ``{'layers': ..., 'attention':
    ...}``, the second the matrix products made inside the :data:`ATTENTION` modules of
    ``model`` other than their linear projections (``addmm``/``mm``/``linear``). A
    dispatch mode with hooks on those modules only, not ``FlopCounterMode``: that one
    tracks modules with global module hooks, with which the rewritten sites run
    unrewritten (hooks must see every module call)."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.flop_counter import flop_registry

    macs = {'layers': 0.0, 'attention': 0.0}
    depth = [0]

    class Counter(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            packet = func._overloadpacket
            if packet.__name__ in COUNTED and packet in flop_registry:
                key = 'attention' if depth[0] and packet.__name__ in ('bmm', 'baddbmm') \
                    else 'layers'
                macs[key] += flop_registry[packet](*args, **kwargs, out_val=out) / 2
            return out

    def enter(*_):
        depth[0] += 1

    def leave(*_):
        depth[0] -= 1
    handles = []
    for module in model.modules():
        if isinstance(module, ATTENTION):
            handles += [module.register_forward_pre_hook(enter),
                        module.register_forward_hook(leave)]
    try:
        with torch.no_grad(), Counter():
            fn(*args)
    finally:
        for handle in handles:
            handle.remove()
    return macs


def _conv_macs(model, path: str, x) -> float:
    """MACs of the convolution at ``path`` in one forward of the unrewritten ``model``."""
    module = model.get_submodule(path)
    conv = getattr(module, 'conv', module)
    shapes = []
    handle = conv.register_forward_hook(lambda m, i, o: shapes.append(o.shape))
    try:
        with torch.no_grad():
            model(x, mode='tensor')
    finally:
        handle.remove()
    n, c_out, h, w = shapes[0]
    kh, kw = conv.kernel_size
    return float(n * c_out * h * w * conv.in_channels // conv.groups * kh * kw)


def site_macs(model: str) -> dict:
    """Whole-model (without and with the attention's products), decode-head and site
    MACs, unrewritten and rewritten."""
    base, hw, site = MODELS[model]
    plain, fused = build(base)
    x = _image(hw)
    whole_a = count_macs(plain, lambda t: plain(t, mode='tensor'), x)
    whole_b = count_macs(fused, lambda t: fused(t, mode='tensor'), x)
    # backbone + neck: the same in both
    features = count_macs(plain, plain.extract_feat, x)['layers']
    attention = whole_a['attention']
    assert whole_b['attention'] == attention  # the rewrite does not touch attention
    head_a, head_b = whole_a['layers'] - features, whole_b['layers'] - features
    site_a = _conv_macs(plain, site, x)
    site_b = head_b - (head_a - site_a)
    return dict(model=model, config=base, input=hw, site=site,
                whole=(whole_a['layers'], whole_b['layers']),
                whole_with_attention=(whole_a['layers'] + attention,
                                      whole_b['layers'] + attention),
                decode_head=(head_a, head_b), site_macs=(site_a, site_b))


def cpu_seconds(fn, x, rounds: int) -> float:
    """Median process CPU time of ``fn(x)`` over ``rounds`` calls after one warm-up."""
    fn(x)
    times = []
    for _ in range(rounds):
        start = time.process_time()
        fn(x)
        times.append(time.process_time() - start)
    return statistics.median(times)


def cpu_time_ratios(model: str, rounds: int, train: bool = False) -> dict:
    """Process CPU time of one forward (or training step), unrewritten and rewritten
    (the calls of :func:`forward_case` / :func:`train_step_case`), alternating the two
    ``rounds`` times. Run with one thread (``--cpu-time`` sets it): the CPU time of one
    thread does not depend on what else runs on a shared machine, where wall time of a
    multi-threaded call does (barrier waits)."""
    make_case = train_step_case if train else forward_case
    case = make_case(lambda name, make, eager, ours, **_: (make, eager, ours), '', model)
    make, eager, ours = case
    x, = make(torch.device('cpu'))
    runs = {'plain': eager, 'fused': ours['fuse_resize_conv']}
    seconds = {'plain': [], 'fused': []}
    for _ in range(rounds):
        for key, fn in runs.items():
            seconds[key].append(cpu_seconds(fn, x, 1))
    plain_s, fused_s = (statistics.median(seconds[k]) for k in ('plain', 'fused'))
    return dict(model=model, input=MODELS[model][1], step='train' if train else 'forward',
                plain_s=plain_s, fused_s=fused_s, ratio=fused_s / plain_s)


#: the methods of resize_conv2d the slice table times
METHODS = ('mix_first', 'polyphase', 'mix_resize')
#: UPerHead's bottleneck slices at 512x1024 input: (factor, low-resolution map)
SLICES = [(s, (1, 512, 128 // s, 256 // s)) for s in (2, 4, 8)]


def slice_times(rounds: int) -> List[dict]:
    """Per resized slice of UPerHead's bottleneck (``w`` 512x512x3x3 on a 512-channel map
    resized to 128x256, padding 1): process CPU time of the composition
    ``F.conv2d(F.interpolate(...))`` and of ``resize_conv2d`` with each method forced
    (inference: no gradient), alternating, median of ``rounds``; and their MACs."""
    import torch.nn.functional as F

    from mmseg_cann.ops import resize_conv as rc
    rows = []
    g = torch.Generator().manual_seed(0)
    w = torch.randn(512, 512, 3, 3, generator=g) * 0.02
    for s, shape in SLICES:
        x = torch.randn(shape, generator=g)
        kw = dict(size=(128, 256), padding=1)
        fns = {'composition': lambda: F.conv2d(F.interpolate(x, size=(128, 256),
                                                             mode='bilinear'), w, padding=1)}
        macs = {}
        for method in METHODS:
            plan = rc.resize_conv2d_plan(x, w, method=method, **kw)
            fns[method] = (lambda p=plan: rc.apply_plan(x, w, None, p))
            macs[method] = plan.macs_rewritten / plan.macs_direct
        seconds = {k: [] for k in fns}
        with torch.no_grad():
            for _ in range(rounds):
                for key, fn in fns.items():
                    seconds[key].append(cpu_seconds(lambda _x: fn(), None, 1))
        med = {k: statistics.median(v) for k, v in seconds.items()}
        rows.append(dict(factor=s, composition_s=med['composition'],
                         **{f'{m}_s': med[m] for m in macs},
                         **{f'{m}_macs': macs[m] for m in macs}))
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description='MACs per fuse_resize_conv site')
    parser.add_argument('--models', nargs='+', default=list(MODELS), choices=list(MODELS))
    parser.add_argument('--json', help='write the rows as JSON to this file')
    parser.add_argument('--cpu-time', type=int, metavar='ROUNDS',
                        help='instead: one-thread process CPU time of a forward (and of a '
                             'training step of segformer_b0), median of ROUNDS')
    parser.add_argument('--slices', type=int, metavar='ROUNDS',
                        help="instead: one-thread process CPU time of each resized slice of "
                             "UPerHead's bottleneck, composition and both methods of "
                             'resize_conv2d, median of ROUNDS')
    args = parser.parse_args(argv)
    if args.slices:
        torch.set_num_threads(1)
        rows = slice_times(args.slices)
        print('| factor | ' + ' | '.join(f'MACs {m}' for m in METHODS) + ' | composition s | '
              + ' | '.join(f'{m} s (ratio)' for m in METHODS) + ' |')
        print('|---|' + '---:|' * (2 * len(METHODS) + 1))
        for r in rows:
            c = r['composition_s']
            print(f"| {r['factor']} | " + ' | '.join(f"{r[m + '_macs']:.3f}x" for m in METHODS)
                  + f' | {c:.3f} | ' + ' | '.join(f"{r[m + '_s']:.3f} ({r[m + '_s'] / c:.2f})"
                                                  for m in METHODS) + ' |')
        if args.json:
            with open(args.json, 'w') as f:
                json.dump(rows, f, indent=1)
        return 0
    if args.cpu_time:
        torch.set_num_threads(1)
        rows = [cpu_time_ratios(m, args.cpu_time) for m in args.models]
        if 'segformer_b0' in args.models:
            rows.append(cpu_time_ratios('segformer_b0', args.cpu_time, train=True))
        print('| model, input | step | unrewritten s | rewritten s | ratio |')
        print('|---|---|---:|---:|---:|')
        for r in rows:
            print(f"| {r['model']} {r['input'][0]}x{r['input'][1]} | {r['step']} | "
                  f"{r['plain_s']:.2f} | {r['fused_s']:.2f} | {r['ratio']:.3f} |")
        if args.json:
            with open(args.json, 'w') as f:
                json.dump(rows, f, indent=1)
        return 0
    rows = [site_macs(m) for m in args.models]
    print('| model, input | site | whole model | with attention | decode head | site |')
    print('|---|---|---:|---:|---:|---:|')
    g = 1e9
    for r in rows:
        cells = [f'{p / g:.2f} G -> {f / g:.2f} G ({f / p:.2f}x)'
                 for p, f in (r['whole'], r['whole_with_attention'], r['decode_head'],
                              r['site_macs'])]
        print(f"| {r['model']} {r['input'][0]}x{r['input'][1]} | {r['site']} | "
              + ' | '.join(cells) + ' |')
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == '__main__':
    sys.exit(main())
