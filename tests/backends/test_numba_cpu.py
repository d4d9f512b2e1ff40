"""The numba CPU kernels of the fused ops against PyTorch and the float64 reference."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from mmseg_cann.backends import fused as fused_backend
from mmseg_cann.backends import numba_cpu
from mmseg_cann.ops.fused import upsample_add, upsample_argmax
from tests._helpers import make_input, run_python
from tests._helpers import assert_within_interpolation_rounding

pytestmark = pytest.mark.skipif(not numba_cpu.available(), reason='numba is not installed')

#: the compiled PyTorch kernel whose arithmetic (fused multiply-adds) the kernels follow
#: was read off torch 2.13's AVX2 build; other builds may contract differently
AVX2 = torch.backends.cpu.get_cpu_capability() == 'AVX2'
#: decoder shapes: FPN top-down 2x, the output head's 4x and 8x, a non-integer ratio
UPSAMPLING = [((16, 32), (32, 64)), ((32, 64), (128, 256)), ((16, 24), (128, 192)),
              ((13, 21), (50, 77))]
#: shapes whose bilinear values were bit-identical to PyTorch's (AVX2 build, both
#: align_corners settings)
BIT_IDENTICAL = [((32, 64), (128, 256)), ((16, 24), (128, 192)), ((64, 128), (128, 256))]


def _calls(monkeypatch, name):
    """Count the calls of one numba kernel wrapper."""
    calls = []
    real = getattr(numba_cpu, name)
    monkeypatch.setattr(numba_cpu, name, lambda *a: calls.append(1) or real(*a))
    return calls


@pytest.mark.parametrize('align_corners', [False, True])
def test_upsample_add_runs_the_kernel_within_rounding_of_pytorch(monkeypatch, align_corners):
    calls = _calls(monkeypatch, 'upsample_add_into')
    for seed, ((h, w), (H, W)) in enumerate(UPSAMPLING):
        x = make_input((2, 3, h, w), seed=seed)
        other = make_input((2, 3, H, W), seed=50 + seed)
        got = upsample_add(x, other, align_corners=align_corners)
        want = other + F.interpolate(x, (H, W), mode='bilinear', align_corners=align_corners)
        # tests/ops/test_fused.py checks the float64 reference as well
        assert_within_interpolation_rounding(got, want, x)
    assert len(calls) == len(UPSAMPLING)


@pytest.mark.skipif(not AVX2, reason='bit-identity observed on the AVX2 build of PyTorch')
@pytest.mark.parametrize('align_corners', [False, True])
def test_upsample_add_is_bit_identical_on_decoder_shapes(align_corners):
    """On outputs 192 or more columns wide (the benchmark's and real decoders') the values
    are PyTorch's bit for bit; narrower outputs such as 32x64 differ in the last bit in
    about a quarter of the values (PyTorch's compiled loop contracts differently there)."""
    for seed, ((h, w), (H, W)) in enumerate(BIT_IDENTICAL):
        x = make_input((2, 8, h, w), seed=seed)
        other = make_input((2, 8, H, W), seed=50 + seed)
        want = other + F.interpolate(x, (H, W), mode='bilinear', align_corners=align_corners)
        assert torch.equal(upsample_add(x, other, align_corners=align_corners), want)


@pytest.mark.parametrize('align_corners', [False, True])
def test_upsample_argmax_labels_match_pytorch(monkeypatch, align_corners):
    calls = _calls(monkeypatch, 'upsample_argmax_into')
    shapes = UPSAMPLING + [((9, 11), (4, 5)), ((1, 6), (3, 13)), ((6, 1), (13, 3))]
    for seed, ((h, w), (H, W)) in enumerate(shapes):
        x = make_input((3, 7, h, w), seed=seed)
        values = F.interpolate(x, (H, W), mode='bilinear', align_corners=align_corners)
        got = upsample_argmax(x, (H, W), align_corners=align_corners)
        want = values.argmax(1)
        differ = got != want
        if differ.any():  # only where the two best classes are within rounding
            top = values.double().topk(2, dim=1).values
            assert float((top[:, 0] - top[:, 1])[differ].max()) <= 1e-6
        assert int(differ.sum()) <= 2, ((h, w), (H, W), int(differ.sum()))
    assert len(calls) == len(shapes)


@pytest.mark.skipif(not AVX2, reason='bit-identity observed on the AVX2 build of PyTorch')
def test_upsample_argmax_keeps_first_of_exact_ties_and_nans_like_torch():
    x = torch.randint(0, 3, (2, 6, 16, 24)).float()  # many exact ties
    x[0, 4, 3, 5] = float('nan')
    x[1, 2, 7, 7] = x[1, 5, 7, 7] = float('nan')  # two NaN classes: the first wins
    for align in (False, True):
        want = F.interpolate(x, (128, 192), mode='bilinear', align_corners=align).argmax(1)
        got = upsample_argmax(x, (128, 192), align_corners=align)
        assert torch.equal(got, want)
        assert bool((got[0] == 4).any()) and bool((got[1] == 2).any())


def _structured_logits(n, c, h, w, seed=0):
    """Decoder-like logits: smooth per-class fields (one class clearly ahead over most of
    the map, close races along the boundaries) plus a little noise."""
    gen = torch.Generator().manual_seed(seed)
    coarse = torch.randn((n, c, h // 4 + 2, w // 4 + 2), generator=gen) * 4
    fields = F.interpolate(coarse, (h, w), mode='bicubic', align_corners=True)
    return fields + 0.1 * torch.randn((n, c, h, w), generator=gen)


def _labels(x, size, align_corners, prune):
    from mmseg_cann.core.taps import linear_taps
    taps = [tuple(t.numpy() for t in linear_taps(i, o, align_corners))
            for i, o in zip(x.shape[-2:], size)]
    out = torch.empty((x.shape[0],) + tuple(size), dtype=torch.int64)
    numba_cpu.upsample_argmax_into(x.contiguous().numpy(), out.numpy(), *taps, prune=prune)
    return out


def _awkward_logits():
    """Inputs for the class pruning: structured, iid, one dominant class, exact ties,
    NaN, infinities, huge and tiny magnitudes, a class only ahead at single pixels."""
    structured = _structured_logits(2, 19, 24, 40)
    dominant = make_input((1, 7, 16, 24), seed=3)
    dominant[:, 2] += 50
    ties = torch.randint(0, 3, (1, 6, 16, 24), generator=torch.Generator().manual_seed(4))
    special = _structured_logits(1, 9, 16, 24, seed=5)
    special[0, 4, 3, 5] = float('nan')
    special[0, 1, 9, 9] = float('inf')
    special[0, 6, 12, 2] = float('-inf')
    scaled = _structured_logits(1, 9, 16, 24, seed=6) * 1e30
    tiny = _structured_logits(1, 9, 16, 24, seed=7) * 1e-30
    spikes = _structured_logits(1, 5, 16, 24, seed=8)
    spikes[0, 3, 5::4, 7::5] += 30  # isolated peaks of a class that is behind elsewhere
    near = _structured_logits(1, 4, 16, 24, seed=9)
    near[0, 1] = near[0, 0] + 1e-7 * torch.randn((16, 24), generator=torch.Generator())
    return {'structured': structured, 'iid': make_input((1, 150, 12, 20), seed=2),
            'dominant': dominant, 'ties': ties.float(), 'special': special,
            'scaled': scaled, 'tiny': tiny, 'spikes': spikes, 'near_tie': near}


@pytest.mark.parametrize('align_corners', [False, True])
@pytest.mark.parametrize('size', [(128, 192), (50, 77), (9, 13)])
def test_argmax_class_pruning_changes_no_label(align_corners, size):
    """The kernel skips, per run of output columns, the classes whose corner values lie
    below another class's by more than the rounding bound; the labels must be those of
    evaluating every class (bit for bit, NaN/infinity/tie rules included)."""
    for name, x in _awkward_logits().items():
        pruned = _labels(x, size, align_corners, prune=True)
        full = _labels(x, size, align_corners, prune=False)
        assert torch.equal(pruned, full), (name, int((pruned != full).sum()))


def test_argmax_pruning_follows_torch_on_structured_logits():
    x = _structured_logits(1, 19, 32, 64)
    values = F.interpolate(x, (256, 512), mode='bilinear')
    got = upsample_argmax(x, (256, 512))
    differ = got != values.argmax(1)
    if differ.any():  # only where the two best classes are within rounding
        top = values.double().topk(2, dim=1).values
        assert float((top[:, 0] - top[:, 1])[differ].max()) <= 1e-6
    assert int(differ.sum()) <= 2


def test_argmax_nan_rule_without_bit_identity():
    """A NaN class is the maximum wherever its NaN reaches (any PyTorch build)."""
    x = make_input((1, 4, 8, 8))
    x[0, 3, 2, 2] = float('nan')
    values = F.interpolate(x, (64, 64), mode='bilinear')
    nan_pixels = values.isnan().any(1)
    got = upsample_argmax(x, (64, 64))
    assert bool(nan_pixels.any()) and bool((got[nan_pixels] == 3).all())


def test_leaves_that_require_grad_under_no_grad():
    """Under no_grad nothing is tracked, so the fused kernels run on such tensors too."""
    x = make_input((1, 3, 8, 8)).requires_grad_()
    other = make_input((1, 3, 32, 32), seed=1).requires_grad_()
    with torch.no_grad():
        got = upsample_add(x, other)
        labels = upsample_argmax(x, (32, 32))
        want = other + F.interpolate(x, (32, 32), mode='bilinear')
        want_labels = F.interpolate(x, (32, 32), mode='bilinear').argmax(1)
    assert not got.requires_grad
    assert_within_interpolation_rounding(got, want, x)
    assert int((labels != want_labels).sum()) <= 2


FORK_SCRIPT = """
import os, torch, torch.nn.functional as F
from mmseg_cann.ops.fused import upsample_argmax
from mmseg_cann.utils import fallback_counts
x = torch.randn(1, 5, 16, 16)
upsample_argmax(x, (64, 64))  # the kernels' thread pool starts in the parent
pid = os.fork()
if pid == 0:
    torch.set_num_threads(1)  # what a forked worker must do for torch itself (DataLoader)
    labels = upsample_argmax(x, (64, 64))
    want = F.interpolate(x, (64, 64), mode='bilinear').argmax(1)
    took_torch_path = any(op == 'upsample_argmax' for op, _ in fallback_counts())
    os._exit(0 if took_torch_path and int((labels != want).sum()) <= 2 else 3)
_, status = os.waitpid(pid, 0)
print('child status', status)
"""


def test_forked_child_takes_the_torch_path():
    """GNU OpenMP is not fork-safe: numba terminates a child that runs a parallel kernel
    after its parent did, even on one thread. The fused ops then take the torch path
    (counted), which works in a child on one thread (torch's own parallel ops hang in a
    forked child that keeps several threads, so forked workers set one, as PyTorch's
    DataLoader does)."""
    result = run_python(['-c', FORK_SCRIPT], timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert 'child status 0' in result.stdout, result.stdout + result.stderr[-2000:]


def test_kernel_follows_torch_thread_count():
    import numba
    previous = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        upsample_argmax(make_input((1, 3, 8, 8)), (32, 32))
        assert numba.get_num_threads() == 1
    finally:
        torch.set_num_threads(previous)


def test_without_numba_the_torch_paths_run(monkeypatch):
    monkeypatch.setattr(numba_cpu, 'available', lambda: False)
    for name in ('upsample_add_into', 'upsample_argmax_into'):
        monkeypatch.setattr(numba_cpu, name, lambda *a: pytest.fail('numba kernel ran'))
    x, other = make_input((1, 3, 8, 8)), make_input((1, 3, 16, 16), seed=1)
    want = other + F.interpolate(x, (16, 16), mode='bilinear')
    assert torch.equal(upsample_add(x, other), want)  # upsample + in-place add
    labels = upsample_argmax(x, (16, 16))
    assert labels.shape == (1, 16, 16)


@pytest.mark.parametrize('dtype, layout', [(torch.float16, 'contiguous'),
                                           (torch.float64, 'contiguous'),
                                           (torch.float32, 'channels_last')])
def test_kernel_applies_only_to_contiguous_float32(dtype, layout):
    x = make_input((1, 3, 4, 4), dtype, layout)
    spec = fused_backend.geo.upsample_spec((4, 4), fused_backend.geo.check_upsample_args(
        size=(8, 8), mode='bilinear', align_corners=False))
    assert not fused_backend._numba_kernel_applies('upsample_argmax', spec, x)
    assert fused_backend._numba_kernel_applies('upsample_argmax', spec,
                                                x.float().contiguous())


@pytest.mark.parametrize('h, H, low_row_bytes, jobs, threads', [
    (128, 1024, 2048 * 4, 256, 2), (128, 1024, 2048 * 4, 1, 2), (1, 2, 8, 1, 4),
    (64, 128, 1 << 24, 6, 2), (9, 4, 40, 2, 16)])
def test_chunk_rows_stays_within_the_buffer_and_balances(h, H, low_row_bytes, jobs, threads):
    rows = numba_cpu.chunk_rows(h, H, low_row_bytes, jobs, threads)
    assert 1 <= rows <= H
    if rows > 1:  # a chunk's W-interpolated rows fit the buffer
        assert (rows * h / H + 2) * low_row_bytes <= numba_cpu.CHUNK_BUFFER_BYTES * 1.01
    # enough chunks for every thread unless a chunk is one row already
    assert rows == 1 or jobs * -(-H // rows) >= min(4 * threads, jobs * H)
