"""Registration in mmseg's MODELS and use through configs and mmcv's builders."""
import os
import textwrap

import torch
from mmengine.registry import MODELS as ROOT_MODELS
from mmengine.registry import DefaultScope

import mmseg_cann
from mmseg_cann import CANNAdaptiveAvgPool2d, CANNAvgPool2d, CANNMaxPool2d, CANNUpsample

from tests._helpers import run_python

NAMES = {'CANNUpsample': CANNUpsample, 'CANNMaxPool2d': CANNMaxPool2d,
         'CANNAvgPool2d': CANNAvgPool2d, 'CANNAdaptiveAvgPool2d': CANNAdaptiveAvgPool2d}


def test_registered_in_mmseg_and_root_registries():
    from mmseg.registry import MODELS
    for name, cls in NAMES.items():
        assert MODELS.module_dict[name] is cls
        assert ROOT_MODELS.module_dict[name] is cls
        assert getattr(mmseg_cann, name) is cls


def test_build_from_config_dicts_in_mmseg_scope():
    from mmseg.registry import MODELS
    with DefaultScope.overwrite_default_scope('mmseg'):
        up = MODELS.build(dict(type='CANNUpsample', scale_factor=2, mode='bilinear',
                               align_corners=False))
        pool = MODELS.build(dict(type='CANNMaxPool2d', kernel_size=3, stride=2,
                                 padding='same', precision='fp16'))
        avg = MODELS.build(dict(type='CANNAvgPool2d', kernel_size=2))
        ada = MODELS.build(dict(type='CANNAdaptiveAvgPool2d', output_size=1))
    assert isinstance(up, CANNUpsample) and up.mode == 'bilinear'
    assert isinstance(pool, CANNMaxPool2d) and pool.padding == 'same'
    assert isinstance(avg, CANNAvgPool2d) and isinstance(ada, CANNAdaptiveAvgPool2d)
    x = torch.rand(1, 2, 6, 6)
    assert up(x).shape == (1, 2, 12, 12) and pool(x).shape == (1, 2, 3, 3)


def test_build_upsample_layer_from_mmcv():
    from mmcv.cnn import build_upsample_layer
    for scope in (None, 'mmseg'):
        with DefaultScope.overwrite_default_scope(scope):
            layer = build_upsample_layer(dict(type='CANNUpsample', scale_factor=2,
                                              mode='nearest'))
        assert isinstance(layer, CANNUpsample)
        assert layer(torch.rand(1, 1, 3, 3)).shape == (1, 1, 6, 6)


def test_custom_imports_in_a_config_file(tmp_path):
    """A fresh process: the modules exist only after the config's custom_imports."""
    cfg = tmp_path / 'cann_cfg.py'
    cfg.write_text(textwrap.dedent('''
        custom_imports = dict(imports=['mmseg_cann'], allow_failed_imports=False)
        default_scope = 'mmseg'
        neck = dict(type='CANNUpsample', scale_factor=2, mode='bilinear', align_corners=False)
        pool = dict(type='CANNMaxPool2d', kernel_size=3, stride=2, padding=1)
    '''))
    script = textwrap.dedent(f'''
        import sys
        from mmengine.registry import DefaultScope
        from mmseg.registry import MODELS
        assert 'CANNUpsample' not in MODELS.module_dict
        assert 'mmseg_cann' not in sys.modules
        from mmengine.config import Config
        cfg = Config.fromfile({str(cfg)!r})
        with DefaultScope.overwrite_default_scope(cfg.default_scope):
            up = MODELS.build(cfg.neck)
            pool = MODELS.build(cfg.pool)
        print(type(up).__name__, type(pool).__name__)
    ''')
    result = run_python(['-c', script])
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ['CANNUpsample', 'CANNMaxPool2d']


def test_kernels_package_installs_as_mmseg_cann_kernels():
    import mmseg_cann.kernels as kernels
    assert kernels.__name__ == 'mmseg_cann.kernels'
    assert kernels.__file__.endswith(os.path.join('kernels', '__init__.py'))
