"""The measurement rows of an older bundle, read as this faprof reads rows: statistics the row was
written without recomputed from its kept samples, the stability verdict filled in, and every row
judged against its GPU's physical limits. Pure functions of the table and the bundle's manifest
(faprof.rows): reading a bundle never imports the timing harness or torch."""

from __future__ import annotations

from typing import Any

import pandas as pd

from faprof.rows import limits, stability, stats


def upgraded(df: pd.DataFrame, manifest: dict[str, Any]) -> pd.DataFrame:
    """`df` (a bundle's measurement rows) as this faprof reads it, given the bundle's manifest."""
    df = upgrade_statistics(df)
    if not df.empty and ("unstable" not in df.columns or df["unstable"].isna().any()):
        # rows written before faprof judged stability get the verdict from their kept samples
        df = stability.fill(df, (manifest.get("settings") or {}).get("timing"))
    if "gpu_name" in df.columns and df["gpu_name"].isna().any():
        # rows written before rows carried their GPU (a bundle resumed by a newer faprof) ran on
        # the run's GPU: name it, or they would not join the newer rows (speedups by GPU)
        gpu = (manifest.get("env") or {}).get("gpu_name")
        if gpu:
            df["gpu_name"] = df["gpu_name"].fillna(gpu)
    return judged(df, manifest)


def judged(df: pd.DataFrame, manifest: dict[str, Any]) -> pd.DataFrame:
    """Rows re-judged against the GPU's physical limits (faprof.rows.limits) as this faprof
    judges them, so a bundle of an older faprof cannot show a time its GPU cannot reach as ok.
    Rows without `l2_flushed` (older bundles) were flushed as their run's timing settings say."""
    if df.empty or "status" not in df.columns:
        return df
    timing = (manifest.get("settings") or {}).get("timing") or {}
    flushed = bool(timing.get("flush_l2", True)) if isinstance(timing, dict) else True
    return limits.judge_frame(df, manifest.get("env") or {}, flushed)


def upgrade_statistics(df: pd.DataFrame) -> pd.DataFrame:
    """Rows written before faprof timed on the median carry the *mean's* t-interval in
    ci95_low_ms/ci95_high_ms. Those rows (no `rel_ci` value) get the median's distribution-free CI,
    quartiles and outlier count recomputed from their kept samples, and `stats_note` says so."""
    if df.empty or "samples_ms" not in df.columns:
        return df
    old = df["rel_ci"].isna() if "rel_ci" in df.columns else pd.Series(True, index=df.index)
    old &= df["samples_ms"].map(lambda x: x is not None and hasattr(x, "__len__") and len(x) > 0)
    if not old.any():
        return df

    df = df.copy()
    cols = {"ci95_low_ms": "ci95_low", "ci95_high_ms": "ci95_high", "rel_ci": "rel_ci", "q1_ms": "q1", "q3_ms": "q3",
            "iqr_ms": "iqr", "outliers": "outliers"}
    for c in [*cols, "stats_note"]:
        if c not in df.columns:
            df[c] = None
    for i in df.index[old]:
        st = stats.summarize(list(df.at[i, "samples_ms"]))
        for c, k in cols.items():
            df.at[i, c] = st.get(k)
        df.at[i, "stats_note"] = "median CI recomputed from the kept samples (row written with the mean's CI)"
    for c in cols:
        df[c] = pd.to_numeric(df[c], errors="coerce")
    return df
