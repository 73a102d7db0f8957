"""Speed tables of loaded runs: timed and flagged rows, rankings over common problems, fwd/bwd,
memory and timing rooflines, and each row's error over its bound."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pandas as pd

from faprof.analysis import speedups as analysis
from faprof.model import gpus, schema


# ----------------------------------------------------------------------------------- variants
def timed(df: pd.DataFrame) -> pd.DataFrame:
    """Rows that carry a timing (ok and wrong: a wrong variant is still timed, and flagged)."""
    if df.empty or "status" not in df:
        return df
    return df[df["status"].isin(schema.TIMED) & pd.to_numeric(df["median_ms"], errors="coerce").gt(0)]


def flagged(df: pd.DataFrame) -> pd.DataFrame:
    """Wrong and failed rows with their reasons and errors, worst first."""
    if df.empty or "status" not in df:
        return pd.DataFrame()
    bad = df[df["status"].isin(["wrong", "failed"])]
    cols = [c for c in ("run", "variant", "problem", "status", "reason", "max_abs_err", "rel_err", "rtol",
                        "atol", "reference", "median_ms") if c in bad]
    return bad.sort_values(["status", "variant"])[cols].reset_index(drop=True)


def not_run(df: pd.DataFrame) -> pd.DataFrame:
    """Unsupported and skipped rows, one line per (variant, reason) with how many problems."""
    if df.empty or "status" not in df:
        return pd.DataFrame()
    t = df[df["status"].isin(["unsupported", "skipped"])]
    if t.empty:
        return pd.DataFrame()
    return (t.groupby(["variant", "status", "reason"], dropna=False).size().rename("problems").reset_index()
            .sort_values(["status", "variant"], ignore_index=True))


COMMON_MIN_SHARE = 0.5
"""A ranking must cover at least this share of its group's problems: variants that would shrink the
problems every ranked variant ran below it are listed apart, with how many they ran, instead."""


def common_problems(df: pd.DataFrame) -> tuple[list[str], list[str], list[str]]:
    """The problems a ranking can compare every variant on.

    Args:
        df: timed rows of one group (one dtype and direction).

    Returns:
        (the problems every ranked variant timed, the ranked variants, the variants left out because
        they ran too few of the problems for the rest to be compared with them).
    """
    problems = df.groupby("variant")["shape_id"].apply(set).to_dict()
    n_all = df["shape_id"].nunique()
    ranked = sorted(problems, key=lambda v: (-len(problems[v]), v))
    left: list[str] = []
    common = set.intersection(*problems.values()) if problems else set()
    while len(ranked) > 1 and len(common) < COMMON_MIN_SHARE * n_all:
        left.append(ranked.pop())  # the variant that ran the fewest problems
        common = set.intersection(*(problems[v] for v in ranked))
    return sorted(common), ranked, left[::-1]


def ranking_table(df: pd.DataFrame) -> pd.DataFrame:
    """Variants ranked by median TFLOP/s over the problems they all ran (`common_problems`), one ranking per
    (dtype, direction): an fp16 row never outranks an fp32-only kernel that could not run it, and no variant
    is ranked on problems the others did not run.

    Returns:
        analysis.ranking's columns with `dtype`, `direction` and `problems` (how many it is over) first; variants
        left out get a row with `ranked` False and the problems they ran.
    """
    t = timed(df)
    if t.empty or "dtype" not in t:
        return analysis.ranking(t) if not t.empty else pd.DataFrame()
    t = t.assign(direction=t.get("direction", "fwd"))
    parts = []
    for (dt, dr), g in t.groupby(["dtype", "direction"], sort=True):
        common, ranked, left = common_problems(g)
        r = analysis.ranking(g[g["variant"].isin(ranked) & g["shape_id"].isin(common)])
        parts.append(r.assign(dtype=dt, direction=dr, problems=len(common), ranked=True))
        for v in left:
            n = g.loc[g["variant"] == v, "shape_id"].nunique()
            parts.append(pd.DataFrame([{"dtype": dt, "direction": dr, "variant": v, "problems": n, "ranked": False}]))
    parts = [p for p in parts if not p.empty]
    if not parts:
        return pd.DataFrame()
    out = pd.concat(parts, ignore_index=True)
    first = ["dtype", "direction", "variant", "problems"]
    return out[[*first, *[c for c in out.columns if c not in first]]]


def line_series(df: pd.DataFrame, x: str, config_col: str = "config") -> pd.Series:
    """Which line each row belongs to beyond its variant: rows of different directions, dtypes or (on a
    sequence-length axis) problem configurations never share a line.

    Args:
        df: the rows a chart draws; x: its x column; config_col: the column naming a problem without S
            (`config`, or a shortened copy of it).

    Returns:
        A label per row ('' when every row of a variant may share one line), e.g. 'bwd', 'fp32 · fwd'.
    """
    cols = [c for c in ("direction", "dtype", "layout") if c in df and df[c].nunique() > 1]
    if x in ("seq_len", "kv_len") and config_col in df and df[config_col].nunique() > 1:
        cols.append(config_col)
    if x == "kv_len" and "seq_len" in df and df["seq_len"].nunique() > 1:
        cols.append("seq_len")  # decode: one line per number of new tokens (Sq), over the cache length
    if not cols:
        return pd.Series("", index=df.index, dtype=object)
    return df[cols].astype(str).agg(" · ".join, axis=1)


def fwd_bwd_tables(df: pd.DataFrame) -> pd.DataFrame:
    """analysis.fwd_bwd_tables over the timed rows."""
    return analysis.fwd_bwd_tables(timed(df)) if not df.empty else pd.DataFrame()


def memory_tables(df: pd.DataFrame, baseline: str | None = None) -> pd.DataFrame:
    """analysis.memory_table (standard vs flash peak extra memory) when the run measured memory.

    The flash side is `sdpa_flash`, or the run's baseline when sdpa_flash has no rows.
    """
    t = timed(df)
    if t.empty or "extra_mem_bytes" not in t or pd.to_numeric(t["extra_mem_bytes"], errors="coerce").isna().all():
        return pd.DataFrame()
    variants = set(t["variant"])
    flash = "sdpa_flash" if "sdpa_flash" in variants else (baseline or "")
    if "torch_standard" not in variants or flash not in variants or flash == "torch_standard":
        return pd.DataFrame()
    return analysis.memory_table(t, standard="torch_standard", flash=flash)


def roofline_from_timing(df: pd.DataFrame) -> pd.DataFrame:
    """Timed GPU rows as roofline points: FLOPs over the minimum traffic (an ideal kernel's
    arithmetic intensity) against the achieved TFLOP/s. No Nsight needed; the real traffic (which
    ncu measures) is higher, so the point sits right of where the kernel really is."""
    t = timed(df)
    if t.empty or "min_bytes" not in t:
        return pd.DataFrame()
    t = t[(t.get("device") == "cuda") & pd.to_numeric(t["min_bytes"], errors="coerce").gt(0)]
    if t.empty:
        return pd.DataFrame()
    return t.assign(intensity=t["flops"].astype(float) / t["min_bytes"].astype(float))


def gpu_ceilings(manifest: dict[str, Any], dtype: str, compute: str = "tensor") -> dict[str, float]:
    """Roofline ceilings of a run's GPU: datasheet peak and bandwidth, and the measured ones.

    Returns:
        name -> value; compute ceilings in TFLOP/s (keys ending 'tflops'), memory in GB/s ('gbs').
    """

    env = manifest.get("env") or {}
    out: dict[str, float] = {}
    name = env.get("gpu_name")
    spec = gpus.lookup(name) if name else None
    if spec is not None:
        peak, _ = gpus.peak_tflops(spec, dtype if dtype in gpus.DTYPES else "fp32",
                                   compute if compute in gpus.COMPUTES else "tensor")
        if peak:
            out[f"datasheet {dtype} peak tflops"] = float(peak)
        if spec.mem_bw_gbs:
            out["datasheet DRAM gbs"] = float(spec.mem_bw_gbs)
    ceil = env.get("ceilings") or {}
    key = f"matmul_{dtype}_tflops" if f"matmul_{dtype}_tflops" in ceil else "matmul_fp32_tflops"
    if ceil.get(key):
        out[f"measured {key.split('_')[1]} matmul tflops"] = float(ceil[key])
    if ceil.get("copy_gbs"):
        out["measured copy gbs"] = float(ceil["copy_gbs"])
    return out


def error_ratio(df: pd.DataFrame) -> pd.Series:
    """Each row's error over the bound it is checked against (above 1 fails; faprof.correctness):
    the largest max |out - ref| / bound over the row's outputs, the bound being the one each output
    was checked against (FlashAttention's: factor x PyTorch's own error in the dtype + eps x
    max(1, max |ref|)); for rows that recorded no per-output bound, the row's max error over
    tol_factor x baseline_max_err + tol_eps; for rows checked without a separate baseline, the
    norm-wise relative error over rtol."""
    num = lambda c: pd.to_numeric(df[c], errors="coerce") if c in df else pd.Series(np.nan, index=df.index)  # noqa: E731
    bound = num("tol_factor") * num("baseline_max_err") + num("tol_eps").fillna(0.0)
    fa = num("max_abs_err") / bound.where(bound > 0)
    if "errors" in df:
        fa = df["errors"].map(_worst_over_bound).fillna(fa)
    return fa.fillna(num("rel_err") / num("rtol"))


def _worst_over_bound(errors: Any) -> float:
    """max over outputs of max_abs / bound from a row's `errors` (dict or its JSON); NaN if none has both."""
    if isinstance(errors, str):
        try:
            errors = json.loads(errors)
        except ValueError:
            return math.nan
    if not isinstance(errors, dict):
        return math.nan
    ratios = [float(e["max_abs"]) / float(e["bound"]) for e in errors.values()
              if isinstance(e, dict) and _finite(e.get("max_abs")) and _finite(e.get("bound")) and float(e["bound"]) > 0]
    return max(ratios) if ratios else math.nan


