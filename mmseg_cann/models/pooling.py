"""Pooling modules backed by :mod:`mmseg_cann.ops.pooling`.

Each is a subclass of the ``torch.nn`` module it replaces (same constructor, same
attributes, ``isinstance`` checks keep working), adds the padding strings where they
apply, a ``precision`` setting and a ``backend`` choice, and holds no state.
"""
from __future__ import annotations

import torch
from torch import nn

from ..backends import check_backend
from ..core import geometry as geo
from ..core.errors import ArgumentError
from ..core.precision import normalize_precision
from ..core.validation import check_divisor_override
from ..ops import direct
from ..ops.pooling import adaptive_avg_pool2d, avg_pool2d, max_pool2d
from ._direct import CANNModule


def _check_forms(check) -> None:
    """Run an argument check at construction for the argument *forms* (a wrong type, an
    unknown padding string: TypeError/ValueError). Out-of-range *values* (a zero stride,
    a zero divisor, padding above half the kernel: :class:`ArgumentError`) are errors
    when the module runs, as in PyTorch, whose modules check nothing when built."""
    try:
        check()
    except ArgumentError:
        pass


def _check_extras(precision, backend) -> None:
    normalize_precision(precision)
    check_backend(backend)


class CANNMaxPool2d(CANNModule, nn.MaxPool2d):
    """``nn.MaxPool2d`` with exact PyTorch semantics on every device.

    Args:
        kernel_size, stride, padding, dilation, return_indices, ceil_mode: as
            ``nn.MaxPool2d``; ``padding`` also takes ``'valid'``, ``'same'``,
            ``'same_upper'`` and ``'same_lower'`` (ONNX ``auto_pad``).
        precision: compute dtype (None defers to the policy's ``max`` entry).
        backend: a registered backend name (``'auto'``, ``'native'``, ``'fast'``,
            ``'reference'``, ``'npu'``, ``'tuned'``, ``'triton'``, ...; see
            :mod:`mmseg_cann.backends`).

    Shape:
        ``(N, C, H, W)`` or ``(C, H, W)`` -> ``(N, C, H_out, W_out)`` or ``(C, H_out, W_out)``.
    """

    def __init__(self, kernel_size, stride=None, padding=0, dilation=1,
                 return_indices: bool = False, ceil_mode: bool = False, *, precision=None,
                 backend: str = 'auto') -> None:
        _check_forms(lambda: geo.check_pool_args(kernel_size, stride, padding, dilation,
                                                 ceil_mode, check_padding_limit=False))
        _check_extras(precision, backend)
        super().__init__(kernel_size, stride, padding, dilation, return_indices, ceil_mode)
        self.precision = precision
        self.backend = backend

    def forward(self, input: torch.Tensor):
        args = (self.kernel_size, self.stride, self.padding, self.dilation, self.ceil_mode,
                self.return_indices, self.precision, self.backend)
        out = direct.run_cached(direct.max_pool2d, args, input)  # the op's first step
        if out is not None:
            return out
        return max_pool2d(input, *args[:6], precision=args[6], backend=args[7])

    def extra_repr(self) -> str:
        return super().extra_repr() + self._settings_repr()


class CANNAvgPool2d(CANNModule, nn.AvgPool2d):
    """``nn.AvgPool2d`` with exact PyTorch semantics on every device.

    Args:
        kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override: as
            ``nn.AvgPool2d``; ``padding`` also takes the padding strings (SAME with ONNX
            ``count_include_pad`` semantics).
        precision: compute dtype (None defers to the policy's ``avg`` entry).
        backend: a registered backend name (``'auto'``, ``'native'``, ``'fast'``,
            ``'reference'``, ``'npu'``, ``'tuned'``, ``'triton'``, ...; see
            :mod:`mmseg_cann.backends`).
    """

    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode: bool = False,
                 count_include_pad: bool = True, divisor_override=None, *, precision=None,
                 backend: str = 'auto') -> None:
        _check_forms(lambda: geo.check_pool_args(kernel_size, stride, padding, 1, ceil_mode,
                                                 check_padding_limit=False))
        _check_forms(lambda: check_divisor_override(divisor_override))
        _check_extras(precision, backend)
        super().__init__(kernel_size, stride, padding, ceil_mode, count_include_pad,
                         divisor_override)
        self.precision = precision
        self.backend = backend

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        args = (self.kernel_size, self.stride, self.padding, self.ceil_mode,
                self.count_include_pad, self.divisor_override, self.precision, self.backend)
        out = direct.run_cached(direct.avg_pool2d, args, input)  # the op's first step
        if out is not None:
            return out
        return avg_pool2d(input, *args[:6], precision=args[6], backend=args[7])

    def extra_repr(self) -> str:
        return super().extra_repr() + self._settings_repr()


class CANNAdaptiveAvgPool2d(CANNModule, nn.AdaptiveAvgPool2d):
    """``nn.AdaptiveAvgPool2d`` with exact PyTorch semantics on every device.

    Args:
        output_size: int or pair (None entries keep the input size).
        precision: compute dtype (None defers to the policy's ``avg`` entry).
        backend: a registered backend name (``'auto'``, ``'native'``, ``'fast'``,
            ``'reference'``, ``'npu'``, ``'tuned'``, ``'triton'``, ...; see
            :mod:`mmseg_cann.backends`).
    """

    def __init__(self, output_size, *, precision=None, backend: str = 'auto') -> None:
        geo.check_adaptive_output_size(output_size)
        _check_extras(precision, backend)
        super().__init__(output_size)
        self.precision = precision
        self.backend = backend

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        args = (self.output_size, self.precision, self.backend)
        out = direct.run_cached(direct.adaptive_avg_pool2d, args, input)  # the op's first step
        if out is not None:
            return out
        return adaptive_avg_pool2d(input, args[0], precision=args[1], backend=args[2])

    def extra_repr(self) -> str:
        return super().extra_repr() + self._settings_repr()
