"""Benchmark mmseg_cann ops against eager PyTorch and torch.compile in one process.

For every case: median time and peak extra memory of eager PyTorch, ``torch.compile`` of
the same function, and every mmseg_cann backend available on the device; ratios to
eager, achieved bandwidth (bytes read + written by the op / time) and the device's
measured copy bandwidth (``dst.copy_(src)`` of 256 MB) as the ceiling. Prints a
Markdown table and writes JSON.

Peak extra memory is the largest amount of memory allocated during the call beyond
what was allocated before it and beyond the returned result (CPU: from the profiler's
allocation events; CUDA/NPU: from the allocator's peak statistics). The numba kernels
of the fused ops allocate their per-thread buffers as torch tensors, so they are counted.

Usage::

    python tools/benchmark.py [--device cpu|cuda|npu] [--cases all|smoke|NAME ...]
                              [--repeats 5] [--no-compile] [--json OUT]

The ``infer_*`` cases run mmseg's whole-model prediction with the model built through
the public API, ``mmseg.apis.init_model`` against ``mmseg_cann.apis.init_model``
(converted, lean prediction path; on CPU both revert SyncBN as mmseg's inferencer does):
Fast-SCNN (a 19-class Cityscapes model) on one 1024x2048 image in ``whole`` mode, and
UNet-S5-D16 (16 base channels) on one HRF-size 2336x3504 image in ``slide`` mode (one
timed call each). ``train_step_demo_unet`` times the demo's
training iteration (``make demo``'s model, batch 4 of 64x64) unconverted and converted
with ``backend='auto'`` and ``'fast'``. The ``int8_ort_*`` cases time int8 against fp32
graphs in onnxruntime (tools/_bench_int8.py; the ``eager`` column is the fp32 graph).
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

import torch
import torch.nn.functional as F
from _bench_int8 import cases as int8_cases
from _bench_resize_conv import cases as resize_conv_cases
from _bench_roi import cases as roi_cases
from _common import (add_debug, build_segmentor, check_output, random_seg_samples, run,
                     sgd_step)

import mmseg_cann
from mmseg_cann.backends import fused as fused_backend
from mmseg_cann.ops import avg_pool2d, max_pool2d, upsample
from mmseg_cann.ops.fused import upsample_add, upsample_argmax

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass
class Case:
    """One benchmark case: ``make()`` returns the inputs, ``eager(*inputs)`` the baseline."""

    name: str
    make: Callable[[torch.device], tuple]
    eager: Callable
    #: mmseg_cann implementations: label -> function of the same inputs
    ours: Dict[str, Callable] = field(default_factory=dict)
    #: bytes moved by the op (reads + writes), for the bandwidth column
    nbytes: Optional[Callable[[tuple, object], int]] = None
    compile: bool = True
    #: timed calls for cases too slow for --repeats (whole-model inference)
    repeats: Optional[int] = None
    #: the Triton kernel form, benchmarked on CUDA/NPU devices only
    triton: Optional[Callable] = None
    #: time the implementations in alternation (round by round) rather than one after
    #: another, so that a drift of the machine's speed (a shared host) is shared by all
    interleave: bool = False


def _rand(shape, dtype, device, channels_last=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g).to(dtype)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    return x.to(device)


def _bytes_in_out(inputs, out):
    outs = out if isinstance(out, (tuple, list)) else (out,)
    return sum(t.numel() * t.element_size() for t in list(inputs) + list(outs)
               if isinstance(t, torch.Tensor))


def _upsample_case(name, shape, size, mode, dtype=torch.float32, cl=False):
    kw = dict(mode=mode, align_corners=False) if mode == 'bilinear' else dict(mode=mode)
    return Case(name, lambda d: (_rand(shape, dtype, d, cl),),
                lambda x: F.interpolate(x, size=size, **kw),
                {f'mmseg_cann {b}': (lambda x, b=b: upsample(x, size=size, backend=b, **kw))
                 for b in ('native',)}, _bytes_in_out,
                triton=lambda x: upsample(x, size=size, backend='triton', **kw))


def _add_case(name, shape, size):
    def make(d):
        return (_rand(shape, torch.float32, d), _rand(shape[:2] + size, torch.float32, d, seed=1))
    return Case(name, make, lambda x, o: o + F.interpolate(x, size=o.shape[-2:], mode='bilinear',
                                                           align_corners=False),
                {'mmseg_cann native': lambda x, o: upsample_add(x, o, backend='native'),
                 'mmseg_cann fused': lambda x, o: upsample_add(x, o, backend='fused'),
                 'mmseg_cann fused, torch paths': _without_numba(
                     lambda x, o: upsample_add(x, o, backend='fused'))}, _bytes_in_out,
                triton=lambda x, o: upsample_add(x, o, backend='triton'))


def _structured_logits(shape, device, seed=0):
    """Decoder-like logits: smooth per-class fields (one class clearly ahead over most of
    the map, close races along region boundaries) plus a little noise."""
    g = torch.Generator().manual_seed(seed)
    n, c, h, w = shape
    coarse = torch.randn((n, c, h // 8 + 2, w // 8 + 2), generator=g) * 4
    fields = F.interpolate(coarse, (h, w), mode='bicubic', align_corners=True)
    return (fields + 0.1 * torch.randn(shape, generator=g)).to(device)


def _argmax_case(name, shape, size, structured=False):
    """``upsample_argmax`` of iid normal logits (every class close to the best almost
    everywhere: the hardest input) or, ``structured``, decoder-like ones."""
    def make(d):
        return (_structured_logits(shape, d) if structured else _rand(shape, torch.float32, d),)
    return Case(name, make,
                lambda x: F.interpolate(x, size=size, mode='bilinear',
                                        align_corners=False).argmax(1),
                {'mmseg_cann native': lambda x: upsample_argmax(x, size, backend='native'),
                 'mmseg_cann fused': lambda x: upsample_argmax(x, size, backend='fused'),
                 'mmseg_cann fused, torch paths': _without_numba(
                     lambda x: upsample_argmax(x, size, backend='fused'))}, _bytes_in_out,
                triton=lambda x: upsample_argmax(x, size, backend='triton'))


def _without_numba(fn):
    """``fn`` with the fused backend's numba kernels switched off: the torch paths
    (in-place add; banded ``torch.compile``) that run where numba does not apply."""
    def run(*args):
        saved, fused_backend.USE_NUMBA = fused_backend.USE_NUMBA, False
        try:
            return fn(*args)
        finally:
            fused_backend.USE_NUMBA = saved
    return run


def _pool_case(name, shape, kind):
    torch_fn = F.max_pool2d if kind == 'max' else F.avg_pool2d
    ours = max_pool2d if kind == 'max' else avg_pool2d
    return Case(name, lambda d: (_rand(shape, torch.float32, d),),
                lambda x: torch_fn(x, 3, 2, 1),
                {'mmseg_cann native': lambda x: ours(x, 3, 2, 1)}, _bytes_in_out,
                triton=lambda x: ours(x, 3, 2, 1, backend='triton'))


def _fast_upsample_case(name, shape, size, mode, cl=False, align_corners=False):
    """Forward upsample: eager, torch.compile, ``backend='native'`` and ``'fast'``."""
    kw = dict(mode=mode, align_corners=align_corners) if mode == 'bilinear' else dict(mode=mode)
    return Case(name, lambda d: (_rand(shape, torch.float32, d, cl),),
                lambda x: F.interpolate(x, size=size, **kw),
                {f'mmseg_cann {b}': (lambda x, b=b: upsample(x, size=size, backend=b, **kw))
                 for b in ('native', 'fast')}, _bytes_in_out)


def _fast_bilinear_train_case(name, shape, size, cl=False):
    """Bilinear forward + backward (a given output gradient): eager vs ``'fast'``."""
    def make(d):
        x = _rand(shape, torch.float32, d, cl).requires_grad_()
        return x, _rand(shape[:2] + size, torch.float32, d, cl, seed=1)

    def step(fn):
        def run(x, g):
            with torch.enable_grad():
                fn(x).backward(g)
            grad, x.grad = x.grad, None
            return grad
        return run
    return Case(name, make, step(lambda x: F.interpolate(x, size=size, mode='bilinear')),
                {'mmseg_cann fast': step(lambda x: upsample(x, size=size, mode='bilinear',
                                                            backend='fast'))},
                _bytes_in_out, compile=False)


def _fast_pool_case(name, shape, kind, cl=False):
    """Pooling 3/2/1 (max with the indices training needs): eager, compile, native, fast."""
    if kind == 'max':
        def torch_fn(x):
            return F.max_pool2d(x, 3, 2, 1, return_indices=True)

        def ours(x, b):
            return max_pool2d(x, 3, 2, 1, return_indices=True, backend=b)
    else:
        def torch_fn(x):
            return F.avg_pool2d(x, 3, 2, 1)

        def ours(x, b):
            return avg_pool2d(x, 3, 2, 1, backend=b)
    return Case(name, lambda d: (_rand(shape, torch.float32, d, cl),), torch_fn,
                {f'mmseg_cann {b}': (lambda x, b=b: ours(x, b)) for b in ('native', 'fast')},
                _bytes_in_out)


def _pspnet_case(name, hw):
    state = {}

    def make(d):
        from mmengine.config import Config
        from mmengine.registry import init_default_scope
        from mmseg.registry import MODELS
        import os
        import tempfile
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, 'cfg.py')
            with open(path, 'w') as f:
                f.write("_base_ = 'mmseg::pspnet/pspnet_r50-d8_4xb2-40k_cityscapes-512x1024.py'\n")
            cfg = Config.fromfile(path)
        init_default_scope('mmseg')
        norm = dict(type='BN', requires_grad=True)
        cfg.model.backbone.update(depth=18, norm_cfg=norm)
        cfg.model.decode_head.update(in_channels=512, channels=128, norm_cfg=norm)
        cfg.model.auxiliary_head.update(in_channels=256, channels=64, norm_cfg=norm)
        cfg.model.data_preprocessor.size = hw
        model = MODELS.build(cfg.model).to(d).eval()
        converted = mmseg_cann.convert_model(copy.deepcopy(model), resize=False)
        state.update(model=model, converted=converted)
        return (_rand((1, 3) + hw, torch.float32, d),)

    def eager(x):
        with torch.no_grad():
            return state['model'](x, mode='tensor')

    def converted(x):
        with torch.no_grad(), mmseg_cann.convert.routed_resize():
            return state['converted'](x, mode='tensor')
    return Case(name, make, eager, {'mmseg_cann converted': converted}, compile=False)


def _api_segmentors(base: str, overrides: Callable[[object], None], device: torch.device):
    """The public API path: ``mmseg.apis.init_model`` (SyncBN reverted to mmengine's
    ``_BatchNormXd`` on CPU, as ``MMSegInferencer`` does) and ``mmseg_cann.apis.init_model``
    (the same, converted with the config's settings and the lean prediction path), both
    from ``mmseg::`` config ``base`` with ``overrides(cfg)`` applied. No checkpoint: both
    start from the same seeded initialisation. ``resize`` routing, which the conversion
    turns on for the whole process, is left off here (the converted case turns it on
    around its own calls, so mmseg's baseline runs mmseg's code)."""
    import tempfile

    from mmengine.config import Config
    from mmengine.model import revert_sync_batchnorm
    from mmseg.apis import init_model as mmseg_init_model

    from mmseg_cann.apis import init_model

    def config():
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, 'cfg.py')
            with open(path, 'w') as f:
                f.write(f"_base_ = '{base}'\n")
            cfg = Config.fromfile(path)
        overrides(cfg)
        return cfg
    torch.manual_seed(0)
    plain = mmseg_init_model(config(), device=str(device))
    if device.type == 'cpu':
        plain = revert_sync_batchnorm(plain)
    was_routed = mmseg_cann.convert.resize_routed()
    torch.manual_seed(0)
    ours = init_model(config(), device=str(device))
    if not was_routed:
        mmseg_cann.convert.restore_resize()
    return plain.eval(), ours


def _inference_case(name, base, hw, overrides=lambda cfg: None):
    """mmseg's ``predict`` on one ``hw`` image (labels and what mmseg keeps with them),
    the model built by ``mmseg.apis.init_model`` vs by ``mmseg_cann.apis.init_model``
    (converted, lean prediction path: what the public API gives). Peak memory here
    includes what the returned samples hold (mmseg keeps full-resolution ``seg_logits``;
    the lean path does not)."""
    state = {}

    def make(d):
        from mmseg.structures import SegDataSample
        model, converted = _api_segmentors(base, overrides, d)
        meta = dict(ori_shape=hw, img_shape=hw, pad_shape=hw, padding_size=[0, 0, 0, 0])
        state.update(model=model, converted=converted, meta=meta, sample=SegDataSample)
        return (_rand((1, 3) + hw, torch.float32, d),)

    def predict(model, x):
        samples = [state['sample'](metainfo=dict(state['meta']))]
        with torch.no_grad():
            return model.predict(x, samples)

    def converted(x):
        with mmseg_cann.convert.routed_resize():
            return predict(state['converted'], x)
    return Case(name, make, lambda x: predict(state['model'], x),
                {'mmseg_cann.apis.init_model, lean predict': converted}, compile=False,
                repeats=1)


DEMO_CONFIG = 'configs/medical/unet-s5-d16_fcn_cann_1xb4-300iter_synthetic-drive-64x64.py'
TRAIN_STEPS_PER_RUN = 5


def _train_step_case(name, config=DEMO_CONFIG, shape=(4, 3, 64, 64), num_classes=2):
    """The demo's training iteration (forward, loss, backward, SGD step; batch 4 of 64x64
    crops): the unconverted model vs ``convert_model(..., backend=b)`` copies of it, each
    with its own optimizer, ``TRAIN_STEPS_PER_RUN`` steps per timed run."""
    state = {}

    def make(d):
        model = build_segmentor(os.path.join(REPO_ROOT, config), lambda cfg: None).to(d)
        for b in ('auto', 'fast'):
            state[b] = mmseg_cann.convert_model(copy.deepcopy(model), resize=False,
                                                backend=b).train()
        state['plain'] = model.train()
        state['optim'] = {k: torch.optim.SGD(m.parameters(), lr=0.01)
                          for k, m in state.items() if k != 'optim'}
        gen = torch.Generator().manual_seed(0)
        state['samples'] = random_seg_samples(shape[2:], num_classes, shape[0], gen, d)
        return (torch.randn(shape, generator=gen).to(d),)

    def steps(key):
        def run(x):
            model, optim = state[key], state['optim'][key]
            routed = contextlib.nullcontext() if key == 'plain' else \
                mmseg_cann.convert.routed_resize()
            with routed:
                for _ in range(TRAIN_STEPS_PER_RUN):
                    loss = sgd_step(model, optim, x, state['samples'])
            return loss
        return run
    return Case(name, make, steps('plain'),
                {f'mmseg_cann converted, backend={b!r}': steps(b) for b in ('auto', 'fast')},
                compile=False)


CALLS_PER_RUN = 1000


def _overhead_case(name, nn_module, cann_module, functional, cann_functional):
    """Per-call cost on a tiny map (1x8x4x4): ``CALLS_PER_RUN`` calls per timed run of the
    nn module, the CANN module (cached direct call), ``torch.nn.functional`` and
    ``mmseg_cann.ops``. What is left is Python overhead per call. Timed in alternation
    (microseconds drift with the load of a shared machine)."""
    def loop(fn):
        def run(x):
            for _ in range(CALLS_PER_RUN):
                out = fn(x)
            return out
        return run
    return Case(name, lambda d: (_rand((1, 8, 4, 4), torch.float32, d),), loop(nn_module),
                {'mmseg_cann module': loop(cann_module),
                 'torch.nn.functional': loop(functional),
                 'mmseg_cann.ops': loop(cann_functional)}, compile=False, interleave=True)


def _hrf_overrides(cfg):
    # the demo's width (16 base channels) at HRF's real size and slide windows
    cfg.model.backbone.base_channels = 16
    cfg.model.decode_head.update(in_channels=16, channels=16)
    cfg.model.auxiliary_head.update(in_channels=32, channels=16)


N, C = 2, 256
CASES = {c.name: c for c in [
    _upsample_case('bilinear2x_fp32_nchw', (N, C, 128, 256), (256, 512), 'bilinear'),
    _upsample_case('bilinear2x_fp32_cl', (N, C, 128, 256), (256, 512), 'bilinear', cl=True),
    _upsample_case('bilinear2x_fp16_nchw', (N, C, 128, 256), (256, 512), 'bilinear',
                   torch.float16),
    _upsample_case('bilinear2x_fp16_cl', (N, C, 128, 256), (256, 512), 'bilinear',
                   torch.float16, cl=True),
    _upsample_case('nearest2x_fp32', (N, C, 128, 256), (256, 512), 'nearest'),
    _upsample_case('bilinear8x_logits', (1, 19, 128, 256), (1024, 2048), 'bilinear'),
    _add_case('upsample_add', (N, C, 64, 128), (128, 256)),
    _argmax_case('upsample_argmax_19', (1, 19, 128, 256), (1024, 2048)),
    _argmax_case('upsample_argmax_150', (1, 150, 128, 128), (1024, 1024)),
    _argmax_case('upsample_argmax_19_structured', (1, 19, 128, 256), (1024, 2048), True),
    _argmax_case('upsample_argmax_150_structured', (1, 150, 128, 128), (1024, 1024), True),
    _pool_case('maxpool_3_2_1', (N, C, 128, 256), 'max'),
    _pool_case('avgpool_3_2_1', (N, C, 128, 256), 'avg'),
    _fast_upsample_case('fast_bilinear2x_nchw', (N, C, 128, 256), (256, 512), 'bilinear'),
    _fast_upsample_case('fast_bilinear2x_nchw_ac', (N, C, 128, 256), (256, 512), 'bilinear',
                        align_corners=True),
    _fast_upsample_case('fast_bilinear2x_cl', (N, C, 128, 256), (256, 512), 'bilinear', cl=True),
    _fast_upsample_case('fast_bilinear2x_cl_ac', (N, C, 128, 256), (256, 512), 'bilinear',
                        cl=True, align_corners=True),
    _fast_bilinear_train_case('fast_bilinear2x_fwd_bwd_nchw', (N, C, 128, 256), (256, 512)),
    _fast_bilinear_train_case('fast_bilinear2x_fwd_bwd_cl', (N, C, 128, 256), (256, 512),
                              cl=True),
    _fast_upsample_case('fast_nearest2x_nchw', (N, C, 128, 256), (256, 512), 'nearest'),
    _fast_upsample_case('fast_nearest2x_cl', (N, C, 128, 256), (256, 512), 'nearest', cl=True),
    _fast_pool_case('fast_maxpool_idx_3_2_1_nchw', (N, C, 128, 256), 'max'),
    _fast_pool_case('fast_maxpool_idx_3_2_1_cl', (N, C, 128, 256), 'max', cl=True),
    _fast_pool_case('fast_avgpool_3_2_1_nchw', (N, C, 128, 256), 'avg'),
    _fast_pool_case('fast_avgpool_3_2_1_cl', (N, C, 128, 256), 'avg', cl=True),
    _pspnet_case('pspnet_r18_forward', (256, 512)),
    _overhead_case('overhead_upsample', torch.nn.Upsample(scale_factor=2, mode='bilinear'),
                   mmseg_cann.CANNUpsample(scale_factor=2, mode='bilinear'),
                   lambda x: F.interpolate(x, scale_factor=2, mode='bilinear'),
                   lambda x: upsample(x, scale_factor=2, mode='bilinear')),
    _overhead_case('overhead_maxpool', torch.nn.MaxPool2d(3, 2, 1),
                   mmseg_cann.CANNMaxPool2d(3, 2, 1), lambda x: F.max_pool2d(x, 3, 2, 1),
                   lambda x: max_pool2d(x, 3, 2, 1)),
    _overhead_case('overhead_avgpool', torch.nn.AvgPool2d(3, 2, 1),
                   mmseg_cann.CANNAvgPool2d(3, 2, 1), lambda x: F.avg_pool2d(x, 3, 2, 1),
                   lambda x: avg_pool2d(x, 3, 2, 1)),
    _overhead_case('overhead_adaptive', torch.nn.AdaptiveAvgPool2d(2),
                   mmseg_cann.CANNAdaptiveAvgPool2d(2), lambda x: F.adaptive_avg_pool2d(x, 2),
                   lambda x: mmseg_cann.ops.adaptive_avg_pool2d(x, 2)),
    _train_step_case('train_step_demo_unet'),
    _inference_case('infer_fastscnn_cityscapes_whole',
                    'mmseg::fastscnn/fast_scnn_8xb4-160k_cityscapes-512x1024.py', (1024, 2048)),
    _inference_case('infer_unet_hrf_slide', 'mmseg::unet/unet-s5-d16_fcn_4xb4-40k_hrf-256x256.py',
                    (2336, 3504), _hrf_overrides),
]}
CASES.update({c.name: c for c in resize_conv_cases(Case)})
CASES.update({c.name: c for c in roi_cases(Case)})
CASES.update({c.name: c for c in int8_cases(Case)})
SMOKE = {c.name: c for c in [
    _upsample_case('smoke_bilinear2x', (1, 8, 16, 16), (32, 32), 'bilinear'),
    _add_case('smoke_upsample_add', (1, 8, 8, 8), (16, 16)),
    _argmax_case('smoke_upsample_argmax', (1, 5, 8, 8), (64, 64)),
    _pool_case('smoke_maxpool', (1, 8, 16, 16), 'max'),
]}


def _sync(device: torch.device):
    if device.type == 'cuda':
        torch.cuda.synchronize()
    elif device.type == 'npu':
        torch.npu.synchronize()  # type: ignore[attr-defined]


def median_time(fn, inputs, device, repeats: int) -> float:
    """Median wall time in ms over ``repeats`` calls, after one warm-up call."""
    fn(*inputs)
    _sync(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn(*inputs)
        _sync(device)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def interleaved_times(fns: Dict[str, Callable], inputs, device, repeats: int) -> dict:
    """Median wall time in ms of each function, timed in alternation: one warm-up call
    each, then ``repeats`` rounds calling every function once."""
    times: Dict[str, List[float]] = {label: [] for label in fns}
    for fn in fns.values():
        fn(*inputs)
        _sync(device)
    for _ in range(repeats):
        for label, fn in fns.items():
            start = time.perf_counter()
            fn(*inputs)
            _sync(device)
            times[label].append((time.perf_counter() - start) * 1e3)
    return {label: statistics.median(t) for label, t in times.items()}


def peak_extra_bytes(fn, inputs, device) -> int:
    """Peak memory allocated during one call beyond its result (bytes)."""
    if device.type in ('cuda', 'npu'):
        mod = getattr(torch, device.type)
        _sync(device)
        base = mod.memory_allocated()
        mod.reset_peak_memory_stats()
        out = fn(*inputs)
        _sync(device)
        return mod.max_memory_allocated() - base - _result_bytes(out)
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = fn(*inputs)
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                    if e.name() == '[memory]')
    level = peak = 0
    for _, nbytes in events:
        level += nbytes
        peak = max(peak, level)
    return max(peak - _result_bytes(out), 0)


def _result_bytes(out) -> int:
    if isinstance(out, torch.Tensor):
        return out.untyped_storage().nbytes()
    if isinstance(out, (tuple, list)):
        return sum(_result_bytes(o) for o in out)
    if isinstance(out, dict):
        return sum(_result_bytes(o) for o in out.values())
    return 0


def warm_up_huge_pages(nbytes: int = 256 << 20, times: int = 4) -> None:
    """Fill a few large huge-page outputs (what the fast kernels allocate) before timing.

    The first transparent-huge-page faults of a process are slow (filling a fresh 256 MB
    huge-page tensor: about 290 ms the first time, 16-19 ms afterwards, on the 2-core
    development machine), a once-per-process cost that would otherwise land in the first
    timed calls of whichever case runs first.
    """
    from mmseg_cann.backends import numba_ops
    held = [numba_ops.empty((nbytes // 4,)).fill_(0.0) for _ in range(times)]
    del held


def copy_bandwidth(device, repeats: int, nbytes: int = 256 << 20) -> float:
    """Measured ``copy_`` bandwidth in GB/s (bytes read + written)."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).fill_(1)
    dst = torch.empty_like(src).fill_(0)
    ms = median_time(lambda: dst.copy_(src), (), device, repeats)
    return 2 * nbytes / ms / 1e6


