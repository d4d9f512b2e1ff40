"""``upsample``: ``F.interpolate`` for 4-D input, with a precision setting and backends."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import backends
from ..backends import auto, native
from ..core.precision import normalize_precision, run_with_precision
from ..core import geometry as geo
from ..core.export_mode import standard_export_tracing
from ..core.validation import (adaptive_mean_only, check_adaptive_input, check_input,
                               check_tensor, native_only_upsample, upsample_dtypes)
from ..utils import record_fallback
from . import direct

#: modes PyTorch takes for 4-D input that only its own op computes (no CANN kernel):
#: they run ``F.interpolate`` itself, counted as a fallback
TORCH_ONLY_MODES = ('lanczos',)


def upsample(input: torch.Tensor, size=None, scale_factor=None, mode: str = 'nearest',
             align_corners=None, recompute_scale_factor=None, antialias: bool = False, *,
             precision=None, backend: str = 'auto') -> torch.Tensor:
    """Resize a batch of feature maps exactly as ``F.interpolate`` does.

    Args:
        input: ``(N, C, H, W)`` tensor, empty only in the batch dimension (``'area'``
            also takes empty channels): floating, or ``uint8`` for every mode but
            ``'area'``, as PyTorch's CPU kernels. uint8 bilinear/bicubic runs PyTorch's
            own kernel whatever the backend (its fixed-point arithmetic is the
            contract), a counted fallback where another backend was asked for.
            Contiguous, non-contiguous and channels_last inputs are accepted;
            channels_last in gives channels_last out. Input of another rank (and
            ``mode='lanczos'``) runs ``F.interpolate`` itself, counted as a fallback.
        size: output ``(H_out, W_out)`` or an int for both.
        scale_factor: multiplier(s) for the spatial size; output is ``floor(in * s)``.
            The source coordinates are then mapped with ``1 / scale_factor`` (PyTorch's
            rule), unless ``recompute_scale_factor=True``, which maps with ``in / out``.
            Exactly one of ``size`` and ``scale_factor`` is given.
        mode: ``'nearest'`` (legacy PyTorch index ``floor(d * scale)``),
            ``'nearest-exact'`` (``floor((d + 0.5) * scale)``), ``'bilinear'``,
            ``'bicubic'`` (Keys, a = -0.75) or ``'area'`` (adaptive average pooling).
        align_corners: for bilinear/bicubic only (None means False).
        recompute_scale_factor: see ``scale_factor``; not allowed with ``size``.
        antialias: antialiasing filter for bilinear/bicubic downsampling.
        precision: compute dtype (``'fp32'``, ``'fp16'``, ``'bf16'``, ``'input'`` or a
            torch dtype); None defers to the precision policy's ``upsample`` entry.
            The result has the dtype PyTorch would return.
        backend: a registered backend name (``'auto'``, ``'native'``, ``'fast'``,
            ``'reference'``, ``'npu'``, ``'tuned'``, ``'triton'``, ...; see
            :mod:`mmseg_cann.backends`).

    Returns:
        ``(N, C, H_out, W_out)`` tensor.

    Raises:
        TypeError, ValueError: for invalid arguments, before any kernel runs; each also
            of PyTorch's type for the same call (:mod:`mmseg_cann.core.errors`).
    """
    out = direct.run_cached(direct.upsample, (size, scale_factor, mode, align_corners,
                                              recompute_scale_factor, antialias, precision,
                                              backend), input)
    if out is not None:
        return out
    check_tensor(input, 'upsample')
    if torch.jit.is_tracing() and not standard_export_tracing():
        # jit.trace records a size as a traced value only through F.interpolate's own
        # call; our checks would fix the traced size (PyTorch checks the arguments).
        # torch.onnx.export's TorchScript tracer keeps the exporter-safe forms.
        return _torch_interpolate(input, size, scale_factor, mode, align_corners,
                                  recompute_scale_factor, antialias,
                                  'torch.jit.trace records F.interpolate (sizes stay traced)')
    if input.dim() != 4 or mode in TORCH_ONLY_MODES:
        normalize_precision(precision)
        backends.check_backend(backend)
        return _torch_interpolate(input, size, scale_factor, mode, align_corners,
                                  recompute_scale_factor, antialias)
    args = geo.check_upsample_args(size, scale_factor, mode, align_corners,
                                   recompute_scale_factor, antialias)
    normalize_precision(precision)
    impl = backends.get_backend(backend)
    if args.mode == 'area':  # adaptive average pooling, with its input rules
        spec = geo.upsample_spec(input.shape[-2:], args)
        if adaptive_mean_only(input, spec.out_size):
            return _torch_interpolate(input, size, scale_factor, mode, align_corners,
                                      recompute_scale_factor, antialias)
        check_adaptive_input(input, spec.out_size, 'upsample')
    else:
        check_input(input, 'upsample', ranks=(4,), dtypes=upsample_dtypes(args.mode),
                    kernel=f'upsample_{args.mode.replace("-", "_")}2d')
        spec = geo.upsample_spec(input.shape[-2:], args)
    if native_only_upsample(input.dtype, args.mode):
        impl = _native_for_uint8(impl, input, backend)
    return run_with_precision(
        'upsample', precision, input, lambda x: impl.upsample(x, spec),
        probe_key=f'upsample-{args.mode}-{args.antialias}',
        probe=lambda t: F.interpolate(t, size=(2, 2), mode=args.mode,
                                      align_corners=args.align_corners))


def _torch_interpolate(input, size, scale_factor, mode, align_corners,
                       recompute_scale_factor, antialias, reason=None) -> torch.Tensor:
    """``F.interpolate`` itself, for calls outside the kernels' domain (PyTorch checks
    the arguments and raises its own errors), counted as a fallback with ``reason``."""
    result = F.interpolate(input, size, scale_factor, mode, align_corners,
                           recompute_scale_factor, antialias)
    record_fallback('upsample', reason or (
        f'{input.dim()}-D {input.dtype} input of shape {tuple(input.shape)} with '
        f"mode={mode!r} is outside the kernels' domain; F.interpolate ran"))
    return result


def _native_for_uint8(impl, input: torch.Tensor, backend: str):
    """The native backend for uint8 bilinear/bicubic, recorded as a fallback when the
    chosen backend would not have run it natively."""
    resolved = auto.select(input) if impl is auto else impl
    if getattr(resolved, 'upsample', None) is not native.upsample:
        record_fallback('upsample', f"uint8 bilinear/bicubic is PyTorch's own fixed-point "
                                    f"arithmetic; backend={backend!r} runs the native op")
    return native
