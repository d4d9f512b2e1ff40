#!/usr/bin/env python
"""Int8 post-training quantization of an mmseg model with the CANN ops (onnxruntime, and
the AMCT hand-off for Ascend).

    python tools/quantize.py CONFIG [CHECKPOINT] --out-dir DIR [--shape H W]
        [--target onnx|atc] [--atc SOC] [--dynamic] [--calib-num N]
        [--calib-split train|val|test] [--calib-random]
        [--method minmax|percentile|entropy] [--activation-type int8|uint8]
        [--exclude NODE ...]
        [--quantize-resize-matrices] [--eval [--eval-num N]] [--cfg-options k=v ...]

1. exports the model as ``tools/export_onnx.py`` does (same model, same graph for the
   target and shape): ``DIR/model_fp32.onnx``; ``--shape`` defaults to the fixed scale
   of the config's test pipeline (the demo's 96x96);
2. calibrates on N images (default 32) of the split's dataset through the config's test
   pipeline (resizing to the shape) and the segmentor's data preprocessor -- the tensors
   the model sees -- or, with ``--calib-random``, on seeded standard-normal inputs;
3. quantizes with onnxruntime (``mmseg_cann.onnx.quantize_model``: QDQ, symmetric
   per-channel int8 weights, per-tensor int8 activations), keeping the interpolation and
   bin-averaging matrices and pooling divisors in float by the rule of
   ``mmseg_cann.onnx.quant_rules`` (``--quantize-resize-matrices`` quantizes the matrices
   too; ``--exclude`` keeps more nodes float): ``DIR/model_int8.onnx``;
4. with ``--eval``: PyTorch fp32, ONNX fp32 and ONNX int8 through mmseg's ``IoUMetric``
   on ``--eval-num`` validation images, the label agreement and the activations that lose
   most to quantization;
5. with ``--target atc --atc SOC``: ``DIR/amct/`` for Ascend's AMCT on a CANN machine
   (quantization config with ``skip_layers``, calibration batch as .bin files, the AMCT
   and ATC command lines) and an onnxruntime emulation of AMCT's rules;
6. writes ``DIR/quant_report.json`` and prints a short table.

User errors (a bad count, a checkpoint of another model, a missing split or data root, a
shape the model cannot take, an unknown --exclude node, --target atc with --dynamic...)
exit 2 with one line; files are written to a staging folder and moved into DIR only
when everything succeeded, so nothing half-written is left there. See
docs/quantization.md.
"""
from __future__ import annotations

import argparse
import json
import os
import os.path as osp
import shutil
import sys
import tempfile

import torch
from _common import (UserError, add_cfg_options, add_debug, check_checkpoint, check_data,
                     check_shape, load_config, required_multiple, run)

DEFAULT_CALIB_NUM = 32
DEFAULT_EVAL_NUM = 16
#: images of the calibration set that the loss debugging runs on (it keeps every
#: intermediate tensor of both graphs in memory)
LOSS_DEBUG_IMAGES = 2


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('config')
    parser.add_argument('checkpoint', nargs='?', default=None)
    parser.add_argument('--out-dir', required=True, help='folder of the outputs')
    parser.add_argument('--shape', nargs=2, type=int, metavar=('H', 'W'),
                        help="input size (default: the test pipeline's fixed scale)")
    parser.add_argument('--target', choices=['onnx', 'atc'], default='onnx')
    parser.add_argument('--atc', metavar='SOC', help='with --target atc: the AMCT hand-off '
                        'and ATC command for this --soc_version (e.g. Ascend310P3)')
    parser.add_argument('--dynamic', action='store_true',
                        help='dynamic batch/height/width graph (--target onnx only)')
    parser.add_argument('--opset', type=int, default=18)
    parser.add_argument('--calib-num', type=int, default=DEFAULT_CALIB_NUM)
    parser.add_argument('--calib-split', choices=['train', 'val', 'test'], default='train')
    parser.add_argument('--calib-random', action='store_true',
                        help='seeded standard-normal calibration inputs (no dataset)')
    parser.add_argument('--method', choices=['minmax', 'percentile', 'entropy'],
                        default='minmax', help='activation range calibration')
    parser.add_argument('--activation-type', choices=['int8', 'uint8'], default='int8',
                        help="activations' 8-bit type (uint8: onnxruntime's advice for x86 "
                             'CPUs without VNNI)')
    parser.add_argument('--exclude', nargs='+', default=[], metavar='NODE',
                        help='node names of model_fp32.onnx to keep in float')
    parser.add_argument('--quantize-resize-matrices', action='store_true',
                        help='quantize the interpolation/bin-averaging matrices too')
    parser.add_argument('--eval', action='store_true',
                        help='mIoU of PyTorch fp32, ONNX fp32 and int8 on the val set')
    parser.add_argument('--eval-num', type=int, default=DEFAULT_EVAL_NUM)
    parser.add_argument('--top', type=int, default=5,
                        help='with --eval: how many of the most lossy activations to list')
    add_cfg_options(parser)
    add_debug(parser)
    return parser.parse_args(argv)


