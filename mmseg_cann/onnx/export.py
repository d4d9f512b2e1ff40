"""Export a model to ONNX with exact CANN-op translations, check and verify it."""
from __future__ import annotations

import contextlib
import logging
import os
import warnings
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from ..core.export_mode import DEFAULT_OPSET, TARGETS, export_mode
from . import atc_backend, ops
from .atc import ATC_MAX_OPSET, atc_reading
from .dynamic_domain import (attach_domain, check_dynamic_domain, input_sources, not_checkable,
                             pinned_dims, program_domain)
from .mmcv_ops import portable_mmcv_ops
from .native_ops import native_ops_as_cann
from .runtime import constant_values, run_onnx
from .translation import MIN_OPSET, size_arithmetic_table, translation_table

#: ONNX ops whose attributes :func:`node_summary` prints
SUMMARY_OPS = ('Resize', 'MaxPool', 'AveragePool', 'GlobalAveragePool', 'GlobalMaxPool')


def export_onnx(model: torch.nn.Module, inputs: Union[torch.Tensor, Tuple[torch.Tensor, ...]],
                path: Optional[Union[str, os.PathLike]] = None, *, opset: int = DEFAULT_OPSET,
                dynamic: bool = False, input_names: Sequence[str] = ('input',),
                output_names: Optional[Sequence[str]] = None, simplify: bool = False,
                target: str = 'onnx'):
    """Export ``model(*inputs)`` to ONNX and check it with ``onnx.checker``.

    Args:
        model: the module (put in eval mode here); CANN ops inside it with
            ``backend='auto'`` are translated by :mod:`mmseg_cann.onnx.translation`.
        inputs: example ``(N, C, H, W)`` tensor(s).
        path: where to write the ``.onnx`` file (weights embedded), or None.
        opset: ONNX opset, >= 17 (antialiasing needs 18); at most 18 for ``'atc'``.
        target: ``'onnx'`` -- standard ONNX ``Resize``/pool nodes whose meaning in
            onnxruntime is PyTorch's; ``'atc'`` -- only forms whose meaning Ascend's ATC
            compiler keeps (:mod:`.atc_backend`; static shapes, opset <= 18), checked
            with :func:`mmseg_cann.onnx.atc.atc_reading`.
        dynamic: make batch, height and width of every input dynamic (symbolic). The
            graph then reproduces PyTorch for every input size; ``ValueError`` where an
            op's rule depends on the concrete size (see
            :func:`~mmseg_cann.onnx.translation.check_dynamic_upsample`,
            :func:`~mmseg_cann.core.geometry.ceil_mode_may_drop`) or where the model's
            own code pins a size to the example's. PyTorch's own resize/pool calls in
            the model (``F.interpolate``, ``nn.AdaptiveAvgPool2d``, ``nn.MaxPool2d``...)
            are exported by the same rules (:mod:`.native_ops`). Where the model's code
            branches on a size, the graph holds for the sizes where the branches go as
            traced: that domain (torch.export's ranges and guards) is stored in the
            graph's metadata and checked by this package's runners
            (:mod:`.dynamic_domain`, :func:`~.dynamic_domain.check_dynamic_domain`).
            mmcv's ``PSAMask`` (PSANet) is traced in a portable form with either setting
            (:mod:`.mmcv_ops`).
        input_names, output_names: graph input/output names.
        simplify: run ``onnxslim.slim`` on the exported graph (PyPI ``onnxslim``,
            ``requirements/tests.txt``); the result is checked like the export.

    Returns:
        the ``onnx.ModelProto``.
    """
    import onnx
    if not isinstance(opset, int) or isinstance(opset, bool) or opset < MIN_OPSET:
        raise ValueError(f'opset must be an int >= {MIN_OPSET}, got {opset!r}')
    if target not in TARGETS:
        raise ValueError(f'target must be one of {TARGETS}, got {target!r}')
    if target == 'atc':
        if opset > ATC_MAX_OPSET:
            raise ValueError(f"opset must be <= {ATC_MAX_OPSET} for target='atc' (ATC "
                             f'registers the standard ONNX ops up to opset '
                             f'{ATC_MAX_OPSET}), got {opset}')
        if dynamic:
            raise ValueError("target='atc' exports fixed shapes (its exact forms are "
                             'constants of the traced sizes): export one graph per input '
                             "size (tools/export_onnx.py --target atc --gears H,W ...), or "
                             "use target='onnx' with dynamic=True")
    if isinstance(inputs, torch.Tensor):
        inputs = (inputs,)
    dynamic_shapes = None
    if dynamic:
        # Dim.AUTO: torch.export keeps each dim symbolic unless the model forces a
        # value (then _check_dynamic refuses the graph) and records the constraints the
        # model puts on it (e.g. a multiple of 16 for UNet)
        auto = torch.export.Dim.AUTO
        dynamic_shapes = _per_argument(model, [{0: auto, 2: auto, 3: auto} for _ in inputs])
    model.eval()
    backend = atc_backend if target == 'atc' else ops
    with _quiet(), export_mode(backend, opset, target), torch.no_grad(), \
            _unwrapped_errors():
        # torch.export without dynamo (strict=False), as torch.onnx.export tries first:
        # the CANN ops' refusals (sizes ONNX cannot express) propagate as they are, where
        # torch.onnx.export would go on to retry a refused graph with dynamo.
        # Fresh tensors: torch.export leaves dim markings on the tensors it traced, which
        # would make a later fixed-shape export of the same tensors symbolic.
        # dynamic: PyTorch's own resize/pool calls take the CANN ops' size-generic forms
        # and refusals (their generic translations bake the traced size in, .native_ops).
        # mmcv's PSAMask is traced in its portable form (.mmcv_ops: its CPU kernel would
        # be recorded element by element, for the traced size only).
        with native_ops_as_cann() if dynamic else contextlib.nullcontext(), \
                portable_mmcv_ops(model):
            exported = _capture(model, tuple(t.detach().clone() for t in inputs),
                                dynamic_shapes)
        program = torch.onnx.export(
            exported, (), dynamo=True,
            opset_version=opset,
            custom_translation_table=_custom_translation_table(opset),
            input_names=list(input_names)[:len(inputs)],
            output_names=None if output_names is None else list(output_names),
            optimize=True, verbose=False)
    proto = program.model_proto
    domain = None
    if dynamic:
        domain = _dynamic_domain(model, inputs, proto, [exported, getattr(
            program, 'exported_program', None)])
    if simplify:
        proto = simplify_onnx(proto)
    if domain is not None:
        attach_domain(proto, domain)
    onnx.checker.check_model(proto, full_check=True)
    if path is not None:
        onnx.save(proto, os.fspath(path))
    return proto


