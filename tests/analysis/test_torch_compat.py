"""The drop-in check against PyTorch's tests (tools/torch_compat.py): which calls are
routed to mmseg_cann, which stay torch's, and the plain/patched outcome comparison, run
through the real tool on small PyTorch-style test files written here."""
from __future__ import annotations

import json
import os
import pickle
import textwrap
import types

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mmseg_cann.analysis import torch_compat
from tests._helpers import run_python

#: helpers of the PyTorch-style test files below: ``check`` asserts that one call was
#: routed to mmseg_cann (patched run) or ran torch's own code (plain run, or a call the
#: routing leaves to torch), using the routing's call counts
COUNTING = """
import contextlib
import sys
import unittest

import torch
import torch.nn as nn
import torch.nn.functional as F

import mmseg_cann.ops as ops

PATCHED = F.interpolate.__module__ != 'torch.nn.functional'
ROUTING = sys.modules[F.interpolate.__module__] if PATCHED else None


def routed(key):
    return ROUTING.COUNTS['routed', key] if PATCHED else 0


class Case(unittest.TestCase):
    def check(self, key, expect_routed, fn, *args, **kwargs):
        before = routed(key)
        out = fn(*args, **kwargs)
        self.assertEqual(routed(key) - before, 1 if expect_routed and PATCHED else 0)
        return out


@contextlib.contextmanager
def calls(name):
    seen = []
    original = getattr(ops, name)

    def counting(*args, **kwargs):
        seen.append(name)
        return original(*args, **kwargs)
    setattr(ops, name, counting)
    try:
        yield seen
    finally:
        setattr(ops, name, original)
"""

UPSAMPLING_TESTS = COUNTING + """

class TestUpsampling(Case):
    def test_interpolate_4d_is_routed(self):
        x = torch.rand(2, 3, 5, 7)
        with calls('upsample') as seen:
            out = self.check('interpolate', True, F.interpolate, x, scale_factor=2,
                             mode='bilinear')
        self.assertEqual(len(seen), 1 if PATCHED else 0)
        self.assertEqual(out.shape, (2, 3, 10, 14))

    def test_interpolate_other_ranks_and_modes_stay_torchs(self):
        self.check('interpolate', False, F.interpolate, torch.rand(1, 2, 3, 4, 5),
                   scale_factor=2, mode='trilinear')
        self.check('interpolate', False, F.interpolate, torch.rand(1, 2, 5), size=9,
                   mode='linear')
        with self.assertRaises(NotImplementedError):
            F.interpolate(torch.rand(1, 2, 5, 5), size=9, mode='linear')

    def test_upsample_wrappers_reach_the_routed_interpolate(self):
        x = torch.rand(1, 1, 3, 3)
        out = self.check('interpolate', True, F.upsample_nearest, x, scale_factor=2)
        self.assertTrue(torch.equal(out, x.repeat_interleave(2, -1).repeat_interleave(2, -2)))
        self.check('interpolate', True, F.upsample_bilinear, x, size=(5, 5))

    def test_upsample_modules(self):
        x = torch.rand(1, 2, 4, 4)
        m = nn.Upsample(scale_factor=2, mode='nearest')
        self.assertIsInstance(m, torch.nn.modules.upsampling.Upsample)
        self.check('Upsample', True, m, x)
        self.check('Upsample', False, m, torch.rand(1, 2, 4, 4, 4))
        self.assertIs(type(nn.Upsample(scale_factor=2, mode='trilinear')),
                      torch.nn.modules.upsampling.Upsample)
        expected = torch.nn.functional.interpolate(x, scale_factor=2, mode='bilinear',
                                                   align_corners=True)
        out = self.check('Upsample', True, nn.UpsamplingBilinear2d(scale_factor=2), x)
        self.assertTrue(torch.equal(out, expected))

    def test_upsample_module_is_torchs(self):
        self.assertEqual(type(nn.Upsample(scale_factor=2)).__name__, 'Upsample')

    def test_interpolate_fails_everywhere(self):
        self.fail('fails on plain torch too')

    @unittest.skip('skipped')
    def test_interpolate_skipped(self):
        pass

    def test_interpolate_nearest_cuda(self):
        pass

    def test_not_selected_by_the_rule(self):
        pass
"""

POOLING_TESTS = COUNTING + """
import copy
import pickle


class TestPooling(Case):
    def test_functions(self):
        x = torch.rand(2, 3, 8, 8)
        self.check('max_pool2d', True, F.max_pool2d, x, 2)
        self.check('max_pool2d', True, F.max_pool2d, x[0], 2)
        values, indices = self.check('max_pool2d', True, F.max_pool2d, x, 3, 2, 1,
                                     return_indices=True)
        self.assertEqual(indices.dtype, torch.int64)
        self.check('max_pool2d_with_indices', True, F.max_pool2d_with_indices, x, 2)
        self.check('max_pool2d', False, F.max_pool1d, x[0], 2)
        self.check('avg_pool2d', True, F.avg_pool2d, x[0], 3, padding=1)
        self.check('avg_pool2d', False, F.avg_pool3d, x, 2)
        self.check('adaptive_avg_pool2d', True, F.adaptive_avg_pool2d, x, (3, 5))
        self.check('max_pool2d', False, torch.max_pool2d, x, 2)

    def test_modules(self):
        x = torch.rand(1, 3, 8, 8)
        for module, key in ((nn.MaxPool2d(3, 2, 1), 'MaxPool2d'), (nn.AvgPool2d(2), 'AvgPool2d'),
                            (nn.AdaptiveAvgPool2d(3), 'AdaptiveAvgPool2d')):
            self.check(key, True, module, x)
            for twin in (copy.deepcopy(module), pickle.loads(pickle.dumps(module))):
                self.assertIs(type(twin), type(module))
                self.assertTrue(torch.equal(twin(x), module(x)))
        before = routed('MaxPool2d')
        with self.assertRaises(RuntimeError):
            nn.MaxPool2d(2)(torch.rand(2, 3))
        self.assertEqual(routed('MaxPool2d'), before)

    def test_pool_module_is_torchs(self):
        self.assertEqual(type(nn.MaxPool2d(2)).__name__, 'MaxPool2d')
"""


