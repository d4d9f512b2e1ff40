"""Triton backend: the kernels of :mod:`mmseg_cann.kernels` (``backend='triton'``).

Runs on CUDA tensors, on Ascend NPU tensors through triton-ascend, and on CPU tensors
only under Triton's interpreter (``TRITON_INTERPRET=1`` in the environment *before*
Triton is first imported: ``@triton.jit`` reads it when a kernel is defined).

Covered: nearest/nearest-exact/bilinear upsampling (bilinear differentiable, with a
deterministic gather-form backward), ``upsample_add``, ``upsample_argmax``, max and
average pooling forward (``(N, C, H, W)`` or ``(C, H, W)`` input). Every launch goes
through :func:`kernels._common.launch` (device-aware launch configuration, int64 offsets
where needed); :mod:`.triton_aot` compiles every launched variant ahead of time for
sm_90 and gfx942 (``tools/device_check.py --aot``) and, with triton-ascend, for an
Ascend 910B3 (``tools/ascend_check.py``). Other upsample modes, pooling with
autograd and adaptive pooling run on the native backend, each counted and logged once as
a fallback (:func:`mmseg_cann.utils.record_fallback`).
"""
from __future__ import annotations

import importlib
import importlib.util
import os

import torch

from ..core import geometry as geo
from ..core import reference as ref
from ..core.taps import linear_taps, pool_divisors, pool_first_taps
from ..utils import record_fallback
from . import native
from .fused import unfused_for_grad

KERNEL_MODES = geo.FUSED_MODES


def check_available(device: torch.device) -> None:
    """Raise a clear error where the Triton kernels cannot run on ``device``."""
    if importlib.util.find_spec('triton') is None:
        raise RuntimeError("backend='triton' needs the 'triton' package (pip install "
                           "triton; triton-ascend on Ascend)")
    if device.type == 'cpu' and os.environ.get('TRITON_INTERPRET') != '1' \
            and not _common().recording():  # recorded launches run nothing
        raise RuntimeError("backend='triton' on CPU tensors runs only under Triton's "
                           'interpreter: set TRITON_INTERPRET=1 before triton is imported, '
                           'or move the tensors to a CUDA/NPU device')


def _kernels():
    # ``kernels/`` installs as mmseg_cann.kernels (setup.py package_dir); the import
    # linter sees it as the root package ``kernels``, so it is imported by name here
    return importlib.import_module('mmseg_cann.kernels.upsample')


def _common():
    """The kernels' shared launch helpers (imports Triton: call once it is known present)."""
    return importlib.import_module('mmseg_cann.kernels._common')


def _axis_taps(in_size: int, out_size: int, spec: geo.UpsampleSpec, axis: int):
    """``(i0, i1, w0, w1)`` for one axis, from the shared tap builders."""
    if spec.mode in geo.NEAREST_MODES:
        idx = torch.from_numpy(ref.nearest_indices(in_size, out_size, spec.kernel_scales[axis],
                                                   spec.mode == 'nearest-exact'))
        return idx, idx, torch.ones(out_size), torch.zeros(out_size)
    return linear_taps(in_size, out_size, bool(spec.align_corners), spec.kernel_scales[axis])


def _spec_taps(spec: geo.UpsampleSpec):
    return tuple(_axis_taps(spec.in_size[a], spec.out_size[a], spec, a) for a in range(2))


def _supported(input: torch.Tensor, spec: geo.UpsampleSpec) -> bool:
    # sizes of 2^31 elements and more take the kernels' int64 offsets
    return (spec.mode in KERNEL_MODES and not spec.antialias
            and input.dtype in (torch.float16, torch.bfloat16, torch.float32))


def reverse_taps(taps, in_size: int):
    """The bilinear backward's tables for one axis, from the forward taps ``(i0, i1, w0,
    w1)`` (``out`` entries each): per input index ``i``, ``(start, count, weight)`` with
    the output indices reading it, ``start[i] + k`` for ``k < count[i]`` (a contiguous
    range: the taps are non-decreasing in the output index), and ``weight[i, k]`` the sum
    of that output's tap weights on ``i`` (``w0 + w1`` where both taps are ``i``, added
    in float32), zero past ``count[i]``. Shapes ``(in,)``, ``(in,)``, ``(in, max count)``.
    """
    i0, i1 = taps[0].long(), taps[1].long()
    w0, w1 = taps[2].float(), taps[3].float()
    out_size = len(i0)
    d = torch.arange(out_size)
    lo = torch.full((in_size,), out_size, dtype=torch.int64)
    hi = torch.full((in_size,), -1, dtype=torch.int64)
    for idx in (i0, i1):
        lo.scatter_reduce_(0, idx, d, 'amin')
        hi.scatter_reduce_(0, idx, d, 'amax')
    count = (hi - lo + 1).clamp_min(0)
    start = torch.where(count > 0, lo, torch.zeros_like(lo))
    width = max(int(count.max()), 1)
    k = torch.arange(width)
    y = (start[:, None] + k).clamp_max(out_size - 1)  # (in, width) output indices
    i = torch.arange(in_size)[:, None]
    weight = (torch.where(i0[y] == i, w0[y], 0.0) + torch.where(i1[y] == i, w1[y], 0.0))
    weight = torch.where(k < count[:, None], weight, 0.0)
    return start.to(torch.int32), count.to(torch.int32), weight.float().contiguous()


