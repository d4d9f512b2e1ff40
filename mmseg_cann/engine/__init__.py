"""mmengine integration: the ``CANNOpsHook`` (registered in mmseg's ``HOOKS``)."""
from .hooks import CANNOpsHook, register_hooks

register_hooks()

__all__ = ['CANNOpsHook']
