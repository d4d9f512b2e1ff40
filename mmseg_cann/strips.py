"""Row-strip execution of a backbone's high-resolution local stages (inference memory).

At full resolution the first stages of a segmentation backbone hold the largest
activations of the whole prediction: Fast-SCNN's first convolution turns a
``3 x 1024 x 2048`` image into ``32 x 512 x 1024`` floats (64 MB), and PyTorch's CPU
convolution briefly holds its output twice. These stages are *row-local*: every output
row depends on a bounded band of input rows. Running such a stage on horizontal strips
of its input, each widened by a halo that covers the receptive field, and keeping only
the rows the strip computes from real input gives the same tensor with a fraction of the
peak memory.

Exactness: a strip computes each kept output element from the same input elements with
the same weights as the whole tensor does (strip boundaries sit on multiples of the
stage's total stride, so the sampling grid is the whole tensor's; the rows a strip's own
padding touches are discarded). Where a convolution's per-output reduction does not
depend on the tensor's height -- PyTorch's CPU kernels for short reductions, such as
those of Fast-SCNN's stem (tested) -- the result is bit-identical; long
reductions (a 1x1 convolution from a few hundred channels) are blocked by shape, so the
values agree to float32 rounding and the labels are the unsplit model's except at
near-ties of the top two classes, the contract of the lean prediction path. Strips run on
CPU tensors only (where their effect is measured); elsewhere the stage runs whole.

What is row-local here (:func:`is_row_local`): the layers in :data:`POINTWISE_LAYERS` and
:data:`WINDOW_LAYERS` in inference mode, and containers whose ``forward`` runs their
children in registration order on one tensor (``nn.Sequential``, mmcv's ``ConvModule`` and
``DepthwiseSeparableConvModule``, mmseg's ``InvertedResidual`` and Fast-SCNN's
``LearningToDownsample``; subclasses that override ``forward`` are not). Anything else --
global pooling, attention, group/layer norm, deformable convolution, upsampling,
training-mode batch norm -- is not, and its children are examined instead.

Used by the lean prediction path (:mod:`mmseg_cann.fusion`) around the backbone, neck
and decode head, without gradients only; a stage is split only when its widest activation is estimated
above :data:`STRIP_ACTIVATION_BYTES`.
"""
from __future__ import annotations

import contextlib
import math
from typing import Iterator, List, Tuple

import torch
from torch import nn

#: Per-element layers (no spatial extent); dropout and batch norm only in eval mode.
POINTWISE_LAYERS = (
    nn.BatchNorm2d, nn.SyncBatchNorm, nn.Identity, nn.Dropout, nn.Dropout2d,
    nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.PReLU, nn.ELU, nn.GELU, nn.SiLU, nn.Mish,
    nn.Hardswish, nn.Hardsigmoid, nn.Sigmoid, nn.Tanh)
#: Layers reading a bounded window of rows (their kernel, stride, dilation, padding).
WINDOW_LAYERS = (nn.Conv2d, nn.MaxPool2d, nn.AvgPool2d, nn.ZeroPad2d, nn.ReflectionPad2d,
                 nn.ReplicationPad2d, nn.ConstantPad2d)
#: A stage is split into strips when its widest activation would exceed this.
STRIP_ACTIVATION_BYTES = 8 * 2**20


def _sequential_containers() -> Tuple[type, ...]:
    """Container classes whose ``forward`` runs their children in registration order
    (pointwise residual additions allowed), where mmcv/mmseg are installed."""
    classes = [nn.Sequential]
    with contextlib.suppress(ImportError):
        from mmcv.cnn import ConvModule, DepthwiseSeparableConvModule
        classes += [ConvModule, DepthwiseSeparableConvModule]
    with contextlib.suppress(ImportError):
        from mmseg.models.backbones.fast_scnn import LearningToDownsample
        from mmseg.models.utils import InvertedResidual
        classes += [InvertedResidual, LearningToDownsample]
    return tuple(classes)


def _pair(v) -> Tuple[int, int]:
    return (v, v) if isinstance(v, int) else tuple(v)


def _window_rows(layer: nn.Module) -> Tuple[int, int, int]:
    """(rows a window spans beyond its first, rows of padding above, vertical stride)."""
    if isinstance(layer, (nn.ZeroPad2d, nn.ReflectionPad2d, nn.ReplicationPad2d,
                          nn.ConstantPad2d)):
        pad = (layer.padding,) * 4 if isinstance(layer.padding, int) else layer.padding
        return 0, pad[2], 1
    kernel = _pair(layer.kernel_size)[0]
    stride = _pair(layer.stride or layer.kernel_size)[0]
    span = _pair(getattr(layer, 'dilation', 1))[0] * (kernel - 1)
    if layer.padding == 'same':
        return span, span // 2, stride
    return span, 0 if layer.padding == 'valid' else _pair(layer.padding)[0], stride


