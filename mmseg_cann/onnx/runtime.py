"""Running an ONNX graph in onnxruntime as exported (shared by export and the ATC reading)."""
from __future__ import annotations

from typing import List, Sequence

import numpy as np


def run_onnx(model_proto, inputs: Sequence[np.ndarray]) -> List[np.ndarray]:
    """Run the graph in onnxruntime (CPU, graph optimisations off: the graph as exported)."""
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    session = ort.InferenceSession(model_proto.SerializeToString(), options,
                                   providers=['CPUExecutionProvider'])
    feeds = {i.name: np.ascontiguousarray(a) for i, a in zip(session.get_inputs(), inputs)}
    return session.run(None, feeds)
