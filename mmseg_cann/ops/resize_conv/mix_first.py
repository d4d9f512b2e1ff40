"""The ``'mix_first'`` method of ``resize_conv2d``: the channel mixing commutes with the
interpolation and with the convolution's spatial shifts (both act on each channel
alone), so each tap's ``C_out x C_in`` matrix is applied to the low-resolution input first
(one product giving ``kH * kW * C_out`` maps, at ``1 / (s_h * s_w)`` of the direct
convolution's cost), then each channel's phases are one convolution of its ``kH * kW``
maps with the fixed kernel ``V[(qh, qw), (kh, kw), rh, rw] = Gh[kh, rh] Gw[kw, rw]``
(interpolation weights only: the same for every channel, independent of ``w``)."""
from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch
import torch.nn.functional as F

from ...core.resize_taps import PhaseAxis
from ._common import pointwise_conv2d, tracing
from .phases import phase_matrix, replicated_window, run_phases


@lru_cache(maxsize=128)
def mix_first_matrix(ah: PhaseAxis, aw: PhaseAxis) -> np.ndarray:
    """``V[(a, b), (kh, kw), rh, rw]``: the coefficient of mixed map ``(kh, kw)`` at
    low-resolution offset ``(rh, rw)`` (from the union footprint's ``lo``) in output
    phase ``(a, b)`` (float64; products of the exact per-axis weights)."""
    (gh,), (gw,) = ah.groups, aw.groups
    t = phase_matrix(ah, aw, gh, gw)  # ((a, b, rh, rw), (kh, kw))
    (_, th), (_, tw) = ah.span, aw.span
    v = t.reshape(ah.s * aw.s, th, tw, ah.k * aw.k).transpose(0, 3, 1, 2).copy()
    v.setflags(write=False)
    return v


def mix_first_phases(x: torch.Tensor, w: torch.Tensor, b, ah: PhaseAxis,
                     aw: PhaseAxis) -> list:
    """The output phases by mixing channels first: ``z[(o, kh, kw)] = w[o, :, kh, kw] ·
    x_r`` on the edge-replicated low-resolution window ``x_r`` (the bias in the first
    tap's maps: every phase weighs each map's values with interpolation weights that sum
    to one), then per channel ``o`` one convolution of its ``kH * kW`` maps with the
    fixed kernel ``V`` (:func:`mix_first_matrix`), giving its ``s_h * s_w`` phases.
    Eagerly, output channels go in chunks so that the mixed maps of one chunk are no
    larger than its output. ``[(gh, gw, (c0, c1), y), ...]`` as
    :func:`~.polyphase.polyphase_phases`."""
    (gh,), (gw,) = ah.groups, aw.groups
    (lo, th), (lo2, tw) = ah.span, aw.span
    xs = replicated_window(x, ah, aw, lo, th, lo2, tw)
    n, cin, hp, wp = xs.shape
    cout, kk, phases = w.shape[0], ah.k * aw.k, ah.s * aw.s
    v = torch.tensor(mix_first_matrix(ah, aw), dtype=x.dtype, device=x.device)
    # rows (o, kh, kw) of the mixing matrix
    w_mix = w.reshape(cout, cin, kk).transpose(1, 2).reshape(cout * kk, cin)
    traced = tracing()
    if not traced:
        xs = xs.contiguous()
    chunks = 1 if traced else max(1, min(cout, -(-kk * hp * wp // (
        phases * ah.blocks * aw.blocks))))
    step = -(-cout // chunks)
    result = []
    for c0 in range(0, cout, step):
        c1 = min(cout, c0 + step)
        rows = w_mix[c0 * kk:c1 * kk]
        if b is None:
            z = pointwise_conv2d(xs, rows)
        elif traced or x.device.type != 'cpu':
            z = pointwise_conv2d(xs, rows, F.pad(b[c0:c1].view(-1, 1), (0, kk - 1)).flatten())
        else:
            z = pointwise_conv2d(xs, rows)
            z.view(n, c1 - c0, kk, hp * wp)[:, :, 0].add_(b[c0:c1].view(1, -1, 1))
        y = F.conv2d(z.reshape(n * (c1 - c0), kk, hp, wp), v)
        result.append((gh, gw, (c0, c1), y.reshape(n, (c1 - c0) * phases, ah.blocks,
                                                   aw.blocks)))
    return result


def mix_first(x: torch.Tensor, w: torch.Tensor, b, ah: PhaseAxis,
              aw: PhaseAxis) -> torch.Tensor:
    """``conv2d(upsample(x), w, b)`` by the mix-first method (phases, then borders)."""
    return run_phases(x, w, b, ah, aw, mix_first_phases)
