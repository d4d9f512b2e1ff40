"""Running an ONNX graph in onnxruntime as exported, and reading its constants (shared
by the export and the ATC reading)."""
from __future__ import annotations

from typing import Dict, List, Sequence

import numpy as np

from .dynamic_domain import check_dynamic_domain


def run_onnx(model_proto, inputs: Sequence[np.ndarray]) -> List[np.ndarray]:
    """Run the graph in onnxruntime (CPU, graph optimisations off: the graph as exported).

    A dynamic graph's inputs are first checked against the sizes it holds for
    (:func:`~.dynamic_domain.check_dynamic_domain`; ``ValueError`` outside them).
    """
    import onnxruntime as ort
    check_dynamic_domain(model_proto, [np.shape(a) for a in inputs])
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    session = ort.InferenceSession(model_proto.SerializeToString(), options,
                                   providers=['CPUExecutionProvider'])
    feeds = {i.name: np.ascontiguousarray(a) for i, a in zip(session.get_inputs(), inputs)}
    return session.run(None, feeds)


def constant_values(model_proto) -> Dict[str, np.ndarray]:
    """Every initializer and ``Constant`` node output of the graph, by tensor name."""
    import onnx
    from onnx import numpy_helper
    consts = {t.name: numpy_helper.to_array(t) for t in model_proto.graph.initializer}
    for node in model_proto.graph.node:
        if node.op_type == 'Constant':
            for a in node.attribute:
                if a.name == 'value':
                    consts[node.output[0]] = numpy_helper.to_array(a.t)
                elif a.name in ('value_ints', 'value_floats'):
                    consts[node.output[0]] = np.array(onnx.helper.get_attribute_value(a))
    return consts
