"""The ahead-of-time check's parts that need no compiler: Triton's binder as used by
:mod:`mmseg_cann.kernels.aot`, the resource-usage parsers, and what the cases record.
(The compilation itself runs in tests/tools/test_device_check.py, in a process without
the interpreter.)"""
from __future__ import annotations

import collections

import pytest
import torch

pytest.importorskip('triton')

from triton.runtime.jit import JITFunction  # noqa: E402

from mmseg_cann import ops  # noqa: E402
from mmseg_cann.backends import triton_aot  # noqa: E402
from mmseg_cann.kernels import _common, aot  # noqa: E402


def _probe(x_ptr, n, one, aligned, scale, BLOCK: 'tl.constexpr'):  # noqa: F821
    pass


def test_bind_specialises_as_a_launch():
    """Ints equal to 1 become constants, 16-divisible ints and pointers get the
    divisibility hint, floats are never specialised (so divisor_override=1 passed as a
    float stays a runtime value)."""
    kernel = JITFunction(_probe)
    x = torch.zeros(64)
    v = aot.bind(kernel, (x, 7, 1, 32, 1.0), dict(BLOCK=16), aot.TARGETS['cuda'])
    assert v.signature == dict(x_ptr='*fp32', n='i32', one='constexpr', aligned='i32',
                               scale='fp32', BLOCK='constexpr')
    assert v.constexprs == {(2,): 1, (5,): 16}
    assert v.attrs[(0,)] == [['tt.divisibility', 16]]   # 16-byte aligned pointer
    assert v.attrs[(3,)] == [['tt.divisibility', 16]]   # 32
    assert v.attrs[(1,)] == []                          # 7
    assert 'one=1' in v.meta and 'num_warps=4' in v.meta
    # an unaligned start drops the pointer's hint; an int >= 2^31 is i64
    v = aot.bind(kernel, (x[1:], 2 ** 31, 2, 3, 1.0), dict(BLOCK=16), aot.TARGETS['cuda'])
    assert v.attrs[(0,)] == [] and v.signature['n'] == 'i64' and v.signature['one'] == 'i32'
    # on ROCm, pointers into buffers under 2 GB get the buffer-range hint
    v = aot.bind(kernel, (x, 7, 1, 32, 1.0), dict(BLOCK=16), aot.TARGETS['hip'])
    assert ['tt.pointer_range', 32] in v.attrs[(0,)]


def test_bind_rejects_what_is_not_a_compilable_kernel():
    with pytest.raises(TypeError, match='JITFunction'):
        aot.bind(_probe, (), {}, aot.TARGETS['cuda'])
    with pytest.raises(TypeError, match='GPUTarget'):
        aot.bind(JITFunction(_probe), (), {}, 'cuda')


def test_resource_usage_parsers():
    log = ('ptxas info    : Compiling entry function \'k\' for \'sm_90a\'\n'
           'ptxas info    : Function properties for k\n'
           '    8 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads\n'
           'ptxas info    : Used 64 registers, used 0 barriers\n')
    assert aot.parse_ptxas_log(log) == (64, 12)
    with pytest.raises(ValueError, match='ptxas'):
        aot.parse_ptxas_log('nothing here')
    amdgcn = ('  .sgpr_count:     38\n  .sgpr_spill_count: 1\n  .vgpr_count:     13\n'
              '  .vgpr_spill_count: 2\n')
    assert aot.amdgcn_usage(amdgcn) == (13, 3)
    with pytest.raises(ValueError, match='vgpr_count'):
        aot.amdgcn_usage('')


def _kernel_args(launch):
    """(kernel name, dtype of the first tensor, CL flag, INT64 flag) of a launch."""
    first = launch.args[0]
    return (launch.kernel.__name__, first.dtype, launch.kwargs.get('CL'),
            launch.kwargs['INT64'])


@pytest.fixture(scope='module')
def recorded():
    props = _common.DeviceProps(**triton_aot.TARGET_DEVICES['cuda'])
    return (triton_aot.record(ops, triton_aot.all_cases(), props)
            + triton_aot.record(ops, triton_aot.int64_cases(), props, int64=True))


def test_cases_record_every_kernel_dtype_layout_and_flag(recorded):
    launches = [item for rec in recorded for item in rec.launches]
    seen = collections.defaultdict(set)
    for item in launches:
        name, dtype, cl, int64 = _kernel_args(item)
        seen[name].add((dtype, cl, int64))
        first = item.args[0]
        seen[name + ':strided'].add(not first.is_contiguous() and not cl)
    kernels = ['upsample_fwd_kernel', 'upsample_argmax_kernel', 'bilinear_bwd_kernel',
               'max_pool_kernel', 'avg_pool_kernel']
    for name in kernels:
        for dtype in triton_aot.DTYPES:
            for cl in (False, True):
                assert (dtype, cl, False) in seen[name], (name, dtype, cl)
        assert any(int64 for _, _, int64 in seen[name]), name
        assert True in seen[name + ':strided'], name
    # every flag combination of the forward kernel, and of the others
    fwd = {tuple(item.kwargs[k] for k in ('NEAREST', 'ADD', 'OTHER_FLAT'))
           for item in launches if item.kernel.__name__ == 'upsample_fwd_kernel'}
    assert fwd == {(n, False, False) for n in (False, True)} | {
        (n, True, f) for n in (False, True) for f in (False, True)}
    avg = {item.kwargs['OVERRIDE'] for item in launches
           if item.kernel.__name__ == 'avg_pool_kernel'}
    assert avg == {False, True}
    # every candidate configuration of the GPU is recorded
    blocks = {(item.kernel.__name__, item.kwargs['num_warps']) for item in launches}
    assert {w for _, w in blocks} == {4, 8}


