"""`faprof compare`: two runs row by row, which is faster overall, and the table that shows it.

The comparison is faprof's one two-run comparison (`faprof.analysis.comparison`): rows matched on
(variant, shape_id), B's median over A's, and faprof's one test (two-sided Mann-Whitney U on the kept
samples, as the dashboard's Diff page); this module formats it. Each side keeps its own % of its GPU's
peak and of its measured ceiling. Every difference is tested, except where either
row's timings are unstable (bimodal, drifting, or a CPU row past its stop rule:
faprof.rows.stability): such a pair is never called significant, and the headline's geometric
mean leaves it out when stable rows remain.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pandas as pd
from rich.table import Table

from faprof.analysis import aliases, comparison
from faprof.errors import FaprofError
from faprof.model import schema
from faprof.report import fmt as f
from faprof.store import Bundle

PCT_NOTE = ("% peak: of each row's own GPU's dense peak at its dtype (faprof's GPU database); % ceiling: of the "
            "matmul rate each run measured on its own GPU (its measured ceiling)")

_PCT_NAMES = {"pct_peak": "% peak", "pct_measured_ceiling": "% ceiling"}


def _geomean(x: pd.Series) -> float:
    x = x[(x > 0) & x.notna()]
    return float(math.exp(x.map(math.log).mean())) if len(x) else math.nan


def gpu_models(bundle: Bundle) -> list[str]:
    """The GPU models a bundle's rows ran on (several after `--gpus` on mixed GPUs; [] for old rows)."""
    df = bundle.measurements()
    if df.empty or "gpu_name" not in df.columns:
        return []
    return sorted(str(g) for g in df["gpu_name"].dropna().unique())


def timed_rows(bundle: Bundle) -> pd.DataFrame:
    """A bundle's measurement rows (declared aliases folded into their target's row, as a run of this
    faprof writes them); FaprofError, saying what the bundle holds instead, when it has none."""
    df = aliases.as_planned(bundle)
    if df.empty or "variant" not in df.columns:
        m = bundle.manifest()
        if m.get("kind") == "sanitize":
            raise FaprofError(f"{bundle.run_id} is a `faprof sanitize` bundle: it holds compute-sanitizer findings, "
                              f"no timings to compare (`faprof show {bundle.path}` prints them)")
        raise FaprofError(f"{bundle.run_id} has no measurements yet (status: {m.get('status')}); nothing to compare")
    return df


def rows_on(bundle: Bundle, gpu: str | None) -> pd.DataFrame:
    """A bundle's rows, only those of GPU model `gpu` when given (FaprofError naming the models if none)."""
    df = timed_rows(bundle)
    if gpu is None:
        models = gpu_models(bundle)
        if len(models) > 1:
            raise FaprofError(f"{bundle.run_id} holds rows of {len(models)} GPU models ({', '.join(models)}); "
                              "choose one with --gpu-a/--gpu-b")
        return df
    if "gpu_name" not in df.columns or not (df["gpu_name"] == gpu).any():
        raise FaprofError(f"{bundle.run_id} has no rows on {gpu!r} (its GPUs: {', '.join(gpu_models(bundle)) or 'not recorded per row'})")
    return df[df["gpu_name"] == gpu].reset_index(drop=True)


def _unstable_sides(ua: Any, ub: Any) -> str:
    return ", ".join(side for side, u in (("A", ua), ("B", ub)) if comparison.is_unstable(u))


