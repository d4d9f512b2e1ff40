"""fuse_resize_conv (mmseg_cann.fusion.resize_conv) on real mmseg heads and models: values
within the documented float32 bound of the unrewritten module, labels equal except at
near-ties, gradients, and the ways users break execution-changing paths (hooks,
subclasses, train/eval, edited attributes, state_dict, deepcopy, compile, unfuse)."""
import copy
import io

import pytest
import torch
import torch.nn.functional as F

from mmseg_cann import convert_model
from mmseg_cann.convert import restore_resize
from mmseg_cann.fusion import FusionReport, fuse_resize_conv, unfuse_model
from mmseg_cann.fusion.resize_conv import SITES, conv_module_over_resized
from mmseg_cann.utils import fallback_counts

from tests._helpers import load_config

BN = dict(type='BN', requires_grad=True)
SEGFORMER = 'mmseg::segformer/segformer_mit-b0_8xb2-160k_ade20k-512x512.py'
EPS = 2.0 ** -24


@pytest.fixture(autouse=True)
def _restore_routing():
    yield
    restore_resize()


def _feats(chs, sizes, n=2, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, c, h, w, generator=g) * scale for c, (h, w) in zip(chs, sizes)]


PYRAMID = [(16, 16), (8, 8), (4, 4), (2, 2)]
#: name -> (head config, input builder): one small instance of every rewritten head
HEADS = {
    'segformer': (dict(type='SegformerHead', in_channels=[8, 16, 24, 32], in_index=[0, 1, 2, 3],
                       channels=16, num_classes=5, norm_cfg=BN, dropout_ratio=0.1),
                  lambda s=1.0: _feats([8, 16, 24, 32], PYRAMID, scale=s)),
    'ham': (dict(type='LightHamHead', in_channels=[16, 24, 32], in_index=[1, 2, 3], channels=16,
                 ham_channels=16, num_classes=5, ham_kwargs=dict(MD_R=4),
                 norm_cfg=dict(type='GN', num_groups=4, requires_grad=True)),
            lambda s=1.0: _feats([8, 16, 24, 32], PYRAMID, scale=s)),
    'fcn_resize_concat': (dict(type='FCNHead', in_channels=[8, 16, 24, 32],
                               in_index=(0, 1, 2, 3), channels=80,
                               input_transform='resize_concat', kernel_size=1, num_convs=1,
                               concat_input=False, num_classes=5, norm_cfg=BN),
                          lambda s=1.0: _feats([8, 16, 24, 32], PYRAMID, scale=s)),
    'lraspp': (dict(type='LRASPPHead', in_channels=(16, 24, 96), in_index=(0, 1, 2),
                    channels=32, input_transform='multiple_select', num_classes=5,
                    norm_cfg=BN, branch_channels=(8, 16)),
               lambda s=1.0: _feats([16, 24, 96], [(256, 320), (128, 160), (64, 80)], n=1,
                                    scale=s)),
    'setr_mla': (dict(type='SETRMLAHead', in_channels=(16,) * 4, channels=32,
                      in_index=(0, 1, 2, 3), mla_channels=8, up_scale=4, num_classes=5,
                      norm_cfg=BN),
                 lambda s=1.0: _feats([16] * 4, [(8, 8)] * 4, scale=s)),
    'setr_up': (dict(type='SETRUPHead', in_channels=16, channels=8, in_index=0, num_classes=5,
                     num_convs=2, up_scale=2, kernel_size=3, norm_cfg=BN),
                lambda s=1.0: _feats([16], [(8, 8)], scale=s)),
    'dpt': (dict(type='DPTHead', in_channels=(16,) * 4, channels=8, embed_dims=16,
                 post_process_channels=[8, 8, 16, 16], num_classes=5, readout_type='project',
                 input_transform='multiple_select', in_index=(0, 1, 2, 3), norm_cfg=BN),
            lambda s=1.0: [[x, torch.randn(2, 16)] for x in _feats([16] * 4, [(8, 8)] * 4,
                                                                   scale=s)]),
    'uper': (dict(type='UPerHead', in_channels=[8, 16, 24, 32], in_index=[0, 1, 2, 3],
                  pool_scales=(1, 2, 3, 6), channels=16, num_classes=5, norm_cfg=BN),
             lambda s=1.0: _feats([8, 16, 24, 32], PYRAMID, scale=s)),
    'fpn_head': (dict(type='FPNHead', in_channels=[8, 8, 8, 8], in_index=[0, 1, 2, 3],
                      feature_strides=[4, 8, 16, 32], channels=8, num_classes=5,
                      norm_cfg=BN, dropout_ratio=0.3),
                 lambda s=1.0: _feats([8] * 4, PYRAMID, scale=s)),
    'unet': (dict(type='UNet', in_channels=3, base_channels=8, num_stages=3,
                  strides=(1, 1, 1), enc_num_convs=(1, 1, 1), dec_num_convs=(1, 1),
                  downsamples=(True, True), enc_dilations=(1, 1, 1), dec_dilations=(1, 1),
                  norm_cfg=BN, upsample_cfg=dict(type='InterpConv')),
             lambda s=1.0: _feats([3], [(32, 48)], scale=s)[0]),
}
EXPECTED = {'segformer': ['<root> (SegformerHead.fusion_conv)'],
            'ham': ['<root> (LightHamHead.squeeze)'],
            'fcn_resize_concat': ['<root> (FCNHead.convs[0])'],
            'lraspp': ['<root> (LRASPPHead.conv_ups[i])'],
            'setr_mla': ['<root> (SETRMLAHead.cls_seg)'],
            'setr_up': ['<root> (SETRUPHead.cls_seg)'],
            'dpt': [f'fusion_blocks.{i} (FeatureFusionBlock.project)' for i in range(4)],
            'fpn_head': ['<root> (FPNHead.cls_seg)'],
            'uper': ['<root> (UPerHead.fpn_bottleneck)'],
            'unet': [f'decoder.{i}.upsample (InterpConv.interp_upsample[1])' for i in range(2)]}


