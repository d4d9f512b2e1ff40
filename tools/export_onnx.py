#!/usr/bin/env python
"""Export an mmseg model with the CANN ops to ONNX (for Ascend ATC), check and verify it.

    python tools/export_onnx.py CONFIG [CHECKPOINT] --shape H W --out FILE
        [--target onnx|atc] [--atc SOC [--gears H,W ...]] [--opset N]
        [--dynamic [--verify-shape H W ...]] [--verify] [--simplify]
        [--cfg-options k=v ...]

Builds the model from CONFIG (SyncBN as BN; without CHECKPOINT no pretrained weights are
downloaded and mmseg's initialisation is used, seeded), converts it with
``mmseg_cann.convert_model`` (CANN modules, mmseg ``resize`` routed), exports the
whole-image forward to logits at the input size (``(1, 3, H, W)`` in,
``(1, num_classes, H, W)`` out: the decode head's logits resized as mmseg's inference
does), checks the graph with ``onnx.checker``,
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

``--target atc`` writes only node forms whose meaning Ascend's ATC compiler keeps
(fixed shapes; ``--gears`` exports one graph per size) and ``--verify`` then runs the
graph as ATC's parser reads it (``mmseg_cann.onnx.atc_reading``). ``--atc SOC`` (e.g.
``Ascend910B``) names the graph's nodes, writes ``<out>.keep_dtype.txt`` beside the model
(the nodes that average, so ATC's default ``force_fp16`` keeps them in fp32 as the
precision policy's ``avg='fp32'`` does), lists nodes ATC would run on the AI CPU and
prints the ``atc`` command; with ``--dynamic`` the command uses
``--dynamic_image_size`` with the ``--gears`` sizes, and ``--verify`` reads the graph as
ATC does at each gear. See docs/deploying_to_ascend.md.
"""
from __future__ import annotations

import argparse
import sys

import torch
from _common import (add_cfg_options, add_debug, check_checkpoint, check_output,
                     check_shape, load_config, quiet_init_weights, required_multiple, run)


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
    parser.add_argument('--target', choices=['onnx', 'atc'], default='onnx',
                        help="'atc': only forms ATC reads as PyTorch computes (default onnx)")
    parser.add_argument('--atc', metavar='SOC',
                        help='print the ATC command for this --soc_version and write the '
                             'keep_dtype file (e.g. Ascend910B)')
    parser.add_argument('--gears', nargs='+', type=_gear, metavar='H,W',
                        help='input sizes: ATC gears with --dynamic, one export each with '
                             '--target atc')
    parser.add_argument('--atol', type=float, default=1e-4)
    parser.add_argument('--min-agree', type=float, default=0.999)
    add_cfg_options(parser)
    add_debug(parser)
    return parser.parse_args(argv)


def _gear(text: str):
    try:
        h, w = (int(v) for v in text.split(','))
    except ValueError:
        raise argparse.ArgumentTypeError(f'a gear is H,W (two positive integers), got {text!r}')
    if h < 1 or w < 1:
        raise argparse.ArgumentTypeError(f'a gear is H,W (two positive integers), got {text!r}')
    return h, w


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
        # seeded before the build: constructors initialise the layers that mmseg's
        # init_weights leaves alone, so every process builds the same weights
        torch.manual_seed(0)
    model = MODELS.build(cfg.model)
    if checkpoint:
        from mmengine.runner import load_checkpoint
        load_checkpoint(model, checkpoint, map_location='cpu')
    else:
        # mmseg's own initialisation: realistic activations for --verify
        quiet_init_weights(model)
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


def avg_precision(cfg):
    """The ``avg`` precision the model runs with: the policy with the config's
    ``CANNOpsHook`` settings applied (as the hook and ``mmseg_cann.apis`` apply them)."""
    from mmseg_cann import get_precision_policy
    from mmseg_cann.apis import cann_settings
    settings = cann_settings(cfg)
    return get_precision_policy().updated(settings['pool_precision'],
                                          settings['upsample_precision']).avg


def export_one(args, model, shape, out):
    """Export at ``shape``; returns the ModelProto, or None after printing the refusal."""
    from mmseg_cann.onnx import export_onnx
    try:
        return export_onnx(model, torch.randn(shape), out, opset=args.opset,
                           dynamic=args.dynamic, output_names=['logits'],
                           simplify=args.simplify, target=args.target)
    except ValueError as exc:  # an unexportable op or setting, explained
        print(f'export failed: {exc}', file=sys.stderr)
        return None


def report_atc(args, cfg, proto, out, shape) -> None:
    """Name nodes, write the keep_dtype file, warn about AI CPU nodes, print the command."""
    import os

    import onnx

    from mmseg_cann.onnx.atc import ai_cpu_nodes, atc_command, keep_dtype_nodes, name_nodes
    name_nodes(proto)
    onnx.save(proto, out)
    keep_file = None
    if avg_precision(cfg) == torch.float32:
        keep = keep_dtype_nodes(proto)
        if keep:
            keep_file = os.path.splitext(out)[0] + '.keep_dtype.txt'
            with open(keep_file, 'w') as f:
                f.write('\n'.join(keep) + '\n')
            print(f'wrote {keep_file}: {len(keep)} averaging node(s) kept in fp32 under '
                  "ATC's force_fp16 (the precision policy's avg='fp32')")
    for line in ai_cpu_nodes(proto):
        print('warning: ' + line)
    gears = args.gears if args.dynamic else None
    stem = os.path.splitext(out)[0]
    print('ATC command:')
    print('  ' + atc_command(out, stem, args.atc, proto.graph.input[0].name, shape,
                             keep_dtype_file=keep_file, gears=gears))


