"""The input sizes a dynamic ONNX graph holds for (its *domain*): read from the exported
program, stated in the graph, checked before the graph runs.

torch.export traces the model once. Where the model's code branches on an input size
(DPT's ``FeatureFusionBlock`` resizes ``res`` only when ``x.shape != res.shape``), the
exported program keeps the branch taken at the traced size and records the condition as a
*guard* on the input sizes (``ExportedProgram._guards_code``; ``ep.module()`` asserts
them, "Guard failed: ..."), and it narrows each symbolic dim to a *range*
(``range_constraints``). The ONNX graph keeps neither: outside them it computes the
traced branch, which is wrong, or crashes onnxruntime. This module is the one place that
reads these conditions (:func:`program_domain`), decides which pin a dim to one value
(:func:`pinned_dims`, refused by ``export_onnx``), writes the rest into the graph's
``metadata_props`` (:data:`METADATA_KEY`, JSON; :func:`attach_domain`,
:func:`read_domain`) and checks input shapes against them
(:func:`check_dynamic_domain`), as the package's runners do before every run.
onnxruntime or ATC given the file directly do not read the metadata: a tool that feeds the
graph itself calls :func:`check_dynamic_domain` first.

Guard expressions are the Python source torch's ``ShapeGuardPythonPrinter`` writes, with
inputs named as the model's ``forward`` takes them (``L['x'].size()[2]``; an input of
``*feats`` is ``L['feats'][0]``). They are never given to ``eval`` (a graph's metadata
may come from anywhere): :func:`evaluate_guard` interprets the printer's vocabulary only
(integer arithmetic, comparisons, ``and``/``or``/``not``, ``max``/``min``/``abs``,
``math.floor``/``ceil``/``trunc``...) and calls anything else *not checkable*.

A guard is left out of the domain only when it is *proven* to hold for every size in the
ranges, by interval arithmetic over the expression (:func:`proven_true`: e.g. ``(W // 16)
> 1`` where ``W >= 32``); a guard that merely held at every size tried is kept, since a
probe cannot show that it holds at the sizes not tried.
"""
from __future__ import annotations

import inspect
import json
import math
import re
from dataclasses import dataclass
from typing import List, Mapping, Optional, Sequence, Tuple, Union

from .guard_expr import SIZE_REF, evaluate_guard, guard_references, proven_true

#: the ``metadata_props`` key holding the domain (JSON, :meth:`DynamicDomain.to_json`)
METADATA_KEY = 'mmseg_cann.dynamic_domain'
#: format version of the JSON
FORMAT = 1
#: :func:`pinned_dims` tries every size from 1 to ``max(PROBE_LIMIT, 4 * traced)``
PROBE_LIMIT = 256
#: names of the axes of an ``(N, C, H, W)`` input, for messages
AXIS_NAMES = {0: 'batch', 1: 'channels', 2: 'height', 3: 'width'}

Shape = Tuple[int, ...]


@dataclass(frozen=True)
class DomainInput:
    """One graph input: its ONNX name, its name in the guards (``source``) and, per axis,
    the range ``(low, high)`` of sizes (``high`` None: unbounded)."""
    name: str
    source: str
    ranges: Tuple[Tuple[int, Optional[int]], ...]


