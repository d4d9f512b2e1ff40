"""tools/export_onnx.py on the shipped Cityscapes PSPNet and DRIVE UNet configs (export,
onnx.checker, onnxruntime verification against PyTorch, node summary) and its exit codes."""
from __future__ import annotations

import re

import pytest

from tests._helpers import run_python

from .conftest import import_tool

pytest.importorskip('onnxruntime')

SHIPPED_PSPNET = 'configs/cityscapes/pspnet_r50-d8_cann_4xb2-40k_cityscapes-512x1024.py'
SHIPPED_UNET = 'configs/medical/unet-s5-d16_fcn_cann_4xb4-40k_drive-64x64.py'


def _no_download(text):
    # no CHECKPOINT: the ImageNet init_cfg of the shipped configs is dropped
    assert 'load checkpoint' not in text.lower() and 'http' not in text


@pytest.mark.slow
def test_shipped_cityscapes_pspnet_export_verified(tmp_path):
    out = tmp_path / 'psp.onnx'
    # the shipped config through --cfg-options with a ResNet-18 trunk (the R50 export
    # takes ~55 s here, over the suite's time budget; docs/benchmarks.md records the R50 run)
    result = run_python(['tools/export_onnx.py', SHIPPED_PSPNET, '--shape', '64', '128',
                         '--out', str(out), '--verify', '--cfg-options',
                         'model.backbone.depth=18', 'model.decode_head.in_channels=512',
                         'model.auxiliary_head.in_channels=256'], timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert out.exists()
    text = result.stdout
    _no_download(result.stdout + result.stderr)
    assert 'onnx.checker: ok' in text and 'verification passed' in text
    assert text.count('argmax agreement 100.0000%') == 2
    # the PPM bins: global pool (1), AveragePool for the even bins, MaxPool stem
    assert 'GlobalAveragePool' in text and 'MaxPool' in text and 'AveragePool' in text
    # the R50-D8 feature map is 8x16; PPM upsampling and the logits resize carry sizes
    assert text.count('sizes=[1,512,8,16]') == 4
    assert 'sizes=[1,19,64,128]' in text and 'scales=' not in text


@pytest.mark.slow
def test_shipped_drive_unet_export_verified(tmp_path):
    out = tmp_path / 'unet.onnx'
    result = run_python(['tools/export_onnx.py', SHIPPED_UNET, '--shape', '64', '64',
                         '--out', str(out), '--verify'], timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    _no_download(result.stdout + result.stderr)
    text = result.stdout
    assert 'verification passed' in text and text.count('argmax agreement 100.0000%') == 2
    # nn.Upsample(scale_factor=2) in the four decoder stages: sizes baked in
    for size in ('[1,1024,8,8]', '[1,512,16,16]', '[1,256,32,32]', '[1,128,64,64]'):
        assert f'sizes={size}' in text
    assert 'sizes=[1,2,64,64]' in text and 'scales=' not in text


def _dynamic_verified(text, traced, others):
    assert 'dynamic shape' in text and 'onnx.checker: ok' in text
    assert 'verification passed' in text
    for shape in [traced] + others:
        assert text.count(f'input {shape}: max abs error') == 2, shape
    agreements = [float(a) for a in re.findall(r'argmax agreement ([0-9.]+)%', text)]
    assert len(agreements) == 2 * (1 + len(others))
    # the values are bounded by the tool's --atol; a pixel whose two best classes are
    # within that rounding may take either class (seen once in a full-suite run: one
    # pixel of one of the six checks), so the labels are checked to all but such pixels
    assert min(agreements) >= 99.99, agreements
    # every Resize gets its sizes from the runtime shape (or scales): none baked in
    assert 'sizes=[' not in text


@pytest.mark.slow
def test_shipped_cityscapes_pspnet_dynamic_export_verified(tmp_path):
    out = tmp_path / 'psp_dynamic.onnx'
    result = run_python(['tools/export_onnx.py', SHIPPED_PSPNET, '--shape', '64', '128',
                         '--out', str(out), '--dynamic', '--verify', '--cfg-options',
                         'model.backbone.depth=18', 'model.decode_head.in_channels=512',
                         'model.auxiliary_head.in_channels=256'], timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    _no_download(result.stdout + result.stderr)
    # default sizes: 96x96 (batch 2; 12x12 feature map) and 80x176 (10x22: the pyramid
    # bins 3 and 6 do not divide it)
    _dynamic_verified(result.stdout, (1, 3, 64, 128), [(2, 3, 96, 96), (1, 3, 80, 176)])
    assert 'GlobalAveragePool' in result.stdout and 'MaxPool' in result.stdout


@pytest.mark.slow
def test_shipped_drive_unet_dynamic_export_verified(tmp_path):
    out = tmp_path / 'unet_dynamic.onnx'
    result = run_python(['tools/export_onnx.py', SHIPPED_UNET, '--shape', '64', '64',
                         '--out', str(out), '--dynamic', '--verify', '--verify-shape',
                         '48', '80', '--verify-shape', '112', '32'], timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    _dynamic_verified(result.stdout, (1, 3, 64, 64), [(1, 3, 48, 80), (1, 3, 112, 32)])
    assert result.stdout.count('MaxPool ') == 4


@pytest.fixture
def tool(monkeypatch):
    """tools/export_onnx.py imported in-process."""
    return import_tool(monkeypatch, 'export_onnx')


def _tiny_model(*args, **kwargs):
    import torch

    from mmseg_cann import CANNUpsample
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1),
                               CANNUpsample(scale_factor=2, mode='bilinear'),
                               torch.nn.AvgPool2d(2)).eval()


def test_tool_exit_codes(tool, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(tool, 'build_model', _tiny_model)
    args = [SHIPPED_PSPNET, '--shape', '12', '20', '--out', str(tmp_path / 'tiny.onnx'),
            '--verify']
    assert tool.main(args) == 0
    assert 'verification passed' in capsys.readouterr().out
    # an impossible agreement threshold must fail the run (exit 1)
    assert tool.main(args + ['--min-agree', '1.01']) == 1
    assert 'verification FAILED' in capsys.readouterr().out


def test_tool_simplify_keeps_exact_graph(tool, tmp_path, monkeypatch, capsys):
    pytest.importorskip('onnxslim')
    monkeypatch.setattr(tool, 'build_model', _tiny_model)
    args = [SHIPPED_PSPNET, '--shape', '12', '20', '--out', str(tmp_path / 'tiny.onnx'),
            '--verify', '--simplify']
    assert tool.main(args) == 0
    text = capsys.readouterr().out
    assert 'simplified with onnxslim' in text and 'verification passed' in text
    assert tool.main(args[:-1]) == 0  # the same export, not simplified
    plain = capsys.readouterr().out

    def nodes(out):
        return [line for line in out.splitlines() if line.startswith('  ')]
    # the slimmed graph keeps every Resize/pool node and its attributes
    assert nodes(text) == nodes(plain) and len(nodes(text)) == 2
    assert 'Resize' in nodes(text)[0] and 'kernel_shape=[2, 2]' in nodes(text)[1]


def test_tool_dynamic_export_verified_at_other_sizes(tool, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(tool, 'build_model', _tiny_model)
    args = [SHIPPED_PSPNET, '--shape', '12', '20', '--out', str(tmp_path / 'tiny.onnx'),
            '--dynamic', '--verify', '--verify-shape', '7', '9', '--verify-shape', '16', '5']
    assert tool.main(args) == 0
    text = capsys.readouterr().out
    assert 'dynamic shape' in text and 'verification passed' in text
    assert 'dynamic domain: ' in text
    # symbolic batch, height and width; three sizes verified, two inputs each
    dims = [line for line in text.splitlines() if line.startswith('dynamic input dims')]
    assert len(dims) == 1 and dims[0].count("'s") == 3, dims
    for shape in ('(1, 3, 12, 20)', '(1, 3, 7, 9)', '(1, 3, 16, 5)'):
        assert text.count(f'input {shape}: max abs error') == 2, shape
    # default verification sizes: another batch and both sizes changed
    assert tool.dynamic_verification_shapes(64, 128) == [(2, 3, 96, 96), (1, 3, 80, 176)]


def _branching_model(*args, **kwargs):
    import torch
    import torch.nn.functional as F

    class ResizeBackWhenOdd(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 3, 3, 2, 1)

        def forward(self, x):
            y = F.interpolate(self.conv(x), scale_factor=2, mode='bilinear')
            if y.shape != x.shape:  # taken at odd sizes only
                y = F.interpolate(y, size=x.shape[2:], mode='bilinear')
            return x + y
    torch.manual_seed(0)
    return ResizeBackWhenOdd().eval()


def test_tool_dynamic_domain_printed_and_checked(tool, tmp_path, monkeypatch, capsys):
    """The conditions of the graph's domain are printed; --verify-shape inside it is
    verified, outside it is refused by the domain check (not run into onnxruntime)."""
    monkeypatch.setattr(tool, 'build_model', _branching_model)
    args = [SHIPPED_PSPNET, '--shape', '12', '20', '--out', str(tmp_path / 'odd.onnx'),
            '--dynamic', '--verify', '--verify-shape', '8', '14']
    assert tool.main(args) == 0
    text = capsys.readouterr().out
    assert 'dynamic domain: the graph holds where all of these hold' in text
    assert '  (2 + 2*(((-1) + input.shape[2]) // 2)) == input.shape[2]' in text
    assert text.count('input (1, 3, 8, 14): max abs error') == 2
    assert tool.main(args[:-2] + ['9', '14']) == 1
    text = capsys.readouterr().out
    assert text.count('input (1, 3, 9, 14): FAILED (ValueError: outside the sizes this '
                      "dynamic graph holds for: input 'input' of shape (1, 3, 9, 14)") == 2
    assert 'verification FAILED' in text


def _nearest_resize_model(*args, **kwargs):
    import torch

    from mmseg_cann.ops import upsample

    class ResizeToHalfInput(torch.nn.Module):
        def forward(self, x):
            return upsample(x, size=(x.shape[2] // 2, x.shape[3] // 2), mode='nearest')
    return ResizeToHalfInput().eval()


def test_tool_dynamic_refusal_exits_2(tool, tmp_path, monkeypatch, capsys):
    # legacy nearest mapped with in/out: PyTorch's float32 index is size-dependent
    monkeypatch.setattr(tool, 'build_model', _nearest_resize_model)
    args = [SHIPPED_PSPNET, '--shape', '12', '20', '--out', str(tmp_path / 'tiny.onnx'),
            '--dynamic']
    assert tool.main(args) == 2
    err = capsys.readouterr().err
    assert 'export failed' in err and 'float32 ratio in/out' in err
    assert tool.main(args[:-1]) == 0  # the fixed-shape export of the same model works


def test_no_pretrained_without_checkpoint(tool):
    from mmengine.config import Config
    cfg = Config(dict(model=dict(pretrained='open-mmlab://resnet50_v1c', backbone=dict(
        type='ResNetV1c', init_cfg=dict(type='Pretrained', checkpoint='x.pth'),
        norm_cfg=dict(type='SyncBN')))))
    tool._no_pretrained(cfg.model)
    assert cfg.model.pretrained is None and 'init_cfg' not in cfg.model.backbone


def test_dynamic_export_refuses_specialised_graph():
    import torch

    from mmseg_cann.ops import upsample
    from mmseg_cann.onnx import export_onnx

    class ForcesWidth(torch.nn.Module):
        """int() of a size outside the CANN ops pins the traced width."""

        def forward(self, x):
            return upsample(x, size=(x.shape[2], int(x.shape[3]) + 1), mode='bilinear')
    with pytest.raises(ValueError, match='came out with fixed width'):
        export_onnx(ForcesWidth(), torch.randn(1, 2, 8, 8), dynamic=True)


PSP_R18 = ['--cfg-options', 'model.backbone.depth=18', 'model.decode_head.in_channels=512',
           'model.auxiliary_head.in_channels=256']


@pytest.mark.slow
def test_shipped_pspnet_atc_target_with_keep_dtype_and_command(tmp_path):
    """--target atc --atc SOC: verified as ATC reads the graph, the averaging nodes of the
    pyramid pooling listed for --keep_dtype, the atc command printed."""
    out = tmp_path / 'psp_atc.onnx'
    result = run_python(['tools/export_onnx.py', SHIPPED_PSPNET, '--shape', '64', '128',
                         '--out', str(out), '--target', 'atc', '--atc', 'Ascend910B',
                         '--verify'] + PSP_R18, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    text = result.stdout
    assert 'target atc' in text and text.count('(as ATC reads it)') == 2
    assert text.count('argmax agreement 100.0000%') == 2 and 'verification passed' in text
    keep = tmp_path / 'psp_atc.keep_dtype.txt'
    names = keep.read_text().split()
    import onnx
    proto = onnx.load(str(out))
    types = {n.name: n.op_type for n in proto.graph.node}
    assert names and all(types[n] in ('AveragePool', 'GlobalAveragePool', 'ReduceMean',
                                      'MatMul', 'Mul') for n in names)
    assert sum(types[n] == 'GlobalAveragePool' for n in names) == 1  # the 1x1 bin
    assert (f'atc --framework=5 --model={out} --output={tmp_path / "psp_atc"} '
            f'--soc_version=Ascend910B --input_shape=input:1,3,64,128 '
            f'--keep_dtype={keep}') in text


@pytest.mark.slow
def test_atc_gears(tmp_path):
    """--target atc --gears: one fixed-shape graph per size; --dynamic --atc --gears: the
    --dynamic_image_size command, the dynamic graph verified as ATC reads it per gear."""
    out = tmp_path / 'unet.onnx'
    result = run_python(['tools/export_onnx.py', SHIPPED_UNET, '--shape', '64', '64',
                         '--out', str(out), '--target', 'atc', '--gears', '64,64', '32,48',
                         '--verify'], timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / 'unet_64x64.onnx').exists() and (tmp_path / 'unet_32x48.onnx').exists()
    assert result.stdout.count('(as ATC reads it)') == 4
    result = run_python(['tools/export_onnx.py', SHIPPED_UNET, '--shape', '64', '64',
                         '--out', str(out), '--dynamic', '--atc', 'Ascend310P3', '--gears',
                         '64,64', '32,48', '--verify'], timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert '--input_shape=input:1,3,-1,-1 --dynamic_image_size=64,64;32,48' in result.stdout
    assert result.stdout.count('(as ATC reads it)') == 6  # traced size + two gears


def test_gears_without_a_target_for_them_exit_2(tmp_path):
    result = run_python(['tools/export_onnx.py', SHIPPED_UNET, '--shape', '64', '64',
                         '--out', str(tmp_path / 'u.onnx'), '--gears', '64,64'], timeout=300)
    assert result.returncode == 2 and '--gears needs --dynamic' in result.stderr


#: prints a digest of every tensor the tool builds without a checkpoint
_BUILD_DIGEST = '''
import hashlib, sys
sys.path.insert(0, 'tools')
from mmengine.config import DictAction
from export_onnx import build_model
options = dict(o.split('=', 1) for o in sys.argv[2:])
options = {k: DictAction._parse_iterable(v) for k, v in options.items()}
for name, t in build_model(sys.argv[1], None, options).state_dict().items():
    print('digest', name, hashlib.sha256(t.detach().contiguous().numpy().tobytes()).hexdigest())
'''


@pytest.mark.slow
def test_weights_without_checkpoint_equal_in_every_process():
    """Without CHECKPOINT the tool seeds before the model is built: two processes build
    the same weights (the layers mmseg's init_weights leaves to their constructors too)."""
    args = ['-c', _BUILD_DIGEST, SHIPPED_PSPNET] + PSP_R18[1:]
    runs = [run_python(args, timeout=300) for _ in range(2)]
    for r in runs:
        assert r.returncode == 0, r.stdout + r.stderr
    first, second = (dict(line.split()[1:] for line in r.stdout.splitlines()
                          if line.startswith('digest ')) for r in runs)
    assert len(first) > 100 and first.keys() == second.keys()
    assert [k for k in first if first[k] != second[k]] == []