def check_arguments(args):
    """User mistakes, before the model is built: config, checkpoint, sizes, output;
    returns the config."""
    cfg = load_config(args.config, args.cfg_options)
    if args.checkpoint:
        check_checkpoint(args.checkpoint)
    multiple = required_multiple(cfg.model)
    check_shape(args.shape, multiple)
    for gear in args.gears or []:
        check_shape(gear, multiple, '--gears')
    for shape in args.verify_shapes or []:
        check_shape(shape, multiple, '--verify-shape')
    check_output(args.out, '--out')
    return cfg


def main(argv=None) -> int:
    args = parse_args(argv)
    from mmseg_cann.onnx import node_summary
    cfg = check_arguments(args)
    model = build_model(args.config, args.checkpoint, args.cfg_options)
    if args.gears and not (args.dynamic or args.target == 'atc'):
        print('export failed: --gears needs --dynamic (ATC gears of one dynamic graph) or '
              '--target atc (one fixed-shape graph per gear)', file=sys.stderr)
        return 2
    if args.dynamic and args.gears and not args.atc:
        print('export failed: --gears with --dynamic is for the ATC command; add --atc SOC',
              file=sys.stderr)
        return 2
    exports = [((1, 3, *args.shape), args.out)]
    if args.target == 'atc' and args.gears:
        import os
        stem, ext = os.path.splitext(args.out)
        exports = [((1, 3, gh, gw), f'{stem}_{gh}x{gw}{ext}') for gh, gw in args.gears]
    ok = True
    for shape, out in exports:
        proto = export_one(args, model, shape, out)
        if proto is None:
            return 2
        if args.dynamic:
            from mmseg_cann.onnx.export import dynamic_dims
            print('dynamic input dims (N, C, H, W): ' + '; '.join(
                str(d) for d in dynamic_dims(proto)))
            print_domain(proto)
        print(f'exported {out} (target {args.target}, opset {args.opset}, '
              f'{"dynamic" if args.dynamic else "fixed"} shape, '
              f'{"simplified with onnxslim, " if args.simplify else ""}'
              f'{len(proto.graph.node)} nodes); onnx.checker: ok')
        print('Resize / pooling nodes:')
        for line in node_summary(proto):
            print('  ' + line)
        if args.atc:
            report_atc(args, cfg, proto, out, shape)
        if args.verify:
            ok &= verify(args, model, proto, shape)
    if args.verify:
        print('verification ' + ('passed' if ok else f'FAILED (atol {args.atol}, min '
                                                      f'agreement {args.min_agree})'))
    return 0 if ok else 1


def print_domain(proto) -> None:
    """The sizes the dynamic graph holds for (the conditions torch.export recorded on the
    input sizes; stored in the graph, checked by mmseg_cann's runners, not by
    onnxruntime or ATC themselves)."""
    from mmseg_cann.onnx.dynamic_domain import read_domain
    domain = read_domain(proto)
    conditions = domain.conditions() if domain is not None else []
    if not conditions:
        print('dynamic domain: every size (no condition on the input sizes)')
        return
    print('dynamic domain: the graph holds where all of these hold (outside them it '
          'computes the traced branch; mmseg_cann.onnx.check_dynamic_domain checks a '
          'size, onnxruntime and ATC do not):')
    for line in conditions:
        print('  ' + line)


def verify(args, model, proto, shape) -> bool:
    """Compare onnxruntime with PyTorch (as ATC reads the graph with --target atc or
    --atc) at the export's size and, for a dynamic graph, more sizes."""
    from mmseg_cann.onnx import verify_onnx
    reading = 'atc' if (args.target == 'atc' or args.atc) else 'onnx'
    shapes = [shape]
    if args.dynamic:
        h, w = shape[2:]
        shapes += ([(1, 3, gh, gw) for gh, gw in args.gears] if args.gears else
                   dynamic_verification_shapes(h, w, args.verify_shapes))
    ok = True
    for size in shapes:
        for name, x in zip(('random', 'synthetic'), verification_inputs(size)):
            label = f'verify {name:<9} input {tuple(size)}' + (
                ' (as ATC reads it)' if reading == 'atc' else '')
            try:
                (r,) = verify_onnx(proto, model, [x], target=reading)
            except Exception as exc:  # PyTorch, onnxruntime or ATC's reading rejects it
                ok = False
                print(f'{label}: FAILED ({type(exc).__name__}: '
                      f'{str(exc).strip().splitlines()[0] if str(exc).strip() else ""})')
                continue
            good = r['max_abs'] <= args.atol and r['argmax_agree'] >= args.min_agree
            ok &= good
            print(f'{label}: max abs error {r["max_abs"]:.3g}, argmax agreement '
                  f'{100 * r["argmax_agree"]:.4f}% {"ok" if good else "FAILED"}')
    return ok


if __name__ == '__main__':
    sys.exit(run(main, 'export_onnx'))
