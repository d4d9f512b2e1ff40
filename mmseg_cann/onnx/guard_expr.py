"""Torch.export's guard expressions over input sizes: evaluated at given shapes, and
proven true over ranges of sizes (used by :mod:`.dynamic_domain`).

A guard is the Python source torch's ``ShapeGuardPythonPrinter`` writes, with inputs
named as the model's ``forward`` takes them: ``L['x'].size()[2]``, ``L['feats'][0]
.size()[3]``. It is never given to ``eval`` (a graph's metadata may come from anywhere):
:func:`evaluate_guard` interprets the printer's vocabulary only -- numbers, ``+ - * //
% / **``, comparisons, ``and``/``or``/``not``, ``max``/``min``/``abs``/``int``/
``float``/``round``, ``math.floor``/``ceil``/``trunc``/``sqrt``, ``torch.sym_float`` --
and calls anything else *not checkable*. :func:`proven_true` bounds the expression by
interval arithmetic.
"""
from __future__ import annotations

import ast
import functools
import math
import re
from typing import List, Mapping, Optional, Sequence, Tuple

#: how the printer writes an input-size reference: ``L['x'].size()[2]``
SIZE_REF = re.compile(r"(L(?:\[(?:'[^']*'|\d+)\])+)\.size\(\)\[(\d+)\]")


def guard_references(guard: str) -> List[Tuple[str, int]]:
    """The ``(source, axis)`` sizes a guard reads, in order of appearance."""
    return list(dict.fromkeys((m.group(1), int(m.group(2)))
                              for m in SIZE_REF.finditer(guard)))


class NotCheckable(Exception):
    """A guard outside the vocabulary :func:`evaluate_guard` interprets."""


_BINARY = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b,
           ast.Mult: lambda a, b: a * b, ast.FloorDiv: lambda a, b: a // b,
           ast.Mod: lambda a, b: a % b, ast.Div: lambda a, b: a / b,
           ast.Pow: lambda a, b: _power(a, b)}
_COMPARE = {ast.Eq: lambda a, b: a == b, ast.NotEq: lambda a, b: a != b,
            ast.Lt: lambda a, b: a < b, ast.LtE: lambda a, b: a <= b,
            ast.Gt: lambda a, b: a > b, ast.GtE: lambda a, b: a >= b}
#: the functions the printer writes, by their dotted name
_FUNCTIONS = {'max': max, 'min': min, 'abs': abs, 'int': int, 'float': float,
              'round': round, 'math.floor': math.floor, 'math.ceil': math.ceil,
              'math.trunc': math.trunc, 'math.sqrt': math.sqrt,
              'torch.sym_float': float, 'torch.sym_max': max, 'torch.sym_min': min,
              'torch._sym_sqrt': math.sqrt}
#: the constants it writes
_CONSTANTS = {'math.inf': math.inf, 'inf': math.inf}


def _power(a, b):
    if abs(b) > 64:
        raise NotCheckable(f'exponent {b}')
    return a ** b


def evaluate_guard(guard: str, shapes: Mapping[str, Sequence[int]]) -> Optional[bool]:
    """The value of ``guard`` at ``shapes`` (guard name, e.g. ``L['x']``, -> shape), or
    None when the guard is not checkable (syntax or a name outside the printer's
    vocabulary, a reference to an input or axis not in ``shapes``, a division by zero)."""
    try:
        return bool(_Evaluator(shapes).visit(_parse(guard)))
    except (NotCheckable, ZeroDivisionError, OverflowError, ValueError):
        return None


@functools.lru_cache(maxsize=4096)
def _parse(guard: str) -> ast.AST:
    """The guard's syntax tree (cached: a domain check evaluates each guard at many
    sizes; the evaluator only reads the tree)."""
    try:
        return ast.parse(guard, mode='eval').body
    except SyntaxError as exc:
        raise NotCheckable(str(exc)) from None


def _dotted(node) -> Optional[str]:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return None if base is None else f'{base}.{node.attr}'
    return None


