#!/usr/bin/env python
"""Export an mmseg model with the CANN ops to ONNX (for Ascend ATC), check and verify it.

    python tools/export_onnx.py CONFIG [CHECKPOINT] --shape H W --out FILE
        [--opset N] [--dynamic [--verify-shape H W ...]] [--verify] [--simplify]
        [--cfg-options k=v ...]

Builds the model from CONFIG (SyncBN as BN; without CHECKPOINT no pretrained weights are
downloaded and mmseg's initialisation is used, seeded), converts it with ``mmseg_cann.convert_model`` (CANN
modules, mmseg ``resize`` routed), exports the whole-image forward to logits at the
input size (``(1, 3, H, W)`` in, ``(1, num_classes, H, W)`` out: the decode head's
logits resized as mmseg's inference does), checks the graph with ``onnx.checker``,
prints the Resize/pool nodes with their attributes and, with ``--verify``, compares
onnxruntime (CPU) with PyTorch on random and synthetic inputs, exiting 1 beyond
``--atol`` or when the argmax agreement is below ``--min-agree`` (exit 2 when the model
cannot be exported exactly, with the reason). ``--simplify`` slims the graph with
onnxslim before it is saved and verified. ``--dynamic`` exports symbolic batch, height
and width (exact for every size, or exit 2 with the size-dependent rule that prevents
it) and ``--verify`` then also checks two other input sizes (or the
``--verify-shape`` ones). The config's
``CANNOpsHook`` (training/testing runtime) plays no part: the tool converts the model
itself and the export backend translates every CANN op.
"""
from __future__ import annotations

import argparse
import sys

import torch
from _common import add_cfg_options, load_config


class WholeImageLogits(torch.nn.Module):
    """``(N, 3, H, W)`` normalised image -> ``(N, classes, H, W)`` logits (eval mode)."""

    def __init__(self, segmentor):
        super().__init__()
        self.segmentor = segmentor

    def forward(self, inputs):
        from mmseg.models.utils import resize
        seg = self.segmentor
        logits = seg._forward(inputs)
        if isinstance(logits, (list, tuple)):
            logits = logits[0]
        head = seg.decode_head
        return resize(logits, size=inputs.shape[2:], mode='bilinear',
                      align_corners=head.align_corners, warning=False)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('config')
    parser.add_argument('checkpoint', nargs='?', default=None)
    parser.add_argument('--shape', nargs=2, type=int, required=True, metavar=('H', 'W'))
    parser.add_argument('--out', required=True, help='output .onnx file')
    parser.add_argument('--opset', type=int, default=18)
    parser.add_argument('--dynamic', action='store_true',
                        help='dynamic batch/height/width (--verify checks two more sizes)')
    parser.add_argument('--verify-shape', nargs=2, type=int, action='append', default=None,
                        metavar=('H', 'W'), dest='verify_shapes',
                        help='with --dynamic --verify: an input size to verify besides '
                             '--shape (repeatable; default: H+32 x W-32 (batch 2) and '
                             'H+16 x W+48)')
    parser.add_argument('--verify', action='store_true')
    parser.add_argument('--simplify', action='store_true',
                        help='slim the graph with onnxslim (verified like the export)')
    parser.add_argument('--atol', type=float, default=1e-4)
    parser.add_argument('--min-agree', type=float, default=0.999)
    add_cfg_options(parser)
    return parser.parse_args(argv)


def build_model(config: str, checkpoint=None, cfg_options=None):
    """The converted segmentor (eval mode) wrapped in :class:`WholeImageLogits`."""
    from mmengine.registry import init_default_scope
    from mmseg.registry import MODELS

    import mmseg_cann
    from mmseg_cann.utils.config import sync_bn_to_bn
    cfg = load_config(config, cfg_options)
    init_default_scope(cfg.get('default_scope', 'mmseg'))
    sync_bn_to_bn(cfg.model)  # SyncBN has no single-process CPU forward
    if not checkpoint:
        _no_pretrained(cfg.model)
    model = MODELS.build(cfg.model)
    if checkpoint:
        from mmengine.runner import load_checkpoint
        load_checkpoint(model, checkpoint, map_location='cpu')
    else:
        # mmseg's own initialisation (seeded): realistic activations for --verify
        torch.manual_seed(0)
        _quiet_init(model)
    model.eval()
    mmseg_cann.convert_model(model)
    return WholeImageLogits(model).eval()