def _write_tests(root):
    os.makedirs(os.path.join(root, 'nn'))
    with open(os.path.join(root, 'test_nn.py'), 'w') as f:
        f.write(UPSAMPLING_TESTS)
    with open(os.path.join(root, 'nn', 'test_pooling.py'), 'w') as f:
        f.write(POOLING_TESTS)


def test_tool_compares_plain_and_patched_runs(tmp_path):
    tests = tmp_path / 'test'
    _write_tests(str(tests))
    out = tmp_path / 'result.json'
    proc = run_python(['tools/torch_compat.py', '--tests', str(tests), '--workers', '1',
                       '--work', str(tmp_path / 'work'), '--out', str(out)], timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(out.read_text())
    selected = {t.split('::')[-1] for t in result['changed_tests']}
    # the CUDA-named test and the one outside the name rule are not run
    assert result['selected'] == 10
    assert result['plain_outcomes'] == {'passed': 8, 'failed': 1, 'skipped': 1}
    assert result['passing_plain'] == 8
    # every routing check passes patched too; only the two tests asserting torch's own
    # classes change, each with its own cause
    assert selected == {'test_upsample_module_is_torchs', 'test_pool_module_is_torchs'}
    assert result['changed'] == 2 and len(result['causes']) == 2
    causes = ' '.join(group['cause'] for group in result['causes'])
    assert "'CANNUpsample' != 'Upsample'" in causes and 'AssertionError' in causes
    assert result['routed_calls'] >= 20 and result['tests_routing'] == 5
    assert result['meta']['files'].keys() == {'nn/test_pooling.py', 'test_nn.py'}
    assert 'changed outcome when patched: 2 of 8' in proc.stdout


def test_tool_rejects_a_folder_without_the_test_files(tmp_path):
    proc = run_python(['tools/torch_compat.py', '--tests', str(tmp_path)])
    assert proc.returncode == 2
    assert 'lacks nn/test_pooling.py, test_nn.py' in proc.stderr
    assert 'Traceback' not in proc.stderr


def test_install_routes_and_uninstall_restores():
    originals = {name: getattr(F, name) for name in torch_compat.FUNCTIONAL_NAMES}
    modules = {name: getattr(nn, name) for name in torch_compat.MODULE_NAMES}
    torch_compat.install()
    try:
        torch_compat.COUNTS.clear()
        x = torch.rand(1, 2, 6, 6)
        assert torch.equal(F.max_pool2d(x, 2), torch.max_pool2d(x, 2))
        F.interpolate(x[None], scale_factor=2)  # 5-D: torch's
        assert torch_compat.COUNTS == {('routed', 'max_pool2d'): 1,
                                       ('native', 'interpolate'): 1}
        m = nn.AvgPool2d(2)
        assert type(m).__name__ == 'CANNAvgPool2d' and isinstance(m, modules['AvgPool2d'])
        assert pickle.loads(pickle.dumps(F.interpolate)) is F.interpolate
    finally:
        torch_compat.uninstall()
    assert all(getattr(F, name) is fn for name, fn in originals.items())
    assert all(getattr(nn, name) is cls for name, cls in modules.items())
    assert not torch_compat.installed()


def _item(path, name):
    return types.SimpleNamespace(path=path, name=name)


def test_selection_rule():
    import re
    items = [_item('/t/test_nn.py', 'test_upsamplingNearest2d_cpu'),
             _item('/t/test_nn.py', 'test_Upsample_interpolate'),
             _item('/t/test_nn.py', 'test_interpolate_nearest_1d_cuda'),
             _item('/t/test_nn.py', 'test_conv2d'),
             _item('/t/nn/test_pooling.py', 'test_max_pool2d_cpu_float32'),
             _item('/t/nn/test_pooling.py', 'test_adaptive_pooling_avg_nhwc_cuda')]
    kept, dropped = torch_compat.select(items, {'test_nn.py': re.compile('(?i)upsampl|interpolat')})
    assert [i.name for i in kept] == ['test_upsamplingNearest2d_cpu', 'test_Upsample_interpolate',
                                     'test_max_pool2d_cpu_float32']
    assert len(dropped) == 3


def test_compare_groups_causes():
    plain = {'tests': {'a': {'outcome': 'passed'}, 'b': {'outcome': 'passed'},
                       'c': {'outcome': 'passed'}, 'd': {'outcome': 'failed', 'error': 'x'},
                       'e': {'outcome': 'passed'}},
             'collect_errors': {}}
    patched = {'tests': {'a': {'outcome': 'passed', 'routed': 2},
                         'b': {'outcome': 'failed', 'error': 'TypeError: size 3 != 4',
                               'routed': 1},
                         'c': {'outcome': 'failed', 'error': 'TypeError: size 5 != 6'},
                         'd': {'outcome': 'passed'}},
               'collect_errors': {}}
    result = torch_compat.compare(plain, patched)
    assert (result['selected'], result['passing_plain'], result['changed']) == (5, 4, 3)
    assert [(g['cause'], g['count']) for g in result['causes']] == [
        ('failed: TypeError: size # != #', 2), ('not run', 1)]
    assert result['causes'][0]['first_error'] == 'TypeError: size 3 != 4'
    assert result['routed_calls'] == 3 and result['tests_routing'] == 2
    assert result['other_changes'] == {'d': ['failed', 'passed']}
