"""Fixtures of the tool tests."""
import pytest
import torch

#: the demo's config (tools/demo.py), which the inference tool tests use
DEMO = 'configs/medical/unet-s5-d16_fcn_cann_1xb4-300iter_synthetic-drive-64x64.py'


@pytest.fixture(scope='module')
def checkpoint(tmp_path_factory):
    """A checkpoint of the demo model with seeded initial weights and mmseg's metadata."""
    from mmseg_cann.apis import init_model
    torch.manual_seed(0)
    model = init_model(DEMO, None, 'cpu')
    path = tmp_path_factory.mktemp('ckpt') / 'demo.pth'
    torch.save({'state_dict': model.state_dict(),
                'meta': {'dataset_meta': {'classes': ('background', 'vessel'),
                                          'palette': [[0, 0, 0], [255, 0, 0]]}}}, path)
    return str(path)
