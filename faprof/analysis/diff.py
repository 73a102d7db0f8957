"""Two runs compared row by row for the dashboard's Diff page: ratio of medians and faprof's one significance test.

The pairing, the ratio and the test are the one two-run comparison's (`faprof.analysis.comparison`);
this module words a verdict per row. The test is `faprof.rows.stats.significance` (two-sided
Mann-Whitney U on the kept samples, as `faprof compare`), which assumes nothing about the distribution (timings are skewed: a long right
tail of slow repeats). A pair where either row's timings are unstable (bimodal, drifting, or a CPU
row that missed its stop rule: faprof.rows.stability) is never called significant.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from faprof.analysis import comparison
from faprof.model import schema
from faprof.rows import stats

SIGNIFICANCE_LEVEL = stats.SIGNIFICANCE_ALPHA
"""The Diff page flags a change as significant when the two-sided p-value is below 5%."""

MIN_SAMPLES_FOR_TEST = 5
"""Fewer kept samples than this on either side: no p-value (the normal approximation of U is poor
and one outlier decides the result)."""

UNSTABLE_VERDICT = "not tested: unstable timings"
"""Verdict of a pair where either row's timings are unstable (faprof.rows.stability)."""


def _verdict(r: dict[str, Any], alpha: float) -> tuple[float, float, str]:
    """(ratio B/A, p-value, verdict in words) of one merged row."""
    ta, tb = r.get("status_a") in schema.TIMED, r.get("status_b") in schema.TIMED
    ratio = comparison.median_ratio(r.get("median_ms_a"), r.get("median_ms_b")) if ta and tb else math.nan
    if r["_merge"] == "left_only":
        return ratio, math.nan, "only in A"
    if r["_merge"] == "right_only":
        return ratio, math.nan, "only in B"
    if not (ta and tb):
        return ratio, math.nan, f"not comparable ({r.get('status_a')} / {r.get('status_b')})"
    p, _ = comparison.mann_whitney(r.get("samples_ms_a"), r.get("samples_ms_b"), alpha, MIN_SAMPLES_FOR_TEST)
    sides = [s for s in ("A", "B") if comparison.is_unstable(r.get(f"unstable_{s.lower()}"))]
    if sides:
        return ratio, p, f"{UNSTABLE_VERDICT} ({' and '.join(sides)})"
    if math.isnan(p):
        return ratio, p, "too few samples to test"
    if p < alpha:
        return ratio, p, "B slower" if ratio > 1 else "B faster"
    return ratio, p, "no significant change"


def diff_runs(a: pd.DataFrame, b: pd.DataFrame, alpha: float = SIGNIFICANCE_LEVEL) -> pd.DataFrame:
    """Two runs compared row by row, matched on (variant, shape_id).

    Args:
        a, b: measurement rows of run A (the reference) and run B.
        alpha: significance level of the Mann-Whitney test on the kept samples (faprof.stats.significance).

    Returns:
        One row per (variant, shape_id) in either run: both statuses and medians, `ratio` = B's
        median / A's (above 1: B is slower), `change_pct`, the test's `p_value`, `significant`
        (p < alpha, never for a pair with unstable timings), `unstable_a`/`unstable_b`, and a
        `verdict` in words.
    """
    m = comparison.pair(a, b, ["problem", "status", "median_ms", "n", "unstable", "samples_ms"])
    if m.empty:
        return pd.DataFrame()
    m["problem"] = m["problem_a"].fillna(m["problem_b"]) if "problem_a" in m else m["shape_id"]
    ratios, p_values, verdicts = zip(*[_verdict(r, alpha) for r in m.to_dict("records")], strict=True)
    m["ratio"] = list(ratios)
    m["change_pct"] = (m["ratio"] - 1.0) * 100.0
    m["p_value"] = list(p_values)
    m["verdict"] = list(verdicts)
    m["significant"] = [v in ("B slower", "B faster") for v in verdicts]
    out_cols = ["variant", "problem", "shape_id", "status_a", "status_b", "median_ms_a", "median_ms_b",
                "n_a", "n_b", "unstable_a", "unstable_b", "ratio", "change_pct", "p_value", "significant", "verdict"]
    m["_compared"] = m["ratio"].isna()
    m = m.sort_values(["_compared", "variant", "problem"], ignore_index=True)
    return m[[c for c in out_cols if c in m]]
