"""Views of the Nsight Compute tables: kernel labels, the longest launch per call, occupancy,
throughput, stall shares and roofline points with their ceilings.

faprof's own tables (faprof.nsight.ncu.tables) have fixed column names; tables of other versions are
read by the words their column names carry (`find_column`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd


# ------------------------------------------------------------------------------ Nsight Compute
def find_column(df: pd.DataFrame, candidates: Sequence[str], contains: Sequence[str] = (),
                exclude: Sequence[str] = ()) -> str | None:
    """The first column named like one of `candidates`, else the first whose name contains every
    word of `contains` and none of `exclude` (case-insensitive). For Nsight tables whose exact
    column names may differ between faprof versions."""
    lower = {c.lower(): c for c in df.columns if isinstance(c, str)}
    for c in candidates:
        if c.lower() in lower:
            return lower[c.lower()]
    if contains:
        for lc, c in lower.items():
            if all(w in lc for w in contains) and not any(w in lc for w in exclude):
                return c
    return None


ALL_KERNELS = "(all)"
"""Kernel name of ncu_summary's per-(variant, shape_id) aggregate rows (faprof.nsight.ncu.summary)."""

PREFERRED_STALL_SOURCE = "warp_state"
"""Of the two stall sources ncu gives (faprof.nsight.ncu.tables.stall_table), warp-state statistics
cover every issued instruction; PC sampling ('pc_sampling') is a sample. Shown unless absent."""

PREFERRED_CEILING_SOURCE = "ncu"
"""Roofline ceilings from ncu's own peak metrics at the clock measured during the kernel (the
other source, 'gpu_db', is the datasheet at the boost clock)."""


def _kernel_rows(df: pd.DataFrame) -> pd.DataFrame:
    """Per-launch rows: the '(all)' aggregate rows ncu_summary carries are left out."""
    k = find_column(df, ("kernel", "kernel_name", "kernel_short"))
    if k is None:
        return df
    return df[df[k].astype(str) != ALL_KERNELS]


def short_kernel(name: Any) -> str:
    """A kernel's name without 'void', namespaces, template arguments and parameters:
    'void at::native::(anonymous)::fmha_fwd<...>(Params)' -> 'fmha_fwd'."""
    s = str(name)
    s = re.sub(r"^void\s+", "", s).replace("(anonymous namespace)", "anonymous")
    depth = 0
    out: list[str] = []
    for ch in s:  # drop everything inside <...> (nested) and stop at the parameter list
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(0, depth - 1)
        elif ch == "(" and depth == 0 and out:
            break
        elif depth == 0:
            out.append(ch)
    base = "".join(out).strip()
    base = base.split("::")[-1] if "::" in base else base
    if re.fullmatch(r"(Kernel\d*|device_kernel|kernel)", base):  # a wrapper: its argument names the kernel
        m = re.search(r"<\s*([A-Za-z_][\w:]*)", s)
        if m:
            base = m.group(1).split("::")[-1]
    return base[:48] or s[:48]


KERNEL_LABEL_CHARS = 26
"""Kernel names in chart labels are cut to this many characters (the full name is in the hover and tables)."""


