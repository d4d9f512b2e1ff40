"""Analysis tools on top of everything else: the parity checker (:mod:`.parity`), the
precision report (:mod:`.precision_report`), the op profiler (:mod:`.op_profile`) and
the NPU call listing (:mod:`.npu_calls`). Their command lines live in ``tools/``."""
