"""Tuning: cache creation, reuse, invalidation on version change, corrupt-cache handling,
and that the tuned backend never changes results."""
import json

import pytest
import torch

from mmseg_cann import ops
from mmseg_cann.backends import tuned
from mmseg_cann.backends import tuning_cache

from tests._helpers import make_input


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path))
    monkeypatch.delenv(tuning_cache.ENV_CACHE_FILE, raising=False)
    tuned.reset_tuning_state()
    yield tmp_path / 'mmseg_cann' / 'tuning.json'
    tuned.reset_tuning_state()


def _entries(path):
    data = json.loads(path.read_text())
    (section, entries), = data['sections'].items()
    return section, entries


def test_cache_is_created_under_xdg_cache_home(cache_dir):
    x = make_input((1, 3, 16, 32))
    out = ops.upsample(x, size=(128, 256), mode='bilinear', backend='tuned')
    assert torch.equal(out, ops.upsample(x, size=(128, 256), mode='bilinear', backend='native'))
    section, entries = _entries(cache_dir)
    assert section.startswith('cpu|') and f'torch={torch.__version__}' in section
    (key, entry), = entries.items()
    assert key.startswith('upsample|1x3x16x32|float32|contiguous')
    # timed: the user's size call and the equivalent scale call, each in both layouts
    assert set(entry['times_ms']) | set(entry['rejected']) == {
        'native', 'scales:8.0x8.0', 'native:to_channels_last',
        'scales:8.0x8.0:to_channels_last'}
    assert entry['plan'] in entry['times_ms']


def test_cache_is_reused_without_timing(cache_dir, monkeypatch):
    x = make_input((1, 3, 9, 9))
    ops.avg_pool2d(x, 3, 2, 1, backend='tuned')
    before = cache_dir.read_text()
    tuned.reset_tuning_state()  # a new process: only the file is left

    def no_timing(*args, **kwargs):
        raise AssertionError('a cached key must not be timed again')

    monkeypatch.setattr(tuned, '_time', no_timing)
    out = ops.avg_pool2d(x, 3, 2, 1, backend='tuned')
    assert torch.equal(out, ops.avg_pool2d(x, 3, 2, 1, backend='native'))
    assert cache_dir.read_text() == before


def test_cached_choice_is_the_one_run(cache_dir, monkeypatch):
    x = make_input((1, 3, 9, 9), memory_format='channels_last')
    ops.max_pool2d(x, 3, 2, 1, backend='tuned')
    section, entries = _entries(cache_dir)
    (key, entry), = entries.items()
    entry['plan'] = 'native:to_nchw'
    cache_dir.write_text(json.dumps({'format': 1, 'sections': {section: {key: entry}}}))
    tuned.reset_tuning_state()
    seen = []
    original = tuned.npu.execute_max_pool2d
    monkeypatch.setattr(tuned.npu, 'execute_max_pool2d',
                        lambda plan, *a: seen.append(plan.name) or original(plan, *a))
    out = ops.max_pool2d(x, 3, 2, 1, backend='tuned')
    assert seen == ['native:to_nchw']
    assert torch.equal(out, ops.max_pool2d(x, 3, 2, 1, backend='native'))
    assert out.is_contiguous(memory_format=torch.channels_last)


def test_version_change_invalidates(cache_dir, monkeypatch):
    x = make_input((1, 3, 8, 8))
    ops.adaptive_avg_pool2d(x, 1, backend='tuned')
    old_section, _ = _entries(cache_dir)
    tuned.reset_tuning_state()
    real = tuning_cache.library_versions
    monkeypatch.setattr(tuning_cache, 'library_versions',
                        lambda: dict(real(), torch='99.0'))
    timed = []
    original = tuned._time
    monkeypatch.setattr(tuned, '_time', lambda run, dev: timed.append(1) or original(run, dev))
    ops.adaptive_avg_pool2d(x, 1, backend='tuned')
    assert timed  # not reused: measured again
    new_section, _ = _entries(cache_dir)  # the stale section of this device is gone
    assert new_section != old_section and 'torch=99.0' in new_section
    assert tuned.get_cache().invalidated == 1


@pytest.mark.parametrize('content', ['{not json', '[]', '{"format": 1, "sections": []}',
                                     '{"format": 0, "sections": {}}'])
def test_corrupt_cache_warns_and_is_rebuilt(cache_dir, content):
    cache_dir.parent.mkdir(parents=True)
    cache_dir.write_text(content)
    x = make_input((1, 2, 6, 6))
    with pytest.warns(UserWarning, match='corrupt'):
        out = ops.upsample(x, scale_factor=1.5, mode='bicubic', backend='tuned')
    assert torch.equal(out, ops.upsample(x, scale_factor=1.5, mode='bicubic', backend='native'))
    section, entries = _entries(cache_dir)
    assert len(entries) == 1 and tuned.get_cache().rebuilt


def test_candidates_that_change_results_are_rejected(cache_dir):
    # a full mean in the other layout sums in another order: not bit-identical on CPU
    x = make_input((2, 16, 33, 47))
    out = ops.adaptive_avg_pool2d(x, 1, backend='tuned')
    assert torch.equal(out, ops.adaptive_avg_pool2d(x, 1, backend='native'))
    _, entries = _entries(cache_dir)
    (entry,) = entries.values()
    assert 'mean:to_channels_last' in entry['rejected']
    assert entry['plan'] in ('native', 'mean')


def test_environment_variable_makes_auto_tune(cache_dir, monkeypatch):
    monkeypatch.setenv('MMSEG_CANN_TUNE', '1')
    x = make_input((1, 2, 10, 10))
    out = ops.upsample(x, size=(20, 30), mode='bilinear')
    assert torch.equal(out, ops.upsample(x, size=(20, 30), mode='bilinear', backend='native'))
    assert cache_dir.exists()


