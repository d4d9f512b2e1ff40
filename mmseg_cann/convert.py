"""Put the CANN modules into an existing model without editing its code.

:func:`convert_model` replaces, in place, modules whose exact class is ``nn.Upsample``,
mmseg's ``Upsample``, ``nn.MaxPool2d``, ``nn.AvgPool2d`` or ``nn.AdaptiveAvgPool2d`` with
the CANN modules carrying the same settings and the module's instance state (hooks,
training flag, attributes), keeps everything else of those kinds (subclasses, patched
instances) and says why, and routes mmseg's functional ``resize()`` through
:func:`mmseg_cann.ops.upsample`. Parameters and ``state_dict`` keys are untouched, so
checkpoints load into converted and unconverted models alike.

How ``resize`` routing works
    About 35 mmseg heads, necks, backbones and segmentors do
    ``from ..utils import resize`` and call ``resize(...)`` from their own module
    globals. Routing rebinds the name ``resize`` in every loaded ``mmseg.*`` module whose
    ``resize`` is mmseg's original function to :func:`cann_resize` (same signature, same
    warning, same result), and keeps the originals. It is process-wide, like the import it
    replaces. :func:`restore_resize` puts every original back; :func:`resize_routed`
    tells whether routing is active; ``with routed_resize(): ...`` routes for a block.
"""
from __future__ import annotations

import dataclasses
import sys
import threading
from collections import Counter
from contextlib import contextmanager
from typing import Callable, Dict, List, Mapping, Optional, Tuple

import torch
from torch import nn

from .backends import OPS, check_backend
from .models import CANNAdaptiveAvgPool2d, CANNAvgPool2d, CANNMaxPool2d, CANNUpsample
from .fusion import apply_fusion, check_options as check_fusion_options
from .ops.upsample import upsample
from .core.precision import PrecisionLike, normalize_precision


# ----------------------------------------------------------------------------------
# resize routing
# ----------------------------------------------------------------------------------
def cann_resize(input, size=None, scale_factor=None, mode='nearest', align_corners=None,
                warning=True):
    """Drop-in for ``mmseg.models.utils.resize`` that runs :func:`mmseg_cann.ops.upsample`.

    Same arguments, same alignment warning, same result as mmseg's function (which calls
    ``F.interpolate`` with exactly these arguments).
    """
    from .core.geometry import any_symbolic, size_value
    symbolic = size is not None and not isinstance(size, int) and any_symbolic(
        tuple(size) + tuple(input.shape[2:]))
    if warning and not symbolic:  # (a dynamic-shape trace cannot evaluate it)
        _original_resize_warning(input, size, align_corners)
    if size is not None:
        size = tuple(size_value(s) for s in size) if not isinstance(size, int) else size
    return upsample(input, size, scale_factor, mode, align_corners)


def _original_resize_warning(input, size, align_corners) -> None:
    # mmseg's own check, typo included (it compares output_w with output_h), so that
    # routed and unrouted runs warn identically.
    import warnings
    if size is not None and align_corners:
        input_h, input_w = tuple(int(x) for x in input.shape[2:])
        output_h, output_w = tuple(int(x) for x in size)
        if output_h > input_h or output_w > output_h:
            if ((output_h > 1 and output_w > 1 and input_h > 1 and input_w > 1)
                    and (output_h - 1) % (input_h - 1) and (output_w - 1) % (input_w - 1)):
                warnings.warn(f'When align_corners={align_corners}, the output would more '
                              f'aligned if input size {(input_h, input_w)} is `x+1` and out '
                              f'size {(output_h, output_w)} is `nx+1`')


_routing_lock = threading.Lock()
_patched: Dict[str, object] = {}  # module name -> original resize


def _original_resize():
    from mmseg.models.utils import wrappers
    return _patched.get('mmseg.models.utils.wrappers', wrappers.resize)


def route_resize() -> List[str]:
    """Rebind ``resize`` in every loaded ``mmseg.*`` module; returns the module names.

    Idempotent: modules already routed are skipped (and still listed).
    """
    import mmseg.models  # noqa: F401  (load every module that imports resize)
    original = _original_resize()
    with _routing_lock:
        for name, module in list(sys.modules.items()):
            if not name.startswith('mmseg.') or module is None:
                continue
            if getattr(module, 'resize', None) is original:
                _patched[name] = original
                module.resize = cann_resize
        return sorted(_patched)


