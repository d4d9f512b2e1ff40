"""Guarded torch_npu detection and chip classification; NPU-only tests skip cleanly."""
import pytest
import torch

from mmseg_cann.backends import npu_device
from mmseg_cann.backends.npu_device import DeviceCaps, classify_soc

needs_npu = pytest.mark.skipif(not npu_device.npu_available(),
                               reason='needs torch_npu with an Ascend NPU')


@pytest.mark.parametrize('soc,name,generation', [
    (102, '', 'A1'), (202, '', '310P'), (220, '', 'A2'), (224, '', 'A2'), (242, '', '310B'),
    (250, '', 'A3'), (255, '', 'A3'), (None, 'Ascend910B3', 'A2'),
    (None, 'Ascend910_9391', 'A3'), (None, 'Ascend310P3', '310P'), (None, 'Ascend910A', 'A1'),
    (-1, 'mystery', 'npu-unknown')])
def test_classify_soc(soc, name, generation):
    assert classify_soc(soc, name) == generation


def test_caps_of_cpu_and_made_up_npus():
    cpu = npu_device.device_caps('cpu')
    assert cpu == DeviceCaps('cpu', 'cpu') and not cpu.is_npu and not cpu.a2_a3
    assert DeviceCaps.npu('A2').a2_a3 and DeviceCaps.npu('A3').a2_a3
    assert not DeviceCaps.npu('310P').a2_a3
    with pytest.raises(ValueError, match='generation'):
        DeviceCaps.npu('B9')


def test_package_import_does_not_import_torch_npu():
    from tests._helpers import run_python
    result = run_python(['-c', 'import sys, mmseg_cann, mmseg_cann.backends.npu; '
                               'print("torch_npu" in sys.modules)'])
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith('False')


def test_detection_is_guarded_without_torch_npu():
    if npu_device.torch_npu_module() is not None:
        pytest.skip('torch_npu is installed here')
    assert not npu_device.npu_available()


@pytest.mark.npu
@needs_npu
def test_npu_caps_and_planned_ops_match_cpu():
    from mmseg_cann import ops
    caps = npu_device.device_caps('npu')
    assert caps.is_npu and caps.generation != 'none'
    x = torch.rand(2, 8, 16, 32)
    for call in (lambda t: ops.upsample(t, size=(128, 256), mode='bilinear', backend='npu'),
                 lambda t: ops.max_pool2d(t, 3, 2, 1, return_indices=True, backend='npu'),
                 lambda t: ops.avg_pool2d(t, 3, 2, 1, backend='npu'),
                 lambda t: ops.adaptive_avg_pool2d(t, 1, backend='npu')):
        out, ref = call(x.to('npu')), call(x)
        if isinstance(ref, tuple):
            assert out[1].dtype == torch.int64 and torch.equal(out[1].cpu(), ref[1])
            out, ref = out[0], ref[0]
        torch.testing.assert_close(out.cpu(), ref, rtol=0, atol=2e-6)
