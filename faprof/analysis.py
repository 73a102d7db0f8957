"""Analysis of measurement tables: throughput, % of peak, bandwidth, speedups, scaling.

Each function takes a DataFrame (a bundle's measurements, or several merged) and returns a new
one; nothing here re-runs a kernel. The CLI, the reports and the app all call these.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from faprof.problem import AttentionProblem

#: Row statuses, in the order tables sort them.
STATUSES = ("ok", "wrong", "failed", "unsupported", "skipped")

#: Statuses that carry a timing (a wrong variant is still timed, and flagged).
TIMED = ("ok", "wrong")


def peak_for(env: dict[str, Any], dtype: str, compute: str) -> tuple[float | None, str]:
    """The peak TFLOP/s used for '% of peak' on this run's GPU, and a label saying which one."""
    from faprof import gpus

    name = env.get("gpu_name")
    if not name:
        return None, "no GPU"
    spec = gpus.lookup(name)
    if spec is None:
        return None, "unknown GPU: measured figures only"
    return gpus.peak_tflops(spec, dtype, compute)


def peak_clock_for(env: dict[str, Any], compute: str = "cuda_core", dtype: str = "fp32") -> float | None:
    """The SM clock the GPU database's peak for (compute, dtype) assumes, if known."""
    from faprof import gpus

    name = env.get("gpu_name")
    spec = gpus.lookup(name) if name else None
    return spec.peak_clock_mhz(compute, dtype) if spec is not None and spec.known else None


def bandwidth_for(env: dict[str, Any]) -> float | None:
    from faprof import gpus

    name = env.get("gpu_name")
    spec = gpus.lookup(name) if name else None
    return getattr(spec, "mem_bw_gbs", None) if spec else None


def derive(problem: AttentionProblem, variant, row: dict[str, Any], env: dict[str, Any]) -> dict[str, Any]:
    """Work counts and rates for one measured row: FLOPs, TFLOP/s, GB/s, % of peak, footprints."""
    out: dict[str, Any] = {
        "flops": problem.flops(),
        "min_bytes": problem.min_bytes(),
        "footprint_standard_bytes": problem.footprint_bytes("standard"),
        "footprint_flash_bytes": problem.footprint_bytes("flash"),
        "tokens": problem.tokens(),
    }
    ms = row.get("median_ms")
    if ms is None or not isinstance(ms, int | float) or math.isnan(ms) or ms <= 0:
        return out
    out["tflops"] = problem.flops() / (ms * 1e-3) / 1e12
    out["gbps"] = problem.min_bytes() / (ms * 1e-3) / 1e9
    out["tokens_per_s"] = problem.tokens() / (ms * 1e-3)
    if row.get("device") == "cuda":
        peak, label = peak_for(env, problem.dtype, variant.compute)
        boost = peak_clock_for(env, variant.compute, problem.dtype)
        if boost:
            label = f"{label} at {boost:.0f} MHz"
        out["peak_tflops"], out["peak_label"], out["peak_clock_mhz"] = peak, label, boost
        if peak:
            out["pct_peak"] = 100.0 * out["tflops"] / peak
            clock = row.get("sm_clock_mhz")
            if boost and isinstance(clock, int | float) and clock > 0 and not math.isnan(clock):
                # the datasheet peak scales with the clock: what this row could reach at the clock it ran at
                out["pct_peak_at_clock"] = 100.0 * out["tflops"] / (peak * clock / boost)
        bw = bandwidth_for(env)
        if bw:
            out["mem_bw_gbs"] = bw
            out["pct_bw"] = 100.0 * out["gbps"] / bw
        ceil = (env.get("ceilings") or {})
        key = f"matmul_{problem.dtype}_tflops" if variant.compute == "tensor" and problem.dtype in ("fp16", "bf16") else "matmul_fp32_tflops"
        if variant.compute == "tensor" and problem.dtype == "fp32" and ceil.get("matmul_tf32_tflops"):
            key = "matmul_tf32_tflops"  # fp32 attention on tensor cores runs as (emulated) TF32
        if ceil.get(key):
            out["pct_measured_ceiling"] = 100.0 * out["tflops"] / ceil[key]
            out["measured_ceiling_tflops"] = ceil[key]
    return out


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


# ------------------------------------------------------------------------------ the advisor
def advise(measurements: pd.DataFrame, ncu_summary: pd.DataFrame | None = None, stalls: pd.DataFrame | None = None,
           nsys_summary: pd.DataFrame | None = None) -> pd.DataFrame:
    """Deprecated shim for callers of the old advisor: faprof.advisor's diagnosis aggregated across
    shapes, in the old columns (variant, dtype, shape_id = the shapes, kernel, category, finding, suggestion).

    Use `faprof.advisor.diagnose(bundle)` and `faprof.advisor.summarize(...)`: they also read
    ncu_metrics, roofline and ncu_rules, which this signature cannot pass.
    """
    from faprof import advisor

    tables = {"measurements": measurements, "ncu_summary": ncu_summary, "stalls": stalls, "nsys_summary": nsys_summary}
    summary = advisor.summarize(advisor.diagnose({k: v for k, v in tables.items() if v is not None}))
    return pd.DataFrame({"variant": summary["variant"], "dtype": summary["dtype"], "shape_id": summary["shapes"], "kernel": "",
                         "category": summary["title"], "finding": summary["evidence"], "suggestion": summary["fix"]})
