"""Why a gated row moved: the ncu counters and stall shares that changed most, and the advisor's findings that changed.

Used by `faprof.gate` for rows it finds slower, when both bundles have ncu tables. Kernels
of a call are matched by name and occurrence (the second launch of a kernel in a call with the
second); counters are a curated set of `ncu_summary` columns (`COUNTERS`), ranked by relative
change; stall reasons by the change in their share of the kernel's stall cycles; advisor findings
(`faprof.advisor.diagnose`, its public columns only) by cause and title.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Any

import pandas as pd

from faprof import advisor
from faprof.model.values import as_float
from faprof.store import Bundle

#: ncu_summary columns compared for a regressed row, with the label and unit they are shown with.
#: What a kernel change moves: launch shape and resources (registers, shared memory, grid, block,
#: occupancy and waves), how busy each unit is (SM, memory, DRAM, L2, tensor and FMA pipes), the
#: work and traffic the hardware counted (instructions by pipe, FLOPs, DRAM bytes, shared-memory
#: instructions and wavefronts), and the classic defects (bank conflicts, spills, uncoalesced loads).
COUNTERS: tuple[tuple[str, str, str], ...] = (
    ("duration_ms", "ncu duration", "ms"),
    ("registers_per_thread", "registers", ""),
    ("smem_per_block_bytes", "shared memory per block", "B"),
    ("grid_size", "grid", ""),
    ("block_size", "block", ""),
    ("theoretical_occupancy_pct", "theoretical occupancy", "%"),
    ("achieved_occupancy_pct", "occupancy", "%"),
    ("waves_per_sm", "waves", ""),
    ("sm_throughput_pct", "SM throughput", "%"),
    ("memory_throughput_pct", "memory throughput", "%"),
    ("dram_throughput_pct", "DRAM throughput", "%"),
    ("l2_throughput_pct", "L2 throughput", "%"),
    ("l2_hit_rate_pct", "L2 hit rate", "%"),
    ("dram_bytes", "DRAM bytes", "B"),
    ("tensor_pipe_util_pct", "tensor pipe", "%"),
    ("fma_pipe_util_pct", "FMA pipe", "%"),
    ("tensor_hmma_inst", "mma.sync instructions", ""),
    ("tensor_gmma_inst", "wgmma instructions", ""),
    ("hw_flops", "executed FLOPs", ""),
    ("smem_inst", "shared-memory instructions", ""),
    ("smem_wavefronts", "shared-memory wavefronts", ""),
    ("smem_wavefronts_per_inst", "shared wavefronts per instruction", ""),
    ("smem_excessive_wavefronts", "excess shared wavefronts (bank conflicts)", ""),
    ("smem_bank_conflicts", "shared bank conflicts (with arbitration)", ""),
    ("local_ld_sectors", "local-memory load sectors (spills)", ""),
    ("local_st_sectors", "local-memory store sectors (spills)", ""),
    ("global_ld_sectors_per_request", "global sectors per load request", ""),
    ("global_excessive_sectors", "excess global sectors", ""),
)

#: A counter that moved by less than this (relative) is not listed: below the default time threshold,
#: so it cannot by itself be why a row moved past it.
MIN_COUNTER_CHANGE = 0.02
#: Counters listed per regressed row (largest relative change first).
TOP_COUNTERS = 6
#: A stall reason whose share of the kernel's stall cycles moved by less than this (a fraction of
#: the cycles, not a relative change: a share going from 0.1% to 1% is tenfold and explains nothing)
#: is not listed.
STALL_MIN_CHANGE = 0.02
#: Stall reasons listed per regressed row (largest change in share first).
TOP_STALLS = 3
#: Kernels below this share of their call's ncu duration on both sides are left out of the counters
#: (a 2-µs preprocessing kernel's counters swing and say little about the call).
WHY_MIN_KERNEL_SHARE = 0.1
#: Advisor findings compared: causes and positions, not ncu's own rule texts or notes (which restate them).
ADVISOR_KINDS = ("correctness", "defect", "limit", "position")
#: A finding on both sides whose estimated share of the call moved by at least this many points is listed.
ADVISOR_GAIN_CHANGE_PP = 5.0

#: Counters and stall changes quoted in a row's one-line summary (the full lists are in JSON/Markdown).
SUMMARY_COUNTERS = 4
SUMMARY_STALLS = 2

def fmt_value(v: float, unit: str) -> str:
    """A counter's value for people: '25%', '0.569 ms', '48 KiB', '168', '81.9k', '5.45G'."""
    if unit == "%":
        return f"{v:.0f}%" if abs(v) >= 10 else f"{v:.2g}%"
    if unit == "ms":
        return f"{v:.4g} ms"
    if unit == "B":
        for size, u in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
            if abs(v) >= size:
                return f"{v / size:.3g} {u}"
        return f"{v:.0f} B"
    for floor, div, u in ((1e12, 1e12, "T"), (1e9, 1e9, "G"), (1e6, 1e6, "M"), (1e4, 1e3, "k")):
        if abs(v) >= floor:  # counts: 3 significant digits past 10,000
            return f"{v / div:.3g}{u}"
    return f"{v:.4g}"


