"""One colour per variant for every chart of a session (the dashboard's pages, a report's charts).

A variant's colour follows from the set of variant names being drawn (all loaded runs, or the run a
report covers), never from the order a chart meets them, so neighbouring charts agree.
"""

from __future__ import annotations

from collections.abc import Iterable

#: 24 distinguishable colours (d3's category10, then its paired lighter and darker tones).
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf", "#393b79", "#ad494a", "#637939", "#8c6d31", "#7b4173", "#3182bd", "#e6550d", "#31a354",
           "#756bb1", "#636363", "#843c39", "#bd9e39", "#6baed6", "#fd8d3c")

#: faprof's variants in the order of the progression: they take the palette's first colours in this order.
KNOWN_ORDER = ("cpu_ref", "torch_standard", "sdpa_math", "sdpa_efficient", "sdpa_flash", "sdpa_cudnn", "sdpa_auto",
               "naive", "fa1", "fa2", "fa2_det", "fa2_wmma", "fa2_mma", "fa2_mma_det", "fa3_wgmma_a", "fa3_wgmma_b",
               "fa3_wgmma_c", "fa3_wgmma_d", "fa3_wgmma_e")


def variant_colors(names: Iterable[object]) -> dict[str, str]:
    """A colour for each variant name, distinct for up to 24 variants: faprof's variants first in the order
    of the progression (KNOWN_ORDER), then the others (user kernels) by name; beyond 24, colours repeat.

    Args:
        names: every variant name the session (or report) draws; duplicates and non-strings are ignored.

    Returns:
        name -> '#rrggbb'.
    """
    seen = {n for n in names if isinstance(n, str) and n}
    ordered = [v for v in KNOWN_ORDER if v in seen] + sorted(seen - set(KNOWN_ORDER))
    return {v: PALETTE[i % len(PALETTE)] for i, v in enumerate(ordered)}
