"""The 1x1 sites of ``fuse_resize_conv``: the per-pixel linear layer after a resize runs
at low resolution (:func:`mmseg_cann.fusion.fuse_resize_conv` applies them).

A 1x1 convolution (any per-pixel linear map ``W``) commutes with interpolation, which is
linear and works per channel: ``W·up(x) = up(W·x)``; for a concatenation of resized maps
``W·cat(up_i(a_i)) = Σ_i up_i(W_i·a_i)``, ``W_i`` the slice of ``W``'s input channels
that ``a_i`` feeds. A bias commutes too, because the interpolation weights of every mode
sum to one (``up(z + b) = up(z) + b``), so it is added once, to the first term. The
layers that follow the convolution in the same ``ConvModule`` (batch norm in training or
eval mode, GN, the activation) are left where they were: they run, as the same module
calls, on the same full-size tensor. Nothing of the model's parameters changes; the
rewrite binds a replacement method on each rewritten module instance (never on mmseg's
classes) and :func:`mmseg_cann.fusion.unfuse_model` removes it.

Exactness: equal in arithmetic; in float32 the sums are formed in another order (the
``K`` input channels of the convolution, split by input, plus the two or four taps of the
interpolation), so each value differs from the unrewritten one by at most the rounding
of those sums: ``|Δ| <= (K + 8)·2^-24·(|W|·up(|a|))`` elementwise before the norm (see
docs/resize_conv.md; tested with large activations). A training-mode ``Dropout2d``
before a rewritten ``conv_seg`` draws one value per (sample, channel), so it is applied
to the low-resolution map (same random stream, same mask); its hooks would see that map,
so a hooked dropout keeps the site unfused. Non-finite activations may spread differently
(an interpolation multiplies a neighbour by a zero weight: ``inf·0``).

Per call the rewritten method checks again what made the site eligible (exact classes,
settings, no hooks on the modules it bypasses or calls with other tensors, no global
module hooks, a valid resize mode, 4-D floating inputs) and otherwise runs the class's own
method (a recorded fallback). Sites (:data:`SITES`; exact classes only):

* ``SegformerHead.fusion_conv``: 1x1 ConvModule over the concat of the resized outputs
  of ``convs``;
* ``LightHamHead.squeeze``: 1x1 ConvModule over the concat of the resized inputs;
* ``FCNHead.convs[0]`` with ``input_transform='resize_concat'`` (HRNet): 1x1 ConvModule
  over the concat of the resized inputs;
* ``LRASPPHead.conv_ups[i]``: 1x1 ConvModule over ``cat(resize(x), convs[i](input))``;
* ``InterpConv`` (UNet, ``conv_first=False``): upsample then a 1x1 ConvModule;
* ``FeatureFusionBlock.project`` (DPT): resize x2 then a 1x1 ConvModule;
* ``SETRMLAHead.cls_seg``: over the concat of the up_convs' final ``Upsample`` outputs;
* ``SETRUPHead.cls_seg``: after the last up_conv's ``Upsample``;
* ``FPNHead.cls_seg`` (Semantic FPN): after the sum of the scale heads, each ending in an
  ``Upsample``;

:mod:`.resize_kxk` adds ``UPerHead.fpn_bottleneck`` (a kxk conv over the concat of resized
maps) through :func:`mmseg_cann.ops.resize_conv.resize_conv2d`.
"""
from __future__ import annotations

import sys
from typing import List, Optional, Sequence

import torch
from torch import nn

from ..core import geometry as geo
from ..ops.fused import upsample_add
from ..ops.resize_conv import pointwise_conv2d as pointwise
from ..ops.upsample import upsample
from ..strips import is_strip_patch
from ..utils.module_hooks import global_hooks_registered, has_hooks
from ..utils import record_fallback
from ._common import Site, record_last_call

OP = 'fuse_resize_conv'
#: resize modes whose F.interpolate weights sum to one (and the modes F.interpolate takes
#: align_corners with)
_MODES = ('nearest', 'nearest-exact', 'bilinear', 'bicubic', 'area')
_ALIGNED_MODES = ('bilinear', 'bicubic')
_ADD_MODES = ('nearest', 'nearest-exact', 'bilinear')


# ----------------------------------------------------------------------------------
# eligibility (one function per kind of module; each returns None or why not)
# ----------------------------------------------------------------------------------
def _first(*reasons) -> Optional[str]:
    for reason in reasons:
        if reason is not None:
            return reason
    return None


