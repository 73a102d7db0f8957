"""The seed report's published figures beside this run's measurement of the variant that plays the same role.

A figure names its subject (PyTorch SDPA, "the report's custom kernel"...); the scenario may map it to
a faprof variant (`maps_to`), else the report's own kernel is played by faprof's most developed kernel
of the same dtype (`ROLE_STAND_INS`), and the report says so. Different GPUs: the ratio says how far
apart the two machines and implementations are, not which code is better.
"""

from __future__ import annotations

import math
import re
from typing import Any

import pandas as pd

from faprof.analysis import aliases
from faprof.model import schema
from faprof.model.values import as_float
from faprof.report import fmt as f
from faprof.report import table_text as rt
from faprof.report.method import cite

#: faprof's own kernels in the order of the progression, most developed first, per kind of math:
#: the one that stands in for a seed report's own ("custom") kernel when the scenario names none.
ROLE_STAND_INS = {"tensor": ("fa2_mma", "fa2_wmma"), "cuda_core": ("fa2", "fa1", "naive")}
_OWN_KERNEL = re.compile(r"custom|report's .*kernel|our kernel", re.IGNORECASE)


def _stand_in(p: dict[str, Any], df: pd.DataFrame) -> tuple[str, str]:
    """The faprof variant measured against a published figure, and how it was chosen ('' when none)."""
    if p.get("maps_to"):
        return str(p["maps_to"]), "named by the scenario"
    if not _OWN_KERNEL.search(str(p.get("subject", ""))):
        return "", ""
    dtype = (p.get("shape") or {}).get("dtype")
    kinds = ("tensor", "cuda_core") if dtype in ("fp16", "bf16") else ("cuda_core",)
    timed = df[df["status"].isin(schema.TIMED)]
    for kind in kinds:
        for v in ROLE_STAND_INS[kind]:
            if not timed[aliases.runs_kernel_of(timed, v) & ((timed["dtype"] == dtype) if dtype else True)].empty:
                return v, "stand-in"
    return "", ""


def _match(p: dict[str, Any], df: pd.DataFrame, variant: str) -> pd.DataFrame:
    t = df[aliases.runs_kernel_of(df, variant) & df["status"].isin(schema.TIMED)]
    for k, col in (("B", "B"), ("H", "H"), ("D", "D"), ("S", "Sq"), ("dtype", "dtype"), ("causal", "causal"),
                   ("direction", "direction")):
        if k in (p.get("shape") or {}):
            t = t[t[col] == p["shape"][k]]
    return t


def _measured(p: dict[str, Any], r: pd.Series) -> tuple[str, float]:
    """This run's counterpart of a published figure, as text and as a number in the figure's unit."""
    what, unit, note = p.get("what"), p.get("unit", ""), str(p.get("note", ""))
    if what == "latency" and unit == "ms":
        return f"{f.ms(r['median_ms'])} ms (median)", as_float(r["median_ms"])
    if what == "throughput" and unit in ("TFLOP/s", "GFLOP/s"):
        scale = 1e3 if unit == "GFLOP/s" else 1.0
        v = as_float(r.get("tflops")) * scale
        if "not halved" in note and bool(r["causal"]):
            return f"{f.sig(2 * v)} {unit} (report's FLOP count)", 2 * v
        return f"{f.sig(v)} {unit}", v
    if what == "throughput" and unit == "tokens/s":
        return f"{f.count(r.get('tokens_per_s'))} tokens/s", as_float(r.get("tokens_per_s"))
    if what == "max_abs_error":
        return f.err(r.get("max_abs_err")), as_float(r.get("max_abs_err"))
    if what in ("memory", "peak_memory") and unit == "MB":
        col = "peak_mem_bytes" if what == "peak_memory" else "extra_mem_bytes"
        v = as_float(r.get(col)) / 2**20
        return f"{f.sig(v)} MiB ({'peak' if what == 'peak_memory' else 'extra'})", v
    if what == "bandwidth" and unit == "GB/s":
        return f"{f.sig(r.get('gbps'))} GB/s (minimum bytes / time)", as_float(r.get("gbps"))
    if what == "speedup" and unit == "x" and not f.missing(r.get("speedup")):
        return f"{f.ratio(r.get('speedup'))} over {r.get('baseline')}", as_float(r.get("speedup"))
    return "", math.nan


