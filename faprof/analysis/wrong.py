"""Wrong rows for display: which rows have an error map, and one map as a heatmap grid.

The error map itself is made in faprof.correctness.errormap (one long table per wrong output: for each
axis, the share of wrong elements, the max error and the unwritten elements per bin) and kept in a
bundle's `error_maps` table; `faprof explain` puts it in sentences (faprof.correctness.wrong_text). Here
it becomes what the dashboard draws: one heatmap row per axis, one cell per bin.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from faprof.correctness.errormap import AXES

#: Axis names as the heatmap labels them.
AXIS_LABELS = {
    "batch": "batch b", "head": "head h", "query_tile": "query rows (tile)", "key_tile": "key rows (tile)",
    "d": "head-dim column d", "mask": "causal mask", "diag_in_tile": "diagonal in tile", "tail": "full vs last tile",
    "sequence": "sequence b", "kv_head": "KV head", "head_in_group": "head within its KV group", "window": "window edges",
    "boundary": "packed tile across sequences", "cache_block": "last cache block",
}

#: The key of one error map: a row's check input and output.
MAP_KEY = ("run_id", "variant", "shape_id", "check_input", "output")


def maps_index(maps: pd.DataFrame) -> pd.DataFrame:
    """One row per error map in `maps` (the error_maps table of one or more runs): MAP_KEY, the share
    of wrong elements over the whole output, its max error and unwritten elements, in table order."""
    if maps.empty:
        return pd.DataFrame(columns=[*MAP_KEY, "share_bad", "max_err", "n_unwritten"])
    keys = [k for k in MAP_KEY if k in maps]
    whole = maps[maps["axis"] == "all"]
    return whole[[*keys, "share_bad", "max_err", "n_unwritten"]].drop_duplicates(keys).reset_index(drop=True)


def map_grid(maps: pd.DataFrame, **key: Any) -> dict[str, Any]:
    """The error map selected by `key` (MAP_KEY fields) as a heatmap grid.

    Returns {'axes': axis labels (rows, AXES order, 'all' left out, axes with one bin kept),
    'z': share of wrong elements per cell (rows x columns, None past an axis' last bin),
    'text': the bin's label per cell, 'hover': one line per cell (range, wrong/total, max error,
    unwritten), 'columns': the number of columns}. Empty lists when nothing matches."""
    m = maps
    for k, v in key.items():
        m = m[m[k] == v]
    m = m[m["axis"] != "all"]
    axes = [a for a in AXES if a != "all" and (m["axis"] == a).any()]
    if not axes:
        return {"axes": [], "z": [], "text": [], "hover": [], "columns": 0}
    rows = {a: m[m["axis"] == a].sort_values(["lo", "hi"], kind="stable") for a in axes}
    width = max(len(r) for r in rows.values())
    z, text, hover = [], [], []
    for a in axes:
        r = rows[a]
        share = [float(x) for x in r["share_bad"]] + [None] * (width - len(r))
        z.append(share)
        text.append([str(b) for b in r["bin"]] + [""] * (width - len(r)))
        hover.append([_hover(a, rec) for rec in r.to_dict("records")] + [""] * (width - len(r)))
    return {"axes": [AXIS_LABELS.get(a, a) for a in axes], "z": z, "text": text, "hover": hover, "columns": width}


def _hover(axis: str, rec: dict[str, Any]) -> str:
    span = f"{rec['lo']}" if rec["lo"] == rec["hi"] else f"{rec['lo']}-{rec['hi']}"
    where = f"{AXIS_LABELS.get(axis, axis)} {rec['bin']}" + (f" ({span})" if str(rec["bin"]) != span else "")
    return (f"{where}: {int(rec['n_bad'])} of {int(rec['n'])} wrong ({float(rec['share_bad']):.0%}), "
            f"max error {float(rec['max_err']):.3g}, {int(rec['n_unwritten'])} unwritten")
