"""Row-strip execution of a backbone's high-resolution local stages (inference memory).

At full resolution the first stages of a segmentation backbone hold the largest
activations of the whole prediction: Fast-SCNN's first convolution turns a
``3 x 1024 x 2048`` image into ``32 x 512 x 1024`` floats (64 MB), and PyTorch's CPU
convolution briefly holds its output twice. These stages are *row-local*: every output
row depends on a band of input rows at a fixed offset. Running such a stage on
horizontal strips of its input, each widened by a halo that covers the receptive field,
and keeping only the rows the strip computes from real input gives the same tensor with
a fraction of the peak memory.

Exactness: a strip computes each kept output element from the same input elements with
the same weights as the whole tensor does (strip boundaries sit on multiples of the
stage's total stride, so the sampling grid is the whole tensor's; the rows a strip's own
padding touches are discarded). Where a convolution's per-output reduction does not
depend on the tensor's height -- PyTorch's CPU kernels for short reductions, such as
those of Fast-SCNN's stem (tested) -- the result is bit-identical; long reductions (a
1x1 convolution from a few hundred channels) are blocked by shape, so the values agree
to float32 rounding and the labels are the unsplit model's except at near-ties of the
top two classes, the contract of the lean prediction path.

Membership (:func:`is_row_local`) is decided by exact class, never by ``isinstance``: a
module qualifies only if ``type(module)`` is a known class, its ``forward`` (and
``__call__``) are the ones that class had when it became known, and the instance has no
``forward`` of its own. The known classes:

* per-element: ``nn.Identity``, the activations in :data:`ACTIVATIONS` and mmcv's
  ``HSigmoid``/``HSwish``/``Swish``; ``nn.Dropout``/``nn.Dropout2d`` in eval mode; batch
  norm (``nn.BatchNorm2d``, ``nn.SyncBatchNorm``, mmengine's ``_BatchNormXd`` that
  ``revert_sync_batchnorm`` builds) in eval mode *with* running statistics
  (``track_running_stats=False`` normalises with the batch's own statistics);
* windows: ``nn.Conv2d`` (padding mode zeros, reflect or replicate, not circular),
  ``nn.MaxPool2d`` without indices, ``nn.AvgPool2d``, the 2-D zero/constant/reflection/
  replication pads (no negative padding), and the CANN ``CANNMaxPool2d``/``CANNAvgPool2d``;
* containers running their children one after another on one tensor: ``nn.Sequential``
  and subclasses keeping its ``forward`` and ``__iter__`` (mmengine's ``Sequential``,
  mmseg's ``ResLayer``), mmcv's ``ConvModule`` and ``DepthwiseSeparableConvModule``,
  mmseg's ``InvertedResidual`` and Fast-SCNN's ``LearningToDownsample``.

A padding that depends on the input height cannot be reproduced on a strip. SAME pooling
(``'same'``, ``'same_upper'``, ``'same_lower'``: ONNX ``auto_pad``) pads
``total // 2`` rows on top (SAME_LOWER: ``total - total // 2``) with
``total = max(d*(k-1) - (H - 1) mod s, 0)``: row-local, with that padding, only where
it is the same for every height (stride 1; kernel 3 stride 2 lower; kernel 2
stride 2 upper).
``nn.Conv2d(padding='same')`` (stride 1 only in PyTorch) pads ``d*(k-1) // 2`` rows on
top for every height: row-local. Everything else -- subclasses overriding ``forward``
(mmcv's ``Conv2dAdaptivePadding`` pads inside it), unknown classes, global pooling,
attention, group/layer norm, upsampling -- is not, and its children are examined
instead. A module with hooks is never inside a larger stage (it can be a stage of its
own: its hooks then see its whole input and output once), and a stage whose first layer
works in place on the stage's input is not split (overlapping strips would apply it
twice, and the caller's tensor would change differently).

Used by the lean prediction path (:mod:`mmseg_cann.fusion`) around the backbone, neck
and decode head. Inside :func:`strip_execution` every call of a stage decides afresh
(hooks registered, ``train()``, attributes edited after entering the block all count):
the stage runs whole unless its input is one CPU floating-point ``(N, C, H, W)``
tensor, gradients are off, no global module hook is registered, nothing traces or
compiles the call (``torch.compile``/``torch.export``, FX, ``torch.jit.trace``, a
Python dispatch mode), it is still row-local, and its widest activation is estimated
above :data:`STRIP_ACTIVATION_BYTES`.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import sys
import threading
import types
import weakref
from typing import Callable, Dict, Iterator, List, Optional, Tuple

import torch
from torch import nn

from .core.geometry import same_padding
from .utils.module_hooks import global_hooks_registered, has_hooks

#: A stage is split into strips when its widest activation would exceed this.
STRIP_ACTIVATION_BYTES = 8 * 2**20

#: Per-element activations of torch (any mode).
ACTIVATIONS = (nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.PReLU, nn.ELU, nn.CELU, nn.SELU, nn.GELU,
               nn.SiLU, nn.Mish, nn.Hardswish, nn.Hardsigmoid, nn.Hardtanh, nn.Sigmoid,
               nn.Tanh, nn.Softplus)
_PADS = (nn.ZeroPad2d, nn.ConstantPad2d, nn.ReflectionPad2d, nn.ReplicationPad2d)

#: (rows a window spans beyond its first, rows of padding above, vertical stride)
Rows = Tuple[int, int, int]


@dataclasses.dataclass(frozen=True)
class _Rule:
    """What an exactly known class does. ``kind``: ``'identity'``, ``'pointwise'``,
    ``'dropout'``, ``'norm'``, ``'window'`` (``rows(m)``: its :data:`Rows`, None when
    its settings are not row-local) or ``'container'`` (``calls(m)``: the children in
    the order its ``forward`` calls them, repeats included)."""
    forward: Callable
    kind: str
    rows: Optional[Callable[[nn.Module], Optional[Rows]]] = None
    calls: Optional[Callable[[nn.Module], List[nn.Module]]] = None


def _pair(v) -> tuple:
    return (v, v) if isinstance(v, int) else tuple(v)


def _window(kernel, stride, dilation, top) -> Optional[Rows]:
    """:data:`Rows` from the vertical settings (None unless plain ints in range)."""
    try:
        k, s, d, p = (_pair(v)[0] for v in (kernel, stride, dilation, top))
    except (TypeError, IndexError):
        return None
    if not all(type(v) is int for v in (k, s, d, p)) or min(k, s, d) < 1 or p < 0:
        return None
    return d * (k - 1), p, s


def _conv_rows(conv: nn.Conv2d) -> Optional[Rows]:
    """``nn.Conv2d.forward`` pads by ``padding`` (mode zeros) or by
    ``_reversed_padding_repeated_twice`` through ``F.pad`` (other modes); for
    ``padding='same'`` PyTorch pads ``d*(k-1) // 2`` on top, whatever the height."""
    if conv.padding_mode in ('reflect', 'replicate'):
        top = conv._reversed_padding_repeated_twice[2]
    elif conv.padding_mode != 'zeros':
        return None  # circular: the top rows read the bottom ones
    elif conv.padding == 'valid':
        top = 0
    elif conv.padding == 'same':
        if any(s != 1 for s in _pair(conv.stride)):
            return None  # PyTorch raises; the whole call does
        top = _pair(conv.dilation)[0] * (_pair(conv.kernel_size)[0] - 1) // 2
    else:
        top = conv.padding
    return _window(conv.kernel_size, conv.stride, conv.dilation, top)


