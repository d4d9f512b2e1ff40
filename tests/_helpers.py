"""Helpers shared by the test suite: inputs, shapes, subprocesses, small real mmseg
models, and checks used by more than one test module. Tests import from here (fixtures
live in ``conftest.py``); no test module imports another."""
from __future__ import annotations

import os
import sys
import tempfile

import numpy as np
import torch

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: (input H, W) -> (output H, W) shapes that catch indexing bugs (docs/design.md 2.1)
AWKWARD_SHAPES = [
    ((1, 1), (2, 2)),      # single pixel
    ((3, 5), (4, 7)),      # coprime, uneven weights
    ((7, 7), (8, 8)),
    ((1, 6), (3, 13)),     # H = 1
    ((6, 1), (13, 3)),     # W = 1
    ((9, 11), (4, 5)),     # downsampling, odd sizes
    ((5, 7), (5, 7)),      # identity
    ((4, 3), (32, 24)),    # x8
    ((2, 3), (32, 48)),    # x16
    ((2, 2), (64, 64)),    # x32
    ((2, 2), (82, 82)),    # float32 nearest index differs from exact math
]
UPSAMPLE_SETTINGS = [
    dict(mode='nearest'), dict(mode='nearest-exact'), dict(mode='area'),
    dict(mode='bilinear', align_corners=False), dict(mode='bilinear', align_corners=True),
    dict(mode='bicubic', align_corners=False), dict(mode='bicubic', align_corners=True),
    dict(mode='bilinear', antialias=True), dict(mode='bicubic', antialias=True),
    dict(mode='bilinear', align_corners=True, antialias=True),
]
MEMORY_FORMATS = ['contiguous', 'channels_last', 'strided']


def setting_id(setting: dict) -> str:
    return '-'.join(f'{v}' if k == 'mode' else f'{k}={v}' for k, v in setting.items())


def make_input(shape, dtype=torch.float32, memory_format='contiguous', seed=0):
    """Uniform [-1, 1) input in the requested layout (``strided``: a non-contiguous view)."""
    gen = torch.Generator().manual_seed(seed)
    if memory_format == 'strided':
        n, c, h, w = shape
        base = torch.rand((n, c, h, 2 * w), generator=gen, dtype=torch.float64) * 2 - 1
        x = base.to(dtype)[..., ::2]
        assert not x.is_contiguous()
        return x
    x = (torch.rand(shape, generator=gen, dtype=torch.float64) * 2 - 1).to(dtype)
    if memory_format == 'channels_last':
        x = x.contiguous(memory_format=torch.channels_last)
    return x


#: where the Triton kernel tests put their tensors: ``cpu`` (Triton's interpreter, the
#: default) or the device ``tools/device_check.py --device`` runs them on
KERNEL_DEVICE = os.environ.get('MMSEG_CANN_KERNEL_DEVICE', 'cpu')


def kernel_input(*args, **kwargs):
    """:func:`make_input` on :data:`KERNEL_DEVICE` (layout kept)."""
    return make_input(*args, **kwargs).to(KERNEL_DEVICE)


def run_python(args, **kwargs):
    """Run a Python subprocess from the repository root with this interpreter."""
    import subprocess
    env = dict(os.environ)
    env.setdefault('PYTHONUNBUFFERED', '1')
    return subprocess.run([sys.executable] + list(args), cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, **kwargs)


#: pooling settings of the export tests: explicit padding, ceil_mode, SAME upper/lower, valid
POOL_SETTINGS = [
    dict(kernel_size=3, stride=2, padding=1),
    dict(kernel_size=3, stride=2, padding=1, ceil_mode=True),
    dict(kernel_size=(2, 3), stride=(2, 1), padding=(1, 0), ceil_mode=True),
    dict(kernel_size=5, stride=2, padding=2, ceil_mode=True),
    dict(kernel_size=2, stride=2, ceil_mode=True),
    dict(kernel_size=3, stride=2, padding='same'),
    dict(kernel_size=4, stride=3, padding='same_lower'),
    dict(kernel_size=4, stride=2, padding='same_lower'),
    dict(kernel_size=(3, 2), stride=1, padding='same_upper'),
    dict(kernel_size=3, stride=2, padding='valid', ceil_mode=True),
]
#: and their input sizes (H = 1 or W = 1, odd, coprime)
POOL_INPUTS = [(1, 1), (5, 5), (7, 9), (6, 1), (10, 13), (9, 11)]


