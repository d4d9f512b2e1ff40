"""Every invalid argument raises ValueError/TypeError naming it, before any kernel runs
(each also of the type PyTorch raises for the call: tests/ops/test_torch_errors.py)."""
import math

import numpy as np
import pytest
import torch

from mmseg_cann import ops
from mmseg_cann.backends import native, reference


@pytest.fixture(autouse=True)
def _no_kernel_may_run(monkeypatch):
    """Any backend call means validation came too late."""
    def forbidden(*args, **kwargs):
        raise AssertionError('a kernel ran before the arguments were validated')
    for backend in (native, reference):
        for name in ('upsample', 'max_pool2d', 'avg_pool2d', 'adaptive_avg_pool2d'):
            monkeypatch.setattr(backend, name, forbidden)


X = torch.zeros(1, 2, 5, 6)

UPSAMPLE_CASES = [
    # (description, args, kwargs, exception, words the message must contain)
    ('not a tensor', (np.zeros((1, 1, 2, 2)),), dict(size=4), TypeError, ['torch.Tensor']),
    ('int64 input', (torch.zeros(1, 1, 2, 2, dtype=torch.int64),), dict(size=4), TypeError,
     ['dtype', 'int64', 'accepted dtypes', 'uint8']),
    ('uint8 area', (torch.zeros(1, 1, 2, 2, dtype=torch.uint8),),
     dict(size=4, mode='area'), TypeError, ['uint8', 'accepted dtypes', 'float32']),
    ('bool input', (torch.zeros(1, 1, 2, 2, dtype=torch.bool),), dict(size=4), TypeError,
     ['dtype']),
    ('empty channels', (torch.zeros(1, 0, 2, 2),), dict(size=4), ValueError, ['non-empty']),
    ('empty width', (torch.zeros(1, 1, 2, 0),), dict(size=4), ValueError, ['non-empty']),
    ('empty height, area', (torch.zeros(1, 1, 0, 2),), dict(size=4, mode='area'), ValueError,
     ['non-empty']),
    ('neither size nor scale', (X,), dict(), ValueError, ['size', 'scale_factor']),
    ('both size and scale', (X,), dict(size=4, scale_factor=2), ValueError,
     ['size', 'scale_factor', 'both']),
    ('zero size', (X,), dict(size=(0, 3)), ValueError, ['size', '>= 1']),
    ('negative size, area', (X,), dict(size=(-1, 3), mode='area'), ValueError, ['size', '>= 0']),
    ('negative size', (X,), dict(size=-2), ValueError, ['size']),
    ('float size', (X,), dict(size=3.5), TypeError, ['size', 'int']),
    ('size of wrong length', (X,), dict(size=(2, 3, 4)), ValueError, ['size', '2']),
    ('size of one entry', (X,), dict(size=(2,)), ValueError, ['size', '2']),
    ('bool size', (X,), dict(size=True), TypeError, ['size']),
    ('zero scale', (X,), dict(scale_factor=0), ValueError, ['scale_factor', '> 0']),
    ('negative scale', (X,), dict(scale_factor=-2.0), ValueError, ['scale_factor']),
    ('nan scale', (X,), dict(scale_factor=math.nan), ValueError, ['scale_factor', 'finite']),
    ('inf scale', (X,), dict(scale_factor=math.inf), ValueError, ['scale_factor', 'finite']),
    ('scale giving empty output', (X,), dict(scale_factor=0.1), ValueError,
     ['scale_factor', 'empty']),
    ('string scale', (X,), dict(scale_factor='2'), TypeError, ['scale_factor']),
    ('scale of wrong length', (X,), dict(scale_factor=(2.0, 2.0, 2.0)), ValueError,
     ['scale_factor']),
    ('unknown mode', (X,), dict(size=4, mode='linear'), ValueError, ['mode', 'bilinear']),
    ('unknown mode (NotImplementedError)', (X,), dict(size=4, mode='linear'),
     NotImplementedError, ['mode']),
    ('trilinear mode', (X,), dict(size=4, mode='trilinear'), ValueError, ['mode']),
    ('align_corners with nearest', (X,), dict(size=4, mode='nearest', align_corners=True),
     ValueError, ['align_corners', 'nearest']),
    ('align_corners with area', (X,), dict(size=4, mode='area', align_corners=False),
     ValueError, ['align_corners']),
    ('non-bool align_corners', (X,), dict(size=4, mode='bilinear', align_corners=1),
     TypeError, ['align_corners']),
    ('antialias with nearest', (X,), dict(size=4, mode='nearest', antialias=True), ValueError,
     ['antialias']),
    ('antialias with area', (X,), dict(size=4, mode='area', antialias=True), ValueError,
     ['antialias']),
    ('recompute with size', (X,), dict(size=4, recompute_scale_factor=True), ValueError,
     ['recompute_scale_factor', 'size']),
    ('unknown backend', (X,), dict(size=4, backend='cuda'), ValueError, ['backend', 'auto']),
    ('backend without the op', (X,), dict(size=4, backend=''), ValueError, ['backend', 'native']),
    ('unknown precision', (X,), dict(size=4, precision='fp8'), ValueError,
     ['precision', 'fp16']),
    ('precision of wrong type', (X,), dict(size=4, precision=16), TypeError, ['precision']),
    ('float64 precision', (X,), dict(size=4, precision=torch.float64), ValueError,
     ['precision']),
]