def run_case(case: Case, device, repeats: int, use_compile: bool, ceiling: float) -> List[dict]:
    inputs = case.make(device)
    impls = {'eager': case.eager}
    if use_compile and case.compile:
        impls['torch.compile'] = torch.compile(case.eager, dynamic=False)
    impls.update(case.ours)
    if case.triton is not None and device.type in ('cuda', 'npu'):
        impls['mmseg_cann triton'] = case.triton
    rows = []
    with torch.no_grad():
        paired = interleaved_times(impls, inputs, device, case.repeats or repeats) \
            if case.interleave else {}
        for label, fn in impls.items():
            ms = paired[label] if case.interleave else \
                median_time(fn, inputs, device, case.repeats or repeats)
            mem = peak_extra_bytes(fn, inputs, device)
            row = dict(case=case.name, impl=label, ms=ms, peak_extra_mb=mem / 2**20)
            if case.nbytes is not None:
                gbs = case.nbytes(inputs, fn(*inputs)) / ms / 1e6
                row.update(gb_s=gbs, copy_fraction=gbs / ceiling)
            rows.append(row)
    eager = rows[0]
    for row in rows:
        row['time_ratio'] = row['ms'] / eager['ms']
        row['mem_ratio'] = (row['peak_extra_mb'] / eager['peak_extra_mb']
                            if eager['peak_extra_mb'] > 0 else None)
    return rows