def is_row_local(module: nn.Module) -> bool:
    """Whether ``module`` maps one NCHW tensor to one, each output row depending on a
    bounded band of input rows (see the module doc)."""
    if isinstance(module, POINTWISE_LAYERS):
        return not (module.training and isinstance(module, (nn.BatchNorm2d, nn.SyncBatchNorm,
                                                            nn.Dropout, nn.Dropout2d)))
    if isinstance(module, WINDOW_LAYERS):
        if isinstance(module, nn.MaxPool2d) and module.return_indices:
            return False
        return getattr(module, 'padding_mode', 'zeros') != 'circular'
    containers = _sequential_containers()
    if not any(type(module).forward is c.forward and isinstance(module, c)
               for c in containers):
        return False
    children = list(module.children())
    return bool(children) and all(is_row_local(c) for c in children)


def row_geometry(module: nn.Module) -> Tuple[int, int]:
    """(total vertical stride ``S``, halo) of a row-local module.

    Output row ``j`` reads input rows ``j*S - P`` to ``j*S - P + E``, with ``P`` the
    padding above and ``E`` the receptive field's extent, both summed over the window
    layers at their input stride. A strip widened by ``max(P, E - P)`` rows on each side
    (rounded up to a multiple of ``S``, so strips stay on the whole tensor's sampling
    grid) computes the rows it keeps from real input only.
    """
    stride, extent, above = 1, 0, 0
    for layer in module.modules():
        if isinstance(layer, WINDOW_LAYERS):
            span, top, s = _window_rows(layer)
            extent += span * stride
            above += top * stride
            stride *= s
    return stride, stride * math.ceil(max(above, extent - above) / stride)


def _widest_bytes(module: nn.Module, x: torch.Tensor) -> int:
    """An estimate of the largest activation ``module`` makes from ``x`` (bytes)."""
    n, c, h, w = x.shape
    area, widest = h * w, c * h * w
    for layer in module.modules():
        if isinstance(layer, (nn.Conv2d, nn.MaxPool2d, nn.AvgPool2d)):
            sh, sw = _pair(layer.stride or layer.kernel_size)
            area = math.ceil(area / (sh * sw))
        if isinstance(layer, nn.Conv2d):
            widest = max(widest, layer.out_channels * area)
    return n * widest * x.element_size()


def run_in_strips(fn, x: torch.Tensor, strips: int, stride: int, halo: int) -> torch.Tensor:
    """``fn(x)`` computed on about ``strips`` horizontal strips of ``x``, for a row-local
    ``fn`` of vertical ``stride`` and ``halo`` (:func:`row_geometry`)."""
    height = x.shape[2]
    step = stride * max(1, math.ceil(height / strips / stride))
    if strips < 2 or step >= height:
        return fn(x)
    pieces: List[torch.Tensor] = []
    for start in range(0, height, step):
        end = min(start + step, height)
        lo, hi = max(start - halo, 0), min(end + halo, height)
        out = fn(x[:, :, lo:hi])
        top = (start - lo) // stride
        pieces.append(out[:, :, top:] if end == height
                      else out[:, :, top:top + (end - start) // stride])
    return torch.cat(pieces, dim=2)


def _strip_forward(module: nn.Module, forward):
    stride, halo = row_geometry(module)

    def forward_in_strips(*args, **kwargs):
        x = args[0] if len(args) == 1 and not kwargs else None
        if not isinstance(x, torch.Tensor) or x.dim() != 4 or x.device.type != 'cpu' \
                or torch.is_grad_enabled():
            return forward(*args, **kwargs)
        strips = math.ceil(_widest_bytes(module, x) / STRIP_ACTIVATION_BYTES)
        return run_in_strips(forward, x, strips, stride, halo)
    return forward_in_strips


def row_local_stages(root: nn.Module) -> Iterator[nn.Module]:
    """The outermost row-local modules under ``root`` (``root`` itself if it is one)."""
    if is_row_local(root):
        yield root
        return
    for child in root.children():
        yield from row_local_stages(child)


@contextlib.contextmanager
def strip_execution(root: nn.Module):
    """Within the block, the outermost row-local stages under ``root`` run in strips
    when called without gradients on a large enough tensor; restored on exit."""
    patched = []
    try:
        for stage in row_local_stages(root):
            if 'forward' in stage.__dict__:
                continue
            stage.forward = _strip_forward(stage, stage.forward)
            patched.append(stage)
        yield patched
    finally:
        for stage in patched:
            stage.__dict__.pop('forward', None)