def _no_pretrained(model_cfg) -> None:
    """Without CHECKPOINT nothing is downloaded: drop ``pretrained`` and the backbone's
    ``Pretrained`` ``init_cfg`` (the shipped configs start from ImageNet weights)."""
    model_cfg['pretrained'] = None
    backbone = model_cfg.get('backbone')
    if isinstance(backbone, dict):
        init_cfg = backbone.get('init_cfg')
        if isinstance(init_cfg, dict) and init_cfg.get('type') == 'Pretrained':
            backbone.pop('init_cfg')


def _quiet_init(model) -> None:
    """``model.init_weights()`` without mmengine's per-parameter info log."""
    import logging

    from mmengine.logging import MMLogger
    logger = MMLogger.get_current_instance()
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        model.init_weights()
    finally:
        logger.setLevel(level)


def verification_inputs(shape, seed=0):
    """Random normal input and a synthetic one (smooth gradients plus blocks)."""
    gen = torch.Generator().manual_seed(seed)
    n, c, h, w = shape
    random = torch.randn(shape, generator=gen)
    yy, xx = torch.meshgrid(torch.linspace(-2, 2, h), torch.linspace(-2, 2, w), indexing='ij')
    blocks = ((torch.arange(h)[:, None] // max(h // 4, 1) + torch.arange(w)[None] //
               max(w // 4, 1)) % 2).float() * 2 - 1
    synthetic = torch.stack([xx, yy, blocks]).expand(n, 3, h, w)[:, :c].contiguous()
    return [random, synthetic]


def dynamic_verification_shapes(h, w, given=None):
    """Input shapes, besides the traced ``(1, 3, h, w)``, at which a dynamic export is
    verified: ``given`` ``(H, W)`` pairs (batch 1), or by default ``(2, 3, h + 32,
    w - 32)`` (``w + 32`` when ``w <= 64``) and ``(1, 3, h + 16, w + 48)``: another
    batch and sizes that keep a multiple of 16 (UNet's constraint) but change the
    divisibility of PSPNet's pyramid bins."""
    if given:
        return [(1, 3, int(a), int(b)) for a, b in given]
    return [(2, 3, h + 32, w - 32 if w > 64 else w + 32), (1, 3, h + 16, w + 48)]


def main(argv=None) -> int:
    args = parse_args(argv)
    from mmseg_cann.onnx import export_onnx, node_summary, verify_onnx
    model = build_model(args.config, args.checkpoint, args.cfg_options)
    h, w = args.shape
    example = torch.randn(1, 3, h, w)
    try:
        proto = export_onnx(model, example, args.out, opset=args.opset,
                            dynamic=args.dynamic, output_names=['logits'],
                            simplify=args.simplify)
    except ValueError as exc:  # an unexportable op or setting, explained
        print(f'export failed: {exc}', file=sys.stderr)
        return 2
    if args.dynamic:
        from mmseg_cann.onnx.export import dynamic_dims
        print('dynamic input dims (N, C, H, W): ' + '; '.join(
            str(d) for d in dynamic_dims(proto)))
    print(f'exported {args.out} (opset {args.opset}, '
          f'{"dynamic" if args.dynamic else "fixed"} shape, '
          f'{"simplified with onnxslim, " if args.simplify else ""}'
          f'{len(proto.graph.node)} nodes); onnx.checker: ok')
    print('Resize / pooling nodes:')
    for line in node_summary(proto):
        print('  ' + line)
    if not args.verify:
        return 0
    shapes = [(1, 3, h, w)]
    if args.dynamic:
        shapes += dynamic_verification_shapes(h, w, args.verify_shapes)
    ok = True
    for shape in shapes:
        for name, x in zip(('random', 'synthetic'), verification_inputs(shape)):
            try:
                (r,) = verify_onnx(proto, model, [x])
            except Exception as exc:  # PyTorch or onnxruntime rejects this size
                ok = False
                print(f'verify {name:<9} input {tuple(shape)}: FAILED ({type(exc).__name__}: '
                      f'{str(exc).strip().splitlines()[0] if str(exc).strip() else ""})')
                continue
            good = r['max_abs'] <= args.atol and r['argmax_agree'] >= args.min_agree
            ok &= good
            print(f'verify {name:<9} input {tuple(shape)}: max abs error {r["max_abs"]:.3g}, '
                  f'argmax agreement {100 * r["argmax_agree"]:.4f}% '
                  f'{"ok" if good else "FAILED"}')
    print('verification ' + ('passed' if ok else f'FAILED (atol {args.atol}, min agreement '
                                                  f'{args.min_agree})'))
    return 0 if ok else 1


if __name__ == '__main__':
    sys.exit(main())