def valid_pool_cases(settings, inputs, dilation: int = 1):
    """``(setting, (H, W))`` pairs whose pooling window fits the padded input."""
    from mmseg_cann.core import geometry as geo
    cases = []
    for setting in settings:
        for hw in inputs:
            args = geo.check_pool_args(setting['kernel_size'], setting.get('stride'),
                                       setting.get('padding', 0), dilation,
                                       setting.get('ceil_mode', False))
            try:
                geo.pool_spec(hw, args)
            except ValueError:
                continue  # empty output
            cases.append((setting, hw))
    return cases


def assert_same_layout(got: torch.Tensor, expected: torch.Tensor) -> None:
    """``got`` is (unambiguously) channels_last exactly when ``expected`` is."""
    from mmseg_cann.core.validation import is_channels_last
    assert is_channels_last(got) == is_channels_last(expected), (
        tuple(got.stride()), tuple(expected.stride()))


def assert_within_interpolation_rounding(got, expected, x):
    """The numba kernel evaluates PyTorch's formula with PyTorch's fused multiply-adds;
    where the compiled PyTorch kernel contracts differently (small, odd shapes), the two
    results differ by the rounding of two lerps: each lerp rounds within ``eps * M``
    (``M`` the largest input magnitude), so two implementations are within ``4 eps M``,
    plus one rounding of the final add (``eps * |result|``)."""
    eps = torch.finfo(got.dtype).eps
    bound = 4 * eps * float(x.abs().max()) + eps * expected.abs()
    assert bool(((got - expected).abs() <= bound).all()), float((got - expected).abs().max())


# ------------------------------------------------------------------ ONNX helpers
class Many(torch.nn.Module):
    """Applies module ``i`` to input ``i``: many cases in one exported graph."""

    def __init__(self, modules):
        super().__init__()
        self.m = torch.nn.ModuleList(modules)

    def forward(self, *inputs):
        return tuple(m(x) for m, x in zip(self.m, inputs))


