"""``--trace``: reading torch_npu profiler output, checking it against the plans, and the
parity table with kernels, on CPU with a fake profiler that writes the files torch_npu
writes (the parsing is the code a real NPU run uses)."""
import csv
import json
import os
import time
import types
from contextlib import contextmanager

import pytest
import torch

from mmseg_cann.analysis import npu_trace, parity
from mmseg_cann.analysis.npu_calls import describe_observed, plan_for_call
from mmseg_cann.backends.npu_device import DeviceCaps

A2 = DeviceCaps.npu('A2', torch_npu='2.8.0')


def write_profiler_output(trace_dir, kernels, name='host_1_20260101_ascend_pt', fmt='csv'):
    """Files laid out as torch_npu's tensorboard_trace_handler writes them."""
    out = os.path.join(trace_dir, name, npu_trace.OUTPUT_DIR)
    os.makedirs(out, exist_ok=True)
    if fmt == 'csv':
        with open(os.path.join(out, npu_trace.KERNEL_DETAILS), 'w', newline='') as f:
            writer = csv.writer(f)
            writer.writerow(['Step Id', 'Name', 'Type', 'Accelerator Core', 'Start Time(us)',
                             'Duration(us)'])
            for i, kernel in enumerate(kernels):
                writer.writerow([1, f'aclnnOp_{kernel}_{kernel}', kernel, 'AI_CORE', i, 1.5])
    else:
        events = [{'ph': 'M', 'name': 'process_name', 'pid': 7, 'args': {'name': 'Python'}},
                  {'ph': 'M', 'name': 'process_name', 'pid': 9,
                   'args': {'name': npu_trace.DEVICE_PROCESS}},
                  {'ph': 'X', 'name': 'aten::upsample_bilinear2d', 'pid': 7, 'ts': 0, 'dur': 2}]
        events += [{'ph': 'X', 'name': k, 'pid': 9, 'ts': i, 'dur': 1}
                   for i, k in enumerate(kernels)]
        with open(os.path.join(out, npu_trace.TRACE_VIEW), 'w') as f:
            json.dump({'traceEvents': events}, f)
    return out


def test_kernel_details_csv_gives_the_kernel_types_in_order(tmp_path):
    write_profiler_output(tmp_path, ['TransData', 'ResizeBilinearV2', 'TransData'])
    assert npu_trace.read_kernel_names(str(tmp_path)) == ['TransData', 'ResizeBilinearV2']


def test_trace_view_json_gives_the_device_tasks_only(tmp_path):
    write_profiler_output(tmp_path, ['Cast', 'UpsampleBilinear2d', 'Cast'], fmt='json')
    assert npu_trace.read_kernel_names(str(tmp_path)) == ['Cast', 'UpsampleBilinear2d']


def test_the_newest_profiler_output_is_read(tmp_path):
    old = write_profiler_output(tmp_path, ['Pooling'], name='host_1_old_ascend_pt')
    os.utime(old, (time.time() - 100, time.time() - 100))
    write_profiler_output(tmp_path, ['AvgPool3D'], name='host_1_new_ascend_pt')
    assert npu_trace.read_kernel_names(str(tmp_path)) == ['AvgPool3D']


def test_a_csv_without_a_type_column_uses_the_names(tmp_path):
    out = os.path.join(tmp_path, npu_trace.OUTPUT_DIR)
    os.makedirs(out)
    with open(os.path.join(out, npu_trace.KERNEL_DETAILS), 'w') as f:
        f.write('Name,Duration(us)\naclnnMaxPool2dWithMask_MaxPool3DWithArgmaxV2,3\n')
    names = npu_trace.read_kernel_names(str(tmp_path))
    assert names == ['aclnnMaxPool2dWithMask_MaxPool3DWithArgmaxV2']
    assert npu_trace.trace_verdict(('MaxPool3DWithArgmaxV2',), (), names) == 'ok'


def test_missing_profiler_output_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match='kernel_details.csv'):
        npu_trace.read_kernel_names(str(tmp_path))


@pytest.mark.parametrize('expect,forbid,kernels,verdict', [
    (('UpsampleBilinear2d',), ('ResizeBilinearV2',), ['Cast', 'UpsampleBilinear2d'], 'ok'),
    (('UpsampleBilinear2d',), ('ResizeBilinearV2',), ['TransData', 'ResizeBilinearV2'],
     'MISMATCH: expected UpsampleBilinear2d; ran ResizeBilinearV2'),
    (('ReduceMean',), (), [], 'MISMATCH: expected ReduceMean'),
    ((), ('Pooling',), ['AvgPool3D'], 'ok'),
    ((), (), ['Anything'], '-'),
    (('pooling',), (), ['Pooling'], 'ok'),  # case-insensitive
])
def test_trace_verdict(expect, forbid, kernels, verdict):
    assert npu_trace.trace_verdict(expect, forbid, kernels) == verdict