@pytest.mark.parametrize('case', UPSAMPLE_CASES, ids=[c[0] for c in UPSAMPLE_CASES])
def test_upsample_rejects(case):
    _, args, kwargs, exc, words = case
    with pytest.raises(exc) as info:
        ops.upsample(*args, **kwargs)
    for word in words:
        assert word in str(info.value), (word, str(info.value))


POOL_CASES = [
    ('not a tensor', 'max', ([[1.0]], 2), {}, TypeError, ['torch.Tensor']),
    ('2-D input', 'max', (torch.zeros(5, 5), 2), {}, ValueError, ['(C, H, W)', '2-D']),
    ('2-D input (IndexError)', 'avg', (torch.zeros(5, 5), 2), {}, IndexError, ['2-D']),
    ('empty channels', 'max', (torch.zeros(1, 0, 5, 5), 2), {}, ValueError, ['non-empty']),
    ('3-D input, empty channels', 'avg', (torch.zeros(0, 5, 5), 2), {}, ValueError,
     ['non-empty']),
    ('zero kernel', 'max', (X, 0), {}, ValueError, ['kernel_size', '>= 1']),
    ('negative kernel', 'avg', (X, -3), {}, ValueError, ['kernel_size']),
    ('float kernel', 'max', (X, 2.5), {}, TypeError, ['kernel_size', 'int']),
    ('kernel of wrong length', 'max', (X, (2, 2, 2)), {}, ValueError, ['kernel_size']),
    ('zero stride', 'max', (X, 2), dict(stride=0), ValueError, ['stride']),
    ('negative stride', 'avg', (X, 2), dict(stride=(1, -1)), ValueError, ['stride']),
    ('zero dilation', 'max', (X, 2), dict(dilation=0), ValueError, ['dilation']),
    ('padding above half kernel', 'max', (X, 3), dict(padding=2), ValueError,
     ['padding', 'half']),
    ('padding above half kernel (avg)', 'avg', (X, 2), dict(padding=(0, 2)), ValueError,
     ['padding', 'half']),
    ('negative padding', 'max', (X, 3), dict(padding=-1), ValueError, ['padding']),
    ('unknown padding string', 'max', (X, 3), dict(padding='full'), ValueError,
     ['padding', 'same_lower']),
    ('kernel larger than input', 'max', (X, 7), {}, ValueError, ['kernel_size', 'larger']),
    ('dilated kernel larger than input', 'max', (X, 3), dict(dilation=3), ValueError,
     ['larger']),
    ('divisor_override zero', 'avg', (X, 2), dict(divisor_override=0), ValueError,
     ['divisor_override']),
    ('divisor_override float', 'avg', (X, 2), dict(divisor_override=1.5), TypeError,
     ['divisor_override']),
    ('integer avg input', 'avg', (torch.zeros(1, 1, 4, 4, dtype=torch.int32), 2), {},
     TypeError, ['dtype', 'int32', 'int64']),
    ('integer avg input (NotImplementedError)', 'avg',
     (torch.zeros(1, 1, 4, 4, dtype=torch.int32), 2), {}, NotImplementedError, ['int32']),
    ('bool max input', 'max', (torch.zeros(1, 1, 4, 4, dtype=torch.bool), 2), {},
     TypeError, ['dtype', 'bool']),
    ('non-bool ceil_mode', 'max', (X, 2), dict(ceil_mode='yes'), TypeError, ['ceil_mode']),
    ('non-bool count_include_pad', 'avg', (X, 2), dict(count_include_pad=None), TypeError,
     ['count_include_pad']),
    ('non-bool ceil_mode (1)', 'max', (X, 2), dict(ceil_mode=1), TypeError, ['ceil_mode']),
    ('unknown precision', 'avg', (X, 2), dict(precision='int8'), ValueError, ['precision']),
    ('unknown backend', 'max', (X, 2), dict(backend='tpu'), ValueError, ['backend']),
    ('adaptive negative size', 'adaptive', (X, -1), {}, ValueError, ['output_size', '>= 0']),
    ('adaptive wrong length', 'adaptive', (X, (1, 2, 3)), {}, ValueError, ['output_size']),
    ('adaptive float size', 'adaptive', (X, 2.5), {}, TypeError, ['output_size']),
    ('adaptive integer input', 'adaptive', (torch.zeros(1, 1, 4, 4, dtype=torch.int32), 2), {},
     TypeError, ['dtype']),
    ('adaptive empty width', 'adaptive', (torch.zeros(1, 1, 4, 0), 2), {}, ValueError,
     ['non-empty']),
    ('adaptive 5-D input', 'adaptive', (torch.zeros(1, 1, 1, 4, 4), 2), {}, ValueError,
     ['3D or 4D']),
]
POOL_OPS = {'max': ops.max_pool2d, 'avg': ops.avg_pool2d, 'adaptive': ops.adaptive_avg_pool2d}


@pytest.mark.parametrize('case', POOL_CASES, ids=[c[0] for c in POOL_CASES])
def test_pooling_rejects(case):
    _, op, args, kwargs, exc, words = case
    with pytest.raises(exc) as info:
        POOL_OPS[op](*args, **kwargs)
    for word in words:
        assert word in str(info.value), (word, str(info.value))
