"""diagnose(): every rule over every call, ranked into one primary cause and secondary findings;
summarize(): one row per (variant, cause) across shapes."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from faprof.advisor.evidence import Call, calls_from, ok, tables_from
from faprof.advisor.findings import KINDS, Finding
from faprof.advisor.rules_call import CALL_RULES, CALL_RULES_FIRST, merge_ncu_rules
from faprof.advisor.rules_kernel import KERNEL_RULES, Context
from faprof.advisor.thresholds import value as T

#: Columns of diagnose()'s table, in order.
DIAG_COLUMNS = ("variant", "shape_id", "dtype", "group", "rank", "primary", "cause", "title", "kind", "kernel",
                "estimated_gain_pct", "evidence", "fix", "rule")

#: Columns of summarize()'s table, in order.
SUMMARY_COLUMNS = ("variant", "dtype", "group", "cause", "title", "kind", "primary_shapes", "shapes", "n_shapes",
                   "max_gain_pct", "median_gain_pct", "evidence", "fix")


def _findings_for(call: Call, ctx: Context) -> list[Finding]:
    ctx.split_launches = set()
    found: list[Finding] = []
    for crule in CALL_RULES_FIRST:
        found += crule(call, ctx)
    for lz in call.launches:
        for krule in KERNEL_RULES:
            f = krule(lz, call, ctx)
            if f is not None:
                found.append(f)
    for crule in CALL_RULES:
        found += crule(call, ctx)
    found += merge_ncu_rules(call, found)
    keep = []
    for f in found:
        if ok(f.gain):
            if f.gain >= T("MIN_GAIN") or f.kind == "correctness":
                keep.append(f)
        elif f.kind in ("correctness", "note", "defect", "limit"):  # a cause whose size cannot be estimated
            keep.append(f)
    return keep


def _rank(found: list[Finding]) -> list[tuple[Finding, bool]]:
    """The primary finding first, then the rest: causes by gain, positions, ncu rules, notes."""

    def gain(f: Finding) -> float:
        return f.gain if ok(f.gain) else -1.0

    primary: Finding | None = next((f for f in found if f.kind == "correctness"), None)
    if primary is None:
        causes = [f for f in found if f.kind in ("defect", "limit") and ok(f.gain) and f.gain >= T("PRIMARY_MIN_GAIN")]
        positions = [f for f in found if f.kind == "position"]
        pool = causes or positions
        primary = max(pool, key=gain) if pool else None
    order = {k: i for i, k in enumerate(KINDS)}
    tier = {"correctness": 0, "defect": 1, "limit": 1, "position": 2, "ncu": 3, "note": 4}
    rest = sorted((f for f in found if f is not primary), key=lambda f: (tier.get(f.kind, 5), -gain(f), order.get(f.kind, 9)))
    return ([(primary, True)] if primary is not None else []) + [(f, False) for f in rest]


def diagnose(source: Any) -> pd.DataFrame:
    """The ranked diagnosis of every (variant, shape) in a bundle.

    Args:
        source: a faprof Bundle, or a mapping {table name: DataFrame} with any of measurements,
            ncu_summary, ncu_metrics, stalls, roofline, nsys_summary, nsys_kernels, ncu_rules (each
            optional), plus optionally 'env' (the manifest's environment: gpu_name for peaks).

    Returns:
        One row per finding (DIAG_COLUMNS): rank 1 is the primary finding of its (variant, shape)
        (`primary` True) unless no finding qualifies; estimated_gain_pct is the share of the call's
        time the cause is estimated to explain (NaN for notes and unestimable ones); evidence quotes
        the figures; `rule` names the rule function (or `ncu:<rule>` for Nsight Compute's own).
    """
    tables = tables_from(source)
    ctx = Context(env=dict(tables.env))
    rows: list[dict[str, Any]] = []
    for call in calls_from(tables):
        status = call.measurement.get("status")
        if status not in (None, "ok", "wrong"):
            continue
        for rank, (f, is_primary) in enumerate(_rank(_findings_for(call, ctx)), start=1):
            rows.append({
                "variant": f.variant, "shape_id": f.shape_id, "dtype": call.dtype,
                "group": call.measurement.get("group"), "rank": rank, "primary": is_primary, "cause": f.cause,
                "title": f.title, "kind": f.kind, "kernel": f.kernel,
                "estimated_gain_pct": 100 * f.gain if ok(f.gain) else math.nan,
                "evidence": f.evidence, "fix": f.fix, "rule": f.rule,
            })
    out = pd.DataFrame(rows, columns=list(DIAG_COLUMNS))
    out["rank"] = out["rank"].astype("int64")
    out["primary"] = out["primary"].astype(bool)
    return out


def summarize(diag: pd.DataFrame) -> pd.DataFrame:
    """One row per (dtype, variant, cause) across shapes: the shapes it holds for and those where it
    is primary, its largest and median estimated gain, and the evidence of its largest-gain shape.

    Rows are ordered by dtype, variant, then causes that are primary somewhere (most shapes first),
    then by the largest gain; notes last."""
    if diag.empty:
        return pd.DataFrame(columns=list(SUMMARY_COLUMNS))
    rows = []
    d = diag.assign(_dtype=diag["dtype"].fillna(""))
    for (_dt, variant, cause, title), g in d.groupby(["_dtype", "variant", "cause", "title"], sort=False, dropna=False):
        g = g.sort_values("estimated_gain_pct", ascending=False, na_position="last")
        best = g.iloc[0]
        shapes = list(dict.fromkeys(g["shape_id"]))
        prim = list(dict.fromkeys(g[g["primary"]]["shape_id"]))
        rows.append({
            "variant": variant, "dtype": ", ".join(sorted({str(d) for d in g["dtype"].dropna()})) or None,
            "group": ", ".join(sorted({str(d) for d in g["group"].dropna()})) or None,
            "cause": cause, "title": title, "kind": best["kind"],
            "primary_shapes": ", ".join(prim), "shapes": ", ".join(shapes), "n_shapes": len(shapes),
            "max_gain_pct": g["estimated_gain_pct"].max(), "median_gain_pct": g["estimated_gain_pct"].median(),
            "evidence": (f"{best['shape_id']}: " if len(shapes) > 1 else "") + str(best["evidence"]),
            "fix": best["fix"], "_n_primary": len(prim), "_tier": 1 if best["kind"] == "note" else 0,
        })
    out = pd.DataFrame(rows)
    dorder = list(dict.fromkeys(d["_dtype"]))
    vorder = list(dict.fromkeys(diag["variant"]))
    out["_d"] = out["dtype"].fillna("").map({v: i for i, v in enumerate(dorder)})
    out["_v"] = out["variant"].map({v: i for i, v in enumerate(vorder)})
    out = out.sort_values(["_d", "_v", "_tier", "_n_primary", "max_gain_pct"],
                          ascending=[True, True, True, False, False], na_position="last")
    return out[list(SUMMARY_COLUMNS)].reset_index(drop=True)


def primary_causes(diag: pd.DataFrame) -> pd.DataFrame:
    """(variant, shape_id, cause, estimated_gain_pct) of each primary finding."""
    p = diag[diag["primary"]] if not diag.empty else diag
    return p[["variant", "shape_id", "cause", "estimated_gain_pct"]].reset_index(drop=True)
