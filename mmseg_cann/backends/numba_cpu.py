"""Parallel CPU kernels for the fused decoder ops, compiled with numba.

The fused bilinear ops spend their time moving memory, not computing: the kernels here
make one pass over the output, keep every intermediate in small per-thread buffers and
use the taps of :func:`mmseg_cann.core.taps.linear_taps` (PyTorch's float32 source
coordinates) with the arithmetic of PyTorch's compiled NCHW CPU kernel as read off
torch 2.13's AVX2 build, fused multiply-adds included::

    t0 = fma(x[y0, x0], w0, x[y0, x1] * w1)      # along W, row y0
    t1 = fma(x[y1, x0], w0, x[y1, x1] * w1)      # along W, row y1
    value = fma(t0, h0, t1 * h1)                  # along H

With it the values are bit-identical to ``F.interpolate``'s on decoder-sized outputs
(192 or more columns; ``tests/backends/test_numba_cpu.py``); on narrow outputs PyTorch's
loop contracts differently and a quarter of the values differ in the last bit (within
the rounding of two lerps, which the tests bound).

``upsample_add_into(x, other, out, ...)``
    ``out = other + upsample(x)``. Output rows are processed in chunks per channel; each
    chunk first interpolates its low-resolution rows along W into a buffer, then writes
    every output row as a lerp of two buffered rows plus the lateral, in one pass.
``upsample_argmax_into(x, out, ...)``
    labels of the upsampled logits. Chunks of output rows run in parallel; a chunk keeps
    two low-resolution rows of every class interpolated along W (``2 x C x W`` values,
    recomputed only when the rows advance); each output row between them is reduced by
    a running maximum over classes and its index (first index wins; NaN wins, as in
    ``torch.argmax``).
    Class pruning: all output pixels of one run of columns between the same two source
    rows interpolate the same four corners per class, so each value lies within the
    range of its class's corners, widened by the float32 rounding of the two lerps
    (:data:`.numba_kernels.ARGMAX_ROUNDING`). A class whose highest corner is below
    another class's lowest corner by more than twice that is never the maximum there and
    is skipped;
    runs left with one class are filled without arithmetic. The labels are those of
    evaluating every class, bit for bit (``tests/backends/test_numba_cpu.py``). Where
    the classes are close everywhere (iid random logits) the row-long loop over all
    classes runs instead, and the search is retried a few row pairs later.
    No full-resolution logits exist, ever.

The kernels take NumPy views of contiguous NCHW float32 CPU tensors (zero copy);
:func:`available` says whether numba is installed. They are compiled on first use
(about 8 s for both on 2 cores) and cached on disk by numba for later processes
(:mod:`.numba_kernels`, which holds the kernels' code).
"""
from __future__ import annotations

import os
from functools import lru_cache

import numpy as np

#: the per-chunk buffer of W-interpolated low-resolution rows stays under this many bytes
CHUNK_BUFFER_BYTES = 2 << 20


@lru_cache(maxsize=1)
def available() -> bool:
    """Whether numba can be imported (``pip install numba``; in requirements/runtime.txt)."""
    try:
        import numba  # noqa: F401
    except ImportError:
        return False
    return True


#: the process whose numba kernels started a thread pool, and that pool's threading layer
_pool = {'pid': None, 'layer': None}


def forked_after_use() -> bool:
    """Whether this process was forked from one whose numba kernels already ran on the
    GNU OpenMP threading layer: GNU OpenMP is not fork-safe, and numba then terminates
    the child at its first parallel kernel ("fork() called from a process already
    using GNU OpenMP"). The callers fall back to the torch paths there."""
    return (_pool['pid'] is not None and _pool['pid'] != os.getpid()
            and _pool['layer'] == 'omp')


def note_pool(numba) -> None:
    """Record that this process started numba's thread pool (see :func:`forked_after_use`);
    every numba kernel calls it after running."""
    if _pool['pid'] != os.getpid():
        _pool['pid'], _pool['layer'] = os.getpid(), numba.threading_layer()


