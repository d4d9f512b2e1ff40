"""Backend selection."""
import pytest
import torch

from mmseg_cann import backends, ops

from ..conftest import make_input


def test_auto_is_native_off_npu(monkeypatch):
    monkeypatch.delenv('MMSEG_CANN_TUNE', raising=False)
    assert backends.get_backend('native') is backends.native
    assert backends.get_backend('reference') is backends.reference
    assert backends.get_backend('npu') is backends.npu
    assert backends.get_backend('tuned') is backends.tuned
    assert backends.auto.select(torch.zeros(1, 1, 2, 2)) is backends.native
    monkeypatch.setenv('MMSEG_CANN_TUNE', '1')
    assert backends.auto.select(torch.zeros(1, 1, 2, 2)) is backends.tuned


@pytest.mark.parametrize('name', backends.RESERVED_BACKENDS)
def test_reserved_names_raise_clear_error(name):
    with pytest.raises(ValueError, match='reserved'):
        backends.check_backend(name)


def test_backends_agree():
    x = make_input((2, 3, 6, 7), torch.float32, 'channels_last')
    calls = [
        lambda b: ops.upsample(x, scale_factor=2.5, mode='bicubic', backend=b),
        lambda b: ops.max_pool2d(x, 3, 2, 'same', return_indices=True, backend=b),
        lambda b: ops.avg_pool2d(x, 3, 2, 1, count_include_pad=False, backend=b),
        lambda b: ops.adaptive_avg_pool2d(x, (3, 2), backend=b),
    ]
    for call in calls:
        native, reference = call('native'), call('reference')
        if isinstance(native, tuple):
            assert torch.equal(native[1], reference[1])
            native, reference = native[0], reference[0]
        assert native.dtype == reference.dtype == torch.float32
        assert native.is_contiguous(memory_format=torch.channels_last) == \
            reference.is_contiguous(memory_format=torch.channels_last)
        torch.testing.assert_close(native, reference, rtol=0, atol=1e-5)
