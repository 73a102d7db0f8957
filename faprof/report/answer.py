"""The first screen: per block of comparable rows, what is fastest against what, and one table of every
variant against the baseline (median with its CI, ratio, TFLOP/s and % of peak — or, for memory-bound
problems such as decode, GB/s and % of the measured copy bandwidth — and status), the way the
hand-written reports put "ours vs SDPA" in one table.

Every sentence names only what ran: a baseline without timings is called missing (with its row's
reason) and the ratios fall back to the fastest variant at each shape, said in those words. A
`focus` report (`faprof report RUN --focus V`) gives, per block, one row per shape for V against
the baseline and the fastest other variant.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from faprof.analysis import aliases
from faprof.analysis.speed import bound_of
from faprof.report import fmt as f
from faprof.report import table_text as rt
from faprof.report.blocks import Block, best, geomean, largest_shape, shape_label, timed

#: Two variants within this factor of each other (geometric mean) are called level in the headline.
LEVEL_WITHIN = 1.02

#: The mark a table cell gets when its row's timings are unstable (faprof.rows.stability).
UNSTABLE_MARK = "≈"


def _is(x: Any) -> bool:
    return not pd.isna(x) and bool(x)


def _peak_words(r: pd.Series) -> str:
    if f.missing(r.get("pct_peak")):
        return ""
    label = str(r.get("peak_label") or "").replace(" (datasheet)", "")
    return f", {f.pct(r.get('pct_peak'))}% of the {label + ' ' if label else ''}peak"


def memory_bound(block: Block) -> bool:
    """Whether the block's problems are memory-bound (decode): its headline is then GB/s against the
    measured copy ceiling, not TFLOP/s (faprof.analysis.bound_of; old bundles are compute-bound)."""
    return bound_of(block.rows) == "memory"


def rate_words(r: pd.Series, memory: bool) -> str:
    """'2.83 TB/s, 94% of the measured copy' (memory-bound) or '575 TFLOP/s, 58% of the ... peak'."""
    if memory:
        if f.missing(r.get("gbps")):
            return ""
        pct = r.get("pct_copy")
        of = f", {f.pct(pct)}% of the measured copy bandwidth" if not f.missing(pct) else (
            f", {f.pct(r.get('pct_bw'))}% of the datasheet DRAM bandwidth" if not f.missing(r.get("pct_bw")) else "")
        return f"{f.sig(r.get('gbps'))} GB/s{of}"
    return f"{f.sig(r.get('tflops'))} TFLOP/s{_peak_words(r)}" if not f.missing(r.get("tflops")) else ""


def rate_cells(r: pd.Series | None, memory: bool) -> dict[str, str]:
    """The two rate columns of a table row: GB/s and % of copy (memory-bound) or TFLOP/s and % of peak."""
    if memory:
        return {"GB/s": f.sig(r.get("gbps")) if r is not None else f.MISSING,
                "% of copy": f.pct(r.get("pct_copy")) if r is not None else f.MISSING}
    return {"TFLOP/s": f.sig(r.get("tflops")) if r is not None else f.MISSING,
            "% of peak": f.pct(r.get("pct_peak")) if r is not None else f.MISSING}


def _baseline_words(block: Block) -> tuple[str, str]:
    """(what the title says about the baseline, the sentence on a missing, partial or fallback baseline)."""
    title, note = _baseline_words_declared(block)
    if block.baseline_note:
        fell = f"{f.md(block.baseline_note[0].upper() + block.baseline_note[1:])}."
        return title.replace(", baseline ", ", fallback baseline ", 1), f"{fell} {note}".strip()
    return title, note


def _baseline_words_declared(block: Block) -> tuple[str, str]:
    n_base, n = block.baseline_shapes(), block.shapes
    if not block.baseline:
        return "", "The scenario names no baseline for these rows: ratios are to the fastest variant at each shape."
    if n_base == 0:
        return (f", baseline {block.baseline} missing",
                f"The baseline did not run here ({f.md(block.baseline_missing_why())}): ratios are to the fastest "
                "variant at each shape instead.")
    if n_base < n:
        return (f", baseline {block.baseline}",
                f"{block.baseline} was timed on {n_base} of the {n} shapes: ratios are over those.")
    return f", baseline {block.baseline}", ""


def headline(block: Block) -> list[str]:
    """The block's heading and its answer in one or two sentences (fastest, against what, how fast)."""
    n = block.shapes
    base_title, base_note = _baseline_words(block)
    lines = [f"### {block.title} · {n} shape{'s' * (n != 1)}{base_title}", ""]
    top = best(block)
    if top is None:
        return [*lines, "Nothing was timed (the rows not run are counted below and listed in the appendix).", ""]
    name = str(top["variant"])
    words = [f"Fastest: **{aliases.label(name, block.rows)}**"]
    if block.baseline_ran and name != block.baseline:
        words.append(f"{f.ratio(top['score'])} {block.reference}")
    r = block.ranking
    others = r[(r["variant"] != name) & (r["wrong"] == 0)]
    if not others.empty:
        nxt = others.iloc[0]
        lead = _lead(block, name, str(nxt["variant"]))
        words.append(f"level with {nxt['variant']} ({f.ratio(lead)})" if lead < LEVEL_WITHIN else
                     f"{f.ratio(lead)} the runner-up {nxt['variant']}'s speed")
    sentence = words[0] + (": " + ", ".join(words[1:]) if len(words) > 1 else "")
    if len(words) > 1 and n > 1:
        sentence += f"; geometric means over the {n} shapes"
    big = largest_shape(block, name)
    if big is not None:
        rate = rate_words(big, memory_bound(block))
        where = "at the largest shape, " if n > 1 else "at "
        sentence += f"; {where}{shape_label(big)}, {f.ms(big['median_ms'])} ms" + (f" ({rate})." if rate else ".")
    return [*lines, sentence + (" " + base_note if base_note else ""), ""]


