"""The exceptions of invalid input, each also of the type PyTorch raises for the same call.

Bad arguments raise ``ValueError``/``TypeError`` naming the argument (mmseg_cann's
contract); where PyTorch's own op raises another type for the same call, the exception is
an instance of that type too, so code written against either -- ``except RuntimeError``
in mmseg's and PyTorch's tests, ``except ValueError`` in ours -- keeps working when a CANN
op or module replaces a ``torch.nn`` one.
"""


class ArgumentError(ValueError, RuntimeError):
    """An invalid size, shape or window argument (e.g. a pooling output that would be
    empty, padding above half the kernel, an empty channel dimension).

    A ``ValueError`` and a ``RuntimeError`` (what PyTorch raises for the same calls).
    """


class InputRankError(ArgumentError, IndexError):
    """An input tensor of a rank the op does not take.

    Also an ``IndexError``: PyTorch raises ``IndexError`` ("Dimension out of range") for
    some ranks (``avg_pool2d`` of a 2-D tensor) and ``RuntimeError`` for others.
    """


class UnsupportedDtypeError(TypeError, NotImplementedError):
    """An input dtype the op has no kernel for (e.g. int16 nearest upsampling, integer
    adaptive average pooling).

    A ``TypeError`` and a ``NotImplementedError`` -- PyTorch's ``"..." not implemented
    for 'Short'`` error, itself a ``RuntimeError``.
    """


class UnsupportedModeError(ArgumentError, NotImplementedError):
    """A mode PyTorch has no kernel for at the input's rank (``'linear'`` or
    ``'trilinear'`` for 4-D input, an unknown name).

    A ``ValueError`` naming the argument and PyTorch's ``NotImplementedError``.
    """
