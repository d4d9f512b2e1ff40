"""The precision policy: resolution order, contexts, threads, autocast and error bounds."""
import threading

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import mmseg_cann
from mmseg_cann import (CANNAdaptiveAvgPool2d, CANNAvgPool2d, CANNMaxPool2d, CANNUpsample,
                        ops, precision_policy, set_precision_policy)
from mmseg_cann.core import reference as ref
from mmseg_cann.core.precision import (PrecisionPolicy, normalize_precision,
                                  resolve_compute_dtype)
from mmseg_cann.analysis.precision_report import error_in_ulps, fp16_accumulating_avg_pool

from tests._helpers import make_input

F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32


def offset_input(shape, dtype, offset=100.0, seed=0):
    """``offset + U[0, 1)``: every partial sum is large, so low-precision sums lose bits."""
    gen = torch.Generator().manual_seed(seed)
    return (torch.rand(shape, generator=gen, dtype=torch.float64) + offset).to(dtype)


# ----------------------------------------------------------------------------------
# settings and resolution order
# ----------------------------------------------------------------------------------
def test_defaults():
    policy = mmseg_cann.get_precision_policy()
    assert policy == PrecisionPolicy(max=None, avg=F32, upsample=None)
    assert policy.to_config() == dict(pool_precision=dict(max='input', avg='fp32'),
                                      upsample_precision='input')


@pytest.mark.parametrize('value, dtype', [
    (None, None), ('input', None), ('fp32', F32), ('FP16', F16), ('bf16', BF16),
    ('float16', F16), ('half', F16), ('bfloat16', BF16), (torch.float32, F32),
    (torch.bfloat16, BF16)])
def test_normalize_precision(value, dtype):
    assert normalize_precision(value) == dtype


def test_resolution_order_argument_then_context_then_global():
    assert resolve_compute_dtype('avg', None, F16) == F32           # global default
    set_precision_policy(pool_precision=dict(avg='bf16'))
    assert resolve_compute_dtype('avg', None, F16) == BF16          # global setting
    with precision_policy(pool_precision=dict(avg='input')):
        assert resolve_compute_dtype('avg', None, F16) is None     # context wins
        assert resolve_compute_dtype('avg', 'fp32', F16) == F32    # argument wins
        with precision_policy(pool_precision=dict(avg='fp32'), upsample_precision='fp32'):
            assert resolve_compute_dtype('avg', None, F16) == F32  # innermost context
            assert resolve_compute_dtype('upsample', None, BF16) == F32
        assert resolve_compute_dtype('avg', None, F16) is None     # restored on exit
        assert resolve_compute_dtype('avg', 'input', BF16) is None
    assert resolve_compute_dtype('avg', None, F16) == BF16
    assert mmseg_cann.get_precision_policy().max is None           # untouched entries kept


def test_inputs_never_cast():
    with precision_policy(pool_precision=dict(max='fp16', avg='fp16'), upsample_precision='fp16'):
        assert resolve_compute_dtype('avg', None, torch.float64) is None  # never lower f64
        assert resolve_compute_dtype('max', None, torch.int64) is None    # integers stay
        labels = torch.randint(0, 9, (1, 1, 6, 6))
        assert ops.max_pool2d(labels, 2).dtype == torch.int64


def test_set_precision_policy_returns_previous_and_reset():
    previous = set_precision_policy(pool_precision=dict(max='fp16'), upsample_precision='bf16')
    assert previous == PrecisionPolicy()
    policy = mmseg_cann.get_precision_policy()
    assert (policy.max, policy.avg, policy.upsample) == (F16, F32, BF16)
    set_precision_policy(reset=True)
    assert mmseg_cann.get_precision_policy() == PrecisionPolicy()


@pytest.mark.parametrize('kwargs, exc', [
    (dict(pool_precision=dict(mean='fp16')), ValueError),
    (dict(pool_precision='fp16'), TypeError),
    (dict(pool_precision=dict(max='fp8')), ValueError),
    (dict(upsample_precision=3), TypeError),
])
def test_bad_settings(kwargs, exc):
    with pytest.raises(exc):
        set_precision_policy(**kwargs)
    with pytest.raises(exc):
        with precision_policy(**kwargs):
            pass


