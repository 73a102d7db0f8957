"""`faprof compare`'s table: two runs row by row, each side's % of its own GPU's peak and ceiling."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pandas as pd
from rich.table import Table

PCT_NOTE = ("% peak: of each row's own GPU's dense peak at its dtype (faprof's GPU database); % ceiling: of the "
            "matmul rate each run measured on its own GPU (its measured ceiling)")

_PCT_NAMES = {"pct_peak": "% peak", "pct_measured_ceiling": "% ceiling"}


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


def compare_table(df: pd.DataFrame, title: str, fmt: Callable[..., str]) -> tuple[Table, list[str]]:
    """(the table, the % columns it shows) for `faprof.report.compare_runs`'s rows."""
    pct = [c for c in _PCT_NAMES if any(f"{c}_{s}" in df and df[f"{c}_{s}"].notna().any() for s in ("a", "b"))]
    extra = [f"{side} {_PCT_NAMES[c]}" for c in pct for side in ("A", "B")]
    t = Table(title=title, header_style="bold")
    for c in ("variant", "shape_id", "A status", "B status", "A ms", "B ms", "B vs A", *extra, "significant (p)"):
        t.add_column(c, justify="right" if c in ("A ms", "B ms", "B vs A", *extra) else "left")
    for _, r in df.iterrows():
        sig = r["significant"]
        t.add_row(r["variant"], r["shape_id"], str(r["status_a"]), str(r["status_b"]), fmt(r["median_ms_a"], ".4g"),
                  fmt(r["median_ms_b"], ".4g"), faster_words(r["ratio_b_over_a"]),
                  *[fmt(r.get(f"{c}_{side}"), ".3g") for c in pct for side in ("a", "b")],
                  "" if pd.isna(sig) else (f"[bold]yes[/] ({r['p_value']:.2g})" if sig else f"no ({r['p_value']:.2g})"))
    return t, pct
