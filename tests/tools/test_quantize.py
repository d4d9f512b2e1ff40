"""tools/quantize.py: end to end on the demo config (export, calibration through the
dataset, int8 graph, evaluation with mmseg's IoUMetric, the AMCT hand-off) and the user
mistakes it answers with exit 2 and one line, leaving no output folder behind."""
from __future__ import annotations

import json

import pytest
import torch

from tests._helpers import run_python

from .conftest import DEMO, run_tool_in_process

pytest.importorskip('onnxruntime')


def _data_options(root):
    """--cfg-options pointing the demo's dataloaders at ``root``."""
    return ['--cfg-options', f'train_dataloader.dataset.dataset.data_root={root}',
            f'val_dataloader.dataset.data_root={root}',
            f'test_dataloader.dataset.data_root={root}']


@pytest.fixture(scope='module')
def drive(tmp_path_factory):
    from mmseg_cann.data import make_dataset
    root = tmp_path_factory.mktemp('drive')
    make_dataset('drive', str(root), num_train=6, num_val=3, seed=0, size=(96, 96))
    return str(root)


@pytest.mark.slow
def test_demo_end_to_end(tmp_path, checkpoint, drive):
    out = tmp_path / 'q'
    result = run_python(['tools/quantize.py', DEMO, checkpoint, '--out-dir', str(out),
                         '--calib-num', '4', '--eval', '--eval-num', '3', '--target', 'atc',
                         '--atc', 'Ascend310P3', '--top', '3'] + _data_options(drive),
                        timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    for name in ('model_fp32.onnx', 'model_int8.onnx', 'quant_report.json',
                 'amct/quantize_amct.py', 'amct/commands.sh', 'amct/calibration/shape.json',
                 'amct/calibration/0003.bin'):
        assert (out / name).is_file(), name
    assert not [p for p in tmp_path.iterdir() if p.name.startswith('.quantize-')]
    report = json.loads((out / 'quant_report.json').read_text())
    # the demo's test pipeline resizes to 96x96: the default --shape
    assert report['shape'] == [96, 96]
    assert report['calibration'] == dict(images=4, method='minmax', split='train',
                                         activation_type='int8')
    assert report['quantized']['Conv'] > 10
    assert report['sizes_bytes']['int8'] < 0.5 * report['sizes_bytes']['fp32']
    ev = report['eval']
    assert ev['images'] == 3
    # the ONNX fp32 graph is the PyTorch model: same labels, same scores
    assert ev['onnx_fp32_label_agreement'] > 99.99
    for key in ('mIoU', 'mDice', 'aAcc'):
        assert abs(ev['onnx_fp32'][key] - ev['fp32'][key]) < 0.01, key
        assert key in ev['int8']
    assert 0 <= ev['label_agreement'] <= 100
    # int8 logits are near the float ones (SQNR well above 10 dB) and the pixels off
    # near ties agree better than all of them
    assert 10 < ev['logits_sqnr_db'] < float('inf')
    assert 0 <= ev['near_tie_pixels'] < 100
    assert ev['label_agreement_clear'] >= ev['label_agreement'] - 1.0
    assert len(ev['lossy_nodes']) == 3
    assert all(r['qdq_sqnr'] <= s['qdq_sqnr'] for r, s in
               zip(ev['lossy_nodes'], ev['lossy_nodes'][1:]))
    amct = report['amct']
    assert amct['would_quantize']['with_skip'] == \
        amct['would_quantize']['without_skip'] - len(amct['skip_layers'])
    assert set(amct['emulation']) == {'with_skip', 'without_skip'}
    text = result.stdout
    assert 'label agreement int8 vs PyTorch fp32' in text and 'AMCT hand-off' in text
    assert 'near ties' in text


@pytest.fixture(scope='module')
def mistakes(tmp_path_factory, drive):
    root = tmp_path_factory.mktemp('quantize_mistakes')
    torch.save({'state_dict': torch.nn.Conv2d(3, 4, 3).state_dict()}, root / 'other.pth')
    no_train = root / 'no_train.py'
    no_train.write_text(f"_base_ = ['{__import__('os').path.abspath(DEMO)}']\n"
                        'train_dataloader = None\n')
    return root


def _cases(f, drive):
    data = _data_options(drive)
    out = ['--out-dir', str(f / 'out')]
    return [
        ([DEMO, '--calib-num', '0'] + out, ['--calib-num', 'positive']),
        ([DEMO, '--calib-num', '-3'] + out, ['--calib-num', 'positive']),
        ([DEMO, '--eval', '--eval-num', '0'] + out, ['--eval-num', 'positive']),
        ([DEMO, str(f / 'other.pth')] + out + data,
         ['not a checkpoint of the model', 'missing']),
        ([str(f / 'no_train.py')] + out, ['no train_dataloader', '--calib-random']),
        ([DEMO] + out + ['--cfg-options', 'train_dataloader.dataset.dataset.data_root='
                         + str(f / 'nowhere')], ['lacks', 'images/training']),
        ([DEMO, '--shape', '90', '96'] + out, ['divisible by 16']),
        ([DEMO, '--exclude', 'no_such_node', '--calib-random'] + out,
         ['--exclude', 'no_such_node']),
        ([DEMO, '--target', 'atc', '--dynamic'] + out, ['fixed shapes', '--dynamic']),
        ([DEMO, '--atc', 'Ascend310P3'] + out, ['--target atc']),
        ([DEMO, '--method', 'mean'] + out, ['invalid choice', "'mean'"]),
    ]


def _assert_refused(mistakes, args, words, status, stderr):
    lines = stderr.strip().splitlines()
    assert status == 2, (args, stderr)
    assert 'Traceback' not in stderr, args
    assert all(w in lines[-1] for w in words), (args, lines[-1])
    assert not (mistakes / 'out').exists(), args
    assert not [p for p in mistakes.iterdir() if p.name.startswith('.quantize-')]


@pytest.mark.slow
def test_user_mistakes_exit_2_with_one_line(mistakes, drive, monkeypatch, capsys):
    """Every mistake through the tool's own entry (in this process: a new interpreter
    per case would cost more than the checks), and the first as a real command line."""
    cases = _cases(mistakes, drive)
    for args, words in cases:
        status, _, err = run_tool_in_process(monkeypatch, capsys, 'quantize', args)
        _assert_refused(mistakes, args, words, status, err)
    args, words = cases[0]
    result = run_python(['tools/quantize.py'] + args, timeout=300)
    _assert_refused(mistakes, args, words, result.returncode, result.stderr)
