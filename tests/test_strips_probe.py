"""Strip execution tried the way users break it: SAME padding, modules that only look
row-local, hooks, in-place edits after entering the block, shared modules, odd inputs,
tracers and compilers, copies, nesting, and real mmseg models through the lean path and
the public API.

Every case compares with the same module called without :func:`strip_execution` (the
unsplit model is the contract), and where strips should run, checks that they did (the
heights the convolutions saw), so an equality cannot hold because nothing was split.
"""
import copy
import pickle

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mmseg_cann import strips
from mmseg_cann.models import CANNAvgPool2d, CANNMaxPool2d
from mmseg_cann.strips import is_row_local, row_geometry, run_in_strips, strip_execution


@pytest.fixture
def conv_heights(monkeypatch):
    """The input heights of the 2-D convolutions that read a 3-channel input (the first
    layer of every stage here) while the test runs."""
    heights = []
    real = F.conv2d

    def recording(input, *args, **kwargs):
        if input.dim() == 4 and input.shape[1] == 3:
            heights.append(input.shape[-2])
        return real(input, *args, **kwargs)
    monkeypatch.setattr(F, 'conv2d', recording)
    return heights


@pytest.fixture
def small_budget(monkeypatch):
    """Strips from 64 KiB activations, so small inputs are split."""
    monkeypatch.setattr(strips, 'STRIP_ACTIVATION_BYTES', 2**16)


def _randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _bn(channels, seed=0, **kwargs):
    """Eval-mode batch norm with non-trivial statistics and affine parameters."""
    bn = nn.BatchNorm2d(channels, **kwargs)
    gen = torch.Generator().manual_seed(seed)
    if bn.running_mean is not None:
        bn.running_mean.copy_(torch.randn(channels, generator=gen))
        bn.running_var.copy_(torch.rand(channels, generator=gen) + 0.5)
    bn.weight.data.copy_(torch.randn(channels, generator=gen))
    bn.bias.data.copy_(torch.randn(channels, generator=gen))
    return bn.eval()


def _conv(cin, cout, *args, seed=0, **kwargs):
    torch.manual_seed(seed)
    return nn.Conv2d(cin, cout, *args, **kwargs)


def _both(module, x):
    """(in the block, unsplit): ``module(x)`` without gradients, each on its own copy
    of ``x``."""
    with torch.no_grad():
        whole = module(x.clone())
        with strip_execution(module):
            got = module(x.clone())
    return got, whole


def _assert_unsplit(got, whole):
    """The unsplit result up to float32 rounding of the convolutions' reductions
    (PyTorch's CPU convolution blocks its reductions by shape, so a strip can round
    differently; a strip-edge error is of the order of the values): same shape, dtype
    and strides, differences within a few ulp of the largest value."""
    assert got.shape == whole.shape and got.dtype == whole.dtype
    assert got.stride() == whole.stride()
    if not torch.equal(got, whole):
        scale = float(whole.abs().max())
        assert float((got - whole).abs().max()) <= 64 * torch.finfo(whole.dtype).eps * scale


def _split(heights, full):
    """The first convolution saw a strip of its input of height ``full``."""
    return any(h < full for h in heights)


# ------------------------------------------------------------------ SAME padding
def test_same_max_pool_in_a_stage_equals_unsplit(conv_heights):
    """A convolution followed by a SAME pool of stride 2 (the README's config example):
    bit-identical to the unsplit stage at the default budget; the convolution before it
    still runs in strips, the pool (whose top padding depends on the height) whole."""
    stage = nn.Sequential(_conv(3, 8, 3, 1, 1), CANNMaxPool2d(3, 2, 'same')).eval()
    x = _randn(1, 3, 1023, 1024)
    got, whole = _both(stage, x)
    assert torch.equal(got, whole)
    assert not is_row_local(stage) and is_row_local(stage[0])
    assert _split(conv_heights, 1023)


