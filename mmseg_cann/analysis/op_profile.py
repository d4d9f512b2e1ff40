"""Per-call-site profile of the upsample and pooling ops of a converted mmseg model.

``tools/profile_ops.py`` is the command-line front end. How it works:

1. the model is built from an mmseg config and converted with
   :func:`mmseg_cann.convert_model` (CANN modules + ``resize`` routing);
2. every call site is labelled: each CANN module's forward by its module path, each
   routed ``resize()`` call by the path of the module that called it and the source line
   (``resize@decode_head.psp_modules.0 (psp_head.py:38)``). A site opens a
   ``torch.profiler.record_function`` range named ``mmseg_cann_site_<n>`` (``n`` = call
   order within one forward, so iterations line up);
3. while profiling, the op layer's backend lookup is wrapped so each call also records
   its op, shapes, dtype and the plan the NPU planner chooses for the device (or for an
   assumed Ascend generation);
4. the forward is ``model.encode_decode`` (backbone, heads and the final resize to the
   input size); ``backward`` adds ``out.float().mean().backward()``. A site's backward
   time is the time of the autograd nodes whose forward ops ran inside its range
   (matched through the profiler's ``sequence_nr``).

Times are CPU times of the profiler ranges on CPU, device times on CUDA. On an NPU the
aten ranges of ``torch.profiler`` only see kernel launches (torch_npu has its own
profiler), so the tool synchronises the device (``torch.npu.synchronize(device)``)
around each site and uses wall-clock time, and synchronises inside the forward and
backward ranges so that their totals include the device work. Per-site backward figures
come from the autograd nodes' CPU ranges, which on an NPU hold only kernel launches:
the report labels them as launch times there (``backward_site_times``).
Bytes moved = input + output (+ int64 indices) bytes of one call; bandwidth = bytes / time.
"""
from __future__ import annotations

import contextvars
import dataclasses
import os
import sys
import time
from contextlib import contextmanager
from typing import Dict, List, Optional, Tuple

import torch
from torch import nn

_current: contextvars.ContextVar = contextvars.ContextVar('mmseg_cann_profile_site', default=None)
RANGE_PREFIX = 'mmseg_cann_site_'
FORWARD_RANGE = 'mmseg_cann_forward'
BACKWARD_RANGE = 'mmseg_cann_backward'


@dataclasses.dataclass
class SiteCall:
    """One call of one site in one forward (filled in as the call runs)."""

    index: int
    site: str
    op: str = ''
    in_shape: Tuple[int, ...] = ()
    out_shape: Tuple[int, ...] = ()
    dtype: str = ''
    plan: str = ''
    bytes: int = 0
    wall_ms: float = 0.0


@dataclasses.dataclass
class SiteStats:
    """Aggregated figures of one site (per forward, averaged over iterations)."""

    site: str
    op: str
    in_shape: str
    out_shape: str
    dtype: str
    plan: str
    fwd_ms: float
    fwd_share: float
    bwd_ms: Optional[float]
    bwd_share: Optional[float]
    mbytes: float
    gbps: float