def markdown(rows: List[dict], ceiling: float) -> str:
    def fmt(value, spec):
        return '-' if value is None else format(value, spec)
    lines = [f'Copy bandwidth (ceiling): {ceiling:.1f} GB/s', '',
             '| case | implementation | median ms | x eager | peak extra MB | x eager mem '
             '| GB/s | of copy bw |', '|---|---|---:|---:|---:|---:|---:|---:|']
    for r in rows:
        lines.append(f"| {r['case']} | {r['impl']} | {r['ms']:.2f} | {r['time_ratio']:.2f} "
                     f"| {r['peak_extra_mb']:.1f} | {fmt(r['mem_ratio'], '.3f')} "
                     f"| {fmt(r.get('gb_s'), '.1f')} | {fmt(r.get('copy_fraction'), '.0%')} |")
    return '\n'.join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--device', default='cpu', choices=['cpu', 'cuda', 'npu'])
    parser.add_argument('--cases', nargs='+', default=['all'],
                        help=f"'all', 'smoke' or names: {', '.join(CASES)}")
    parser.add_argument('--repeats', type=int, default=5)
    parser.add_argument('--no-compile', action='store_true',
                        help='skip the torch.compile column')
    parser.add_argument('--json', help='write the rows as JSON to this file')
    add_debug(parser)
    args = parser.parse_args(argv)
    if args.json:
        check_output(args.json, '--json')
    if args.device == 'npu':
        import torch_npu  # noqa: F401  (registers the device)
    device = torch.device(args.device)
    if device.type != 'cpu' and not getattr(torch, device.type).is_available():
        parser.error(f'--device {args.device}: no such device available')
    if args.repeats < 1:
        parser.error('--repeats must be >= 1')
    selected = []
    for name in args.cases:
        if name == 'all':
            selected += list(CASES.values())
        elif name == 'smoke':
            selected += list(SMOKE.values())
        elif name in CASES or name in SMOKE:
            selected.append(CASES.get(name) or SMOKE[name])
        else:
            parser.error(f"--cases: unknown case {name!r}; use 'all', 'smoke' or one of "
                         f"{', '.join(list(CASES) + list(SMOKE))}")
    if device.type == 'cpu':
        warm_up_huge_pages()
    ceiling = copy_bandwidth(device, args.repeats)
    rows = []
    for case in selected:
        rows += run_case(case, device, args.repeats, not args.no_compile, ceiling)
        print(f'done {case.name}', file=sys.stderr, flush=True)
    print(markdown(rows, ceiling))
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(dict(device=str(device), torch=torch.__version__,
                           copy_gb_s=ceiling, rows=rows), f, indent=1)
    return 0


if __name__ == '__main__':
    sys.exit(run(main, 'benchmark'))
