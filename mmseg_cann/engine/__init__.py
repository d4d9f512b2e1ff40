"""mmengine integration: ``CANNOpsHook`` (registered in mmseg's ``HOOKS``) and the
checkpoint allow-list for ``torch.load(weights_only=True)``. Needs mmengine and mmseg."""
from .checkpoint import allow_mmengine_checkpoints
from .hooks import CANNOpsHook, register_hooks

register_hooks()

__all__ = ['CANNOpsHook', 'allow_mmengine_checkpoints']