def _calls(summary: pd.DataFrame, variant: str, shape_id: str) -> dict[tuple[str, int], pd.Series]:
    """The kernels of one call by (name, occurrence of that name), in launch order."""
    if summary.empty:
        return {}
    s = summary[(summary["variant"] == variant) & (summary["shape_id"] == shape_id) & (summary["kernel"] != "(all)")]
    if "launch" in s:
        s = s.sort_values("launch", kind="stable")
    out: dict[tuple[str, int], pd.Series] = {}
    seen: Counter[str] = Counter()
    for _, k in s.iterrows():
        name = str(k["kernel"])
        out[(name, seen[name])] = k
        seen[name] += 1
    return out


def _shares(call: dict[tuple[str, int], pd.Series]) -> dict[tuple[str, int], float]:
    d = {k: as_float(v.get("duration_ms")) for k, v in call.items()}
    total = sum(x for x in d.values() if math.isfinite(x))
    return {k: (x / total if total > 0 and math.isfinite(x) else math.nan) for k, x in d.items()}


def _big_kernels(call_a: dict[tuple[str, int], pd.Series], call_b: dict[tuple[str, int], pd.Series]) -> set:
    """Kernels in both calls holding at least WHY_MIN_KERNEL_SHARE of their call's ncu time on a side
    (a kernel whose time ncu did not record counts: nothing says it is small)."""
    sh_a, sh_b = _shares(call_a), _shares(call_b)

    def big(x: float) -> bool:
        return not math.isfinite(x) or x >= WHY_MIN_KERNEL_SHARE
    return {k for k in call_a if k in call_b and (big(sh_a[k]) or big(sh_b[k]))}


def _stall_map(stalls: pd.DataFrame, variant: str, shape_id: str, call: dict[tuple[str, int], pd.Series]) -> dict:
    if stalls.empty:
        return {}
    s = stalls[(stalls["variant"] == variant) & (stalls["shape_id"] == shape_id)]
    out: dict[tuple[str, int], dict[str, float]] = {}
    for key, k in call.items():
        rows = s[(s["kernel"] == k["kernel"]) & (s["launch"] == k.get("launch"))] if "launch" in s else s[s["kernel"] == k["kernel"]]
        out[key] = {str(r): float(v) for r, v in zip(rows["reason"], rows["share"], strict=True) if pd.notna(v)}
    return out