def _global_hooks_reason() -> Optional[str]:
    """Why no site runs rewritten while global module hooks are registered."""
    return 'global module hooks' if global_hooks_registered() else None


def _base(module):
    """The module itself where ``torch.export`` (non-strict) hands out a proxy of it (a
    generated subclass whose attributes read the real module's)."""
    from torch.fx.experimental import proxy_tensor
    proxy = getattr(proxy_tensor, '_AttrProxy', None)
    if proxy is not None and isinstance(module, proxy):
        return module.get_base()
    return module


def _as_built(module, classes, what: str) -> Optional[str]:
    """None if ``module`` is of one of the exact ``classes``, runs that class's methods
    (none set on the instance, except a strip-execution patch) and has no hooks."""
    module = _base(module)
    if type(module) not in classes:
        return (f'{what} is {type(module).__name__}, not '
                + ' or '.join(c.__name__ for c in classes))
    for key, value in module.__dict__.items():
        if hasattr(type(module), key) and callable(value) and not isinstance(value, nn.Module) \
                and not (key == 'forward' and is_strip_patch(module, value)):
            return f'{what} has {key} set on the instance'
    if has_hooks(module):
        return f'{what} has hooks (they would not see its full-resolution tensors)'
    return None


def _conv1x1(conv, what: str) -> Optional[str]:
    """A plain per-pixel ``nn.Conv2d``: 1x1, stride 1, no padding, one group."""
    reason = _as_built(conv, (nn.Conv2d,), what)
    if reason is not None:
        return reason
    if tuple(conv.kernel_size) != (1, 1) or tuple(conv.stride) != (1, 1) or conv.groups != 1 \
            or conv.padding not in ((0, 0), 'valid'):
        return (f'{what} is not a plain 1x1 convolution (kernel {conv.kernel_size}, stride '
                f'{conv.stride}, padding {conv.padding}, groups {conv.groups})')
    return None


def _conv_module(cm, what: str, conv_check=None) -> Optional[str]:
    """mmcv's ``ConvModule`` running a plain 1x1 conv first (``conv_check``: another
    check of the conv), then norm/act as its ``forward`` does."""
    from mmcv.cnn import ConvModule
    reason = _as_built(cm, (ConvModule,), what)
    if reason is not None:
        return reason
    if tuple(cm.order)[:1] != ('conv',):
        return f'{what}.order={cm.order}'
    if cm.with_explicit_padding:
        return f'{what} pads explicitly'
    if getattr(cm, 'efficient_conv_bn_eval_forward', None) is not None:
        return f'{what} has efficient_conv_bn_eval on'
    return (conv_check or _conv1x1)(cm.conv, f'{what}.conv')


def _upsample_classes() -> tuple:
    from mmseg.models.utils import Upsample

    from ..models import CANNUpsample
    return (nn.Upsample, nn.UpsamplingBilinear2d, nn.UpsamplingNearest2d, Upsample,
            CANNUpsample)


def _upsample_module(module, what: str) -> Optional[str]:
    return _as_built(module, _upsample_classes(), what)


def _cls_seg(head) -> Optional[str]:
    """``BaseDecodeHead.cls_seg``: ``conv_seg(dropout(x))`` with a channel dropout."""
    dropout = head.dropout
    return _first(None if dropout is None else _as_built(dropout, (nn.Dropout2d,), 'dropout'),
                  _conv1x1(head.conv_seg, 'conv_seg'))


def _mode(mode, align_corners) -> Optional[str]:
    """None for the resize settings F.interpolate accepts (mmseg's resize passes them)."""
    if mode not in _MODES:
        return f'resize mode {mode!r}'
    if align_corners is not None and mode not in _ALIGNED_MODES:
        return f'align_corners={align_corners!r} with mode {mode!r} (F.interpolate raises)'
    return None


def _sequential(seq, what: str, last) -> Optional[str]:
    """An ``nn.Sequential`` (bypassed: its children run one by one) ending in ``last``."""
    reason = _as_built(seq, (nn.Sequential,), what)
    if reason is not None:
        return reason
    if len(seq) == 0:
        return f'{what} is empty'
    return last(seq[len(seq) - 1], f'{what}[{len(seq) - 1}]')


def _tensors(xs) -> bool:
    return all(isinstance(x, torch.Tensor) and x.dim() == 4 and x.is_floating_point()
               for x in xs)