class SiteRecorder:
    """Labels call sites of a converted model and records what each call does.

    Args:
        model: the converted model (CANN modules inside, resize routed).
        caps: the :class:`~mmseg_cann.backends.npu_device.DeviceCaps` plans are made for.
        sync: synchronise the device around each site and keep wall-clock times.
    """

    def __init__(self, model: nn.Module, caps, sync: bool = False) -> None:
        self.model = model
        self.caps = caps
        self.sync = sync
        self.calls: List[SiteCall] = []
        self._counter = 0
        self._paths = {id(m): p for p, m in model.named_modules()}
        self._undo: List = []
        self._plans: Dict[tuple, str] = {}

    # -- site labelling -------------------------------------------------------------
    def _open(self, label: str):
        call = SiteCall(self._counter, label)
        self._counter += 1
        self.calls.append(call)
        return call

    @contextmanager
    def _site(self, label: str, device):
        call = self._open(label)
        token = _current.set(call)
        if self.sync:
            _synchronize(device)
        start = time.perf_counter()
        try:
            with torch.profiler.record_function(f'{RANGE_PREFIX}{call.index}'):
                yield call
        finally:
            if self.sync:
                _synchronize(device)
            call.wall_ms = (time.perf_counter() - start) * 1e3
            _current.reset(token)

    def new_iteration(self) -> None:
        self._counter = 0

    def install(self) -> 'SiteRecorder':
        from ..models.registry import CANN_MODULES
        for path, module in self.model.named_modules():
            if isinstance(module, CANN_MODULES):
                self._wrap_forward(path, module)
        self._wrap_resize()
        self._wrap_backends()
        return self

    def remove(self) -> None:
        for undo in reversed(self._undo):
            undo()
        self._undo.clear()

    def _wrap_forward(self, path: str, module: nn.Module) -> None:
        original = module.forward
        recorder = self

        def forward(*args, **kwargs):
            with recorder._site(path, args[0].device if args else None):
                return original(*args, **kwargs)

        module.forward = forward
        self._undo.append(lambda: delattr(module, 'forward'))

    def _wrap_resize(self) -> None:
        from .. import convert
        recorder = self
        routed = convert.cann_resize

        def resize(input, *args, **kwargs):
            frame = sys._getframe(1)
            owner = frame.f_locals.get('self')
            path = recorder._paths.get(id(owner), type(owner).__name__ if owner is not None
                                       else '?')
            where = f'{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}'
            with recorder._site(f'resize@{path or "<model>"} ({where})', input.device):
                return routed(input, *args, **kwargs)

        for name in list(convert._patched):
            module = sys.modules.get(name)
            if module is not None and getattr(module, 'resize', None) is routed:
                module.resize = resize
                self._undo.append(lambda m=module: setattr(m, 'resize', routed))

    def _wrap_backends(self) -> None:
        from .. import backends
        original = backends.get_backend
        recorder = self

        def get_backend(name, op='upsample'):
            return _RecordingBackend(original(name, op), recorder)

        backends.get_backend = get_backend
        self._undo.append(lambda: setattr(backends, 'get_backend', original))
        # every call reaches the backend (no cached direct calls) while recording
        from ..ops.direct import direct_calls_disabled
        disabled = direct_calls_disabled()
        disabled.__enter__()
        self._undo.append(lambda: disabled.__exit__(None, None, None))

    def describe(self, op: str, x: torch.Tensor, spec=None, **kw) -> str:
        """The plan line for this call, memoised so that profiled iterations (after the
        warm-up) do not pay for planning inside the timed range."""
        from ..backends.npu import plan_for
        from ..backends.npu_plan import memory_format_of
        key = (op, tuple(x.shape), x.dtype, memory_format_of(x), repr(spec),
               tuple(sorted(kw.items())))
        if key not in self._plans:
            self._plans[key] = plan_for(op, x.detach(), spec, caps=self.caps, **kw).describe()
        return self._plans[key]


class _RecordingBackend:
    """Wraps a backend module: fills the current site's record, then runs the call."""

    def __init__(self, impl, recorder: SiteRecorder) -> None:
        self.impl, self.recorder = impl, recorder

    def __getattr__(self, name):  # the fused ops run unrecorded
        return getattr(self.impl, name)

    def _fill(self, op, x, out, plan):
        call = _current.get()
        if call is None:
            return
        values = out[0] if isinstance(out, tuple) else out
        call.op, call.in_shape, call.out_shape = op, tuple(x.shape), tuple(values.shape)
        call.dtype = str(x.dtype).replace('torch.', '')
        call.plan = plan
        call.bytes = sum(t.numel() * t.element_size()
                         for t in ((x,) + (out if isinstance(out, tuple) else (out,))))

    def upsample(self, x, spec):
        out = self.impl.upsample(x, spec)
        self._fill('upsample', x, out, self.recorder.describe('upsample', x, spec))
        return out

    def max_pool2d(self, x, spec, return_indices=False):
        out = self.impl.max_pool2d(x, spec, return_indices)
        self._fill('max_pool2d', x, out, self.recorder.describe(
            'max_pool2d', x, spec, return_indices=return_indices))
        return out

    def avg_pool2d(self, x, spec, count_include_pad=True, divisor_override=None):
        out = self.impl.avg_pool2d(x, spec, count_include_pad, divisor_override)
        self._fill('avg_pool2d', x, out, self.recorder.describe(
            'avg_pool2d', x, spec, count_include_pad=count_include_pad,
            divisor_override=divisor_override))
        return out

    def adaptive_avg_pool2d(self, x, output_size):
        out = self.impl.adaptive_avg_pool2d(x, output_size)
        self._fill('adaptive_avg_pool2d', x, out, self.recorder.describe(
            'adaptive_avg_pool2d', x, out_size=tuple(output_size)))
        return out


def _synchronize(device) -> None:
    """Wait for ``device``'s queued work (its own queue: the device is passed on)."""
    if device is None:
        return
    from ..backends.npu_device import synchronize
    synchronize(device)


# ----------------------------------------------------------------------------------
# building the model and profiling it
# ----------------------------------------------------------------------------------
def build_converted_model(config: str, shape: Tuple[int, int], device: str,
                          cfg_options: Optional[dict] = None) -> nn.Module:
    """Build ``config``'s segmentor (no checkpoint), convert it, move it to ``device``."""
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    from mmseg.registry import MODELS

    from ..convert import convert_model
    cfg = Config.fromfile(config)
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    init_default_scope(cfg.get('default_scope', 'mmseg'))
    model_cfg = cfg.model
    model_cfg.pop('pretrained', None)
    if model_cfg.get('data_preprocessor') is not None:
        model_cfg.data_preprocessor['size'] = tuple(shape)
    model = MODELS.build(model_cfg)
    convert_model(model)
    return model.to(device)


