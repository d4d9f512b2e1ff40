"""``tools/profile_ops.py`` on a converted Cityscapes PSPNet (reduced backbone) on CPU."""
import json

import pytest

from tests._helpers import run_python

SMALL_PSPNET = """_base_ = 'mmseg::pspnet/pspnet_r50-d8_4xb2-40k_cityscapes-512x1024.py'
norm_cfg = dict(type='BN', requires_grad=True)
model = dict(
    backbone=dict(depth=18, stem_channels=16, base_channels=16, norm_cfg=norm_cfg),
    decode_head=dict(in_channels=128, channels=32, norm_cfg=norm_cfg),
    auxiliary_head=dict(in_channels=64, channels=16, norm_cfg=norm_cfg))
"""


@pytest.mark.slow
def test_profile_table_json_and_plot(tmp_path):
    config = tmp_path / 'pspnet_r18_small_cityscapes.py'
    config.write_text(SMALL_PSPNET)
    out_json, out_png = tmp_path / 'ops.json', tmp_path / 'ops.png'
    result = run_python(['tools/profile_ops.py', str(config), '--shape', '64', '128',
                         '--iters', '1', '--backward', '--assume-chip', 'A2',
                         '--json', str(out_json), '--plot', str(out_png)], timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert 'fwd ms' in result.stdout and 'bwd ms' in result.stdout
    report = json.loads(out_json.read_text())
    sites = {(s['site'], s['in_shape']): s for s in report['sites']}
    # every upsample/pool call site of PSPNet: stem max pool, 4 PPM pools, 4 PPM resizes,
    # the final resize of the logits to the input size
    names = [s['site'] for s in report['sites']]
    assert 'backbone.maxpool' in names
    assert sum(n.startswith('decode_head.psp_modules.') for n in names) == 4
    assert sum(n.startswith('resize@decode_head.psp_modules') for n in names) == 4
    final = [s for s in report['sites'] if s['out_shape'] == '1x19x64x128']
    assert len(final) == 1 and final[0]['op'] == 'upsample'
    assert final[0]['in_shape'] == '1x19x8x16'
    # the A2 plans: 8x bilinear gets consistent scales, the 1x1 PPM bin is a mean
    assert final[0]['plan'].startswith('scales:8.0x8.0')
    assert sites[('decode_head.psp_modules.0.0', '1x128x8x16')]['plan'].startswith('mean')
    maxpool = sites[('backbone.maxpool', '1x16x32x64')]
    assert maxpool['out_shape'] == '1x16x16x32'
    assert maxpool['mbytes'] == pytest.approx((16 * 32 * 64 + 16 * 16 * 32) * 4 / 1e6, abs=1e-3)
    for s in report['sites']:
        assert s['fwd_ms'] > 0 and 0 < s['fwd_share'] < 1 and s['bwd_share'] >= 0
    assert 0 < report['sites_forward_share'] < 1 and report['backward_ms'] > 0
    assert out_png.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