# ----------------------------------------------------------------------------------
# the arithmetic
# ----------------------------------------------------------------------------------
def _plain_torch() -> bool:
    """A compiler or tracer records the call (and no mmseg_cann export routes the ops):
    the fused add's CPU kernel cannot be traced, its torch composition can."""
    return (torch.compiler.is_compiling() and not torch.compiler.is_exporting()) \
        or torch.jit.is_tracing()


def resize_size(size) -> tuple:
    """A size to resize to, as the resize is given it: ints, symbolic sizes unchanged,
    and the traced sizes ``torch.jit.trace`` records (an ``int()`` would fix them)."""
    if torch.jit.is_tracing():
        return tuple(size)
    return tuple(geo.size_value(s) for s in size)


def _resize(z, size, mode, align_corners):
    return upsample(z, size=resize_size(size), mode=mode, align_corners=align_corners)


def _resize_add(z, acc, mode, align_corners):
    """``acc + resize(z, size=acc.shape[-2:])`` (one pass where the fused op applies).
    While autograd records on the CPU, the ``'fast'`` backend's differentiable form of
    the fused op runs (its backward kernel sums the same products as PyTorch's in
    another order)."""
    if mode in _ADD_MODES and not _plain_torch() and z.dtype == acc.dtype:
        training = torch.is_grad_enabled() and (z.requires_grad or acc.requires_grad)
        backend = 'fast' if training and z.device.type == 'cpu' else 'auto'
        return upsample_add(z, acc, mode, align_corners, backend=backend)
    return acc + _resize(z, acc.shape[-2:], mode, align_corners)


def resized_sum(terms, size, mode, align_corners, bias=None) -> torch.Tensor:
    """``Σ_i resize(conv2d(x_i, W_i), size) + bias`` for ``terms = [(x_i, W_i)]`` of 1x1
    weights: each product at its input's resolution; terms already of ``size`` are not
    resized; the bias is added to the first product (interpolation weights sum to one)."""
    size = resize_size(size)
    # full-size first (sizes compared without specialising symbolic ones)
    terms = sorted(terms, key=lambda t: not geo.same_sizes(t[0].shape[-2:], size))
    acc = None
    for x, w in terms:
        z = pointwise(x, w, bias if acc is None else None)
        if geo.same_sizes(z.shape[-2:], size):
            acc = z if acc is None else acc + z
        elif acc is None:
            acc = _resize(z, size, mode, align_corners)
        else:
            acc = _resize_add(z, acc, mode, align_corners)
    return acc


def _after_conv(cm, y):
    """The layers of ConvModule ``cm`` after its conv, in its order (as its forward)."""
    for layer in tuple(cm.order)[1:]:
        if layer == 'norm' and cm.with_norm:
            y = cm.norm(y)
        elif layer == 'act' and cm.with_activation:
            y = cm.activate(y)
    return y


def conv_module_over_resized(cm, xs: Sequence[torch.Tensor], size, mode, align_corners):
    """``cm(cat([resize(x, size) for x in xs], 1))`` with the 1x1 conv at each input's
    resolution; None when the channels do not add up to the conv's (the caller then runs
    the unfused expression, which raises as mmseg does)."""
    weight = cm.conv.weight
    channels = [int(x.shape[1]) for x in xs]
    if sum(channels) != weight.shape[1]:
        return None
    terms = list(zip(xs, torch.split(weight, channels, dim=1)))
    return _after_conv(cm, resized_sum(terms, size, mode, align_corners, cm.conv.bias))


def _module_resize(module):
    """The ``resize`` the module's own code calls (mmseg's, or the routed one)."""
    return getattr(sys.modules[type(module).__module__], 'resize')


def _unfused(module, name, reason, *args):
    record_fallback(OP, reason, site=type(module).__name__)
    record_last_call(module, (f'composition: {reason}',))
    return getattr(type(module), name)(module, *args)


def _head_inputs(head, reason_of, inputs, method: str = 'forward'):
    """``(head._transform_inputs(inputs), None)`` when the rewritten ``method`` of decode
    head ``head`` may run (``reason_of(head)`` is None, no global module hooks, the
    transformed inputs are 4-D floating tensors); else ``(None, the class's own method's
    result)``, recorded as a fallback."""
    reason = _first(reason_of(head), _global_hooks_reason())
    if reason is not None:
        return None, _unfused(head, method, reason, inputs)
    xs = head._transform_inputs(inputs)
    if not _tensors(xs if isinstance(xs, (list, tuple)) else [xs]):
        return None, _unfused(head, method, 'inputs are not 4-D floating tensors', inputs)
    return xs, None