# (pool, row-local): SAME's top padding is total // 2 (upper) or total - total // 2
# (lower), total = max(d*(k-1) - (H - 1) mod s, 0): the same for every H with stride
# 1, and where the rounding hides the difference (kernel 2 stride 2 upper: 0 for
# totals 0 and 1; kernel 3 stride 2 lower: 1 for totals 1 and 2)
SAME_POOLS = [
    (lambda: CANNAvgPool2d(3, 2, 'same', count_include_pad=False), False),
    (lambda: CANNAvgPool2d(3, 2, 'same'), False),
    (lambda: CANNMaxPool2d(3, 2, 'same_upper'), False),
    (lambda: CANNMaxPool2d(3, 2, 'same_lower'), True),
    (lambda: CANNAvgPool2d(3, 2, 'same_lower', count_include_pad=False), True),
    (lambda: CANNMaxPool2d(2, 2, 'same_lower'), False),
    (lambda: CANNMaxPool2d(2, 2, 'same_upper'), True),
    (lambda: CANNAvgPool2d(2, 2, 'same_upper', count_include_pad=False), True),
    (lambda: CANNMaxPool2d(3, 3, 'same', dilation=2), False),
    (lambda: CANNMaxPool2d(3, 1, 'same_lower'), True),
    (lambda: CANNAvgPool2d(4, 1, 'same_upper', count_include_pad=False), True),
    (lambda: CANNMaxPool2d(4, 1, 'same_lower', dilation=2), True),
    (lambda: CANNMaxPool2d(3, 2, 'valid'), True),
    (lambda: CANNAvgPool2d(3, 2, 1, ceil_mode=True, count_include_pad=False), True),
]


@pytest.mark.parametrize('height', [101, 102, 103])
@pytest.mark.parametrize('make,row_local', SAME_POOLS)
def test_same_pooling_equals_unsplit(make, row_local, height, small_budget, conv_heights):
    stage = nn.Sequential(_conv(3, 8, 3, 1, 1), nn.ReLU(), make()).eval()
    assert is_row_local(stage) == row_local
    got, whole = _both(stage, _randn(1, 3, height, 40, seed=height))
    _assert_unsplit(got, whole)
    assert _split(conv_heights, height)  # the whole stage, or its convolution alone


@pytest.mark.parametrize('padding_mode', ['zeros', 'reflect', 'replicate'])
@pytest.mark.parametrize('kernel,dilation', [((4, 3), (2, 1)), (3, 1), ((2, 5), (3, 2))])
def test_conv_same_padding_is_row_local(kernel, dilation, padding_mode, small_budget,
                                        conv_heights):
    """``nn.Conv2d(padding='same')`` pads ``d*(k-1) // 2`` rows on top for any height
    (the odd row at the bottom), in every padding mode but circular."""
    stage = nn.Sequential(_conv(3, 4, kernel, padding='same', dilation=dilation,
                                padding_mode=padding_mode), nn.ReLU(),
                          _conv(4, 4, 3, 2, 1, seed=1, padding_mode=padding_mode))
    assert is_row_local(stage)
    for height in (97, 98):
        conv_heights.clear()
        got, whole = _both(stage, _randn(1, 3, height, 64, seed=height))
        _assert_unsplit(got, whole)
        assert _split(conv_heights, height)
    circular = _conv(3, 4, 3, padding='same', padding_mode='circular')
    assert not is_row_local(circular)


# ------------------------------------------------- modules that only look row-local
def test_conv2d_adaptive_padding_is_not_row_local(small_budget):
    """mmcv's ``Conv2dAdaptivePadding`` pads in ``forward`` by the input size (its
    registered padding is 0)."""
    from mmcv.cnn.bricks import Conv2dAdaptivePadding
    torch.manual_seed(0)
    stage = nn.Sequential(Conv2dAdaptivePadding(3, 8, 3, stride=2), _bn(8), nn.ReLU()).eval()
    assert not is_row_local(stage) and not is_row_local(stage[0])
    for height in (101, 102):
        got, whole = _both(stage, _randn(1, 3, height, 40, seed=height))
        _assert_unsplit(got, whole)