def restore_resize() -> List[str]:
    """Undo :func:`route_resize`: put mmseg's ``resize`` back; returns the module names."""
    with _routing_lock:
        restored = sorted(_patched)
        for name, original in _patched.items():
            module = sys.modules.get(name)
            if module is not None and getattr(module, 'resize', None) is cann_resize:
                module.resize = original
        _patched.clear()
        return restored


def resize_routed() -> bool:
    """Whether mmseg's ``resize`` currently runs through mmseg_cann."""
    return bool(_patched)


@contextmanager
def routed_resize():
    """Route ``resize`` inside a ``with`` block, restoring the previous state after."""
    was_routed = resize_routed()
    route_resize()
    try:
        yield
    finally:
        if not was_routed:
            restore_resize()

# ----------------------------------------------------------------------------------
# module replacement
# ----------------------------------------------------------------------------------
@dataclasses.dataclass
class ConversionReport:
    """What one :func:`convert_model` call did, by module path.

    A module placed at several paths (shared) is listed once, under the path
    ``model.named_modules()`` gives it.
    """

    #: (path, old type, new type): modules replaced by CANN modules
    replaced: List[Tuple[str, str, str]] = dataclasses.field(default_factory=list)
    #: (path, type, reason): modules of the converted kinds left as they are
    kept: List[Tuple[str, str, str]] = dataclasses.field(default_factory=list)
    resize_modules: List[str] = dataclasses.field(default_factory=list)
    fusion: object = None  # mmseg_cann.fusion.FusionReport when an option asked for it
    #: (path, type, changes): CANN modules already in the model given the settings asked for
    updated: List[Tuple[str, str, str]] = dataclasses.field(default_factory=list)

    @property
    def counts(self) -> Dict[str, int]:
        return dict(Counter(f'{old} -> {new}' for _, old, new in self.replaced))

    def __str__(self) -> str:
        head = f'mmseg_cann conversion: {len(self.replaced)} module(s) replaced'
        if self.updated:
            head += f', {len(self.updated)} updated'
        if self.kept:
            head += f', {len(self.kept)} kept'
        lines = [head + f', resize routed in {len(self.resize_modules)} mmseg module(s)']
        for kind, count in sorted(self.counts.items()):
            lines.append(f'  {count:4d} x {kind}')
        for path, old, new in self.replaced:
            lines.append(f'    {path or "<root>"}: {old} -> {new}')
        for path, kind, changes in self.updated:
            lines.append(f'    {path or "<root>"}: {kind} updated ({changes})')
        for path, old, reason in self.kept:
            lines.append(f'    {path or "<root>"}: {old} kept ({reason})')
        if self.fusion is not None and str(self.fusion):
            lines.append(str(self.fusion))
        return '\n'.join(lines)


def _mmseg_upsample_type():
    try:
        from mmseg.models.utils import Upsample
    except ImportError:  # pragma: no cover - mmseg is a dependency
        return None
    return Upsample


def unwrap_model(model: nn.Module) -> nn.Module:
    """The model inside DDP / mmengine wrappers (anything with a ``module`` attribute
    that is a wrapper class of torch or mmengine)."""
    from mmengine.model import is_model_wrapper
    while is_model_wrapper(model):
        model = model.module
    return model


def _pool_precision_entry(pool_precision, key):
    if pool_precision is None:
        return None
    if not isinstance(pool_precision, Mapping):
        raise TypeError(f"pool_precision must be a dict like dict(max='fp16', avg='fp32'), "
                        f'got {pool_precision!r}')
    unknown = set(pool_precision) - {'max', 'avg'}
    if unknown:
        raise ValueError(f"pool_precision accepts the keys 'max' and 'avg', got {sorted(unknown)}")
    value = pool_precision.get(key)
    normalize_precision(value, f'pool_precision[{key!r}]')
    return value


# Builders: the CANN module with the settings of a module of a converted class.
def _from_torch_upsample(module, precision, backend):
    return CANNUpsample(size=module.size, scale_factor=module.scale_factor, mode=module.mode,
                        align_corners=module.align_corners,
                        recompute_scale_factor=module.recompute_scale_factor,
                        precision=precision, backend=backend)


def _from_mmseg_upsample(module, precision, backend):
    # mmseg's Upsample computes a size first: floor(in * scale), mapped with in/out
    if module.size:
        return CANNUpsample(size=module.size, mode=module.mode,
                            align_corners=module.align_corners, precision=precision,
                            backend=backend)
    return CANNUpsample(scale_factor=module.scale_factor, mode=module.mode,
                        align_corners=module.align_corners, recompute_scale_factor=True,
                        precision=precision, backend=backend)