def compare_runs(a: Bundle, b: Bundle, gpu_a: str | None = None, gpu_b: str | None = None) -> pd.DataFrame:
    """Row-by-row comparison of two runs on (variant, shape_id).

    Args:
        a, b: the two bundles (may be one bundle holding two GPU models).
        gpu_a, gpu_b: the GPU model of each side's rows, for a bundle that holds several.

    Returns:
        One row per pair in both runs: statuses, medians with their 95% CIs, `ratio_b_over_a`, each
        side's % of peak and of measured ceiling, `unstable` ('A', 'B', 'A, B' or '': whose timings are
        unstable, with `unstable_reason_a/_b`), the Mann-Whitney `p_value` and `significant` (NA when
        not tested: too few samples, or unstable timings).
    """
    da, db = rows_on(a, gpu_a), rows_on(b, gpu_b)
    cols = ["status", "median_ms", "ci95_low_ms", "ci95_high_ms", "tflops", "pct_peak", "pct_measured_ceiling",
            "device", "dtype", "unstable", "unstable_reason", "samples_ms"]
    m = comparison.pair(da, db, cols, how="inner").drop(columns="_merge")
    m["ratio_b_over_a"] = m["median_ms_b"] / m["median_ms_a"]
    none = [None] * len(m)
    m["unstable"] = [_unstable_sides(x, y) for x, y in zip(m.get("unstable_a", none), m.get("unstable_b", none), strict=True)]
    tests = [comparison.mann_whitney(x, y) if {sa, sb} <= set(schema.TIMED) else (float("nan"), None)
             for x, y, sa, sb in zip(m.get("samples_ms_a", none), m.get("samples_ms_b", none),
                                     m["status_a"], m["status_b"], strict=True)]
    m["p_value"] = [p for p, _ in tests]
    # Unstable timings: the test's assumption (each side one distribution) does not hold, so no verdict.
    m["significant"] = pd.array([None if u else sig for (_, sig), u in zip(tests, m["unstable"], strict=True)],
                                dtype="boolean")
    return m.drop(columns=[c for c in ("samples_ms_a", "samples_ms_b", "unstable_a", "unstable_b") if c in m])


@dataclass
class CompareSummary:
    """The comparison in words: the headline, each side's GPU, and what makes it shaky."""

    headline: str
    gpu_a: str
    gpu_b: str
    warnings: list[str]


def _machine_warnings(a: Bundle, b: Bundle, rows: pd.DataFrame, gpu_a: str, gpu_b: str) -> list[str]:
    warnings: list[str] = []
    if gpu_a != gpu_b:
        warnings.append(f"different GPUs: A ran on {gpu_a}, B on {gpu_b}; the ratios compare machines, not code")
    if {"device_a", "device_b"} <= set(rows.columns):
        diff = rows[rows["device_a"].notna() & rows["device_b"].notna() & (rows["device_a"] != rows["device_b"])]
        if not diff.empty:
            pairs = ", ".join(f"{x} in A / {y} in B" for x, y in dict.fromkeys(zip(diff["device_a"], diff["device_b"], strict=True)))
            warnings.append(f"{len(diff)} row(s) ran on different devices ({pairs}), e.g. {diff.iloc[0]['variant']}")
    da, db = rows_on(a, gpu_a if gpu_a in gpu_models(a) else None), rows_on(b, gpu_b if gpu_b in gpu_models(b) else None)
    dt_a = set(da["dtype"].dropna()) if "dtype" in da else set()
    dt_b = set(db["dtype"].dropna()) if "dtype" in db else set()
    if dt_a != dt_b:
        warnings.append(f"different dtypes: A has {', '.join(sorted(dt_a)) or 'none'}, B has {', '.join(sorted(dt_b)) or 'none'}; "
                        "only rows of the same dtype and shape are compared")
    return warnings


def _speed_words(speed: float, over: str) -> str:
    if abs(speed - 1) < 0.005:
        return f"B and A take the same time ({over})"
    if speed > 1:
        return f"B is {f.ratio(speed)} faster than A ({over})"
    return f"B is {f.ratio(1 / speed)} slower than A ({over})"