def level_with_fastest(block: Block) -> list[str]:
    """Variants other than the fastest whose speed is level with it (the fastest's lead under LEVEL_WITHIN),
    in ranking order: there is no gap to explain."""
    top = best(block)
    if top is None:
        return []
    name = str(top["variant"])
    r = block.ranking
    return [str(v) for v in r.loc[(r["variant"] != name) & (r["wrong"] == 0), "variant"]
            if _lead(block, name, str(v)) < LEVEL_WITHIN]


def _lead(block: Block, a: str, b: str) -> float:
    """How much faster a is than b over the shapes both timed (geometric mean of b's median over a's)."""
    t = timed(block.rows)
    ta = t[t["variant"] == a].set_index("shape_id")["median_ms"]
    tb = t[t["variant"] == b].set_index("shape_id")["median_ms"]
    common = ta.index.intersection(tb.index)
    return geomean(tb[common] / ta[common]) if len(common) else math.nan


def _with_ci(r: pd.Series) -> str:
    """'0.0303 (0.0302–0.0304)'; the median alone when it has no CI (fewer than 6 calls)."""
    lo, hi = r.get("ci95_low_ms"), r.get("ci95_high_ms")
    ci = "" if f.missing(lo) or f.missing(hi) else f" ({f.ms(lo)}–{f.ms(hi)})"
    return f"{f.ms(r['median_ms'])}{ci}"


def _status_cell(block: Block, x: pd.Series) -> str:
    parts = []
    rows = block.rows[block.rows["variant"] == x["variant"]]
    if x["wrong"]:
        parts.append(f"⚠ wrong on {x['wrong']}")
    if x["shapes"] < x["total"]:
        not_run = rows[~rows["status"].isin(("ok", "wrong"))]["status"]
        parts.append(f"{x['shapes']} of {x['total']} shapes" + (f" ({not_run.iloc[0]} on the rest)" if not not_run.empty else ""))
    if x["unstable"]:
        parts.append(f"{UNSTABLE_MARK} {x['unstable']} unstable")
    gamed = int(sum(rt.flagged(r) for _, r in rows.iterrows()))
    if gamed:
        parts.append(f"{rt.TIMING_FLAG_MARK} timing flagged on {gamed}")
    return "; ".join(parts) or "ok"


def _marks(r: Any) -> str:
    """The marks after a row's time: ≈ unstable, ⚑ timing flagged."""
    return ((f" {UNSTABLE_MARK}" if _is(r.get("unstable")) else "")
            + (f" {rt.TIMING_FLAG_MARK}" if rt.flagged(r) else ""))


