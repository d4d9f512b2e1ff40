"""Whether a user's module hooks could observe a change in how a model executes.

Execution-changing paths (strips, the fusions) skip a module whose hooks would see
different tensors, or run nothing differently while global module hooks are registered.
"""
from torch import nn
from torch.nn.modules import module as _torch_module


def has_hooks(module: nn.Module) -> bool:
    """``module`` has forward, forward-pre, backward or backward-pre hooks."""
    return bool(module._forward_hooks or module._forward_pre_hooks
                or module._backward_hooks or module._backward_pre_hooks)


def global_hooks_registered() -> bool:
    """Module hooks registered for every module (``register_module_forward_hook`` ...)."""
    return bool(_torch_module._global_forward_hooks or _torch_module._global_forward_pre_hooks
                or _torch_module._global_backward_hooks
                or _torch_module._global_backward_pre_hooks)
