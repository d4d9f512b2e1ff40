"""The parity checker's case list and its judgement."""
import torch

from mmseg_cann.analysis import parity


def test_case_list_covers_every_mode_and_op():
    cases = parity.build_cases()
    variants = {c.variant.split(' ')[0] for c in cases if c.op == 'upsample'}
    assert variants == {'nearest', 'nearest-exact', 'bilinear', 'bicubic', 'area'}
    assert any('align_corners=True' in c.variant for c in cases)
    assert any('antialias=True' in c.variant for c in cases)
    assert {c.op for c in cases} == {'upsample', 'max_pool2d', 'avg_pool2d',
                                     'adaptive_avg_pool2d'}
    assert any('same' in c.variant for c in cases if c.op == 'max_pool2d')
    assert len(parity.build_cases(quick=True)) < len(cases)


def test_passes_on_cpu_and_reports_nearest_rule():
    cases = [c for c in parity.build_cases(quick=True)
             if c.op == 'upsample' and c.variant == 'nearest']
    results = parity.run_all(cases, torch.device('cpu'), [torch.float32, torch.float64])
    assert all(r.passed for r in results)
    rules = {(r.dtype, r.shape): r.rule for r in results}
    assert rules[('float32', '2x3x2x2->82x82')] == 'pytorch'
    assert rules[('float64', '2x3x2x2->82x82')] == 'exact'


def test_detects_a_kernel_computing_in_lower_precision():
    case = next(c for c in parity.build_cases(quick=True)
                if c.op == 'upsample' and c.variant.startswith('bilinear'))
    good = parity.run_case(case, torch.device('cpu'), torch.float32)
    bad = parity.run_case(case, torch.device('cpu'), torch.float32,
                          op_kwargs=dict(precision='bf16'))
    assert good.passed and not bad.passed
    assert bad.max_abs_err > parity.tolerance(case, torch.float32)


def test_detects_wrong_indices():
    case = next(c for c in parity.build_cases(quick=True)
                if c.op == 'max_pool2d' and c.in_shape[-1] > 3)
    original = parity.OPS['max_pool2d']
    try:
        parity.OPS['max_pool2d'] = lambda x, **kw: (original(x, **kw)[0],
                                                    original(x, **kw)[1] * 0)
        result = parity.run_case(case, torch.device('cpu'), torch.float32)
    finally:
        parity.OPS['max_pool2d'] = original
    assert not result.passed and 'indices' in result.note


def test_full_run_averages_in_the_input_dtype_too():
    # the default 'fp32' policy would hide a kernel that accumulates fp16 in fp16
    full = [c for c in parity.build_cases() if c.op_kwargs.get('precision') == 'input']
    assert {c.op for c in full} == {'avg_pool2d', 'adaptive_avg_pool2d'}
    assert not [c for c in parity.build_cases(quick=True) if c.op_kwargs]
    assert all('precision' not in c.kwargs and c.call_kwargs['precision'] == 'input'
               for c in full)


def test_op_only_arguments_reach_the_op_but_not_the_reference():
    case = next(c for c in parity.build_cases() if c.op_kwargs.get('precision') == 'input'
                and c.op == 'avg_pool2d')
    seen = {}
    original = parity.OPS['avg_pool2d']
    try:
        parity.OPS['avg_pool2d'] = lambda x, **kw: seen.update(kw) or original(x, **kw)
        result = parity.run_case(case, torch.device('cpu'), torch.float16)
    finally:
        parity.OPS['avg_pool2d'] = original
    assert seen['precision'] == 'input' and result.passed
    assert result.kernels is None and result.device_indices == ''