def summary_table(block: Block) -> str:
    """One row per variant: the median at the largest shape with its CI, the ratio to the reference
    (geometric mean and range over shapes), TFLOP/s and % of peak there, and the status."""
    r = block.ranking
    if r.empty:
        return ""
    t = timed(block.rows)
    big = t.sort_values("flops")["shape_id"].iloc[-1]
    big_label = shape_label(t[t["shape_id"] == big].iloc[0])
    ref = block.baseline if block.baseline_ran else "fastest"
    rows = []
    for _, x in r.iterrows():
        at = t[(t["variant"] == x["variant"]) & (t["shape_id"] == big)]
        a = at.iloc[0] if not at.empty else None
        mark = _marks(a) if a is not None else ""
        rng = f" ({f.ratio(x['low'])}–{f.ratio(x['high'])})" if x["shapes"] > 1 else ""
        label = aliases.label(str(x["variant"]), block.rows)  # names the aliases its kernel stands for
        name = f"{label} (baseline)" if x["variant"] == block.baseline else label
        rows.append({
            "variant": name,
            f"ms at {big_label} (95% CI)": f"{_with_ci(a)}{mark}" if a is not None else f.MISSING,
            f"vs {ref} (range)": f"{f.ratio(x['score'])}{rng}",
            **rate_cells(a, memory_bound(block)),
            "status": _status_cell(block, x),
        })
    return rt.md_table(pd.DataFrame(rows))


def focus_table(block: Block, focus: str) -> str:
    """Report 003's table for one variant: per shape its median and the baseline's, the ratio, the fastest
    other variant and the ratio to it, TFLOP/s and % of peak, status."""
    t = timed(block.rows)
    mine = block.rows[block.rows["variant"] == focus].sort_values("flops")
    rows = []
    for _, r in mine.iterrows():
        sid = r["shape_id"]
        here = t[t["shape_id"] == sid]
        base = here[here["variant"] == block.baseline] if block.baseline_ran else here.iloc[0:0]
        rivals = here[(here["variant"] != focus) & (here["status"] == "ok")].sort_values("median_ms")
        is_timed = r["status"] in ("ok", "wrong")
        row = {"shape": shape_label(r),
               f"{focus} ms (95% CI)": (_with_ci(r) + _marks(r))
               if is_timed else f.MISSING}
        if block.baseline_ran and focus != block.baseline:
            b = base.iloc[0] if not base.empty else None
            row[f"{block.baseline} ms"] = f.ms(b["median_ms"]) if b is not None else f.MISSING
            row[f"vs {block.baseline}"] = f.ratio(b["median_ms"] / r["median_ms"]) if b is not None and is_timed else f.MISSING
        fast = rivals.iloc[0] if not rivals.empty else None
        row["fastest other (ms)"] = f"{fast['variant']} ({f.ms(fast['median_ms'])})" if fast is not None else f.MISSING
        row["vs it"] = f.ratio(fast["median_ms"] / r["median_ms"]) if fast is not None and is_timed else f.MISSING
        row.update(rate_cells(r, memory_bound(block)))
        row["status"] = str(r["status"]) + (f": {f.md(r.get('reason'))}" if r["status"] not in ("ok", "wrong") else "")
        rows.append(row)
    return rt.md_table(pd.DataFrame(rows))


def focus_headline(block: Block, focus: str) -> list[str]:
    """A focus block's heading and sentence: the variant against the baseline and the fastest, and its rank."""
    n = block.shapes
    base_title, base_note = _baseline_words(block)
    lines = [f"### {block.title} · {n} shape{'s' * (n != 1)}{base_title}", ""]
    r = block.ranking
    mine = r[r["variant"] == focus]
    if mine.empty:
        rows = block.rows[block.rows["variant"] == focus]
        why = f"{rows.iloc[0]['status']}: {f.md(rows.iloc[0].get('reason'))}" if not rows.empty else "not in this run"
        return [*lines, f"**{focus}** has no timing in this block ({why}).", ""]
    x = mine.iloc[0]
    place = int(mine.index[0]) + 1
    words = [f"**{focus}** ranks {place} of {len(r)}"]
    if block.baseline_ran and focus != block.baseline:
        words.append(f"{f.ratio(x['score'])} {block.reference}")
    top = best(block)
    if top is not None and top["variant"] != focus:
        words.append(f"the fastest, {top['variant']}, is {f.ratio(_lead(block, str(top['variant']), focus))} its speed")
    sentence = ", ".join(words) + (f" (geometric means over {x['shapes']} shapes)." if x["shapes"] > 1 else ".")
    return [*lines, sentence + (" " + base_note if base_note else ""), ""]