def _capture(model: torch.nn.Module, args: tuple, dynamic_shapes):
    """``torch.export.export(strict=False)`` as ``torch.onnx.export`` runs it: size-0/1
    dims may stay dynamic (``backed_size_oblivious``), and the shapes are refined once from
    the exporter's suggested fixes when it asks for that."""
    with torch.fx.experimental._config.patch(backed_size_oblivious=True):
        try:
            return torch.export.export(model, args, dynamic_shapes=dynamic_shapes,
                                       strict=False)
        except torch._dynamo.exc.UserError as exc:
            try:
                refined = torch.export.dynamic_shapes.refine_dynamic_shapes_from_suggested_fixes(
                    exc.msg, dynamic_shapes)
            except Exception:  # noqa: BLE001 - nothing to refine: the exporter's error
                raise exc from None
            return torch.export.export(model, args, dynamic_shapes=refined, strict=False)


def _per_argument(model: torch.nn.Module, specs: List[dict]) -> tuple:
    """``dynamic_shapes`` laid out like ``model.forward``'s parameters: the specs of
    inputs taken by ``*args`` go into one tuple (torch.export's structure)."""
    import inspect
    params = list(inspect.signature(model.forward).parameters.values())
    for i, param in enumerate(params):
        if param.kind == param.VAR_POSITIONAL:
            return tuple(specs[:i]) + (tuple(specs[i:]),)
    return tuple(specs)