def counter_changes(call_a: dict[tuple[str, int], pd.Series], call_b: dict[tuple[str, int], pd.Series]) -> list[dict[str, Any]]:
    """The curated ncu counters (`COUNTERS`) that moved most between two calls' kernels.

    Args:
        call_a: the baseline call's kernels, by (name, occurrence).
        call_b: the candidate call's kernels.

    Returns:
        Dicts (kernel, counter, label, unit, baseline, candidate, rel_change), largest |log ratio|
        first (a counter going from 0 to something first of all), those under MIN_COUNTER_CHANGE
        left out; kernels on one side only as entries with counter 'kernel'.
    """
    out: list[tuple[float, dict[str, Any]]] = []
    for key in [k for k in call_a if k not in call_b]:
        out.append((math.inf, {"kernel": key[0], "counter": "kernel", "label": "kernel", "unit": "",
                               "baseline": 1.0, "candidate": 0.0, "rel_change": -1.0}))
    for key in [k for k in call_b if k not in call_a]:
        out.append((math.inf, {"kernel": key[0], "counter": "kernel", "label": "kernel", "unit": "",
                               "baseline": 0.0, "candidate": 1.0, "rel_change": math.inf}))
    big = _big_kernels(call_a, call_b)
    for key in [k for k in call_a if k in big]:
        ka, kb = call_a[key], call_b[key]
        for col, label, unit in COUNTERS:
            va, vb = as_float(ka.get(col)), as_float(kb.get(col))
            if not (math.isfinite(va) and math.isfinite(vb)) or va == vb or va < 0 or vb < 0:
                continue
            if va == 0:
                rank, rel = math.inf, math.inf
            elif vb == 0:
                rank, rel = math.inf, -1.0
            else:
                rel = vb / va - 1
                rank = abs(math.log(vb / va))
            if abs(rel) < MIN_COUNTER_CHANGE:
                continue
            out.append((rank, {"kernel": key[0], "counter": col, "label": label, "unit": unit,
                               "baseline": va, "candidate": vb, "rel_change": rel}))
    out.sort(key=lambda t: -t[0])
    return [d for _, d in out[:TOP_COUNTERS]]


def stall_changes(stalls_a: dict, stalls_b: dict) -> list[dict[str, Any]]:
    """Stall reasons whose share of a kernel's stall cycles moved by at least STALL_MIN_CHANGE.

    Args:
        stalls_a: {(kernel, occurrence): {reason: share}} of the baseline call.
        stalls_b: the same for the candidate.

    Returns:
        Dicts (kernel, reason, baseline, candidate, change), largest |change| first, TOP_STALLS at most.
    """
    out = []
    for key in [k for k in stalls_a if k in stalls_b]:
        a, b = stalls_a[key], stalls_b[key]
        for reason in sorted(set(a) | set(b)):
            sa, sb = a.get(reason, 0.0), b.get(reason, 0.0)
            if abs(sb - sa) >= STALL_MIN_CHANGE:
                out.append({"kernel": key[0], "reason": reason, "baseline": sa, "candidate": sb, "change": sb - sa})
    out.sort(key=lambda d: -abs(d["change"]))
    return out[:TOP_STALLS]


def advisor_changes(diag_a: pd.DataFrame, diag_b: pd.DataFrame, variant: str, shape_id: str) -> list[dict[str, Any]]:
    """Advisor findings (`advisor.diagnose` rows of ADVISOR_KINDS) that appeared, vanished, became
    primary or changed their estimated share of the call by ADVISOR_GAIN_CHANGE_PP points or more.

    Args:
        diag_a: diagnose() of the baseline bundle.
        diag_b: diagnose() of the candidate bundle.
        variant: the row's variant.
        shape_id: the row's shape.

    Returns:
        Dicts (change: new / gone / primary / grew / shrank, cause, title, baseline_gain_pct,
        candidate_gain_pct), the primary change first.
    """
    def pick(d: pd.DataFrame) -> pd.DataFrame:
        if d.empty:
            return d
        return d[(d["variant"] == variant) & (d["shape_id"] == shape_id) & d["kind"].isin(ADVISOR_KINDS)]

    a, b = pick(diag_a), pick(diag_b)
    ga = {(r.cause, r.title): float(r.estimated_gain_pct) for r in a.itertuples()}
    gb = {(r.cause, r.title): float(r.estimated_gain_pct) for r in b.itertuples()}
    out: list[dict[str, Any]] = []
    pa = a[a["primary"]]["title"].tolist() if not a.empty else []
    pb = b[b["primary"]]["title"].tolist() if not b.empty else []
    if pa != pb and (pa or pb):
        out.append({"change": "primary", "cause": ", ".join(b[b["primary"]]["cause"]) if not b.empty else "",
                    "title": f"{', '.join(pa) or 'none'} -> {', '.join(pb) or 'none'}",
                    "baseline_gain_pct": math.nan, "candidate_gain_pct": math.nan})
    for k in gb:
        if k not in ga:
            out.append({"change": "new", "cause": k[0], "title": k[1], "baseline_gain_pct": math.nan,
                        "candidate_gain_pct": gb[k]})
    for k in ga:
        if k not in gb:
            out.append({"change": "gone", "cause": k[0], "title": k[1], "baseline_gain_pct": ga[k],
                        "candidate_gain_pct": math.nan})
    for k in ga:
        if k in gb and math.isfinite(ga[k]) and math.isfinite(gb[k]) and abs(gb[k] - ga[k]) >= ADVISOR_GAIN_CHANGE_PP:
            out.append({"change": "grew" if gb[k] > ga[k] else "shrank", "cause": k[0], "title": k[1],
                        "baseline_gain_pct": ga[k], "candidate_gain_pct": gb[k]})
    return out