def compare_summary(a: Bundle, b: Bundle, rows: pd.DataFrame, gpu_a: str | None = None,
                    gpu_b: str | None = None) -> CompareSummary:
    """Which run is faster overall (geometric mean of A's median over B's on rows timed in both, stable
    rows only when there are any), in words with the direction in them, and what makes the comparison
    shaky (GPUs, devices, dtypes, unstable timings)."""
    ma, mb = a.manifest(), b.manifest()
    gpu_a = gpu_a or (ma.get("env") or {}).get("gpu_name") or "CPU only"
    gpu_b = gpu_b or (mb.get("env") or {}).get("gpu_name") or "CPU only"
    warnings = _machine_warnings(a, b, rows, gpu_a, gpu_b)
    both = rows[rows["status_a"].isin(schema.TIMED) & rows["status_b"].isin(schema.TIMED)
                & (rows["median_ms_a"] > 0) & (rows["median_ms_b"] > 0)]
    if both.empty:
        return CompareSummary("no row is timed in both runs", gpu_a, gpu_b, warnings)
    shaky = both["unstable"].astype(str).str.len() > 0 if "unstable" in both else pd.Series(False, index=both.index)
    if shaky.any():
        warnings.append(f"{int(shaky.sum())} of {len(both)} rows timed in both have unstable timings in A or B (bimodal, "
                        "drifting, or a CPU row past its stop rule): their differences are not tested for significance")
    stable = both[~shaky]
    n = len(stable) if not stable.empty else len(both)
    over = f"geometric mean over {n} row{'s' * (n != 1)} timed in both"
    if stable.empty:
        over += ", every one with unstable timings: not a reliable figure"
    elif shaky.any():
        over += f"; {int(shaky.sum())} with unstable timings left out"
    speed = _geomean((stable if not stable.empty else both).pipe(lambda t: t["median_ms_a"] / t["median_ms_b"]))
    return CompareSummary(_speed_words(speed, over), gpu_a, gpu_b, warnings)


# ------------------------------------------------------------------------------------- table
def faster_words(ratio_b_over_a: Any) -> str:
    """B's time over A's as words: '1.30x faster' / '1.08x slower' / 'same' (within 0.5%)."""
    try:
        r = float(ratio_b_over_a)
    except (TypeError, ValueError):
        return ""
    if math.isnan(r) or r <= 0:
        return ""
    if abs(r - 1) < 0.005:
        return "same"
    return f"{1 / r:.2f}x faster" if r < 1 else f"{r:.2f}x slower"


def _verdict(r: Any) -> str:
    if r.get("unstable"):
        return f"not tested: unstable in {r['unstable']}"
    sig = r["significant"]
    if pd.isna(sig):
        return ""
    return f"[bold]yes[/] ({r['p_value']:.2g})" if sig else f"no ({r['p_value']:.2g})"


def compare_table(df: pd.DataFrame, title: str, fmt: Callable[..., str]) -> tuple[Table, list[str]]:
    """(the table, the % columns it shows) for `compare_runs`'s rows."""
    pct = [c for c in _PCT_NAMES if any(f"{c}_{s}" in df and df[f"{c}_{s}"].notna().any() for s in ("a", "b"))]
    extra = [f"{side} {_PCT_NAMES[c]}" for c in pct for side in ("A", "B")]
    t = Table(title=title, header_style="bold")
    for c in ("variant", "shape_id", "A status", "B status", "A ms", "B ms", "B vs A", *extra, "significant (p)"):
        t.add_column(c, justify="right" if c in ("A ms", "B ms", "B vs A", *extra) else "left")
    for _, r in df.iterrows():
        t.add_row(r["variant"], r["shape_id"], str(r["status_a"]), str(r["status_b"]), fmt(r["median_ms_a"], ".4g"),
                  fmt(r["median_ms_b"], ".4g"), faster_words(r["ratio_b_over_a"]),
                  *[fmt(r.get(f"{c}_{side}"), ".3g") for c in pct for side in ("a", "b")], _verdict(r))
    return t, pct


def unstable_notes(df: pd.DataFrame, limit: int = 5) -> list[str]:
    """One line per unstable row of a compare table (at most `limit`, then a count)."""
    out = []
    shaky = df[df["unstable"].astype(str).str.len() > 0] if "unstable" in df else df.iloc[0:0]
    for _, r in shaky.head(limit).iterrows():
        why = "; ".join(f"{side}: {r.get(f'unstable_reason_{side.lower()}')}" for side in str(r["unstable"]).split(", "))
        out.append(f"unstable: {r['variant']} {r['shape_id']} ({why})")
    if len(shaky) > limit:
        out.append(f"... and {len(shaky) - limit} more unstable row(s)")
    return out