def _build(name, seed=0):
    from mmengine.registry import init_default_scope
    from mmseg.registry import MODELS
    init_default_scope('mmseg')
    torch.manual_seed(seed)
    module = MODELS.build(HEADS[name][0])
    module.init_weights()
    return module


def _out(module, inputs):
    out = module(inputs)
    return torch.cat([o.flatten() for o in out]) if isinstance(out, (list, tuple)) \
        else out


def _tol(ref):
    """Model-level tolerance: float32 rounding of sums over a few hundred channels,
    relative to the largest magnitude (the elementwise bound is tested per site)."""
    return dict(rtol=0, atol=float(ref.detach().abs().max()) * 512 * EPS + 1e-30)


@pytest.mark.parametrize('name', sorted(HEADS))
@pytest.mark.parametrize('mode', ['eval', 'train'])
def test_head_values_and_gradients(name, mode):
    plain = _build(name)
    fused = copy.deepcopy(plain)
    report = fuse_resize_conv(fused)
    assert report.resize_conv == EXPECTED[name] and report.skipped == []
    getattr(plain, mode)()
    getattr(fused, mode)()
    inputs = HEADS[name][1](1e3)  # large activations
    torch.manual_seed(1)  # same dropout masks
    ref = _out(plain, inputs)
    torch.manual_seed(1)
    got = _out(fused, inputs)
    torch.testing.assert_close(got, ref, **_tol(ref))
    g = torch.Generator().manual_seed(2)
    upstream = torch.randn(ref.shape, generator=g)
    (ref * upstream).sum().backward()
    (got * upstream).sum().backward()
    # a gradient that cancels to zero in arithmetic (a bias before a training-mode batch
    # norm) is rounding noise of the size of the largest gradients
    scale = max(float(p.grad.abs().max()) for p in plain.parameters() if p.grad is not None)
    for (n, p), (_, q) in zip(plain.named_parameters(), fused.named_parameters()):
        assert (p.grad is None) == (q.grad is None), n
        if p.grad is not None:
            torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=512 * EPS * scale), n
    if mode == 'train':  # running statistics updated alike (norm at full resolution)
        for (n, b), (_, c) in zip(plain.named_buffers(), fused.named_buffers()):
            if b.is_floating_point():
                torch.testing.assert_close(c, b, **_tol(b)), n