def simplify_onnx(proto):
    """``onnxslim.slim(proto)`` (constant folding, dead-node and shape-op elimination).

    The Resize/pool attributes are not rewritten by it; whether the slimmed graph still
    matches PyTorch is for :func:`verify_onnx` (the export tool's ``--verify``) to show.
    """
    try:
        import onnxslim
    except ImportError as exc:
        raise ValueError('simplify=True needs the onnxslim package (pip install onnxslim)') \
            from exc
    with _quiet():
        return onnxslim.slim(proto)


def _dynamic_domain(model, inputs, proto, programs):
    """The graph's :class:`~.dynamic_domain.DynamicDomain`, after :func:`_check_dynamic`
    and the refusal of guards that cannot be checked (the sizes the graph holds for could
    not be stated)."""
    sources = input_sources(model.forward, inputs)
    names = graph_input_names(proto)
    programs = [p for k, p in enumerate(programs)
                if p is not None and all(p is not q for q in programs[:k])]
    domain = program_domain(programs, sources, names)
    traced = {s: list(t.shape) for s, t in zip(sources, inputs)}
    _check_dynamic(proto, domain, traced)
    unchecked = not_checkable(domain, traced)
    if unchecked:
        raise ValueError(
            f'dynamic=True: the model cannot be exported with dynamic sizes: torch.export '
            f'guards the input sizes with {unchecked[0]!r}, which mmseg_cann cannot '
            'evaluate (outside the guard vocabulary of mmseg_cann.onnx.guard_expr), so the '
            'sizes the graph holds for cannot be stated; export with fixed shapes '
            '(dynamic=False), one graph per input size')
    return domain


def _check_dynamic(proto, domain=None, traced=None) -> None:
    """Refuse a 'dynamic' export whose batch, height or width came out fixed.

    The CANN ops keep symbolic sizes symbolic (or refuse a size-dependent rule), but
    other code in a model can still force a value (an ``int()`` of a size, a branch on
    it); torch.export then specialises that dimension to the example input -- either
    as a fixed ONNX dim, or (``Dim.AUTO``) as a symbol whose range is the one traced
    value, or a symbol guarded to it (``L['x'].size()[0] == 1``), which the ONNX graph
    would not show; or a dim named by the value, such as ``'10'``, when an exported
    program is converted -- and the graph, valid for that size only, is rejected rather
    than passed off as dynamic (:func:`~.dynamic_domain.pinned_dims` reads the range and
    the guards).
    """
    pinned = {} if domain is None else {(k, axis): reasons for k, axis, reasons
                                        in pinned_dims(domain, traced)}
    inputs = {n: i for i, n in enumerate(graph_input_names(proto))}
    for value in proto.graph.input:
        if value.name not in inputs:
            continue
        k = inputs[value.name]
        dims = value.type.tensor_type.shape.dim
        if len(dims) != 4:
            continue
        fixed = [name for axis, name in ((0, 'batch'), (2, 'height'), (3, 'width'))
                 if dims[axis].HasField('dim_value') or dims[axis].dim_param.isdigit()
                 or (k, axis) in pinned]
        # the shortest reasons, over the graph's input names ("guard input.shape[0] == 1")
        why = sorted({domain.render(r) for axis in (0, 2, 3)
                      for r in pinned.get((k, axis), [])}, key=len)
        why = why[:2] + ([f'{len(why) - 2} more'] if len(why) > 2 else [])
        if fixed:
            raise ValueError(
                f'dynamic=True: input {value.name!r} came out with fixed '
                f'{", ".join(fixed)} {[d.dim_param or d.dim_value for d in dims]}: code in '
                'the model forces the traced size (an int() of a size or a branch on it, '
                'outside the CANN ops' + (f"; torch.export's {'; '.join(why)}" if why else '')
                + '); export with fixed shapes (dynamic=False), one graph per input size')