def _finite(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def bound_of(df: pd.DataFrame) -> str:
    """'memory' when every timed row with a bound is memory-bound (decode: chart GB/s against the copy
    ceiling), else 'compute' (old bundles have no bound column: compute)."""
    if df.empty or "bound" not in df:
        return "compute"
    bounds = set(df["bound"].dropna())
    return "memory" if bounds == {"memory"} else "compute"


X_AXES = {
    "sequence length": "seq_len",
    "KV length Sk": "kv_len",
    "problem (ordered by FLOPs)": "problem",
    "FLOPs per call": "flops",
}
"""Choices of x axis for the per-variant charts: menu text -> column."""


MAX_CONFIGS_FOR_SEQ_AXIS = 3
"""Over this many problem configurations (B, H, D, dtype, mask) the sequence-length charts would be
a tangle of short lines; such data is shown per problem instead."""


def default_x_axis(df: pd.DataFrame) -> str:
    """'sequence length' when the problems form a few lines over S, else 'problem (ordered by FLOPs)'.

    Report 003's grid changes B, H and S together (three problems share S=128, each with its own
    B and H): lines over S would zig-zag between them, so such data is shown per problem instead.
    """
    t = timed(df)
    if t.empty or "config" not in t:
        return "sequence length"
    if "kv_len" in t and t["seq_len"].nunique() < t["kv_len"].nunique():
        return "KV length Sk"  # decode: a few new tokens against caches of many lengths
    if t["config"].nunique() > MAX_CONFIGS_FOR_SEQ_AXIS:
        return "problem (ordered by FLOPs)"
    keys = [c for c in ("run_id", "variant", "config", "seq_len", "kv_len") if c in t]
    return "sequence length" if not t.duplicated(keys).any() else "problem (ordered by FLOPs)"


