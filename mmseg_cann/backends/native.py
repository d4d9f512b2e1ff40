"""Native backend: PyTorch's own ops on the tensor's device.

On CPU and CUDA these are PyTorch's kernels; on an Ascend NPU, torch_npu routes the same
aten ops to the CANN ``aclnn*`` kernels. Arguments reach PyTorch exactly as the user
gave them (size or scale factor, ``recompute_scale_factor``), so the scale rule is
PyTorch's own. What PyTorch's pooling ops cannot express directly (asymmetric SAME
padding, padding above half the kernel) is done with an explicit pad.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F

from ..core import geometry as geo
from ..core.validation import is_channels_last
from ..core.taps import pool_divisors, pool_first_taps
from ..utils import record_fallback

_HALF_DTYPES = (torch.float16, torch.bfloat16)


def upsample(input: torch.Tensor, spec: geo.UpsampleSpec) -> torch.Tensor:
    """``F.interpolate`` with the user's arguments."""
    args = spec.args
    if args.antialias and input.device.type == 'cpu' and input.dtype in _HALF_DTYPES:
        # PyTorch has no fp16/bf16 antialiasing kernel on CPU.
        record_fallback('upsample', f'antialias has no CPU {input.dtype} kernel in PyTorch; '
                                    'computing in float32')
        return upsample(input.float(), spec).to(input.dtype)
    if _cpu_antialias_width_one_defect(input, spec):
        # PyTorch's NCHW CPU antialias kernel returns wrong values when the output width
        # is 1 and the height changes. The filter is separable, so resize the transposed
        # plane (output height 1 is handled right) and transpose back.
        record_fallback('upsample', "antialias with output width 1 is wrong in PyTorch's "
                                    'NCHW CPU kernel; resizing the transposed plane')
        swap = (lambda pair: None if pair is None else (pair[1], pair[0]))
        out = F.interpolate(input.transpose(-1, -2), size=swap(args.size),
                            scale_factor=swap(args.scale_factor), mode=args.mode,
                            align_corners=args.align_corners,
                            recompute_scale_factor=args.recompute_scale_factor, antialias=True)
        return out.transpose(-1, -2).contiguous()
    return F.interpolate(input, size=args.size, scale_factor=args.scale_factor,
                         mode=args.mode, align_corners=args.align_corners,
                         recompute_scale_factor=args.recompute_scale_factor,
                         antialias=args.antialias)


def _cpu_antialias_width_one_defect(input: torch.Tensor, spec: geo.UpsampleSpec) -> bool:
    # floating inputs only: PyTorch's uint8 antialias kernel is right (NCHW and
    # channels_last agree), and its rounding is the contract there
    return (spec.antialias and input.device.type == 'cpu' and spec.out_size[1] == 1
            and input.dtype.is_floating_point
            and spec.out_size[0] not in (1, spec.in_size[0])
            and not is_channels_last(input))  # PyTorch's channels_last kernel is right


def _pad_value(dtype: torch.dtype) -> float:
    if dtype.is_floating_point:
        return -math.inf
    return torch.iinfo(dtype).min


def _explicit_pad(input: torch.Tensor, spec: geo.PoolSpec, value: float) -> torch.Tensor:
    (top, left), (bottom, right) = spec.pad_begin, spec.pad_end
    return F.pad(input, (left, right, top, bottom), value=value)


def max_pool2d(input: torch.Tensor, spec: geo.PoolSpec, return_indices: bool = False):
    """``F.max_pool2d``; asymmetric (SAME) padding through an explicit ``-inf`` pad."""
    args = spec.args
    if spec.torch_padding_ok:
        return F.max_pool2d(input, args.kernel, args.stride, spec.pad_begin, args.dilation,
                            args.ceil_mode, return_indices)
    padded = _explicit_pad(input, spec, _pad_value(input.dtype))
    result = F.max_pool2d(padded, args.kernel, args.stride, 0, args.dilation, False,
                          return_indices)
    if not return_indices:
        return result
    values, padded_index = result
    return values, _unpad_indices(values, padded_index, spec)


