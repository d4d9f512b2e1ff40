"""mmseg's inference APIs with the model converted as ``CANNOpsHook`` converts it.

``mmseg.apis.init_model``/``inference_model``, ``MMSegInferencer`` and mmseg's
``demo/image_demo.py`` build the model without running the training Runner, so the
config's ``CANNOpsHook`` never runs there. These wrappers apply the same conversion
(:func:`mmseg_cann.convert_model` with the hook's settings from the config, the precision
policy installed) and turn on the lean prediction path by default
(:func:`mmseg_cann.fusion.lean_predict`: labels without full-resolution logits in
``whole`` mode, in-place accumulation in ``slide`` mode). Checkpoints load through
``torch.load(weights_only=True)`` with the mmengine allow-list
(:func:`mmseg_cann.allow_mmengine_checkpoints`), never ``weights_only=False``.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from ..convert import convert_model
from ..core.precision import set_precision_policy
from ..engine.checkpoint import allow_mmengine_checkpoints

#: CANNOpsHook's keyword arguments and their defaults (what the hook converts with)
HOOK_DEFAULTS = dict(pool_precision=None, upsample_precision=None, upsample=True,
                     pooling=True, resize=True, fuse_upsample_add=False, lean_predict=False,
                     backend=None, fuse_resize_conv=False)


def cann_settings(cfg) -> dict:
    """The ``CANNOpsHook`` settings of ``cfg`` (its ``custom_hooks`` entry), with the
    hook's defaults for what the entry does not set (all defaults without an entry)."""
    settings = dict(HOOK_DEFAULTS)
    for hook in cfg.get('custom_hooks', None) or []:
        if hook.get('type') == 'CANNOpsHook':
            unknown = set(hook) - set(HOOK_DEFAULTS) - {'type', 'priority'}
            if unknown:
                raise ValueError(f'CANNOpsHook in the config has unknown settings '
                                 f'{sorted(unknown)}; accepted: {sorted(HOOK_DEFAULTS)}')
            settings.update({k: v for k, v in hook.items() if k in HOOK_DEFAULTS})
    return settings


def convert_for_inference(model: nn.Module, cfg, lean_predict: bool = True) -> nn.Module:
    """Convert ``model`` with ``cfg``'s hook settings, install its precision policy and
    bind the lean prediction path (unless ``lean_predict=False``); returns ``model``."""
    if not isinstance(lean_predict, bool):
        raise TypeError(f'lean_predict must be True or False, got {lean_predict!r}')
    settings = cann_settings(cfg)
    if settings['pool_precision'] is not None or settings['upsample_precision'] is not None:
        set_precision_policy(settings['pool_precision'], settings['upsample_precision'])
    convert_model(model, upsample=settings['upsample'], pooling=settings['pooling'],
                  resize=settings['resize'], fuse_upsample_add=settings['fuse_upsample_add'],
                  lean_predict=lean_predict or settings['lean_predict'],
                  backend=settings['backend'], fuse_resize_conv=settings['fuse_resize_conv'])
    return model


def _on_cpu(device) -> bool:
    return str(device).startswith('cpu') or not (torch.cuda.is_available() or
                                                 str(device).startswith('npu'))


def init_model(config, checkpoint: Optional[str] = None, device: str = 'cpu',
               cfg_options: Optional[dict] = None, *, lean_predict: bool = True) -> nn.Module:
    """``mmseg.apis.init_model`` plus the CANN conversion.

    Args:
        config: config file path, ``Path`` or ``mmengine.Config``.
        checkpoint: checkpoint path (loaded with ``weights_only=True``), or None.
        device: ``'cpu'``, ``'cuda[:i]'`` or ``'npu[:i]'``. On CPU, SyncBN layers become
            BatchNorm (as ``MMSegInferencer`` does; SyncBN needs a GPU).
        cfg_options: overrides merged into the config.
        lean_predict: predict labels without full-resolution logits (default True).

    Returns:
        the segmentor in eval mode, converted (``model.cann_conversion_report``).
    """
    from mmengine.model import revert_sync_batchnorm
    from mmseg.apis import init_model as mmseg_init_model

    allow_mmengine_checkpoints()
    if device.startswith('npu'):
        import torch_npu  # noqa: F401  (registers the npu device)
    model = mmseg_init_model(config, checkpoint, device=device, cfg_options=cfg_options)
    if _on_cpu(device):
        model = revert_sync_batchnorm(model)
    return convert_for_inference(model, model.cfg, lean_predict)


def inference_model(model: nn.Module, img):
    """``mmseg.apis.inference_model`` (image path(s) or array(s) -> ``SegDataSample``(s));
    a converted model without the lean path gets it bound first."""
    from mmseg.apis import inference_model as mmseg_inference_model

    from ..fusion import is_lean
    if getattr(model, 'cann_conversion_report', None) is not None and not is_lean(model):
        from ..fusion import lean_predict
        lean_predict(model)
    return mmseg_inference_model(model, img)


def _inferencer_base():
    from mmseg.apis import MMSegInferencer
    return MMSegInferencer


class CANNInferencer(_inferencer_base()):
    """``MMSegInferencer`` whose model is converted as :func:`init_model` converts it.

    ``CANNInferencer(model='configs/...py', weights='ckpt.pth', device='cpu')`` works as
    ``MMSegInferencer`` does (``out_dir``, visualisation, ``return_datasamples``);
    ``lean_predict=False`` keeps mmseg's prediction path.
    """

    def __init__(self, model, weights=None, classes=None, palette=None, dataset_name=None,
                 device=None, scope='mmseg', *, lean_predict: bool = True) -> None:
        if not isinstance(lean_predict, bool):
            raise TypeError(f'lean_predict must be True or False, got {lean_predict!r}')
        allow_mmengine_checkpoints()
        self._cann_lean_predict = lean_predict
        super().__init__(model=model, weights=weights, classes=classes, palette=palette,
                         dataset_name=dataset_name, device=device, scope=scope)

    def _init_model(self, cfg, weights, device='cpu'):
        from mmengine.model import revert_sync_batchnorm
        model = super()._init_model(cfg, weights, device)
        if _on_cpu(device):
            model = revert_sync_batchnorm(model)
        return convert_for_inference(model, cfg, self._cann_lean_predict)
