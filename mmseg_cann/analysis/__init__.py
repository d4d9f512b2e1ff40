"""Analysis tools on top of everything else: the parity checker (:mod:`.parity`), the
precision report (:mod:`.precision_report`), the op profiler (:mod:`.op_profile`),
the NPU call listing (:mod:`.npu_calls`), and torchao's PT2E quantization flow with a
summary of the quantized graph (:mod:`.pt2e`). Their command lines live in ``tools/``."""