def size_reference(node) -> Optional[Tuple[str, int]]:
    """``(source, axis)`` when ``node`` is ``L[...].size()[axis]``, else None."""
    if not (isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant)
            and type(node.slice.value) is int):
        return None
    call = node.value
    if not (isinstance(call, ast.Call) and not call.args and not call.keywords
            and isinstance(call.func, ast.Attribute) and call.func.attr == 'size'):
        return None
    keys, base = [], call.func.value
    while isinstance(base, ast.Subscript):
        if not (isinstance(base.slice, ast.Constant)
                and type(base.slice.value) in (int, str)):
            return None
        keys.append(base.slice.value)
        base = base.value
    if not (isinstance(base, ast.Name) and base.id == 'L' and keys):
        return None
    return 'L' + ''.join(f'[{k!r}]' for k in reversed(keys)), node.slice.value


class _Evaluator:
    """Interprets the printer's vocabulary over concrete shapes; anything else raises
    :class:`NotCheckable`."""

    def __init__(self, shapes):
        self.shapes = shapes

    def visit(self, node):
        ref = size_reference(node)
        if ref is not None:
            return self.size(*ref)
        method = getattr(self, 'visit_' + type(node).__name__, None)
        if method is None:
            raise NotCheckable(type(node).__name__)
        return method(node)

    def size(self, source, axis):
        shape = self.shapes.get(source)
        if shape is None or not 0 <= axis < len(shape):
            raise NotCheckable(f'{source}.size()[{axis}]')
        return int(shape[axis])

    def visit_Constant(self, node):
        if type(node.value) not in (int, float, bool):
            raise NotCheckable(repr(node.value))
        return node.value

    def visit_Name(self, node):
        return self.constant(node)

    def visit_Attribute(self, node):
        return self.constant(node)

    def constant(self, node):
        name = _dotted(node)
        if name not in _CONSTANTS:
            raise NotCheckable(str(name))
        return _CONSTANTS[name]

    def visit_UnaryOp(self, node):
        value = self.visit(node.operand)
        if isinstance(node.op, ast.Not):
            return not value
        if isinstance(node.op, ast.USub):
            return -value
        if isinstance(node.op, ast.UAdd):
            return +value
        raise NotCheckable(type(node.op).__name__)

    def visit_BinOp(self, node):
        op = _BINARY.get(type(node.op))
        if op is None:
            raise NotCheckable(type(node.op).__name__)
        return op(self.visit(node.left), self.visit(node.right))

    def visit_BoolOp(self, node):
        values = [bool(self.visit(v)) for v in node.values]  # all checkable, or none
        return all(values) if isinstance(node.op, ast.And) else any(values)

    def visit_Compare(self, node):
        left, result = self.visit(node.left), True
        for op, right_node in zip(node.ops, node.comparators):
            compare = _COMPARE.get(type(op))
            if compare is None:
                raise NotCheckable(type(op).__name__)
            right = self.visit(right_node)
            result = result and compare(left, right)
            left = right
        return result

    def visit_Call(self, node):
        fn = _FUNCTIONS.get(_dotted(node.func))
        if fn is None or node.keywords or not node.args:
            raise NotCheckable(ast.unparse(node.func))
        return fn(*[self.visit(a) for a in node.args])


# -- interval proof

def proven_true(guard: str, ranges: Mapping[str, Sequence[Tuple[int, Optional[int]]]]) \
        -> bool:
    """Whether ``guard`` holds for every size within ``ranges`` (guard name -> per axis
    ``(low, high)``), shown by interval arithmetic: each sub-expression's value bounded
    over the box of ranges (sound: the bounds may be loose, never wrong), a comparison
    true when the bounds of its two sides cannot overlap the wrong way. False when that
    does not prove it (the guard is then kept)."""
    try:
        return _Bounds(ranges).truth(_parse(guard)) == {True}
    except (NotCheckable, ZeroDivisionError, OverflowError, ValueError):
        return False


_UNKNOWN = (-math.inf, math.inf)


