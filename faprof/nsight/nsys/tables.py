"""nsys' analyses, one function per question, each returning a DataFrame; `summarize` joins them into nsys_summary.

Input: nsys_kernels (`faprof.nsight.nsys.read.attribute_kernels`). Times in nsys_kernels are
nanoseconds on nsys' session clock (`*_ns`); the summary is in microseconds (`*_us`) except the two
figures compared with the harness (`harness_ms`, `nsys_gpu_ms`). Nothing here plots.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from faprof.model.schema import TIMED
from faprof.rows.intervals import busy_ns

#: Columns of nsys_summary.parquet, in order.
SUMMARY_COLUMNS: tuple[str, ...] = (
    "variant", "shape_id", "status", "reason", "iterations",
    "kernels_per_call", "kernels_per_call_min", "kernels_per_call_max", "kernel_names",
    "gpu_us", "gpu_us_min", "wall_us", "host_us", "busy_frac",
    "launch_us", "launch_us_max", "first_launch_us", "idle_us", "gap_us",
    "harness_ms", "nsys_gpu_ms", "harness_over_gpu", "harness_over_wall",
)


_CALL = ["variant", "shape_id", "iteration"]
_PAIR = ["variant", "shape_id"]


def per_call(kernels: pd.DataFrame) -> pd.DataFrame:
    """One row per call (variant, shape_id, iteration).

    Columns: kernels (launched by the call), gpu_ns (GPU busy time: the union of the kernels' intervals,
    the sum of their durations unless they overlap, as with programmatic dependent launch), wall_ns (first launch
    call's start to the last kernel's end), host_ns (the call's `iter<i>` range: host time),
    first_launch_ns (first launch call's start to the first kernel's start), idle_ns (GPU idle
    between the call's consecutive kernels, summed; overlapping kernels count 0).
    """
    cols = [*_CALL, "kernels", "gpu_ns", "wall_ns", "host_ns", "first_launch_ns", "idle_ns"]
    if kernels.empty:
        return pd.DataFrame(columns=cols)
    gaps = idle_gaps(kernels)
    idle = gaps.groupby(_CALL)["gap_ns"].sum() if not gaps.empty else pd.Series(dtype="float64")
    g = kernels.sort_values([*_CALL, "start_ns"]).groupby(_CALL, sort=False)
    out = pd.DataFrame({
        "kernels": g.size(),
        "gpu_ns": g[["start_ns", "end_ns"]].apply(lambda k: busy_ns(zip(k["start_ns"], k["end_ns"], strict=True))),
        "wall_ns": g["end_ns"].max() - g["api_start_ns"].min(),
        "host_ns": g["iter_end_ns"].first() - g["iter_start_ns"].first(),
        "first_launch_ns": g["start_ns"].first() - g["api_start_ns"].first(),
    })
    out["idle_ns"] = idle.reindex(out.index).fillna(0) if len(idle) else 0
    return out.reset_index()[cols]


def kernels_per_call(kernels: pd.DataFrame) -> pd.DataFrame:
    """Per (variant, shape_id): kernels per call (median, min, max over calls) and the kernels'
    short names in launch order of the first recorded call."""
    cols = [*_PAIR, "kernels_per_call", "kernels_per_call_min", "kernels_per_call_max", "kernel_names"]
    if kernels.empty:
        return pd.DataFrame(columns=cols)
    calls = per_call(kernels)
    g = calls.groupby(_PAIR, sort=False)["kernels"]
    out = pd.DataFrame({"kernels_per_call": g.median(), "kernels_per_call_min": g.min(), "kernels_per_call_max": g.max()})
    first = kernels.sort_values([*_CALL, "kernel_index"]).groupby(_PAIR, sort=False)
    names = first.apply(lambda d: list(d[d["iteration"] == d["iteration"].min()]["kernel_short"].astype(str)),
                        include_groups=False)
    out["kernel_names"] = names.reindex(out.index)
    return out.reset_index()[cols]


def launch_overhead(kernels: pd.DataFrame) -> pd.DataFrame:
    """Per (variant, shape_id): launch latency, the launch call's start to the kernel's start
    (median and max over every kernel, in µs), and the first kernel's of each call (median).

    The per-kernel figure is nsys_kernels' `launch_latency_ns`. It holds the host's launch cost and
    any wait for the stream: a kernel queued behind its predecessor starts late for that reason.
    CUDA tracing itself lengthens every API call (on the H100 a traced cudaLaunchKernel took 7-11 µs):
    compare launch figures between variants of one capture, not with untraced timings.
    """
    cols = [*_PAIR, "launch_us", "launch_us_max", "first_launch_us"]
    if kernels.empty:
        return pd.DataFrame(columns=cols)
    g = kernels.groupby(_PAIR, sort=False)["launch_latency_ns"]
    out = pd.DataFrame({"launch_us": g.median() / 1e3, "launch_us_max": g.max() / 1e3})
    first = per_call(kernels).groupby(_PAIR, sort=False)["first_launch_ns"].median() / 1e3
    out["first_launch_us"] = first.reindex(out.index)
    return out.reset_index()[cols]


def idle_gaps(kernels: pd.DataFrame) -> pd.DataFrame:
    """One row per pair of consecutive kernels of a call: the GPU idle time between them.

    gap_ns = next kernel's start - the latest end so far in the call, floored at 0 (kernels that
    overlap on several streams leave no gap).
    """
    cols = [*_CALL, "kernel_index", "kernel", "next_kernel", "gap_ns"]
    if kernels.empty:
        return pd.DataFrame(columns=cols)
    k = kernels.sort_values([*_CALL, "start_ns"]).reset_index(drop=True)
    end_so_far = k.groupby(_CALL, sort=False)["end_ns"].cummax()
    prev_end = end_so_far.groupby([k[c] for c in _CALL], sort=False).shift(1)
    gap = (k["start_ns"] - prev_end).clip(lower=0)
    prev_name = k.groupby(_CALL, sort=False)["kernel_short"].shift(1)
    out = pd.DataFrame({**{c: k[c] for c in _CALL}, "kernel_index": k["kernel_index"] - 1,
                        "kernel": prev_name, "next_kernel": k["kernel_short"], "gap_ns": gap})
    return out[prev_end.notna()].reset_index(drop=True)[cols]


def harness_agreement(summary: pd.DataFrame, measurements: pd.DataFrame | None) -> pd.DataFrame:
    """harness_ms (the bundle's CUDA-event median of the same variant and shape) beside nsys' figures.

    harness_over_gpu = harness_ms / nsys_gpu_ms (median kernel time per call); harness_over_wall
    compares with the call's GPU wall span. The events bracket the whole call, gaps included, and
    the harness flushes the L2 before each repeat while nsys' calls run back to back on a warm L2:
    expect harness_over_gpu a little above 1, and well above 1 for launch-bound calls (on the H100
    the smoke shapes' 5-40 µs of kernels read 1.6-1.9x: event overhead and launch gaps). nsys'
    tracing makes every launch slower (7-11 µs per cudaLaunchKernel), which stretches the wall span of
    launch-bound calls: harness_over_wall below 1 says so, and that the capture's gaps overstate the
    untraced ones; kernel durations are not affected. NaN when the bundle has no timed row for the pair.
    """
    cols = [*_PAIR, "harness_ms", "nsys_gpu_ms", "harness_over_gpu", "harness_over_wall"]
    if summary.empty:
        return pd.DataFrame(columns=cols)
    out = summary[_PAIR].copy()
    out["nsys_gpu_ms"] = pd.to_numeric(summary["gpu_us"], errors="coerce") / 1e3
    wall_ms = pd.to_numeric(summary["wall_us"], errors="coerce") / 1e3
    harness = pd.Series(np.nan, index=out.index)
    if measurements is not None and not measurements.empty and {"variant", "shape_id", "median_ms"} <= set(measurements):
        meas = measurements
        if "status" in meas:
            meas = meas[meas["status"].isin(TIMED)]
        lookup = meas.drop_duplicates(_PAIR, keep="last").set_index(_PAIR)["median_ms"]
        harness = pd.Series([lookup.get((v, s), np.nan) for v, s in zip(out["variant"], out["shape_id"], strict=True)],
                            index=out.index, dtype="float64")
    out["harness_ms"] = harness
    out["harness_over_gpu"] = out["harness_ms"] / out["nsys_gpu_ms"]
    out["harness_over_wall"] = out["harness_ms"] / wall_ms
    return out[cols]


def summarize(kernels: pd.DataFrame, measurements: pd.DataFrame | None = None,
              plan: dict[str, Any] | None = None) -> pd.DataFrame:
    """nsys_summary: one row per (variant, shape_id), medians over the recorded calls.

    Columns (SUMMARY_COLUMNS): status ('ok'; 'no kernels' when the pair ran but launched none;
    'not run' with the target's reason), iterations, kernels per call, gpu_us (kernel time per
    call), wall_us (first launch to last kernel end), host_us (the call on the host), busy_frac
    (gpu_us / wall_us), launch overhead, idle_us (sum of gaps per call) and gap_us (median gap),
    and the harness agreement. Pairs come from the plan when given, else from the kernels.
    """
    rows: list[tuple[str, str]] = []
    reasons: dict[tuple[str, str], tuple[str, str]] = {}
    planned_iters: dict[tuple[str, str], int] = {}
    if plan is not None:
        for p in plan.get("pairs", []):
            key = (p["variant"], p["shape_id"])
            rows.append(key)
            reasons[key] = ("no kernels", "") if p.get("ran") else ("not run", p.get("reason", ""))
            planned_iters[key] = int(p.get("iters", 0)) if p.get("ran") else 0
    if not kernels.empty:
        for key in kernels[_PAIR].drop_duplicates().itertuples(index=False, name=None):
            if key not in reasons:
                rows.append(key)
    base = pd.DataFrame(list(dict.fromkeys(rows)), columns=_PAIR)
    if base.empty:
        return pd.DataFrame({c: pd.Series(dtype="object") for c in SUMMARY_COLUMNS})
    if not kernels.empty:
        calls = per_call(kernels)
        g = calls.groupby(_PAIR, sort=False)
        timing = pd.DataFrame({
            "iterations": g.size(),
            "gpu_us": g["gpu_ns"].median() / 1e3, "gpu_us_min": g["gpu_ns"].min() / 1e3,
            "wall_us": g["wall_ns"].median() / 1e3, "host_us": g["host_ns"].median() / 1e3,
            "busy_frac": (calls["gpu_ns"] / calls["wall_ns"]).groupby([calls[c] for c in _PAIR], sort=False).median(),
            "idle_us": g["idle_ns"].median() / 1e3,
        }).reset_index()
        gaps = idle_gaps(kernels)
        gap = (gaps.groupby(_PAIR, sort=False)["gap_ns"].median() / 1e3).rename("gap_us").reset_index()
        base = (base.merge(timing, on=_PAIR, how="left").merge(kernels_per_call(kernels), on=_PAIR, how="left")
                .merge(launch_overhead(kernels), on=_PAIR, how="left").merge(gap, on=_PAIR, how="left"))
    for c in SUMMARY_COLUMNS:
        if c not in base:
            base[c] = None if c == "kernel_names" else np.nan
    status = [("ok", "") if pd.notna(g_) else reasons.get((v, s), ("no kernels", ""))
              for v, s, g_ in zip(base["variant"], base["shape_id"], base["gpu_us"], strict=True)]
    base["status"] = [st for st, _ in status]
    base["reason"] = [r for _, r in status]
    # calls recorded: counted from the kernels; a pair that ran but launched none made plan["iters"]
    iters = pd.to_numeric(base["iterations"], errors="coerce")
    fallback = pd.Series([planned_iters.get((v, s), 0) for v, s in zip(base["variant"], base["shape_id"], strict=True)],
                         index=base.index)
    base["iterations"] = iters.fillna(fallback).astype("int64")
    agree = harness_agreement(base, measurements)
    for c in ("harness_ms", "nsys_gpu_ms", "harness_over_gpu", "harness_over_wall"):
        base[c] = agree[c].to_numpy()
    for c in SUMMARY_COLUMNS:
        if c not in ("variant", "shape_id", "status", "reason", "kernel_names", "iterations"):
            base[c] = pd.to_numeric(base[c], errors="coerce").astype("float64")
    return base[list(SUMMARY_COLUMNS)]