def check_arguments(args):
    """User mistakes, before any work: returns ``(cfg, (H, W))``."""
    from mmseg_cann.onnx.calibration import fixed_test_size
    for name, value in (('--calib-num', args.calib_num), ('--eval-num', args.eval_num),
                        ('--top', args.top)):
        if value < 1:
            raise UserError(f'{name} must be a positive number of images, got {value}')
    if args.atc and args.target != 'atc':
        raise UserError('--atc SOC is the AMCT/ATC hand-off of --target atc; add '
                        '--target atc')
    if args.dynamic and args.target == 'atc':
        raise UserError('--target atc exports fixed shapes (ATC compiles one graph per '
                        'input size): drop --dynamic, or use --target onnx')
    cfg = load_config(args.config, args.cfg_options)
    if args.checkpoint:
        check_checkpoint(args.checkpoint)
    shape = tuple(args.shape) if args.shape else fixed_test_size(cfg)
    if shape is None:
        raise UserError("--shape H W is required: the config's test pipeline has no fixed "
                        'scale to take it from')
    check_shape(shape, required_multiple(cfg.model))
    splits = [] if args.calib_random else [args.calib_split]
    if args.eval:
        splits.append('val')
    for split in splits:
        if not cfg.get(f'{split}_dataloader'):
            raise UserError(f'the config has no {split}_dataloader (asked for by '
                            f'{"--eval" if split == "val" and args.eval else "--calib-split"})'
                            + ('; use --calib-random for inputs without a dataset'
                               if not args.eval else ''))
        check_data(cfg, [f'{split}_dataloader'])
    parent = osp.dirname(osp.abspath(args.out_dir))
    if osp.exists(args.out_dir) and not osp.isdir(args.out_dir):
        raise UserError(f'--out-dir {args.out_dir!r} exists and is not a folder')
    if not osp.isdir(parent) or not os.access(parent, os.W_OK):
        raise UserError(f'--out-dir {args.out_dir!r}: its parent folder {parent!r} does not '
                        'exist or is not writable')
    return cfg, shape


def check_checkpoint_fits(config, checkpoint, cfg_options) -> None:
    """UserError when the checkpoint's weights are not those of the config's model
    (missing or unexpected keys, other shapes), naming a few."""
    from mmengine.registry import init_default_scope
    from mmseg.registry import MODELS

    from mmseg_cann.utils.config import sync_bn_to_bn
    cfg = load_config(config, cfg_options)
    init_default_scope(cfg.get('default_scope', 'mmseg'))
    sync_bn_to_bn(cfg.model)
    cfg.model['pretrained'] = None
    own = MODELS.build(cfg.model).state_dict()
    content = torch.load(checkpoint, map_location='cpu', weights_only=True)
    state = content.get('state_dict', content)
    state = {k[len('module.'):] if k.startswith('module.') else k: v
             for k, v in state.items()}
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    shapes = [k for k in own if k in state and hasattr(state[k], 'shape')
              and tuple(state[k].shape) != tuple(own[k].shape)]
    if missing or unexpected or shapes:
        parts = [f'{len(v)} {label} (e.g. {v[0]})' for label, v in (
            ('missing', missing), ('unexpected', unexpected), ('of another shape', shapes))
            if v]
        raise UserError(f'checkpoint {checkpoint!r} is not a checkpoint of the model of '
                        f'{config!r}: keys ' + ', '.join(parts))


