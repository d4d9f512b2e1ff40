"""Compatibility of Triton's CPU interpreter (``TRITON_INTERPRET=1``) with numpy >= 2.4.

The interpreter of Triton 3.x wraps a scalar kernel argument as a 1-element numpy array
and implements ``tensor.__index__`` as ``int(array)``, which numpy 2.4 rejects for arrays
with ``ndim > 0``: a ``range()`` with a runtime bound inside a kernel then fails with
"only 0-dimensional arrays can be converted to Python scalars". :func:`apply` registers
an ``__index__`` that takes the single element, inside the interpreter's own patch scope
(so it is undone with the interpreter's other patches after each launch). Compiled
(GPU/NPU) kernels are not affected.
"""
from __future__ import annotations

_applied = False


def apply() -> None:
    """Install the patch once; a no-op when the interpreter is not in use."""
    global _applied
    from triton import knobs
    if _applied or not knobs.runtime.interpret:
        return
    from triton.runtime import interpreter
    original = interpreter._patch_lang_tensor

    def patch_lang_tensor(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, '__index__',
                       lambda self: int(self.handle.data.reshape(-1)[0]))

    interpreter._patch_lang_tensor = patch_lang_tensor
    _applied = True
