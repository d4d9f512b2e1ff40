"""Compatibility of Triton's CPU interpreter (``TRITON_INTERPRET=1``) with numpy >= 2.4.

The interpreter of Triton 3.x wraps a scalar kernel argument as a 1-element numpy array
and implements ``tensor.__index__`` as ``int(array)``, which numpy 2.4 rejects for arrays
with ``ndim > 0``: a ``range()`` with a runtime bound inside a kernel then fails with
"only 0-dimensional arrays can be converted to Python scalars". :func:`apply` registers
an ``__index__`` that takes the single element where the interpreter patches Triton's
tensor class: inside its patch scope where it has one (undone with the interpreter's
other patches after each launch), directly where it patches without one. Compiled
(GPU/NPU) kernels are not affected.

Works with Triton 3.2 (triton-ascend) through 3.6, told apart by feature: the settings
object ``triton.knobs`` (newer releases; older ones read ``TRITON_INTERPRET`` from the
environment) and the signature of the interpreter's tensor patch.
"""
from __future__ import annotations

import inspect
import os

_applied = False


def interpreting() -> bool:
    """Whether Triton's interpreter replaces ``@triton.jit`` in this process."""
    try:
        from triton import knobs
    except ImportError:  # no settings object: Triton reads the environment
        return os.environ.get('TRITON_INTERPRET', '0') == '1'
    return bool(knobs.runtime.interpret)


def _index(self):
    return int(self.handle.data.reshape(-1)[0])


def apply() -> None:
    """Install the patch once; a no-op when the interpreter is not in use."""
    global _applied
    if _applied or not interpreting():
        return
    from triton.runtime import interpreter
    original = interpreter._patch_lang_tensor
    if len(inspect.signature(original).parameters) >= 2:  # (tensor, scope)
        def patch_lang_tensor(tensor, scope):
            original(tensor, scope)
            scope.set_attr(tensor, '__index__', _index)
    else:  # (tensor): the interpreter sets the attributes itself
        def patch_lang_tensor(tensor):
            original(tensor)
            tensor.__index__ = _index
    interpreter._patch_lang_tensor = patch_lang_tensor
    _applied = True