def _no_padding_string(module):
    # torch's pools take no padding strings (they raise when run); the CANN modules read
    # them as ONNX auto_pad, so converting would change an error into a result
    if isinstance(module.padding, str):
        raise ValueError(f'padding={module.padding!r} is an error in {type(module).__name__}; '
                         f'the CANN module would read it as ONNX auto_pad')


def _from_max_pool(module, precision, backend):
    _no_padding_string(module)
    return CANNMaxPool2d(module.kernel_size, module.stride, module.padding, module.dilation,
                         module.return_indices, module.ceil_mode, precision=precision,
                         backend=backend)


def _from_avg_pool(module, precision, backend):
    _no_padding_string(module)
    return CANNAvgPool2d(module.kernel_size, module.stride, module.padding, module.ceil_mode,
                         module.count_include_pad, module.divisor_override,
                         precision=precision, backend=backend)


def _from_adaptive_avg_pool(module, precision, backend):
    return CANNAdaptiveAvgPool2d(module.output_size, precision=precision, backend=backend)


def _converted_classes() -> Dict[type, Tuple[str, type, Callable]]:
    """Exact class -> (family, CANN class, builder) for every class the converter replaces.

    Only these exact classes are replaced. ``nn.UpsamplingNearest2d`` and
    ``nn.UpsamplingBilinear2d`` only fix ``nn.Upsample``'s settings in ``__init__`` (same
    ``forward``, no other method), so they convert like ``nn.Upsample``.
    """
    table = {
        nn.Upsample: ('upsample', CANNUpsample, _from_torch_upsample),
        nn.UpsamplingNearest2d: ('upsample', CANNUpsample, _from_torch_upsample),
        nn.UpsamplingBilinear2d: ('upsample', CANNUpsample, _from_torch_upsample),
        nn.MaxPool2d: ('max', CANNMaxPool2d, _from_max_pool),
        nn.AvgPool2d: ('avg', CANNAvgPool2d, _from_avg_pool),
        nn.AdaptiveAvgPool2d: ('avg', CANNAdaptiveAvgPool2d, _from_adaptive_avg_pool),
    }
    mmseg_upsample = _mmseg_upsample_type()
    if mmseg_upsample is not None:
        table[mmseg_upsample] = ('upsample', CANNUpsample, _from_mmseg_upsample)
    return table


#: the CANN modules, by exact class: their family (which option and precision apply)
_CANN_FAMILIES = {CANNUpsample: 'upsample', CANNMaxPool2d: 'max', CANNAvgPool2d: 'avg',
                  CANNAdaptiveAvgPool2d: 'avg'}
#: what every nn.Module holds in its __dict__ (hooks, training flag, parameters, ...)
_MODULE_STATE = frozenset(nn.Module().__dict__)
#: torch's wrapper of hooks that are called with their module (held by weak reference)
_WrappedHook = getattr(torch.nn.modules.module, '_WrappedHook', None)


def _class_name(cls: type) -> str:
    if cls.__module__.startswith('torch.nn.'):
        return f'nn.{cls.__name__}'
    if cls.__module__.startswith('mmseg.'):
        return f"mmseg's {cls.__name__}"
    return cls.__name__


def _nearest_known(module: nn.Module, converted) -> Optional[type]:
    """The first class of ``type(module)``'s MRO that is converted or a CANN module."""
    for cls in type(module).__mro__:
        if cls in converted or cls in _CANN_FAMILIES:
            return cls
    return None


def _kept_reason(module: nn.Module, known: type, methods_of: Tuple[type, ...]
                 ) -> Optional[str]:
    """Why ``module`` (whose nearest known class is ``known``) is not converted, or None.

    ``methods_of``: the classes whose methods must not be replaced on the instance.
    """
    cls = type(module)
    if cls is not known:
        if cls.forward is not known.forward:
            return f'subclass of {_class_name(known)} that overrides forward'
        return f'subclass of {_class_name(known)}; only the exact known classes are converted'
    for key, value in module.__dict__.items():
        # a method replaced on the instance (forward, or _call_impl via Module.compile)
        if callable(value) and any(hasattr(c, key) for c in methods_of):
            if key == '_compiled_call_impl':
                return 'compiled in place (Module.compile)'
            return f'{key} is set on the instance'
    return None