def _pool_rows(pool: nn.Module) -> Optional[Rows]:
    """Max/average pooling: torch's, and the CANN modules whose ``padding`` also takes
    the ONNX ``auto_pad`` strings."""
    if getattr(pool, 'return_indices', False):
        return None  # indices are flat positions in the whole plane
    kernel, padding = pool.kernel_size, pool.padding
    stride = pool.stride if pool.stride not in (None, (), []) else kernel
    dilation = getattr(pool, 'dilation', 1)
    if not isinstance(padding, str):
        return _window(kernel, stride, dilation, padding)
    padding = padding.lower()
    if type(pool) in (nn.MaxPool2d, nn.AvgPool2d) or padding not in (
            'valid', 'same', 'same_upper', 'same_lower'):
        return None  # rejected when it runs
    rows = _window(kernel, stride, dilation, 0)
    if rows is None or padding == 'valid':
        return rows
    span, _, s = rows
    # SAME's top padding for every height (it depends on the height modulo the stride)
    tops = {same_padding(h, span + 1, s, 1, padding == 'same_lower')[0]
            for h in range(1, s + 1)}
    return (span, tops.pop(), s) if len(tops) == 1 else None


def _pad_rows(pad: nn.Module) -> Optional[Rows]:
    padding = _pair(pad.padding) * 2 if isinstance(pad.padding, int) else tuple(pad.padding)
    if len(padding) != 4 or not all(type(p) is int and p >= 0 for p in padding):
        return None  # negative padding crops
    return 0, padding[2], 1


