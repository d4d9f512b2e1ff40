"""roi_pool2d against the real references: ``torchvision.ops.roi_pool`` (its outputs
recorded by ``make oracle``, :mod:`tests.ops.roi_oracle`) for ``mode='max'`` and
``F.adaptive_{max,avg}_pool2d`` of each box's slice for both modes; edge cases, bad
input, gradients, precision and the per-device plan."""
from __future__ import annotations

import sys

import pytest
import torch
import torch.nn.functional as F

from mmseg_cann.backends import roi_npu
from mmseg_cann.core import roi as roi_rules
from mmseg_cann.ops import roi_pool2d
from tests.ops import roi_oracle
from tests.ops.roi_oracle import ORACLE_CASES, inside_boxes, random_map

BACKENDS = ('fast', 'native')


@pytest.fixture(scope='module')
def oracle():
    """torchvision's results for :data:`ORACLE_CASES`, as recorded by ``make oracle``
    (name -> dict(output=, argmax=, grad_input=))."""
    recorded = roi_oracle.load_fixture()
    reason = roi_oracle.stale_reason(recorded)
    if reason:
        pytest.fail(reason, pytrace=False)
    version = recorded['torchvision']
    assert version.startswith(roi_oracle.TORCHVISION), version
    return recorded['results']


def test_recorded_oracle_is_what_torchvision_gives(oracle):
    """Where ``.venv-torchvision`` exists (``make oracle``): the live oracle gives the
    recorded values, argmax and gradients bit for bit."""
    reason = roi_oracle.oracle_missing()
    if reason:
        pytest.skip(reason)
    live = roi_oracle.run_live_oracle()
    assert list(live['results']) == list(oracle)
    for name, ref in oracle.items():
        for key in roi_oracle.FIELDS:
            got, want = live['results'][name][key], ref[key]
            assert (got.dtype, got.shape) == (want.dtype, want.shape), (name, key)
            assert got.numpy().tobytes() == want.numpy().tobytes(), (name, key)


def test_a_changed_case_list_asks_for_make_oracle():
    """Any change to a case (an input value, a box, a size, a scale, a gradient, a name)
    changes the recorded hash, and the fixture then fails naming ``make oracle``."""
    recorded = roi_oracle.load_fixture()
    assert roi_oracle.stale_reason(recorded) == ''
    base = roi_oracle.cases_sha256()
    name = 'float32-edges'
    changes = [('input', lambda c: c['input'].view(-1)[5].add_(2 ** -20)),
               ('rois', lambda c: c['rois'][3, 2].add_(1)),
               ('grad', lambda c: c['grad'].view(-1)[0].neg_()),
               ('output_size', lambda c: c.update(output_size=(4, 3))),
               ('spatial_scale', lambda c: c.update(spatial_scale=0.5))]
    for what, change in changes:
        cases = {n: {k: v.clone() if torch.is_tensor(v) else v for k, v in c.items()}
                 for n, c in ORACLE_CASES.items()}
        change(cases[name])
        assert roi_oracle.cases_sha256(cases) != base, what
        assert 'run `make oracle`' in roi_oracle.stale_reason(recorded, cases), what
    renamed = {('x' + n if n == name else n): c for n, c in ORACLE_CASES.items()}
    assert roi_oracle.cases_sha256(renamed) != base


@pytest.mark.parametrize('backend', BACKENDS)
@pytest.mark.parametrize('name', list(ORACLE_CASES))
def test_max_equals_torchvision(oracle, name, backend):
    case, ref = ORACLE_CASES[name], oracle[name]
    x = case['input'].clone().requires_grad_(True)
    out, index = roi_pool2d(x, case['rois'], case['output_size'], 'max',
                            case['spatial_scale'], return_indices=True, backend=backend)
    torch.testing.assert_close(out, ref['output'], rtol=0, atol=0, equal_nan=True)
    assert index.dtype == torch.int64
    assert torch.equal(index, ref['argmax'].long())
    (out * case['grad']).sum().backward()
    if backend == 'fast':  # the same sums in the same order: equal
        assert torch.equal(x.grad, ref['grad_input'])
    else:
        torch.testing.assert_close(x.grad, ref['grad_input'])


def test_bin_rule_disagreement_is_torchvision_for_max(oracle):
    """roi_h = 3 into 21 bins: torchvision's float32 bins end one row past the box; max
    follows torchvision, avg the adaptive slice."""
    assert (3, 21) in roi_rules.bin_rule_disagreements(8, 21, torch.float32)
    case = ORACLE_CASES['float32-bin-rule']
    x, rois = case['input'], case['rois']
    ours = roi_pool2d(x, rois, (21, 13), 'max')
    assert torch.equal(ours, oracle['float32-bin-rule']['output'])
    adaptive = F.adaptive_max_pool2d(x[0, :, 0:3, 0:3], (21, 13))
    assert not torch.equal(ours[0], adaptive)  # the rules differ here
    avg = roi_pool2d(x, rois, (21, 13), 'avg')
    assert torch.equal(avg[0], F.adaptive_avg_pool2d(x[0, :, 0:3, 0:3], (21, 13)))


