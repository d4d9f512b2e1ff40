"""torch.export's guard expressions (``mmseg_cann.onnx.guard_expr``): evaluated at given
shapes without ``eval``, and proven true over size ranges only when they are."""
from __future__ import annotations

import itertools

import pytest

from mmseg_cann.onnx.guard_expr import evaluate_guard, guard_references, proven_true

X = "L['x']"
#: guards torch.export wrote for the test models and mmseg's DPT / SegFormer
EVEN_H = "(2 + 2*(((-1) + L['x'].size()[2]) // 2)) == L['x'].size()[2]"
MULTIPLE_16 = "max(0, ((-1)*L['x'].size()[3]) + 16*math.ceil(L['x'].size()[3] / 16)) <= 0"
BOTH_16 = "L['x'].size()[3] >= 16 and L['x'].size()[2] >= 16"
TOKENS = "(1 + (L['x'].size()[3] // 16)*(L['x'].size()[2] // 16)) != 197"
SAME_BATCH = "L['feats'][1].size()[0] == L['feats'][0].size()[0]"


def _x(h, w, n=1):
    return {X: (n, 3, h, w)}


@pytest.mark.parametrize('guard, shapes, expected', [
    (EVEN_H, _x(8, 8), True), (EVEN_H, _x(7, 8), False), (EVEN_H, _x(2, 3), True),
    (MULTIPLE_16, _x(8, 32), True), (MULTIPLE_16, _x(8, 40), False),
    (BOTH_16, _x(16, 16), True), (BOTH_16, _x(15, 64), False),
    (TOKENS, _x(224, 224), False), (TOKENS, _x(224, 192), True),
    (SAME_BATCH, {"L['feats'][0]": (2, 4, 8, 8), "L['feats'][1]": (2, 8, 4, 4)}, True),
    (SAME_BATCH, {"L['feats'][0]": (2, 4, 8, 8), "L['feats'][1]": (1, 8, 4, 4)}, False),
    ("not L['x'].size()[0] == 1", _x(4, 4, n=2), True),
    ("1 < L['x'].size()[2] <= 4", _x(4, 4), True), ("1 < L['x'].size()[2] <= 4", _x(5, 4), False),
    ("L['x'].size()[2] % 3 == 1 or L['x'].size()[3] ** 2 == 49", _x(6, 7), True),
    ("min(L['x'].size()[2], 5) + abs(-2) == 7 and math.floor(L['x'].size()[3] / 2) == 3",
     _x(9, 7), True),
    ("torch.sym_float(L['x'].size()[2]) / 2 < math.inf", _x(9, 7), True),
])
def test_evaluate_guard(guard, shapes, expected):
    assert evaluate_guard(guard, shapes) is expected


@pytest.mark.parametrize('guard', [
    "__import__('os').system('true') == 0",  # a call outside the vocabulary
    "L['x'].stride()[0] == 1",                # not a size
    "L['y'].size()[0] == 1",                  # an input the shapes do not hold
    "L['x'].size()[4] == 1",                  # an axis it does not have
    "L['x'].size()[2] // 0 == 1",             # division by zero
    "L['x'].size()[2] ** 100 > 1",            # exponent beyond the printer's use
    "(lambda: 1)() == 1", "[1][0] == 1", "L['x'].size()[2] == ",
])
def test_guards_outside_the_vocabulary_are_not_checkable(guard):
    assert evaluate_guard(guard, _x(8, 8)) is None


def test_guard_references():
    assert guard_references(SAME_BATCH) == [("L['feats'][1]", 0), ("L['feats'][0]", 0)]
    assert guard_references(BOTH_16) == [(X, 3), (X, 2)]


@pytest.mark.parametrize('guard, low, expected', [
    ("(L['x'].size()[3] // 16) > 1", 32, True), ("(L['x'].size()[3] // 16) > 1", 31, False),
    ("1 < 3*L['x'].size()[3]*L['x'].size()[2]", 33, True),
    ("1 < 3*L['x'].size()[3]*L['x'].size()[2]", 0, False),
    (BOTH_16, 32, True), (BOTH_16, 8, False),
    (EVEN_H, 32, False), (MULTIPLE_16, 32, False), (TOKENS, 32, False),
    ("max(1, L['x'].size()[2] // 4) != 0", 0, True),
    ("L['x'].size()[2] % 16 < 16", 0, False),  # true, but beyond interval bounds: kept
])
def test_proven_true(guard, low, expected):
    ranges = {X: [(1, 2), (3, 3), (low, None), (low, None)]}
    assert proven_true(guard, ranges) is expected


@pytest.mark.parametrize('guard', [
    EVEN_H, MULTIPLE_16, BOTH_16, TOKENS, "(L['x'].size()[3] // 16) > 1",
    "1 < 3*L['x'].size()[3]*L['x'].size()[2]", "L['x'].size()[2] - L['x'].size()[3] < 9",
    "(L['x'].size()[2] // 3) * 3 >= L['x'].size()[2] - 2",
    "math.ceil(L['x'].size()[2] / 5) <= L['x'].size()[2] // 5 + 1",
    "not (L['x'].size()[2] // 4 == 2)", "max(L['x'].size()[2], 7) >= 7 or False",
])
@pytest.mark.parametrize('low, high', [(1, 40), (16, 48), (33, 64), (7, 9)])
def test_proven_true_only_where_it_holds(guard, low, high):
    """Soundness: whatever is proven holds at every size of the (bounded) ranges."""
    ranges = {X: [(1, 2), (3, 3), (low, high), (low, high)]}
    if proven_true(guard, ranges):
        for n, h, w in itertools.product((1, 2), range(low, high + 1), range(low, high + 1)):
            assert evaluate_guard(guard, {X: (n, 3, h, w)}), (n, h, w)
