"""``fuse_resize_conv``: find the sites of :mod:`.resize_conv` (1x1) and :mod:`.resize_kxk`
(UPerHead's bottleneck) in a model and bind their rewritten methods."""
from __future__ import annotations

import weakref
from typing import List

from torch import nn

from . import resize_conv, resize_kxk
from ._common import FusionReport, Site, _bind


def all_sites() -> List[Site]:
    """Every site :func:`fuse_resize_conv` rewrites: the 1x1 ones, then the kxk ones."""
    return resize_conv.SITES + resize_kxk.SITES


def fuse_resize_conv(model: nn.Module, report: FusionReport = None) -> FusionReport:
    """Move the per-pixel linear layer after a resize below it at every eligible site of
    ``model`` (see the module doc); a method bound on each rewritten instance, removed by
    :func:`mmseg_cann.fusion.unfuse_model`. Idempotent.

    Args:
        model: any ``nn.Module`` (an mmseg segmentor, head, neck or backbone).
        report: a :class:`FusionReport` to add to (a new one by default).

    Returns:
        the report: ``resize_conv`` lists the rewritten sites, ``skipped`` the sites of
        these classes left as they are and why (subclasses, other settings, hooks).
    """
    report = report if report is not None else FusionReport()
    sites = [(s, s.resolve()) for s in all_sites()]
    for path, module in model.named_modules():
        path = path or '<root>'
        for site, cls in sites:
            if not isinstance(module, cls) or (site.present is not None
                                               and not site.present(module)):
                continue
            name = f'{cls.__name__}.{site.layer}'
            if type(module) is not cls:
                report.skipped.append(f'{path} ({name}: {type(module).__name__} is a subclass; '
                                      'only the exact class is rewritten)')
                continue
            reason = site.reason(module)
            if reason is not None:
                report.skipped.append(f'{path} ({name}: {reason})')
                continue
            _bind(module, site.method, site.fused, site.label)
            report.resize_conv.append(f'{path} ({name})')
            report.sites[path] = weakref.ref(module)
    return report
