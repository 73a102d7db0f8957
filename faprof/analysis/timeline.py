"""The Nsight Systems timeline of one problem, shaped for a Gantt chart (one lane per variant)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from faprof.analysis.ncu_views import find_column

MAX_TIMELINE_BARS = 4000
"""The timeline draws at most this many kernels; more makes the browser crawl and shows nothing more."""

# ---------------------------------------------------------------------------- Nsight Systems
def timeline(kernels: pd.DataFrame, run_id: str, shape_id: str, iterations: int) -> pd.DataFrame:
    """Kernels of one problem in one run, for a Gantt chart: one lane per variant.

    Times are microseconds from each variant's first kernel in the shown iterations, so variants
    measured one after another line up at zero.

    Args:
        kernels: nsys_kernels (merged). run_id, shape_id: which run and problem.
        iterations: show the first this many recorded calls of each variant.
    """
    if kernels.empty:
        return pd.DataFrame()
    k = kernels[(kernels["run_id"] == run_id) & (kernels["shape_id"] == shape_id)].copy()
    if k.empty:
        return k
    start = find_column(k, ("start_ns", "start"))
    end = find_column(k, ("end_ns", "end"))
    if start is None:
        return pd.DataFrame()
    if "iteration" in k:
        first = k.groupby("variant")["iteration"].transform("min")
        k = k[k["iteration"] < first + iterations]
    k["start_ns_"] = pd.to_numeric(k[start], errors="coerce")
    if "duration_ns" in k:
        k["dur_ns_"] = pd.to_numeric(k["duration_ns"], errors="coerce")
    elif end is not None:
        k["dur_ns_"] = pd.to_numeric(k[end], errors="coerce") - k["start_ns_"]
    else:
        return pd.DataFrame()
    t0 = k.groupby("variant")["start_ns_"].transform("min")
    name = find_column(k, ("kernel_short", "kernel", "name")) or "variant"
    out = pd.DataFrame({
        "variant": k["variant"], "iteration": k.get("iteration"), "kernel": k[name].astype(str),
        "start_us": (k["start_ns_"] - t0) / 1e3, "duration_us": k["dur_ns_"] / 1e3,
        "launch_latency_us": pd.to_numeric(k["launch_latency_ns"], errors="coerce") / 1e3
        if "launch_latency_ns" in k else np.nan,
    }).sort_values(["variant", "start_us"]).head(MAX_TIMELINE_BARS)
    return out.reset_index(drop=True)