def test_explicit_cache_file_variable(tmp_path, monkeypatch):
    target = tmp_path / 'elsewhere' / 'tune.json'
    monkeypatch.setenv(tuning_cache.ENV_CACHE_FILE, str(target))
    tuned.reset_tuning_state()
    try:
        ops.max_pool2d(make_input((1, 2, 7, 7)), 2, backend='tuned')
    finally:
        tuned.reset_tuning_state()
    assert target.exists()


def test_timing_runs_do_not_count_as_fallbacks(cache_dir, monkeypatch):
    from mmseg_cann.backends import npu
    from mmseg_cann.backends.npu_device import DeviceCaps
    from mmseg_cann.utils import fallback_counts, reset_fallbacks
    plan_for = npu.plan_for
    # plan as on an A2 chip: a 2x bilinear resize is a documented fallback there
    monkeypatch.setattr(npu, 'plan_for', lambda op, x, spec=None, **kw: plan_for(
        op, x, spec, caps=DeviceCaps.npu('A2'), **kw))
    reset_fallbacks()
    x = make_input((1, 2, 8, 8))
    ops.upsample(x, size=(16, 16), mode='bilinear', backend='tuned')
    # the planner's (fallback) plan, the user's size call, is timed 4 times; only a real
    # call may count, and only when the tuner picked that plan
    (entry,) = _entries(cache_dir)[1].values()
    expected = 1 if entry['plan'] == 'native' else 0
    assert sum(fallback_counts().values()) == expected


def test_candidates_that_raise_are_rejected(cache_dir, monkeypatch):
    original = tuned.npu.execute_upsample

    def refuse_scale_calls(plan, x, spec):
        if plan.call == 'scales':
            raise RuntimeError('the device kernel rejects this call form')
        return original(plan, x, spec)

    monkeypatch.setattr(tuned.npu, 'execute_upsample', refuse_scale_calls)
    x = make_input((1, 3, 16, 32))
    out = ops.upsample(x, size=(128, 256), mode='bilinear', backend='tuned')
    assert torch.equal(out, ops.upsample(x, size=(128, 256), mode='bilinear', backend='native'))
    (entry,) = _entries(cache_dir)[1].values()
    assert {'scales:8.0x8.0', 'scales:8.0x8.0:to_channels_last'} <= set(entry['rejected'])
    assert 'raised RuntimeError' in entry['rejected_why']['scales:8.0x8.0']
    assert entry['plan'] in entry['times_ms'] and not entry['plan'].startswith('scales')


def test_a_candidate_set_that_all_raises_reraises(cache_dir):
    from mmseg_cann.backends.npu_plan import Plan
    x = make_input((1, 1, 4, 4))

    def run(plan):
        raise ValueError(f'no kernel for {plan.name}')

    with pytest.raises(ValueError, match='no kernel for native'):
        tuned.choose('upsample', 'key', x, [Plan('upsample'), Plan('upsample', 'size')], run)


def test_tuning_a_device_that_returns_a_mask(cache_dir, monkeypatch):
    # with return_indices and SAME padding the tuner ran call forms
    # whose device result is torch_npu's int8 mask, and unpadding it raised
    import math
    import torch.nn.functional as F
    from mmseg_cann.backends import npu
    from mmseg_cann.backends.npu_device import DeviceCaps
    real = F.max_pool2d
    calls = []

    def device_then_cpu(input, kernel_size, stride=None, padding=0, dilation=1,
                        ceil_mode=False, return_indices=False):
        # every device call answers with a mask; the executor's CPU recomputation that
        # follows each one gets PyTorch's answer
        result = real(input, kernel_size, stride, padding, dilation, ceil_mode, return_indices)
        calls.append(return_indices)
        if not return_indices or len(calls) % 2 == 0:
            return result
        values, _ = result
        n, c, oh, ow = values.shape
        return values, torch.zeros((n, c, 4, (math.ceil(oh * ow / 16) + 1) * 32),
                                   dtype=torch.int8)

    from mmseg_cann.utils import fallback_counts, reset_fallbacks
    plan_for = npu.plan_for
    monkeypatch.setattr(npu, 'plan_for', lambda op, x, spec=None, **kw: plan_for(
        op, x, spec, caps=DeviceCaps.npu('A2'), **kw))
    monkeypatch.setattr(F, 'max_pool2d', device_then_cpu)
    reset_fallbacks()
    x = make_input((1, 2, 9, 9))
    values, index = ops.max_pool2d(x, 2, 2, 'same', return_indices=True, backend='tuned')
    monkeypatch.setattr(F, 'max_pool2d', real)
    ref = ops.max_pool2d(x, 2, 2, 'same', return_indices=True, backend='native')
    assert torch.equal(values, ref[0]) and torch.equal(index, ref[1])
    (entry,) = _entries(cache_dir)[1].values()
    assert entry['plan'] in entry['times_ms'] and 'rejected_why' in entry
    assert len(calls) > 10  # every candidate ran, each device call answered with a mask
    assert [n for (_, reason), n in fallback_counts().items() if 'a mask' in reason] == [1]


def test_timing_synchronizes_the_device_it_timed(monkeypatch):
    import types
    from mmseg_cann.backends import npu_device
    seen = []
    fake = types.SimpleNamespace(npu=types.SimpleNamespace(synchronize=seen.append))
    monkeypatch.setattr(npu_device, 'torch_npu_module', lambda: fake)
    tuned._sync('npu:2')
    assert seen == ['npu:2']