def _adaptive_loop(x, rois, size, mode):
    pool = F.adaptive_max_pool2d if mode == 'max' else F.adaptive_avg_pool2d
    return torch.stack([pool(x[b, :, y1:y2 + 1, x1:x2 + 1], size)
                        for b, x1, y1, x2, y2 in rois.long().tolist()])


@pytest.mark.parametrize('backend', BACKENDS)
@pytest.mark.parametrize('dtype', [torch.float32, torch.float64])
@pytest.mark.parametrize('size', [(7, 7), (3, 5), (1, 1), (4, 9), (16, 16)])
def test_avg_equals_adaptive_avg_of_each_slice(backend, dtype, size):
    x = random_map((2, 7, 19, 24), 1, dtype)
    rois = inside_boxes(80, 19, 24, 2, dtype=dtype)
    assert torch.equal(roi_pool2d(x, rois, size, 'avg', backend=backend),
                       _adaptive_loop(x, rois, size, 'avg'))


@pytest.mark.parametrize('backend', BACKENDS)
def test_avg_channels_last_and_scaled_boxes(backend):
    x = random_map((2, 5, 16, 16), 3).contiguous(memory_format=torch.channels_last)
    rois = inside_boxes(30, 16, 16, 4)
    scaled = rois.clone()
    scaled[:, 1:] *= 8  # image coordinates of a stride-8 map
    out = roi_pool2d(x, scaled, (3, 3), 'avg', spatial_scale=1 / 8, backend=backend)
    assert torch.equal(out, _adaptive_loop(x, rois, (3, 3), 'avg'))


@pytest.mark.parametrize('backend', BACKENDS)
@pytest.mark.parametrize('dtype', [torch.float32, torch.float64])
def test_max_equals_adaptive_max_where_the_bin_rules_agree(backend, dtype):
    size = (7, 7)
    rois = inside_boxes(200, 40, 40, 5, dtype=dtype)
    bad = set(roi_rules.bin_rule_disagreements(40, 7, dtype))
    keep = [i for i, r in enumerate(rois.long().tolist())
            if (r[4] - r[2] + 1, 7) not in bad and (r[3] - r[1] + 1, 7) not in bad]
    rois = rois[keep]
    x = random_map((2, 4, 40, 40), 6, dtype)
    assert torch.equal(roi_pool2d(x, rois, size, 'max', backend=backend),
                       _adaptive_loop(x, rois, size, 'max'))


def test_disagreeing_sizes_are_few():
    pairs = roi_rules.bin_rule_disagreements(256, 14, torch.float32)
    assert 0 < len(pairs) < 0.05 * 256 * 14
    assert (3, 21) not in pairs  # out of the listed range
    assert (7, 13) in pairs


# -------------------------------------------------------------------- edge cases
@pytest.mark.parametrize('backend', BACKENDS)
def test_edge_cases_defined(backend):
    x = random_map((2, 3, 8, 8), 7)
    # wholly outside: every bin empty -> 0, index -1
    out, idx = roi_pool2d(x, torch.tensor([[0., 20, 20, 30, 30]]), 2, 'max', 1.0, True,
                          backend=backend)
    assert torch.equal(out, torch.zeros(1, 3, 2, 2)) and bool((idx == -1).all())
    assert torch.equal(roi_pool2d(x, torch.tensor([[1., -9, -9, -2, -2]]), 2, 'avg',
                                  backend=backend), torch.zeros(1, 3, 2, 2))
    # reversed box: the single cell at (x1, y1)
    for mode in ('max', 'avg'):
        out = roi_pool2d(x, torch.tensor([[1., 5, 6, 1, 2]]), 1, mode, backend=backend)
        assert torch.equal(out[0, :, 0, 0], x[1, :, 6, 5])
    # rounding halves away from zero: x1 = 0.5 -> 1, y1 = 1.5 -> 2, x2 = 2.5 -> 3
    out = roi_pool2d(x, torch.tensor([[0., 0.5, 1.5, 2.5, 3.4]]), 1, 'avg', backend=backend)
    assert torch.equal(out, F.adaptive_avg_pool2d(x[0:1, :, 2:4, 1:4], 1))
    # partly outside: bins on the whole box, clipped; avg over the cells inside
    out = roi_pool2d(x, torch.tensor([[0., -2, -2, 3, 3]]), 2, 'avg', backend=backend)
    # (rows 1..3, columns 1..3 is bin (0, 0) of adaptive pooling of a 3x6 slice to 1x2)
    assert torch.equal(out[0, :, 1, 1], F.adaptive_avg_pool2d(x[0, :, 1:4, 1:7], (1, 2))[:, 0, 0])
    assert torch.equal(out[0, :, 0, 0], F.adaptive_avg_pool2d(x[0, :, 0:1, 0:1], 1)[:, 0, 0])
    # K = 0
    for mode in ('max', 'avg'):
        assert roi_pool2d(x, torch.zeros(0, 5), (3, 2), mode, backend=backend).shape == \
            (0, 3, 3, 2)