def test_context_is_per_thread_and_global_is_shared():
    barrier = threading.Barrier(2)
    seen = {}

    def worker(name, avg):
        with precision_policy(pool_precision=dict(avg=avg)):
            barrier.wait()  # both contexts active at once
            seen[name] = mmseg_cann.get_precision_policy().avg
            barrier.wait()
        seen[name + '-after'] = mmseg_cann.get_precision_policy().avg

    threads = [threading.Thread(target=worker, args=('a', 'fp16')),
               threading.Thread(target=worker, args=('b', 'bf16'))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen == {'a': F16, 'b': BF16, 'a-after': F32, 'b-after': F32}
    # a context in the main thread is invisible to a new thread; the global setting is not
    result = {}
    set_precision_policy(pool_precision=dict(max='bf16'))
    with precision_policy(pool_precision=dict(avg='fp16')):
        t = threading.Thread(target=lambda: result.update(p=mmseg_cann.get_precision_policy()))
        t.start()
        t.join()
    assert result['p'].avg == F32 and result['p'].max == BF16


def test_compiled_code_reads_the_policy_and_recompiles_when_it_changes():
    """``torch.compile`` traces the policy lookup (no graph break) and guards on it: a
    process-wide change or a context of the calling thread takes effect in compiled code;
    another thread's context does not."""
    from mmseg_cann.core import precision

    def scale(x):
        return x * (2.0 if precision.get_precision_policy().avg == BF16 else 1.0)

    torch._dynamo.reset()
    compiled = torch.compile(scale, fullgraph=True, backend='eager')
    x = torch.ones(2)
    assert compiled(x).tolist() == [1.0, 1.0]
    with precision_policy(pool_precision=dict(avg='bf16')):
        assert compiled(x).tolist() == [2.0, 2.0]
        with precision_policy(pool_precision=dict(avg='fp32')):
            assert compiled(x).tolist() == [1.0, 1.0]
        assert compiled(x).tolist() == [2.0, 2.0]  # the outer context again
        seen = []
        thread = threading.Thread(target=lambda: seen.append(compiled(x).tolist()))
        thread.start()
        thread.join()
        assert seen == [[1.0, 1.0]]
    assert compiled(x).tolist() == [1.0, 1.0]
    set_precision_policy(pool_precision=dict(avg='bf16'))
    assert compiled(x).tolist() == [2.0, 2.0]


# ----------------------------------------------------------------------------------
# semantics: compute in the chosen dtype, return the input dtype
# ----------------------------------------------------------------------------------
def test_compute_dtype_changes_values_not_dtypes():
    x = make_input((1, 2, 16, 16), F32)
    for setting in ('fp16', 'bf16'):
        low = torch.float16 if setting == 'fp16' else torch.bfloat16
        y = ops.upsample(x, scale_factor=2, mode='bilinear', precision=setting)
        assert y.dtype == F32
        assert torch.equal(y, F.interpolate(x.to(low), scale_factor=2, mode='bilinear').float())
    y = ops.avg_pool2d(x.half(), 3, 1, 1)  # default avg='fp32'
    assert y.dtype == F16
    assert torch.equal(y, F.avg_pool2d(x.half().float(), 3, 1, 1).half())


BACKWARD_CALLS = [
    ('avg', lambda t, p: ops.avg_pool2d(t, 3, 2, 1, precision=p),
     lambda t: F.avg_pool2d(t, 3, 2, 1)),
    ('avg', lambda t, p: ops.adaptive_avg_pool2d(t, 3, precision=p),
     lambda t: F.adaptive_avg_pool2d(t, 3)),
    ('max', lambda t, p: ops.max_pool2d(t, 2, precision=p), lambda t: F.max_pool2d(t, 2)),
    ('upsample', lambda t, p: ops.upsample(t, scale_factor=2, mode='bilinear', precision=p),
     lambda t: F.interpolate(t, scale_factor=2, mode='bilinear')),
]


@pytest.mark.parametrize('setting', [None, 'input', 'fp32', 'fp16', 'bf16'])
@pytest.mark.parametrize('family, ours, plain', BACKWARD_CALLS)
def test_backward_follows_policy(setting, family, ours, plain):
    x = make_input((1, 2, 8, 8), F16).requires_grad_()
    y = ours(x, setting)
    assert y.dtype == F16
    grad_out = make_input(tuple(y.shape), F16, seed=1)
    grad, = torch.autograd.grad(y, x, grad_out)
    assert grad.dtype == F16
    # by hand: cast to the compute dtype, PyTorch's op, cast back; autograd does the rest
    compute = resolve_compute_dtype(family, setting, F16)
    x2 = x.detach().clone().requires_grad_()
    y2 = plain(x2.to(compute) if compute is not None else x2).to(F16)
    expected, = torch.autograd.grad(y2, x2, grad_out)
    assert torch.equal(y, y2) and torch.equal(grad, expected)


# ----------------------------------------------------------------------------------
# error bounds (docs/design.md 2.2): fp32 averaging is within 1 ulp of float64
# ----------------------------------------------------------------------------------
AVG_WINDOWS = [(3, 3), (7, 7), (15, 15), (31, 31), (64, 128)]


@pytest.mark.parametrize('dtype', [F16, BF16])
@pytest.mark.parametrize('window', AVG_WINDOWS, ids=lambda w: f'{w[0]}x{w[1]}')
def test_fp32_average_within_one_ulp(dtype, window):
    x = offset_input((1, 3, 64, 128), dtype)
    expected = ref.avg_pool2d(x.double(), window, window)
    got = ops.avg_pool2d(x, window, window)  # default policy: avg='fp32'
    assert got.dtype == dtype
    _, ulps = error_in_ulps(got, expected, dtype)
    assert ulps <= 1.0


@pytest.mark.parametrize('dtype', [F16, BF16])
@pytest.mark.parametrize('bins', [1, 2, 3, 6])
def test_fp32_pyramid_pooling_within_one_ulp(dtype, bins):
    x = offset_input((1, 3, 64, 128), dtype, seed=bins)
    got = ops.adaptive_avg_pool2d(x, bins)
    _, ulps = error_in_ulps(got, ref.adaptive_avg_pool2d(x.double(), bins), dtype)
    assert ulps <= 1.0


def test_fp16_accumulation_breaks_the_bound():
    """The emulated fp16-accumulating kernel is what the fp32 policy protects against."""
    x = offset_input((1, 3, 64, 128), F16)
    for window in [(7, 7), (15, 15)]:
        expected = ref.avg_pool2d(x.double(), window, window)
        _, ulps = error_in_ulps(fp16_accumulating_avg_pool(x, window, window), expected, F16)
        assert ulps > 1.0
    glob = fp16_accumulating_avg_pool(x, (64, 128), (64, 128))
    assert torch.isinf(glob).all()  # 8192 * 100 overflows fp16


@pytest.mark.parametrize('dtype, settings', [
    (F16, ['input', 'fp16', 'fp32']), (BF16, ['input', 'bf16', 'fp32']),
    (F32, ['input', 'fp32'])])
def test_max_pooling_exact_in_every_policy_that_holds_the_input(dtype, settings):
    x = make_input((2, 3, 17, 23), dtype)
    expected = F.max_pool2d(x, 3, 2, 1)
    for setting in settings:
        with precision_policy(pool_precision=dict(max=setting)):
            assert torch.equal(ops.max_pool2d(x, 3, 2, 1), expected)
        assert torch.equal(ops.max_pool2d(x, 3, 2, 1, precision=setting), expected)


# ----------------------------------------------------------------------------------
# autocast: the CANN modules return what the PyTorch modules return
# ----------------------------------------------------------------------------------
def _pairs():
    return [
        (CANNUpsample(scale_factor=2, mode='bilinear'),
         nn.Upsample(scale_factor=2, mode='bilinear')),
        (CANNMaxPool2d(3, 2, 1), nn.MaxPool2d(3, 2, 1)),
        (CANNAvgPool2d(3, 2, 1), nn.AvgPool2d(3, 2, 1)),
        (CANNAdaptiveAvgPool2d(2), nn.AdaptiveAvgPool2d(2)),
    ]


@pytest.mark.parametrize('autocast_dtype', [BF16, F16])
@pytest.mark.parametrize('setting', [None, 'input', 'fp32', 'fp16', 'bf16'])
def test_autocast_dtype_parity(autocast_dtype, setting):
    conv = nn.Conv2d(3, 4, 3, padding=1)
    x = make_input((1, 3, 12, 12), F32)
    with precision_policy(pool_precision=dict(max=setting, avg=setting),
                          upsample_precision=setting):
        for ours, theirs in _pairs():
            with torch.autocast('cpu', dtype=autocast_dtype):
                features = conv(x)  # autocast: lower precision
                assert features.dtype == autocast_dtype
                for inp in (features, x, x.double()):
                    got, expected = ours(inp), theirs(inp)
                    assert got.dtype == expected.dtype == inp.dtype
                    if setting == 'input':
                        assert torch.equal(got, expected)


def test_mmengine_amp_autocast_context():
    """mmengine's autocast (what AmpOptimWrapper.optim_context enters) on CPU."""
    from mmengine.runner.amp import autocast
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), CANNMaxPool2d(2),
                          CANNAvgPool2d(3, 1, 1), CANNUpsample(scale_factor=2, mode='bilinear'))
    reference = nn.Sequential(model[0], nn.MaxPool2d(2), nn.AvgPool2d(3, 1, 1),
                              nn.Upsample(scale_factor=2, mode='bilinear'))
    x = make_input((2, 3, 16, 16), F32)
    with autocast(device_type='cpu', dtype=BF16):
        got, expected = model(x), reference(x)
    assert got.dtype == expected.dtype == BF16
    with precision_policy(pool_precision=dict(avg='input')):
        with autocast(device_type='cpu', dtype=BF16):
            assert torch.equal(model(x), reference(x))
