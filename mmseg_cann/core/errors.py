"""The exception for invalid arguments that PyTorch answers with ``RuntimeError``."""


class ArgumentError(ValueError, RuntimeError):
    """An invalid size, shape or window argument (e.g. a kernel larger than the padded
    input, padding above half the kernel, an empty output size).

    It is a ``ValueError`` (mmseg_cann's contract: bad arguments raise ``ValueError`` with
    a message naming the argument) and a ``RuntimeError`` (what PyTorch's own ops raise
    for the same calls), so code written against either -- ``except RuntimeError`` in
    mmseg's tests, ``except ValueError`` in ours -- keeps working when a CANN module
    replaces a ``torch.nn`` one.
    """
