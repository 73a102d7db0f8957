"""diagnose(): the ranked causes of every (variant, shape): why it is slower than the fastest variant
there (or a named one), split from the accounting, then what holds for the kernel on its own;
summarize(): one row per (variant, cause) across shapes.

Order of work for one call:
1. every rule over the call and its launches (`rules_call`, `rules_kernel`: mechanisms named from
   their own counters, and the accounting's stall terms) gives the absolute findings, in shares of the
   call's time; a stall term a mechanism of the same kernel claims is dropped (the mechanism says it);
2. a cause the fastest call at the shape shares with most calls there is a note about the shape, said
   once (variant "(all)"), and dropped from every call;
3. the gap to the reference (the fastest profiled call at the shape, or `against`) is split into the
   accounting's terms (`differential`), and mechanisms claim their terms (`gap_findings`): these are
   the causes in shares of the gap;
4. ranking: wrong results first; then the largest cause of the gap (at least PRIMARY_MIN_GAP_SHARE of
   it), else the largest absolute cause (at least PRIMARY_MIN_GAIN of the call), else the roofline
   position; then the rest.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from typing import Any

import pandas as pd

from faprof.advisor.accounting import missing_counters
from faprof.advisor.causes import KINDS, record
from faprof.advisor.differential import decompose, fold_aliases, level_with, reference_for
from faprof.advisor.evidence import Call, calls_from, ok, tables_from
from faprof.advisor.findings import Finding, pct_of_share
from faprof.advisor.gap_findings import gap_findings
from faprof.advisor.roles import movers
from faprof.advisor.rules_call import CALL_RULES, CALL_RULES_FIRST, merge_ncu_rules
from faprof.advisor.rules_kernel import KERNEL_RULES, KERNEL_TERM_RULES, MOVER_RULES, Context
from faprof.advisor.rules_pair import pair_findings
from faprof.advisor.sources import attach, borrow
from faprof.advisor.thresholds import value as T
from faprof.model import schema
from faprof.model.values import as_float

#: Columns of diagnose()'s table, in order.
DIAG_COLUMNS = ("variant", "shape_id", "dtype", "group", "rank", "primary", "cause", "title", "kind", "kernel",
                "estimated_gain_pct", "unit", "against", "share_of_gap_pct", "gap_ms", "net_ms", "parent", "evidence",
                "fix", "source", "rule", "aliases")

#: Columns of summarize()'s table, in order.
SUMMARY_COLUMNS = ("variant", "dtype", "group", "cause", "title", "kind", "unit", "against", "primary_shapes", "shapes",
                   "n_shapes", "max_gain_pct", "median_gain_pct", "evidence", "fix", "source", "aliases")

#: Causes summarize() keeps per (dtype, variant) besides those primary on some shape (None: all);
#: `faprof explain --per-shape` lists every finding.
SUMMARY_TOP = 3

#: The variant name of shape notes (a fact about a shape, not about one variant).
SHAPE_ROW = "(all)"


def _absolute(call: Call, ctx: Context) -> list[Finding]:
    ctx.split_launches = set()
    found: list[Finding] = []
    for crule in CALL_RULES_FIRST:
        found += crule(call, ctx)
    moving = movers(call)
    for lz in call.launches:
        mover = any(m is lz for m in moving)
        for krule in MOVER_RULES if mover else KERNEL_RULES:
            f = krule(lz, call, ctx)
            if f is not None:
                found.append(f)
        for trule in () if mover else KERNEL_TERM_RULES:
            found += trule(lz, call, ctx)
    for crule in CALL_RULES:
        found += crule(call, ctx)
    found += merge_ncu_rules(call, found)
    # a stall a mechanism of the same kernel explains is that mechanism's (spills -> long_scoreboard ...)
    claimed = {(f.kernel, t) for f in found for t in record(f.cause).claims if not t.endswith("*")}
    found = [f for f in found if not (f.cause.startswith("stall:") and (f.kernel, f.cause) in claimed)]
    found = _within_headroom(call, found)
    keep = []
    for f in found:
        if ok(f.gain):
            if f.gain >= T("MIN_GAIN") or f.kind == "correctness":
                keep.append(f)
        elif f.kind in ("correctness", "note", "defect", "limit"):  # a cause whose size cannot be estimated
            keep.append(f)
    return keep


def headroom(call: Call) -> tuple[float, str]:
    """(share of the call's time above its floor, what the floor is) from the row's position against
    the run's measured ceiling: the copy bandwidth for a memory-bound problem, the matmul ceiling for a
    compute-bound one; (NaN, '') where the row has neither."""
    m = call.measurement
    bound = m.get("bound")
    col, what = {"memory": ("pct_copy", "the measured copy bandwidth"),
                 "compute": ("pct_measured_ceiling", "the measured matmul ceiling")}.get(str(bound), ("", ""))
    level = as_float(m.get(col)) if col else math.nan
    if not ok(level):
        return math.nan, ""
    return max(0.0, 1.0 - level / 100.0), f"{level:.0f}% of {what} ({bound}-bound problem)"


def _within_headroom(call: Call, found: list[Finding]) -> list[Finding]:
    """No finding claims more of the call's time than lies above its ceiling (a decode kernel at the
    copy bandwidth cannot gain 40% by hiding memory latency: its bytes take the time); a call within
    AT_BOUND_HEADROOM of its ceiling says so, as a note."""
    room, where = headroom(call)
    if not ok(room):
        return found
    out = []
    for f in found:
        if f.unit == "call" and ok(f.gain) and f.gain > room and f.kind not in ("correctness", "note"):
            f = dataclasses.replace(f, gain=room, evidence=f"{f.evidence} (at most {pct_of_share(room)} of the call's "
                                    f"time lies above its ceiling: {where})")
        out.append(f)
    if room <= T("AT_BOUND_HEADROOM"):
        out.append(Finding(call.variant, call.shape_id, "at_bound", math.nan,
                           f"{where}: the kernel moves (or computes) what the problem needs at the rate the "
                           f"machine was measured to sustain; at most {pct_of_share(room)} of its time lies above that",
                           "none within the kernel at this size: fewer bytes (a narrower K/V cache dtype, fewer "
                           "KV heads read) or fewer FLOPs change the floor itself", "call:at_bound"))
    return out


def _gain(f: Finding) -> float:
    return f.gain if ok(f.gain) else -1.0


def _rank(found: list[Finding], level: bool = False) -> list[tuple[Finding, bool]]:
    """The primary finding first, then the rest: gap causes by share (each followed by its symptoms),
    then absolute causes by gain, positions, ncu rules, notes. A call level with its comparator (`level`)
    gets no primary cause (wrong results still come first)."""
    primary: Finding | None = next((f for f in found if f.kind == "correctness"), None)
    gap = [f for f in found if f.unit == "gap" and f.kind not in ("note", "ncu") and ok(f.gap_share)]
    if level:
        rest = sorted((f for f in found if f is not primary), key=lambda f: (f.cause != "level", -_gain(f)))
        return ([(primary, True)] if primary is not None else []) + [(f, False) for f in rest]
    if primary is None:
        eligible = [f for f in gap if f.gap_share >= T("PRIMARY_MIN_GAP_SHARE")]
        if eligible:
            primary = max(eligible, key=lambda f: f.gap_share)
    if primary is None:
        absolute = [f for f in found if f.unit != "gap"]
        causes = [f for f in absolute if f.kind in ("defect", "limit", "term") and ok(f.gain)
                  and f.gain >= T("PRIMARY_MIN_GAIN")]
        positions = [f for f in absolute if f.kind == "position"]
        pool = causes or positions
        primary = max(pool, key=_gain) if pool else None
    order = {k: i for i, k in enumerate(KINDS)}
    tier = {"correctness": 0, "defect": 2, "limit": 2, "term": 2, "position": 3, "ncu": 4, "note": 5}

    parent_share = {f.cause: f.gap_share for f in gap}

    def key(f: Finding) -> tuple:
        if f.unit == "gap" and f.kind not in ("note", "ncu"):  # a symptom right after its parent
            share = parent_share.get(f.parent, 0.0) if f.parent else f.gap_share
            return (1, -(share if ok(share) else 0.0), 1 if f.parent else 0)
        return (tier.get(f.kind, 6), -_gain(f), order.get(f.kind, 9))

    rest = sorted((f for f in found if f is not primary), key=key)
    return ([(primary, True)] if primary is not None else []) + [(f, False) for f in rest]


def _shape_notes(calls: list[Call], absolute: dict[int, list[Finding]]) -> list[Finding]:
    """Causes the fastest profiled call at a shape shares with most calls there: one note per shape
    and cause (variant SHAPE_ROW); the cause is dropped from every call at the shape."""
    notes: list[Finding] = []
    by_shape: dict[str, list[Call]] = defaultdict(list)
    for c in calls:
        if id(c) in absolute and c.launches and ok(_median(c)):
            by_shape[c.shape_id].append(c)
    for shape, group in by_shape.items():
        if len(group) < 2:
            continue
        fastest = min(group, key=_median)
        others = [c for c in group if c is not fastest]
        for f in list(absolute[id(fastest)]):
            if not record(f.cause).of_shape:
                continue
            sharing = [c for c in others if any(g.cause == f.cause for g in absolute[id(c)])]
            if len(sharing) < T("SHAPE_NOTE_MIN_SHARE") * len(others):
                continue
            for c in (fastest, *others):
                absolute[id(c)] = [g for g in absolute[id(c)] if g.cause != f.cause]
            title = record(f.cause).title
            notes.append(Finding(SHAPE_ROW, shape, f.cause, math.nan,
                                 f"{title}: true of the fastest call here ({fastest.variant}: {f.evidence}) and of "
                                 f"{len(sharing)} of the {len(others)} other profiled variants: a property of the "
                                 "shape, not a defect of a kernel", f.fix, f"shape:{f.rule}", kernel=f.kernel,
                                 kind="note", title=f"the shape: {title}"))
    return notes


def _median(c: Call) -> float:
    v = as_float(c.measurement.get("median_ms"))
    return v if c.measurement.get("status") in ("ok", "wrong") and ok(v) and v > 0 else math.nan


def _row(f: Finding, call: Call | None, rank: int, primary: bool) -> dict[str, Any]:
    m = call.measurement if call is not None else {}
    return {
        "variant": f.variant, "shape_id": f.shape_id, "dtype": call.dtype if call is not None else None,
        "group": m.get("group"), "rank": rank, "primary": primary, "cause": f.cause, "title": f.title,
        "kind": f.kind, "kernel": f.kernel,
        # in the unit the row names: the share of the slowdown to `against` (0..100) or of the call's time
        "estimated_gain_pct": (100 * f.gap_share if f.unit == "gap" and ok(f.gap_share)
                               else 100 * f.gain if ok(f.gain) else math.nan),
        "unit": f.unit, "against": f.against or None,
        "share_of_gap_pct": 100 * f.gap_share if ok(f.gap_share) else math.nan,
        "gap_ms": f.gap_ms if ok(f.gap_ms) else math.nan, "net_ms": f.net_ms if ok(f.net_ms) else math.nan,
        "parent": f.parent or None, "evidence": f.evidence,
        "fix": f.fix,
        "source": f.source or None, "rule": f.rule,
    }


def _call_findings(call: Call, calls: list[Call], absolute: dict[int, list[Finding]],
                   against: str | None) -> tuple[list[Finding], bool]:
    """A call's findings: its own, and the causes of its gap to the reference (its bytes and math paths
    compared, then the partition); True as the second value when it is level with its comparator."""
    found = list(absolute[id(call)])
    level = level_with(call, calls, against) if call.launches else None
    if level is not None:
        found.append(Finding(call.variant, call.shape_id, "level", math.nan,
                             f"within {100 * (T('LEVEL_RATIO') - 1):.0f}% of {level} in time, and not "
                             f"{100 * (T('LEVEL_CYCLES_RATIO') - 1):.0f}% apart in both time and Nsight Compute's replayed "
                             "cycles (noise between two runs of one kernel): no gap to explain", "none needed", "gap:level", unit="gap", against=level))
        return found, True
    ref = reference_for(call, calls, against) if call.launches else None
    if ref is None:
        return found, False
    gap = decompose(call, ref)
    if gap is not None:
        pair = pair_findings(call, ref, absolute[id(call)])
        causes = gap_findings(gap, call, ref, absolute[id(call)] + pair, absolute.get(id(ref), []))
        children = {f.cause for f in causes if f.parent}
        found = [f for f in found if f.cause not in children] + causes
    elif missing_counters(call) or missing_counters(ref):
        lacking = sorted(set(missing_counters(call)) | set(missing_counters(ref)))
        found.append(Finding(call.variant, call.shape_id, "missing_counters", math.nan,
                             f"the gap to {ref.variant} cannot be split: the bundle lacks the accounting's "
                             f"counters ({', '.join(lacking)})",
                             "profile again with this faprof's `--ncu` (the faprof set requests them)",
                             "gap:missing", unit="gap", against=ref.variant))
    return found, False


def diagnose(source: Any, against: str | None = None) -> pd.DataFrame:
    """The ranked diagnosis of every (variant, shape) in a bundle.

    Args:
        source: a faprof Bundle, or a mapping {table name: DataFrame} with any of measurements,
            ncu_summary, ncu_metrics, stalls, roofline, nsys_summary, nsys_kernels, ncu_rules (each
            optional), plus optionally 'env' (the manifest's environment: gpu_name for peaks).
        against: the variant every gap is measured to (default: the fastest profiled variant at each
            shape).

    Returns:
        One row per finding (DIAG_COLUMNS): rank 1 is the primary finding of its (variant, shape)
        (`primary` True) unless no finding qualifies. `unit` says what a share is of: 'call' (the call's
        GPU time: estimated_gain_pct), 'gap' (the measured gap to `against`: share_of_gap_pct, its share of
        the slowdown, 0..100, gap_ms its estimated gain, at most the gap, and net_ms that gain before it
        is clipped to the gap). Shape notes have
        variant "(all)". evidence quotes the figures; `rule` names the rule (`gap:<term>` for a term
        of the gap, `ncu:<rule>` for Nsight Compute's own).
    """
    tables = tables_from(source)
    ctx = Context(env=dict(tables.env))
    calls = [c for c in calls_from(tables) if c.measurement.get("status") in (None, "ok", "wrong")]
    # one kernel, one call: aliases (declared, or the same kernels recorded) fold into their canonical
    # variant, so no variant is explained twice or compared with its own kernel
    calls, also, canon = fold_aliases(calls, tables)
    lines = borrow(tables.get("source_lines"), calls)
    ctx.lines = lines
    ctx.demangled = {(c.variant, c.shape_id, lz.kernel): str(lz.row.get("kernel_demangled") or lz.kernel)
                     for c in calls for lz in c.launches}
    absolute = {id(c): _absolute(c, ctx) for c in calls}
    notes = _shape_notes(calls, absolute)
    parsed: dict = {}  # each profiled kernel's SASS parsed once, however many causes and shapes point at it
    rows: list[dict[str, Any]] = []
    for call in calls:
        ag = canon.get((against, call.shape_id), against) if against else None
        if ag == call.variant:  # the comparator is this call's own kernel under another name: nothing to explain
            found, level = list(absolute[id(call)]), False
        else:
            found, level = _call_findings(call, calls, absolute, ag)
        ranked = _rank(found, level)
        attach([f for f, _ in ranked], lines, call.variant, call.shape_id, memo=parsed)
        named = also.get((call.variant, call.shape_id))
        for rank, (f, is_primary) in enumerate(ranked, start=1):
            rows.append({**_row(f, call, rank, is_primary), "aliases": named})
    at = {c.shape_id: c for c in calls}
    for f in notes:  # a shape's dtype and group from any call at it
        rows.append({**_row(f, at.get(f.shape_id), 1, False), "aliases": None})
    out = pd.DataFrame(rows, columns=list(DIAG_COLUMNS))
    out["rank"] = out["rank"].astype("int64")
    out["primary"] = out["primary"].astype(bool)
    return out


def _aliases_of(g: pd.DataFrame) -> str | None:
    names = [n for a in g.get("aliases", pd.Series(dtype=object)).dropna() for n in str(a).split(schema.ALIAS_SEP) if n]
    return schema.ALIAS_SEP.join(dict.fromkeys(names)) or None


def summarize(diag: pd.DataFrame, top: int | None = SUMMARY_TOP) -> pd.DataFrame:
    """One row per (dtype, variant, cause) across shapes: the shapes it holds for and those where it
    is primary, its largest and median estimated gain, and the evidence of its largest-gain shape.

    Rows are ordered by dtype, variant, then causes that are primary somewhere (most shapes first),
    then by the largest gain; notes last. With `top`, a variant keeps its causes primary somewhere and
    its `top` largest others (a screen per dtype); None keeps all."""
    if diag.empty:
        return pd.DataFrame(columns=list(SUMMARY_COLUMNS))
    rows = []
    d = diag.assign(_dtype=diag["dtype"].fillna(""))
    for (_dt, variant, cause, title), g in d.groupby(["_dtype", "variant", "cause", "title"], sort=False, dropna=False):
        g = g.sort_values("estimated_gain_pct", ascending=False, na_position="last")
        best = g.iloc[0]
        shapes = list(dict.fromkeys(g["shape_id"]))
        prim = list(dict.fromkeys(g[g["primary"]]["shape_id"]))
        # where in the source: the line of the cause where it is primary (at its largest share), else its largest
        located = g[g["source"].notna() & (g["source"].astype(str) != "")] if "source" in g else g.iloc[0:0]
        lead = located[located["primary"]] if located["primary"].any() else located
        source = (f"{lead.iloc[0]['shape_id']}: " if len(shapes) > 1 else "") + str(lead.iloc[0]["source"]) \
            if not lead.empty else None
        rows.append({
            "variant": variant, "dtype": ", ".join(sorted({str(d) for d in g["dtype"].dropna()})) or None,
            "group": ", ".join(sorted({str(d) for d in g["group"].dropna()})) or None,
            "cause": cause, "title": title, "kind": best["kind"], "unit": best["unit"], "against": best["against"],
            "primary_shapes": ", ".join(prim), "shapes": ", ".join(shapes), "n_shapes": len(shapes),
            "max_gain_pct": g["estimated_gain_pct"].max(), "median_gain_pct": g["estimated_gain_pct"].median(),
            "evidence": (f"{best['shape_id']}: " if len(shapes) > 1 else "") + str(best["evidence"]),
            "fix": best["fix"], "source": source, "aliases": _aliases_of(g), "_n_primary": len(prim),
            "_tier": 1 if best["kind"] == "note" else 0,
        })
    out = pd.DataFrame(rows)
    dorder = list(dict.fromkeys(d["_dtype"]))
    vorder = list(dict.fromkeys(diag["variant"]))
    out["_d"] = out["dtype"].fillna("").map({v: i for i, v in enumerate(dorder)})
    out["_v"] = out["variant"].map({v: i for i, v in enumerate(vorder)})
    out = out.sort_values(["_d", "_v", "_tier", "_n_primary", "max_gain_pct"],
                          ascending=[True, True, True, False, False], na_position="last")
    if top is not None:  # a screen per dtype: what is primary somewhere, then the largest few more
        rank = out.groupby(["_d", "_v"]).cumcount()
        out = out[(out["_n_primary"] > 0) | ((out["_tier"] == 0) & (rank < top))]
    return out[list(SUMMARY_COLUMNS)].reset_index(drop=True)


def primary_causes(diag: pd.DataFrame) -> pd.DataFrame:
    """(variant, shape_id, cause, estimated_gain_pct) of each primary finding."""
    p = diag[diag["primary"]] if not diag.empty else diag
    return p[["variant", "shape_id", "cause", "estimated_gain_pct"]].reset_index(drop=True)
