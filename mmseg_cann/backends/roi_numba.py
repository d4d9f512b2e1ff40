"""numba CPU kernels of ROI pooling (:mod:`.roi_cpu` launches them).

Bins come precomputed and clipped (:func:`mmseg_cann.core.roi.roi_bins`). The arithmetic
is that of the reference kernels, so results are bit for bit theirs:

* max: each bin is scanned row by row from ``MAX_START`` (-FLT_MAX) with index -1, a
  value replaces the running maximum only when strictly greater (torchvision's CPU
  kernel: the first maximum wins, NaN never wins); an empty bin is 0 with index -1;
* avg: each bin is summed row by row from 0 in the compute dtype, then divided by its
  row count and then by its column count (``sum / kh / kw``, PyTorch's NCHW adaptive
  average pooling kernel); an empty bin is 0;
* backward: per channel, ROI after ROI, bin after bin in row-major order (torchvision's
  order for max: the same float sums).

The forward kernels read the input as NHWC so that the inner loop runs over channels
(independent accumulators, vectorised), each bin still summed in its own order; one
ROI per parallel iteration. The backward kernels run a block of channels per parallel
iteration on NCHW gradients (no two threads write the same cell).
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange


#: side of the tiles of :func:`to_nhwc`
TILE = 16


@njit(parallel=True, cache=True)
def to_nhwc(x, out):
    """``out[n, h, w, c] = x[n, c, h, w]`` in tiles of channels x columns (a blocked
    transpose, parallel over rows)."""
    n, channels, height, width = x.shape
    for nh in prange(n * height):
        b = nh // height
        r = nh % height
        for c0 in range(0, channels, TILE):
            c1 = min(channels, c0 + TILE)
            for w0 in range(0, width, TILE):
                w1 = min(width, w0 + TILE)
                for c in range(c0, c1):
                    for w in range(w0, w1):
                        out[b, r, w, c] = x[b, c, r, w]


@njit(parallel=True, cache=True)
def max_forward(x, batch, hs, he, ws, we, start, out, index, with_index):
    """``out[k, c, i, j]`` (and, ``with_index``, the flat ``index`` into H*W) of NHWC
    ``x``; the scan without indices is a separate loop (it vectorises better)."""
    n_roi = batch.shape[0]
    width = x.shape[2]
    channels = x.shape[3]
    out_h = hs.shape[1]
    out_w = ws.shape[1]
    for k in prange(n_roi):
        b = batch[k]
        best = np.empty(channels, dtype=x.dtype)
        where = np.empty(channels, dtype=np.int32)
        for i in range(out_h):
            for j in range(out_w):
                h0, h1, w0, w1 = hs[k, i], he[k, i], ws[k, j], we[k, j]
                best[:] = start
                where[:] = -1
                for h in range(h0, h1):
                    for w in range(w0, w1):
                        row = x[b, h, w]
                        if with_index:
                            flat = np.int32(h * width + w)
                            for c in range(channels):
                                v = row[c]
                                kept = best[c]
                                better = v > kept
                                best[c] = v if better else kept
                                where[c] = flat if better else where[c]
                        else:
                            for c in range(channels):
                                v = row[c]
                                kept = best[c]
                                best[c] = v if v > kept else kept
                empty = h1 <= h0 or w1 <= w0
                for c in range(channels):
                    out[k, c, i, j] = 0 if empty else best[c]
                    if with_index:
                        index[k, c, i, j] = where[c]


@njit(parallel=True, cache=True)
def avg_forward(x, batch, hs, he, ws, we, rows, cols, out):
    """``out[k, c, i, j]`` = the bin's sum / rows / columns, of NHWC ``x``; ``rows``
    (K, out_h) and ``cols`` (K, out_w) are the bins' clipped sizes in ``x``'s dtype."""
    n_roi = batch.shape[0]
    channels = x.shape[3]
    out_h = hs.shape[1]
    out_w = ws.shape[1]
    for k in prange(n_roi):
        b = batch[k]
        acc = np.empty(channels, dtype=x.dtype)
        for i in range(out_h):
            for j in range(out_w):
                h0, h1, w0, w1 = hs[k, i], he[k, i], ws[k, j], we[k, j]
                if h1 <= h0 or w1 <= w0:
                    for c in range(channels):
                        out[k, c, i, j] = 0
                    continue
                for c in range(channels):
                    acc[c] = 0
                for h in range(h0, h1):
                    w = w0
                    while w + 4 <= w1:  # four cells per pass, still added one by one
                        r0, r1, r2, r3 = x[b, h, w], x[b, h, w + 1], x[b, h, w + 2], \
                            x[b, h, w + 3]
                        for c in range(channels):
                            acc[c] = (((acc[c] + r0[c]) + r1[c]) + r2[c]) + r3[c]
                        w += 4
                    while w < w1:
                        r0 = x[b, h, w]
                        for c in range(channels):
                            acc[c] += r0[c]
                        w += 1
                kh = rows[k, i]
                kw = cols[k, j]
                for c in range(channels):
                    out[k, c, i, j] = acc[c] / kh / kw


#: channels per parallel iteration of the backward kernels (the output gradient of one
#: ROI and block is read contiguously)
CHANNEL_BLOCK = 16


@njit(parallel=True, cache=True)
def max_backward(grad_out, batch, index, grad_in):
    """``grad_in[b, c].flat[index] += grad_out`` (NCHW, zero-initialised ``grad_in``)."""
    n_roi, channels, out_h, out_w = grad_out.shape
    plane = grad_in.shape[2] * grad_in.shape[3]
    cells = out_h * out_w
    go = grad_out.reshape(-1)
    ix = index.reshape(-1)
    gi = grad_in.reshape(-1)
    for cb in prange((channels + CHANNEL_BLOCK - 1) // CHANNEL_BLOCK):
        c0 = cb * CHANNEL_BLOCK
        c1 = min(channels, c0 + CHANNEL_BLOCK)
        for k in range(n_roi):
            for c in range(c0, c1):
                src = (k * channels + c) * cells
                dst = (batch[k] * channels + c) * plane
                for t in range(cells):
                    flat = ix[src + t]
                    if flat >= 0:
                        gi[dst + flat] += go[src + t]


@njit(parallel=True, cache=True)
def avg_backward(grad_out, batch, hs, he, ws, we, rows, cols, grad_in):
    """Each bin's ``grad / rows / columns`` added to its cells (NCHW, zero-initialised;
    ``rows``/``cols`` as in :func:`avg_forward`)."""
    n_roi, channels, out_h, out_w = grad_out.shape
    for cb in prange((channels + CHANNEL_BLOCK - 1) // CHANNEL_BLOCK):
        c0 = cb * CHANNEL_BLOCK
        c1 = min(channels, c0 + CHANNEL_BLOCK)
        for k in range(n_roi):
            b = batch[k]
            for c in range(c0, c1):
                for i in range(out_h):
                    for j in range(out_w):
                        h0, h1, w0, w1 = hs[k, i], he[k, i], ws[k, j], we[k, j]
                        if h1 <= h0 or w1 <= w0:
                            continue
                        g = grad_out[k, c, i, j] / rows[k, i] / cols[k, j]
                        for h in range(h0, h1):
                            for w in range(w0, w1):
                                grad_in[b, c, h, w] += g