@pytest.mark.parametrize('mode', ['bilinear', 'nearest'])
@pytest.mark.parametrize('align', [False, True, None])
def test_site_within_elementwise_bound(mode, align):
    """|Δ| <= (K + 8)·2^-24·(|W|·up(|a|)) elementwise, K the conv's input channels."""
    from mmcv.cnn import ConvModule
    if mode == 'nearest' and align is not None:
        pytest.skip('F.interpolate rejects align_corners for nearest')
    torch.manual_seed(0)
    cm = ConvModule(4 * 64, 32, 1, bias=True, norm_cfg=None, act_cfg=None)
    xs = _feats([64] * 4, [(24, 40), (12, 20), (5, 7), (3, 3)], scale=1e4)
    size = (24, 40)
    ups = [F.interpolate(x, size=size, mode=mode, align_corners=align) for x in xs]
    with torch.no_grad():
        got = conv_module_over_resized(cm, xs, size, mode, align)
        ref = cm(torch.cat(ups, 1))
        bound = F.conv2d(torch.cat([F.interpolate(x.double().abs(), size=size, mode=mode,
                                                  align_corners=align) for x in xs], 1),
                         cm.conv.weight.double().abs(), cm.conv.bias.double().abs())
    k = cm.conv.in_channels
    assert ((got.double() - ref.double()).abs() <= (k + 8) * EPS * bound).all()


def _segmentor(base, seed=0):
    """mmseg's model of config ``base`` with random weights (BN for SyncBN)."""
    from mmengine.registry import init_default_scope
    from mmseg.registry import MODELS

    from mmseg_cann.utils.config import sync_bn_to_bn
    init_default_scope('mmseg')
    cfg = load_config(base).model
    cfg.pretrained = None
    cfg.backbone.pop('init_cfg', None)
    sync_bn_to_bn(cfg)
    torch.manual_seed(seed)
    model = MODELS.build(cfg)
    model.init_weights()
    return model


def test_segformer_model_labels_and_convert_report():
    plain = _segmentor(SEGFORMER).eval()
    model = convert_model(copy.deepcopy(plain), fuse_resize_conv=True)
    report = model.cann_conversion_report
    assert report.fusion.resize_conv == ['decode_head (SegformerHead.fusion_conv)']
    assert 'resize_conv fused at 1 site(s)' in str(report)
    x = torch.rand(1, 3, 64, 96) * 255
    with torch.no_grad():
        ref = plain._forward(x)
        got = model._forward(x)
    torch.testing.assert_close(got, ref, **_tol(ref))
    top2 = ref.topk(2, dim=1).values
    clear = (top2[:, 0] - top2[:, 1]) > 2 * _tol(ref)['atol']
    assert torch.equal(got.argmax(1)[clear], ref.argmax(1)[clear])
    assert clear.float().mean() > 0.99
    unfuse_model(model)
    with torch.no_grad():
        assert torch.equal(model._forward(x), ref) or torch.allclose(model._forward(x), ref)
    assert 'forward' not in model.decode_head.__dict__


def test_with_lean_predict_and_upsample_add():
    """With the other fusions: lean prediction (strip execution inside) gives mmseg's
    labels; UPerHead takes its rewrite (which fuses the top-down adds too)."""
    plain = _segmentor(SEGFORMER).eval()
    model = convert_model(copy.deepcopy(plain), fuse_resize_conv=True, lean_predict=True,
                          fuse_upsample_add=True)
    x = torch.rand(1, 3, 64, 96) * 255
    with torch.no_grad():
        ref = plain.predict(x)[0]
        got = model.predict(x)[0]
    logits = ref.seg_logits.data
    top2 = logits.topk(2, dim=0).values
    clear = (top2[0] - top2[1]) > 1e-4 * float(logits.abs().max())
    assert torch.equal(got.pred_sem_seg.data[0][clear], ref.pred_sem_seg.data[0][clear])
    head = _build('uper')
    report = convert_model(head, fuse_resize_conv=True, fuse_upsample_add=True,
                           resize=False).cann_conversion_report.fusion
    assert report.upsample_add == ['<root> (UPerHead._forward_feature)']
    assert report.resize_conv == ['<root> (UPerHead.fpn_bottleneck)']
    assert head._forward_feature.__func__.__name__ == '_uper_forward_feature'


def test_option_validated_and_off_by_default():
    plain = _build('segformer')
    with pytest.raises(TypeError, match='fuse_resize_conv'):
        convert_model(copy.deepcopy(plain), fuse_resize_conv='yes')
    model = convert_model(copy.deepcopy(plain), resize=False)
    assert 'forward' not in model.__dict__ and model.cann_conversion_report.fusion.resize_conv == []