def _registered_children(module: nn.Module) -> List[nn.Module]:
    """``nn.Sequential.forward``: every registered child in order."""
    return list(module._modules.values())


def _conv_module_calls(m: nn.Module) -> List[nn.Module]:
    """mmcv ``ConvModule.forward(x)``: conv (after the explicit padding layer), norm
    and activation in ``order``, each where present."""
    calls = []
    for layer in m.order:
        if layer == 'conv':
            calls += [m.padding_layer, m.conv] if m.with_explicit_padding else [m.conv]
        elif layer == 'norm' and m.with_norm:
            calls.append(m.norm)
        elif layer == 'act' and m.with_activation:
            calls.append(m.activate)
    return calls


def _attributes(*names: str) -> Callable[[nn.Module], List[nn.Module]]:
    return lambda m: [getattr(m, name) for name in names]


def _torch_rules() -> Dict[type, _Rule]:
    rules: Dict[type, _Rule] = {}
    kinds = [((nn.Identity,), 'identity', None, None), (ACTIVATIONS, 'pointwise', None, None),
             ((nn.Dropout, nn.Dropout2d), 'dropout', None, None),
             ((nn.BatchNorm2d, nn.SyncBatchNorm), 'norm', None, None),
             ((nn.Conv2d,), 'window', _conv_rows, None),
             ((nn.MaxPool2d, nn.AvgPool2d), 'window', _pool_rows, None),
             (_PADS, 'window', _pad_rows, None),
             ((nn.Sequential,), 'container', None, _registered_children)]
    for classes, kind, rows, calls in kinds:
        for cls in classes:
            rules[cls] = _Rule(cls.forward, kind, rows, calls)
    return rules


#: Known classes of other packages by defining module and name: (kind, rows, calls).
#: Found in ``sys.modules`` when an instance is met -- an instance exists only once its
#: class is loaded -- so nothing is imported here: the CANN pooling modules live in a
#: layer above this one, and plain-torch models never load mmcv or mmseg.
_NAMED = {
    ('mmengine.model.utils', '_BatchNormXd'): ('norm', None, None),
    ('mmcv.cnn.bricks.hsigmoid', 'HSigmoid'): ('pointwise', None, None),
    ('mmcv.cnn.bricks.hswish', 'HSwish'): ('pointwise', None, None),
    ('mmcv.cnn.bricks.swish', 'Swish'): ('pointwise', None, None),
    ('mmcv.cnn.bricks.conv_module', 'ConvModule'): ('container', None, _conv_module_calls),
    ('mmcv.cnn.bricks.depthwise_separable_conv_module', 'DepthwiseSeparableConvModule'):
        ('container', None, _attributes('depthwise_conv', 'pointwise_conv')),
    ('mmseg.models.utils.inverted_residual', 'InvertedResidual'):
        ('container', None, _attributes('conv')),
    ('mmseg.models.backbones.fast_scnn', 'LearningToDownsample'):
        ('container', None, _attributes('conv', 'dsconv1', 'dsconv2')),
    ('mmseg_cann.models.pooling', 'CANNMaxPool2d'): ('window', _pool_rows, None),
    ('mmseg_cann.models.pooling', 'CANNAvgPool2d'): ('window', _pool_rows, None),
}
_RULES = _torch_rules()


def _rule(cls: type) -> Optional[_Rule]:
    """The rule of exactly ``cls`` (None: not known to be row-local)."""
    if cls.__call__ is not nn.Module.__call__ or cls._call_impl is not nn.Module._call_impl:
        return None
    rule = _RULES.get(cls)
    if rule is None:
        named = _NAMED.get((cls.__module__, cls.__qualname__))
        if named is not None and getattr(sys.modules.get(cls.__module__), cls.__qualname__,
                                         None) is cls:
            # the forward it has when first met is the one known from then on
            rule = _RULES.setdefault(cls, _Rule(cls.forward, *named))
        elif issubclass(cls, nn.Sequential) and cls.__iter__ is nn.Sequential.__iter__:
            rule = _RULES[nn.Sequential]  # if it keeps Sequential's forward (below)
    if rule is None or cls.forward is not rule.forward:
        return None
    return rule


def is_strip_patch(module: nn.Module, forward) -> bool:
    """``forward`` is :func:`strip_execution`'s patch of ``module``."""
    return isinstance(forward, types.MethodType) and forward.__self__ is module \
        and forward.__func__ is _forward_in_strips


