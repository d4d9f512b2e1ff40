"""Property-based tests: random shapes and arguments against PyTorch and the reference."""
import math
import os

import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mmseg_cann import ops
from mmseg_cann.core import geometry as geo
from mmseg_cann.core import reference as ref

#: raise with HYPOTHESIS_EXAMPLES=2000 for a longer local hunt
SETTINGS = settings(max_examples=int(os.environ.get('HYPOTHESIS_EXAMPLES', '60')), deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])
modes = st.sampled_from(['nearest', 'nearest-exact', 'bilinear', 'bicubic', 'area'])


@st.composite
def upsample_calls(draw):
    mode = draw(modes)
    hi, wi = draw(st.integers(1, 12)), draw(st.integers(1, 12))
    kw = dict(mode=mode)
    if mode in ('bilinear', 'bicubic'):
        kw['align_corners'] = draw(st.sampled_from([None, False, True]))
        kw['antialias'] = draw(st.booleans())
    if draw(st.booleans()):
        kw['size'] = (draw(st.integers(1, 40)), draw(st.integers(1, 40)))
    else:
        sh = draw(st.floats(0.25, 6.0))
        sw = draw(st.floats(0.25, 6.0))
        if math.floor(hi * sh) < 1 or math.floor(wi * sw) < 1:
            sh, sw = max(sh, 1.0), max(sw, 1.0)
        kw['scale_factor'] = (sh, sw)
        kw['recompute_scale_factor'] = draw(st.sampled_from([None, False, True]))
    return (draw(st.integers(0, 2)), draw(st.integers(1, 3)), hi, wi), kw


@SETTINGS
@given(upsample_calls(), st.sampled_from([torch.float32, torch.float64]),
       st.booleans(), st.integers(0, 2**31 - 1))
def test_upsample_equals_pytorch(call, dtype, channels_last, seed):
    shape, kw = call
    x = (torch.rand(shape, generator=torch.Generator().manual_seed(seed), dtype=dtype) * 2 - 1)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    out_w = kw['size'][1] if 'size' in kw else math.floor(shape[3] * kw['scale_factor'][1])
    out_h = kw['size'][0] if 'size' in kw else math.floor(shape[2] * kw['scale_factor'][0])
    if kw.get('antialias') and out_w == 1 and out_h not in (1, shape[2]):
        # PyTorch's NCHW antialias defect (tests/ops/test_upsample.py): the reference
        torch.testing.assert_close(ops.upsample(x, **kw), ref.upsample(x, **kw).to(dtype),
                                   rtol=0, atol=1e-5)
        return
    assert torch.equal(ops.upsample(x, **kw), F.interpolate(x, **kw))


@SETTINGS
@given(upsample_calls(), st.integers(0, 2**31 - 1))
def test_upsample_float64_matches_reference(call, seed):
    shape, kw = call
    x = torch.rand(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    got = ops.upsample(x, **kw)
    if kw['mode'].startswith('nearest'):
        candidates = [ref.upsample(x, **kw, nearest_rule=r) for r in ('pytorch', 'exact')]
        assert any(torch.equal(got, c) for c in candidates)
    else:
        torch.testing.assert_close(got, ref.upsample(x, **kw), rtol=0, atol=1e-11)


@st.composite
def pool_calls(draw):
    k = (draw(st.integers(1, 5)), draw(st.integers(1, 5)))
    s = (draw(st.integers(1, 4)), draw(st.integers(1, 4)))
    d = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    padding = draw(st.one_of(
        st.sampled_from(['same', 'same_lower', 'valid']),
        st.tuples(st.integers(0, k[0] // 2), st.integers(0, k[1] // 2))))
    ceil_mode = draw(st.booleans())
    hw = (draw(st.integers(1, 14)), draw(st.integers(1, 14)))
    return hw, dict(kernel_size=k, stride=s, padding=padding, dilation=d, ceil_mode=ceil_mode)


def _spec_or_none(hw, kw):
    try:
        return geo.pool_spec(hw, geo.check_pool_args(**kw))
    except ValueError:
        return None


@SETTINGS
@given(pool_calls(), st.integers(0, 2**31 - 1))
def test_max_pool_matches_reference_and_pytorch(call, seed):
    hw, kw = call
    spec = _spec_or_none(hw, kw)
    if spec is None:
        return
    x = torch.rand((2, 2) + hw, generator=torch.Generator().manual_seed(seed),
                   dtype=torch.float64)
    values, index = ops.max_pool2d(x, **kw, return_indices=True)
    exp_values, exp_index = ref.max_pool2d(x, **kw, return_indices=True)
    assert torch.equal(values, exp_values) and torch.equal(index, exp_index)
    if isinstance(kw['padding'], str) and kw['padding'].startswith('same'):
        assert values.shape[-2:] == tuple(-(-n // s) for n, s in zip(hw, kw['stride']))
    elif spec.torch_padding_ok:
        pt = dict(kw, padding=0 if kw['padding'] == 'valid' else kw['padding'])
        assert torch.equal(values, F.max_pool2d(x, **pt))


@SETTINGS
@given(pool_calls(), st.booleans(), st.integers(0, 2**31 - 1))
def test_avg_pool_matches_reference(call, count_include_pad, seed):
    hw, kw = call
    kw = dict(kw, dilation=1)
    if _spec_or_none(hw, kw) is None:
        return
    kw.pop('dilation')
    x = torch.rand((1, 2) + hw, generator=torch.Generator().manual_seed(seed),
                   dtype=torch.float64)
    torch.testing.assert_close(ops.avg_pool2d(x, **kw, count_include_pad=count_include_pad),
                               ref.avg_pool2d(x, **kw, count_include_pad=count_include_pad),
                               rtol=0, atol=1e-12)
