"""Every small pooling geometry against real PyTorch calls.

Input H and W 1..6, kernel 1..4, stride 1..3, padding 0..2, dilation 1..3 (max pooling),
``ceil_mode`` both, ``count_include_pad`` both (average pooling): the ops, the modules
and every backend must accept exactly the geometries PyTorch accepts, with PyTorch's
values and indices, and reject the others with an exception that is an instance of
PyTorch's.
"""
import itertools

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mmseg_cann import ops
from mmseg_cann.backends import numba_ops
from mmseg_cann.models import CANNAvgPool2d, CANNMaxPool2d

from tests._helpers import compare_with_torch, outcome, same_tensors

SIZES = range(1, 7)
#: (H, W) pairs of the backend sweeps: every size on each axis once (the axes are
#: computed independently; the ops tests take all 36 pairs)
AXIS_PAIRS = [(h, 7 - h) for h in SIZES]
MAX_GEOMETRIES = list(itertools.product(range(1, 5), range(1, 4), range(0, 3), range(1, 4),
                                        (False, True)))
AVG_GEOMETRIES = list(itertools.product(range(1, 5), range(1, 4), range(0, 3), (False, True),
                                        (False, True)))


@pytest.fixture(autouse=True)
def _one_thread():
    """Thousands of tiny calls: PyTorch's thread pool only adds contention."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _input(h: int, w: int) -> torch.Tensor:
    """Small integer values (ties for the index rule, exact sums for the averages)."""
    gen = torch.Generator().manual_seed(h * 7 + w)
    return torch.randint(-3, 4, (1, 2, h, w), generator=gen).float()


def _max_cases(pairs=tuple(itertools.product(SIZES, SIZES))):
    for (h, w), (k, s, p, d, ceil) in itertools.product(pairs, MAX_GEOMETRIES):
        yield h, w, k, s, p, d, ceil


def _avg_cases(pairs=tuple(itertools.product(SIZES, SIZES))):
    for (h, w), (k, s, p, ceil, cip) in itertools.product(pairs, AVG_GEOMETRIES):
        yield h, w, k, s, p, ceil, cip


def _past_padded_input(h, w, k, p, d=1) -> bool:
    """Whether a window extends past the padded input on some axis (accepted by PyTorch
    only through ``ceil_mode``; the case earlier versions rejected)."""
    return min(h, w) + 2 * p < d * (k - 1) + 1


def test_max_pool2d_accepts_and_rejects_as_pytorch():
    problems, accepted = [], 0
    for h, w, k, s, p, d, ceil in _max_cases():
        x = _input(h, w)
        label = f'max_pool2d {h}x{w} k={k} s={s} p={p} d={d} ceil={ceil}'
        expected = compare_with_torch(lambda: F.max_pool2d(x, k, s, p, d, ceil, True),
                            lambda: ops.max_pool2d(x, k, s, p, d, ceil, True), label, problems)
        compare_with_torch(lambda: nn.MaxPool2d(k, s, p, d, True, ceil)(x),
                 lambda: CANNMaxPool2d(k, s, p, d, True, ceil)(x), f'module {label}', problems)
        accepted += expected is not None
    assert not problems, f'{len(problems)} mismatches, e.g. {problems[:5]}'
    assert 0 < accepted < len(SIZES) ** 2 * len(MAX_GEOMETRIES)


def test_avg_pool2d_accepts_and_rejects_as_pytorch():
    problems, accepted = [], 0
    for h, w, k, s, p, ceil, cip in _avg_cases():
        x = _input(h, w)
        label = f'avg_pool2d {h}x{w} k={k} s={s} p={p} ceil={ceil} count_include_pad={cip}'
        expected = compare_with_torch(lambda: F.avg_pool2d(x, k, s, p, ceil, cip),
                            lambda: ops.avg_pool2d(x, k, s, p, ceil, cip), label, problems)
        compare_with_torch(lambda: nn.AvgPool2d(k, s, p, ceil, cip)(x),
                 lambda: CANNAvgPool2d(k, s, p, ceil, cip)(x), f'module {label}', problems)
        accepted += expected is not None
    assert not problems, f'{len(problems)} mismatches, e.g. {problems[:5]}'
    assert 0 < accepted < len(SIZES) ** 2 * len(AVG_GEOMETRIES)


def test_ceil_mode_window_past_the_input_is_accepted():
    """A user's report: the last ceil-mode window starts inside the input and runs
    past it (PyTorch keeps it)."""
    x = torch.randn(1, 1, 1, 5)
    expected = nn.MaxPool2d(2, 2, ceil_mode=True)(x)
    assert expected.shape == (1, 1, 1, 3)
    assert torch.equal(CANNMaxPool2d(2, 2, ceil_mode=True)(x), expected)
    assert torch.equal(ops.avg_pool2d(x, 2, 2, ceil_mode=True),
                       F.avg_pool2d(x, 2, 2, ceil_mode=True))


BACKENDS = ['reference', 'portable', 'npu', 'tuned',
            pytest.param('fast', marks=pytest.mark.skipif(not numba_ops.available(),
                                                           reason='numba is not installed'))]


@pytest.fixture
def _tuning_cache(tmp_path, monkeypatch):
    monkeypatch.setenv('MMSEG_CANN_TUNING_CACHE', str(tmp_path / 'tuning.json'))


def _in_sweep(backend: str, h, w, k, p, d) -> bool:
    """Every case, or for the tuned backend (which times each new call once) the
    geometries whose windows run past the padded input."""
    return backend != 'tuned' or _past_padded_input(h, w, k, p, d)


@pytest.mark.parametrize('backend', BACKENDS)
@pytest.mark.usefixtures('_tuning_cache')
def test_backends_on_every_accepted_max_geometry(backend):
    """Values (and indices, where the backend returns them) of every geometry PyTorch
    accepts, bit for bit."""
    indices = backend != 'portable'  # the portable form has no indices (export)
    problems = []
    for h, w, k, s, p, d, ceil in _max_cases(AXIS_PAIRS):
        if not _in_sweep(backend, h, w, k, p, d):
            continue
        x = _input(h, w)
        expected, error = outcome(lambda: F.max_pool2d(x, k, s, p, d, ceil, indices))
        if error is not None:
            continue
        got = ops.max_pool2d(x, k, s, p, d, ceil, indices, backend=backend)
        if not same_tensors(expected, got):
            problems.append(f'{h}x{w} k={k} s={s} p={p} d={d} ceil={ceil}')
    assert not problems, f'{len(problems)} geometries differ, e.g. {problems[:5]}'


@pytest.mark.parametrize('backend', BACKENDS)
@pytest.mark.usefixtures('_tuning_cache')
def test_backends_on_every_accepted_avg_geometry(backend):
    """Averages of every geometry PyTorch accepts: bit for bit (integer-valued input, so
    the sums are exact), within float32 rounding for the portable form (a multiplied
    correction)."""
    problems = []
    for h, w, k, s, p, ceil, cip in _avg_cases(AXIS_PAIRS):
        if not _in_sweep(backend, h, w, k, p, 1):
            continue
        x = _input(h, w)
        expected, error = outcome(lambda: F.avg_pool2d(x, k, s, p, ceil, cip))
        if error is not None:
            continue
        got = ops.avg_pool2d(x, k, s, p, ceil, cip, backend=backend)
        same = (torch.allclose(got, expected, rtol=1e-6, atol=1e-6) if backend == 'portable'
                else same_tensors(expected, got))
        if not same or got.shape != expected.shape:
            problems.append(f'{h}x{w} k={k} s={s} p={p} ceil={ceil} count_include_pad={cip}')
    assert not problems, f'{len(problems)} geometries differ, e.g. {problems[:5]}'
