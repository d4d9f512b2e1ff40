"""Guarded torch_npu detection, chip classification and device identification; the
torch_npu calls are checked against a fake module; NPU-only tests skip cleanly."""
import os
import subprocess
import sys
import textwrap
import types

import pytest
import torch

from mmseg_cann.backends import npu_device
from mmseg_cann.backends.npu_device import DeviceCaps, classify_soc, parse_torch_npu_version

from tests._helpers import REPO_ROOT

needs_npu = pytest.mark.skipif(not npu_device.npu_available(),
                               reason='needs torch_npu with an Ascend NPU')


@pytest.mark.parametrize('soc,name,generation', [
    (102, '', 'A1'), (202, '', '310P'), (220, '', 'A2'), (224, '', 'A2'), (242, '', '310B'),
    (250, '', 'A3'), (255, '', 'A3'), (260, '', '950'), (None, 'Ascend910B3', 'A2'),
    (None, 'Ascend910_9391', 'A3'), (None, 'Ascend310P3', '310P'), (None, 'Ascend910A', 'A1'),
    (None, 'Ascend950PR', '950'), (-1, 'mystery', 'npu-unknown')])
def test_classify_soc(soc, name, generation):
    assert classify_soc(soc, name) == generation


@pytest.mark.parametrize('text,version', [('2.8.0.post2', (2, 8)), ('2.10.0rc1', (2, 10)),
                                          ('2.1.0', (2, 1)), ((2, 9), (2, 9)), (None, None)])
def test_parse_torch_npu_version(text, version):
    assert parse_torch_npu_version(text) == version


@pytest.mark.parametrize('bad,exc', [('abc', ValueError), ('', ValueError), (2.8, TypeError),
                                     ((2, '9'), TypeError)])
def test_parse_torch_npu_version_rejects_bad_input(bad, exc):
    with pytest.raises(exc, match='torch_npu version'):
        parse_torch_npu_version(bad)


# generation, torch_npu, compatible switch -> (op-plugin 26.x, max_pool2d returns indices)
@pytest.mark.parametrize('generation,version,compatible,expected', [
    ('A2', None, False, (False, False)),    # unknown version: planned as op-plugin 7.x
    ('A2', '2.8.0', True, (False, False)),  # the switch does not exist before 26.x
    ('A2', '2.9.0', False, (True, False)),
    ('A2', '2.9.0', True, (True, True)),
    ('A3', '2.10.0', True, (True, True)),
    ('950', None, False, (False, True)),    # Ascend950 is aclnn-only
])
def test_capabilities_of_torch_npu_releases(generation, version, compatible, expected):
    caps = DeviceCaps.npu(generation, torch_npu=version, compatible_impl=compatible)
    assert (caps.op_plugin_26, caps.max_pool_returns_indices) == expected


def test_caps_of_cpu_and_made_up_npus():
    cpu = npu_device.device_caps('cpu')
    assert cpu == DeviceCaps('cpu', 'cpu') and not cpu.is_npu and not cpu.a2_a3
    assert not cpu.max_pool_returns_indices
    assert DeviceCaps.npu('A2').a2_a3 and DeviceCaps.npu('A3').a2_a3
    assert not DeviceCaps.npu('310P').a2_a3
    assert str(DeviceCaps.npu('A2', torch_npu='2.10', compatible_impl=True)) == \
        'Ascend-A2 (A2, torch_npu 2.10, TORCH_NPU_USE_COMPATIBLE_IMPL=1)'
    with pytest.raises(ValueError, match='generation'):
        DeviceCaps.npu('B9')
    with pytest.raises(TypeError, match='compatible_impl'):
        DeviceCaps.npu('A2', compatible_impl='1')


class FakeNpu:
    """torch_npu.npu as far as device identification uses it; records the call order."""

    def __init__(self, soc=223, name='Ascend910B3'):
        self.soc, self.name, self.calls = soc, name, []

    def get_soc_version(self):
        self.calls.append('get_soc_version')
        if isinstance(self.soc, Exception):
            raise self.soc
        return self.soc

    def get_device_name(self, index=None):
        self.calls.append('get_device_name')
        if isinstance(self.name, Exception):
            raise self.name
        return self.name

    def synchronize(self, device=None):
        self.calls.append(('synchronize', device))


def fake_torch_npu(npu, version='2.8.0.post1'):
    return types.SimpleNamespace(npu=npu, __version__=version)


def test_identification_asks_the_soc_version_first(monkeypatch):
    monkeypatch.delenv(npu_device.ENV_COMPATIBLE_IMPL, raising=False)
    npu = FakeNpu()
    caps = npu_device._identify_npu(fake_torch_npu(npu), 0)
    assert npu.calls == ['get_soc_version', 'get_device_name']
    assert caps == DeviceCaps('npu', 'Ascend910B3', 'A2', 223, (2, 8), False)


