"""``CANNUpsample``: ``nn.Upsample`` backed by :func:`mmseg_cann.ops.upsample`."""
from __future__ import annotations

import torch
from torch import nn

from ..backends import check_backend
from ..core import geometry as geo
from ..core.precision import normalize_precision
from ..ops import direct
from ..ops.upsample import upsample
from ._direct import CANNModule


class CANNUpsample(CANNModule, nn.Upsample):
    """Upsample layer with PyTorch's exact semantics on every device.

    A drop-in for ``nn.Upsample`` (same constructor and attributes; it is a subclass)
    and for mmseg's ``Upsample`` (whose size-first behaviour corresponds to
    ``recompute_scale_factor=True``). On an Ascend NPU it runs the CANN kernels.

    Args:
        size, scale_factor, mode, align_corners, recompute_scale_factor: as
            ``nn.Upsample`` / :func:`mmseg_cann.ops.upsample`.
        antialias: antialiasing for bilinear/bicubic downsampling.
        precision: compute dtype (None defers to the precision policy).
        backend: a registered backend name (``'auto'``, ``'native'``, ``'fast'``,
            ``'reference'``, ``'npu'``, ``'tuned'``, ``'triton'``, ...; see
            :mod:`mmseg_cann.backends`).

    Shape:
        ``(N, C, H, W)`` -> ``(N, C, H_out, W_out)``. Other ranks (``(N, C, W)``,
        ``(N, C, D, H, W)``) run ``nn.Upsample``'s own call, ``F.interpolate`` with these
        settings (no precision setting), counted as a fallback.
    """

    def __init__(self, size=None, scale_factor=None, mode: str = 'nearest',
                 align_corners=None, recompute_scale_factor=None, antialias: bool = False,
                 *, precision=None, backend: str = 'auto') -> None:
        args = geo.check_upsample_args(size, scale_factor, mode, align_corners,
                                       recompute_scale_factor, antialias)
        normalize_precision(precision)
        check_backend(backend)
        super().__init__(size=size, scale_factor=scale_factor, mode=mode,
                         align_corners=align_corners,
                         recompute_scale_factor=recompute_scale_factor)
        self.antialias = args.antialias
        self.precision = precision
        self.backend = backend

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        args = (self.size, self.scale_factor, self.mode, self.align_corners,
                self.recompute_scale_factor, self.antialias, self.precision, self.backend)
        out = direct.run_cached(direct.upsample, args, input)  # the op's first step
        if out is not None:
            return out
        return upsample(input, *args[:6], precision=args[6], backend=args[7])

    def extra_repr(self) -> str:
        parts = [f'size={self.size}' if self.size is not None
                 else f'scale_factor={self.scale_factor}', f'mode={self.mode!r}']
        if self.align_corners is not None:
            parts.append(f'align_corners={self.align_corners}')
        if self.recompute_scale_factor is not None:
            parts.append(f'recompute_scale_factor={self.recompute_scale_factor}')
        if self.antialias:
            parts.append('antialias=True')
        return ', '.join(parts) + self._settings_repr()
