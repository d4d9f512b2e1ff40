"""ROI pooling: ``roi_pool2d``, each box of a batch of feature maps pooled to a fixed size.

The region and bin rules are :mod:`mmseg_cann.core.roi`'s; where the call runs is planned
by :mod:`mmseg_cann.backends.roi_npu` (numba kernels on a CPU, the vendor kernel for max
pooling on an Ascend NPU where it applies, an exact aten form elsewhere).

In a graph (``torch.compile``, ``torch.export``, ``torch.jit.trace``) the op is one call
of the registered operator ``mmseg_cann::roi_pool2d`` (:func:`_roi_pool_op`), which
runs the eager op when the graph runs: the boxes' values are read then, not when the
graph is made. Training under ``torch.compile`` (an input that needs a gradient) runs
the op eagerly between graphs instead.
"""
from __future__ import annotations

import functools
from typing import List, Optional

import torch
from torch.overrides import handle_torch_function, has_torch_function

from ..backends import roi_cpu, roi_npu
from ..core import export_mode
from ..core import geometry as geo
from ..core import roi as roi_rules
from ..core.precision import normalize_precision, precision_name, run_with_precision
from ..utils import record_fallback

_HALF = (torch.float16, torch.bfloat16)


def _dynamo_disabled(fn):
    """``torch.compiler.disable(fn)``, made at the first call: applying it when this module
    is imported would import ``torch._dynamo`` (and with it Triton, before a user could set
    ``TRITON_INTERPRET``) on ``import mmseg_cann``."""
    disabled = None

    @functools.wraps(fn)
    def call(*args, **kwargs):
        nonlocal disabled
        if disabled is None:
            disabled = torch.compiler.disable(fn)
        return disabled(*args, **kwargs)
    return call


def roi_pool2d(input: torch.Tensor, rois, output_size, mode: str = 'max',
               spatial_scale: float = 1.0, return_indices: bool = False, *, precision=None,
               backend: str = 'auto'):
    """Pool each region of interest of ``input`` to ``output_size``.

    Args:
        input: ``(N, C, H, W)`` floating tensor (C, H, W non-empty).
        rois: ``(K, 5)`` tensor of ``[batch_index, x1, y1, x2, y2]`` in input-image
            coordinates (floating or integer, on ``input``'s device), or a list of
            ``(L_i, 4)`` box tensors, one per image (torchvision's two forms). Batch
            indices must be whole numbers in ``[0, N)`` and coordinates finite.
        output_size: int or ``(out_h, out_w)``, positive.
        mode: ``'max'`` -- ``torchvision.ops.roi_pool`` bit for bit (its float bins, empty
            bins 0, NaN never pooled); ``'avg'`` -- for a box inside the map,
            ``F.adaptive_avg_pool2d(input[b, :, y1:y2 + 1, x1:x2 + 1], output_size)`` bit
            for bit (bins clipped to the map, empty bins 0). Box -> region rule:
            ``round(coord * spatial_scale)`` (halves away from zero), ends inclusive,
            reversed boxes one cell wide (:mod:`mmseg_cann.core.roi`).
        spatial_scale: positive factor from box coordinates to map cells (1/16 for a
            stride-16 feature map).
        return_indices: ``mode='max'`` only: also return int64 flat indices into each
            ``H * W`` plane (torchvision's argmax; -1 where nothing was pooled).
        precision: compute dtype, None defers to the policy's ``max``/``avg`` entry
            (average pooling of fp16/bf16 accumulates in float32 by default).
        backend: ``'auto'`` (planned per device), ``'npu'`` (the same planner),
            ``'fast'`` (the numba CPU kernels), ``'native'`` (the aten form).

    Returns:
        ``(K, C, out_h, out_w)`` values in ``input``'s dtype (and the indices).

    Raises:
        TypeError, ValueError: invalid arguments (shapes, dtypes, batch indices,
            non-finite coordinates), before any pooling runs.
    """
    # an FX proxy, a tensor subclass or a torch function mode sees one call of the op (as
    # torch.nn.functional dispatches); not while exporting, which traces the op's path
    dispatched = (input, rois) if isinstance(rois, torch.Tensor) else (input,)
    if has_torch_function(dispatched) and not torch.compiler.is_exporting():
        return handle_torch_function(roi_pool2d, dispatched, input, rois, output_size, mode,
                                     spatial_scale, return_indices, precision=precision,
                                     backend=backend)
    roi_rules.check_roi_input(input)
    rois = roi_rules.boxes_to_rois(rois, input)
    mode = roi_rules.check_mode(mode)
    out_hw = roi_rules.check_output_size(output_size)
    scale = roi_rules.check_spatial_scale(spatial_scale)
    return_indices = geo.truth_flag(return_indices)
    if return_indices and mode != 'max':
        raise ValueError("roi_pool2d: return_indices=True needs mode='max'")
    normalize_precision(precision)
    backend = roi_npu.check_roi_backend(backend)
    exporting = export_mode.export_backend()
    if exporting is not None and backend == 'auto':
        export = getattr(exporting, 'roi_pool2d', None)
        if export is None:
            target = export_mode.current_target()
            raise ValueError(f'roi_pool2d cannot be exported to the {target!r} target')
        return export(input, rois, out_hw, mode, scale, return_indices)
    if _recorded_in_graph(input):
        named = precision if precision is None or isinstance(precision, str) else \
            precision_name(normalize_precision(precision))
        pooled = _roi_pool_op(input, rois, list(out_hw), mode, scale, return_indices, named,
                              backend)
        return tuple(pooled) if return_indices else pooled[0]
    return _pool_eagerly(input, rois, out_hw, mode, scale, return_indices, precision, backend)


