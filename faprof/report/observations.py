"""Plain-words observations on a run: correctness, how ratios change with size, unstable timings, rows not run.

`notes` are the few lines the first screen keeps; `observations` (trends per baseline) go to the appendix.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from faprof.model import schema
from faprof.report import fmt as f

#: A ratio trend counts as widening/narrowing when the gap (max(s, 1/s)) changes by more than this factor.
TREND_FACTOR = 1.15


def trend_phrase(variant: str, first: float, last: float) -> str:
    """How a variant's speed relative to its baseline changes from the smallest to the largest problem.

    The gap is how far the ratio is from 1 in either direction (max(s, 1/s)): a variant 1.42x as fast
    whose ratio falls to 1.02x has a *shrinking lead*, not a widening gap.
    """
    def words(s: float) -> str:
        return f"{f.ratio(s)} faster" if s >= 1 else f"{f.ratio(1 / s)} slower"

    span = f"{words(first)} → {words(last)}"
    if (first >= 1) != (last >= 1) and max(first, 1 / first) < TREND_FACTOR and max(last, 1 / last) < TREND_FACTOR:
        return f"{variant} stays level ({span})"
    if (first >= 1) != (last >= 1):
        return f"{variant} changes sides ({span})"
    g0, g1 = max(first, 1 / first), max(last, 1 / last)
    if g1 > g0 * TREND_FACTOR:
        change = "'s lead grows" if first >= 1 else "'s gap widens"
    elif g1 < g0 / TREND_FACTOR:
        change = "'s lead shrinks" if first >= 1 else "'s gap narrows"
    else:
        change = " holds steady"
    return f"{variant}{change} ({span})"


def trends(df: pd.DataFrame) -> list[str]:
    """How each variant's speed against its baseline changes from the smallest to the largest problem,
    one sentence per (baseline, dtype, direction); only where the baseline was timed."""
    out: list[str] = []
    t = df[df["status"].isin(schema.TIMED)]
    if "speedup" not in t:
        return out
    bcol = t["baseline"] if "baseline" in t else pd.Series("", index=t.index)
    for (b, dt, dr), gb in t.assign(_b=bcol.fillna("")).groupby(["_b", "dtype", "direction"], sort=False):
        items = []
        for v, g in gb.groupby("variant", sort=False):
            g = g.dropna(subset=["speedup"]).sort_values("flops")
            if v != b and b and len(g) >= 3 and g.iloc[0]["speedup"] > 0 and g.iloc[-1]["speedup"] > 0:
                items.append(trend_phrase(str(v), float(g.iloc[0]["speedup"]), float(g.iloc[-1]["speedup"])))
        if items:
            out.append(f"From the smallest to the largest {dt} {dr} problem, against {b}: " + "; ".join(items) + ".")
    return out


def _not_run(df: pd.DataFrame) -> str:
    """'35 rows not run: 20 unsupported (fa2_wmma, fa2_mma, ...: supports dtypes ...), ...' (every row: appendix)."""
    bad = df[df["status"].isin(("unsupported", "skipped"))]
    if bad.empty:
        return ""
    parts = []
    for (status, why), g in bad.assign(_why=bad["reason"].map(_reason_kind)).groupby(["status", "_why"], sort=False):
        parts.append(f"{len(g)} {status} ({', '.join(dict.fromkeys(g['variant']))}: {f.md(why)})")
    return f"{len(bad)} rows not run: " + "; ".join(parts) + ". Every row: appendix."


def _reason_kind(reason: Any) -> str:
    """A reason without the variant's name, so rows that fail alike count together ('supports dtypes ...')."""
    text = str(reason) if isinstance(reason, str) and reason else "no reason recorded"
    head, _, rest = text.partition(" ")
    return rest if rest.startswith("supports ") and head.replace("_", "").isalnum() else text


def notes(df: pd.DataFrame) -> list[str]:
    """The first screen's notes: wrong and failed rows, correctness overall, unstable timings, rows not run."""
    out: list[str] = []
    for status, word in (("wrong", "gave wrong results"), ("failed", "failed")):
        for v, g in df[df["status"] == status].groupby("variant"):
            reason = g["reason"].dropna().iloc[0] if g["reason"].notna().any() else ""
            out.append(f"**{v} {word}** on {len(g)} problem(s)" + (f" ({f.md(reason)})." if reason else "."))
    ok_all = df[df["status"].isin(["ok", "wrong"])]
    if not ok_all.empty and (ok_all["status"] == "ok").all():
        out.append(f"All {ok_all['variant'].nunique()} variants that ran are within tolerance of the reference "
                   f"(largest max abs error {f.err(ok_all['max_abs_err'].max())}).")
    shaky = ok_all[ok_all["unstable"].fillna(False).astype(bool)] if "unstable" in ok_all else ok_all.iloc[0:0]
    if not shaky.empty:
        by = ", ".join(f"{v} ({n})" for v, n in shaky["variant"].value_counts().items())
        out.append(f"{len(shaky)} row(s) have unstable timings, marked ≈ (bimodal, drifting, or a CPU row past its stop "
                   f"rule; their medians may not repeat, and compare does not test them): {by}. Reasons: appendix.")
    gamed = ok_all[ok_all["timing_flagged"].fillna(False).astype(bool)] if "timing_flagged" in ok_all else ok_all.iloc[0:0]
    if not gamed.empty:
        by = ", ".join(f"{v} ({n})" for v, n in gamed["variant"].value_counts().items())
        out.append(f"{len(gamed)} row(s) have flagged timings, marked ⚑ (GPU work outside the call's own launches, "
                   f"an output cached from or deferred past its inputs, or inputs overwritten; rows that missed work "
                   f"were timed again drained): {by}. Reasons: appendix.")
    nr = _not_run(df)
    if nr:
        out.append(nr)
    return out
