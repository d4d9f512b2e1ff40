"""Inference the way mmseg users run it, with the CANN ops: :func:`init_model`,
:func:`inference_model` and :class:`CANNInferencer` (mmseg's APIs, converted)."""
from .inference import CANNInferencer, cann_settings, inference_model, init_model

__all__ = ['init_model', 'inference_model', 'CANNInferencer', 'cann_settings']
