"""Backend selection."""
import pytest
import torch

from mmseg_cann import backends, ops

from tests._helpers import assert_same_layout, make_input


def test_auto_is_native_off_npu(monkeypatch):
    monkeypatch.delenv('MMSEG_CANN_TUNE', raising=False)
    assert backends.get_backend('native') is backends.native
    assert backends.get_backend('reference') is backends.reference
    assert backends.get_backend('npu') is backends.npu
    assert backends.get_backend('tuned') is backends.tuned
    assert backends.auto.select(torch.zeros(1, 1, 2, 2)) is backends.native
    monkeypatch.setenv('MMSEG_CANN_TUNE', '1')
    assert backends.auto.select(torch.zeros(1, 1, 2, 2)) is backends.tuned


def test_one_registry_knows_what_each_backend_implements():
    assert backends.backend_names() == ('auto', 'native', 'reference', 'npu', 'tuned',
                                        'fused', 'portable', 'triton', 'fast')
    for name in backends.backend_names():
        assert isinstance(backends.get_backend(name), backends.Backend)
    for op in backends.FUSED_OPS:
        assert backends.backends_implementing(op) == ('auto', 'native', 'reference', 'fused',
                                                      'portable', 'triton', 'fast')
    assert backends.get_backend('fused', 'upsample_add') is backends.fused
    with pytest.raises(ValueError, match="backend must be one of .*got 'npu'"):
        backends.get_backend('npu', 'upsample_argmax')
    with pytest.raises(ValueError, match="got 'compiled'"):
        backends.check_backend('compiled')
    with pytest.raises(TypeError, match='backend must be a string'):
        backends.check_backend(None)


def test_register_backend(monkeypatch):
    class Doubling:
        """A user backend: native results times two (so it is visible)."""
        upsample = staticmethod(lambda x, spec: 2 * backends.native.upsample(x, spec))
        max_pool2d = staticmethod(backends.native.max_pool2d)
        avg_pool2d = staticmethod(backends.native.avg_pool2d)
        adaptive_avg_pool2d = staticmethod(backends.native.adaptive_avg_pool2d)

    monkeypatch.setattr(backends, '_REGISTRY', dict(backends._REGISTRY))
    backends.register_backend('doubling', Doubling)
    backends.register_backend('doubling', Doubling)  # idempotent
    x = make_input((1, 2, 3, 4))
    torch.testing.assert_close(ops.upsample(x, size=(5, 6), mode='bilinear', backend='doubling'),
                               2 * torch.nn.functional.interpolate(x, size=(5, 6), mode='bilinear'),
                               rtol=0, atol=0)
    assert 'doubling' not in backends.backends_implementing('upsample_add')
    with pytest.raises(ValueError, match='already registered'):
        backends.register_backend('doubling', backends.native)
    with pytest.raises(TypeError, match="missing \\['max_pool2d'"):
        backends.register_backend('partial', type('Partial', (), {'upsample': Doubling.upsample}))
    with pytest.raises(ValueError, match='non-empty string'):
        backends.register_backend('', Doubling)


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
        assert_same_layout(native, reference)
        torch.testing.assert_close(native, reference, rtol=0, atol=1e-5)