class _BilinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input, spec, taps):
        ctx.spec, ctx.taps, ctx.dtype = spec, taps, input.dtype
        return _kernels().upsample_fwd(input, spec.out_size, taps[0], taps[1], False)

    @staticmethod
    def backward(ctx, grad):
        h, w = ctx.spec.in_size
        g = _kernels().bilinear_bwd(grad, (h, w), reverse_taps(ctx.taps[0], h),
                                    reverse_taps(ctx.taps[1], w))
        return g.to(ctx.dtype), None, None


def upsample(input: torch.Tensor, spec: geo.UpsampleSpec) -> torch.Tensor:
    """Upsample with the Triton kernel (nearest modes, bilinear); other cases native."""
    check_available(input.device)
    if not _supported(input, spec):
        record_fallback('upsample', f'no Triton kernel for mode={spec.mode!r}, '
                                    f'antialias={spec.antialias}, dtype {input.dtype}; '
                                    'running natively')
        return native.upsample(input, spec)
    taps = _spec_taps(spec)
    if spec.mode == 'bilinear':
        return _BilinearFunction.apply(input, spec, taps)
    return _kernels().upsample_fwd(input, spec.out_size, taps[0], taps[1], True)


def upsample_add(input, other, spec):
    """``other + upsample(input)`` in one kernel (not differentiable)."""
    check_available(input.device)
    if unfused_for_grad('upsample_add', 'triton', input, other):
        return native.upsample_add(input, other, spec)
    if not _supported(input, spec):
        record_fallback('upsample_add', f'no Triton kernel for dtype {input.dtype}')
        return native.upsample_add(input, other, spec)
    taps = _spec_taps(spec)
    return _kernels().upsample_fwd(input, spec.out_size, taps[0], taps[1],
                                   spec.mode != 'bilinear', other=other)


def upsample_argmax(logits, spec):
    """Labels of the upsampled logits, computed per pixel over classes."""
    check_available(logits.device)
    if unfused_for_grad('upsample_argmax', 'triton', logits):
        return native.upsample_argmax(logits, spec)
    if not _supported(logits, spec):
        record_fallback('upsample_argmax', f'no Triton kernel for dtype {logits.dtype}')
        return native.upsample_argmax(logits, spec)
    taps = _spec_taps(spec)
    return _kernels().upsample_argmax(logits, spec.out_size, taps[0], taps[1],
                                      spec.mode != 'bilinear')


def _pool_kernels():
    return importlib.import_module('mmseg_cann.kernels.pooling')


def _pool_supported(input) -> bool:
    # the kernels' int32 max indices address one H*W plane
    return input.dtype in (torch.float16, torch.bfloat16, torch.float32) \
        and input.shape[-2] * input.shape[-1] < 2 ** 31


def _batched(input: torch.Tensor) -> torch.Tensor:
    """``(C, H, W)`` input as a batch of one (the kernels take ``(N, C, H, W)``)."""
    return input.unsqueeze(0) if input.dim() == 3 else input


def _unbatched(input: torch.Tensor, *outputs: torch.Tensor):
    """The outputs of :func:`_batched` input without the added batch dimension."""
    return tuple(o.squeeze(0) if input.dim() == 3 else o for o in outputs)


def max_pool2d(input, spec, return_indices=False):
    """Max pooling forward with the Triton kernel (not differentiable: the indices give
    the gradient, PyTorch's ``max_unpool``-style backward is not implemented here)."""
    check_available(input.device)
    if not _pool_supported(input) or (torch.is_grad_enabled() and input.requires_grad):
        record_fallback('max_pool2d', f'no Triton kernel for dtype {input.dtype}, for '
                                      'the backward pass or for an H*W plane of 2^31 '
                                      'elements; running natively')
        return native.max_pool2d(input, spec, return_indices)
    first_taps = [torch.tensor(t, dtype=torch.int32) for t in pool_first_taps(spec)]
    values, indices = _unbatched(input, *_pool_kernels().max_pool2d(_batched(input), spec,
                                                                    first_taps))
    return (values, indices) if return_indices else values


def avg_pool2d(input, spec, count_include_pad=True, divisor_override=None):
    """Average pooling forward (float32 accumulation) with the Triton kernel."""
    check_available(input.device)
    if not _pool_supported(input) or (torch.is_grad_enabled() and input.requires_grad):
        record_fallback('avg_pool2d', f'no Triton kernel for dtype {input.dtype}, for '
                                      'the backward pass or for an H*W plane of 2^31 '
                                      'elements; running natively')
        return native.avg_pool2d(input, spec, count_include_pad, divisor_override)
    divisors = [torch.tensor(t, dtype=torch.int32)
                for t in pool_divisors(spec, count_include_pad)]
    out = _pool_kernels().avg_pool2d(_batched(input), spec, divisors, divisor_override)
    return _unbatched(input, out)[0]


def adaptive_avg_pool2d(input, output_size):
    check_available(input.device)
    record_fallback('adaptive_avg_pool2d', 'no Triton kernel; running natively')
    return native.adaptive_avg_pool2d(input, output_size)
