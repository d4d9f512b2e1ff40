"""What the fusions share: the report and the per-instance method binding."""
from __future__ import annotations

import dataclasses
from typing import Callable, List, Optional

from torch import nn


@dataclasses.dataclass
class FusionReport:
    """What :func:`fuse_upsample_add` / :func:`lean_predict` / :func:`fuse_resize_conv`
    rewrote, by module path, and what they left alone and why (``skipped``)."""
    upsample_add: List[str] = dataclasses.field(default_factory=list)
    lean_predict: List[str] = dataclasses.field(default_factory=list)
    skipped: List[str] = dataclasses.field(default_factory=list)
    #: ``'path (Class.attribute: what runs at low resolution)'`` per rewritten site
    resize_conv: List[str] = dataclasses.field(default_factory=list)

    def __str__(self) -> str:
        lines = []
        if self.upsample_add:
            lines.append(f'  upsample_add fused in {len(self.upsample_add)} top-down path(s): '
                         + ', '.join(self.upsample_add))
        if self.lean_predict:
            lines.append('  lean predict (upsample_argmax) on: ' + ', '.join(self.lean_predict))
        if self.resize_conv:
            lines.append(f'  resize_conv fused at {len(self.resize_conv)} site(s): '
                         + ', '.join(self.resize_conv))
        for item in self.skipped:
            lines.append(f'  not fused: {item}')
        return '\n'.join(lines)


class BoundMethod:
    """A rewritten method bound to one module instance: called as ``fn(module, ...)``.

    Unlike ``types.MethodType`` (which pickles as ``getattr(module, fn.__name__)``, a name
    the module does not have) it pickles, with ``torch.save`` of a whole model too;
    ``copy.deepcopy`` binds the copy's method to the copied module.
    """

    def __init__(self, fn, module: nn.Module) -> None:
        self.__func__ = fn
        self.__self__ = module

    def __call__(self, *args, **kwargs):
        return self.__func__(self.__self__, *args, **kwargs)

    @property
    def __signature__(self):
        import inspect
        signature = inspect.signature(self.__func__)
        return signature.replace(parameters=list(signature.parameters.values())[1:])

    def __repr__(self) -> str:
        return (f'<mmseg_cann rewritten method {self.__func__.__name__} of '
                f'{type(self.__self__).__name__}>')


def _bind(module: nn.Module, name: str, fn) -> None:
    """Bind ``fn`` as method ``name`` of this one instance (undone by ``unfuse_model``)."""
    setattr(module, name, BoundMethod(fn, module))
    module._cann_fused = tuple(sorted(set(getattr(module, '_cann_fused', ())) | {name}))


@dataclasses.dataclass(frozen=True)
class Site:
    """One rewritten site: mmseg's class (``module.Class``), the layer that moves below
    the resize, the method bound, its eligibility check and its replacement."""
    cls: str
    layer: str
    form: str
    method: str
    reason: Callable
    fused: Callable
    #: whether an instance has the form at all (None: every instance); instances without
    #: it are not listed in the report
    present: Optional[Callable] = None

    def resolve(self) -> type:
        module, name = self.cls.rsplit('.', 1)
        return getattr(__import__(module, fromlist=[name]), name)