@pytest.mark.parametrize('name', ['', RuntimeError('no device')])
def test_an_empty_or_failing_device_name_gives_npu(monkeypatch, name):
    # torch_npu >= 2.6: get_device_name ignores its index and may return ''
    monkeypatch.setenv(npu_device.ENV_COMPATIBLE_IMPL, '1')
    caps = npu_device._identify_npu(fake_torch_npu(FakeNpu(251, name), '2.10.0'), 1)
    assert caps.name == 'npu' and caps.generation == 'A3'
    assert caps.torch_npu_version == (2, 10) and caps.compatible_impl


def test_a_failing_soc_version_falls_back_to_the_name(monkeypatch):
    caps = npu_device._identify_npu(fake_torch_npu(FakeNpu(RuntimeError('x'), 'Ascend310P3'),
                                                   'not-a-version'), 0)
    assert (caps.generation, caps.soc_version, caps.torch_npu_version) == ('310P', None, None)


def test_npu_strings_need_no_torch_device_without_torch_npu(monkeypatch):
    # stock torch cannot parse 'npu:1'; without torch_npu no torch.device is built
    monkeypatch.setattr(npu_device, 'torch_npu_module', lambda: None)
    assert npu_device.device_caps('npu:1') == DeviceCaps('npu', 'npu', 'npu-unknown')
    with pytest.raises(RuntimeError, match='torch_npu'):
        npu_device.synchronize('npu:1')


def test_synchronize_passes_the_device_on(monkeypatch):
    npu = FakeNpu()
    monkeypatch.setattr(npu_device, 'torch_npu_module', lambda: fake_torch_npu(npu))
    npu_device.synchronize('npu:3')
    npu_device.synchronize(torch.device('cpu'))  # nothing to wait for
    assert npu.calls == [('synchronize', 'npu:3')]
    with pytest.raises(TypeError, match='device'):
        npu_device.synchronize(3)


STUB = '''
import os, traceback
frames = [f for f in traceback.extract_stack()[:-1] if 'importlib' not in f.filename]
with open(os.environ['TORCH_NPU_STUB_LOG'], 'a') as log:
    log.write(frames[-1].filename + '\\n')
raise ImportError('stub torch_npu: not an Ascend machine')
'''


def test_mmseg_cann_modules_do_not_import_torch_npu(tmp_path):
    # A stub torch_npu logs the file of every import statement that reaches it. mmengine's
    # device/utils.py imports torch_npu (and would set jit_compile=False) when
    # mmseg_cann loads mmengine.device; mmseg_cann's own modules must not, until
    # torch_npu_module() is called.
    (tmp_path / 'torch_npu').mkdir()
    (tmp_path / 'torch_npu' / '__init__.py').write_text(STUB)
    log = tmp_path / 'importers.log'
    script = textwrap.dedent('''
        import mmseg_cann, mmseg_cann.backends.npu, mmseg_cann.backends.tuned
        import mmseg_cann.analysis.npu_calls, mmseg_cann.analysis.npu_trace
        import mmseg_cann.analysis.parity, mmseg_cann.analysis.op_profile
        print('IMPORTED')
        from mmseg_cann.backends.npu_device import torch_npu_module
        assert torch_npu_module() is None
    ''')
    env = dict(os.environ, TORCH_NPU_STUB_LOG=str(log),
               PYTHONPATH=os.pathsep.join([str(tmp_path), REPO_ROOT]))
    result = subprocess.run([sys.executable, '-c', script], cwd=REPO_ROOT, env=env,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    importers = log.read_text().split()
    package = os.path.join(REPO_ROOT, 'mmseg_cann') + os.sep
    before, after = importers[:-1], importers[-1:]
    assert any(p.replace(os.sep, '/').endswith('mmengine/device/utils.py') for p in before)
    assert not [p for p in before if p.startswith(package)], before
    assert after[0].endswith(os.path.join('backends', 'npu_device.py'))  # the lazy import


def test_detection_is_guarded_without_torch_npu():
    if npu_device.torch_npu_module() is not None:
        pytest.skip('torch_npu is installed here')
    assert not npu_device.npu_available()


@pytest.mark.npu
@needs_npu
def test_npu_caps_and_planned_ops_match_cpu():
    from mmseg_cann import ops
    caps = npu_device.device_caps('npu')
    assert caps.is_npu and caps.generation != 'none' and caps.name
    x = torch.rand(2, 8, 16, 32)
    for call in (lambda t: ops.upsample(t, size=(128, 256), mode='bilinear', backend='npu'),
                 lambda t: ops.max_pool2d(t, 3, 2, 1, return_indices=True, backend='npu'),
                 lambda t: ops.max_pool2d(t, 2, 2, 'same', return_indices=True, backend='npu'),
                 lambda t: ops.avg_pool2d(t, 3, 2, 1, backend='npu'),
                 lambda t: ops.adaptive_avg_pool2d(t, 1, backend='npu')):
        out, ref = call(x.to('npu')), call(x)
        if isinstance(ref, tuple):
            assert out[1].dtype == torch.int64 and torch.equal(out[1].cpu(), ref[1])
            out, ref = out[0], ref[0]
        torch.testing.assert_close(out.cpu(), ref, rtol=0, atol=2e-6)