def test_hooks_see_full_resolution_tensors():
    """A hook on a bypassed module registered after fusion: that call runs unfused and
    the hook sees the full-resolution concat; registered before: the site is skipped."""
    plain = _build('segformer').eval()
    fused = copy.deepcopy(plain)
    fuse_resize_conv(fused)
    inputs = HEADS['segformer'][1]()
    seen = []
    handle = fused.fusion_conv.conv.register_forward_hook(
        lambda m, i, o: seen.append(tuple(i[0].shape)))
    with torch.no_grad():
        got = fused(inputs)
        ref = plain(inputs)
    assert seen == [(2, 64, 16, 16)]
    assert torch.equal(got, ref)  # the class's own forward ran
    handle.remove()
    with torch.no_grad():
        fused(inputs)
    assert len(seen) == 1
    hooked = copy.deepcopy(plain)
    hooked.fusion_conv.register_forward_pre_hook(lambda m, i: None)
    report = fuse_resize_conv(hooked)
    assert report.resize_conv == [] and 'fusion_conv has hooks' in report.skipped[0]
    # global module hooks see every module call: unfused while one is registered
    calls = []
    handle = torch.nn.modules.module.register_module_forward_hook(
        lambda m, i, o: calls.append(type(m).__name__))
    try:
        with torch.no_grad():
            assert torch.equal(fused(inputs), ref)
    finally:
        handle.remove()
    assert 'Conv2d' in calls


def test_subclass_and_edited_attributes():
    from mmseg.models.decode_heads import SegformerHead

    class MyHead(SegformerHead):
        pass
    sub = MyHead(in_channels=[8, 16], in_index=[0, 1], channels=8, num_classes=3)
    report = fuse_resize_conv(torch.nn.Sequential(sub))
    assert report.resize_conv == [] and 'subclass' in report.skipped[0]
    plain = _build('segformer').eval()
    fused = copy.deepcopy(plain)
    fuse_resize_conv(fused)
    inputs = HEADS['segformer'][1]()
    # mmseg raises for nearest with align_corners=False (F.interpolate); so must we
    for m in (plain, fused):
        m.interpolate_mode = 'nearest'
    with pytest.raises(ValueError, match='align_corners'):
        plain(inputs)
    with pytest.raises(ValueError, match='align_corners'):
        fused(inputs)
    for m in (plain, fused):
        m.align_corners = None
    with torch.no_grad():
        torch.testing.assert_close(fused(inputs), plain(inputs))
    # a conv edited into a 3x3 after fusion: the class's forward runs, identical values
    for m in (plain, fused):
        m.interpolate_mode, m.align_corners = 'bilinear', False
        conv = m.fusion_conv.conv
        m.fusion_conv.conv = torch.nn.Conv2d(conv.in_channels, conv.out_channels, 3, padding=1,
                                             bias=False)
    fused.fusion_conv.conv.load_state_dict(plain.fusion_conv.conv.state_dict())
    with torch.no_grad():
        assert torch.equal(fused(inputs), plain(inputs))


def test_state_dict_deepcopy_reconvert_and_unfuse():
    plain = _build('segformer').eval()
    fused = copy.deepcopy(plain)
    fuse_resize_conv(fused)
    assert list(fused.state_dict()) == list(plain.state_dict())
    other = copy.deepcopy(plain)
    other.load_state_dict(fused.state_dict())
    twin = copy.deepcopy(fused)
    assert twin.forward.__self__ is twin  # bound to the copy
    buffer = io.BytesIO()
    torch.save(fused, buffer)  # a whole-model pickle keeps the rewrite
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    assert loaded.forward.__self__ is loaded
    again = fuse_resize_conv(twin)
    assert again.resize_conv == ['<root> (SegformerHead.fusion_conv)']
    inputs = HEADS['segformer'][1]()
    with torch.no_grad():
        ref = plain(inputs)
        for m in (fused, twin, loaded):
            torch.testing.assert_close(m(inputs), ref)
    assert unfuse_model(twin) == ['<root>']
    with torch.no_grad():
        assert torch.equal(twin(inputs), ref)