class FakeProfiler:
    """torch_npu.profiler as NpuTracer uses it. On exit the profile writes, under the
    handler's directory, the kernels ``kernels_for(directory)`` names."""

    ProfilerActivity = types.SimpleNamespace(NPU='NPU', CPU='CPU')

    def __init__(self, kernels_for):
        self.kernels_for = kernels_for
        self.profiles = 0

    def tensorboard_trace_handler(self, dir_name):
        return dir_name

    @contextmanager
    def profile(self, activities, on_trace_ready):
        assert activities == [self.ProfilerActivity.NPU]
        self.profiles += 1
        yield self
        write_profiler_output(on_trace_ready, self.kernels_for(on_trace_ready))


def kernels_of_a_910a_like_device(case_dir):
    """A device that resizes every bilinear call with TransData + ResizeBilinearV2 and
    pools with the kernels the A2 plans predict."""
    name = os.path.basename(case_dir)
    if 'upsample_bilinear' in name:
        return ['TransData', 'ResizeBilinearV2', 'TransData']
    if 'max_pool2d' in name:
        return ['MaxPool3DWithArgmaxV2']
    return []


def test_tracer_runs_one_profile_per_call(tmp_path):
    fake = FakeProfiler(lambda d: ['ReduceMean'])
    tracer = npu_trace.NpuTracer(str(tmp_path), profiler=fake)
    out, kernels = tracer.trace(lambda: 42, 'adaptive_avg_pool2d:out=1')
    assert (out, kernels, fake.profiles) == (42, ['ReduceMean'], 1)
    assert os.listdir(tmp_path) == ['00001_adaptive_avg_pool2d_out_1']


def test_parity_table_shows_the_kernels_and_flags_mispredicted_plans(tmp_path):
    cases = [c for c in parity.build_cases(quick=True)
             if c.variant in ('bilinear align_corners=False', 'k3 s2 p1 d1')]
    tracer = npu_trace.NpuTracer(str(tmp_path), profiler=FakeProfiler(
        kernels_of_a_910a_like_device))

    def plan_fn(case, x):
        return plan_for_call(case.op, x, case.call_kwargs, A2)

    results = parity.run_all(cases, torch.device('cpu'), [torch.float32], plan_fn=plan_fn,
                             tracer=tracer)
    table = parity.format_table(results)
    assert table.splitlines()[0].split()[-3:] == ['kernels', 'trace', 'result']
    fast = [r for r in results if 'UpsampleBilinear2d (fast' in r.plan]
    slow = [r for r in results if 'ResizeBilinearV2' in r.plan]
    pools = [r for r in results if r.op == 'max_pool2d']
    assert fast and slow and pools and len(fast) + len(slow) + len(pools) == len(results)
    for r in fast:  # predicted the fast kernel, but the trace shows ResizeBilinearV2
        identity = r.shape == '2x3x5x7->5x7'  # the fast branch runs no kernel for it
        assert r.trace == ('MISMATCH: ran ResizeBilinearV2' if identity else
                           'MISMATCH: expected UpsampleBilinear2d; ran ResizeBilinearV2')
        assert r.kernels == ['TransData', 'ResizeBilinearV2']
    assert all(r.trace == 'ok' for r in slow + pools)
    mismatch_rows = [line for line in table.splitlines() if 'MISMATCH' in line]
    assert len(mismatch_rows) == len(fast)
    assert all('TransData, ResizeBilinearV2' in line for line in mismatch_rows)
    summary = parity.summarize(results)
    assert summary['traced'] == len(results) and summary['trace_mismatches'] == len(fast)
    assert all(r.passed for r in results)  # a mispredicted kernel is not a parity failure
    only = parity.format_table(results, failures_only=True).splitlines()
    assert len(only) == 2 + len(fast)  # header, rule, and the flagged rows


def test_max_pool_plan_column_reports_the_kernel_the_device_used():
    x = torch.rand(1, 2, 9, 9)
    plan = plan_for_call('max_pool2d', x, dict(kernel_size=3, stride=2, padding=1,
                                               return_indices=True), A2)
    assert 'aclnnMaxPool2dWithMask' in plan.describe()
    mask = describe_observed(plan, ['int8 mask'])
    indices = describe_observed(plan, ['int32 indices'])
    assert 'the device returned an int8 mask' in mask
    assert 'aclnnMaxPool2dWithIndices (the device returned int32' in indices
    assert describe_observed(plan, []) == plan.describe()
    result = parity.Result('max_pool2d', 'k3', '1x2x9x9', 'float32', 0, 0, 0, True,
                           device_indices='int32 indices')
    parity._fill_plan(result, plan, types.SimpleNamespace(type='npu'))
    assert result.plan == indices
    parity._fill_plan(result, plan, torch.device('cpu'))  # a CPU run with --assume-chip
    assert result.plan == plan.describe()


def test_the_default_tracer_needs_torch_npu(tmp_path, monkeypatch):
    monkeypatch.setattr(npu_trace, 'torch_npu_module', lambda: None)
    with pytest.raises(RuntimeError, match='needs torch_npu'):
        npu_trace.NpuTracer(str(tmp_path))
