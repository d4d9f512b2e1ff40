"""The dynamic-export promise over every model config mmseg ships: each model (whole-image
logits) and its decode head alone, exported with ``dynamic=True`` at one size, is either
exact in onnxruntime at two other sizes -- one where the pyramid/pooling maps are
smaller than their bins, one where they are larger -- or refused with a ``ValueError``
naming the rule: at export, or at a size outside the graph's domain (where a size branch
of the model went otherwise than traced). Never a silently wrong graph, never an
onnxruntime crash.

``fuse_resize_conv`` is a parameter of the sweep (:data:`VARIANTS`), so a rewritten model
is swept the same way.
"""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mmseg_cann.fusion import fuse_resize_conv
from tests._model_sweep import NOT_BUILT, NOT_RUNNING, base_model_names, build_base_model

pytest.importorskip('onnxruntime')
pytest.importorskip('onnxscript')
from mmseg_cann.onnx import check_dynamic_domain, export_onnx  # noqa: E402
from mmseg_cann.onnx.export import run_onnx  # noqa: E402

#: traced (H, W), then the checked sizes: 1/8 maps 4x6 and 1/32 maps 1x2 (smaller than
#: PSP's 6 bins), then 1/8 maps 28x24 and 1/32 maps 7x6 (larger; 28 = 4*6+4, unequal bins)
TRACED = (64, 64)
CHECKED = [(32, 48), (224, 192)]
#: configs whose layers need larger inputs: (traced, checked). LRASPP's image pool is an
#: AvgPool2d(49, stride=(16, 20)) on the 1/8 map, so inputs start at 392 pixels.
SIZES = {'lraspp_m-v3-d8': ((392, 392), [(400, 456), (520, 392)])}
#: tools/export_onnx.py's --atol (whole models, float32)
ATOL = 1e-4


def _fused(model):
    if not fuse_resize_conv(model).resize_conv:
        pytest.skip('no fuse_resize_conv site in this model (the plain variant covers it)')
    return model


#: the sweep's variants: model transforms applied before export
VARIANTS = {'plain': lambda model: model, 'fuse_resize_conv': _fused}
#: the configs ``make test`` sweeps (each kind of size-dependent rule: pyramid and
#: adaptive pooling bins, ASPP's image pool, ceil-mode pools, the rewritten heads of
#: ``fuse_resize_conv``); ``MMSEG_CANN_FULL_SWEEP=1`` sweeps every config (1-2 hours on
#: the 2-core machine). SegFormer and DPT are refused at export (torch.export's guards
#: pin their batch), which tests/onnx/test_dynamic_domain.py covers in seconds.
CI_CONFIGS = ('apcnet_r50-d8', 'deeplabv3_r50-d8', 'pspnet_r50-d8', 'upernet_r50')
FULL_SWEEP = os.environ.get('MMSEG_CANN_FULL_SWEEP') == '1'
#: the rule names a refusal's message must contain one of
RULES = ('cannot be exported', 'came out with fixed')


class Logits(torch.nn.Module):
    """``(N, 3, H, W)`` -> ``(N, classes, H, W)``: mmseg's whole-image inference logits."""

    def __init__(self, segmentor):
        super().__init__()
        self.segmentor = segmentor

    def forward(self, x):
        out = self.segmentor._forward(x)
        out = out[0] if isinstance(out, (list, tuple)) else out
        return F.interpolate(out, size=x.shape[2:], mode='bilinear', align_corners=False)


class ModelAndHead(torch.nn.Module):
    """Both parts in one graph (one export per config): the whole-image logits of the
    image (input 0), and the decode head alone on its feature maps given as separate
    inputs, each with its own dynamic sizes."""

    def __init__(self, segmentor, with_head: bool):
        super().__init__()
        self.logits = Logits(segmentor)
        self.head = segmentor.decode_head if with_head else None

    def forward(self, image, *feats):
        if self.head is None:
            return self.logits(image)
        out = self.head(list(feats))  # a tuple for some heads (DANet's three maps)
        return (self.logits(image),) + (tuple(out) if isinstance(out, (tuple, list))
                                         else (out,))


def _image(hw, seed):
    return torch.randn((1, 3) + tuple(hw), generator=torch.Generator().manual_seed(seed))


def _head_inputs(segmentor, x):
    """The decode head's inputs for image ``x``, or None when they are not all 4-D maps."""
    with torch.no_grad():
        feats = segmentor.extract_feat(x)
    feats = list(feats) if isinstance(feats, (list, tuple)) else [feats]
    if not all(isinstance(f, torch.Tensor) and f.dim() == 4 for f in feats):
        return None
    return tuple(feats)


