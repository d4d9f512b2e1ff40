"""What the fusions share: the report and the per-instance method binding."""
from __future__ import annotations

import dataclasses
import weakref
from typing import Callable, Dict, List, Optional, Tuple

import torch
from torch import nn

#: the instance attribute holding what a rewritten site ran at its last call
LAST_CALL = '_cann_last_call'


@dataclasses.dataclass
class FusionReport:
    """What :func:`fuse_upsample_add` / :func:`lean_predict` / :func:`fuse_resize_conv`
    rewrote, by module path, and what they left alone and why (``skipped``)."""
    upsample_add: List[str] = dataclasses.field(default_factory=list)
    lean_predict: List[str] = dataclasses.field(default_factory=list)
    skipped: List[str] = dataclasses.field(default_factory=list)
    #: ``'path (Class.attribute: what runs at low resolution)'`` per rewritten site
    resize_conv: List[str] = dataclasses.field(default_factory=list)
    #: the rewritten ``fuse_resize_conv`` modules by path (weak references)
    sites: Dict[str, weakref.ref] = dataclasses.field(default_factory=dict, repr=False,
                                                      compare=False)

    def last_calls(self) -> Dict[str, Tuple[str, ...]]:
        """Per rewritten ``fuse_resize_conv`` site that has run since it was rewritten,
        what ran at its last call: the method per resized part (``'mix_first'``,
        ``'polyphase'``, ``'mix_resize'``, ``'1x1 at low resolution'``) or
        ``'composition: <reason>'`` (also counted in ``fallback_counts()``)."""
        calls = {}
        for path, ref in self.sites.items():
            module = ref()
            ran = None if module is None else module.__dict__.get(LAST_CALL)
            if ran is not None:
                calls[path] = ran
        return calls

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
        for path, ran in self.last_calls().items():
            lines.append(f'    last call at {path}: ' + ', '.join(ran))
        for item in self.skipped:
            lines.append(f'  not fused: {item}')
        return '\n'.join(lines)


class BoundMethod:
    """A rewritten method bound to one module instance: called as ``fn(module, ...)``.

    Unlike ``types.MethodType`` (which pickles as ``getattr(module, fn.__name__)``, a name
    the module does not have) it pickles, with ``torch.save`` of a whole model too;
    ``copy.deepcopy`` binds the copy's method to the copied module.
    """

    def __init__(self, fn, module: nn.Module, label: Optional[str] = None) -> None:
        self.__func__ = fn
        self.__self__ = module
        #: what a call runs unless ``fn`` records otherwise (:func:`record_last_call`)
        self.label = label

    def __call__(self, *args, **kwargs):
        if self.label is not None:
            record_last_call(self.__self__, (self.label,))
        return self.__func__(self.__self__, *args, **kwargs)

    @property
    def __signature__(self):
        import inspect
        signature = inspect.signature(self.__func__)
        return signature.replace(parameters=list(signature.parameters.values())[1:])

    def __repr__(self) -> str:
        return (f'<mmseg_cann rewritten method {self.__func__.__name__} of '
                f'{type(self.__self__).__name__}>')


def record_last_call(module: nn.Module, ran) -> None:
    """Note what a rewritten site ran at this call (:meth:`FusionReport.last_calls`);
    nothing while a compiler traces (no side effect in its graph)."""
    if not torch.compiler.is_compiling():
        module.__dict__[LAST_CALL] = tuple(ran)


def _bind(module: nn.Module, name: str, fn, label: Optional[str] = None) -> None:
    """Bind ``fn`` as method ``name`` of this one instance (undone by ``unfuse_model``);
    ``label``: what a call runs unless ``fn`` records otherwise."""
    setattr(module, name, BoundMethod(fn, module, label))
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
    #: what a call of the rewritten method runs unless it records otherwise (the report's
    #: last call; None: the method records it)
    label: Optional[str] = '1x1 at low resolution'

    def resolve(self) -> type:
        module, name = self.cls.rsplit('.', 1)
        return getattr(__import__(module, fromlist=[name]), name)