def test_batch_norm_without_running_stats_is_not_row_local(small_budget, conv_heights):
    """``track_running_stats=False``: eval mode normalises with the batch's statistics."""
    stage = nn.Sequential(_conv(3, 8, 3, 1, 1), _bn(8, track_running_stats=False)).eval()
    assert not is_row_local(stage)
    got, whole = _both(stage, _randn(1, 3, 101, 40))
    _assert_unsplit(got, whole)
    assert _split(conv_heights, 101)  # the convolution alone still runs in strips


def test_reverted_sync_batch_norm_is_row_local(small_budget, conv_heights):
    """mmengine's ``revert_sync_batchnorm`` (what the inference APIs apply on CPU) makes
    ``_BatchNormXd``: a known batch norm."""
    from mmengine.model import revert_sync_batchnorm
    stage = nn.Sequential(_conv(3, 8, 3, 2, 1), nn.SyncBatchNorm(8), nn.ReLU())
    stage = revert_sync_batchnorm(stage).eval()
    stage[1].load_state_dict(_bn(8).state_dict())
    assert type(stage[1]).__name__ == '_BatchNormXd' and is_row_local(stage)
    got, whole = _both(stage, _randn(1, 3, 201, 80))
    _assert_unsplit(got, whole)
    assert _split(conv_heights, 201)
    with strip_execution(stage) as stages:
        assert stages == [stage]


class _ColumnCentred(nn.Conv2d):
    """A convolution whose output is centred over each column (not row-local)."""

    def forward(self, x):
        out = super().forward(x)
        return out - out.mean(2, keepdim=True)


class _PlainSubclass(nn.Conv2d):
    pass


def test_subclasses_and_instance_forwards_are_not_row_local(small_budget):
    stage = nn.Sequential(_ColumnCentred(3, 8, 3, 1, 1), nn.ReLU()).eval()
    assert not is_row_local(stage) and not is_row_local(_PlainSubclass(3, 3, 3))
    got, whole = _both(stage, _randn(1, 3, 101, 40))
    _assert_unsplit(got, whole)

    conv = _conv(3, 8, 3, 1, 1)
    real_forward = conv.forward
    conv.forward = lambda x: (lambda out: out - out.mean(2, keepdim=True))(real_forward(x))
    stage = nn.Sequential(conv, nn.ReLU())
    assert not is_row_local(stage)
    got, whole = _both(stage, _randn(1, 3, 101, 40))
    _assert_unsplit(got, whole)


def test_an_in_place_first_layer_is_not_split(small_budget):
    """Overlapping strips would apply an in-place layer on the stage's input twice to
    the overlap: outputs and the caller's tensor must be the unsplit ones."""
    for first in ([nn.LeakyReLU(0.1, inplace=True)],
                  [nn.Identity(), nn.Dropout(0.5, inplace=True).eval(), nn.Hardswish(True)]):
        stage = nn.Sequential(*first, _conv(3, 8, 3, 1, 1)).eval()
        x = _randn(1, 3, 101, 40)
        x_whole, x_split = x.clone(), x.clone()
        with torch.no_grad():
            whole = stage(x_whole)
            with strip_execution(stage):
                got = stage(x_split)
        _assert_unsplit(got, whole)
        assert torch.equal(x_split, x_whole)


def test_shared_module_runs_twice_in_the_geometry(small_budget, conv_heights):
    """One convolution instance used twice in a stage widens the receptive field twice."""
    shared = _conv(8, 8, 3, 1, 1, seed=1)
    stage = nn.Sequential(_conv(3, 8, 3, 1, 1), nn.ReLU(), shared, nn.ReLU(), shared)
    got, whole = _both(stage, _randn(1, 3, 101, 40))
    _assert_unsplit(got, whole)
    assert row_geometry(stage) == (1, 3)
    assert _split(conv_heights, 101)


def test_last_strip_holds_the_stage_windows():
    """A one-row remainder: the last strip reaches up far enough for a valid 5x5
    convolution after which a pad restores the height."""
    stage = nn.Sequential(_conv(3, 4, 5), nn.ZeroPad2d((2, 2, 2, 2)))
    x = _randn(1, 3, 13, 9)
    with torch.no_grad():
        got = run_in_strips(stage, x, 4, *row_geometry(stage))
        _assert_unsplit(got, stage(x))


