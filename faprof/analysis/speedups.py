"""Analysis of measurement tables: throughput, % of peak, bandwidth, speedups, scaling.

Each function takes a DataFrame (a bundle's measurements, or several merged) and returns a new
one; nothing here re-runs a kernel. The CLI, the reports and the app all call these.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from faprof.model.schema import TIMED


def with_speedups(df: pd.DataFrame, baseline: str, group_baselines: dict[str, str] | None = None,
                  fallbacks: dict[str, list[str]] | None = None) -> pd.DataFrame:
    """Add `baseline` (the variant each row is compared with), `baseline_ms` and `speedup` =
    baseline median / row median, per (run, shape_id, GPU model); >1 means faster than the baseline.

    `group_baselines` maps a group name to its own baseline (rows of other groups use `baseline`).
    `fallbacks` maps a group name to the baselines after its own, in order ("" for every group: the
    scenario's baseline and fallbacks, `baseline_chains`): where a group's baseline was timed on none of
    its shapes in a run on a GPU model (an optional library not installed there), its rows are compared
    with the first of these that was, `baseline_declared` names the one the scenario declared and
    `baseline_note` says why they differ ('' where they do not). Only timed rows of the baseline count;
    rows without a timed baseline get NaN.
    """
    if df.empty:
        return df.assign(speedup=pd.Series(dtype=float))
    keys = ["shape_id"] + (["run_id"] if "run_id" in df.columns else [])
    if "gpu_name" in df.columns and df["gpu_name"].notna().any():
        keys.append("gpu_name")  # a bundle of several GPU models compares each model's rows with its own baseline
    out = df.drop(columns=[c for c in ("baseline", "baseline_ms", "speedup", "baseline_declared", "baseline_note")
                           if c in df.columns])
    groups = out["group"].fillna("") if "group" in out.columns else pd.Series("", index=out.index)
    declared = [(group_baselines or {}).get(g, baseline) for g in groups]
    out["baseline_declared"] = declared
    out["baseline"] = declared
    out["baseline_note"] = ""
    if fallbacks:
        _fall_back(out, groups, fallbacks, [k for k in keys if k != "shape_id"])
    base = out[out["status"].isin(TIMED)][[*keys, "variant", "median_ms"]]
    base = base.rename(columns={"variant": "baseline", "median_ms": "baseline_ms"})
    out = out.merge(base, on=[*keys, "baseline"], how="left")
    out["speedup"] = out["baseline_ms"] / out["median_ms"]
    out.loc[~out["status"].isin(TIMED), "speedup"] = float("nan")
    return out


def _fall_back(out: pd.DataFrame, groups: pd.Series, fallbacks: dict[str, list[str]], keys: list[str]) -> None:
    """Set `baseline` and `baseline_note` in place where a (run, GPU model, group)'s declared baseline has no
    timed row: the first of its fallbacks that has one (see with_speedups)."""
    timed_rows = out["status"].isin(TIMED) & (pd.to_numeric(out["median_ms"], errors="coerce") > 0)
    for _, part in out.assign(_g=groups).groupby([*keys, "_g"], sort=False, dropna=False):
        declared = str(part["baseline_declared"].iloc[0])
        g = str(part["_g"].iloc[0])
        ran = set(part.loc[timed_rows[part.index], "variant"])
        if declared in ran:
            continue
        chain = list(dict.fromkeys([*fallbacks.get(g, []), *fallbacks.get("", [])]))
        pick = next((v for v in chain if v != declared and v in ran), None)
        if pick is None:
            continue
        mine = part[part["variant"] == declared]
        if mine.empty:
            why = "was not among the variants run"
        else:
            r = mine.iloc[0]
            reason = str(r.get("reason") or "").strip() if "reason" in mine else ""
            why = f"was {r['status']} on every shape" + (f" ({reason})" if reason else "")
        where = f"group {g}: " if g else ""
        out.loc[part.index, "baseline"] = pick
        out.loc[part.index, "baseline_note"] = (f"{where}the baseline {declared} {why}; speedups are over the next "
                                                f"baseline, {pick}")


def baseline_chains(manifest: dict[str, Any]) -> dict[str, list[str]]:
    """The fallback baselines a bundle's scenario names, for with_speedups' `fallbacks`: {group: its own
    fallbacks}, and "" (tried after a group's own, for every group): the scenario's baseline, then its fallbacks."""
    scen = manifest.get("scenario", {})
    raw = scen.get("raw") or {}

    def names(x: Any) -> list[str]:
        return [x] if isinstance(x, str) else [str(v) for v in x] if isinstance(x, list) else []

    default = str(scen.get("baseline", "") or "")
    out = {"": [b for b in [default, *names(raw.get("baseline_fallback"))] if b]}
    for i, g in enumerate(raw.get("groups", []) or []):
        if isinstance(g, dict):
            out[g.get("name", f"groups[{i}]")] = names(g.get("baseline_fallback"))
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
    """with_speedups using the baselines (and fallback baselines) the bundle's scenario names."""
    default, groups = baselines_of(manifest)
    return with_speedups(bundle_measurements, default, groups, baseline_chains(manifest))


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