def why_summary(why: dict[str, Any]) -> str:
    """One line: advisor changes, then the counters and stall shares that moved most."""
    parts: list[str] = []
    for c in why.get("advisor", []):
        gain_b, gain_a = c["candidate_gain_pct"], c["baseline_gain_pct"]
        if c["change"] == "new":
            parts.append(f"new: {c['title']}" + (f" ~{gain_b:.0f}% of the call" if math.isfinite(gain_b) else ""))
        elif c["change"] == "gone":
            parts.append(f"gone: {c['title']}")
        elif c["change"] == "primary":
            parts.append(f"primary cause: {c['title']}")
        else:
            parts.append(f"{c['title']} ~{gain_a:.0f}% -> ~{gain_b:.0f}% of the call")
    multi = len({c["kernel"] for c in why.get("counters", [])}) > 1
    for c in why.get("counters", [])[:SUMMARY_COUNTERS]:
        prefix = f"[{c['kernel']}] " if multi else ""
        if c["counter"] == "kernel":
            parts.append(f"kernel {c['kernel']} {'appeared' if c['candidate'] else 'vanished'}")
            continue
        rel = "" if c["unit"] == "%" or not math.isfinite(c["rel_change"]) else f" ({c['rel_change']:+.1%})"
        parts.append(f"{prefix}{c['label']} {fmt_value(c['baseline'], c['unit'])} -> "
                     f"{fmt_value(c['candidate'], c['unit'])}{rel}")
    for s in why.get("stalls", [])[:SUMMARY_STALLS]:
        parts.append(f"stall {s['reason']} {s['baseline']:.0%} -> {s['candidate']:.0%} of stall cycles")
    return "; ".join(parts) if parts else why.get("note", "")


@dataclass
class Nsight:
    """One bundle's ncu tables and diagnosis, read once."""

    summary: pd.DataFrame
    stalls: pd.DataFrame
    bundle: Bundle
    _diag: pd.DataFrame | None = None

    @classmethod
    def of(cls, b: Bundle) -> Nsight:
        return cls(b.read("ncu_summary"), b.read("stalls"), b)

    @property
    def diag(self) -> pd.DataFrame:
        if self._diag is None:
            self._diag = advisor.diagnose(self.bundle)
        return self._diag


def why_moved(na: Nsight, nb: Nsight, variant: str, shape_id: str) -> dict[str, Any]:
    """What changed in one row's ncu tables and diagnosis between baseline and candidate.

    Returns:
        {'counters': [...], 'stalls': [...], 'advisor': [...], 'summary': str}, or {'note': ...}
        when ncu did not profile the row on both sides.
    """
    ca, cb = _calls(na.summary, variant, shape_id), _calls(nb.summary, variant, shape_id)
    if not ca or not cb:
        side = "either side" if not ca and not cb else ("the baseline" if not ca else "the candidate")
        return {"note": f"ncu did not profile this row on {side}", "counters": [], "stalls": [], "advisor": []}
    big = _big_kernels(ca, cb)
    sa = {k: v for k, v in _stall_map(na.stalls, variant, shape_id, ca).items() if k in big}
    why: dict[str, Any] = {
        "counters": counter_changes(ca, cb),
        "stalls": stall_changes(sa, _stall_map(nb.stalls, variant, shape_id, cb)),
        "advisor": advisor_changes(na.diag, nb.diag, variant, shape_id),
    }
    why["summary"] = why_summary(why) or "no curated counter, stall share or advisor finding moved past its floor"
    return why