def test_box_list_form_equals_tensor_form():
    x = random_map((2, 3, 10, 10), 8)
    boxes = [torch.tensor([[0., 0, 5, 5], [2, 2, 9, 9]]), torch.tensor([[1., 1, 3, 8]])]
    rois = torch.tensor([[0., 0, 0, 5, 5], [0, 2, 2, 9, 9], [1, 1, 1, 3, 8]])
    for mode in ('max', 'avg'):
        assert torch.equal(roi_pool2d(x, boxes, 3, mode), roi_pool2d(x, rois, 3, mode))


def test_integer_rois_and_empty_batch():
    x = random_map((2, 3, 10, 10), 8)
    rois = torch.tensor([[0, 0, 0, 5, 5], [1, 2, 2, 9, 9]])
    assert torch.equal(roi_pool2d(x, rois, 3, 'avg'), roi_pool2d(x, rois.float(), 3, 'avg'))
    assert roi_pool2d(x[:0], torch.zeros(0, 5), 2).shape == (0, 3, 2, 2)


# -------------------------------------------------------------------- bad input
X = torch.zeros(2, 3, 8, 8)
R = torch.tensor([[0., 0, 0, 3, 3]])


@pytest.mark.parametrize('call, exc, words', [
    (lambda: roi_pool2d(X, R[:, :4], 2), ValueError, 'shape (K, 5)'),
    (lambda: roi_pool2d(X, R[0], 2), ValueError, 'shape (K, 5)'),
    (lambda: roi_pool2d(X, R.bool(), 2), TypeError, 'real floating or integer'),
    (lambda: roi_pool2d(X, R.to(torch.complex64), 2), TypeError, 'real floating'),
    (lambda: roi_pool2d(X, torch.tensor([[2., 0, 0, 3, 3]]), 2), ValueError, 'in [0, 2)'),
    (lambda: roi_pool2d(X, torch.tensor([[-1., 0, 0, 3, 3]]), 2), ValueError, 'in [0, 2)'),
    (lambda: roi_pool2d(X, torch.tensor([[0.5, 0, 0, 3, 3]]), 2), ValueError, 'whole'),
    (lambda: roi_pool2d(X, torch.tensor([[0., float('nan'), 0, 3, 3]]), 2), ValueError,
     'finite'),
    (lambda: roi_pool2d(X, torch.tensor([[0., 0, 0, 3e9, 3]]), 2), ValueError, 'below'),
    (lambda: roi_pool2d(X, R.to('meta'), 2), ValueError, 'device'),
    (lambda: roi_pool2d(X, 'boxes', 2), TypeError, 'rois'),
    (lambda: roi_pool2d(X, [torch.zeros(2, 5)], 2), ValueError, 'rois[0]'),
    (lambda: roi_pool2d(X[0], R, 2), ValueError, '(N, C, H, W)'),
    (lambda: roi_pool2d(X.long(), R, 2), TypeError, 'dtype'),
    (lambda: roi_pool2d(X[:, :0], R, 2), ValueError, 'non-empty'),
    (lambda: roi_pool2d(X, R, 0), ValueError, 'output_size'),
    (lambda: roi_pool2d(X, R, (2, -1)), ValueError, 'output_size'),
    (lambda: roi_pool2d(X, R, 2.5), TypeError, 'output_size'),
    (lambda: roi_pool2d(X, R, (1, 2, 3)), ValueError, 'output_size'),
    (lambda: roi_pool2d(X, R, 2, 'min'), ValueError, 'mode'),
    (lambda: roi_pool2d(X, R, 2, spatial_scale=0), ValueError, 'spatial_scale'),
    (lambda: roi_pool2d(X, R, 2, spatial_scale=float('nan')), ValueError, 'spatial_scale'),
    (lambda: roi_pool2d(X, R, 2, spatial_scale='1'), TypeError, 'spatial_scale'),
    (lambda: roi_pool2d(X, R, 2, 'avg', return_indices=True), ValueError, 'return_indices'),
    (lambda: roi_pool2d(X, R, 2, backend='triton'), ValueError, 'backend'),
    (lambda: roi_pool2d(X, R, 2, precision='fp8'), ValueError, 'precision'),
])
def test_bad_input_raises_naming_the_argument(call, exc, words):
    with pytest.raises(exc) as info:
        call()
    assert words in str(info.value)


