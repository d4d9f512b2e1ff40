"""The lowest layer: rules every other part of mmseg_cann takes from one place.

* :mod:`.geometry` -- output sizes, source coordinates, SAME padding, ceil rules,
  argument validation of sizes, scales and windows;
* :mod:`.validation` -- the checks of tensor inputs and op arguments shared by every op;
* :mod:`.reference` -- float64 reference implementations written from the formulas;
* :mod:`.taps` -- per-axis index/weight tables for the fast paths;
* :mod:`.precision` -- the precision policy;
* :mod:`.export_mode` -- the flag the ONNX layer sets while it traces;
* :mod:`.standard_export` -- which aten ops torch's standard ONNX exporters translate
  exactly (what ``backend='auto'`` records under them).

Imports torch and numpy only (no mmseg, mmcv or mmengine).
"""
from . import export_mode, geometry, precision, reference, standard_export, taps, validation

__all__ = ['geometry', 'validation', 'reference', 'taps', 'precision', 'export_mode',
           'standard_export']