def test_torch_compile_matches():
    plain = _build('segformer').eval()
    fused = copy.deepcopy(plain)
    fuse_resize_conv(fused)
    inputs = HEADS['segformer'][1]()
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward
    compiled = torch.compile(fused, fullgraph=True, backend=backend)
    with torch.no_grad():
        torch.testing.assert_close(compiled(inputs), plain(inputs))
    # the rewritten form was traced: no concat, the fusion conv as four 1x1 slices
    targets = [str(n.target) for n in graphs[0].graph.nodes]
    assert not any('cat' in t for t in targets)
    assert sum('conv2d' in t for t in targets) == 4 + 4 + 1


def test_uper_torch_compile_fullgraph():
    """UPerHead's rewrite compiles whole (its resize_conv2d calls trace as the
    composition) with the plain head's values."""
    plain = _build('uper').eval()
    fused = copy.deepcopy(plain)
    fuse_resize_conv(fused)
    inputs = HEADS['uper'][1]()
    torch._dynamo.reset()
    compiled = torch.compile(fused, fullgraph=True, backend='eager')
    with torch.no_grad():
        ref = plain(inputs)
        torch.testing.assert_close(compiled(inputs), ref, **_tol(ref))


def test_unet_interp_conv_first_is_not_rewritten():
    from mmseg.models.backbones.unet import InterpConv
    block = InterpConv(8, 4, conv_first=True)
    report = fuse_resize_conv(block)
    assert report.resize_conv == [] and 'conv already runs first' in report.skipped[0]


def test_sites_table_resolves():
    from mmseg_cann.fusion import all_sites
    assert len(SITES) == 9 and len(all_sites()) == 10
    for site in all_sites():
        assert site.resolve().__name__ in site.cls
    assert isinstance(fuse_resize_conv(torch.nn.Conv2d(1, 1, 1)), FusionReport)


def test_heads_without_the_form_are_not_listed():
    """An FCNHead without resize_concat (every auxiliary head) is not a site."""
    from mmseg.models.decode_heads import FCNHead
    report = fuse_resize_conv(FCNHead(in_channels=8, channels=8, num_classes=2))
    assert report.resize_conv == [] and report.skipped == []


def test_uper_hooked_bottleneck_runs_unfused():
    """The kxk site: a hook on the bypassed bottleneck conv sees the concat."""
    plain = _build('uper').eval()
    fused = copy.deepcopy(plain)
    fuse_resize_conv(fused)
    inputs = HEADS['uper'][1]()
    seen = []
    fused.fpn_bottleneck.conv.register_forward_hook(lambda m, i, o: seen.append(i[0].shape))
    with torch.no_grad():
        assert torch.equal(fused(inputs), plain(inputs))
    assert seen == [(2, 64, 16, 16)]


def test_inputs_and_norms_users_break_it_with():
    """Norms without running statistics, inputs the rewrite does not take (3-D, integer),
    FX tracing and one instance shared by two models: the rewritten head gives what the
    unrewritten one gives (values, or the same kind of error)."""
    from tests._helpers import outcome
    cfg = dict(HEADS['segformer'][0], norm_cfg=dict(type='BN', track_running_stats=False))
    from mmengine.registry import init_default_scope
    from mmseg.registry import MODELS
    init_default_scope('mmseg')
    torch.manual_seed(0)
    plain = MODELS.build(cfg).eval()
    fused = copy.deepcopy(plain)
    assert fuse_resize_conv(fused).resize_conv == ['<root> (SegformerHead.fusion_conv)']
    inputs = HEADS['segformer'][1](100.0)
    with torch.no_grad():
        ref = plain(inputs)
        torch.testing.assert_close(fused(inputs), ref, **_tol(ref))
        for bad in ([x[0] for x in inputs], [x.long() for x in inputs]):
            want, got = outcome(lambda: plain(bad)), outcome(lambda: fused(bad))
            assert (want[1] is None) == (got[1] is None), (want, got)
            if want[1] is not None:
                assert type(got[1]) is type(want[1]), (want, got)
    traced_plain = outcome(lambda: torch.fx.symbolic_trace(plain))
    traced_fused = outcome(lambda: torch.fx.symbolic_trace(fused))
    assert (traced_plain[1] is None) == (traced_fused[1] is None), (traced_plain, traced_fused)
    if traced_fused[1] is None:
        with torch.no_grad():
            torch.testing.assert_close(traced_fused[0](inputs), ref, **_tol(ref))
    # one fused instance inside two containers, fused again through each: one rewrite
    a, b = torch.nn.ModuleList([fused]), torch.nn.ModuleList([fused])
    assert fuse_resize_conv(a).resize_conv == fuse_resize_conv(b).resize_conv
    assert fused._cann_fused == ('forward',)
    assert fused.forward.__self__ is fused
    with torch.no_grad():
        torch.testing.assert_close(b[0](inputs), ref, **_tol(ref))