# -------------------------------------------------------------------- gradients
@pytest.mark.parametrize('backend', BACKENDS)
@pytest.mark.parametrize('mode', ['max', 'avg'])
def test_gradcheck_float64(backend, mode):
    g = torch.Generator().manual_seed(0)
    # distinct values: max pooling is differentiable away from ties
    x = torch.randperm(2 * 3 * 7 * 8, generator=g).double().view(2, 3, 7, 8) / 10
    x.requires_grad_(True)
    rois = torch.tensor([[0., 0, 0, 6, 5], [1, 1, 2, 5, 6], [0, 2, 1, 4, 3],
                         [1, -2, -1, 3, 2], [0, 5, 4, 9, 9], [1, 3, 3, 3, 3],
                         [0, 0, 0, 6, 5]], dtype=torch.float64)
    assert torch.autograd.gradcheck(
        lambda t: roi_pool2d(t, rois, (3, 2), mode, backend=backend), (x,))


# -------------------------------------------------------------------- precision
@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
def test_half_inputs_follow_the_precision_policy(dtype):
    x = random_map((2, 4, 12, 12), 2).to(dtype)
    rois = inside_boxes(40, 12, 12, 3)
    avg = roi_pool2d(x, rois, 3, 'avg')
    assert avg.dtype == dtype
    # fp32 accumulation, rounded once (PyTorch's CPU adaptive pooling does the same)
    assert torch.equal(avg, _adaptive_loop(x.float(), rois, 3, 'avg').to(dtype))
    assert torch.equal(avg, _adaptive_loop(x, rois, 3, 'avg'))
    mx = roi_pool2d(x, rois, 3, 'max')
    assert mx.dtype == dtype
    assert torch.equal(mx, roi_pool2d(x.float(), rois, 3, 'max').to(dtype))
    assert roi_pool2d(x, rois, 3, 'avg', precision='input').dtype == dtype


def test_explicit_precision_casts_the_computation():
    x = random_map((1, 2, 9, 9), 4)
    rois = inside_boxes(10, 9, 9, 5, batch=1)
    out = roi_pool2d(x, rois, 2, 'avg', precision='bf16')
    assert out.dtype == torch.float32
    assert torch.equal(out, roi_pool2d(x.bfloat16(), rois, 2, 'avg', precision='input')
                       .float())


# -------------------------------------------------------------------- planning
def _plan(mode='max', backend='auto', device='npu', dtype=torch.float32, channels=256,
          return_indices=False, kernels=True, vendor=True):
    return roi_npu.plan_roi_pool(mode, backend, device, dtype, channels, return_indices,
                                 kernels_usable=kernels, vendor_available=vendor)


def test_plan_per_device():
    assert _plan(device='cpu') == roi_npu.RoiPlan('kernels')
    assert _plan(device='cpu', kernels=False).call == 'aten'
    assert 'numba' in _plan(device='cpu', kernels=False).fallback
    assert _plan(device='cuda') == roi_npu.RoiPlan('aten')
    assert _plan(backend='native', device='cpu') == roi_npu.RoiPlan('aten')
    assert _plan() == roi_npu.RoiPlan('vendor')
    assert _plan(backend='npu') == roi_npu.RoiPlan('vendor')
    for kwargs, words in [(dict(mode='avg'), 'averages'), (dict(vendor=False), 'mmcv'),
                          (dict(channels=24), 'multiple of 16'),
                          (dict(dtype=torch.bfloat16), 'bfloat16'),
                          (dict(return_indices=True), 'return_indices')]:
        plan = _plan(**kwargs)
        assert plan.call == 'aten' and words in plan.fallback, (kwargs, plan)


def test_cpu_calls_take_the_kernels_and_half_the_aten_form_records_nothing():
    from mmseg_cann.utils import fallback_counts, reset_fallbacks
    reset_fallbacks()
    x = random_map((1, 2, 6, 6), 1)
    roi_pool2d(x, torch.tensor([[0., 0, 0, 5, 5]]), 2)
    assert 'roi_pool2d' not in fallback_counts()


@pytest.mark.skipif(sys.platform != 'linux', reason='numba kernels are tested on Linux')
def test_kernels_are_used_on_cpu():
    from mmseg_cann.backends import roi_cpu
    assert roi_cpu.usable(torch.zeros(1, dtype=torch.float32))
    assert not roi_cpu.usable(torch.zeros(1, dtype=torch.float16))
