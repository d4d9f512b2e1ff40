"""mmengine checkpoints load with torch.load(weights_only=True), and nothing more does."""
import io
import pickle

import numpy as np
import pytest
import torch
from mmengine.logging import HistoryBuffer

from mmseg_cann.engine.checkpoint import allow_mmengine_checkpoints, history_buffer_method


@pytest.fixture(autouse=True)
def _mmengine_allow_list():
    """The allow-list for these tests only (importing mmseg_cann does not install it)."""
    saved = torch.serialization.get_safe_globals()
    allow_mmengine_checkpoints()
    yield
    torch.serialization.clear_safe_globals()
    torch.serialization.add_safe_globals(saved)


def _roundtrip(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf)  # weights_only=True is torch's default


def test_mmengine_checkpoint_content_loads():
    buffer = HistoryBuffer()
    for v in (0.5, 0.25, 0.125):
        buffer.update(v)
    state = {'state_dict': {'w': torch.ones(2)},
             'message_hub': {'log_scalars': {'train/loss': buffer}},
             'meta': {'hist': np.arange(3, dtype=np.float64), 'scalar': np.float32(2.5),
                      'ints': np.array([1, 2], dtype=np.int64)}}
    loaded = _roundtrip(state)
    assert loaded['message_hub']['log_scalars']['train/loss'].min() == 0.125
    assert loaded['message_hub']['log_scalars']['train/loss'].mean() == pytest.approx(0.875 / 3)
    np.testing.assert_array_equal(loaded['meta']['hist'], np.arange(3))
    assert loaded['meta']['scalar'] == np.float32(2.5)


class _Sneaky:
    def __init__(self, owner, name):
        self.owner, self.name = owner, name

    def __reduce__(self):
        return (getattr, (self.owner, self.name))


@pytest.mark.parametrize('owner, name', [(np.ndarray, 'tofile'), (HistoryBuffer, '__init__'),
                                         (HistoryBuffer, '_statistics_methods')])
def test_other_getattr_calls_are_refused(owner, name):
    with pytest.raises(pickle.UnpicklingError):
        _roundtrip({'x': _Sneaky(owner, name)})


def test_history_buffer_method_only_returns_public_methods():
    assert history_buffer_method(HistoryBuffer, 'mean') is HistoryBuffer.mean
    with pytest.raises(pickle.UnpicklingError):
        history_buffer_method(dict, 'update')