def _known(module: nn.Module) -> Optional[_Rule]:
    """``module``'s rule if its class is exactly known and it runs that class's forward
    (an instance ``forward`` is allowed only as the strip patch, or as its own class's
    ``forward`` bound to it: what an unpickled patched stage holds)."""
    own = module.__dict__.get('forward')
    if own is not None and not is_strip_patch(module, own) and not (
            isinstance(own, types.MethodType) and own.__self__ is module
            and own.__func__ is type(module).forward):
        return None
    return _rule(type(module))


def _row_local(module: nn.Module, inside: bool) -> bool:
    if inside and has_hooks(module):
        return False  # its hooks would see partial tensors, once per strip
    rule = _known(module)
    if rule is None:
        return False
    if rule.kind == 'dropout':
        return not module.training
    if rule.kind == 'norm':
        return not module.training and module.running_mean is not None \
            and module.running_var is not None
    if rule.kind == 'window':
        return rule.rows(module) is not None
    if rule.kind == 'container':
        calls = rule.calls(module)
        return bool(calls) and all(_row_local(c, True) for c in calls)
    return True


def is_row_local(module: nn.Module) -> bool:
    """Whether ``module`` maps one NCHW tensor to one, each output row depending on a
    band of input rows at a fixed offset, as far as its exactly known class tells (see
    the module doc). Hooks on ``module`` itself do not count (they see its whole input
    and output); hooks on any module inside it do."""
    return _row_local(module, False)


def _windows(module: nn.Module) -> Iterator[Tuple[nn.Module, Rows]]:
    """The window layers of a row-local module in the order they run, repeats included."""
    rule = _known(module)
    if rule.kind == 'window':
        yield module, rule.rows(module)
    elif rule.kind == 'container':
        for child in rule.calls(module):
            yield from _windows(child)


def _geometry(module: nn.Module) -> Tuple[int, int]:
    stride, extent, above = 1, 0, 0
    for _, (span, top, s) in _windows(module):
        extent += span * stride
        above += top * stride
        stride *= s
    return stride, stride * math.ceil(max(above, extent - above) / stride)


def row_geometry(module: nn.Module) -> Tuple[int, int]:
    """(total vertical stride ``S``, halo) of a row-local module.

    Output row ``j`` reads input rows ``j*S - P`` to ``j*S - P + E``, with ``P`` the
    padding above and ``E`` the receptive field's extent, both summed over the window
    layers (in the order they run) at their input stride. A strip widened by
    ``max(P, E - P)`` rows on each side (rounded up to a multiple of ``S``, so strips
    stay on the whole tensor's sampling grid) computes the rows it keeps from real input.

    Raises:
        ValueError: ``module`` is not row-local (:func:`is_row_local`).
    """
    if not is_row_local(module):
        raise ValueError(f'module must be row-local (mmseg_cann.strips.is_row_local), got '
                         f'{type(module).__name__}')
    return _geometry(module)


def _first_op_in_place(module: nn.Module) -> Optional[bool]:
    """Whether a row-local module's first operation changes its input in place (None:
    it hands its input on as it is, as identity and eval-mode dropout do)."""
    rule = _known(module)
    if rule.kind in ('identity', 'dropout'):
        return None
    if rule.kind == 'pointwise':
        return bool(getattr(module, 'inplace', False))
    if rule.kind == 'container':
        for child in rule.calls(module):
            first = _first_op_in_place(child)
            if first is not None:
                return first
        return None
    return False


def _widest_bytes(module: nn.Module, x: torch.Tensor) -> int:
    """An estimate of the largest activation a row-local ``module`` makes from ``x``:
    the outputs of its convolutions and pooling layers (bytes)."""
    n, channels, h, w = x.shape
    area, widest = h * w, 0
    for layer, (_, _, stride) in _windows(module):
        if not isinstance(layer, _PADS):
            stride_w = _pair(layer.stride or layer.kernel_size)[-1]
            area = math.ceil(area / (stride * stride_w))
            channels = getattr(layer, 'out_channels', channels)
            widest = max(widest, channels * area)
    return n * widest * x.element_size()