def _recorded_in_graph(input: torch.Tensor) -> bool:
    """Whether a graph is being made that holds this call as one call of
    ``mmseg_cann::roi_pool2d``: ``torch.export``, ``torch.jit.trace``, and
    ``torch.compile`` where no input gradient is needed (the registered op has no
    gradient: with one, dynamo runs :func:`_pool_eagerly` between graphs)."""
    if torch.compiler.is_exporting() or torch.jit.is_tracing():
        return True
    return torch.compiler.is_compiling() and not (torch.is_grad_enabled()
                                                  and input.requires_grad)


# dynamo runs the eager op between graphs: its checks read the boxes' values and the CPU
# kernels are numba functions
@_dynamo_disabled
def _pool_eagerly(input, rois, out_hw, mode, scale, return_indices, precision, backend):
    """The op after its argument checks: the boxes' checks, their bins, the pooling."""
    roi_rules.check_rois(rois, input)
    bins = roi_rules.roi_bins(rois, scale, out_hw, input.shape[-2:], mode)
    return run_with_precision(
        mode, precision, input,
        lambda x: _pool(x, rois, bins, out_hw, mode, scale, return_indices, backend),
        probe_key=f'roi_pool2d_{mode}', probe=lambda t: t)


def _pool(x, rois, bins, out_hw, mode, scale, return_indices, backend):
    """Run the planned call form on ``x`` (already in the compute dtype)."""
    compute = x.float() if x.dtype in _HALF else x
    plan = roi_npu.plan_roi_pool(mode, backend, x.device.type, x.dtype, x.shape[1],
                                 return_indices, kernels_usable=roi_cpu.usable(compute),
                                 vendor_available=roi_npu.mmcv_npu_available())
    if plan.fallback:
        record_fallback('roi_pool2d', plan.fallback)
    if plan.call == 'vendor':
        return roi_npu.pool_vendor(x, rois, out_hw, scale)
    if mode == 'avg' and tuple(out_hw) == (1, 1):
        return roi_npu.pool_mean(x, bins)  # PyTorch's 1x1 adaptive pooling is a mean
    if plan.call == 'kernels':
        result = roi_cpu.roi_pool(compute, bins, mode, return_indices)
    else:
        result = roi_npu.pool_aten(x, bins, mode, return_indices)
    if compute is x or plan.call != 'kernels':
        return result
    if return_indices:
        return result[0].to(x.dtype), result[1]
    return result.to(x.dtype)


@torch.library.custom_op('mmseg_cann::roi_pool2d', mutates_args=())
def _roi_pool_op(input: torch.Tensor, rois: torch.Tensor, output_size: List[int], mode: str,
                 spatial_scale: float, return_indices: bool, precision: Optional[str],
                 backend: str) -> List[torch.Tensor]:
    """:func:`roi_pool2d` as one registered operator (what a graph records): the eager
    op's values (and indices) when the graph runs, contiguous."""
    pooled = _pool_eagerly(input, rois, output_size, mode, spatial_scale, return_indices,
                           precision, backend)
    return [t.contiguous() for t in pooled] if return_indices else [pooled.contiguous()]


@_roi_pool_op.register_fake
def _(input, rois, output_size, mode, spatial_scale, return_indices, precision, backend):
    shape = (rois.shape[0], input.shape[1], output_size[0], output_size[1])
    pooled = [input.new_empty(shape)]
    if return_indices:
        pooled.append(input.new_empty(shape, dtype=torch.int64))
    return pooled


def _no_gradient(ctx, grads):
    raise RuntimeError(
        'roi_pool2d: the gradient of ROI pooling recorded in a torch.export or '
        'torch.jit.trace graph is not available (those graphs are for inference); '
        'train with the eager module or under torch.compile, which runs the op eagerly '
        'between graphs when an input needs a gradient')


_roi_pool_op.register_autograd(_no_gradient)