def _event_time_ms(evt, device_type: str) -> float:
    if device_type == 'cuda':
        return getattr(evt, 'device_time_total', getattr(evt, 'cuda_time_total', 0.0)) / 1e3
    return evt.cpu_time_total / 1e3


def _descendants(evt):
    stack = list(evt.cpu_children)
    while stack:
        child = stack.pop()
        yield child
        stack.extend(child.cpu_children)


def profile_model(model: nn.Module, shape: Tuple[int, int], device: str, *, iters: int = 3,
                  batch: int = 1, backward: bool = False, caps=None,
                  warmup: int = 1) -> dict:
    """Profile ``model`` (a converted mmseg segmentor); returns the report dict.

    Args:
        model: from :func:`build_converted_model`.
        shape: input ``(H, W)``.
        device: ``'cpu'``, ``'cuda'`` or ``'npu'``.
        iters: profiled iterations (after ``warmup`` unprofiled ones); times are means.
        batch: batch size.
        backward: also run and attribute the backward pass.
        caps: device capabilities the plans are shown for (default: ``device``'s).
    """
    from torch.profiler import ProfilerActivity, profile

    from ..backends.npu_device import device_caps
    dev = torch.device(device)
    caps = caps if caps is not None else device_caps(dev)
    h, w = shape
    x = torch.randn(batch, 3, h, w, device=dev)
    metas = [dict(img_shape=(h, w), ori_shape=(h, w), pad_shape=(h, w))] * batch
    model.eval()  # BN running stats (batch 1 works); gradients still flow for --backward
    recorder = SiteRecorder(model, caps, sync=dev.type == 'npu').install()

    sync_in_ranges = syncs_inside_ranges(dev.type)

    def step():
        recorder.new_iteration()
        recorder.calls.clear()
        with torch.profiler.record_function(FORWARD_RANGE):
            out = model.encode_decode(x, metas)
            if sync_in_ranges:
                _synchronize(dev)
        if backward:
            with torch.profiler.record_function(BACKWARD_RANGE):
                out.float().mean().backward()
                if sync_in_ranges:
                    _synchronize(dev)
        return out

    try:
        with torch.set_grad_enabled(backward):
            for _ in range(warmup):
                step()
            activities = [ProfilerActivity.CPU] + (
                [ProfilerActivity.CUDA] if dev.type == 'cuda' else [])
            per_iter_calls = []
            with profile(activities=activities) as prof:
                for _ in range(iters):
                    step()
                    _synchronize(dev)
                    per_iter_calls.append(list(recorder.calls))
    finally:
        recorder.remove()
    return _summarize(prof.events(), per_iter_calls, dev.type, str(dev), iters, backward, caps,
                      shape, batch)


def syncs_inside_ranges(device_type: str) -> bool:
    """Whether the forward/backward profiler ranges end with a device sync: on an NPU,
    whose ranges would otherwise time only the kernel launches."""
    return device_type == 'npu'


def backward_site_times(device_type: str) -> str:
    """What the per-site backward figures measure on ``device_type``: ``'launch'`` on an
    NPU (autograd-node CPU ranges hold only kernel launches there), else ``'device'``
    (CUDA device time) or ``'cpu'``."""
    return {'npu': 'launch', 'cuda': 'device'}.get(device_type, 'cpu')