def _take_state(new: nn.Module, old: nn.Module) -> None:
    """Give ``new`` the instance state of ``old``: the very hook dictionaries (so hooks
    keep running and their handles still remove them), the training flag, parameters,
    buffers and submodules registered on it, and any other attribute set on it. The
    settings ``new`` was built with (and the CANN-only ones) stay ``new``'s."""
    own = set(new.__dict__) - _MODULE_STATE
    for key, value in old.__dict__.items():
        if key not in own:
            new.__dict__[key] = value
    # hooks registered "with module" (load_state_dict pre-hooks) hold a weak reference to
    # their module: the entries now point to the replacement (same ids: handles work)
    for key in _MODULE_STATE:
        hooks = new.__dict__.get(key)
        if not isinstance(hooks, dict):
            continue
        for hook_id, hook in list(hooks.items()):
            if (_WrappedHook is not None and isinstance(hook, _WrappedHook)
                    and hook.with_module and hook.module() is old):
                hooks[hook_id] = _WrappedHook(hook.hook, new)


def _same_precision(current, wanted) -> bool:
    if current is None:  # None defers to the policy: not the same as any explicit value
        return False
    try:
        return normalize_precision(current) == normalize_precision(wanted)
    except (TypeError, ValueError):
        return False


def _update(module: nn.Module, precision, backend) -> str:
    """Apply the settings given (None: not given) to a CANN module; the changes made."""
    changes = []
    if backend is not None and module.backend != backend:
        changes.append(('backend', module.backend, backend))
    if precision is not None and not _same_precision(module.precision, precision):
        changes.append(('precision', module.precision, precision))
    for name, _, value in changes:
        setattr(module, name, value)
    return ', '.join(f'{name} {old!r} -> {new!r}' for name, old, new in changes)


class _Converter:
    """One conversion: decides per module object (once, so shared modules stay shared)."""

    def __init__(self, upsample: bool, pooling: bool, pool_precision, upsample_precision,
                 backend: Optional[str]) -> None:
        self.enabled = {'upsample': upsample, 'max': pooling, 'avg': pooling}
        self.precision = {'upsample': upsample_precision,
                          'max': _pool_precision_entry(pool_precision, 'max'),
                          'avg': _pool_precision_entry(pool_precision, 'avg')}
        self.backend = backend
        self.converted = _converted_classes()
        self.report = ConversionReport()
        # id(module) -> (module, what takes its place); holding the module keeps its id
        self.done: Dict[int, Tuple[nn.Module, nn.Module]] = {}

    def run(self, model: nn.Module) -> None:
        """Convert ``model``'s tree, in ``named_modules()`` order."""
        self.convert(model, '', replaceable=False)
        self._visit(model, '', {id(model)})

    def _visit(self, parent: nn.Module, path: str, visited: set) -> None:
        for name, child in list(parent._modules.items()):
            if child is None:
                continue
            full = f'{path}.{name}' if path else name
            if id(child) not in self.done:
                self.done[id(child)] = (child, self.convert(child, full))
            new = self.done[id(child)][1]
            if new is not child:
                setattr(parent, name, new)
            if id(new) not in visited:
                visited.add(id(new))
                self._visit(new, full, visited)

    def convert(self, module: nn.Module, path: str, replaceable: bool = True) -> nn.Module:
        """The module to put in ``module``'s place (``module`` itself when unchanged)."""
        known = _nearest_known(module, self.converted)
        if known is None:
            return module
        if known in _CANN_FAMILIES:
            # its own (private) attributes may hold callables: check the torch class's
            family, build = _CANN_FAMILIES[known], None
            methods_of = tuple(c for c in known.__mro__ if c in self.converted)[:1]
        else:
            family, target, build = self.converted[known]
            methods_of = (known, target)
        if not self.enabled[family]:
            return module
        kind = type(module).__name__
        reason = _kept_reason(module, known, methods_of)
        if reason is None and build is not None and not replaceable:
            reason = 'the model itself: convert a module that holds it'
        if reason is not None:
            self.report.kept.append((path, kind, reason))
            return module
        if build is None:  # a CANN module already: apply the settings asked for
            changes = _update(module, self.precision[family], self.backend)
            if changes:
                self.report.updated.append((path, kind, changes))
            return module
        try:
            new = build(module, self.precision[family], self.backend or 'auto')
        except (TypeError, ValueError) as exc:
            # settings PyTorch accepts when building a module but no CANN module takes
            # (PyTorch would fail when it runs): keep the module as it is
            self.report.kept.append((path, kind, str(exc)))
            return module
        _take_state(new, module)
        self.report.replaced.append((path, kind, type(new).__name__))
        return new


