"""Helpers shared by the Triton kernels and their launchers (never a kernel file's
private names: kernel files import from here).

Device rules (docs/design.md 2.3): a 1-D grid no larger than the device's core count
with a loop inside, int32 offsets and index loads; tensors addressed through their
strides, with the flat element order following the output's layout (NCHW or
channels_last) so that stores are contiguous.
"""
from __future__ import annotations

import triton
import triton.language as tl

from mmseg_cann.core.validation import is_channels_last as channels_last

from . import interpreter_compat

interpreter_compat.apply()
BLOCK = 256


@triton.jit
def decompose(e, C, H, W, CL: tl.constexpr):
    if CL:
        c = e % C
        t = e // C
        x = t % W
        t = t // W
        y = t % H
        n = t // H
    else:
        x = e % W
        t = e // W
        y = t % H
        t = t // H
        c = t % C
        n = t // C
    return n, c, y, x



def grid_size(total: int, device) -> int:
    """Programs of the 1-D grid: enough to cover ``total`` elements, at most one per core."""
    import torch
    if device.type == 'cuda':
        cores = torch.cuda.get_device_properties(device).multi_processor_count
    elif device.type == 'npu':  # vector cores of the Ascend AI core (triton-ascend)
        cores = getattr(torch.npu.get_device_properties(device), 'vector_core_num', 40)
    else:  # the interpreter on CPU: a few programs exercise the loop
        cores = 4
    return max(1, min(triton.cdiv(total, BLOCK), cores, 65535))


def loop(total: int, device):
    """``(grid, nprog, iters)``: each program handles blocks ``it * nprog + pid``."""
    nprog = grid_size(total, device)
    return (nprog,), nprog, triton.cdiv(total, nprog * BLOCK)


def taps(taps, device):
    import torch
    i0, i1, w0, w1 = taps
    return (i0.to(device, torch.int32), i1.to(device, torch.int32),
            w0.to(device, torch.float32), w1.to(device, torch.float32))


def output_like(x, out_hw, dtype=None):
    """An empty ``(N, C, *out_hw)`` tensor in ``x``'s layout (channels_last stays)."""
    import torch
    fmt = torch.channels_last if channels_last(x) else torch.contiguous_format
    return torch.empty((x.shape[0], x.shape[1]) + tuple(out_hw), dtype=dtype or x.dtype,
                       device=x.device, memory_format=fmt)
