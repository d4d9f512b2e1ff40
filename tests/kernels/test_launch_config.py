"""Launch configuration of the Triton kernels: pure functions of device properties,
tested with fake properties (no GPU needed)."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip('triton')

from mmseg_cann.kernels import _common as common  # noqa: E402

H100 = common.DeviceProps('cuda', 132, name='H100')
MI300 = common.DeviceProps('hip', 304, name='MI300X')
ASCEND = common.DeviceProps('npu', 40, max_grid=65535, name='910B')
LIMIT = common.INT32_LIMIT


@pytest.mark.parametrize('props', [H100, MI300], ids=lambda p: p.kind)
def test_gpu_grid_covers_the_work_without_a_loop(props):
    for config in common.candidate_configs('map', props):
        for total in (1, 511, 512, 513, 10 ** 6, 2 ** 33):
            plan = common.plan_launch(total, config, props)
            assert plan.iters == 1 and plan.grid == (plan.nprog,)
            assert plan.nprog == -(-total // config.block)  # one block per program
            assert plan.num_warps == config.num_warps


def test_npu_grid_is_capped_at_the_cores_and_loops():
    config = common.candidate_configs('map', ASCEND)[0]
    plan = common.plan_launch(10 ** 6, config, ASCEND)
    assert plan.nprog == 40 and plan.iters == -(-10 ** 6 // (40 * config.block))
    assert common.plan_launch(100, config, ASCEND).nprog == 1
    # more cores than the 1-D grid limit: the limit wins
    wide = common.DeviceProps('npu', 10 ** 6, max_grid=65535)
    assert common.plan_launch(2 ** 30, config, wide).nprog == 65535


def test_tile_kernels_split_the_block_into_rows():
    config = common.Config(256, 4)
    plan = common.plan_launch(1000, config, H100, inner=32)
    assert plan.block == 8 and plan.nprog == 125


def test_row_launches_tile_each_row():
    """A row launch (the NPU row kernels): tiles of ``block`` columns per row, the block
    at most the row's next power of two (at least 16), the plan's int64 decision over
    the rows its tiles reach."""
    config = common.Config(256, 4)
    plan = common.plan_launch(10 * 1000, config, ASCEND, row=1000)  # 10 rows of 1000
    assert plan.block == 256 and plan.nprog == 40 and plan.iters == 1  # 40 tiles
    plan = common.plan_launch(7 * 12, config, ASCEND, row=12)
    assert plan.block == 16 and plan.nprog == 7 and plan.iters == 1
    plan = common.plan_launch(3 * 40, config, ASCEND, inner=32, row=40)
    assert plan.block == 8 and plan.nprog == 15  # 5 tiles per row
    rows = LIMIT // 1024 // 10 * 10  # 4 tiles per row, 40 programs: no overshoot
    assert not common.plan_launch(rows * 1024, config, ASCEND, row=1024).int64
    assert common.plan_launch((rows + 10) * 1024, config, ASCEND, row=1024).int64
    # the looping grid's last round overshoots by up to nprog - 1 tiles, whole rows
    assert common.plan_launch((rows - 1) * 1024, config, ASCEND, row=1024).int64 == (
        -(-(rows - 1) * 4 // 40) * 40 // 4 * 1024 > LIMIT)
    with pytest.raises(ValueError, match='multiple of row'):
        common.plan_launch(100, config, ASCEND, row=7)


def test_int64_decision_includes_the_grid_overshoot():
    config = common.Config(512, 4)
    # the last block ends exactly at 2^31: every flat index fits in int32
    assert not common.plan_launch(LIMIT - 512 + 1, config, H100).int64
    assert not common.plan_launch(LIMIT, config, H100).int64
    # one more element: the grid forms indices past 2^31
    assert common.plan_launch(LIMIT + 1, config, H100).int64
    # an NPU grid loops: its overshoot is up to nprog * block past the last element
    plan = common.plan_launch(LIMIT - 1000, config, ASCEND)
    assert plan.nprog * plan.iters * plan.block > LIMIT and plan.int64


def test_int64_decision_includes_the_tensors_offsets():
    config = common.Config(512, 4)
    # a small output (pooling) of a large input: the input's offsets decide
    assert not common.plan_launch(1000, config, H100, max_offset=LIMIT // 2 - 1).int64
    assert common.plan_launch(1000, config, H100, max_offset=LIMIT // 2).int64
    assert common.needs_int64(10, 10, index_limit=20)
    assert not common.needs_int64(10, 9, index_limit=20)


def test_max_offset_of_views_and_storage_offsets():
    base = torch.zeros(4, 10)
    assert common.max_offset([base]) == 39
    assert common.max_offset([base[:, 1::2]]) == 39          # last element of row 3
    assert common.max_offset([base[1:3, 2:5]]) == 24         # offset 12, rows of 10
    assert common.max_offset([base.t()]) == 39
    assert common.max_offset([torch.zeros(0, 5), 'not a tensor', 3]) == 0
    cl = torch.zeros(2, 3, 4, 5).contiguous(memory_format=torch.channels_last)
    assert common.max_offset([cl]) == cl.numel() - 1


def test_candidate_configs_per_device():
    for family in common.GPU_CONFIGS:
        gpu = common.candidate_configs(family, H100)
        assert len(set(gpu)) >= 2  # something to tune
        assert common.candidate_configs(family, ASCEND) == (common.FIXED_CONFIG['npu'],)
        assert len(common.candidate_configs(family, common.device_props('cpu'))) == 1
    with pytest.raises(ValueError, match='family'):
        common.candidate_configs('unknown', H100)
    with pytest.raises(ValueError, match='total'):
        common.plan_launch(-1, common.Config(256, 4), H100)


def test_tuner_measures_every_candidate_once_and_caches():
    timed = []
    times = {256: 3.0, 512: 1.0, 1024: 2.0}

    def timer(fn):
        fn()
        return times[timed[-1]]

    tuner = common.Tuner(timer)
    candidates = [common.Config(b, 4) for b in times]
    pick = tuner.pick(('k',), candidates, lambda c: timed.append(c.block))
    assert pick.block == 512 and timed == [256, 512, 1024]
    assert tuner.pick(('k',), candidates, lambda c: timed.append(c.block)).block == 512
    assert len(timed) == 3  # cached: nothing measured again
    # a single candidate is never measured
    assert tuner.pick(('other',), candidates[:1], lambda c: timed.append(0)) == candidates[0]
    assert len(timed) == 3


def test_launch_context_validates_and_restores():
    with pytest.raises(TypeError, match='props'):
        with common.launch_context(props={'kind': 'cuda'}):
            pass
    with pytest.raises(ValueError, match='index_limit'):
        with common.launch_context(index_limit=0):
            pass
    launches = []
    with common.launch_context(H100, record=launches):
        assert common.recording()
        with common.launch_context(ASCEND):  # nested: not recording
            assert not common.recording()
        assert common.recording()
    assert not common.recording()


def test_device_props_of_the_cpu_are_the_interpreter():
    props = common.device_props(torch.device('cpu'))
    assert props.kind == 'cpu' and props.cores >= 2  # several programs: the loop runs
