"""The op profiler's NPU timing decisions, checked on CPU: device syncs with the device,
syncs inside the forward/backward ranges, wall-clock site times and backward figures
labelled as launch times on an NPU."""
import types

import pytest

from mmseg_cann.analysis import op_profile
from mmseg_cann.backends import npu_device


@pytest.mark.parametrize('device_type,sync,bwd', [('npu', True, 'launch'),
                                                  ('cuda', False, 'device'),
                                                  ('cpu', False, 'cpu')])
def test_timing_decisions_per_device(device_type, sync, bwd):
    assert op_profile.syncs_inside_ranges(device_type) is sync
    assert op_profile.backward_site_times(device_type) == bwd


def test_sites_synchronize_the_device_they_ran_on(monkeypatch):
    seen = []
    fake = types.SimpleNamespace(npu=types.SimpleNamespace(synchronize=seen.append))
    monkeypatch.setattr(npu_device, 'torch_npu_module', lambda: fake)
    op_profile._synchronize('npu:1')
    op_profile._synchronize(None)
    assert seen == ['npu:1']


class Event:
    def __init__(self, name, cpu_ms, children=(), sequence_nr=-1):
        self.name, self.cpu_time_total = name, cpu_ms * 1e3
        self.cpu_children, self.sequence_nr = list(children), sequence_nr


def profile_events():
    op = Event('aten::upsample_bilinear2d', 0.4, sequence_nr=5)
    return [Event(op_profile.FORWARD_RANGE, 10.0), Event(op_profile.BACKWARD_RANGE, 6.0),
            Event(op_profile.RANGE_PREFIX + '0', 0.5, [op]),
            Event('autograd::engine::evaluate_function: UpsampleBilinear2DBackward0', 0.2,
                  sequence_nr=5)]


@pytest.mark.parametrize('device_type,fwd_ms', [('npu', 3.0), ('cpu', 0.5)])
def test_site_times_and_labels(device_type, fwd_ms):
    call = op_profile.SiteCall(0, 'resize@decode_head', 'upsample', (1, 19, 8, 16),
                               (1, 19, 64, 128), 'float32', 'scales:8.0x8.0', 1000, wall_ms=3.0)
    report = op_profile._summarize(profile_events(), [[call]], device_type, device_type, 1,
                                   True, npu_device.DeviceCaps.npu('A2'), (64, 128), 1)
    (site,) = report['sites']
    # an NPU site is timed by the wall clock around synchronised calls, a CPU site by
    # the profiler; backward per site comes from the autograd node either way
    assert site['fwd_ms'] == pytest.approx(fwd_ms) and site['bwd_ms'] == pytest.approx(0.2)
    text = op_profile.format_report(report)
    launch = device_type == 'npu'
    assert ('bwd launch ms' in text.splitlines()[0]) is launch
    assert ('kernel launch times' in text) is launch
    assert report['backward_site_times'] == ('launch' if launch else 'cpu')