def convert_model(model: nn.Module, *, upsample: bool = True, pooling: bool = True,
                  resize: bool = True, pool_precision: Optional[Mapping[str, PrecisionLike]] = None,
                  upsample_precision: PrecisionLike = None, logger=None,
                  fuse_upsample_add: bool = False, lean_predict: bool = False,
                  backend: Optional[str] = None, fuse_resize_conv: bool = False) -> nn.Module:
    """Replace upsample/pool modules with CANN modules in place; returns ``model``.

    Only modules whose exact class is ``nn.Upsample`` (or ``nn.UpsamplingNearest2d`` /
    ``nn.UpsamplingBilinear2d``), mmseg's ``Upsample``, ``nn.MaxPool2d``, ``nn.AvgPool2d``
    or ``nn.AdaptiveAvgPool2d`` are replaced, and only when no method (``forward``, ...)
    is set on the instance. Subclasses and patched instances are kept and listed in the
    report with the reason. A replacement takes over the module's hooks (their handles
    keep working), training flag, registered parameters/buffers/submodules and other
    instance attributes; a module shared by several parents gets one replacement.

    Args:
        model: any ``nn.Module``, also wrapped in DDP or ``MMDistributedDataParallel``.
        upsample: replace ``nn.Upsample`` and mmseg's ``Upsample`` (which keeps its
            size-first semantics as ``recompute_scale_factor=True``).
        pooling: replace ``nn.MaxPool2d``, ``nn.AvgPool2d``, ``nn.AdaptiveAvgPool2d``.
        resize: route mmseg's functional ``resize()`` through mmseg_cann (process-wide,
            see the module docstring; undo with :func:`restore_resize`).
        pool_precision: ``dict(max=..., avg=...)`` given to the new pooling modules as
            their ``precision`` (None or a missing key: they follow the precision policy).
        upsample_precision: ``precision`` of the new upsample modules.
        logger: an mmengine logger for the report (default: the current MMLogger).
        fuse_upsample_add: use :func:`mmseg_cann.ops.upsample_add` in the top-down paths
            of mmseg's FPN neck and UPerHead (per instance; :mod:`mmseg_cann.fusion`).
        lean_predict: a ``predict`` taking labels with :func:`mmseg_cann.ops.upsample_argmax`
            without full-resolution logits (``seg_logits_low`` instead of ``seg_logits``;
            :mod:`mmseg_cann.fusion`).
        fuse_resize_conv: run the per-pixel linear layer that follows a resize (SegFormer's
            ``fusion_conv``, ...) at each input's own resolution (per instance; the sites
            rewritten and skipped are in the report; :mod:`mmseg_cann.fusion.resize_conv`).
            Undo the fusions with :func:`mmseg_cann.fusion.unfuse_model`.
        backend: the ``backend`` of every CANN module built (``'auto'``, ``'fast'``, ...;
            :mod:`mmseg_cann.backends`; None: ``'auto'``). Routed ``resize()`` calls keep
            ``'auto'``.

    CANN modules already in the model (of the exact CANN classes) get the ``backend``
    and precisions that are given (not None); what is not given stays as it is, so
    converting again changes nothing unless asked. The report (``ConversionReport``:
    replaced, updated, kept) is logged and kept as ``model.cann_conversion_report``.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f'model must be an nn.Module, got {type(model).__name__}')
    for key in ('max', 'avg'):  # validated before any module changes
        _pool_precision_entry(pool_precision, key)
    normalize_precision(upsample_precision, 'upsample_precision')
    check_fusion_options(fuse_upsample_add=fuse_upsample_add, lean_predict=lean_predict,
                         fuse_resize_conv=fuse_resize_conv)
    if backend is not None:
        for op in OPS:
            check_backend(backend, op)
    inner = unwrap_model(model)
    converter = _Converter(upsample, pooling, pool_precision, upsample_precision, backend)
    converter.run(inner)
    report = converter.report
    if resize:
        report.resize_modules = route_resize()
    report.fusion = apply_fusion(inner, fuse_upsample_add, lean_predict, fuse_resize_conv)
    inner.cann_conversion_report = report
    _log(str(report), logger)
    return model


def _log(message: str, logger=None) -> None:
    from mmengine.logging import print_log
    print_log(message, logger=logger if logger is not None else 'current')