def ort_nearest_indices(n_in, exact_mode, *, n_out=None, scale=None):
    """Source indices onnxruntime reads for a nearest ``Resize`` of a 1-D ramp of
    ``n_in`` values, to ``n_out`` (``sizes``) or by ``scale`` (``scales``)."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from mmseg_cann.onnx import resize_attributes
    attrs = resize_attributes('nearest-exact' if exact_mode else 'nearest', False, False, 18)
    if scale is not None:
        shape = helper.make_tensor('scales', TensorProto.FLOAT, [4], [1, 1, 1, scale])
        inputs = ['x', '', 'scales']
    else:
        shape = helper.make_tensor('sizes', TensorProto.INT64, [4], [1, 1, 1, n_out])
        inputs = ['x', '', '', 'sizes']
    node = helper.make_node('Resize', inputs, ['y'], **attrs)
    graph = helper.make_graph(
        [node], 'g', [helper.make_tensor_value_info('x', TensorProto.FLOAT, [1, 1, 1, n_in])],
        [helper.make_tensor_value_info('y', TensorProto.FLOAT, None)], [shape])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid('', 18)])
    model.ir_version = 9
    session = ort.InferenceSession(model.SerializeToString(), providers=['CPUExecutionProvider'])
    ramp = np.arange(n_in, dtype=np.float32).reshape(1, 1, 1, n_in)
    return session.run(None, {'x': ramp})[0].ravel().astype(np.int64)


# ------------------------------------------------------- small real mmseg models
def load_config(path_or_base: str):
    """A config from a file of this repository or from ``mmseg::...`` (through a base).

    Loaded with mmengine's ``format_python_code=False``: a Runner writes its config's
    text to the log, the work folder and every checkpoint, and yapf's formatting of it
    (cosmetic; the text is valid Python either way) took about 3.5 s of each Runner test.
    The tools' own runs keep the formatting.
    """
    from mmengine.config import Config
    if path_or_base.startswith('mmseg::'):
        with tempfile.NamedTemporaryFile('w', suffix='.py', delete=False) as f:
            f.write(f"_base_ = '{path_or_base}'\n")
        try:
            cfg = Config.fromfile(f.name)
        finally:
            os.unlink(f.name)
    else:
        cfg = Config.fromfile(os.path.join(REPO_ROOT, path_or_base))
    # (mmengine 0.10.7's fromfile does not pass format_python_code on to the Config it
    # makes of a plain config file)
    return Config(cfg.to_dict(), cfg_text=cfg.text, filename=cfg.filename,
                  format_python_code=False)


def build_small(base: str, depth: int = 18, channels: int = 32):
    """Build an mmseg segmentor from ``base`` with a ResNet-``depth`` and thin heads."""
    from mmengine.registry import init_default_scope
    from mmseg.registry import MODELS

    from mmseg_cann.utils.config import sync_bn_to_bn
    init_default_scope('mmseg')
    cfg = load_config(base)
    model_cfg = cfg.model
    model_cfg.pretrained = None
    sync_bn_to_bn(model_cfg)
    backbone = model_cfg.backbone
    if backbone.get('type', '').startswith('ResNet'):
        backbone.depth = depth
        backbone.pop('init_cfg', None)
        widths = [64, 128, 256, 512]
        for head_name in ('decode_head', 'auxiliary_head'):
            head = model_cfg.get(head_name)
            if head is None:
                continue
            index = head.get('in_index', -1)
            if isinstance(index, (list, tuple)):
                head.in_channels = [widths[i] for i in index]
            else:
                head.in_channels = widths[index]
            head.channels = channels
            if 'c1_in_channels' in head:
                head.c1_in_channels = widths[0]
                head.c1_channels = channels // 2
        neck = model_cfg.get('neck')
        if neck is not None:
            neck.in_channels = widths
            neck.out_channels = channels
            head = model_cfg.decode_head
            head.in_channels = [channels] * len(head.in_channels) \
                if isinstance(head.in_channels, list) else channels
    model = MODELS.build(model_cfg)
    model.init_weights()
    return model


def seg_batch(model, shape=(2, 3, 64, 128), num_classes=19, seed=0):
    """Inputs and data samples for ``model.loss``."""
    from mmengine.structures import PixelData
    from mmseg.structures import SegDataSample
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(shape, generator=gen)
    samples = []
    for _ in range(shape[0]):
        sample = SegDataSample()
        sample.gt_sem_seg = PixelData(
            data=torch.randint(0, num_classes, (1,) + shape[2:], generator=gen))
        sample.set_metainfo(dict(img_shape=shape[2:], ori_shape=shape[2:],
                                 pad_shape=shape[2:]))
        samples.append(sample)
    return x, samples


def outcome(call):
    """``(result, None)`` or ``(None, exception)`` of ``call()``."""
    try:
        return call(), None
    except Exception as exc:  # noqa: BLE001 - compared with PyTorch's
        return None, exc


def same_tensors(expected, got) -> bool:
    """Same dtypes, shapes and values (NaN where PyTorch has NaN) of a tensor or a tuple."""
    expected = expected if isinstance(expected, tuple) else (expected,)
    got = got if isinstance(got, tuple) else (got,)
    return len(expected) == len(got) and all(
        a.dtype == b.dtype and a.shape == b.shape and (
            torch.equal(a, b) or (a.is_floating_point()
                                  and torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0))))
        for a, b in zip(expected, got))


def compare_with_torch(torch_call, our_call, label, problems):
    """Run both calls; append a line to ``problems`` unless both return the same tensors
    or ours raises an instance of PyTorch's exception type. Returns PyTorch's result
    (None if it raised)."""
    expected, torch_error = outcome(torch_call)
    got, our_error = outcome(our_call)
    if torch_error is not None:
        if not isinstance(our_error, type(torch_error)):
            problems.append(f'{label}: PyTorch raises {type(torch_error).__name__}, ours '
                            f'{"returns" if our_error is None else repr(our_error)}')
    elif our_error is not None:
        problems.append(f'{label}: PyTorch returns, ours raises {our_error!r}')
    elif not same_tensors(expected, got):
        problems.append(f'{label}: values or indices differ from PyTorch')
    return expected