class _Bounds:
    """``(low, high)`` of a numeric node, ``{True}``/``{False}``/``{True, False}`` of a
    boolean one, over the box of ranges."""

    def __init__(self, ranges):
        self.ranges = ranges

    def value(self, node) -> Tuple[float, float]:
        ref = size_reference(node)
        if ref is not None:
            source, axis = ref
            axes = self.ranges.get(source)
            if axes is None or not 0 <= axis < len(axes):
                raise NotCheckable(source)
            lo, hi = axes[axis]
            return float(lo), math.inf if hi is None else float(hi)
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return float(node.value), float(node.value)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            lo, hi = self.value(node.operand)
            return -hi, -lo
        if isinstance(node, ast.BinOp):
            return self.binary(type(node.op), self.value(node.left), self.value(node.right))
        if isinstance(node, ast.Call) and not node.keywords and node.args:
            return self.call(_dotted(node.func), [self.value(a) for a in node.args])
        return _UNKNOWN

    @staticmethod
    def binary(op, a, b):
        if op is ast.Add:
            return a[0] + b[0], a[1] + b[1]
        if op is ast.Sub:
            return a[0] - b[1], a[1] - b[0]
        if op is ast.Mult:
            products = [_times(x, y) for x in a for y in b]
            return min(products), max(products)
        if op in (ast.FloorDiv, ast.Div) and b[0] > 0:
            # a positive divisor: a / b is monotone in a and in b on the box, so its
            # bounds are at the corners
            quotients = [x / y for x in a for y in b]
            if any(math.isnan(q) for q in quotients):
                return _UNKNOWN
            lo, hi = min(quotients), max(quotients)
            if op is ast.FloorDiv:
                lo, hi = (math.floor(v) if math.isfinite(v) else v for v in (lo, hi))
            return lo, hi
        if op is ast.Mod and b[0] == b[1] and b[0] > 0:
            return 0.0, b[0]  # Python's a % c lies in [0, c) for c > 0
        return _UNKNOWN

    @staticmethod
    def call(name, args):
        if name in ('max', 'torch.sym_max'):
            return max(a[0] for a in args), max(a[1] for a in args)
        if name in ('min', 'torch.sym_min'):
            return min(a[0] for a in args), min(a[1] for a in args)
        monotone = {'math.floor': math.floor, 'math.ceil': math.ceil,
                    'math.trunc': math.trunc, 'int': math.trunc, 'float': float,
                    'torch.sym_float': float}.get(name)
        if monotone is not None and len(args) == 1:
            lo, hi = args[0]
            return (monotone(lo) if math.isfinite(lo) else lo,
                    monotone(hi) if math.isfinite(hi) else hi)
        return _UNKNOWN

    def truth(self, node) -> set:
        if isinstance(node, ast.BoolOp):
            parts = [self.truth(v) for v in node.values]
            if isinstance(node.op, ast.And):
                return {False} if any(p == {False} for p in parts) else \
                    {True} if all(p == {True} for p in parts) else {True, False}
            return {True} if any(p == {True} for p in parts) else \
                {False} if all(p == {False} for p in parts) else {True, False}
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            return {not v for v in self.truth(node.operand)}
        if isinstance(node, ast.Compare):
            result, left = {True}, self.value(node.left)
            for op, right_node in zip(node.ops, node.comparators):
                right = self.value(right_node)
                part = _compare_bounds(type(op), left, right)
                result = {False} if {False} in (result, part) else \
                    {True} if result == part == {True} else {True, False}
                left = right
            return result
        return {True, False}


def _times(x, y):
    return 0.0 if x == 0 or y == 0 else x * y


def _compare_bounds(op, a, b) -> set:
    (alo, ahi), (blo, bhi) = a, b
    if op in (ast.Lt, ast.Gt):
        if op is ast.Gt:
            (alo, ahi), (blo, bhi) = b, a
        return {True} if ahi < blo else {False} if alo >= bhi else {True, False}
    if op in (ast.LtE, ast.GtE):
        if op is ast.GtE:
            (alo, ahi), (blo, bhi) = b, a
        return {True} if ahi <= blo else {False} if alo > bhi else {True, False}
    same = alo == ahi == blo == bhi and math.isfinite(alo)
    apart = ahi < blo or bhi < alo
    if op is ast.Eq:
        return {True} if same else {False} if apart else {True, False}
    if op is ast.NotEq:
        return {True} if apart else {False} if same else {True, False}
    return {True, False}