def chunk_rows(h: int, H: int, bytes_per_low_row: int, n_parallel: int, threads: int) -> int:
    """Output rows per chunk: the W-interpolated low-resolution rows one chunk needs
    (about ``rows * h / H + 2``) fit in :data:`CHUNK_BUFFER_BYTES`, and there are at
    least ``4 * threads`` chunks over ``n_parallel`` images to share between threads."""
    by_memory = (CHUNK_BUFFER_BYTES / max(1, bytes_per_low_row) - 2) * H / max(1, h)
    by_balance = -(-n_parallel * H // (4 * max(1, threads))) // max(1, n_parallel)
    return int(max(1, min(H, by_memory, max(1, by_balance))))


@lru_cache(maxsize=1)
def _kernels():
    """``(numba, upsample_add_into, upsample_argmax_into)``; compiles or loads the kernels."""
    import numba

    from . import numba_kernels
    return numba, numba_kernels.upsample_add_into, numba_kernels.upsample_argmax_into


def column_taps(i0: np.ndarray, i1: np.ndarray, w0: np.ndarray, w1: np.ndarray) -> tuple:
    """Column taps for the kernels: ``(seg, seg_i0, seg_i1, i0, i1, w0, w1)`` where
    output columns ``seg[k]:seg[k + 1]`` all lerp source columns ``seg_i0[k]`` and
    ``seg_i1[k]`` (taps are non-decreasing, so each pair is one run of columns)."""
    change = np.flatnonzero((i0[1:] != i0[:-1]) | (i1[1:] != i1[:-1])) + 1
    seg = np.concatenate([[0], change, [len(i0)]]).astype(np.int64)
    return seg, i0[seg[:-1]], i1[seg[:-1]], i0, i1, w0, w1


def use_threads(numba) -> int:
    """Run with as many threads as PyTorch uses (``torch.set_num_threads`` applies)."""
    import torch
    threads = max(1, min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS))
    numba.set_num_threads(threads)
    return threads


def upsample_add_into(x: np.ndarray, other: np.ndarray, out: np.ndarray, row_taps, col_taps
                      ) -> None:
    """``out[:] = other + bilinear(x)`` for ``(N, C, h, w)`` ``x`` and ``(N, C, H, W)``
    ``other``/``out`` (C-contiguous float32); taps are ``(i0, i1, w0, w1)`` NumPy arrays
    per axis (int64 indices, float32 weights). The per-thread buffers are torch
    tensors, so memory profilers see them."""
    import torch
    numba, add, _ = _kernels()
    n, c, h, w = x.shape
    H, W = out.shape[2:]
    threads = use_threads(numba)
    rows = chunk_rows(h, H, W * x.itemsize, n * c, threads)
    i0, i1 = row_taps[:2]
    starts = np.arange(0, H, rows)
    needed = int((i1[np.minimum(starts + rows, H) - 1] - i0[starts]).max()) + 1
    work = torch.empty((threads, needed, 1, W), dtype=torch.float32).numpy()
    add(x, other, out, *row_taps, column_taps(*col_taps), rows, work)
    note_pool(numba)


def upsample_argmax_into(x: np.ndarray, out: np.ndarray, row_taps, col_taps,
                         prune: bool = True) -> None:
    """``out[:] = bilinear(x).argmax(1)`` for ``(N, C, h, w)`` ``x`` and ``(N, H, W)``
    int64 ``out``; arguments as :func:`upsample_add_into`. Per thread the kernel holds
    ``2 x C x W`` interpolated values, a row of maxima and labels and the candidate
    classes of each column run. ``prune=False`` evaluates every class everywhere (the
    same labels, slower; the tests compare the two)."""
    import torch
    numba, _, argmax = _kernels()
    n, c, h, w = x.shape
    H, W = out.shape[1:]
    threads = use_threads(numba)
    rows = -(-H // max(1, -(-4 * threads // n)))  # >= 4 chunks per thread
    cols = column_taps(*col_taps)
    runs = len(cols[1])
    work = torch.empty((threads, 2, c, W), dtype=torch.float32).numpy()
    work_best = torch.empty((threads, 2, max(W, runs)), dtype=torch.float32).numpy()
    work_label = torch.empty((threads, 2, max(W, runs)), dtype=torch.int32).numpy()
    work_cand = torch.empty((threads, runs, c), dtype=torch.int32).numpy()
    work_count = torch.empty((threads, runs), dtype=torch.int32).numpy()
    work_highs = torch.empty((threads, c, runs), dtype=torch.float32).numpy()
    argmax(x, out, *row_taps, cols, rows, bool(prune), work, work_best, work_label,
           work_cand, work_count, work_highs)
    note_pool(numba)