# ----------------------------------------------------------------------------------
# the sites
# ----------------------------------------------------------------------------------
def _segformer_reason(head):
    return _first(_conv_module(head.fusion_conv, 'fusion_conv'),
                  _mode(head.interpolate_mode, head.align_corners))


def _segformer_forward(self, inputs):
    """``SegformerHead.forward`` with ``fusion_conv``'s conv at each input's resolution."""
    inputs, unfused = _head_inputs(self, _segformer_reason, inputs)
    if unfused is not None:
        return unfused
    size = inputs[0].shape[2:]
    lows = [conv(x) for x, conv in zip(inputs, self.convs)]
    mode, align = self.interpolate_mode, self.align_corners
    out = conv_module_over_resized(self.fusion_conv, lows, size, mode, align)
    if out is None:
        resize = _module_resize(self)
        out = self.fusion_conv(torch.cat([resize(input=z, size=size, mode=mode,
                                                 align_corners=align) for z in lows], dim=1))
    return self.cls_seg(out)


def _ham_reason(head):
    return _first(_conv_module(head.squeeze, 'squeeze'), _mode('bilinear', head.align_corners))


def _ham_forward(self, inputs):
    """``LightHamHead.forward`` with ``squeeze``'s conv at each input's resolution."""
    inputs, unfused = _head_inputs(self, _ham_reason, inputs)
    if unfused is not None:
        return unfused
    x = conv_module_over_resized(self.squeeze, inputs, inputs[0].shape[2:], 'bilinear',
                                 self.align_corners)
    if x is None:
        return type(self).forward(self, inputs)
    x = self.hamburger(x)
    return self.cls_seg(self.align(x))


def _fcn_reason(head):
    if head.input_transform != 'resize_concat':
        return f'input_transform={head.input_transform!r} (no resize before convs)'
    if head.concat_input:
        return 'concat_input=True keeps the full-resolution concat'
    return _as_built(head.convs, (nn.Sequential,), 'convs') \
        or _conv_module(head.convs[0], 'convs[0]') or _mode('bilinear', head.align_corners)


def _fcn_forward(self, inputs):
    """``FCNHead.forward`` (``resize_concat``) with ``convs[0]``'s conv at each input's
    resolution."""
    reason = _first(_fcn_reason(self), _global_hooks_reason())
    if reason is not None:
        return _unfused(self, 'forward', reason, inputs)
    xs = [inputs[i] for i in self.in_index]
    if not _tensors(xs):
        return _unfused(self, 'forward', 'inputs are not 4-D floating tensors', inputs)
    y = conv_module_over_resized(self.convs[0], xs, xs[0].shape[2:], 'bilinear',
                                 self.align_corners)
    if y is None:
        return type(self).forward(self, inputs)
    for layer in list(self.convs)[1:]:
        y = layer(y)
    return self.cls_seg(y)


def _lraspp_reason(head):
    return _first(*[_conv_module(m, f'conv_ups[{i}]') for i, m in enumerate(head.conv_ups)],
                  _mode('bilinear', head.align_corners))


def _lraspp_forward(self, inputs):
    """``LRASPPHead.forward`` with each ``conv_ups[i]``'s conv on the low-resolution ``x``
    and on the lateral at its own resolution."""
    inputs, unfused = _head_inputs(self, _lraspp_reason, inputs)
    if unfused is not None:
        return unfused
    resize = _module_resize(self)
    x = inputs[-1]
    x = self.aspp_conv(x) * resize(self.image_pool(x), size=x.size()[2:], mode='bilinear',
                                   align_corners=self.align_corners)
    x = self.conv_up_input(x)
    for i in range(len(self.branch_channels) - 1, -1, -1):
        size = inputs[i].size()[2:]
        lateral = self.convs[i](inputs[i])
        y = conv_module_over_resized(self.conv_ups[i], [x, lateral], size, 'bilinear',
                                     self.align_corners)
        if y is None:
            y = self.conv_ups[i](torch.cat([resize(x, size=size, mode='bilinear',
                                                   align_corners=self.align_corners),
                                            lateral], 1))
        x = y
    return self.cls_seg(x)


