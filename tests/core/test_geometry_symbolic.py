"""Symbolic sizes through :mod:`mmseg_cann.core.geometry`: the size-independent
decisions against brute force over sizes, and the symbolic output sizes (``torch.export``
with dynamic height/width, sizes arrive as ``SymInt``) evaluated at other sizes against
the concrete rules."""
from __future__ import annotations

import math

import torch

from mmseg_cann.core import geometry as geo


def test_ceil_mode_may_drop_is_exactly_the_size_dependent_case():
    for k in range(1, 6):
        for s in range(1, 5):
            for p in range(0, k // 2 + 1):
                for d in (1, 2):
                    ek = geo.effective_kernel(k, d)
                    differs = False
                    for n in range(max(1, ek - 2 * p), 80):
                        onnx_ceil = -(-(n + 2 * p - ek) // s) + 1
                        torch_out = geo.pool_output_size(n, k, s, p, d, True)
                        differs |= onnx_ceil != torch_out
                    assert geo.ceil_mode_may_drop(k, s, p, d) == differs, (k, s, p, d)


def test_scale_keeps_size_matches_brute_force():
    for scale in (0.3, 0.5, 0.99, 1.0, 1.01, 1.2, 1.4999, 1.5, 1.75, 2.0, 3.0):
        kept = [math.floor(n * scale) == n for n in range(2, 400)]
        want = True if all(kept) else False if not any(kept) else None
        assert geo.scale_keeps_size(scale, 2) is want, scale


class SizesOf(torch.nn.Module):
    """Returns an empty tensor shaped by the geometry's output sizes for ``x``'s (symbolic,
    when exported with dynamic shapes) spatial size, one per pooling / upsample setting."""

    def __init__(self, pools, upsamples):
        super().__init__()
        self.pools, self.upsamples = pools, upsamples

    def forward(self, x):
        hw = x.shape[-2:]
        outs = [x.new_empty(geo.pool_spec(hw, a).out_size) for a in self.pools]
        outs += [x.new_empty(geo.upsample_spec(hw, a).out_size) for a in self.upsamples]
        return tuple(outs)


POOLS = [geo.check_pool_args(2, 2, 1, ceil_mode=True),      # drop depends on the size
         geo.check_pool_args(3, 2, 1, ceil_mode=True),      # never drops
         geo.check_pool_args(5, 3, 2, 2, ceil_mode=False),  # dilated
         geo.check_pool_args(1, 3, 'same'),                 # kernel < stride: max(., 0)
         geo.check_pool_args(4, 3, 'same_lower')]
UPSAMPLES = [geo.check_upsample_args(scale_factor=s, mode='bilinear')
             for s in (2, 0.5, 1.5, (2.5, 0.6))]


def test_symbolic_sizes_are_exact_at_every_size():
    """The geometry's symbolic sizes (torch.export, dynamic H/W) evaluate to the concrete
    rule at sizes other than the traced one, and no size is pinned to the example."""
    model = SizesOf(POOLS, UPSAMPLES)
    auto = torch.export.Dim.AUTO
    program = torch.export.export(model, (torch.empty(1, 1, 11, 13),),
                                  dynamic_shapes=({2: auto, 3: auto},))
    assert all(r.lower != r.upper for r in program.range_constraints.values())
    run = program.module()
    for hw in [(12, 14), (16, 16), (17, 20), (24, 31), (19, 40), (30, 12)]:
        got = [tuple(t.shape) for t in run(torch.empty((1, 1) + hw))]
        want = [geo.pool_spec(hw, a).out_size for a in POOLS]
        want += [geo.upsample_spec(hw, a).out_size for a in UPSAMPLES]
        assert got == want, hw