def _bwd_over_fwd(p: dict[str, Any], df: pd.DataFrame, variant: str) -> tuple[str, float]:
    """A published backward/forward time ratio's counterpart: the variant's bwd and fwd medians at
    the figure's shape (one of each), as text and number."""
    shape = {k: v for k, v in (p.get("shape") or {}).items() if k != "direction"}
    rows = {d: _match({**p, "shape": {**shape, "direction": d}}, df, variant) for d in ("fwd", "bwd")}
    if any(len(t) != 1 for t in rows.values()):
        n = {d: len(t) for d, t in rows.items()}
        return (f"{n['fwd']} forward and {n['bwd']} backward rows match; see the tables" if any(n.values()) else ""), math.nan
    fwd, bwd = (as_float(rows[d].iloc[0]["median_ms"]) for d in ("fwd", "bwd"))
    v = bwd / fwd if fwd > 0 else math.nan
    return f"{f.ratio(v)} ({f.ms(bwd)} / {f.ms(fwd)} ms)", v


def published_rows(df: pd.DataFrame, manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """Each published figure with this run's counterpart (variant, text, value, ratio) where one exists."""
    out = []
    for p in manifest.get("published") or []:
        variant, how = _stand_in(p, df)
        text, value, ratio_words = "", math.nan, ""
        if variant and p.get("what") == "bwd_over_fwd":
            text, value = _bwd_over_fwd(p, df, variant)
        elif variant:
            t = _match(p, df, variant)
            if len(t) == 1:
                text, value = _measured(p, t.iloc[0])
                text = text or "not measured by faprof's timing (a profiler figure)"
            elif len(t) > 1:
                text = f"{len(t)} shapes match; see the tables"
        pv = as_float(p.get("value"))
        if value == value and pv == pv and value > 0 and pv > 0:
            if p.get("what") == "latency":
                ratio_words = f"{f.ratio(pv / value)} less time" if value < pv else f"{f.ratio(value / pv)} more time"
            elif p.get("what") == "throughput":
                ratio_words = f"{f.ratio(value / pv)} the rate"
        out.append({**p, "variant": variant, "how": how, "measured": text, "measured_value": value, "ratio": ratio_words})
    return out


def section(df: pd.DataFrame, m: dict[str, Any], gpu: str) -> list[str]:
    """The first screen's published-figures section ([] when the scenario quotes none)."""
    pubs = published_rows(df, m)
    if not pubs:
        return []
    their_gpu = ", ".join(dict.fromkeys(str(p.get("gpu")) for p in pubs))
    lines = [f"## Against the published figures ({their_gpu})", ""]
    cited = cite((m.get("scenario") or {}).get("source"))
    subjects: dict[str, tuple[str, str]] = {}
    for p in pubs:
        if p["variant"]:
            subjects.setdefault(p["subject"], (p["variant"], p["how"]))
    timed = df[df["status"].isin(schema.TIMED)]
    ran = {*timed["variant"], *(v for v, _ in aliases.folded_keys(timed))}  # an alias ran as its canonical
    roles = [f"{s} → **{v}**" + (" (faprof's own kernel of the same dtype, standing in for it)" if how == "stand-in" else "")
             + ("" if v in ran else " (not timed in this run)") for s, (v, how) in subjects.items()]
    lines.append(f"Figures quoted from {cited or 'the seed report'} on its {their_gpu}, beside this run on the {gpu}. "
                 f"Who plays whom: {'; '.join(roles) or 'no figure names a faprof variant'}. "
                 "Different GPUs: the ratio says how far apart the two machines and implementations are, not which code is better.")
    lines.append("")
    for subject, (v, _) in subjects.items():
        lat = [p for p in pubs if p["subject"] == subject and p["what"] == "latency" and p["measured_value"] == p["measured_value"]]
        if len(lat) >= 2:
            r = sorted(as_float(p["value"]) / p["measured_value"] for p in lat)
            lines.append(f"- {subject} vs {v}: {v} takes {f.ratio(r[0])}–{f.ratio(r[-1])} less time here "
                         f"over the {len(lat)} published latencies." if r[0] > 1 else
                         f"- {subject} vs {v}: time ratio (published / here) {f.ratio(r[0])}–{f.ratio(r[-1])} over {len(lat)} shapes.")
    lines.append("")
    rows = [{"published figure": f"{p['what'].replace('_', ' ')}: {p['subject']}",
             "shape": " ".join(f"{k}={v}" for k, v in (p.get("shape") or {}).items() if k not in ("dtype", "causal", "D")) or f.MISSING,
             f"published ({p.get('gpu')})": f"{f.as_written(p.get('value'))} {p.get('unit', '')}".strip()
             + (f" ({p['stat']})" if p.get("stat") else ""),
             f"measured here ({gpu})": (f"{p['variant']}: {p['measured']}" if p["measured"] else
                                       (f"{p['variant']}: not in this run" if p["variant"] else "no faprof counterpart")),
             "here vs published": p["ratio"] or f.MISSING} for p in pubs]
    return [*lines, rt.md_table(pd.DataFrame(rows))]
