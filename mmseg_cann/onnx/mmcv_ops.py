"""mmcv ops traced in a portable form while :func:`~mmseg_cann.onnx.export_onnx` exports.

mmcv's ``PSAMask`` (PSANet's point-wise spatial attention, mmseg's ``PSAHead``) runs a
C++ kernel. On the CPU that kernel copies the mask element by element with tensor
indexing (``buffer.view({-1})[i] = mask.view({-1})[j]``, mmcv's
``ops/csrc/pytorch/cpu/psamask.cpp``), and it takes the batch and the map size as C++
ints. ``torch.export``, tracing it with fake tensors, therefore records one
``view``/``select``/``copy_`` group per copied element -- up to ``(H*W)**2`` per mask: 256
on a 4x4 map, 3.9 million on the 32x64 map of a 512x1024 image -- for the traced size
only (measured on the small PSANet of the model sweep at 64x64: 2,652 exported nodes and
12,475 ONNX nodes for the decode head alone, 24,654 for the model and head, on which
onnxscript's rewriter, whose two-node ``SlicesSplit`` pattern rescans the whole graph at
every node, then ran for over 25 minutes).

:func:`portable_mmcv_ops` makes each ``PSAMask`` of the exported model compute
:func:`psa_mask` instead while it is traced: the same copy as one gather over indices
built from the runtime size (``arange`` of the map's height and width), so the graph has
a few dozen nodes whatever the size and, exported with ``dynamic=True``, holds for every
size. The values are mmcv's bit for bit (a copy; zero where the mask window falls outside
the map: those entries gather from a zero channel padded onto the input), checked against
the kernel in ``tests/onnx/test_mmcv_ops.py``.
"""
from __future__ import annotations

import contextlib
import sys
from typing import Iterator, Sequence

import torch

#: mmcv's ``psa_type`` names
PSA_TYPES = ('collect', 'distribute')


def psa_mask(input: torch.Tensor, psa_type: str, mask_size: Sequence[int]) -> torch.Tensor:
    """mmcv's ``PSAMask(psa_type, mask_size)(input)`` in plain PyTorch ops.

    ``input`` ``(N, hm*wm, H, W)`` -> ``(N, H*W, H, W)``. With ``half = (hm-1)//2,
    (wm-1)//2``, the mask entry ``(i, j)`` of position ``(h, w)`` is the attention
    between ``(h, w)`` and ``(y, x) = (h + i - half_h, w + j - half_w)``; ``'collect'``
    puts it at output ``[n, y*W + x, h, w]``, ``'distribute'`` at ``[n, h*W + w, y, x]``,
    and every output entry whose window offset falls outside the mask is zero.
    """
    if psa_type not in PSA_TYPES:
        raise ValueError(f'psa_mask: psa_type must be one of {PSA_TYPES}, got {psa_type!r}')
    hm, wm = (int(mask_size), int(mask_size)) if isinstance(mask_size, int) \
        else (int(mask_size[0]), int(mask_size[1]))
    if not isinstance(input, torch.Tensor) or input.dim() != 4:
        raise ValueError('psa_mask: input must be a 4-D tensor (N, hm*wm, H, W), got '
                         + (f'shape {tuple(input.shape)}' if isinstance(input, torch.Tensor)
                            else type(input).__name__))
    n, channels, height, width = input.shape
    if channels != hm * wm:
        raise ValueError(f'psa_mask: the input has {channels} channels, the mask size '
                         f'{hm}x{wm} needs {hm * wm}')
    rows = torch.arange(height, device=input.device)
    cols = torch.arange(width, device=input.device)
    # the mask row of target row y seen from row h: y - h + half_h (likewise columns)
    di = rows[:, None] - rows[None, :] + (hm - 1) // 2   # [y, h]
    dj = cols[:, None] - cols[None, :] + (wm - 1) // 2   # [x, w]
    inside = (((di >= 0) & (di < hm))[:, None, :, None]
              & ((dj >= 0) & (dj < wm))[None, :, None, :]).long()
    # mask channel di*wm + dj inside the window, else channel hm*wm: the zero channel
    # appended below. Integer arithmetic, no select: the graph stays GatherElements,
    # Pad and elementwise integer ops (all in ATC's ONNX parser; see docs/onnx_export.md)
    channel = ((di[:, None, :, None] * wm + dj[None, :, None, :]) * inside
               + channels * (1 - inside)).reshape(height * width, height * width)
    # collect[n, p, q] = input[n, channel[p, q], q] for target p = (y, x), source q = (h, w)
    flat = torch.nn.functional.pad(input.reshape(n, channels, height * width), (0, 0, 0, 1))
    out = torch.gather(flat, 1, channel.unsqueeze(0).expand(n, -1, -1))
    if psa_type == 'distribute':
        out = out.transpose(1, 2)
    return out.reshape(n, height * width, height, width)


@contextlib.contextmanager
def portable_mmcv_ops(model: torch.nn.Module) -> Iterator[None]:
    """``with portable_mmcv_ops(model): torch.export.export(model, ...)`` -- each mmcv
    ``PSAMask`` in ``model`` computes :func:`psa_mask` for the duration (the modules'
    own forwards are restored on exit). Subclasses that override ``forward`` and
    instances given their own ``forward`` are left as they are. A model without them, or
    without mmcv's ops imported, is left as it is."""
    module = sys.modules.get('mmcv.ops.psa_mask')
    psa_class = getattr(module, 'PSAMask', None)
    patched = []
    if psa_class is not None:
        for sub in model.modules():
            # mmcv's own forward only: a subclass's or an instance's own forward is
            # the user's code, traced as it is
            if (isinstance(sub, psa_class) and sub.mask_size is not None
                    and type(sub).forward is psa_class.forward
                    and 'forward' not in vars(sub)):
                sub.forward = _portable_forward(sub)
                patched.append(sub)
    try:
        yield
    finally:
        for sub in patched:
            del sub.forward


def _portable_forward(module: torch.nn.Module):
    def forward(input: torch.Tensor) -> torch.Tensor:
        return psa_mask(input, module.psa_type, module.mask_size)
    return forward