# ------------------------------------------------------------------------- hooks
HOOKS = {
    'forward': lambda m, log: m.register_forward_hook(
        lambda mod, args, out: log.append(out.shape[2])),
    'forward_pre': lambda m, log: m.register_forward_pre_hook(
        lambda mod, args: log.append(args[0].shape[2])),
    'forward_kwargs': lambda m, log: m.register_forward_hook(
        lambda mod, args, kwargs, out: log.append(out.shape[2]), with_kwargs=True),
    'full_backward': lambda m, log: m.register_full_backward_hook(
        lambda mod, gin, gout: log.append(-1)),
}


@pytest.mark.parametrize('registered', ['before', 'inside'])
@pytest.mark.parametrize('kind', sorted(HOOKS))
def test_hooked_modules_see_the_whole_tensor_once(kind, registered, small_budget):
    stage = nn.Sequential(_conv(3, 8, 3, 1, 1), _bn(8), nn.ReLU(), _conv(8, 8, 3, 1, 1)).eval()
    x = _randn(1, 3, 1023, 64)
    log = []
    with torch.no_grad():
        whole = stage(x)
        if registered == 'before':
            handle = HOOKS[kind](stage[0], log)
        with strip_execution(stage):
            if registered == 'inside':
                handle = HOOKS[kind](stage[0], log)
            got = stage(x)
    handle.remove()
    _assert_unsplit(got, whole)
    if kind != 'full_backward':
        assert log == [1023]


@pytest.mark.parametrize('kind', ['forward', 'forward_pre'])
def test_global_module_hooks_see_whole_tensors(kind, small_budget, conv_heights):
    from torch.nn.modules import module as torch_module
    register = {'forward': torch_module.register_module_forward_hook,
                'forward_pre': torch_module.register_module_forward_pre_hook}[kind]
    stage = nn.Sequential(_conv(3, 8, 3, 1, 1), nn.ReLU()).eval()
    x = _randn(1, 3, 301, 64)
    log = []
    with torch.no_grad(), strip_execution(stage):
        handle = register(lambda m, *args: log.append(type(m).__name__))
        try:
            got = stage(x)
        finally:
            handle.remove()
    assert log.count('Conv2d') == 1 and log.count('ReLU') == 1
    assert not _split(conv_heights, 301)
    assert torch.equal(got, _both(stage, x)[1])


def test_hooks_on_the_stage_itself_see_its_whole_input_once(small_budget, conv_heights):
    stage = nn.Sequential(_conv(3, 8, 3, 1, 1), nn.ReLU()).eval()
    log = []
    stage.register_forward_pre_hook(lambda m, args: log.append(args[0].shape[2]))
    got, whole = _both(stage, _randn(1, 3, 301, 64))
    _assert_unsplit(got, whole) and log == [301, 301]
    assert _split(conv_heights, 301)


# ------------------------------------------------------- edits after entering the block
def test_train_mode_after_entry_runs_whole(small_budget):
    stage = nn.Sequential(_conv(3, 8, 3, 1, 1), _bn(8)).eval()
    plain = copy.deepcopy(stage)
    x = _randn(1, 3, 201, 40)
    with torch.no_grad(), strip_execution(stage):
        stage.train()
        plain.train()
        assert torch.equal(stage(x), plain(x))
    assert torch.equal(stage[1].running_mean, plain[1].running_mean)


