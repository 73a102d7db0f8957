"""Reading an nsys SQLite export (whatever the nsys version calls its columns) and joining its kernels to NVTX ranges.

`load_sqlite` -> NsysTrace (kernels, CUDA API calls, NVTX ranges); `attribute_kernels` joins each
kernel through its launching API call (correlationId) to the innermost `iter<i>` range and its
parents `<shape_id>` and `<variant>`: the rows of `nsys_kernels.parquet`. `read_kernels` does both
from a file.
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from faprof.errors import FaprofError

#: NVTX event types (ENUM_NSYS_EVENT_TYPE) of ranges: push/pop and start/end. Read from the
#: export's enum table when it has one; these are the values every version so far has used.
NVTX_RANGE_EVENT_TYPES: dict[str, int] = {"NvtxPushPopRange": 59, "NvtxStartEndRange": 60}

#: Name of the innermost per-call range the target pushes (`iter0`, `iter1`, ...).
ITER_RANGE = re.compile(r"^iter(\d+)$")

#: Columns of nsys_kernels.parquet, in order.
KERNEL_COLUMNS: tuple[str, ...] = (
    "variant", "shape_id", "iteration", "kernel_index", "kernel", "kernel_short",
    "start_ns", "end_ns", "duration_ns", "grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z",
    "registers_per_thread", "static_smem_bytes", "dynamic_smem_bytes", "smem_bytes",
    "stream", "device", "correlation_id", "api", "api_start_ns", "api_end_ns", "launch_latency_ns",
    "iter_start_ns", "iter_end_ns", "global_tid", "nvtx_match",
)


@dataclass
class NsysTrace:
    """The tables of one nsys SQLite export, with column names made the same for every version."""

    kernels: pd.DataFrame
    """One row per kernel: start, end, device, stream, correlation_id, pid, kernel, kernel_short, grid/block, ..."""
    api: pd.DataFrame
    """CUDA API calls (runtime and driver): correlation_id, start, end, global_tid, pid, api."""
    ranges: pd.DataFrame
    """Closed NVTX ranges: start, end, text, global_tid, pid."""
    meta: dict[str, Any] = field(default_factory=dict)
    """Export metadata (META_DATA_EXPORT), table names, GPUs."""
    notes: list[str] = field(default_factory=list)
    """What the reader had to work around (absent tables, old column names)."""


#: Canonical column -> names it has had in nsys exports, first match wins.
_KERNEL_ALIASES: dict[str, tuple[str, ...]] = {
    "start": ("start",), "end": ("end",),
    "device": ("deviceId", "device"), "stream": ("streamId", "stream"),
    "correlation_id": ("correlationId",), "global_pid": ("globalPid", "globalTid"),
    "grid_x": ("gridX",), "grid_y": ("gridY",), "grid_z": ("gridZ",),
    "block_x": ("blockX",), "block_y": ("blockY",), "block_z": ("blockZ",),
    "registers_per_thread": ("registersPerThread", "registers"),
    "static_smem_bytes": ("staticSharedMemory",), "dynamic_smem_bytes": ("dynamicSharedMemory",),
}
_KERNEL_NAME_COLUMNS = ("demangledName", "name", "mangledName", "shortName")
_API_ALIASES: dict[str, tuple[str, ...]] = {
    "start": ("start",), "end": ("end",), "correlation_id": ("correlationId",),
    "global_tid": ("globalTid", "globalThreadId"), "name": ("nameId", "name"),
}
_NVTX_ALIASES: dict[str, tuple[str, ...]] = {
    "start": ("start",), "end": ("end",), "global_tid": ("globalTid", "globalThreadId"),
    "event_type": ("eventType",), "text": ("text",), "text_id": ("textId",),
}

#: Tables where nsys puts CUDA API calls: runtime and driver calls share the RUNTIME table in
#: the exports seen so far; a DRIVER table is read too where an export has one.
_API_TABLES = ("CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_DRIVER")
_KERNEL_TABLE = "CUPTI_ACTIVITY_KIND_KERNEL"
_NVTX_TABLE = "NVTX_EVENTS"


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _columns(con: sqlite3.Connection, table: str) -> list[str]:
    return [r[1] for r in con.execute(f"PRAGMA table_info({_q(table)})")]


def _select(con: sqlite3.Connection, table: str, aliases: dict[str, tuple[str, ...]], notes: list[str],
            extra: Iterable[str] = ()) -> pd.DataFrame:
    """SELECT each canonical column from the first alias the table has (NULL when none)."""
    cols = set(_columns(con, table))
    parts = []
    for canon, names in aliases.items():
        hit = next((n for n in names if n in cols), None)
        if hit is None:
            parts.append(f"NULL AS {_q(canon)}")
            if canon not in ("text", "text_id", "global_pid"):
                notes.append(f"{table} has no {'/'.join(names)} column")
        else:
            if hit != names[0]:
                notes.append(f"{table}: read {canon} from {hit} (older name)")
            parts.append(f"{_q(hit)} AS {_q(canon)}")
    parts += [_q(c) for c in extra if c in cols]
    return pd.read_sql_query(f"SELECT {', '.join(parts)} FROM {_q(table)}", con)


def _pid(gtid: pd.Series) -> pd.Series:
    """The process id inside nsys' global thread/process id (bits 24..47; above them: host/VM ids)."""
    return (pd.to_numeric(gtid, errors="coerce").astype("Int64") // (1 << 24)) % (1 << 24)


def _resolve_names(values: pd.Series, strings: dict[int, str]) -> pd.Series:
    """Names stored as StringIds ids (newer exports) or as text (older ones) -> text."""
    def one(v: Any) -> Any:
        if v is None or (isinstance(v, float) and np.isnan(v)):
            return None
        if isinstance(v, int | np.integer) or (isinstance(v, float) and float(v).is_integer()):
            return strings.get(int(v), str(int(v)))
        return str(v)
    return values.map(one)


def load_sqlite(path: str | Path) -> NsysTrace:
    """Read the kernels, CUDA API calls and NVTX ranges of an nsys SQLite export.

    Handles the differences between nsys versions: names as StringIds ids or as text (`textId` vs
    `text`, `nameId` vs `name`), `demangledName` missing in some exports (falls back to `name`,
    `mangledName`, `shortName`), event types from ENUM_NSYS_EVENT_TYPE when present, and tables
    that nsys leaves out when they would be empty (a capture without kernels has no KERNEL table).

    Args:
        path: the `.sqlite` file `nsys export --type sqlite` wrote.

    Returns:
        The trace (its `notes` say what the reader had to work around).

    Raises:
        FaprofError: the file is missing or not an SQLite database.
    """
    path = Path(path)
    if not path.is_file():
        raise FaprofError(f"nsys export {path} does not exist")
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")}
    except sqlite3.DatabaseError as e:
        raise FaprofError(f"{path} is not an SQLite export of an nsys report ({e}); export it again with "
                          "`nsys export --type sqlite`") from None
    notes: list[str] = []
    try:
        strings, meta = _read_strings_and_meta(con, tables, notes)
        k = _read_kernel_table(con, tables, strings, notes)
        api = _read_api_calls(con, tables, strings, notes)
        ranges = _read_nvtx_ranges(con, tables, strings, notes)
    finally:
        con.close()
    for df in (k, api, ranges):
        for c in ("start", "end"):
            df[c] = pd.to_numeric(df[c], errors="coerce").astype("Int64")
    return NsysTrace(kernels=k.reset_index(drop=True), api=api, ranges=ranges, meta=meta, notes=notes)


def _read_strings_and_meta(con: sqlite3.Connection, tables: set[str],
                           notes: list[str]) -> tuple[dict[int, str], dict[str, Any]]:
    """The StringIds table (id -> text) and the export's metadata: table names, META_DATA_EXPORT, GPUs."""
    strings: dict[int, str] = {}
    if "StringIds" in tables:
        strings = dict(con.execute("SELECT id, value FROM StringIds").fetchall())
    else:
        notes.append("no StringIds table: names are read as text")
    meta: dict[str, Any] = {"tables": sorted(tables)}
    if "META_DATA_EXPORT" in tables:
        meta.update({str(k): v for k, v in con.execute("SELECT name, value FROM META_DATA_EXPORT").fetchall()})
    if "TARGET_INFO_GPU" in tables:
        gcols = _columns(con, "TARGET_INFO_GPU")
        want = [c for c in ("id", "name", "smCount", "busLocation") if c in gcols]
        if want:
            meta["gpus"] = [dict(zip(want, r, strict=True)) for r in
                            con.execute(f"SELECT {', '.join(_q(c) for c in want)} FROM TARGET_INFO_GPU")]
    return strings, meta


def _read_kernel_table(con: sqlite3.Connection, tables: set[str], strings: dict[int, str],
                       notes: list[str]) -> pd.DataFrame:
    """One row per kernel, with its full and short name and its process id."""
    if _KERNEL_TABLE not in tables:
        notes.append(f"no {_KERNEL_TABLE} table: the capture holds no kernels")
        return pd.DataFrame(columns=[*_KERNEL_ALIASES, "kernel", "kernel_short", "pid"])
    k = _select(con, _KERNEL_TABLE, _KERNEL_ALIASES, notes)
    kcols = _columns(con, _KERNEL_TABLE)
    name_cols = [c for c in _KERNEL_NAME_COLUMNS if c in kcols]
    raw = pd.read_sql_query(
        f"SELECT {', '.join(_q(c) for c in name_cols) or 'NULL AS none'} FROM {_KERNEL_TABLE}", con)
    full = pd.Series([None] * len(raw), dtype=object)
    for c in [c for c in name_cols if c != "shortName"] or name_cols:
        full = full.where(full.notna(), _resolve_names(raw[c], strings))
    if "demangledName" not in kcols:
        notes.append(f"{_KERNEL_TABLE} has no demangledName; kernel names come from {name_cols or 'nowhere'}")
    k["kernel"] = full.values
    k["kernel_short"] = (_resolve_names(raw["shortName"], strings).values if "shortName" in kcols
                         else full.map(_short_name).values)
    k["pid"] = _pid(k["global_pid"])
    return k


def _read_api_calls(con: sqlite3.Connection, tables: set[str], strings: dict[int, str],
                    notes: list[str]) -> pd.DataFrame:
    """CUDA runtime and driver calls, with their names and process id."""
    frames = []
    for t in _API_TABLES:
        if t in tables:
            a = _select(con, t, _API_ALIASES, notes)
            a["api"] = _resolve_names(a.pop("name"), strings)
            frames.append(a)
    if frames:
        api = pd.concat(frames, ignore_index=True)
    else:
        notes.append("no CUDA API table (CUPTI_ACTIVITY_KIND_RUNTIME): kernels cannot be joined to NVTX ranges")
        api = pd.DataFrame(columns=["start", "end", "correlation_id", "global_tid", "api"])
    api["pid"] = _pid(api["global_tid"])
    return api


def _read_nvtx_ranges(con: sqlite3.Connection, tables: set[str], strings: dict[int, str],
                      notes: list[str]) -> pd.DataFrame:
    """Closed NVTX ranges (push/pop and start/end) with their text, thread and process id."""
    if _NVTX_TABLE not in tables:
        notes.append(f"no {_NVTX_TABLE} table: no NVTX ranges were recorded")
        ranges = pd.DataFrame(columns=["start", "end", "text", "global_tid"])
        ranges["pid"] = _pid(ranges["global_tid"])
        return ranges
    n = _select(con, _NVTX_TABLE, _NVTX_ALIASES, notes)
    types = dict(NVTX_RANGE_EVENT_TYPES)
    if "ENUM_NSYS_EVENT_TYPE" in tables:
        ecols = _columns(con, "ENUM_NSYS_EVENT_TYPE")
        if {"id", "name"} <= set(ecols):
            found = dict(con.execute("SELECT name, id FROM ENUM_NSYS_EVENT_TYPE").fetchall())
            types.update({k_: found[k_] for k_ in NVTX_RANGE_EVENT_TYPES if k_ in found})
    if n["event_type"].notna().any():
        n = n[n["event_type"].isin(list(types.values()))]
    text = n["text"].astype(object)
    if n["text_id"].notna().any():
        by_id = _resolve_names(n["text_id"], strings)
        text = text.where(text.notna() & (text.astype(str) != ""), by_id)
    n = n.assign(text=text)
    n = n[n["end"].notna() & n["start"].notna()]
    n = n[pd.to_numeric(n["end"]) >= pd.to_numeric(n["start"])]
    ranges = n[["start", "end", "text", "global_tid"]].reset_index(drop=True)
    ranges["pid"] = _pid(ranges["global_tid"])
    return ranges


def _short_name(name: Any) -> Any:
    """'void ns::kern<T>(args)' -> 'kern' (for exports without shortName)."""
    if not isinstance(name, str):
        return name
    s = re.sub(r"\(.*$", "", name)
    depth, out = 0, []
    for ch in s:
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif depth == 0:
            out.append(ch)
    return "".join(out).split()[-1].split("::")[-1] if "".join(out).split() else name


# ---------------------------------------------------------------------------- joining
def _iter_ranges(ranges: pd.DataFrame) -> pd.DataFrame:
    """`iter<i>` ranges with their parents: the innermost enclosing range on the same thread
    (`shape_id`) and the one enclosing that (`variant`). Ranges nest as a stack per thread."""
    cols = ["global_tid", "pid", "start", "end", "iteration", "shape_id", "variant"]
    if ranges.empty:
        return pd.DataFrame(columns=cols)
    r = ranges.dropna(subset=["start", "end", "text"])
    is_iter = r["text"].astype(str).str.match(ITER_RANGE.pattern)
    rows = []
    for tid, group in r.groupby("global_tid", sort=False):
        g = group.sort_values(["start", "end"], ascending=[True, False])
        starts, ends = _i64(g["start"]), _i64(g["end"])
        texts = g["text"].astype(str).to_numpy()
        for i in np.flatnonzero(is_iter.loc[g.index].to_numpy()):
            enclosing = np.flatnonzero((starts <= starts[i]) & (ends >= ends[i]))
            enclosing = enclosing[enclosing != i]
            if len(enclosing) < 2:
                continue
            # sorted by (start, -end): the last enclosing ones are the innermost
            shape_i, variant_i = enclosing[-1], enclosing[-2]
            rows.append((tid, g["pid"].iloc[i], int(starts[i]), int(ends[i]),
                         int(ITER_RANGE.match(texts[i]).group(1)), texts[shape_i], texts[variant_i]))  # type: ignore[union-attr]
    return pd.DataFrame(rows, columns=cols)


def _i64(values: pd.Series) -> np.ndarray:
    """A column as int64 numpy, NA as -1 (never a real time, thread or process id)."""
    return pd.to_numeric(values, errors="coerce").astype("Int64").fillna(-1).to_numpy(dtype=np.int64)


def _match_intervals(keys: np.ndarray, starts: np.ndarray, ends: np.ndarray, key_iv: np.ndarray,
                     start_iv: np.ndarray, end_iv: np.ndarray) -> np.ndarray:
    """For each call (key, [start, end]) the index of the interval of the same key containing it,
    or -1. Intervals of one key must not overlap (the target's iter ranges never do)."""
    out = np.full(len(keys), -1, dtype=np.int64)
    if len(key_iv) == 0 or len(keys) == 0:
        return out
    order = np.lexsort((start_iv, key_iv))
    ks, ss, es = key_iv[order], start_iv[order], end_iv[order]
    for key in np.unique(keys):
        lo, hi = np.searchsorted(ks, key, "left"), np.searchsorted(ks, key, "right")
        if lo == hi:
            continue
        sel = np.flatnonzero(keys == key)
        pos = np.searchsorted(ss[lo:hi], starts[sel], "right") - 1
        ok = (pos >= 0) & (ends[sel] <= es[lo:hi][np.clip(pos, 0, None)])
        out[sel[ok]] = order[lo + pos[ok]]
    return out


def attribute_kernels(trace: NsysTrace, plan: dict[str, Any] | None = None) -> pd.DataFrame:
    """nsys_kernels: every kernel launched inside an `iter<i>` range, with its variant, shape and call.

    A kernel is joined to the API call that launched it (same correlationId and process); the call's
    [start, end] lies inside the innermost `iter<i>` range on the same thread (`nvtx_match`
    'thread'). Calls made on another thread of the process (autograd runs CUDA backward ops on its
    own device thread, with no NVTX ranges) fall back to the `iter<i>` range of the process that
    contains them in time (`nvtx_match` 'process'): the target runs calls one at a time, so its
    iter ranges never overlap. Kernels outside every iter range (the warm-up) are left out.

    Args:
        trace: `load_sqlite`'s result.
        plan: the target's plan (JSON dict); when given, ranges whose (variant, shape_id) it does not
            list are left out (another program's NVTX ranges).

    Returns:
        A DataFrame with KERNEL_COLUMNS (empty, with the columns, when nothing matched).
    """
    k, api, ranges = trace.kernels, trace.api, trace.ranges
    empty = pd.DataFrame({c: pd.Series(dtype=_KERNEL_DTYPES.get(c, "object")) for c in KERNEL_COLUMNS})
    if k.empty or api.empty or ranges.empty:
        return empty
    calls = api.dropna(subset=["correlation_id", "start", "end"]).drop_duplicates(["correlation_id", "pid"])
    m = k.merge(calls[["correlation_id", "pid", "start", "end", "global_tid", "api"]].rename(
        columns={"start": "api_start_ns", "end": "api_end_ns"}), on=["correlation_id", "pid"], how="inner")
    if m.empty:
        # exports without a pid in the kernel table: correlation ids alone (one profiled process)
        m = k.drop(columns=["pid"]).merge(calls[["correlation_id", "pid", "start", "end", "global_tid", "api"]].rename(
            columns={"start": "api_start_ns", "end": "api_end_ns"}), on="correlation_id", how="inner")
    if m.empty:
        return empty
    it = _iter_ranges(ranges)
    if plan is not None and not it.empty:
        pairs = {(p["variant"], p["shape_id"]) for p in plan.get("pairs", [])}
        it = it[[(v, s) in pairs for v, s in zip(it["variant"], it["shape_id"], strict=True)]].reset_index(drop=True)
    if it.empty:
        return empty
    a_start, a_end = _i64(m["api_start_ns"]), _i64(m["api_end_ns"])
    i_start, i_end = _i64(it["start"]), _i64(it["end"])
    by_thread = _match_intervals(_i64(m["global_tid"]), a_start, a_end, _i64(it["global_tid"]), i_start, i_end)
    by_process = _match_intervals(_i64(m["pid"]), a_start, a_end, _i64(it["pid"]), i_start, i_end)
    idx = np.where(by_thread >= 0, by_thread, by_process)
    keep = idx >= 0
    m = m[keep].reset_index(drop=True)
    idx = idx[keep]
    m["nvtx_match"] = np.where(by_thread[keep] >= 0, "thread", "process")
    for c in ("variant", "shape_id", "iteration"):
        m[c] = it[c].to_numpy()[idx]
    m["iter_start_ns"], m["iter_end_ns"] = i_start[idx], i_end[idx]
    m = m.rename(columns={"start": "start_ns", "end": "end_ns"})
    m["duration_ns"] = m["end_ns"] - m["start_ns"]
    m["launch_latency_ns"] = m["start_ns"] - m["api_start_ns"]
    m["smem_bytes"] = (pd.to_numeric(m["static_smem_bytes"], errors="coerce").astype("Int64")
                       + pd.to_numeric(m["dynamic_smem_bytes"], errors="coerce").astype("Int64"))
    m = m.sort_values(["variant", "shape_id", "iteration", "start_ns"], kind="stable").reset_index(drop=True)
    m["kernel_index"] = m.groupby(["variant", "shape_id", "iteration"]).cumcount()
    out = m[list(KERNEL_COLUMNS)].copy()
    for c, dt in _KERNEL_DTYPES.items():
        if c in out and dt != "object":
            out[c] = pd.to_numeric(out[c], errors="coerce").astype(dt)
    # keep the plan's order of variants and shapes where there is one
    if plan is not None:
        order = {(p["variant"], p["shape_id"]): i for i, p in enumerate(plan.get("pairs", []))}
        out = out.assign(_o=[order.get((v, s), 1 << 30) for v, s in zip(out["variant"], out["shape_id"], strict=True)])
        out = out.sort_values(["_o", "iteration", "kernel_index"], kind="stable").drop(columns="_o").reset_index(drop=True)
    return out


_KERNEL_DTYPES: dict[str, str] = {
    "iteration": "Int64", "kernel_index": "Int64", "start_ns": "Int64", "end_ns": "Int64", "duration_ns": "Int64",
    "grid_x": "Int64", "grid_y": "Int64", "grid_z": "Int64", "block_x": "Int64", "block_y": "Int64", "block_z": "Int64",
    "registers_per_thread": "Int64", "static_smem_bytes": "Int64", "dynamic_smem_bytes": "Int64", "smem_bytes": "Int64",
    "stream": "Int64", "device": "Int64", "correlation_id": "Int64", "api_start_ns": "Int64", "api_end_ns": "Int64",
    "launch_latency_ns": "Int64", "iter_start_ns": "Int64", "iter_end_ns": "Int64", "global_tid": "Int64",
}


def read_kernels(sqlite_path: str | Path, plan: dict[str, Any] | str | Path | None = None) -> pd.DataFrame:
    """`attribute_kernels(load_sqlite(path), plan)`: the one way in from a file (plan: dict or JSON path)."""
    plan_dict = json.loads(Path(plan).read_text()) if isinstance(plan, str | Path) else plan
    return attribute_kernels(load_sqlite(sqlite_path), plan_dict)
