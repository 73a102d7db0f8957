"""Analysis of measurement tables: throughput, % of peak, bandwidth, speedups, scaling.

Each function takes a DataFrame (a bundle's measurements, or several merged) and returns a new
one; nothing here re-runs a kernel. The CLI, the reports and the app all call these.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from faprof.model.schema import STATUSES, TIMED  # noqa: F401  (one home: model.schema)
from faprof.rows.derive import bandwidth_for, derive, peak_clock_for, peak_for  # noqa: F401  (one home: rows.derive)


def with_speedups(df: pd.DataFrame, baseline: str, group_baselines: dict[str, str] | None = None) -> pd.DataFrame:
    """Add `baseline` (the variant each row is compared with), `baseline_ms` and `speedup` =
    baseline median / row median, per (run, shape_id, GPU model); >1 means faster than the baseline.

    `group_baselines` maps a group name to its own baseline (rows of other groups use `baseline`).
    Only timed rows of the baseline count; rows without a timed baseline get NaN.
    """
    if df.empty:
        return df.assign(speedup=pd.Series(dtype=float))
    keys = ["shape_id"] + (["run_id"] if "run_id" in df.columns else [])
    if "gpu_name" in df.columns and df["gpu_name"].notna().any():
        keys.append("gpu_name")  # a bundle of several GPU models compares each model's rows with its own baseline
    out = df.drop(columns=[c for c in ("baseline", "baseline_ms", "speedup") if c in df.columns])
    groups = out["group"] if "group" in out.columns else pd.Series("", index=out.index)
    out["baseline"] = [(group_baselines or {}).get(g, baseline) for g in groups]
    base = out[out["status"].isin(TIMED)][[*keys, "variant", "median_ms"]]
    base = base.rename(columns={"variant": "baseline", "median_ms": "baseline_ms"})
    out = out.merge(base, on=[*keys, "baseline"], how="left")
    out["speedup"] = out["baseline_ms"] / out["median_ms"]
    out.loc[~out["status"].isin(TIMED), "speedup"] = float("nan")
    return out


def baselines_of(manifest: dict[str, Any]) -> tuple[str, dict[str, str]]:
    """(the scenario's baseline, {group: baseline} for groups with their own) from a bundle manifest."""
    scen = manifest.get("scenario", {})
    default = scen.get("baseline", "")
    groups = {}
    for i, g in enumerate((scen.get("raw") or {}).get("groups", []) or []):
        # unnamed groups are called "groups[i]", as scenarios._group names them
        if isinstance(g, dict) and g.get("baseline"):
            groups[g.get("name", f"groups[{i}]")] = g["baseline"]
    return default, groups


def speedups_for(bundle_measurements: pd.DataFrame, manifest: dict[str, Any]) -> pd.DataFrame:
    """with_speedups using the baselines the bundle's scenario names."""
    default, groups = baselines_of(manifest)
    return with_speedups(bundle_measurements, default, groups)


def ranking(df: pd.DataFrame) -> pd.DataFrame:
    """Variants ranked by median TFLOP/s over the timed rows (for README-style tables)."""
    t = df[df["status"].isin(TIMED)]
    if t.empty:
        return pd.DataFrame()
    agg = t.groupby("variant").agg(
        rows=("shape_id", "count"), median_tflops=("tflops", "median"), max_tflops=("tflops", "max"),
        median_pct_peak=("pct_peak", "median") if "pct_peak" in t else ("tflops", "size"),
        median_speedup=("speedup", "median") if "speedup" in t else ("tflops", "size"),
        wrong=("status", lambda s: int((s == "wrong").sum())),
    )
    return agg.sort_values("median_tflops", ascending=False).reset_index()


def scaling(df: pd.DataFrame, variant: str, axis: str = "B") -> pd.DataFrame:
    """Strong/weak scaling as in report 002: throughput over an axis relative to its smallest value.

    For each group of rows that differ only in `axis`, speedup vs smallest = (work/time) ratio and
    efficiency = speedup / (axis ratio).
    """
    t = df[(df["variant"] == variant) & df["status"].isin(TIMED)].copy()
    if t.empty:
        return pd.DataFrame()
    others = [c for c in ("B", "H", "Sq", "Sk", "D", "dtype", "causal", "direction") if c != axis]
    rows = []
    for _, g in t.groupby(others):
        if len(g) < 2:
            continue
        g = g.sort_values(axis)
        base = g.iloc[0]
        # A row measured once carries the first scenario group that names its shape, so a scaling
        # series can span groups; it is labelled by the group most of its rows came from.
        label = g["group"].fillna("").value_counts().idxmax() if "group" in g else ""
        for _, r in g.iterrows():
            ratio = r[axis] / base[axis]
            thr_speedup = (r["flops"] / r["median_ms"]) / (base["flops"] / base["median_ms"])
            rows.append({"group": label, **{c: r[c] for c in others}, axis: r[axis], "median_ms": r["median_ms"],
                         "throughput_vs_smallest": thr_speedup, "efficiency_pct": 100 * thr_speedup / ratio})
    return pd.DataFrame(rows)


def fwd_bwd_table(df: pd.DataFrame, variant: str) -> pd.DataFrame:
    """Report 002's 'Forward | Backward | ratio | total' table from fwd and bwd rows of one variant,
    with each direction's TFLOP/s where the rows carry it."""
    t = df[(df["variant"] == variant) & df["status"].isin(TIMED)]
    if t.empty:
        return pd.DataFrame()
    cols = ["B", "H", "Sq", "Sk", "D", "dtype", "causal"]
    vals = ["median_ms", *(["tflops"] if "tflops" in t else [])]

    def part(direction: str, tag: str) -> pd.DataFrame:
        return t[t["direction"] == direction][[*cols, *vals]].rename(
            columns={"median_ms": f"{tag}_ms", "tflops": f"{tag}_tflops"})

    out = part("fwd", "fwd").merge(part("bwd", "bwd"), on=cols, how="inner").merge(part("fwd_bwd", "fwd_bwd"), on=cols, how="left")
    out["bwd_over_fwd"] = out["bwd_ms"] / out["fwd_ms"]
    return out


def fwd_bwd_tables(df: pd.DataFrame) -> pd.DataFrame:
    """fwd_bwd_table for every variant that has both forward and backward timings, one frame with a
    `variant` column first."""
    if df.empty or "direction" not in df:
        return pd.DataFrame()
    t = df[df["status"].isin(TIMED)]
    out = []
    for v in sorted(t["variant"].unique()):
        if {"fwd", "bwd"} <= set(t.loc[t["variant"] == v, "direction"]):
            fb = fwd_bwd_table(t, v)
            if not fb.empty:
                out.append(fb.assign(variant=v))
    if not out:
        return pd.DataFrame()
    res = pd.concat(out, ignore_index=True)
    return res[["variant", *[c for c in res.columns if c != "variant"]]]


def memory_table(df: pd.DataFrame, standard: str = "torch_standard", flash: str = "sdpa_flash") -> pd.DataFrame:
    """Report 002's memory table: measured peak extra memory of a standard and a flash variant per
    sequence length, beside the analytic footprints, and the reduction factor."""
    t = df[df["status"].isin(TIMED) & df["variant"].isin([standard, flash])]
    if t.empty or "extra_mem_bytes" not in t:
        return pd.DataFrame()
    cols = ["B", "H", "Sq", "Sk", "D", "dtype", "causal", "direction"]
    piv = t.pivot_table(index=cols, columns="variant", values="extra_mem_bytes", aggfunc="first").reset_index()
    an = t.drop_duplicates(cols)[[*cols, "footprint_standard_bytes", "footprint_flash_bytes"]]
    out = piv.merge(an, on=cols, how="left")
    if standard in out and flash in out:
        out["measured_reduction"] = out[standard] / out[flash]
    out["analytic_reduction"] = out["footprint_standard_bytes"] / out["footprint_flash_bytes"]
    return out
