"""The row kernels that launches on an NPU take (block loads only, for triton-ascend),
run under Triton's interpreter with an Ascend launch
plan: bit for bit the results of the flat kernels (which the other kernel tests compare
with PyTorch), NaN and infinities included; and which launches take them."""
from __future__ import annotations

import pytest
import torch

from mmseg_cann.ops import avg_pool2d, max_pool2d, upsample
from mmseg_cann.ops.fused import upsample_add, upsample_argmax
from tests._helpers import kernel_input

pytest.importorskip('triton')

from mmseg_cann.kernels import _common  # noqa: E402

NPU = _common.DeviceProps('npu', 40, max_grid=65535, name='Ascend910B3')
#: (input H, W) -> (output H, W): 1x1 input, 2x, coprime, height-1 and width-1 inputs,
#: a row longer than one tile (256 columns), downsampling (by 2 and by 17), a 1x1 output
UPSAMPLE_SHAPES = [((1, 1), (2, 2)), ((4, 6), (8, 12)), ((3, 5), (4, 7)), ((1, 6), (3, 13)),
                   ((6, 1), (13, 3)), ((1, 150), (1, 300)), ((9, 11), (4, 5)),
                   ((2, 34), (3, 2)), ((5, 7), (1, 1))]
SETTINGS = [dict(mode='nearest'), dict(mode='nearest-exact'),
            dict(mode='bilinear', align_corners=False),
            dict(mode='bilinear', align_corners=True)]
#: windows: the main ones, stride 1, SAME, ceil mode, stride 3, stride 17 (flat kernels)
POOL_CASES = [((7, 9), dict(kernel_size=3, stride=2, padding=1)),
              ((8, 8), dict(kernel_size=2, stride=2)),
              ((1, 9), dict(kernel_size=3, stride=2, padding=1)),
              ((9, 1), dict(kernel_size=3, stride=2, padding=1)),
              ((1, 1), dict(kernel_size=3, stride=2, padding=1)),
              ((5, 6), dict(kernel_size=(1, 3), stride=1, padding=(0, 1))),
              ((6, 5), dict(kernel_size=3, stride=2, padding='same')),
              ((5, 5), dict(kernel_size=3, stride=2, padding=1, ceil_mode=True)),
              ((3, 40), dict(kernel_size=3, stride=2, padding=1)),
              ((8, 7), dict(kernel_size=2, stride=3)),
              ((3, 40), dict(kernel_size=(1, 17), stride=17))]


def _with_specials(x):
    """``x`` with a NaN, +inf and -inf (bit patterns must survive the kernels)."""
    x = x.clone(memory_format=torch.preserve_format) if x.is_contiguous() or \
        x.is_contiguous(memory_format=torch.channels_last) else x
    h, w = x.shape[-2:]
    x[0, 0, h // 2, w // 2] = float('inf')
    x[-1, -1, -1, -1] = float('-inf')
    x[0, 0, 0, 0] = float('nan')
    return x


def _bits(t):
    if t.is_floating_point():
        return t.contiguous().view({2: torch.int16, 4: torch.int32}[t.element_size()])
    return t


def _assert_bits_equal(got, want):
    assert got.shape == want.shape and got.dtype == want.dtype
    assert got.stride() == want.stride()
    assert torch.equal(_bits(got), _bits(want))


def _upsample_results(x, other, size, setting):
    out = [upsample(x, size=size, backend='triton', **setting),
           upsample_add(x, other, backend='triton', **setting),
           upsample_argmax(x, size, backend='triton', **setting)]
    if setting['mode'] == 'bilinear':
        xg = x.detach().requires_grad_()
        grad = kernel_input(x.shape[:2] + tuple(size), torch.float32, seed=9)
        out.append(torch.autograd.grad(upsample(xg, size=size, backend='triton', **setting),
                                       xg, grad)[0])
    return out


@pytest.mark.slow
@pytest.mark.parametrize('dtype,layout', [(torch.float32, 'contiguous'),
                                          (torch.float16, 'strided'),
                                          (torch.float32, 'channels_last')], ids=str)
def test_upsample_row_kernels_match_the_flat_kernels_bit_for_bit(dtype, layout):
    for seed, ((h, w), size) in enumerate(UPSAMPLE_SHAPES):
        x = _with_specials(kernel_input((1, 2, h, w), dtype, layout, seed=seed))
        other = kernel_input((1, 2) + size, dtype, layout, seed=20 + seed)
        for setting in SETTINGS:
            want = _upsample_results(x, other, size, setting)
            with _common.launch_context(NPU):
                got = _upsample_results(x, other, size, setting)
            for g, r in zip(got, want):
                _assert_bits_equal(g, r)


@pytest.mark.slow
@pytest.mark.parametrize('dtype,layout', [(torch.float32, 'contiguous'),
                                          (torch.float16, 'strided'),
                                          (torch.float32, 'channels_last')], ids=str)
def test_pool_row_kernels_match_the_flat_kernels_bit_for_bit(dtype, layout):
    for seed, (hw, kw) in enumerate(POOL_CASES):
        x = _with_specials(kernel_input((1, 2) + hw, dtype, layout, seed=seed))

        def run():
            return (*max_pool2d(x, **kw, return_indices=True, backend='triton'),
                    avg_pool2d(x, **kw, backend='triton'),
                    avg_pool2d(x, **kw, count_include_pad=False, backend='triton'),
                    avg_pool2d(x, **kw, divisor_override=5, backend='triton'))
        want = run()
        with _common.launch_context(NPU):
            got = run()
        for g, r in zip(got, want):
            _assert_bits_equal(g, r)


def _launched(fn):
    launches = []
    with _common.launch_context(NPU, record=launches):
        fn()
    return [item.kernel.__name__ for item in launches]


def test_npu_launches_take_row_kernels_where_they_apply():
    x = torch.zeros(1, 2, 4, 6)
    cl = x.contiguous(memory_format=torch.channels_last)
    assert _launched(lambda: upsample(x, size=(8, 12), mode='bilinear',
                                      backend='triton')) == ['upsample_fwd_rows_kernel']
    assert _launched(lambda: upsample_argmax(x, (8, 12), backend='triton')) == [
        'upsample_argmax_rows_kernel']
    assert _launched(lambda: max_pool2d(x, 3, 2, 1, backend='triton')) == [
        'max_pool_rows_kernel']
    assert _launched(lambda: avg_pool2d(x, 2, 2, backend='triton')) == [
        'avg_pool_rows_kernel']
    assert _launched(lambda: upsample(cl, size=(8, 12), backend='triton')) == [
        'upsample_fwd_rows_kernel']
    assert _launched(lambda: avg_pool2d(x, 3, 3, backend='triton')) == [
        'avg_pool_rows_kernel']
    # downsampling along W by more than 128 and column strides over 16 keep the flat ones
    wide = torch.zeros(1, 2, 4, 600)
    assert _launched(lambda: upsample(wide, size=(8, 2), backend='triton')) == [
        'upsample_fwd_kernel']
    assert _launched(lambda: avg_pool2d(wide, (1, 17), 17, backend='triton')) == [
        'avg_pool_kernel']
    # the GPU plan never takes them
    launches = []
    with _common.launch_context(_common.DeviceProps('cuda', 132), record=launches):
        upsample(x, size=(8, 12), backend='triton')
    assert {item.kernel.__name__ for item in launches} == {'upsample_fwd_kernel'}
