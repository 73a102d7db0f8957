"""A bundle's `error_maps` table: the error maps of wrong rows, carried by their rows until compaction.

A wrong measurement row carries its error map (faprof.correctness.errormap records) as JSON text in
its `error_map` field; the row file keeps it until `Bundle.compact()` moves every map into
`error_maps.parquet`, one long-format record per (row, input, output, axis, bin), keyed to its row
by (variant, shape_id, gpu_name) and `row_seq`. A map belongs to the newest row of its key only:
when a row is measured again (resume, retry) its old map is dropped with it, and a crash between
writing the table and deleting the row files cannot double a map (records of a row file already
folded in are replaced by the ones it still carries).
"""

from __future__ import annotations

import json
import math
from typing import Any

import pandas as pd

#: The measurement-row field holding a wrong row's map until compaction.
COLUMN = "error_map"

#: Columns of the table: the row's identity, then faprof.correctness.errormap.MAP_COLUMNS.
COLUMNS = ("variant", "shape_id", "gpu_name", "row_seq", "check_input", "output", "axis", "bin", "lo", "hi", "n",
           "n_bad", "share_bad", "max_err", "n_unwritten")


def _records(text: Any) -> list[dict[str, Any]]:
    if text is None or (isinstance(text, float) and math.isnan(text)) or not str(text).strip():
        return []
    return list(json.loads(text))


def from_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """The map records carried by measurement rows (their `error_map` field), as a table."""
    if rows.empty or COLUMN not in rows.columns:
        return pd.DataFrame(columns=list(COLUMNS))
    out = []
    for _, r in rows[rows[COLUMN].notna()].iterrows():
        ident = {k: r.get(k) for k in ("variant", "shape_id", "gpu_name", "row_seq")}
        out += [{**ident, **rec} for rec in _records(r[COLUMN])]
    return pd.DataFrame(out, columns=list(COLUMNS))


def merge(stored: pd.DataFrame, rows: pd.DataFrame) -> pd.DataFrame:
    """The live error maps: the stored table's records of rows that are still the newest of their key,
    plus the records the (merged) measurement rows still carry, which replace stored ones of the same row.

    Args:
        stored: `error_maps.parquet` as read (empty when absent).
        rows: the merged measurement rows (compacted table and pending row files, newest per key).
    """
    new = from_rows(rows)
    if stored.empty:
        return new.reset_index(drop=True)
    live = set(rows["row_seq"].dropna()) if "row_seq" in rows.columns else set()
    keep = stored[stored["row_seq"].isin(live) & ~stored["row_seq"].isin(set(new["row_seq"]))]
    if new.empty or keep.empty:
        return (keep if new.empty else new).reset_index(drop=True)
    return pd.concat([keep, new], ignore_index=True)


def without_maps(rows: pd.DataFrame) -> pd.DataFrame:
    """Measurement rows without the `error_map` field (it lives in its own table)."""
    return rows.drop(columns=[COLUMN], errors="ignore")
