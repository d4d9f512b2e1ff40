"""The ``'polyphase'`` method of ``resize_conv2d``: each output phase is a convolution of
the edge-replicated low-resolution input with the kernel
``V[o, i, rh, rw] = sum_{kh, kw} w[o, i, kh, kw] Gh[kh, rh] Gw[kw, rw]``, which covers only
the low-resolution taps that phase reads; phases with the same footprint are computed by
one convolution (output channels ``(o, phase)``). Cheaper than mixing first for few input
channels. The kernels are derived from ``weight`` at every call (a few products per
weight entry), so an in-place change of the weight, through ``.data`` too, is always
seen."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ...core.resize_taps import PhaseAxis
from .phases import phase_matrix, replicated_window, run_phases


def phase_kernels(w: torch.Tensor, ah: PhaseAxis, aw: PhaseAxis) -> list:
    """Per phase group ``(gh, gw)``, the kernel ``(C_out * phases, C_in, Th, Tw)``
    (output channels ordered ``(o, a, b)``): ``[(gh, gw, kernel), ...]``."""
    cout, cin = w.shape[:2]
    # (o, kh*kw, i): one batched product per group gives (o, a, b, rh, rw, i)
    wt = w.reshape(cout, cin, ah.k * aw.k).transpose(1, 2)
    kernels = []
    for gh in ah.groups:
        for gw in aw.groups:
            t = torch.tensor(phase_matrix(ah, aw, gh, gw), dtype=w.dtype, device=w.device)
            th, tw = gh[3] - gh[2] + 1, gw[3] - gw[2] + 1
            v = torch.matmul(t, wt).view(cout * (gh[1] - gh[0]) * (gw[1] - gw[0]), th, tw,
                                         cin)
            # contiguous (OIHW): oneDNN rounds less accurately with channels_last kernels
            kernels.append((gh, gw, v.permute(0, 3, 1, 2).contiguous()))
    return kernels


def polyphase_phases(x: torch.Tensor, w: torch.Tensor, b, ah: PhaseAxis,
                     aw: PhaseAxis) -> list:
    """The phase convolutions of the edge-replicated ``x``: ``[(gh, gw, (0, C_out), y),
    ...]`` with ``y`` of shape ``(N, C_out * phases, blocks_h, blocks_w)``, channels
    ``(o, a, b)`` (exact away from the zero padding)."""
    result = []
    for gh, gw, v in phase_kernels(w, ah, aw):
        (q0, q1, lo, hi), (p0, p1, lo2, hi2) = gh, gw
        xs = replicated_window(x, ah, aw, lo, hi - lo + 1, lo2, hi2 - lo2 + 1)
        bias = None if b is None else b.repeat_interleave((q1 - q0) * (p1 - p0))
        result.append((gh, gw, (0, w.shape[0]), F.conv2d(xs, v, bias)))
    return result


def polyphase(x: torch.Tensor, w: torch.Tensor, b, ah: PhaseAxis,
              aw: PhaseAxis) -> torch.Tensor:
    """``conv2d(upsample(x), w, b)`` by the polyphase method (phases, then borders)."""
    return run_phases(x, w, b, ah, aw, polyphase_phases)