#: inputs at sizes that are not multiples of the network's stride (whole-image inference
#: at any size), for the heads whose input sizes are free
ODD_PYRAMID = [(25, 33), (13, 17), (7, 9), (4, 5)]
ODD = {
    'segformer': lambda: _feats([8, 16, 24, 32], ODD_PYRAMID),
    'ham': lambda: _feats([8, 16, 24, 32], ODD_PYRAMID),
    'fcn_resize_concat': lambda: _feats([8, 16, 24, 32], ODD_PYRAMID),
    'uper': lambda: _feats([8, 16, 24, 32], ODD_PYRAMID),
    'fpn_head': lambda: _feats([8] * 4, ODD_PYRAMID),
    # its image pool is a 49x49 average pool: the last map must be at least that large
    'lraspp': lambda: _feats([16, 24, 96], [(99, 131), (51, 67), (51, 67)], n=1),
    'setr_mla': lambda: _feats([16] * 4, [(7, 9)] * 4),
    'setr_up': lambda: _feats([16], [(7, 9)]),
}


def _rewrite_fallbacks(before):
    return {k: v - before.get(k, 0) for k, v in fallback_counts().items()
            if k[0] in ('fuse_resize_conv', 'resize_conv2d') and v != before.get(k, 0)}


@pytest.mark.parametrize('name', sorted(ODD))
def test_any_input_size_and_empty_batch(name):
    """Odd sizes (maps of 25x33, 13x17, 7x9, 4x5): every site runs rewritten (no
    composition, nothing counted), within float32 rounding of the unrewritten head, and
    the report says what ran at the last call; an empty batch gives what the
    unrewritten head gives."""
    from tests._helpers import outcome
    plain = _build(name).eval()
    fused = copy.deepcopy(plain)
    report = fuse_resize_conv(fused)
    inputs = ODD[name]()
    before = dict(fallback_counts())
    with torch.no_grad():
        torch.manual_seed(1)  # the same random bases of LightHamHead's decomposition
        ref = _out(plain, inputs)
        torch.manual_seed(1)
        torch.testing.assert_close(_out(fused, inputs), ref, **_tol(ref))
    assert _rewrite_fallbacks(before) == {}
    last = report.last_calls()
    assert set(last) == {p.split(' (')[0] for p in report.resize_conv}
    ran = [m for methods in last.values() for m in methods]
    assert ran and not any(m.startswith('composition') for m in ran), last
    if name == 'uper':
        assert set(ran) <= {'conv2d (no resize)', 'mix_resize'} and 'mix_resize' in ran
    assert 'last call at' in str(report)
    empty = [x[:0] for x in inputs]
    with torch.no_grad():
        want, got = outcome(lambda: plain(empty)), outcome(lambda: fused(empty))
    assert (want[1] is None) == (got[1] is None), (want, got)
    if want[1] is None:
        assert _out(fused, empty).shape == _out(plain, empty).shape
    else:
        assert type(got[1]) is type(want[1]), (want, got)


def test_uper_jit_trace_is_size_generic():
    """``torch.jit.trace`` of a rewritten UPerHead traces (the composition is recorded
    for the kxk site, counted) and, like the unrewritten head's trace, gives the
    head's values at another input size."""
    plain = _build('uper').eval()
    fused = copy.deepcopy(plain)
    fuse_resize_conv(fused)
    inputs, odd = HEADS['uper'][1](), ODD['uper']()
    with torch.no_grad():
        traced = torch.jit.trace(fused, (inputs,), check_trace=False)
        traced_plain = torch.jit.trace(plain, (inputs,), check_trace=False)
        for feats in (inputs, odd):
            ref = plain(feats)
            torch.testing.assert_close(traced(feats), ref, **_tol(ref))
            torch.testing.assert_close(traced_plain(feats), ref, **_tol(ref))