def _interp_reason(module):
    seq = module.interp_upsample
    reason = _as_built(seq, (nn.Sequential,), 'interp_upsample')
    if reason is not None:
        return reason
    if len(seq) != 2:
        return f'interp_upsample has {len(seq)} layers'
    return _upsample_module(seq[0], 'interp_upsample[0] (with conv_first=True the conv '
                                    'already runs first)') \
        or _conv_module(seq[1], 'interp_upsample[1]')


def _interp_forward(self, x):
    """``InterpConv.forward`` with the 1x1 conv before the upsample, norm/act after it."""
    reason = _first(_interp_reason(self), _global_hooks_reason(),
                    None if _tensors([x]) else 'input is not a 4-D floating tensor')
    if reason is not None:
        return _unfused(self, 'forward', reason, x)
    up, cm = self.interp_upsample[0], self.interp_upsample[1]

    def run(t):
        return _after_conv(cm, up(cm.conv(t)))
    if self.with_cp and x.requires_grad:
        import torch.utils.checkpoint as cp
        return cp.checkpoint(run, x)
    return run(x)


def _fusion_block_reason(block):
    return _first(_conv_module(block.project, 'project'), _mode('bilinear', block.align_corners))


def _fusion_block_forward(self, *inputs):
    """DPT ``FeatureFusionBlock.forward`` with ``project``'s conv before the x2 resize."""
    reason = _first(_fusion_block_reason(self),
                    _global_hooks_reason(),
                    None if inputs and _tensors(inputs) else 'inputs are not 4-D floating tensors')
    if reason is not None:
        return _unfused(self, 'forward', reason, *inputs)
    resize = _module_resize(self)
    x = inputs[0]
    if len(inputs) == 2:
        res = inputs[1]
        if x.shape != res.shape:
            res = resize(res, size=(x.shape[2], x.shape[3]), mode='bilinear',
                         align_corners=False)
        x = x + self.res_conv_unit1(res)
    x = self.res_conv_unit2(x)
    z = resize(self.project.conv(x), scale_factor=2, mode='bilinear',
               align_corners=self.align_corners)
    return _after_conv(self.project, z)


def _same_upsample(modules) -> bool:
    keys = {(type(m), m.size, m.scale_factor, m.mode, m.align_corners,
             getattr(m, 'recompute_scale_factor', None)) for m in modules}
    return len(keys) == 1


def _mla_reason(head):
    reason = _first(*[_sequential(s, f'up_convs[{i}]', _upsample_module)
                      for i, s in enumerate(head.up_convs)])
    if reason is not None:
        return reason
    if not _same_upsample([s[len(s) - 1] for s in head.up_convs]):
        return 'the up_convs end in differently set upsamples'
    return _cls_seg(head)


def _mla_forward(self, inputs):
    """``SETRMLAHead.forward`` with ``cls_seg`` (dropout + 1x1) before the upsample: the
    up_convs' maps are concatenated at their common low resolution and upsampled once."""
    inputs, unfused = _head_inputs(self, _mla_reason, inputs)
    if unfused is not None:
        return unfused
    lows = []
    for x, up_conv in zip(inputs, self.up_convs):
        for layer in list(up_conv)[:-1]:
            x = layer(x)
        lows.append(x)
    ups = [s[len(s) - 1] for s in self.up_convs][:len(lows)]
    if not all(geo.same_sizes(t.shape[2:], lows[0].shape[2:]) for t in lows) or \
            sum(int(t.shape[1]) for t in lows) != self.conv_seg.in_channels:
        return self.cls_seg(torch.cat([up(t) for up, t in zip(ups, lows)], dim=1))
    return ups[0](self.cls_seg(torch.cat(lows, dim=1)))


def _fpn_head_reason(head):
    n = len(head.feature_strides)
    reason = _first(*[_sequential(head.scale_heads[i], f'scale_heads[{i}]', _upsample_module)
                      for i in range(1, min(n, len(head.scale_heads)))])
    return _first(reason, _cls_seg(head), _mode('bilinear', head.align_corners))


def _channel_mask(head, like):
    """The ``Dropout2d`` mask ``cls_seg`` would apply to a map like ``like`` (the same
    random draws: one per (sample, channel)), or None in eval mode / without dropout."""
    dropout = head.dropout
    if dropout is None or not dropout.training or dropout.p == 0:
        return None
    return dropout(like.new_ones(like.shape[:2] + (1, 1)))


