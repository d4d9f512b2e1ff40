"""``upsample``: ``F.interpolate`` for 4-D input, with a precision setting and backends."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import backends
from ..core.precision import normalize_precision, run_with_precision
from ..core import geometry as geo
from ..core.validation import check_input
from . import direct


def upsample(input: torch.Tensor, size=None, scale_factor=None, mode: str = 'nearest',
             align_corners=None, recompute_scale_factor=None, antialias: bool = False, *,
             precision=None, backend: str = 'auto') -> torch.Tensor:
    """Resize a batch of feature maps exactly as ``F.interpolate`` does.

    Args:
        input: ``(N, C, H, W)`` floating tensor (``uint8`` is accepted by the nearest
            modes, as in PyTorch). Contiguous, non-contiguous and channels_last inputs
            are accepted; channels_last in gives channels_last out.
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
        TypeError, ValueError: for invalid arguments, before any kernel runs.
    """
    out = direct.run_cached(direct.upsample, (size, scale_factor, mode, align_corners,
                                              recompute_scale_factor, antialias, precision,
                                              backend), input)
    if out is not None:
        return out
    check_input(input, 'upsample', ranks=(4,), integer_dtypes=(torch.uint8,))
    args = geo.check_upsample_args(size, scale_factor, mode, align_corners,
                                   recompute_scale_factor, antialias)
    if input.dtype == torch.uint8 and args.mode not in geo.NEAREST_MODES:
        raise TypeError(f'upsample: integer (uint8) input is only accepted by the nearest '
                        f'modes {geo.NEAREST_MODES}, not mode={args.mode!r}; cast it to a '
                        f'floating dtype first')
    normalize_precision(precision)
    impl = backends.get_backend(backend)
    spec = geo.upsample_spec(input.shape[-2:], args)
    return run_with_precision(
        'upsample', precision, input, lambda x: impl.upsample(x, spec),
        probe_key=f'upsample-{args.mode}-{args.antialias}',
        probe=lambda t: F.interpolate(t, size=(2, 2), mode=args.mode,
                                      align_corners=args.align_corners))