def test_settings_edited_after_entry_are_used(small_budget, conv_heights):
    """Geometry and membership are decided per call: a wider dilation, a padding
    string that makes the pool height-dependent, a circular padding mode."""
    stage = nn.Sequential(_conv(3, 8, 3, 1, 1), nn.ReLU(), _conv(8, 8, 3, 1, 1, seed=1),
                          CANNMaxPool2d(3, 2, 1)).eval()
    x = _randn(1, 3, 203, 40)
    with torch.no_grad(), strip_execution(stage):
        stage[2].dilation, stage[2].padding = (4, 4), (4, 4)
        got = stage(x)
        assert _split(conv_heights, 203)
        stage[3].padding = 'same'
        got_same = stage(x)
        stage[3].padding = 1
        stage[0].padding_mode = 'circular'
        stage[0]._reversed_padding_repeated_twice = [1, 1, 1, 1]
        got_circular = stage(x)
    with torch.no_grad():
        assert torch.equal(got_circular, stage(x))
        stage[0].padding_mode = 'zeros'
        _assert_unsplit(got, stage(x))
        stage[3].padding = 'same'
        assert torch.equal(got_same, stage(x))


# ------------------------------------------------------------------ inputs and dtypes
@pytest.mark.parametrize('shape,dtype', [
    ((3, 201, 40), torch.float32),        # unbatched
    ((1, 3, 1, 201, 40), torch.float32),  # 5-D: the layer's own error
    ((0, 3, 201, 40), torch.float32),     # empty batch
    ((1, 3, 1, 40), torch.float32),       # one row
    ((1, 3, 201, 0), torch.float32),      # no columns
    ((1, 3, 201, 40), torch.int64),       # integer input: the layer's own error
    ((1, 3, 201, 40), torch.float64),
])
def test_odd_inputs_behave_as_unsplit(shape, dtype, small_budget):
    stage = nn.Sequential(_conv(3, 8, 3, 1, 1), nn.ReLU(), nn.MaxPool2d(3, 2, 1)).eval()
    stage = stage.to(torch.float64) if dtype == torch.float64 else stage
    x = (_randn(*shape) * 10).to(dtype)
    outcomes = []
    for split in (False, True):
        with torch.no_grad(), (strip_execution(stage) if split else _nothing()):
            try:
                outcomes.append(stage(x.clone()))
            except Exception as error:  # the unsplit module's own error, if any
                outcomes.append(type(error))
    if isinstance(outcomes[0], torch.Tensor):
        _assert_unsplit(outcomes[1], outcomes[0])
    else:
        assert outcomes[1] is outcomes[0]


def test_integer_pooling_stage_behaves_as_unsplit(small_budget):
    stage = nn.Sequential(nn.MaxPool2d(3, 2, 1), nn.ReLU())
    x = torch.randint(-100, 100, (1, 64, 301, 64), generator=torch.Generator().manual_seed(0))
    got, whole = _both(stage, x)
    assert got.dtype == whole.dtype and torch.equal(got, whole)


def test_channels_last_keeps_its_layout(small_budget, conv_heights):
    stage = nn.Sequential(_conv(3, 8, 3, 2, 1), _bn(8), nn.ReLU()).eval()
    x = _randn(1, 3, 201, 80).contiguous(memory_format=torch.channels_last)
    got, whole = _both(stage, x)
    _assert_unsplit(got, whole) and got.stride() == whole.stride()
    assert _split(conv_heights, 201)


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


# ------------------------------------------------------- tracers, compilers, copies
def _stage():
    return nn.Sequential(_conv(3, 8, 3, 1, 1), _bn(8), nn.ReLU(),
                         _conv(8, 8, 3, 1, 1, seed=1)).eval()


def test_torch_compile_inside_the_block_runs_whole(small_budget, conv_heights):
    torch._dynamo.reset()
    stage = _stage()
    compiled = torch.compile(stage, backend='eager', fullgraph=True)
    for height in (201, 150):
        x = _randn(1, 3, height, 40, seed=height)
        conv_heights.clear()
        with torch.no_grad(), strip_execution(stage):
            got = compiled(x)
        assert not _split(conv_heights, height)
        assert torch.equal(got, _both(stage, x)[1])


def test_torch_export_inside_the_block_runs_whole(small_budget):
    stage = _stage()
    with torch.no_grad(), strip_execution(stage):
        exported = torch.export.export(stage, (_randn(1, 3, 201, 40),))
    ops = [str(n.target) for n in exported.graph.nodes if n.op == 'call_function']
    assert sum('conv' in op for op in ops) == 2 and not any('slice' in op for op in ops)


