"""Put the CANN modules into an existing model without editing its code.

:func:`convert_model` replaces, in place, ``nn.Upsample``, mmseg's ``Upsample``,
``nn.MaxPool2d``, ``nn.AvgPool2d`` and ``nn.AdaptiveAvgPool2d`` with the CANN modules
carrying the same settings, and routes mmseg's functional ``resize()`` through
:func:`mmseg_cann.ops.upsample`. Parameters and ``state_dict`` keys are untouched (the
CANN modules hold no state), so checkpoints load into converted and unconverted models
alike.

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
from typing import Dict, List, Mapping, Optional, Tuple

from torch import nn

from .backends import OPS, check_backend
from .models import CANNAdaptiveAvgPool2d, CANNAvgPool2d, CANNMaxPool2d, CANNUpsample
from .fusion import apply_fusion
from .models.registry import CANN_MODULES
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
    """What :func:`convert_model` replaced, by module path and by type."""

    replaced: List[Tuple[str, str, str]] = dataclasses.field(default_factory=list)
    #: (path, type, reason): modules kept because their settings have no CANN module
    kept: List[Tuple[str, str, str]] = dataclasses.field(default_factory=list)
    resize_modules: List[str] = dataclasses.field(default_factory=list)
    fusion: object = None  # mmseg_cann.fusion.FusionReport when an option asked for it

    @property
    def counts(self) -> Dict[str, int]:
        return dict(Counter(f'{old} -> {new}' for _, old, new in self.replaced))

    def __str__(self) -> str:
        lines = [f'mmseg_cann conversion: {len(self.replaced)} module(s) replaced, '
                 f'resize routed in {len(self.resize_modules)} mmseg module(s)']
        for kind, count in sorted(self.counts.items()):
            lines.append(f'  {count:4d} x {kind}')
        for path, old, new in self.replaced:
            lines.append(f'    {path or "<root>"}: {old} -> {new}')
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


def _replacement(module: nn.Module, upsample_on: bool, pooling_on: bool,
                 pool_precision, upsample_precision, backend: str = 'auto'
                 ) -> Optional[nn.Module]:
    if isinstance(module, CANN_MODULES):
        return None
    mmseg_upsample = _mmseg_upsample_type()
    if upsample_on and mmseg_upsample is not None and type(module) is mmseg_upsample:
        # mmseg's Upsample computes a size first: floor(in * scale), mapped with in/out
        if module.size:
            return CANNUpsample(size=module.size, mode=module.mode,
                                align_corners=module.align_corners,
                                precision=upsample_precision, backend=backend)
        return CANNUpsample(scale_factor=module.scale_factor, mode=module.mode,
                            align_corners=module.align_corners, recompute_scale_factor=True,
                            precision=upsample_precision, backend=backend)
    if upsample_on and isinstance(module, nn.Upsample):
        return CANNUpsample(size=module.size, scale_factor=module.scale_factor,
                            mode=module.mode, align_corners=module.align_corners,
                            recompute_scale_factor=module.recompute_scale_factor,
                            precision=upsample_precision, backend=backend)
    if not pooling_on:
        return None
    if isinstance(module, nn.MaxPool2d):
        return CANNMaxPool2d(module.kernel_size, module.stride, module.padding, module.dilation,
                             module.return_indices, module.ceil_mode,
                             precision=_pool_precision_entry(pool_precision, 'max'),
                             backend=backend)
    if isinstance(module, nn.AvgPool2d):
        return CANNAvgPool2d(module.kernel_size, module.stride, module.padding,
                             module.ceil_mode, module.count_include_pad,
                             module.divisor_override,
                             precision=_pool_precision_entry(pool_precision, 'avg'),
                             backend=backend)
    if isinstance(module, nn.AdaptiveAvgPool2d):
        return CANNAdaptiveAvgPool2d(module.output_size,
                                     precision=_pool_precision_entry(pool_precision, 'avg'),
                                     backend=backend)
    return None


def convert_model(model: nn.Module, *, upsample: bool = True, pooling: bool = True,
                  resize: bool = True, pool_precision: Optional[Mapping[str, PrecisionLike]] = None,
                  upsample_precision: PrecisionLike = None, logger=None,
                  fuse_upsample_add: bool = False, lean_predict: bool = False,
                  backend: str = 'auto') -> nn.Module:
    """Replace upsample/pool modules with CANN modules in place; returns ``model``.

    Args:
        model: any ``nn.Module``, also wrapped in DDP or ``MMDistributedDataParallel``.
        upsample: replace ``nn.Upsample`` and mmseg's ``Upsample`` (which keeps its
            size-first semantics as ``recompute_scale_factor=True``).
        pooling: replace ``nn.MaxPool2d``, ``nn.AvgPool2d``, ``nn.AdaptiveAvgPool2d``.
        resize: route mmseg's functional ``resize()`` through mmseg_cann (process-wide,
            see the module docstring; undo with :func:`restore_resize`).
        pool_precision: ``dict(max=..., avg=...)`` given to the new pooling modules as
            their ``precision`` (None: they follow the precision policy).
        upsample_precision: ``precision`` of the new upsample modules.
        logger: an mmengine logger for the report (default: the current MMLogger).
        fuse_upsample_add: use :func:`mmseg_cann.ops.upsample_add` in the top-down paths
            of mmseg's FPN neck and UPerHead (per instance; :mod:`mmseg_cann.fusion`).
        lean_predict: a ``predict`` taking labels with :func:`mmseg_cann.ops.upsample_argmax`
            without full-resolution logits (``seg_logits_low`` instead of ``seg_logits``;
            :mod:`mmseg_cann.fusion`). Undo both with :func:`mmseg_cann.fusion.unfuse_model`.
        backend: the ``backend`` of every CANN module built (``'auto'``, ``'fast'``, ...;
            :mod:`mmseg_cann.backends`). Routed ``resize()`` calls keep ``'auto'``.

    The report (``ConversionReport``) is logged and kept as ``model.cann_conversion_report``.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f'model must be an nn.Module, got {type(model).__name__}')
    for key in ('max', 'avg'):  # validated before any module changes
        _pool_precision_entry(pool_precision, key)
    normalize_precision(upsample_precision, 'upsample_precision')
    for op in OPS:
        check_backend(backend, op)
    inner = unwrap_model(model)
    report = ConversionReport()
    for path, module in list(inner.named_modules()):
        for child_name, child in list(module.named_children()):
            full = f'{path}.{child_name}' if path else child_name
            try:
                new = _replacement(child, upsample, pooling, pool_precision,
                                   upsample_precision, backend)
            except (TypeError, ValueError) as exc:
                # settings PyTorch accepts when building a module but no CANN module takes
                # (PyTorch would fail when it runs): keep the module as it is
                report.kept.append((full, type(child).__name__, str(exc)))
                continue
            if new is None:
                continue
            new.train(child.training)
            setattr(module, child_name, new)
            report.replaced.append((full, type(child).__name__, type(new).__name__))
    if resize:
        report.resize_modules = route_resize()
    report.fusion = apply_fusion(inner, fuse_upsample_add, lean_predict)
    inner.cann_conversion_report = report
    _log(str(report), logger)
    return model


def _log(message: str, logger=None) -> None:
    from mmengine.logging import print_log
    print_log(message, logger=logger if logger is not None else 'current')
