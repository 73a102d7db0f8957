"""The estimate checked against the fix: for pairs of kernels that differ by one defect (a kernel and its
clean twin), the primary cause's estimated gain against the measured gap to the twin.

The twin *is* the fix applied, so the measured gap T_kernel - T_twin is what fixing the primary cause
would save, if the primary cause is the defect. The estimate is the primary cause's part of the gap's
partition (`faprof.advisor.partition`): the time of the terms it owns, net of what it lets other terms give
back, at most the measured gap. The error is estimate / measured - 1 (0 = exact; below 0 the fix gives more
than the estimate promises); `net_error` is the same before the clip to the gap, above 0 where the cause's
terms interact with others that give time back (`clipped`).
This is the estimated-vs-achieved table of GPA (Zhou et al., "GPA: A GPU Performance Advisor Based on
Instruction Sampling", CGO 2021) for faprof's advisor.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from typing import Any

import pandas as pd

from faprof.advisor.evidence import ok
from faprof.model.values import as_float

#: Columns of estimate_table().
ESTIMATE_COLUMNS = ("variant", "twin", "shape_id", "dtype", "gpu", "ms", "twin_ms", "measured_gap_us", "primary",
                    "expected", "estimated_gain_us", "error", "net_gain_us", "net_error", "clipped", "level", "faster")


def estimate_table(bundle: Any, twins: Mapping[str, str], expected: Mapping[str, str | None] | None = None,
                   diags: Mapping[str, pd.DataFrame] | None = None) -> pd.DataFrame:
    """One row per (kernel, shape) whose twin was timed at the shape: the measured gap, the primary cause
    against the twin and its estimated gain (µs), and the error; `level` (within noise of the twin) and
    `faster` (faster than the twin beyond noise) rows have no gap to explain. `twins`: variant -> its twin (a twin
    mapped to itself is left out); `expected`: variant -> the defect's cause, quoted beside the primary;
    `diags`: diagnose(bundle, against=twin) per twin, when the caller has them."""
    from faprof.advisor.diagnose import diagnose

    meas = bundle.measurements()
    timed = meas[meas["status"] == "ok"].set_index(["variant", "shape_id"])
    diags = dict(diags or {})
    gpu = str(meas["gpu_name"].dropna().iloc[0]) if "gpu_name" in meas and meas["gpu_name"].notna().any() else ""
    rows = []
    for variant, twin in twins.items():
        if variant == twin:
            continue
        if twin not in diags:
            diags[twin] = diagnose(bundle, against=twin)
        d = diags[twin]
        for (v, sid), r in timed.iterrows():
            if v != variant or (twin, sid) not in timed.index:
                continue
            ms, twin_ms = as_float(r["median_ms"]), as_float(timed.loc[(twin, sid), "median_ms"])
            mine = d[(d["variant"] == variant) & (d["shape_id"] == sid)]
            prim = mine[mine["primary"]]
            p = prim.iloc[0] if not prim.empty else None
            est = as_float(p["gap_ms"]) if p is not None and p["unit"] == "gap" else math.nan
            net = as_float(p.get("net_ms")) if p is not None and p["unit"] == "gap" else math.nan
            net = net if ok(net) else est  # a table from before the gain was clipped to the gap
            gap = ms - twin_ms
            rows.append({"variant": variant, "twin": twin, "shape_id": sid, "dtype": r.get("dtype"), "gpu": gpu,
                         "ms": ms, "twin_ms": twin_ms, "measured_gap_us": 1e3 * gap,
                         "primary": p["cause"] if p is not None else None,
                         "expected": (expected or {}).get(variant), "estimated_gain_us": 1e3 * est,
                         "error": est / gap - 1 if ok(est) and gap > 0 else math.nan,
                         # the gain before it was clipped to the gap (its terms interact with others)
                         "net_gain_us": 1e3 * net, "net_error": net / gap - 1 if ok(net) and gap > 0 else math.nan,
                         "clipped": ok(est) and ok(net) and net > est,
                         "level": (level := bool((mine["cause"] == "level").any())),
                         # faster than its twin beyond noise: the "defect" gives time back, there is no gap
                         # to explain (planted_l2_thrash on the H100's causal shape)
                         "faster": not level and gap < 0})
    return pd.DataFrame(rows, columns=list(ESTIMATE_COLUMNS))


def error_summary(table: pd.DataFrame, within: float = 0.25, column: str = "error") -> dict[str, float]:
    """Median and worst |error|, and the share of rows within `within`, over rows with an estimate
    (`column`: 'error', of the gain said, or 'net_error', of the gain before it was clipped to the gap)."""
    errs = [abs(e) for e in table[column] if ok(e)]
    if not errs:
        return {"n": 0, "median_abs_error": math.nan, "worst_abs_error": math.nan, "share_within": math.nan}
    return {"n": len(errs), "median_abs_error": statistics.median(errs), "worst_abs_error": max(errs),
            "share_within": sum(e <= within for e in errs) / len(errs)}
