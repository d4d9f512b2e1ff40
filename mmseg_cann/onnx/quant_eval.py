"""Accuracy of a quantized graph, with mmseg's own metric: PyTorch fp32, the ONNX fp32
graph and the ONNX int8 graph on a config's validation images, and the activations that
lose most to quantization (onnxruntime's QDQ loss-debugging module).

All three produce logits at the graph's input size (the exported whole-image function);
each goes back to the original image size through the segmentor's own
``postprocess_result`` and into its own ``IoUMetric`` (the config's ``val_evaluator``
settings), as ``tools/test.py`` scores a model in ``whole`` mode.
"""
from __future__ import annotations

import copy
import os
import tempfile
from typing import Dict, List, Sequence

import numpy as np

from .calibration import dataset_batches
from .dynamic_domain import check_dynamic_domain
from .quantize import calibration_reader, graph_inputs

#: the result names of :func:`evaluate_quantized`
VARIANTS = ('fp32', 'onnx_fp32', 'int8')
#: activations onnxruntime folds into the quantization of their input (the zero point
#: clips): in the int8 graph their tensor holds the unclipped value, so their own
#: "quantization step" would compare the input with the clipped output
_FOLDED = ('Relu', 'Clip')


def session(model_proto, threads: int = 0):
    """An onnxruntime CPU session with the default graph optimisations (as deployed);
    ``threads`` 0: onnxruntime's default."""
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3
    return ort.InferenceSession(model_proto.SerializeToString(), options,
                                providers=['CPUExecutionProvider'])


def _metric(cfg, dataset_meta):
    from mmseg.evaluation import IoUMetric
    settings = dict(cfg.get('val_evaluator') or {})
    metric = IoUMetric(iou_metrics=list(settings.get('iou_metrics', ['mIoU'])),
                       ignore_index=settings.get('ignore_index', 255))
    metric.dataset_meta = dataset_meta
    return metric


def _labels(samples) -> List[np.ndarray]:
    return [s.pred_sem_seg.data[0].cpu().numpy() for s in samples]


class LogitStats:
    """How far the int8 logits are from the float ones, against how far apart the float
    logits' two best classes are: the label agreement of a quantized model is bounded by
    its float margins (an untrained model's are near ties almost everywhere).

    :meth:`add` takes each image's ``(N, C, H, W)`` logits of both graphs at the graph
    output; :meth:`summary` gives

    * ``logits_sqnr_db``: ``10 log10(sum(ref**2) / sum((got - ref)**2))`` over all
      pixels and classes (inf where equal);
    * ``near_tie_pixels``: percent of pixels whose float margin (top-1 minus top-2
      logit) is below the int8 logits' RMS error, where one quantization error can
      flip the label;
    * ``label_agreement_clear``: the label agreement on the other pixels (None when
      there are none).
    """

    def __init__(self):
        self._noise = self._signal = 0.0
        self._values = 0
        self._margins, self._same = [], []

    def add(self, ref: np.ndarray, got: np.ndarray) -> None:
        if ref.shape != got.shape or ref.ndim != 4 or ref.shape[1] < 2:
            raise ValueError(f'LogitStats.add: logits must be (N, C>=2, H, W) of one shape, '
                             f'got {ref.shape} and {got.shape}')
        ref = ref.astype(np.float64)
        got = got.astype(np.float64)
        self._noise += float(((got - ref) ** 2).sum())
        self._signal += float((ref ** 2).sum())
        self._values += ref.size
        top2 = np.sort(ref, axis=1)[:, -2:]
        # kept per pixel until the RMS error is known: float32 (4 bytes a pixel)
        self._margins.append((top2[:, 1] - top2[:, 0]).ravel().astype(np.float32))
        self._same.append((ref.argmax(1) == got.argmax(1)).ravel())

    def summary(self) -> Dict[str, object]:
        if not self._values:
            raise ValueError('LogitStats.summary: no logits were added')
        rms = (self._noise / self._values) ** 0.5
        margins = np.concatenate(self._margins)
        same = np.concatenate(self._same)
        clear = margins >= rms
        return dict(
            logits_sqnr_db=(float('inf') if self._noise == 0 else
                            round(10 * float(np.log10(self._signal / self._noise)), 2)),
            near_tie_pixels=round(100.0 * float((~clear).mean()), 3),
            label_agreement_clear=(round(100.0 * float(same[clear].mean()), 3)
                                   if clear.any() else None))


