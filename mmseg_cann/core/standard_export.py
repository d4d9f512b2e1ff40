"""Which aten ops torch's standard ONNX exporters translate exactly: the one rule.

While a standard exporter traces (``torch.onnx.export`` with TorchScript or dynamo,
``torch.export``; see :func:`mmseg_cann.core.export_mode.standard_export_tracing`),
``backend='auto'`` records, per call, the aten op PyTorch's own module records
(``upsample_bilinear2d``, ``upsample_nearest2d``, ``max_pool2d``, ``avg_pool2d``,
``adaptive_avg_pool2d``) where the functions below say both exporters translate it
exactly, and the exporter-safe forms of :mod:`mmseg_cann.backends.portable` otherwise.
Graph passes (torchao's PT2E quantizers, for one) then see the graph they see for the
unconverted model. Exactness comes first: where in doubt a function answers False (a
portable ``MatMul`` is a missed nicety, a wrong ``Resize`` a defect).

The rule reads the translations in torch 2.13 (``torch/onnx/_internal/
torchscript_exporter/symbolic_helper.py`` ``_interpolate_helper``, ``symbolic_opset9.py``
``_adaptive_pool``, ``symbolic_opset10.py`` ``_max_pool``/``_avg_pool``) and onnxscript
0.7 (``function_libs/torch_lib/ops/nn.py``: ``aten_upsample_bilinear2d(_vec)``,
``aten_upsample_nearestnd_vec``, ``aten_max_pool2d``, ``aten_avg_pool2d``; it has no
``adaptive_avg_pool2d``, which the dynamo exporter decomposes), and was measured against
onnxruntime 1.32 at opset 18 (``tests/onnx/test_standard_exporters.py`` checks every case):

* **Bilinear** becomes ``Resize`` linear (``half_pixel`` or ``align_corners``) with the
  user's ``scales`` or with ``sizes`` (the non-``vec`` translation ignores the scales):
  onnxruntime then maps with ``in / out``, PyTorch with ``1 / scale_factor``, and an
  output size from float32 ``scales`` can differ from PyTorch's. Both agree when every
  axis has ``out = k * in``, ``k`` integral and any user scale equal to ``k`` (an axis
  of size 1 is a copy in both); ``align_corners=True`` maps with ``(in - 1) / (out - 1)``
  in both. The two compute the same source coordinates and taps; the values differ by
  float32 rounding. With ``align_corners=False`` and ``k`` a power of two the
  coordinates are exact on both sides and the results agree to about 1 ulp at every
  size; otherwise both round the coordinates in float32 (PyTorch's own kernel is then
  up to 2.4e-5 from exact math on a 128x128 input in [-1, 1], onnxruntime up to 2.7e-5
  from PyTorch): the tests check that the graph is never further from exact math than
  PyTorch's kernel is, plus a few ulps. Antialiasing and bicubic keep the matrix form.
* **Nearest** (legacy) becomes ``Resize`` nearest ``asymmetric``/``floor``; onnxruntime
  reads index ``floor(d / k)``, divided in float32 (exact for these sizes), PyTorch
  ``floor(d * float32(1 / k))``. Emitted when ``out = k * in`` (user scale ``k`` if any)
  and PyTorch's float32 indices equal ``floor(d / k)`` (checked per call; true for every
  power of two). ``nearest-exact`` keeps ``Gather``: the TorchScript exporter has no
  translation for ``_upsample_nearest_exact2d``.
* **Max and average pooling** become ``MaxPool``/``AveragePool`` with PyTorch's
  symmetric ``pads``, ``dilations`` and ``count_include_pad``: exact when PyTorch takes
  the padding itself (symmetric, at most half the kernel) and ``ceil_mode`` does not
  change the output size. ``divisor_override`` is dropped by both translations (the
  measured defect that made the portable forms necessary), and a ``ceil_mode`` window
  that PyTorch drops is not one ONNX drops in every reading: both keep the portable form.
* **Adaptive average pooling** becomes ``GlobalAveragePool`` (1x1) or ``AveragePool``
  with kernel and stride ``in / out`` when every output size divides its input size;
  otherwise the TorchScript exporter refuses it, and the bin matrices stay.

Only float32 4-D inputs with sizes fixed at trace time qualify (other dtypes and ranks,
and symbolic sizes, keep the forms they had).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from . import geometry as geo
from . import reference as ref

#: the only dtype the rule emits aten ops for (what the measurements cover)
EXACT_DTYPES = (torch.float32,)


def _plain_input(input: torch.Tensor) -> bool:
    if not isinstance(input, torch.Tensor):
        raise TypeError(f'input must be a torch.Tensor, got {type(input).__name__}')
    return input.dim() == 4 and input.dtype in EXACT_DTYPES


def _check_spec(spec, kind: type, name: str) -> None:
    if not isinstance(spec, kind):
        raise TypeError(f'{name} must be a geometry.{kind.__name__}, got '
                        f'{type(spec).__name__}')


def _integral_factor(in_size: int, out_size: int, user_scale) -> int:
    """``k`` when ``out = k * in`` and the coordinate step is ``1 / k``, else 0."""
    if in_size < 1 or out_size % in_size:
        return 0
    k = out_size // in_size
    if user_scale is not None and float(user_scale) != float(k):
        return 0
    return k


def _power_of_two(k: int) -> bool:
    return k >= 1 and k & (k - 1) == 0


def _nearest_axis_exact(in_size: int, out_size: int, user_scale) -> bool:
    k = _integral_factor(in_size, out_size, user_scale)
    if not k:
        return False
    if _power_of_two(k):
        return True
    torch_idx = ref.nearest_indices(in_size, out_size, user_scale, False, 'pytorch')
    return bool(np.array_equal(torch_idx, np.arange(out_size) // k))


def _bilinear_axis_exact(in_size: int, out_size: int, user_scale) -> bool:
    return _integral_factor(in_size, out_size, user_scale) > 0


def upsample_exports_exactly(input: torch.Tensor, spec: geo.UpsampleSpec) -> bool:
    """Whether ``F.interpolate``'s aten op for ``spec`` exports exactly (module docstring).

    Raises:
        TypeError: ``input`` is not a tensor or ``spec`` not an ``UpsampleSpec``.
    """
    _check_spec(spec, geo.UpsampleSpec, 'spec')
    if not _plain_input(input):
        return False
    if geo.any_symbolic(tuple(spec.in_size) + tuple(spec.out_size)):
        return False
    if spec.mode == 'area':
        return adaptive_avg_pool_exports_exactly(input, spec.out_size)
    axes = zip(spec.in_size, spec.out_size, spec.kernel_scales)
    if spec.mode == 'nearest':
        return all(_nearest_axis_exact(*axis) for axis in axes)
    if spec.mode == 'bilinear' and not spec.antialias:
        return all(_bilinear_axis_exact(*axis) for axis in axes)
    return False


def _pool_windows_plain(spec: geo.PoolSpec) -> bool:
    """PyTorch takes the padding itself and ``ceil_mode`` changes no output size."""
    if geo.any_symbolic(tuple(spec.in_size) + tuple(spec.out_size)):
        return False
    if not spec.torch_padding_ok:
        return False
    if not spec.args.ceil_mode:
        return True
    floor_sizes = tuple(geo.pool_output_size(n, k, s, p, d, False) for n, k, s, p, d in
                        zip(spec.in_size, spec.kernel, spec.stride, spec.pad_begin,
                            spec.dilation))
    return floor_sizes == tuple(spec.out_size)


def max_pool_exports_exactly(input: torch.Tensor, spec: geo.PoolSpec,
                             return_indices: bool = False) -> bool:
    """Whether ``F.max_pool2d``'s aten op for ``spec`` exports exactly (module docstring);
    never with ``return_indices`` (ONNX indices are not PyTorch's).

    Raises:
        TypeError: ``input`` is not a tensor or ``spec`` not a ``PoolSpec``.
    """
    _check_spec(spec, geo.PoolSpec, 'spec')
    return _plain_input(input) and not return_indices and _pool_windows_plain(spec)


def avg_pool_exports_exactly(input: torch.Tensor, spec: geo.PoolSpec,
                             divisor_override=None) -> bool:
    """Whether ``F.avg_pool2d``'s aten op for ``spec`` exports exactly (module docstring):
    never with ``divisor_override``, which both translations drop.

    Raises:
        TypeError: ``input`` is not a tensor or ``spec`` not a ``PoolSpec``.
    """
    _check_spec(spec, geo.PoolSpec, 'spec')
    return (_plain_input(input) and divisor_override is None
            and _pool_windows_plain(spec))


def adaptive_avg_pool_exports_exactly(input: torch.Tensor, output_size: Sequence[int]) -> bool:
    """Whether ``F.adaptive_avg_pool2d(input, output_size)`` exports exactly: every
    output size divides its input size (module docstring).

    Raises:
        TypeError: ``input`` is not a tensor or ``output_size`` not a pair.
    """
    if not isinstance(output_size, (tuple, list)) or len(output_size) != 2:
        raise TypeError(f'output_size must be a resolved (H, W) pair, got {output_size!r}')
    if not _plain_input(input):
        return False
    sizes = tuple(input.shape[-2:]) + tuple(output_size)
    if geo.any_symbolic(sizes):
        return False
    return all(o >= 1 and n % o == 0 for n, o in zip(input.shape[-2:], output_size))