def _fpn_head_forward(self, inputs):
    """``FPNHead.forward`` with ``cls_seg`` (channel dropout + 1x1) applied to each scale
    head's map before its last upsample; the class maps are summed at full size."""
    x, unfused = _head_inputs(self, _fpn_head_reason, inputs)
    if unfused is not None:
        return unfused
    output = self.scale_heads[0](x[0])
    lows = []
    for i in range(1, len(self.feature_strides)):
        h = x[i]
        layers = list(self.scale_heads[i])
        for layer in layers[:-1]:
            h = layer(h)
        lows.append((h, layers[-1]))
    if any(h.shape[1] != self.conv_seg.in_channels for h, _ in lows) or \
            output.shape[1] != self.conv_seg.in_channels:
        resize = _module_resize(self)
        for h, up in lows:
            output = output + resize(up(h), size=output.shape[2:], mode='bilinear',
                                     align_corners=self.align_corners)
        return self.cls_seg(output)
    mask = _channel_mask(self, output)
    weight, bias = self.conv_seg.weight, self.conv_seg.bias
    size = output.shape[2:]
    acc = pointwise(output if mask is None else output * mask, weight, bias)
    for h, up in lows:
        z = up(pointwise(h if mask is None else h * mask, weight))
        if not geo.same_sizes(z.shape[2:], size):
            acc = _resize_add(z, acc, 'bilinear', self.align_corners)
        else:
            acc = acc + z
    return acc


def _setr_up_reason(head):
    if len(head.up_convs) == 0:
        return 'no up_convs'
    return _first(_sequential(head.up_convs[len(head.up_convs) - 1], 'up_convs[-1]',
                              _upsample_module), _cls_seg(head))


def _setr_up_forward(self, x):
    """``SETRUPHead.forward`` with ``cls_seg`` before the last up_conv's upsample."""
    x, unfused = _head_inputs(self, _setr_up_reason, x)
    if unfused is not None:
        return unfused
    n, c, h, w = x.shape
    x = x.reshape(n, c, h * w).transpose(2, 1).contiguous()
    x = self.norm(x)
    x = x.transpose(1, 2).reshape(n, c, h, w).contiguous()
    convs = list(self.up_convs)
    for up_conv in convs[:-1]:
        x = up_conv(x)
    last = list(convs[-1])
    for layer in last[:-1]:
        x = layer(x)
    return last[-1](self.cls_seg(x))


_HEADS = 'mmseg.models.decode_heads'
#: every site of the 1x1 form in mmseg 1.2.2 that is rewritten (docs/resize_conv.md)
SITES: List[Site] = [
    Site(f'{_HEADS}.segformer_head.SegformerHead', 'fusion_conv',
         '1x1 ConvModule over cat of resized maps', 'forward', _segformer_reason,
         _segformer_forward),
    Site(f'{_HEADS}.ham_head.LightHamHead', 'squeeze',
         '1x1 ConvModule over cat of resized inputs', 'forward', _ham_reason, _ham_forward),
    Site(f'{_HEADS}.fcn_head.FCNHead', 'convs[0]',
         "1x1 ConvModule over resize_concat inputs", 'forward', _fcn_reason, _fcn_forward,
         lambda head: head.input_transform == 'resize_concat'),
    Site(f'{_HEADS}.lraspp_head.LRASPPHead', 'conv_ups[i]',
         '1x1 ConvModule over cat(resized x, lateral)', 'forward', _lraspp_reason,
         _lraspp_forward),
    Site('mmseg.models.backbones.unet.InterpConv', 'interp_upsample[1]',
         'upsample then 1x1 ConvModule', 'forward', _interp_reason, _interp_forward),
    Site(f'{_HEADS}.dpt_head.FeatureFusionBlock', 'project',
         'resize x2 then 1x1 ConvModule', 'forward', _fusion_block_reason,
         _fusion_block_forward),
    Site(f'{_HEADS}.setr_mla_head.SETRMLAHead', 'cls_seg',
         'dropout + 1x1 over cat of upsampled maps', 'forward', _mla_reason, _mla_forward),
    Site(f'{_HEADS}.fpn_head.FPNHead', 'cls_seg',
         'dropout + 1x1 after the sum of upsampled scale heads', 'forward', _fpn_head_reason,
         _fpn_head_forward),
    Site(f'{_HEADS}.setr_up_head.SETRUPHead', 'cls_seg',
         'dropout + 1x1 after the last upsample', 'forward', _setr_up_reason,
         _setr_up_forward),
]