def _summarize(events, per_iter_calls, device_type: str, device_name: str, iters, backward,
               caps, shape, batch) -> dict:
    fwd_total = bwd_total = 0.0
    site_fwd: Dict[int, float] = {}
    seq_to_site: Dict[int, int] = {}
    backward_nodes = []
    for evt in events:
        name = evt.name
        if name == FORWARD_RANGE:
            fwd_total += _event_time_ms(evt, device_type)
        elif name == BACKWARD_RANGE:
            bwd_total += _event_time_ms(evt, device_type)
        elif name.startswith(RANGE_PREFIX):
            index = int(name[len(RANGE_PREFIX):])
            site_fwd[index] = site_fwd.get(index, 0.0) + _event_time_ms(evt, device_type)
            for child in _descendants(evt):
                if getattr(child, 'sequence_nr', -1) >= 0:
                    seq_to_site[child.sequence_nr] = index
        elif name.startswith('autograd::engine::evaluate_function'):
            backward_nodes.append(evt)
    site_bwd: Dict[int, float] = {}
    for evt in backward_nodes:
        index = seq_to_site.get(getattr(evt, 'sequence_nr', -1))
        if index is not None:
            site_bwd[index] = site_bwd.get(index, 0.0) + _event_time_ms(evt, device_type)
    calls = per_iter_calls[-1]
    if device_type == 'npu':  # wall-clock times of synchronised sites
        site_fwd = {c.index: sum(it[c.index].wall_ms for it in per_iter_calls
                                 if len(it) > c.index) for c in calls}
    fwd_total, bwd_total = fwd_total / iters, bwd_total / iters
    rows = []
    for call in calls:
        fwd = site_fwd.get(call.index, 0.0) / iters
        bwd = site_bwd.get(call.index, 0.0) / iters if backward else None
        rows.append(SiteStats(
            call.site, call.op or '-', 'x'.join(map(str, call.in_shape)),
            'x'.join(map(str, call.out_shape)), call.dtype, call.plan, round(fwd, 4),
            round(fwd / fwd_total, 4) if fwd_total else 0.0,
            None if bwd is None else round(bwd, 4),
            None if bwd is None else (round(bwd / bwd_total, 4) if bwd_total else 0.0),
            round(call.bytes / 1e6, 3),
            round(call.bytes / (fwd * 1e-3) / 1e9, 3) if fwd > 0 else 0.0))
    rows.sort(key=lambda r: -r.fwd_ms)
    return {'device': device_name, 'plans_for': str(caps), 'shape': list(shape), 'batch': batch,
            'backward_site_times': backward_site_times(device_type) if backward else None,
            'iters': iters, 'forward_ms': round(fwd_total, 3),
            'backward_ms': round(bwd_total, 3) if backward else None,
            'sites_forward_share': round(sum(r.fwd_share for r in rows), 4),
            'sites': [dataclasses.asdict(r) for r in rows]}


def format_report(report: dict, max_plan: int = 60) -> str:
    """The report as a text table (sites sorted by forward time)."""
    backward = report['backward_ms'] is not None
    launch = report.get('backward_site_times') == 'launch'
    bwd = ['bwd launch ms', 'bwd launch %'] if launch else ['bwd ms', 'bwd %']
    header = ['site', 'op', 'input', 'output', 'dtype', 'fwd ms', 'fwd %'] + (
        bwd if backward else []) + ['MB', 'GB/s', 'plan']
    rows = [header]
    for s in report['sites']:
        plan = s['plan'] if len(s['plan']) <= max_plan else s['plan'][:max_plan - 3] + '...'
        rows.append([s['site'], s['op'], s['in_shape'], s['out_shape'], s['dtype'],
                     f"{s['fwd_ms']:.3f}", f"{100 * s['fwd_share']:.1f}"] +
                    ([f"{s['bwd_ms']:.3f}", f"{100 * s['bwd_share']:.1f}"] if backward else []) +
                    [f"{s['mbytes']:.2f}", f"{s['gbps']:.2f}", plan])
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(header))]
    lines = ['  '.join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, '  '.join('-' * w for w in widths))
    total = (f"forward {report['forward_ms']:.2f} ms per iteration "
             f"(batch {report['batch']}, {report['shape'][0]}x{report['shape'][1]}, "
             f"{report['device']}, plans for {report['plans_for']}); upsample/pool sites: "
             f"{100 * report['sites_forward_share']:.1f}% of the forward")
    if backward:
        total += f"; backward {report['backward_ms']:.2f} ms"
        if launch:
            total += (' (per-site backward figures are kernel launch times: the NPU runs '
                      'asynchronously)')
    return '\n'.join(lines + ['', total])


def plot_report(report: dict, path: str, top: int = 25) -> None:
    """Horizontal bar chart of forward (and backward) time per site, slowest on top."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    sites = report['sites'][:top][::-1]
    labels = [f"{s['site'][:48]}  {s['in_shape']}->{s['out_shape']}" for s in sites]
    fwd = [s['fwd_ms'] for s in sites]
    fig, ax = plt.subplots(figsize=(11, 0.38 * len(sites) + 1.6))
    ax.barh(range(len(sites)), fwd, label='forward', color='tab:blue')
    if report['backward_ms'] is not None:
        ax.barh(range(len(sites)), [s['bwd_ms'] for s in sites], left=fwd,
                label='backward', color='tab:orange')
    ax.set_yticks(range(len(sites)))
    ax.set_yticklabels(labels, fontsize=7)
    ax.set_xlabel('ms per iteration')
    ax.set_title(f"upsample/pool call sites ({report['device']}, "
                 f"{report['shape'][0]}x{report['shape'][1]}, batch {report['batch']}; "
                 f"forward {report['forward_ms']:.1f} ms)", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches='tight')
    plt.close(fig)