@dataclass(frozen=True)
class DynamicDomain:
    """The sizes a dynamic graph holds for: every input's ranges, and the guards (Python
    expressions over ``<source>.size()[axis]``) that must all be true."""
    inputs: Tuple[DomainInput, ...]
    guards: Tuple[str, ...]

    def to_json(self) -> str:
        return json.dumps(dict(
            format=FORMAT,
            inputs=[dict(name=i.name, source=i.source, ranges=[list(r) for r in i.ranges])
                    for i in self.inputs],
            guards=list(self.guards)), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> 'DynamicDomain':
        """The domain stated by :meth:`to_json`; ``ValueError`` for anything else."""
        try:
            data = json.loads(text)
            if data.get('format') != FORMAT:
                raise ValueError(f"format {data.get('format')!r}, expected {FORMAT}")
            inputs = tuple(DomainInput(str(i['name']), str(i['source']), tuple(
                (int(lo), None if hi is None else int(hi)) for lo, hi in i['ranges']))
                for i in data['inputs'])
            guards = tuple(str(g) for g in data['guards'])
        except (TypeError, KeyError, AttributeError, ValueError) as exc:
            raise ValueError(f'the graph\'s {METADATA_KEY!r} metadata is not a dynamic '
                             f'domain written by mmseg_cann ({exc})') from None
        return cls(inputs, guards)

    def conditions(self) -> List[str]:
        """The domain in words over the graph's input names (``input.shape[2] >= 33``):
        the ranges that exclude a size above 0, then the guards."""
        lines = []
        for item in self.inputs:
            for axis, (lo, hi) in enumerate(item.ranges):
                ref = f'{item.name}.shape[{axis}]'
                if lo == hi:
                    continue  # a fixed dim: the graph's own input shape states it
                if lo > 1:
                    lines.append(f'{ref} >= {lo}')
                if hi is not None:
                    lines.append(f'{ref} <= {hi}')
        return lines + [self.render(g) for g in self.guards]

    def render(self, guard: str) -> str:
        """``guard`` with the graph's input names: ``input.shape[2]`` for
        ``L['x'].size()[2]``."""
        names = {i.source: i.name for i in self.inputs}
        return SIZE_REF.sub(lambda m: f'{names.get(m.group(1), m.group(1))}.shape['
                                       f'{m.group(2)}]', guard)


def input_sources(forward, inputs: Sequence[object]) -> List[str]:
    """The guards' name of each input of ``forward(*inputs)``: ``L['x']``, and
    ``L['feats'][k]`` for the ``k``-th input taken by ``*feats`` (as torch.export binds
    the example inputs to the signature)."""
    from torch.utils import _pytree as pytree
    bound = inspect.signature(forward).bind(*inputs)
    return ['L' + pytree.keystr(path)
            for path, _ in pytree.tree_leaves_with_path(dict(bound.arguments))]


def program_domain(programs: Sequence[object], sources: Sequence[str],
                   names: Sequence[str]) -> DynamicDomain:
    """The domain of the graph converted from the exported ``programs`` (the captured one
    and the one torch.onnx converted: their conditions together).

    Per user input ``k`` (ONNX name ``names[k]``, guard name ``sources[k]``): each dim's
    range (its symbol's ``range_constraints``, intersected over ``programs``; a fixed dim
    ``(v, v)``); the equalities torch.export asserts between dims sharing a symbol (as
    ``ep.module()`` does); every guard of ``_guards_code`` that refers to an input size,
    less those :func:`proven_true` over the ranges.
    """
    inputs = None
    guards: List[str] = []
    for program in programs:
        found, equal = _input_ranges(program, sources)
        inputs = found if inputs is None else [
            [_intersect(a, b) for a, b in zip(x, y)] for x, y in zip(inputs, found)]
        guards += equal
        aliases = {f"L['flat_args'][{k}]": s for k, s in enumerate(sources)}
        for guard in getattr(program, '_guards_code', None) or []:
            for alias, source in aliases.items():
                guard = guard.replace(alias, source)
            if SIZE_REF.search(guard):
                guards.append(guard)
    domain_inputs = tuple(DomainInput(n, s, tuple(r))
                          for n, s, r in zip(names, sources, inputs or []))
    kept = [g for g in dict.fromkeys(guards)
            if not proven_true(g, {i.source: i.ranges for i in domain_inputs})]
    return DynamicDomain(domain_inputs, tuple(kept))


def _input_ranges(program, sources):
    """Per user input, each dim's ``(low, high)``; and ``a == b`` guards for dims that
    share a symbol."""
    import sympy
    ranges = program.range_constraints
    placeholders = {n.name: n for n in program.graph.nodes if n.op == 'placeholder'}
    result, equal, first = [], [], {}
    for name, source in zip(program.graph_signature.user_inputs, sources):
        val = placeholders[name].meta.get('val') if name in placeholders else None
        dims = []
        for axis, dim in enumerate(getattr(val, 'shape', ())):
            ref = f'{source}.size()[{axis}]'
            expr = getattr(getattr(dim, 'node', None), 'expr', None)
            if expr is None:
                dims.append((int(dim), int(dim)))
                continue
            if isinstance(expr, sympy.Symbol) and expr in first:
                equal.append(f'{ref} == {first[expr]}')
            first.setdefault(expr, ref)
            bound = ranges.get(expr)
            if bound is None:  # a dim derived from others (e.g. 2*s0): stated as a guard
                dims.append((0, None))
                equal.append(_derived_guard(ref, expr, first))
                continue
            dims.append((max(0, int(bound.lower)),
                         None if not math.isfinite(float(bound.upper)) else int(bound.upper)))
        result.append(dims)
    return result, equal


def _derived_guard(ref: str, expr, first) -> str:
    """``ref == <expr over the inputs' sizes>`` for a dim torch.export derived from other
    dims; an unresolvable symbol stays in it, which makes the guard not checkable."""
    from torch.utils._sympy.printers import PythonPrinter
    text = PythonPrinter().doprint(expr)
    for symbol in sorted(expr.free_symbols, key=lambda s: -len(s.name)):
        if symbol in first and first[symbol] != ref:
            text = re.sub(rf'\b{symbol.name}\b', first[symbol], text)
    return f'{ref} == {text}'


def _intersect(a, b):
    lo = max(a[0], b[0])
    hi = a[1] if b[1] is None else b[1] if a[1] is None else min(a[1], b[1])
    return lo, hi


def not_checkable(domain: DynamicDomain, shapes: Mapping[str, Sequence[int]]) -> List[str]:
    """The guards of ``domain`` that :func:`evaluate_guard` cannot evaluate at
    ``shapes`` (e.g. the traced ones)."""
    return [g for g in domain.guards if evaluate_guard(g, shapes) is None]


#: how :func:`pinned_dims` moves the other dims a guard reads: ``traced * f + o``
OTHER_SIZES = tuple((f, o) for f in (1, 2, 3) for o in (0, 1, 16))


def pinned_dims(domain: DynamicDomain, traced: Mapping[str, Sequence[int]],
                axes: Sequence[int] = (0, 2, 3)) -> List[Tuple[int, int, List[str]]]:
    """The dims (``axes`` of each input) that the domain admits at the traced size only.

    Per dim, every size from 1 to ``max(PROBE_LIMIT, 4 * traced)`` within its range is
    tried against the guards that read the dim, with the other dims those guards read at
    their traced sizes and moved together (:data:`OTHER_SIZES`): a dim is pinned when no
    such setting admits a size but the traced one (``B*H*W == H*W`` pins the batch; a
    relation such as ``H == W`` or two inputs' equal batch narrows the domain without
    pinning either). Returns ``(input index, axis, reasons)``: the range
    (``'range [1, 1]'``) and the guards (``"guard L['x'].size()[0] == 1"``) that refuse
    some other size.
    """
    pinned = []
    for k, item in enumerate(domain.inputs):
        for axis in axes:
            if axis >= len(item.ranges):
                continue
            reasons = _pinning(domain, item, axis, traced)
            if reasons is not None:
                pinned.append((k, axis, reasons))
    return pinned


def _pinning(domain, item, axis, traced) -> Optional[List[str]]:
    """The reasons dim ``axis`` of ``item`` is pinned to its traced size, or None."""
    size = traced[item.source][axis]
    lo, hi = item.ranges[axis]
    if lo == hi:
        return [f'range [{lo}, {hi}]'] if lo == size else None
    ref = (item.source, axis)
    own = [g for g in domain.guards if ref in guard_references(g)]
    ranges = {i.source: i.ranges for i in domain.inputs}
    others = sorted({r for g in own for r in guard_references(g)
                     if r != ref and r[0] in ranges and r[1] < len(ranges[r[0]])
                     and ranges[r[0]][r[1]][0] != ranges[r[0]][r[1]][1]})
    limit = max(PROBE_LIMIT, 4 * size)
    reasons = []
    for f, o in OTHER_SIZES if others else OTHER_SIZES[:1]:
        probe = {s: list(shape) for s, shape in traced.items()}
        for source, other in others:
            probe[source][other] = traced[source][other] * f + o
        # nearest the traced size first: an unpinned dim is usually shown so at once
        candidates = sorted(range(max(lo, 1), (limit if hi is None else min(hi, limit)) + 1),
                            key=lambda c: (abs(c - size), c))
        for candidate in candidates:
            probe[item.source][axis] = candidate
            failing = [g for g in own if evaluate_guard(g, probe) is False]
            if not failing and candidate != size:
                return None
            reasons += [f'guard {g}' for g in failing if f'guard {g}' not in reasons]
    return reasons


def violations(domain: DynamicDomain, shapes: Sequence[Sequence[int]]) -> List[str]:
    """Why ``shapes`` (one per graph input, in order) are outside ``domain``: one message
    per broken range or guard (naming the input, its size and the condition); empty
    when they are inside."""
    if len(shapes) != len(domain.inputs):
        return [f'the graph has {len(domain.inputs)} input(s) '
                f'({", ".join(i.name for i in domain.inputs)}), got {len(shapes)} shape(s)']
    named = {i.source: tuple(int(d) for d in s) for i, s in zip(domain.inputs, shapes)}
    found = []
    for item, shape in zip(domain.inputs, shapes):
        shape = tuple(int(d) for d in shape)
        if len(shape) != len(item.ranges):
            found.append(f'input {item.name!r} has shape {shape}, the graph takes '
                         f'{len(item.ranges)} dims')
            continue
        for axis, (lo, hi) in enumerate(item.ranges):
            if shape[axis] < lo or (hi is not None and shape[axis] > hi):
                what = AXIS_NAMES.get(axis, f'axis {axis}') if len(shape) == 4 \
                    else f'axis {axis}'
                bound = f'{lo} to {hi}' if hi is not None else f'at least {lo}'
                found.append(f'input {item.name!r} of shape {shape}: its {what} '
                             f'{shape[axis]} is outside {bound}, the range torch.export '
                             f'gave this dim when tracing the model')
    if found:
        return found
    for guard in domain.guards:
        value = evaluate_guard(guard, named)
        if value:
            continue
        inputs = [i for i in domain.inputs
                  if i.source in {s for s, _ in guard_references(guard)}]
        where = ', '.join(f'{i.name!r} of shape {named[i.source]}' for i in inputs)
        label = 'input' if len(inputs) == 1 else 'inputs'
        if value is None:
            found.append(f'{label} {where}: the graph\'s domain guard '
                         f'{domain.render(guard)!r} cannot be checked')
        else:
            found.append(f'{label} {where}: at export the model\'s code took a branch that '
                         f'holds only where {domain.render(guard)}')
    return found


def attach_domain(proto, domain: DynamicDomain) -> None:
    """Write ``domain`` into ``proto.metadata_props`` under :data:`METADATA_KEY`
    (replacing an earlier one)."""
    keep = [p for p in proto.metadata_props if p.key != METADATA_KEY]
    del proto.metadata_props[:]
    for prop in keep:
        proto.metadata_props.add(key=prop.key, value=prop.value)
    proto.metadata_props.add(key=METADATA_KEY, value=domain.to_json())


def read_domain(proto) -> Optional[DynamicDomain]:
    """The domain stated in ``proto``'s metadata, or None (a fixed-shape graph, or one
    exported without it)."""
    for prop in proto.metadata_props:
        if prop.key == METADATA_KEY:
            return DynamicDomain.from_json(prop.value)
    return None


def check_dynamic_domain(proto, shapes: Union[Sequence[Sequence[int]],
                                              Mapping[str, Sequence[int]]]) -> None:
    """Raise ``ValueError`` when input ``shapes`` are outside the sizes the dynamic graph
    ``proto`` holds for (its :data:`METADATA_KEY` metadata); nothing for a graph without
    it.

    Args:
        proto: the ``onnx.ModelProto`` (from ``export_onnx(..., dynamic=True)`` or
            ``onnx.load``).
        shapes: one shape per graph input, in the graph's order, or ``{input name:
            shape}`` for every input.

    Call it before running the graph with onnxruntime or another runtime directly: they
    do not read the metadata, and outside the domain the graph computes the branch the
    model took at the traced size (wrong values, or a runtime error).
    """
    domain = read_domain(proto)
    if domain is None:
        return
    if isinstance(shapes, Mapping):
        names = [i.name for i in domain.inputs]
        unknown = sorted(set(shapes) - set(names))
        missing = [n for n in names if n not in shapes]
        if unknown or missing:
            raise ValueError(f'shapes must name the graph inputs {names}, got '
                             f'{sorted(shapes)}')
        shapes = [shapes[n] for n in names]
    found = violations(domain, list(shapes))
    if found:
        raise ValueError(
            'outside the sizes this dynamic graph holds for: ' + '; '.join(found)
            + '; export a graph for this size (dynamic=False)')