def test_cases_include_size_one_dimensions_and_ones(recorded):
    launches = [item for rec in recorded for item in rec.launches]
    # a one-program launch (nprog == iters == 1, both become constants)
    assert any(item.kwargs['nprog'] == 1 and item.kwargs['iters'] == 1 for item in launches)
    # divisor_override=1 reaches the kernel as a float (never a constant)
    overrides = {item.args[14] for item in launches
                 if item.kernel.__name__ == 'avg_pool_kernel' and item.kwargs['OVERRIDE']}
    assert overrides == {1.0, 5.0} and all(isinstance(o, float) for o in overrides)
    # a channel count of 1 and 1x1 inputs
    fwd = [item for item in launches if item.kernel.__name__ == 'upsample_fwd_kernel']
    assert any(item.args[12] == 1 and item.args[0].shape[-2:] == (1, 1) for item in fwd)
    # a (C, H, W) pooling input is launched as a batch of one
    assert any('(3, 7, 9)' in rec.case for rec in recorded)


def test_recorded_int64_launches_and_their_cases(recorded):
    int64 = [rec for rec in recorded if rec.case.endswith('[int64]')]
    assert int64 and all(item.kwargs['INT64'] for rec in int64 for item in rec.launches)
    assert not any(item.kwargs['INT64'] for rec in recorded if rec not in int64
                   for item in rec.launches)


def test_make_layouts_and_errors():
    x = triton_aot.make((2, 3, 4, 5), torch.float16, 'strided')
    assert not x.is_contiguous() and x.storage_offset() == 1 and x.shape == (2, 3, 4, 5)
    assert triton_aot.make((2, 3, 4, 5), torch.float32, 'channels_last').is_contiguous(
        memory_format=torch.channels_last)
    with pytest.raises(ValueError, match='layout'):
        triton_aot.make((1, 1, 1, 1), torch.float32, 'nhwc')


def test_run_check_validates_before_compiling(monkeypatch):
    monkeypatch.setenv('TRITON_INTERPRET', '1')
    with pytest.raises(RuntimeError, match='TRITON_INTERPRET'):
        triton_aot.run_check(ops)
    monkeypatch.delenv('TRITON_INTERPRET')
    with pytest.raises(ValueError, match='targets'):
        triton_aot.run_check(ops, targets=['cuda', 'sm_100'], cases=[], wide_cases=[])


def test_a_case_that_launches_nothing_is_an_error():
    props = _common.DeviceProps(**triton_aot.TARGET_DEVICES['cuda'])
    case = triton_aot.Case('native only', lambda ops_: ops_.upsample(
        torch.zeros(1, 1, 2, 2), size=4, mode='bicubic', backend='triton'))
    with pytest.raises(RuntimeError, match='launched no kernel'):
        triton_aot.record(ops, [case], props)


def test_report_table_counts_failures_spills_and_skips():
    results = [aot.Result('k1', 'cuda:90', 'a', 'BLOCK=256', registers=40, spills=0),
               aot.Result('k1', 'cuda:90', 'b', 'BLOCK=512', registers=72, spills=16),
               aot.Result('k2', 'cuda:90', 'c', '', error='CompilationError: at 1:2')]
    report = triton_aot.Report(results=results, skipped={'hip:gfx942': 'no amd backend'},
                               launches={'cuda:90': 6}, cases=3,
                               first_case={'b': 'case b', 'c': 'case c'})
    assert not report.ok and report.failures == results[2:] and report.spilling == [
        results[1]]
    assert triton_aot.summary_rows(report) == [
        dict(target='cuda:90', kernel='k1', variants=2, max_registers=72, spills=1,
             failures=0),
        dict(target='cuda:90', kernel='k2', variants=1, max_registers=0, spills=0,
             failures=1)]
    text = triton_aot.format_report(report)
    assert '| cuda:90 | k1 | 2 | 72 | 1 | 0 |' in text
    assert '| hip:gfx942 | skipped: no amd backend |' in text
    assert 'first case: case c\n  CompilationError: at 1:2' in text
    assert 'first case: case b\n  spills: 16' in text
    data = triton_aot.report_json(report)
    assert data['ok'] is False and data['results'][2]['case'] == 'case c'
    assert triton_aot.Report(results=results[:1]).ok
    assert not triton_aot.Report().ok  # nothing compiled is not a pass