def export(args, cfg, model, shape, folder):
    """Export ``model_fp32.onnx`` (nodes named) into ``folder``; returns the proto."""
    import onnx

    from mmseg_cann.onnx import export_onnx
    from mmseg_cann.onnx.atc import name_nodes
    out = osp.join(folder, 'model_fp32.onnx')
    try:
        proto = export_onnx(model, torch.randn((1, 3) + tuple(shape)), None,
                            opset=args.opset, dynamic=args.dynamic, output_names=['logits'],
                            target=args.target)
    except ValueError as exc:  # an op or setting without an exact form, explained
        raise UserError(f'export failed: {exc}') from exc
    name_nodes(proto)
    onnx.save(proto, out)
    print(f'exported {out} (target {args.target}, '
          f'{"dynamic" if args.dynamic else "fixed"} shape {shape[0]}x{shape[1]}, '
          f'{len(proto.graph.node)} nodes)')
    return proto


def calibration_inputs(args, cfg, model, shape):
    from mmseg_cann.onnx.calibration import build_dataset, dataset_batches, random_inputs
    if args.calib_random:
        return random_inputs(args.calib_num, shape), 'random'
    dataset = build_dataset(cfg, args.calib_split, shape)
    inputs = [x for x, _ in dataset_batches(dataset, args.calib_num, shape,
                                            model.segmentor.data_preprocessor)]
    return inputs, args.calib_split