def test_jit_trace_inside_the_block_runs_whole(small_budget):
    stage = _stage()
    with torch.no_grad(), strip_execution(stage):
        traced = torch.jit.trace(stage, _randn(1, 3, 201, 40))
    x = _randn(1, 3, 333, 40, seed=1)
    with torch.no_grad():
        assert torch.equal(traced(x), stage(x))


def test_fx_trace_inside_the_block_runs_whole(small_budget):
    stage = _stage()
    with torch.no_grad(), strip_execution(stage):
        traced = torch.fx.symbolic_trace(stage)
    assert 'getitem' not in traced.code
    x = _randn(1, 3, 201, 40)
    with torch.no_grad():
        assert torch.equal(traced(x), stage(x))


def test_dispatch_mode_inside_the_block_sees_whole_tensors(small_budget):
    from torch.utils._python_dispatch import TorchDispatchMode

    class Log(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))
    stage = _stage()
    with torch.no_grad(), strip_execution(stage), Log() as log:
        stage(_randn(1, 3, 201, 40))
    assert sum('convolution' in op for op in log.ops) == 2


def test_copies_made_inside_the_block(small_budget, conv_heights):
    """A deep copy runs its own weights (whole), pickling works, and nothing of the
    block stays on the copies."""
    model = nn.Sequential(_stage(), nn.AdaptiveAvgPool2d(4))
    x = _randn(1, 3, 201, 40)
    with torch.no_grad(), strip_execution(model) as stages:
        assert stages == [model[0]]
        twin = copy.deepcopy(model)
        loaded = pickle.loads(pickle.dumps(model))
        twin[0][0].weight.mul_(2)
        got_twin, got_loaded = twin(x), loaded(x)
        conv_heights.clear()
        model(x)
        assert _split(conv_heights, 201)
    reference = nn.Sequential(_stage(), nn.AdaptiveAvgPool2d(4))
    with torch.no_grad():
        assert torch.equal(got_loaded, model(x))
        reference.load_state_dict(twin.state_dict())
        assert torch.equal(got_twin, reference(x))
    for m in list(twin.modules()) + list(model.modules()):
        assert 'forward' not in m.__dict__
    with torch.no_grad(), strip_execution(twin) as stages:
        assert stages == [twin[0]]


def test_nested_blocks(small_budget, conv_heights):
    stage = _stage()
    x = _randn(1, 3, 201, 40)
    with torch.no_grad():
        whole = stage(x)
        with strip_execution(stage):
            with strip_execution(stage) as inner:
                assert inner == [stage]
                _assert_unsplit(stage(x), whole)
            conv_heights.clear()
            _assert_unsplit(stage(x), whole)
            assert _split(conv_heights, 201)
    assert 'forward' not in stage.__dict__