def graph_input_names(proto) -> List[str]:
    """The graph's inputs that are not initializers, in order (the model's inputs)."""
    initializers = {t.name for t in proto.graph.initializer}
    return [i.name for i in proto.graph.input if i.name not in initializers]


def dynamic_dims(proto) -> List[List[Union[int, str]]]:
    """Each graph input's dims: ints where fixed, the symbolic expression (e.g.
    ``'s53'``, ``'16*s0'``) where dynamic."""
    return [[d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]
            for value in proto.graph.input]


class _unwrapped_errors:
    """Re-raise our own ValueError (an unexportable op) instead of the exporter's wrapper,
    and turn the exporter's failure on an attribute computed from a dynamic size into a
    ValueError naming the rule (:func:`_symbolic_attribute_error`)."""

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        chain = []
        seen = exc
        while seen is not None and len(chain) < 64:
            if isinstance(seen, ValueError) and 'mmseg_cann' in _origin(seen):
                raise seen from None
            chain.append(seen)
            seen = seen.__cause__ or seen.__context__
        refusal = _symbolic_attribute_error(chain)
        if refusal is not None:
            raise refusal from exc
        return False


def _symbolic_attribute_error(chain: List[BaseException]) -> Optional[ValueError]:
    """The refusal for an exporter error chain that failed on a symbolic attribute, else
    None.

    ONNX attributes are constants of the graph (ONNX IR, "Attributes"): an operator
    argument that PyTorch computes from a dynamic size, such as the ``groups`` of
    DMHead's per-sample filters (``F.conv2d(..., groups=batch * channels)``), has no
    ONNX form; torch's converter stops with ``Unsupported attribute type: SymbolicTensor``
    deep inside its ``ConversionError``.
    """
    import re
    texts = [str(e) for e in chain]
    if not any(isinstance(e, TypeError) and 'Unsupported attribute type' in t
               and 'SymbolicTensor' in t for e, t in zip(chain, texts)):
        return None
    joined = '\n'.join(texts)
    node = re.search(r'target=torch\.ops\.([\w.]+)', joined)
    attrs = re.search(r"named_attrs=\{(.*?)\}, opset", joined, re.S)
    symbolic = sorted(set(re.findall(r"'(\w+)': SymbolicTensor", attrs.group(1)))) \
        if attrs else []
    where = node.group(1) if node else 'an operator'
    what = f" ({', '.join(symbolic)})" if symbolic else ''
    return ValueError(
        f'dynamic=True: {where} cannot be exported with dynamic sizes: the model computes '
        f'its attribute{what} from the input size (e.g. a grouped convolution whose groups '
        'follow the batch size), and ONNX attributes are constants; export with fixed '
        'shapes (dynamic=False), one graph per input size')


def _origin(exc: BaseException) -> str:
    tb = exc.__traceback__
    last = ''
    while tb is not None:
        last = tb.tb_frame.f_code.co_filename
        tb = tb.tb_next
    return last


class _quiet:
    """Silence the exporter's progress prints and torchvision warnings."""

    def __enter__(self):
        self._logger = logging.getLogger('torch.onnx')
        self._level = self._logger.level
        self._logger.setLevel(logging.ERROR)
        self._warn = warnings.catch_warnings()
        self._warn.__enter__()
        warnings.simplefilter('ignore')
        import io
        self._out = contextlib.redirect_stdout(io.StringIO())
        self._out.__enter__()

    def __exit__(self, *exc):
        self._out.__exit__(*exc)
        self._warn.__exit__(*exc)
        self._logger.setLevel(self._level)