def run_in_strips(fn, x: torch.Tensor, strips: int, stride: int, halo: int) -> torch.Tensor:
    """``fn(x)`` computed on about ``strips`` horizontal strips of ``x``, for a row-local
    ``fn`` of vertical ``stride`` and ``halo`` (:func:`row_geometry`).

    Each strip starts on a multiple of ``stride`` and reaches ``halo`` rows beyond the
    rows it keeps; the last one reaches up far enough to hold ``2 * halo`` rows more than
    a strip's share (a short remainder could be too small for the stage's windows).
    """
    height = x.shape[2]
    step = stride * max(1, math.ceil(height / strips / stride))
    if strips < 2 or step >= height:
        return fn(x)
    pieces: List[torch.Tensor] = []
    for start in range(0, height, step):
        end = min(start + step, height)
        lo = start - halo
        if end == height:
            lo = min(lo, (height - 2 * halo - step) // stride * stride)
        lo, hi = max(lo, 0), min(end + halo, height)
        out = fn(x[:, :, lo:hi])
        top = (start - lo) // stride
        pieces.append(out[:, :, top:] if end == height
                      else out[:, :, top:top + (end - start) // stride])
    return torch.cat(pieces, dim=2)


def _tracing() -> bool:
    """Something records the call (a compiler, exporter or tracer would keep the strips
    in its graph, for this input's height only)."""
    return (torch.compiler.is_compiling() or torch.jit.is_tracing()
            or getattr(torch.fx._symbolic_trace, '_is_fx_tracing_flag', False)
            or torch._C._len_torch_dispatch_stack() > 0)


def _strip_plan(stage: nn.Module, args, kwargs) -> Optional[Tuple[int, int, int]]:
    """(strips, stride, halo) when this call of ``stage`` runs in strips, else None."""
    if len(args) != 1 or kwargs:
        return None
    x = args[0]
    if type(x) is not torch.Tensor or x.dim() != 4 or x.device.type != 'cpu' \
            or x.layout is not torch.strided or not x.is_floating_point() \
            or torch.is_grad_enabled() or global_hooks_registered() or not is_row_local(stage) \
            or _first_op_in_place(stage):
        return None
    strips = math.ceil(_widest_bytes(stage, x) / STRIP_ACTIVATION_BYTES)
    return (strips,) + _geometry(stage) if strips > 1 else None


#: stages patched by live :func:`strip_execution` blocks -> how many blocks hold each
_ACTIVE: 'weakref.WeakKeyDictionary[nn.Module, int]' = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def _forward_in_strips(self, *args, **kwargs):
    """A patched stage's ``forward``: its class's ``forward``, in strips when this call
    allows it (see the module doc)."""
    forward = type(self).forward
    if _tracing():
        return forward(self, *args, **kwargs)
    if self not in _ACTIVE:
        # a copy of a patched stage (deepcopy inside the block): not split, unpatched
        if is_strip_patch(self, self.__dict__.get('forward')):
            del self.__dict__['forward']
        return forward(self, *args, **kwargs)
    plan = _strip_plan(self, args, kwargs)
    if plan is None:
        return forward(self, *args, **kwargs)
    return run_in_strips(functools.partial(forward, self), args[0], *plan)


# pickle saves a bound method as ``getattr(its module, __name__)``: a stage pickled inside
# the block loads with its class's forward
_forward_in_strips.__name__ = 'forward'


def row_local_stages(root: nn.Module) -> Iterator[nn.Module]:
    """The outermost row-local modules under ``root`` (``root`` itself if it is one),
    each once."""
    seen = set()

    def walk(module):
        if id(module) not in seen:
            seen.add(id(module))
            if is_row_local(module):
                yield module
            else:
                for child in module.children():
                    yield from walk(child)
    return walk(root)


@contextlib.contextmanager
def strip_execution(root: nn.Module):
    """Within the block, the outermost row-local stages under ``root`` run in strips
    when a call allows it (see the module doc); restored on exit. Blocks nest (a stage
    stays patched until the last block holding it exits) and may run in several
    threads. Yields the list of the block's stages."""
    stages: List[nn.Module] = []
    try:
        with _LOCK:
            for module in root.modules():
                if module not in _ACTIVE and is_strip_patch(module, module.__dict__.get('forward')):
                    del module.__dict__['forward']  # copied from a patched stage
            for stage in row_local_stages(root):
                if stage not in _ACTIVE:
                    stage.__dict__['forward'] = types.MethodType(_forward_in_strips, stage)
                _ACTIVE[stage] = _ACTIVE.get(stage, 0) + 1
                stages.append(stage)
        yield stages
    finally:
        with _LOCK:
            for stage in stages:
                held = _ACTIVE.pop(stage, 1) - 1
                if held:
                    _ACTIVE[stage] = held
                elif is_strip_patch(stage, stage.__dict__.get('forward')):
                    del stage.__dict__['forward']