def clip(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


#: Characters of one label line (the shape id of a varlen or windowed problem can be longer: it wraps).
LABEL_LINE_CHARS = 60


def _wrap_id(shape_id: str) -> str:
    """A shape id on one line, or on two, broken at the underscore nearest the middle, when longer than
    LABEL_LINE_CHARS (never clipped: two problems may differ only in the middle of their ids)."""
    if len(shape_id) <= LABEL_LINE_CHARS:
        return shape_id
    cuts = [i for i, ch in enumerate(shape_id) if ch == "_"]
    if not cuts:
        return shape_id
    i = min(cuts, key=lambda c: abs(c - len(shape_id) // 2))
    return shape_id[:i] + "<br>" + shape_id[i:]


def ncu_key(df: pd.DataFrame) -> pd.Series:
    """'variant · problem · kernel' labels for Nsight Compute rows (bars and legends); '#launch' is
    added where one problem launches the same kernel more than once."""
    cols = [c for c in ("variant", "shape_id") if c in df]
    k = find_column(df, ("kernel_short", "kernel", "kernel_name", "name"))
    if not cols and k is None:
        return pd.Series([str(i) for i in range(len(df))], index=df.index, dtype=object)
    # Two short lines ('variant · kernel' over the problem), so labels leave the chart its width.
    head = df["variant"].astype(str) if "variant" in df else pd.Series("", index=df.index, dtype=object)
    if k is not None:
        kern = df[k].map(lambda n: clip(short_kernel(n), KERNEL_LABEL_CHARS))
        head = kern if "variant" not in df else head + " · " + kern
    out = head + ("<br>" + df["shape_id"].astype(str).map(_wrap_id) if "shape_id" in df else "")
    launch = find_column(df, ("launch", "kernel_id"))
    if launch is not None:
        base = out
        multi = df.assign(_b=base).groupby("_b")[launch].transform("nunique") > 1
        out = base.where(~multi, base + " #" + df[launch].astype(str))
    return out


LAUNCH_KEY = ("variant", "shape_id", "kernel_id")
"""Columns that name one kernel launch in every ncu table (faprof.nsight.ncu.catalogue_core.KEY_COLUMNS)."""


def main_launches(summary: pd.DataFrame) -> pd.DataFrame:
    """The longest kernel launch of each (run, variant, problem) in ncu_summary: the one worth
    looking at first (torch_standard launches a GEMM, a softmax and several small elementwise
    kernels; the GEMM or the softmax dominates).

    Returns:
        The key columns (run_id, variant, shape_id, kernel_id) of those launches; empty when the
        summary has no duration or no launch key.
    """
    s = _kernel_rows(summary)
    keys = [c for c in ("run_id", *LAUNCH_KEY) if c in s]
    if s.empty or "duration_ms" not in s or "kernel_id" not in s:
        return pd.DataFrame(columns=keys)
    d = pd.to_numeric(s["duration_ms"], errors="coerce").fillna(-1.0)
    idx = d.groupby([s[c] for c in keys if c != "kernel_id"]).idxmax()
    return s.loc[idx.to_numpy(), keys].reset_index(drop=True)


def only_launches(df: pd.DataFrame, launches: pd.DataFrame) -> pd.DataFrame:
    """Rows of an ncu table (summary, stalls, roofline) that belong to the given launches."""
    keys = [c for c in launches.columns if c in df.columns]
    if df.empty or launches.empty or "kernel_id" not in keys:
        return df
    return df.merge(launches[keys].drop_duplicates(), on=keys, how="inner")


def occupancy(summary: pd.DataFrame) -> pd.DataFrame:
    """Achieved and theoretical occupancy (%) per kernel launch with the limiter, long format.

    Returns:
        Columns: key, run_id, variant, shape_id, metric ('achieved'/'theoretical'), value (%),
        limiter. Empty when the summary has no occupancy column.
    """
    if summary.empty:
        return pd.DataFrame()
    s = _kernel_rows(summary)
    ach = find_column(s, ("achieved_occupancy_pct", "achieved_occupancy"), ("achieved", "occupancy"))
    theo = find_column(s, ("theoretical_occupancy_pct", "theoretical_occupancy"), ("theoretical", "occupancy"))
    lim = find_column(s, ("occupancy_limiter", "limiter"), ("limiter",))
    metrics = [(n, c) for n, c in (("achieved", ach), ("theoretical", theo)) if c is not None]
    if not metrics:
        return pd.DataFrame()
    rows = []
    key = ncu_key(s)
    for name, col in metrics:
        vals = pd.to_numeric(s[col], errors="coerce")
        if "pct" not in col.lower() and vals.notna().any() and vals.dropna().le(1.0).all():
            vals = vals * 100.0  # a fraction, not a percentage
        rows.append(pd.DataFrame({
            "key": key, "run_id": s.get("run_id"), "variant": s.get("variant"), "shape_id": s.get("shape_id"),
            "metric": name, "value": vals, "limiter": s[lim].fillna("").astype(str) if lim else "",
        }))
    return pd.concat(rows, ignore_index=True).dropna(subset=["value"])


#: Throughput columns of ncu_summary (% of peak), by label: exact names first, then name words.
_THROUGHPUT = (
    ("SM (compute)", ("sm_throughput_pct", "compute_throughput_pct"), ("sm", "throughput")),
    ("memory (busiest unit)", ("memory_throughput_pct", "mem_throughput_pct"), ("memory", "throughput")),
    ("DRAM", ("dram_throughput_pct",), ("dram", "throughput")),
    ("tensor pipe", ("tensor_pipe_util_pct", "tensor_pipe_pct"), ("tensor", "pipe")),
)


def throughput(summary: pd.DataFrame) -> pd.DataFrame:
    """Compute (SM), memory and tensor-pipe throughput as % of peak per kernel launch, long format."""
    if summary.empty:
        return pd.DataFrame()
    s = _kernel_rows(summary)
    key = ncu_key(s)
    rows, seen = [], set()
    for name, exact, words in _THROUGHPUT:
        col = find_column(s, exact, words)
        if col is None or col in seen:
            continue
        seen.add(col)
        rows.append(pd.DataFrame({"key": key, "run_id": s.get("run_id"), "variant": s.get("variant"),
                                  "shape_id": s.get("shape_id"), "metric": name,
                                  "value": pd.to_numeric(s[col], errors="coerce")}))
    if not rows:
        return pd.DataFrame()
    return pd.concat(rows, ignore_index=True).dropna(subset=["value"])


def stall_sources(stalls: pd.DataFrame) -> list[str]:
    """The stall sources a stalls table holds, the preferred one first ([] when it has no `source`)."""
    if stalls.empty or "source" not in stalls:
        return []
    found = [str(x) for x in stalls["source"].dropna().unique()]
    return sorted(found, key=lambda x: (x != PREFERRED_STALL_SOURCE, x))


def stall_shares(stalls: pd.DataFrame, source: str | None = None) -> pd.DataFrame:
    """Stall reasons as % of each kernel launch's stalls (key, reason, share_pct), biggest first.

    Args:
        stalls: the stalls table (faprof.nsight.metrics.stall_table: `share` is a fraction summing
            to 1 per launch and source), or any table with a reason and a share/value column.
        source: which stall source to show when the table has several ('warp_state' by default).
    """
    if stalls.empty:
        return pd.DataFrame()
    s = _kernel_rows(stalls)
    srcs = stall_sources(s)
    if srcs:
        s = s[s["source"] == (source if source in srcs else srcs[0])]
    reason = find_column(s, ("reason", "stall_reason", "stall"), ("reason",))
    value = find_column(s, ("share_pct", "share", "fraction", "pct", "value", "samples", "cycles"), ("share",))
    if reason is None or value is None:
        return pd.DataFrame()
    out = pd.DataFrame({"key": ncu_key(s), "run_id": s.get("run_id"), "variant": s.get("variant"),
                        "shape_id": s.get("shape_id"), "reason": s[reason].astype(str),
                        "raw": pd.to_numeric(s[value], errors="coerce")}).dropna(subset=["raw"])
    if out.empty:
        return out
    lv = value.lower()
    if "pct" in lv:
        out["share_pct"] = out["raw"]
    elif lv in ("share", "fraction") and out["raw"].max() <= 1.0 + 1e-9:
        out["share_pct"] = out["raw"] * 100.0
    else:
        totals = out.groupby("key")["raw"].transform("sum")
        out["share_pct"] = 100.0 * out["raw"] / totals.where(totals > 0)
    order = out.groupby("reason")["share_pct"].sum().sort_values(ascending=False).index
    out["reason"] = pd.Categorical(out["reason"], categories=list(order), ordered=True)
    return out.sort_values(["key", "reason"]).drop(columns="raw").reset_index(drop=True)


_FLOPS_SCALE = (("tflop", 1.0), ("gflop", 1e-3), ("flop", 1e-12))
_BW_SCALE = (("tb", 1e3), ("gb", 1.0), ("byte", 1e-9))


def _scale(name: str, table: Sequence[tuple[str, float]]) -> float:
    n = name.lower()
    for word, f in table:
        if word in n:
            return f
    return 1.0


@dataclass
class Roofline:
    """Points and ceilings for a roofline chart (FLOP/byte on x, TFLOP/s on y)."""

    points: pd.DataFrame
    """key, run_id, variant, shape_id, precision (or ''), intensity, tflops, bound."""
    compute: dict[str, float]
    """Compute ceilings, name -> TFLOP/s."""
    memory: dict[str, float]
    """Memory ceilings, name -> GB/s."""
    source: str = ""
    """Where the ceilings come from ('ncu', 'gpu_db', or '' for a table without that column)."""


def ceiling_sources(table: pd.DataFrame) -> list[str]:
    """The ceiling sources of a roofline table, the preferred ('ncu') first."""
    if table.empty or "ceiling_source" not in table:
        return []
    found = [str(x) for x in table["ceiling_source"].dropna().unique()]
    return sorted(found, key=lambda x: (x != PREFERRED_CEILING_SOURCE, x))


def roofline(table: pd.DataFrame, source: str | None = None) -> Roofline:
    """Roofline points and ceilings from the ncu `roofline` table.

    faprof's table (faprof.nsight.metrics.roofline_table) has two rows per point, one per
    `ceiling_source`; `source` picks one ('ncu' by default). Ceilings are the peak FLOP/s of each
    precision present and the peak DRAM bandwidth. A table with other column names is read by
    the units its names carry ('tflops', 'flops_per_s', 'gbs', 'bytes_per_s'...).
    """
    empty = Roofline(pd.DataFrame(), {}, {})
    if table.empty:
        return empty
    t = _kernel_rows(table)
    srcs = ceiling_sources(t)
    chosen = (source if source in srcs else srcs[0]) if srcs else ""
    if chosen:
        t = t[t["ceiling_source"] == chosen]
    ai = find_column(t, ("arithmetic_intensity", "intensity", "ai", "flop_per_byte", "flops_per_byte"), ("intensity",))
    perf = find_column(t, ("achieved_flops_per_s", "achieved_tflops", "achieved_flops", "tflops", "flops_per_s"),
                       ("achieved",), ("peak", "ceiling", "intensity", "roof"))
    if ai is None or perf is None or t.empty:
        return empty
    prec = find_column(t, ("precision", "level", "memory_level"))
    pts = pd.DataFrame({
        "key": ncu_key(t), "run_id": t.get("run_id"), "variant": t.get("variant"), "shape_id": t.get("shape_id"),
        "precision": t[prec].fillna("").astype(str) if prec else "",
        "intensity": pd.to_numeric(t[ai], errors="coerce"),
        "tflops": pd.to_numeric(t[perf], errors="coerce") * _scale(perf, _FLOPS_SCALE),
        "bound": t["bound"].fillna("").astype(str) if "bound" in t else "",
    }).dropna(subset=["intensity", "tflops"])
    pts = pts[(pts["intensity"] > 0) & (pts["tflops"] > 0)].reset_index(drop=True)
    compute: dict[str, float] = {}
    memory: dict[str, float] = {}
    if "peak_flops_per_s" in t:
        # One roof per FLOP kind (tensor, fp32, ...): its peak, named with where it comes from.
        groups = t.groupby(prec, dropna=True) if prec else [("peak", t)]
        for kind, g in groups:
            v = pd.to_numeric(g["peak_flops_per_s"], errors="coerce").max()
            where = g["ceiling_label"].dropna().astype(str).iloc[0] if "ceiling_label" in g and g["ceiling_label"].notna().any() else ""
            if pd.notna(v) and v > 0:
                compute[f"{kind} peak" + (f" ({where})" if where else "")] = float(v) * 1e-12
        if "peak_dram_bytes_per_s" in t:
            v = pd.to_numeric(t["peak_dram_bytes_per_s"], errors="coerce").max()
            if pd.notna(v) and v > 0:
                memory["DRAM"] = float(v) * 1e-9
    else:
        for c in t.columns:
            lc = str(c).lower()
            if c in (ai, perf) or "pct" in lc or "ridge" in lc or not any(w in lc for w in ("ceiling", "peak")):
                continue
            v = pd.to_numeric(t[c], errors="coerce").dropna()
            if v.empty or v.max() <= 0:
                continue
            if any(w in lc for w in ("bw", "bandwidth", "byte", "gbs", "dram")):
                memory[str(c)] = float(v.max()) * _scale(lc, _BW_SCALE)
            elif "flop" in lc:
                compute[str(c)] = float(v.max()) * _scale(lc, _FLOPS_SCALE)
    return Roofline(pts, compute, memory, chosen)


def roofline_curve(compute_tflops: float, bandwidth_gbs: float, x: np.ndarray) -> np.ndarray:
    """The attainable TFLOP/s at each intensity x: min(compute peak, bandwidth * x)."""
    return np.minimum(compute_tflops, bandwidth_gbs * x / 1e3)