def verify_onnx(model_proto, model: torch.nn.Module,
                inputs: Sequence[Union[torch.Tensor, Tuple[torch.Tensor, ...]]], *,
                target: str = 'onnx') -> List[Dict]:
    """Compare onnxruntime with eager PyTorch on each input (tuple) of ``inputs``.

    With ``target='atc'`` onnxruntime runs the graph as ATC's parser reads it
    (:func:`mmseg_cann.onnx.atc.atc_reading`, at each input's size), so the comparison
    shows what a deployment through ATC computes; an :class:`~.atc.AtcReadError` says
    that ATC rejects the graph or reads it without a defined result.

    A dynamic graph is compared only at the sizes it holds for: ``ValueError`` (from
    :func:`~.dynamic_domain.check_dynamic_domain`) for an input outside them.

    Returns one dict per input: ``max_abs`` (over all outputs), ``argmax_agree`` (fraction
    of pixels whose channel argmax agrees, first output) and ``shape``.
    """
    results = []
    model.eval()
    for item in inputs:
        item = (item,) if isinstance(item, torch.Tensor) else tuple(item)
        # a dynamic graph: only at the sizes it holds for (ValueError naming the guard)
        check_dynamic_domain(model_proto, [tuple(t.shape) for t in item])
        with torch.no_grad():
            expected = model(*item)
        expected = [expected] if isinstance(expected, torch.Tensor) else list(expected)
        graph = model_proto
        if target == 'atc':
            names = [i.name for i in model_proto.graph.input
                     if i.name not in {t.name for t in model_proto.graph.initializer}]
            graph = atc_reading(model_proto, {n: tuple(t.shape) for n, t in zip(names, item)})
        got = run_onnx(graph, [t.numpy() for t in item])
        max_abs = 0.0
        for e, g in zip(expected, got):
            e = e.numpy()
            if e.shape != g.shape:
                raise ValueError(f'onnxruntime output shape {g.shape} differs from '
                                 f'PyTorch {e.shape}')
            max_abs = max(max_abs, float(np.max(np.abs(e - g))) if e.size else 0.0)
        e0, g0 = expected[0].numpy(), got[0]
        agree = float(np.mean(e0.argmax(1) == g0.argmax(1))) if e0.ndim == 4 else 1.0
        results.append(dict(shape=tuple(item[0].shape), max_abs=max_abs, argmax_agree=agree))
    return results


def node_summary(model_proto) -> List[str]:
    """One line per Resize/pooling node: op, name, attributes, and constant sizes/scales."""
    import onnx
    consts = constant_values(model_proto)
    lines = []
    for node in model_proto.graph.node:
        if node.op_type not in SUMMARY_OPS:
            continue
        attrs = []
        for a in sorted(node.attribute, key=lambda a: a.name):
            value = onnx.helper.get_attribute_value(a)
            if isinstance(value, bytes):
                value = value.decode()
            attrs.append(f'{a.name}={value}')
        if node.op_type == 'Resize':
            for slot, label in ((2, 'scales'), (3, 'sizes')):
                if len(node.input) > slot and node.input[slot]:
                    value = consts.get(node.input[slot])
                    attrs.append(f'{label}=' + ('<computed>' if value is None else
                                               ('[' + ','.join(
                                                   repr(float(v)) if label == 'scales'
                                                   else str(int(v)) for v in value.ravel())
                                               + ']')))
        lines.append(f'{node.op_type:<17} {node.name:<28} ' + ' '.join(attrs))
    return lines


def node_attributes(model_proto, op_type: str) -> List[Dict[str, object]]:
    """Attributes of every ``op_type`` node (plus ``sizes``/``scales`` for Resize)."""
    rows = []
    for line in node_summary(model_proto):
        if not line.startswith(op_type + ' '):
            continue
        fields = line.split()[2:]
        row = {}
        for field in fields:
            key, _, value = field.partition('=')
            row[key] = value
        rows.append(row)
    return rows


def _custom_translation_table(opset: int) -> Dict[object, object]:
    """``custom_translation_table`` for ``torch.onnx.export(dynamo=True)`` at ``opset``."""
    table = {getattr(torch.ops.mmseg_cann, name).default: fn
             for name, fn in translation_table(opset).items()}
    table.update(ops.roi_translation_table(opset))
    table.update(size_arithmetic_table(opset))
    return table