def _unpad_indices(values: torch.Tensor, padded_index: torch.Tensor,
                   spec: geo.PoolSpec) -> torch.Tensor:
    """Map flat indices into the padded plane back to the input plane.

    Padded cells hold the lowest value, so they never win against an input cell; a
    window whose input cells are all the lowest value (``-inf``) takes PyTorch's
    default index, the window's first in-bounds tap.

    Only real indices are mapped: int32/int64 tensors of the output's shape (int32 from
    torch_npu's ``aclnnMaxPool2dWithIndices``). Anything else, such as the int8 mask of
    ``aclnnMaxPool2dWithMask`` (shape ``(N, C, kh*kw, (ceil(oh*ow/16)+1)*32)``), is
    returned unchanged for the caller to recognise (the NPU executor recomputes
    PyTorch's indices on the CPU then).
    """
    if padded_index.dtype not in (torch.int32, torch.int64) or \
            padded_index.shape != values.shape:
        return padded_index
    padded_index = padded_index.long()
    (h, w), (top, left) = spec.in_size, spec.pad_begin
    padded_w = w + left + spec.pad_end[1]
    rows = torch.div(padded_index, padded_w, rounding_mode='floor') - top
    cols = padded_index % padded_w - left
    index = rows * w + cols
    in_pad = (rows < 0) | (rows >= h) | (cols < 0) | (cols >= w)
    if bool(in_pad.any()):
        first_rows, first_cols = (torch.tensor(t, device=index.device)
                                  for t in pool_first_taps(spec))
        default = first_rows[:, None] * w + first_cols[None, :]
        index = torch.where(in_pad, default.expand_as(index), index)
    return index


def avg_pool2d(input: torch.Tensor, spec: geo.PoolSpec, count_include_pad: bool = True,
               divisor_override: Optional[int] = None) -> torch.Tensor:
    """``F.avg_pool2d``; SAME padding with ONNX semantics through an explicit zero pad."""
    args = spec.args
    if spec.torch_padding_ok:
        return F.avg_pool2d(input, args.kernel, args.stride, spec.pad_begin, args.ceil_mode,
                            count_include_pad, divisor_override)
    padded = _explicit_pad(input, spec, 0.0)
    if divisor_override is not None or count_include_pad:
        # every SAME window lies inside the padded input: the divisor is k*k or the override
        return F.avg_pool2d(padded, args.kernel, args.stride, 0, False, True, divisor_override)
    # exclude padded cells: window sums divided by the number of input cells per window
    sums = F.avg_pool2d(padded.float() if padded.dtype in _HALF_DTYPES else padded,
                        args.kernel, args.stride, 0, False, True, 1)
    counts = [torch.tensor(t, dtype=sums.dtype, device=sums.device)
              for t in pool_divisors(spec, False)]
    divisor = counts[0][:, None] * counts[1][None, :]
    if not sums.dtype.is_floating_point:  # int64: PyTorch's truncating integer division
        return torch.div(sums, divisor, rounding_mode='trunc')
    return (sums / divisor).to(input.dtype)


def adaptive_avg_pool2d(input: torch.Tensor, output_size) -> torch.Tensor:
    """``F.adaptive_avg_pool2d``."""
    return F.adaptive_avg_pool2d(input, output_size)


def upsample_add(input: torch.Tensor, other: torch.Tensor,
                 spec: geo.UpsampleSpec) -> torch.Tensor:
    """The unfused ``other + upsample(input)`` (differentiable)."""
    return other + upsample(input, spec)


def upsample_argmax(logits: torch.Tensor, spec: geo.UpsampleSpec) -> torch.Tensor:
    """The unfused ``upsample(logits).argmax(1)`` (materialises full-size logits)."""
    return upsample(logits, spec).argmax(1)