def evaluate_quantized(cfg, model, dataset, proto_fp32, proto_int8, count: int,
                       shape) -> Dict[str, object]:
    """Score PyTorch fp32, ONNX fp32 and ONNX int8 on ``count`` images of ``dataset``.

    Args:
        cfg: the config (its ``val_evaluator``: ``iou_metrics``, ``ignore_index``).
        model: the exported module (``(N, 3, H, W)`` -> logits at the input size) with
            the segmentor as ``model.segmentor`` (its data preprocessor and
            ``postprocess_result``).
        dataset: :func:`.calibration.build_dataset` of the validation split.
        proto_fp32, proto_int8: the float and quantized graphs.
        count: images to score (spread over the dataset).
        shape: ``(H, W)`` of the graph input.

    Returns:
        ``{images, fp32, onnx_fp32, int8: {metric: value}, label_agreement (int8 vs
        PyTorch fp32), onnx_fp32_label_agreement}`` (metrics and agreements in percent,
        after ``postprocess_result``) and :class:`LogitStats`' ``logits_sqnr_db``,
        ``near_tie_pixels`` and ``label_agreement_clear`` (int8 vs PyTorch fp32 at the
        graph output).
    """
    import torch
    from mmengine.logging import MMLogger
    segmentor = model.segmentor
    metrics = {v: _metric(cfg, dataset.metainfo) for v in VARIANTS}
    sessions = {'onnx_fp32': session(proto_fp32), 'int8': session(proto_int8)}
    name = graph_inputs(proto_fp32)[0]
    same = {'int8': [0, 0], 'onnx_fp32': [0, 0]}
    images = 0
    stats = LogitStats()
    for inputs, samples in dataset_batches(dataset, count, shape,
                                           segmentor.data_preprocessor):
        images += 1
        with torch.no_grad():
            logits = {'fp32': model(torch.from_numpy(inputs))}
        for variant, sess in sessions.items():
            check_dynamic_domain(proto_fp32, {name: inputs.shape})
            logits[variant] = torch.from_numpy(sess.run(None, {name: inputs})[0])
        stats.add(logits['fp32'].numpy(), logits['int8'].numpy())
        labels = {}
        for variant in VARIANTS:
            results = segmentor.postprocess_result(logits[variant], copy.deepcopy(samples))
            metrics[variant].process({}, [r.to_dict() for r in results])
            labels[variant] = _labels(results)
        for variant in same:
            for a, b in zip(labels[variant], labels['fp32']):
                same[variant][0] += int((a == b).sum())
                same[variant][1] += a.size
    logger = MMLogger.get_current_instance()
    level = logger.level
    logger.setLevel('WARNING')  # IoUMetric prints its per-class table at INFO
    try:
        scores = {v: {k: float(x) for k, x in metrics[v].evaluate(images).items()}
                  for v in VARIANTS}
    finally:
        logger.setLevel(level)
    return dict(images=images, **scores,
                label_agreement=100.0 * same['int8'][0] / max(same['int8'][1], 1),
                onnx_fp32_label_agreement=100.0 * same['onnx_fp32'][0] /
                max(same['onnx_fp32'][1], 1), **stats.summary())


def lossy_nodes(prepared_fp32, proto_int8, inputs: Sequence[np.ndarray],
                top: int = 5) -> List[Dict[str, object]]:
    """The ``top`` activations with the lowest signal-to-quantization-noise ratio (dB)
    of their own quantize/dequantize step (``qdq_sqnr``), with the SQNR of the int8
    graph's value against the float graph's (``xmodel_sqnr``, the error accumulated up
    to there) and the node that writes them; activations that are zero on every input
    are left out (no signal, no loss). onnxruntime's ``qdq_loss_debug`` on the
    float graph the quantizer saw (``prepared_fp32``) and the int8 graph."""
    import onnx
    from onnxruntime.quantization.qdq_loss_debug import (
        collect_activations, compute_activation_error, create_activation_matching,
        modify_model_output_intermediate_tensors)
    name = graph_inputs(prepared_fp32)[0]

    with tempfile.TemporaryDirectory() as tmp:
        acts = {}
        for label, proto in (('float', prepared_fp32), ('qdq', proto_int8)):
            path = os.path.join(tmp, f'{label}.onnx')
            onnx.save(proto, path)
            modify_model_output_intermediate_tensors(path, path + '.aug.onnx')
            acts[label] = collect_activations(path + '.aug.onnx', calibration_reader(
                [{name: x} for x in inputs]))
    matching = create_activation_matching(acts['qdq'], acts['float'])
    errors = compute_activation_error(matching)
    producers = {o: n for n in prepared_fp32.graph.node for o in n.output}
    rows = []
    for tensor, err in errors.items():
        node = producers.get(tensor)
        if node is None or 'qdq_err' not in err or node.op_type in _FOLDED:
            continue
        if not any(np.any(a) for a in matching[tensor].get('pre_qdq', [])):
            # zero everywhere (e.g. a residual branch whose last norm layer starts at
            # zero, as mmseg's ResNets initialise it): nothing to lose, and the ratio
            # is 0/0, which onnxruntime reports as 0 dB
            continue
        rows.append(dict(node=node.name, op_type=node.op_type, tensor=tensor,
                         qdq_sqnr=round(float(err['qdq_err']), 2),
                         xmodel_sqnr=round(float(err.get('xmodel_err', float('nan'))), 2)))
    rows.sort(key=lambda r: r['qdq_sqnr'])
    return rows[:top]