def _sweep_one(module, make_inputs, traced_hw=TRACED, checked=CHECKED):
    """Export ``module`` dynamically at ``traced_hw`` and run it at ``checked``. Returns
    ``('refused', message)`` or ``('exact', [(hw, max_abs or why not run)...])``, where a
    size outside the graph's domain (the sizes its size branches hold for,
    ``mmseg_cann.onnx.check_dynamic_domain``) is refused at that size with the guard; a
    wrong graph inside the domain or an onnxruntime failure fails the test."""
    traced = make_inputs(traced_hw, 0)
    try:
        proto = export_onnx(module, traced, dynamic=True)
    except ValueError as exc:
        assert any(rule in str(exc) for rule in RULES), exc
        return 'refused', str(exc)
    check_dynamic_domain(proto, [tuple(t.shape) for t in traced])  # holds where traced
    errors = []
    for k, hw in enumerate(checked):
        inputs = make_inputs(hw, k + 1)
        try:
            check_dynamic_domain(proto, [tuple(t.shape) for t in inputs])
        except ValueError as exc:
            assert 'outside the sizes this dynamic graph holds for' in str(exc), exc
            errors.append((hw, f'refused at this size: {exc}'))
            continue
        try:
            with torch.no_grad():
                expected = module(*inputs)
        except Exception as exc:  # noqa: BLE001 - the model's own size constraint
            errors.append((hw, f'PyTorch raises {type(exc).__name__}'))
            continue
        expected = expected if isinstance(expected, tuple) else (expected,)
        got = run_onnx(proto, [t.numpy() for t in inputs])
        err = 0.0
        for e, g in zip(expected, got):
            assert g.shape == tuple(e.shape), hw
            err = max(err, float(np.abs(g - e.numpy()).max()))
        assert err <= ATOL, (hw, err, [float(e.abs().max()) for e in expected])
        errors.append((hw, err))
    # checked at some size: exact, or refused by the graph's domain
    assert any(isinstance(e, float) or e.startswith('refused') for _, e in errors), errors
    return 'exact', errors


SWEPT = [n for n in base_model_names() if n not in NOT_BUILT and n not in NOT_RUNNING]
#: what this run sweeps
SWEEP = SWEPT if FULL_SWEEP else [n for n in SWEPT if n in CI_CONFIGS]


@pytest.mark.slow
@pytest.mark.skipif(not FULL_SWEEP, reason='builds every config: with the full sweep '
                    '(MMSEG_CANN_FULL_SWEEP=1)')
def test_configs_left_out_are_the_known_ones():
    """The configs left out of the sweep are exactly those that do not build or run
    (with the full sweep, which they are left out of)."""
    failing = {}
    for name in base_model_names():
        try:
            model = build_base_model(name)
        except Exception as exc:  # noqa: BLE001 - the reason is reported
            failing[name] = f'{type(exc).__name__}: {exc}'[:200]
            continue
        if name in NOT_RUNNING:
            with pytest.raises(Exception):
                Logits(model)(_image(TRACED, 0))
    assert set(failing) == set(NOT_BUILT), failing
    assert len(SWEPT) >= 43


def sweep_model(name: str, variant: str):
    """:func:`_sweep_one` of config ``name`` after ``VARIANTS[variant]``: its logits and,
    unless a cascade or fed other than 4-D maps, its decode head alone."""
    segmentor = VARIANTS[variant](build_base_model(name))
    traced_hw, checked = SIZES.get(name, (TRACED, CHECKED))
    with_head = (not isinstance(segmentor.decode_head, torch.nn.ModuleList)
                 and _head_inputs(segmentor, _image(traced_hw, 0)) is not None)

    def inputs(hw, seed):
        image = _image(hw, seed)
        return (image,) + (_head_inputs(segmentor, image) if with_head else ())
    # without the head, the logits alone (a model taking *feats with no feats would not
    # match torch.export's dynamic_shapes structure)
    module = ModelAndHead(segmentor, True) if with_head else Logits(segmentor)
    return _sweep_one(module.eval(), inputs, traced_hw, checked), with_head


@pytest.mark.slow
@pytest.mark.parametrize('variant', sorted(VARIANTS))
@pytest.mark.parametrize('name', SWEEP)
def test_dynamic_export_exact_or_refused(name, variant, record_property):
    (outcome, detail), with_head = sweep_model(name, variant)
    record_property('outcome', outcome)
    record_property('detail', detail)  # the refusal, or per checked size
    record_property('with_head', with_head)