def main(argv=None) -> int:
    args = parse_args(argv)
    cfg, shape = check_arguments(args)
    if args.checkpoint:
        check_checkpoint_fits(args.config, args.checkpoint, args.cfg_options)
    from export_onnx import build_model

    from mmseg_cann.onnx import quantize_model
    from mmseg_cann.onnx.quant_rules import check_node_names
    model = build_model(args.config, args.checkpoint, args.cfg_options)
    staging = tempfile.mkdtemp(prefix='.quantize-', dir=osp.dirname(osp.abspath(args.out_dir)))
    try:
        proto = export(args, cfg, model, shape, staging)
        try:
            check_node_names(proto, args.exclude, '--exclude')
        except ValueError as exc:
            raise UserError(str(exc)) from exc
        inputs, split = calibration_inputs(args, cfg, model, shape)
        result = quantize_model(proto, inputs, osp.join(staging, 'model_int8.onnx'),
                                method=args.method, exclude=args.exclude,
                                activation_type=args.activation_type,
                                quantize_resize_matrices=args.quantize_resize_matrices)
        report = dict(
            config=args.config, checkpoint=args.checkpoint, target=args.target,
            shape=list(shape),
            calibration=dict(images=len(inputs), method=args.method, split=split,
                             activation_type=args.activation_type),
            quantized=result.quantized, excluded=result.float_nodes,
            quantize_resize_matrices=args.quantize_resize_matrices,
            sizes_bytes={name: os.path.getsize(osp.join(staging, f'model_{name}.onnx'))
                         for name in ('fp32', 'int8')},
            eval=None, amct=None)
        if args.eval:
            report['eval'] = evaluate(args, cfg, model, proto, result, shape, inputs)
        if args.atc:
            report['amct'] = amct_handoff(args, cfg, proto, result, inputs, staging)
        with open(osp.join(staging, 'quant_report.json'), 'w') as f:
            json.dump(report, f, indent=2)
        _publish(staging, args.out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    print_table(report, args.out_dir)
    return 0


def evaluate(args, cfg, model, proto, result, shape, calib_inputs):
    from mmseg_cann.onnx.calibration import build_dataset
    from mmseg_cann.onnx.quant_eval import evaluate_quantized, lossy_nodes
    dataset = build_dataset(cfg, 'val', shape)
    scores = evaluate_quantized(cfg, model, dataset, proto, result.model, args.eval_num,
                                shape)
    scores['lossy_nodes'] = lossy_nodes(result.prepared, result.model,
                                        calib_inputs[:LOSS_DEBUG_IMAGES], args.top)
    return scores


def amct_handoff(args, cfg, proto, result, inputs, staging):
    """``DIR/amct/`` and the keep_dtype file; the AMCT emulation with and without the
    skip list (label agreement against the float graph on the calibration inputs)."""
    from export_onnx import avg_precision

    from mmseg_cann.onnx.amct import amct_quantizable, emulate, skip_layers, write_handoff
    from mmseg_cann.onnx.atc import keep_dtype_nodes
    from mmseg_cann.onnx.quant_rules import float_nodes
    keep = keep_dtype_nodes(proto) if avg_precision(cfg) == torch.float32 else []
    keep_file = None
    if keep:
        keep_file = 'model_fp32.keep_dtype.txt'
        with open(osp.join(staging, keep_file), 'w') as f:
            f.write('\n'.join(keep) + '\n')
    rows = float_nodes(proto, args.quantize_resize_matrices, args.exclude)
    section = write_handoff(proto, inputs, osp.join(staging, 'amct'), args.atc,
                            float_rows=rows, keep_float=keep,
                            keep_dtype_file=keep_file and '../' + keep_file)
    section['folder'] = osp.join(args.out_dir, 'amct')
    prepared = result.prepared
    every = amct_quantizable(prepared)
    present = {n.name for n in prepared.graph.node}
    skip = set(skip_layers(prepared, float_nodes(
        prepared, args.quantize_resize_matrices, [n for n in args.exclude if n in present]),
        keep))
    section['emulation'] = {
        'without_skip': emulate(prepared, inputs, every),
        'with_skip': emulate(prepared, inputs, [n for n in every if n not in skip])}
    return section


def _publish(staging: str, out_dir: str) -> None:
    """Move the finished files from the staging folder into ``out_dir``."""
    os.makedirs(out_dir, exist_ok=True)
    for name in sorted(os.listdir(staging)):
        target = osp.join(out_dir, name)
        if osp.isdir(target) and not osp.islink(target):
            shutil.rmtree(target)
        os.replace(osp.join(staging, name), target)


def print_table(report, out_dir) -> None:
    cal = report['calibration']
    print(f'calibration: {cal["images"]} {cal["split"]} image(s), {cal["method"]}')
    print('quantized (int8 in and out): ' + ', '.join(
        f'{op} {n}' for op, n in report['quantized'].items()))
    print(f'kept in float ({len(report["excluded"])}):')
    for row in report['excluded']:
        print(f'  {row["op_type"]:<8} {row["node"]:<32} {row["reason"]}')
    sizes = report['sizes_bytes']
    print(f'model size: fp32 {sizes["fp32"] / 1e6:.2f} MB, int8 {sizes["int8"] / 1e6:.2f} MB')
    ev = report.get('eval')
    if ev:
        keys = [k for k in ev['fp32'] if k in ('mIoU', 'mDice', 'aAcc')]
        print(f'| {ev["images"]} val images | ' + ' | '.join(keys) + ' |')
        print('|---' * (len(keys) + 1) + '|')
        for variant in ('fp32', 'onnx_fp32', 'int8'):
            print(f'| {variant} | ' + ' | '.join(f'{ev[variant][k]:.2f}' for k in keys) + ' |')
        print(f'label agreement int8 vs PyTorch fp32: {ev["label_agreement"]:.3f}% '
              f'(ONNX fp32: {ev["onnx_fp32_label_agreement"]:.3f}%)')
        clear = ev['label_agreement_clear']
        print(f'int8 logits: SQNR {ev["logits_sqnr_db"]} dB; {ev["near_tie_pixels"]:.2f}% of '
              "the pixels are near ties (fp32's top-2 margin below the int8 logits' RMS "
              'error), agreement on the others '
              + ('-' if clear is None else f'{clear:.3f}%'))
        print('most lossy activations (SQNR dB of their own QDQ step / vs the float graph):')
        for row in ev['lossy_nodes']:
            print(f'  {row["op_type"]:<8} {row["node"]:<32} {row["qdq_sqnr"]:7.2f} '
                  f'{row["xmodel_sqnr"]:7.2f}')
    amct = report.get('amct')
    if amct:
        print(f'AMCT hand-off: {amct["folder"]} (skip_layers: {len(amct["skip_layers"])}); '
              'emulated AMCT rules, label agreement with the float graph on the '
              'calibration inputs:')
        for key, label in (('without_skip', 'every AMCT layer'),
                           ('with_skip', 'with skip_layers')):
            em = amct['emulation'][key]
            print(f'  {label:<17} {em["layers"]:4d} layers quantized, agreement '
                  f'{em["label_agreement"]:.3f}%')
    print(f'wrote {out_dir}: model_fp32.onnx, model_int8.onnx, quant_report.json'
          + (', amct/' if amct else ''))


if __name__ == '__main__':
    sys.exit(run(main, 'quantize'))