def test_blocks_in_several_threads(small_budget):
    """Blocks entered and left by several threads on one model: every call gives the
    unsplit result, and the last block to leave removes the patch."""
    import threading
    stage = _stage()
    x = _randn(1, 3, 201, 40)
    with torch.no_grad():
        whole = stage(x)
    results, errors = [], []

    def run():
        try:
            for _ in range(3):
                with torch.no_grad(), strip_execution(stage):
                    results.append(stage(x))
        except Exception as error:  # reported below
            errors.append(error)
    threads = [threading.Thread(target=run) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors and len(results) == 12
    for got in results:
        _assert_unsplit(got, whole)
    assert 'forward' not in stage.__dict__


# ------------------------------------------------------------------ what is known
def test_membership_table():
    from mmengine.model import Sequential as EngineSequential

    class KeepsForward(nn.Sequential):
        pass

    class Iterates(nn.Sequential):
        def __iter__(self):
            return iter(list(self._modules.values())[::-1])
    conv = _conv(3, 3, 3, padding=1)
    assert is_row_local(KeepsForward(conv, nn.GELU()))
    assert is_row_local(EngineSequential(conv, nn.PReLU(3)))
    assert not is_row_local(Iterates(conv, nn.ReLU()))
    assert not is_row_local(nn.Sequential(conv, nn.Dropout(0.1)))  # training mode
    assert is_row_local(nn.Sequential(conv, nn.Dropout(0.1)).eval())
    assert not is_row_local(nn.ZeroPad2d((0, 0, -1, 1)))
    assert not is_row_local(nn.CircularPad2d(1))
    assert is_row_local(nn.ReflectionPad2d(2)) and is_row_local(nn.ReplicationPad2d(1))
    assert not is_row_local(nn.MaxPool2d(3, 2, 1, return_indices=True))
    assert not is_row_local(CANNMaxPool2d(3, 2, 'same', return_indices=True))
    with pytest.raises(ValueError, match='row-local'):
        row_geometry(nn.GroupNorm(1, 3))


# ---------------------------------------------------------- real mmseg models
def _fcn_same_stem(seed=0):
    """A ResNet-18-FCN (thin) whose stem pool is ``CANNMaxPool2d(3, 2, 'same')``."""
    from mmengine.registry import init_default_scope
    from mmseg.registry import MODELS
    from tests._helpers import load_config

    from mmseg_cann.utils.config import sync_bn_to_bn
    init_default_scope('mmseg')
    cfg = load_config('mmseg::fcn/fcn_r50-d8_4xb2-40k_cityscapes-512x1024.py').model
    sync_bn_to_bn(cfg)
    cfg.pretrained = None
    cfg.backbone.update(depth=18, stem_channels=16, base_channels=16, init_cfg=None)
    cfg.decode_head.update(in_channels=128, channels=32)
    cfg.auxiliary_head = None
    torch.manual_seed(seed)
    model = MODELS.build(cfg)
    model.init_weights()
    model.backbone.maxpool = CANNMaxPool2d(3, 2, 'same')
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.load_state_dict(_bn(m.num_features, seed=m.num_features).state_dict())
    return model.eval()


def test_fcn_with_same_stem_pool_predicts_mmseg_labels(small_budget, conv_heights):
    """The lean prediction path (with full-resolution logits kept, so mmseg's logits can
    be compared) on an input whose stem-pool input has an odd height: logits within
    float32 rounding of mmseg's own ``predict``, labels equal except at near-ties."""
    from mmseg.structures import SegDataSample

    from mmseg_cann.fusion import lean_predict
    model = _fcn_same_stem()
    lean = copy.deepcopy(model)
    lean_predict(lean, keep_logits=True)
    height, width = 201, 236  # the stem makes it 101 rows: SAME pads 1 row on top
    x = _randn(1, 3, height, width)
    meta = dict(ori_shape=(height, width), img_shape=(height, width),
                pad_shape=(height, width), padding_size=[0, 0, 0, 0])
    with torch.no_grad():
        expected = model.predict(x, [SegDataSample(metainfo=dict(meta))])[0]
        conv_heights.clear()
        got = lean.predict(x, [SegDataSample(metainfo=dict(meta))])[0]
    assert _split(conv_heights, height)  # the stem ran in strips
    logits = expected.seg_logits.data
    _assert_unsplit(got.seg_logits.data, logits)
    top2 = logits.topk(2, dim=0).values
    near_tie = (top2[0] - top2[1]) <= 1e-4
    differ = got.pred_sem_seg.data[0] != expected.pred_sem_seg.data[0]
    assert not bool((differ & ~near_tie).any()), int(differ.sum())


def test_api_init_model_strips_fast_scnn_stem(monkeypatch):
    """``mmseg_cann.apis.init_model`` on CPU reverts SyncBN to ``_BatchNormXd``: the
    Fast-SCNN stem is still one stage."""
    from tests._helpers import load_config

    from mmseg_cann.apis import init_model
    cfg = load_config('mmseg::fastscnn/fast_scnn_8xb4-160k_cityscapes-512x1024.py')
    model = init_model(cfg, device='cpu')
    stem = model.backbone.learning_to_downsample
    assert type(stem.conv.bn).__name__ == '_BatchNormXd'
    with strip_execution(model) as stages:
        assert stem in stages
