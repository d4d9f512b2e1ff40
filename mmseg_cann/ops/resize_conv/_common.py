"""What the methods of ``resize_conv2d`` share: whether a tracer records the op, and the
per-pixel channel mixing."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ...core.export_mode import standard_export_tracing


def tracing() -> bool:
    """Whether a tracer records the op (export, compile, jit): the methods then take
    out-of-place forms (concatenations, ``pixel_shuffle``, padded slices) that exporters
    read, instead of writing into preallocated outputs."""
    return standard_export_tracing() or torch.compiler.is_compiling() or \
        torch.jit.is_tracing() or torch.jit.is_scripting()


def pointwise_conv2d(x: torch.Tensor, w: torch.Tensor, bias=None) -> torch.Tensor:
    """``F.conv2d(x, w, bias)`` for a 1x1 ``w`` (or its ``(C_out, C_in)`` matrix). On
    contiguous CPU tensors in eager mode a batched matrix product (the same sums; on the
    development CPU a 1x1 convolution of low-resolution maps ran up to half as fast);
    traced and exported calls and other devices keep the convolution (what exporters
    and the NPU planner know). An empty batch gives an empty result of the right shape."""
    cout = w.shape[0]
    if x.device.type != 'cpu' or not x.is_contiguous() or x.shape[0] == 0 or tracing():
        return F.conv2d(x, w.reshape(cout, -1, 1, 1), bias)
    n, c, h, wd = x.shape
    # bmm of the (broadcast) weight: its result is already (N, C_out, H*W); matmul would
    # compute the transposed product and copy it back
    out = torch.bmm(w.reshape(cout, c).expand(n, -1, -1), x.view(n, c, h * wd))
    if bias is not None:
        out = out.add_(bias.view(1, -1, 1))
    return out.view(n, cout, h, wd)
