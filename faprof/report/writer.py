"""Reports from a run bundle that lead with the answer, then show it, then give every number.

Layout of report.md / report.html:

1. **The answer** (the first screen, under 60 lines): per group of comparable rows (scenario
   group x dtype x direction) what is fastest and by how much, with the ranking on one line;
   the primary diagnosis per variant (`_diagnosis_section`, the bottleneck advisor); and the seed
   report's published figures beside this run's measurement of the variant that plays the same
   role, with the ratio between them.
2. **Charts**: per group, the ranking and the time per shape (plotly: interactive in the HTML,
   PNG files beside report.md when kaleido can render them, else a pointer to report.html).
3. **Observations**: correctness, how ratios change with size, noisy timings.
4. **Appendix**: every table (results per group with the median's 95% CI, against the baseline,
   correctness, output samples, throughput against peak, latency and memory, forward/backward,
   memory, scaling, bandwidth, rows not run, all advisor findings, Nsight Compute, environment,
   method).

Every number comes from the bundle; published figures are labelled as the report's. Numbers are
formatted by `report_fmt` (units in headers, no `nan`, no positive exponents); HTML is rendered
from the Markdown by markdown-it-py. Nothing is written until everything is rendered.
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from faprof import advisor
from faprof.analysis import core as analysis
from faprof.errors import FaprofError
from faprof.measure import stats
from faprof.measure.wrong_text import explain_wrong_rows
from faprof.model import schema
from faprof.report import charts as rc
from faprof.report import fmt as f
from faprof.report import tables as rt
from faprof.run import sanitize
from faprof.store import Bundle, csv_files, write_files

#: Relative standard error above which a timing is called noisy in the observations.
NOISY_REL_SEM = 0.02

#: A ratio trend counts as widening/narrowing when the gap (max(s, 1/s)) changes by more than this factor.
TREND_FACTOR = 1.15

#: faprof's own kernels in the order of the progression, most developed first, per kind of math:
#: the one that stands in for a seed report's own ("custom") kernel when the scenario names none.
ROLE_STAND_INS = {"tensor": ("fa2_mma", "fa2_wmma"), "cuda_core": ("fa2", "fa1", "naive")}
_OWN_KERNEL = re.compile(r"custom|report's .*kernel|our kernel", re.IGNORECASE)


# ----------------------------------------------------------------------------- small helpers
def cite(source: str | None) -> str:
    """A seed report cited by title, GPU and date: 'path/003_x.txt (Title, GPU, date)' -> '*Title* (GPU, date)'.

    The file path is dropped: a user who clones faprof does not have the seed files.
    """
    if not source:
        return ""
    m = re.search(r"\(([^()]*)\)\s*$", source)
    inner = m.group(1) if m else source
    if re.fullmatch(r"\S+\.(txt|md)", inner.strip()):
        return ""
    title, _, rest = inner.partition(",")
    return f"*{title.strip()}* ({rest.strip()})" if rest else f"*{title.strip()}*"


def _shape_short(r: Any) -> str:
    return rt.shape(r, dtype=False)


def _geomean(x: pd.Series) -> float:
    x = x[(x > 0) & x.notna()]
    return float(math.exp(x.map(math.log).mean())) if len(x) else math.nan


@dataclass
class Block:
    """Rows a ranking compares: one scenario group, dtype and direction."""

    group: str
    dtype: str
    direction: str
    baseline: str | None
    rows: pd.DataFrame
    ranking: pd.DataFrame = field(default_factory=pd.DataFrame)

    @property
    def title(self) -> str:
        causal = set(self.rows["causal"].astype(bool))
        mask = " causal" if causal == {True} else (" non-causal" if causal == {False} else "")
        word = {"fwd": "forward", "bwd": "backward", "fwd_bwd": "forward+backward"}.get(self.direction, self.direction)
        head = f"{self.dtype}{mask} {word}"
        # The group's name only when it says more than the dtype/mask/direction do ('forward fp32' does not).
        return head if set(self.group.split()) <= set(head.split()) else f"{self.group} · {head}"

    @property
    def slug(self) -> str:
        return re.sub(r"[^a-z0-9]+", "-", f"{self.group}-{self.dtype}-{self.direction}".lower()).strip("-")


def blocks(df: pd.DataFrame) -> list[Block]:
    """The run's blocks in scenario order, each with its ranking (see `rank`)."""
    out = []
    groups = df["group"].fillna("") if "group" in df else pd.Series("", index=df.index)
    for (g, dt, dr), rows in df.assign(_g=groups).groupby(["_g", "dtype", "direction"], sort=False):
        base = rows["baseline"].dropna() if "baseline" in rows else pd.Series(dtype=object)
        b = Block(str(g), str(dt), str(dr), str(base.iloc[0]) if not base.empty else None, rows.drop(columns="_g"))
        b.ranking = rank(b)
        out.append(b)
    return out


def rank(block: Block) -> pd.DataFrame:
    """Variants of a block by speed: geometric mean over its shapes of the baseline's median over the
    variant's (or, without a timed baseline, of the fastest variant's median per shape over the variant's).

    Columns: variant, score, shapes (timed), total (shapes in the block), wrong (rows flagged wrong).
    """
    t = block.rows[block.rows["status"].isin(schema.TIMED) & (block.rows["median_ms"] > 0)]
    total = block.rows["shape_id"].nunique()
    if t.empty:
        return pd.DataFrame(columns=["variant", "score", "shapes", "total", "wrong"])
    base = t[t["variant"] == block.baseline].set_index("shape_id")["median_ms"] if block.baseline else pd.Series(dtype=float)
    ref = base if not base.empty else t.groupby("shape_id")["median_ms"].min()
    t = t[t["shape_id"].isin(ref.index)]
    rel = ref.reindex(t["shape_id"]).to_numpy() / t["median_ms"].to_numpy()
    t = t.assign(_rel=rel)
    rows = [{"variant": v, "score": _geomean(g["_rel"]), "shapes": g["shape_id"].nunique(), "total": total,
             "wrong": int((g["status"] == "wrong").sum())} for v, g in t.groupby("variant", sort=False)]
    return pd.DataFrame(rows).sort_values("score", ascending=False, kind="stable").reset_index(drop=True)


# --------------------------------------------------------------------------------- the answer
def _headline(block: Block, gpu: str | None) -> list[str]:
    r = block.ranking
    n = block.rows["shape_id"].nunique()
    what = f"**{block.title}** ({n} shape{'s' * (n != 1)}" + (f", baseline {block.baseline})" if block.baseline else ")")
    if r.empty:
        return [f"{what}: nothing was timed (see the rows not run in the appendix).", ""]
    ok = r[(r["wrong"] == 0) & (r["shapes"] == r["total"])]
    best = ok.iloc[0] if not ok.empty else r[r["wrong"] == 0].iloc[0] if (r["wrong"] == 0).any() else r.iloc[0]
    t = block.rows[block.rows["status"].isin(schema.TIMED)]
    mine = t[t["variant"] == best["variant"]].set_index("shape_id")["median_ms"]
    words = [f"{what}: fastest is **{best['variant']}**"]
    if block.baseline and best["variant"] != block.baseline:
        words.append(f"{f.ratio(best['score'])} {block.baseline}'s speed")
    others = r[(r["variant"] != best["variant"]) & (r["wrong"] == 0)]
    if not others.empty:
        nxt = others.iloc[0]
        theirs = t[t["variant"] == nxt["variant"]].set_index("shape_id")["median_ms"]
        common = mine.index.intersection(theirs.index)
        lead = _geomean(theirs[common] / mine[common]) if len(common) else math.nan
        words.append(f"level with the runner-up {nxt['variant']} ({f.ratio(lead)})" if lead < 1.02 else
                     f"{f.ratio(lead)} the runner-up {nxt['variant']}'s speed")
    sentence = words[0] + (": " + ", ".join(words[1:]) if len(words) > 1 else "")
    sentence += f", geometric means over the {n} shapes" if len(words) > 1 and n > 1 else ""
    big = t[t["variant"] == best["variant"]].sort_values("flops").iloc[-1]
    rate = f"{f.sig(big.get('tflops'))} TFLOP/s" if not f.missing(big.get("tflops")) else ""
    label = str(big.get("peak_label") or "").replace(" (datasheet)", "")
    peak = (f", {f.pct(big.get('pct_peak'))}% of the {label + ' ' if label else ''}peak" if not f.missing(big.get("pct_peak")) else "")
    where = "at the largest shape, " if n > 1 else "at "
    sentence += f"; {where}{_shape_short(big)}, it takes {f.ms(big['median_ms'])} ms" + (f" ({rate}{peak})." if rate else ".")
    ref = f"vs {block.baseline}" if block.baseline and block.baseline in set(r["variant"]) else "vs the fastest per shape"
    items = []
    for _, x in r.iterrows():
        item = f"{x['variant']} {f.ratio(x['score'])}"
        if x["shapes"] < x["total"]:
            item += f" ({x['shapes']} of {x['total']} shapes)"
        if x["wrong"]:
            item += " ⚠ wrong results"
        items.append(f"**{item}**" if x["variant"] == best["variant"] else item)
    return [sentence, "", f"Speed {ref}: " + " · ".join(items), ""]


def _diagnosis_section(bundle: Bundle, df: pd.DataFrame, order: list[str]) -> tuple[list[str], pd.DataFrame]:
    """The 'why': the advisor's ranked diagnosis (faprof.advisor), one line per variant and dtype for
    the first screen, and every finding, ranked per (variant, shape), for the appendix.

    A variant's line names the cause that is primary on most of its shapes (ties: the larger
    estimated gain), the shapes it holds for, the evidence it rests on and the fix.
    """

    ncu, nsys = bundle.read("ncu_summary"), bundle.read("nsys_summary")
    diag = advisor.diagnose(bundle)
    have = [name for name, t in (("Nsight Compute", ncu), ("Nsight Systems", nsys)) if not t.empty]
    lines = ["### Why: the primary diagnosis per variant", ""]
    if have:
        lines += [f"From the timings and {' and '.join(have)}, ranked by the share of the call's time each cause "
                  "explains (`faprof explain RUN` for every shape; every finding: appendix).", ""]
    else:
        lines += ["From the timings alone: this run has no Nsight data, so occupancy, memory throughput and stall "
                  "reasons are unknown (`faprof profile --ncu` adds them).", ""]
    summ = advisor.summarize(diag) if not diag.empty else pd.DataFrame()
    quiet = []
    for v in order:
        g = summ[summ["variant"] == v] if not summ.empty else summ
        if g.empty:
            quiet.append(v)
            continue
        for dtype, gd in g.groupby("dtype", sort=False):
            gd = gd.assign(_np=gd["primary_shapes"].map(lambda x: len([t for t in str(x).split(", ") if t])),
                           _g=pd.to_numeric(gd["max_gain_pct"], errors="coerce").fillna(-1))
            top = gd.sort_values(["_np", "_g"], ascending=False).iloc[0]
            if top["_np"] == 0:
                continue
            total = df[(df["variant"] == v) & (df["dtype"] == dtype) & df["status"].isin(schema.TIMED)]["shape_id"].nunique()
            gain = f"; up to {top['max_gain_pct']:.0f}% of the call's time" if pd.notna(top["max_gain_pct"]) else ""
            ev = str(top["evidence"]).split(" | ")[0]
            lines.append(f"- **{v}** ({dtype}): {top['title']} (primary on {top['_np']} of {total} shapes{gain}): "
                         f"{ev}. Fix: {top['fix']}.")
    if quiet:
        lines.append(f"- no diagnosis from this run's data for {', '.join(quiet)}.")
    return lines + [""], diag


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
            if not timed[(timed["variant"] == v) & ((timed["dtype"] == dtype) if dtype else True)].empty:
                return v, "stand-in"
    return "", ""


def _match(p: dict[str, Any], df: pd.DataFrame, variant: str) -> pd.DataFrame:
    t = df[(df["variant"] == variant) & df["status"].isin(schema.TIMED)]
    for k, col in (("B", "B"), ("H", "H"), ("D", "D"), ("S", "Sq"), ("dtype", "dtype"), ("causal", "causal"),
                   ("direction", "direction")):
        if k in (p.get("shape") or {}):
            t = t[t[col] == p["shape"][k]]
    return t


def _measured(p: dict[str, Any], r: pd.Series) -> tuple[str, float]:
    """This run's counterpart of a published figure, as text and as a number in the figure's unit."""
    what, unit, note = p.get("what"), p.get("unit", ""), str(p.get("note", ""))
    if what == "latency" and unit == "ms":
        return f"{f.ms(r['median_ms'])} ms (median)", f.num(r["median_ms"])
    if what == "throughput" and unit in ("TFLOP/s", "GFLOP/s"):
        scale = 1e3 if unit == "GFLOP/s" else 1.0
        v = f.num(r.get("tflops")) * scale
        if "not halved" in note and bool(r["causal"]):
            return f"{f.sig(2 * v)} {unit} (report's FLOP count)", 2 * v
        return f"{f.sig(v)} {unit}", v
    if what == "throughput" and unit == "tokens/s":
        return f"{f.count(r.get('tokens_per_s'))} tokens/s", f.num(r.get("tokens_per_s"))
    if what == "max_abs_error":
        return f.err(r.get("max_abs_err")), f.num(r.get("max_abs_err"))
    if what in ("memory", "peak_memory") and unit == "MB":
        col = "peak_mem_bytes" if what == "peak_memory" else "extra_mem_bytes"
        v = f.num(r.get(col)) / 2**20
        return f"{f.sig(v)} MiB ({'peak' if what == 'peak_memory' else 'extra'})", v
    if what == "bandwidth" and unit == "GB/s":
        return f"{f.sig(r.get('gbps'))} GB/s (minimum bytes / time)", f.num(r.get("gbps"))
    if what == "speedup" and unit == "x" and not f.missing(r.get("speedup")):
        return f"{f.ratio(r.get('speedup'))} over {r.get('baseline')}", f.num(r.get("speedup"))
    return "", math.nan


def _bwd_over_fwd(p: dict[str, Any], df: pd.DataFrame, variant: str) -> tuple[str, float]:
    """A published backward/forward time ratio's counterpart: the variant's bwd and fwd medians at
    the figure's shape (one of each), as text and number."""
    shape = {k: v for k, v in (p.get("shape") or {}).items() if k != "direction"}
    rows = {d: _match({**p, "shape": {**shape, "direction": d}}, df, variant) for d in ("fwd", "bwd")}
    if any(len(t) != 1 for t in rows.values()):
        n = {d: len(t) for d, t in rows.items()}
        return (f"{n['fwd']} forward and {n['bwd']} backward rows match; see the tables" if any(n.values()) else ""), math.nan
    fwd, bwd = (f.num(rows[d].iloc[0]["median_ms"]) for d in ("fwd", "bwd"))
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
        pv = f.num(p.get("value"))
        if value == value and pv == pv and value > 0 and pv > 0:
            if p.get("what") == "latency":
                ratio_words = f"{f.ratio(pv / value)} less time" if value < pv else f"{f.ratio(value / pv)} more time"
            elif p.get("what") == "throughput":
                ratio_words = f"{f.ratio(value / pv)} the rate"
        out.append({**p, "variant": variant, "how": how, "measured": text, "measured_value": value, "ratio": ratio_words})
    return out


def _published_section(df: pd.DataFrame, m: dict[str, Any], gpu: str) -> list[str]:
    pubs = published_rows(df, m)
    if not pubs:
        return []
    their_gpu = ", ".join(dict.fromkeys(str(p.get("gpu")) for p in pubs))
    lines = [f"### Against the published figures ({their_gpu})", ""]
    cited = cite((m.get("scenario") or {}).get("source"))
    subjects: dict[str, tuple[str, str]] = {}
    for p in pubs:
        if p["variant"]:
            subjects.setdefault(p["subject"], (p["variant"], p["how"]))
    roles = [f"{s} → **{v}**" + (" (faprof's own kernel of the same dtype, standing in for it)" if how == "stand-in" else "")
             for s, (v, how) in subjects.items()]
    lines.append(f"Figures quoted from {cited or 'the seed report'} on its {their_gpu}, beside this run on the {gpu}. "
                 f"Who plays whom: {'; '.join(roles) or 'no figure names a faprof variant'}. "
                 "Different GPUs: the ratio says how far apart the two machines and implementations are, not which code is better.")
    lines.append("")
    for subject, (v, _) in subjects.items():
        lat = [p for p in pubs if p["subject"] == subject and p["what"] == "latency" and p["measured_value"] == p["measured_value"]]
        if len(lat) >= 2:
            r = sorted(f.num(p["value"]) / p["measured_value"] for p in lat)
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


# ----------------------------------------------------------------------------- observations
def trend_phrase(variant: str, first: float, last: float) -> str:
    """How a variant's speed relative to its baseline changes from the smallest to the largest problem.

    The gap is how far the ratio is from 1 in either direction (max(s, 1/s)): a variant 1.42x as fast
    whose ratio falls to 1.02x has a *shrinking lead*, not a widening gap.
    """
    def words(s: float) -> str:
        return f"{f.ratio(s)} faster" if s >= 1 else f"{f.ratio(1 / s)} slower"

    span = f"{words(first)} → {words(last)}"
    if (first >= 1) != (last >= 1) and max(first, 1 / first) < TREND_FACTOR and max(last, 1 / last) < TREND_FACTOR:
        return f"{variant} stays level ({span})"
    if (first >= 1) != (last >= 1):
        return f"{variant} changes sides ({span})"
    g0, g1 = max(first, 1 / first), max(last, 1 / last)
    if g1 > g0 * TREND_FACTOR:
        change = "'s lead grows" if first >= 1 else "'s gap widens"
    elif g1 < g0 / TREND_FACTOR:
        change = "'s lead shrinks" if first >= 1 else "'s gap narrows"
    else:
        change = " holds steady"
    return f"{variant}{change} ({span})"


def observations(df: pd.DataFrame) -> list[str]:
    """Plain-words observations, each backed by the table rows it names."""
    out: list[str] = []
    t = df[df["status"].isin(schema.TIMED)]
    for status, word in (("wrong", "gave wrong results"), ("failed", "failed")):
        for v, g in df[df["status"] == status].groupby("variant"):
            reason = g["reason"].dropna().iloc[0] if g["reason"].notna().any() else ""
            out.append(f"**{v} {word}** on {len(g)} problem(s)" + (f" ({reason})." if reason else "."))
    ok_all = df[df["status"].isin(["ok", "wrong"])]
    if not ok_all.empty and (ok_all["status"] == "ok").all():
        out.append(f"All {ok_all['variant'].nunique()} variants that ran are within tolerance of the reference "
                   f"(largest max abs error {f.err(ok_all['max_abs_err'].max())}).")
    if "speedup" in t:
        bcol = t["baseline"] if "baseline" in t else pd.Series("", index=t.index)
        for (b, dt, dr), gb in t.assign(_b=bcol.fillna("")).groupby(["_b", "dtype", "direction"], sort=False):
            items = []
            for v, g in gb.groupby("variant", sort=False):
                g = g.dropna(subset=["speedup"]).sort_values("flops")
                if v != b and b and len(g) >= 3 and g.iloc[0]["speedup"] > 0 and g.iloc[-1]["speedup"] > 0:
                    items.append(trend_phrase(str(v), float(g.iloc[0]["speedup"]), float(g.iloc[-1]["speedup"])))
            if items:
                out.append(f"From the smallest to the largest {dt} {dr} problem, against {b}: " + "; ".join(items) + ".")
    noisy = t[t["rel_sem"] > NOISY_REL_SEM] if "rel_sem" in t else t.iloc[0:0]
    if not noisy.empty:
        out.append(f"{len(noisy)} timing(s) have a standard error above {NOISY_REL_SEM:.0%} of the mean "
                   f"(e.g. {noisy.iloc[0]['variant']} at {rt.shape(noisy.iloc[0])}); treat small differences there as noise.")
    return out


# ------------------------------------------------------------------------------- rendering
ChartHook = Callable[[str, str], str]


def _meta(m: dict[str, Any], df: pd.DataFrame) -> str:
    counts = df["status"].value_counts()
    timed = int(counts.get("ok", 0) + counts.get("wrong", 0))
    stamp = str(m.get("created_utc") or "")
    date = f" on {stamp[:4]}-{stamp[4:6]}-{stamp[6:8]}" if re.match(r"\d{8}T", stamp) else ""
    parts = [f"Run `{m.get('run_id')}`, {m.get('status')}{date}", f"{len(df)} rows: {timed} timed"]
    parts[-1] += "".join(f", {int(counts[s])} {s}" for s in ("wrong", "failed", "unsupported", "skipped") if counts.get(s))
    pref = ["cupti", "cuda_event", "event", "host"]
    timers = sorted(df["timer"].dropna().unique().tolist() if "timer" in df else [],
                    key=lambda x: pref.index(x) if x in pref else len(pref))
    names = {"cupti": "CUPTI kernel times", "cuda_event": "CUDA events", "host": "host clock (CPU rows)", "event": "CUDA events"}
    if timers:
        parts.append("timed with " + ", ".join(names.get(str(x), str(x)) for x in timers) + "; medians with their 95% CI")
    src = cite((m.get("scenario") or {}).get("source"))
    if src:
        parts.append(f"reproduces {src}")
    return " · ".join(parts) + "."


def _method(m: dict[str, Any]) -> str:
    timing = (m.get("settings") or {}).get("timing", {})
    baseline = (m.get("scenario") or {}).get("baseline")
    return (f"Each variant is checked against a reference (float64 on the CPU, or fp32 on the GPU for big problems) on "
            f"fresh random inputs, with outputs pre-filled with NaN, before it is timed. GPU times are medians after "
            f"{timing.get('warmup_ms', '?')} ms of warm-up, with the L2 flushed before every repeat "
            f"({'on' if timing.get('flush_l2', True) else 'off'}), repeated until the standard error is under "
            f"{100 * timing.get('target_rel_sem', 0.005):.1f}% of the mean or {timing.get('budget_s', '?')} s per pair; "
            f"'median 95% CI' is the confidence interval of the median. FLOPs: 4·B·H·Sq·Sk·D forward, halved when "
            f"causal; backward 2.5x. Speed vs baseline is the baseline's median over the variant's (above 1 = faster "
            f"than {baseline} or the group's own baseline).\n")


def short_labels(labels: list[str]) -> tuple[dict[str, str], str]:
    """Drop the words every label shares ('D=64 causal'): short tick labels, and the shared words."""
    words = [lab.split() for lab in labels]
    common = [w for w in words[0] if all(w in ws for ws in words[1:])] if len(words) > 1 else []
    return {lab: " ".join(w for w in ws if w not in common) or lab for lab, ws in zip(labels, words, strict=True)}, " ".join(common)


def build_charts(blks: list[Block]) -> list[Any]:
    """The report's plotly charts (empty without plotly)."""

    if not rc.plotly_available():
        return []
    charts = []
    for b in blks:
        if b.ranking.empty:
            continue
        charts.append(rc.ranking_chart(f"{b.slug}-ranking", f"{b.title}: speed vs {b.baseline or 'the fastest'}", b.ranking,
                                       b.baseline))
        t = b.rows[b.rows["status"].isin(schema.TIMED)].sort_values("flops")
        if t["shape_id"].nunique() > 1:
            t = t.assign(_shape=[_shape_short(r) for _, r in t.iterrows()])
            order = list(dict.fromkeys(t["_shape"]))
            short, common = short_labels(order)
            charts.append(rc.time_chart(f"{b.slug}-time", f"{b.title}: median time per shape" + (f" ({common})" if common else ""),
                                        t, order, short))
    return charts


def render_markdown(bundle: Bundle, chart_hook: ChartHook | None = None, charts: list[Any] | None = None,
                    chart_note: str = "") -> str:
    """The report as Markdown. `chart_hook(name, title)` returns the Markdown (or an HTML placeholder)
    for each chart in `charts`; without charts the section says why (`chart_note`)."""
    m = bundle.manifest()
    meas = bundle.measurements()
    if meas.empty or "variant" not in meas:

        what = ("a `faprof sanitize` bundle: its findings are in sanitizer.parquet (`faprof export RUN --csv DIR`)"
                if m.get("kind") == "sanitize" else f"status {m.get('status')}")
        raise FaprofError(f"{bundle.path} has no timed rows to report ({what})")
    df = analysis.speedups_for(meas, m)
    env = m.get("env", {}) or {}
    gpu = env.get("gpu_name") or "CPU (no GPU)"
    blks = blocks(df)
    parts = [f"# {m['scenario']['name']} on {gpu}", "", _meta(m, df), "", "## The answer", ""]
    for b in blks:
        parts += _headline(b, env.get("gpu_name"))
    wrong = explain_wrong_rows(meas, bundle.read("error_maps"))
    if wrong:  # which bug each wrong row looks like, and where: before any timing is read
        parts += ["## Wrong results", "", "Each wrong row's bug signature and error map (`faprof explain RUN` prints "
                  "the same):", "", "```text", *wrong, "```", ""]
    order = list(dict.fromkeys(v for b in blks for v in b.ranking["variant"]))
    diag, adv = _diagnosis_section(bundle, df, order)
    parts += diag
    parts += _published_section(df, m, gpu)
    parts += ["## Charts", ""]
    if charts and chart_hook is not None:
        for c in charts:
            parts += [chart_hook(c.name, c.title), ""]
    else:
        parts += [chart_note or "No charts (plotly is not installed: pip install plotly).", ""]
    obs = observations(df)
    if obs:
        parts += ["## Observations", "", *[f"- {x}" for x in obs], ""]
    parts += _appendix(bundle, df, m, blks, adv)
    return "\n".join(parts).rstrip() + "\n"


def _appendix(bundle: Bundle, df: pd.DataFrame, m: dict[str, Any], blks: list[Block], adv: pd.DataFrame) -> list[str]:
    parts = ["## Appendix: every table", ""]
    parts += ["### Results", "", "Times in ms (median; ± the half-width of the median's 95% CI); TFLOP/s with faprof's "
              "FLOP count; speed vs baseline = the baseline's median / the row's.", ""]
    groups = df["group"].fillna("") if "group" in df else pd.Series("", index=df.index)
    for g in dict.fromkeys(groups):
        if g:
            parts += [f"#### {g}", ""]
        parts.append(rt.md_table(rt.results_frame(df[groups == g])))
    for b in dict.fromkeys(df["baseline"].dropna()) if "baseline" in df else []:
        cmp = rt.baseline_comparison(df[df["baseline"] == b], b)
        if not cmp.empty:
            parts += [f"### Against {b}", "", rt.md_table(cmp)]
    parts += ["### Correctness", "", rt.md_table(rt.correctness_frame(df))]
    for sid in df["shape_id"].unique()[:2]:
        s = rt.sample_frame(df, sid)
        if not s.empty and s.shape[1] > 2:
            parts += [f"### First output elements, {rt.shape(df[df['shape_id'] == sid].iloc[0])}", "", rt.md_table(s)]
    for title, frame in (("Throughput against peak", rt.throughput_frame(df)),
                         ("Latency, tokens/s and memory", rt.latency_frame(df)),
                         ("Forward and backward", rt.fwd_bwd_frame(df)),
                         ("Memory (MiB: measured extra memory per call, and analytic footprints)", rt.memory_frame(df)),
                         ("Scaling over batch size", rt.scaling_frame(df)),
                         ("Bandwidth utilization", rt.bandwidth_frame(df)),
                         ("Rows not run", rt.not_run_frame(df))):
        if not frame.empty:
            parts += [f"### {title}", "", rt.md_table(frame)]
    if not adv.empty:
        parts += ["### Every advisor finding", "", "Ranked per variant and shape (rank 1 is the primary cause); each "
                  "finding quotes the measurement or Nsight metric it rests on.", "",
                  rt.md_table(rt.advisor_frame(adv, df))]
    ncu = rt.ncu_frame(bundle.read("ncu_summary"))
    if not ncu.empty:
        parts += ["### Nsight Compute, per kernel launch", "", rt.md_table(ncu)]
    parts += ["### Environment", "", rt.md_table(rt.environment_frame(m)), "### Method", "", _method(m)]
    return parts


_HTML_STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:2em auto;max-width:1280px;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:1em 0;font-size:13px}td,th{border:1px solid #ccc;padding:3px 8px}
th{background:#f3f3f3;text-align:left}td{text-align:right}td:first-child{text-align:left}
code{background:#f5f5f5;padding:0 3px}.chart{margin:1em 0}h1{font-size:1.6em}
"""


def render_html(bundle: Bundle, charts: list[Any] | None = None) -> str:
    """The Markdown report rendered by markdown-it-py into one self-contained page with interactive charts."""
    from markdown_it import MarkdownIt

    charts = build_charts(blocks(analysis.speedups_for(bundle.measurements(), bundle.manifest()))) if charts is None else charts
    script, divs = "", dict[str, str]()
    if charts:

        script, divs = rc.html_divs(charts)
    md = render_markdown(bundle, chart_hook=lambda name, title: f"<!--chart:{name}-->", charts=charts,
                         chart_note="No charts (plotly is not installed: pip install plotly).")
    body = MarkdownIt("commonmark", {"html": True}).enable("table").render(md)
    for name, div in divs.items():
        body = body.replace(f"<!--chart:{name}-->", f"<div class=\"chart\">{div}</div>")
    m = bundle.manifest()
    title = html.escape(f"faprof report: {m['scenario']['name']} on {(m.get('env') or {}).get('gpu_name') or 'CPU'}")
    return (f"<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{title}</title>"
            f"<style>{_HTML_STYLE}</style>{script}</head>\n<body>\n{body}</body></html>\n")


def render_files(bundle: Bundle, formats: tuple[str, ...] = ("md", "html", "csv"),
                 notice: Callable[[str], None] | None = None) -> dict[str, str | bytes]:
    """Every file of the report, rendered in memory, by path relative to the report folder."""
    files: dict[str, str | bytes] = {}
    m = bundle.manifest()
    if m.get("kind") == "sanitize":  # a `faprof sanitize` bundle: its own short report
        from markdown_it import MarkdownIt


        md = sanitize.markdown(bundle)
        if "md" in formats:
            files["report.md"] = md
        if "html" in formats:
            body = MarkdownIt("commonmark").enable("table").render(md)
            files["report.html"] = (f"<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>faprof sanitize"
                                    f"</title><style>{_HTML_STYLE}</style></head>\n<body>\n{body}</body></html>\n")
        if "csv" in formats:

            files.update({f"csv/{name}": text for name, text in csv_files(bundle).items()})
        return files
    charts = build_charts(blocks(analysis.speedups_for(bundle.measurements(), m))) if {"md", "html"} & set(formats) else []
    if "md" in formats:

        images, why = rc.png_images(charts) if charts else ({}, "")
        if images:
            files.update({f"charts/{name}.png": data for name, data in images.items()})
            md = render_markdown(bundle, chart_hook=lambda name, title: f"![{title}](charts/{name}.png)", charts=charts)
        else:
            note = why or "No charts (plotly is not installed: pip install plotly)."
            if charts and "html" in formats:
                note += "; open [report.html](report.html) for them."
            if why and notice:
                notice(why)
            md = render_markdown(bundle, chart_note=note)
        files["report.md"] = md
    if "html" in formats:
        files["report.html"] = render_html(bundle, charts)
    if "csv" in formats:

        files.update({f"csv/{name}": text for name, text in csv_files(bundle).items()})
    return files


def write_reports(bundle: Bundle, dest: str | Path, formats: tuple[str, ...] = ("md", "html", "csv"),
                  notice: Callable[[str], None] | None = None) -> list[Path]:
    """Render the report and write it under `dest`; a damaged bundle raises before anything is written."""

    return write_files(dest, render_files(bundle, formats, notice))


# -------------------------------------------------------------------------------- compare
def gpu_models(bundle: Bundle) -> list[str]:
    """The GPU models a bundle's rows ran on (several after `--gpus` on mixed GPUs; [] for old rows)."""
    df = bundle.measurements()
    if df.empty or "gpu_name" not in df.columns:
        return []
    return sorted(str(g) for g in df["gpu_name"].dropna().unique())


def rows_on(bundle: Bundle, gpu: str | None) -> pd.DataFrame:
    """A bundle's rows, only those of GPU model `gpu` when given (FaprofError naming the models if none)."""
    df = bundle.measurements()
    if gpu is None:
        models = gpu_models(bundle)
        if len(models) > 1:
            raise FaprofError(f"{bundle.run_id} holds rows of {len(models)} GPU models ({', '.join(models)}); "
                              "choose one with --gpu-a/--gpu-b")
        return df
    if "gpu_name" not in df.columns or not (df["gpu_name"] == gpu).any():
        raise FaprofError(f"{bundle.run_id} has no rows on {gpu!r} (its GPUs: {', '.join(gpu_models(bundle)) or 'not recorded per row'})")
    return df[df["gpu_name"] == gpu].reset_index(drop=True)


def compare_runs(a: Bundle, b: Bundle, gpu_a: str | None = None, gpu_b: str | None = None) -> pd.DataFrame:
    """Row-by-row comparison of two runs on (variant, shape_id): medians with their 95% CIs, the
    ratio, and faprof's one significance method (`stats.significance`: two-sided Mann-Whitney U on
    the kept samples, as the dashboard's Diff page): `p_value`, `significant` (None: too few samples).
    Each side keeps its own % of peak and % of measured ceiling (each against its own GPU).

    `gpu_a` / `gpu_b` pick one GPU model of a bundle that holds several (A and B may be one bundle)."""

    da, db = rows_on(a, gpu_a), rows_on(b, gpu_b)
    keys = ["variant", "shape_id"]
    cols = [*keys, "status", "median_ms", "ci95_low_ms", "ci95_high_ms", "tflops", "pct_peak", "pct_measured_ceiling",
            "device", "dtype", "samples_ms"]
    m = da[[c for c in cols if c in da]].merge(db[[c for c in cols if c in db]], on=keys, suffixes=("_a", "_b"))
    m["ratio_b_over_a"] = m["median_ms_b"] / m["median_ms_a"]
    tests = [stats.significance(stats.as_samples(x), stats.as_samples(y)) if {sa, sb} <= set(schema.TIMED) else {}
             for x, y, sa, sb in zip(m.get("samples_ms_a", [None] * len(m)), m.get("samples_ms_b", [None] * len(m)),
                                     m["status_a"], m["status_b"], strict=True)]
    m["p_value"] = [t.get("p_value", float("nan")) for t in tests]
    m["significant"] = pd.array([t.get("significant") for t in tests], dtype="boolean")
    return m.drop(columns=[c for c in ("samples_ms_a", "samples_ms_b") if c in m])


@dataclass
class CompareSummary:
    headline: str
    gpu_a: str
    gpu_b: str
    warnings: list[str]


def compare_summary(a: Bundle, b: Bundle, rows: pd.DataFrame, gpu_a: str | None = None,
                    gpu_b: str | None = None) -> CompareSummary:
    """Which run is faster overall (geometric mean of A's median over B's on rows timed in both), in
    words with the direction in them, and what makes the comparison shaky (GPUs, devices, dtypes)."""
    ma, mb = a.manifest(), b.manifest()
    gpu_a = gpu_a or (ma.get("env") or {}).get("gpu_name") or "CPU only"
    gpu_b = gpu_b or (mb.get("env") or {}).get("gpu_name") or "CPU only"
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
    both = rows[rows["status_a"].isin(schema.TIMED) & rows["status_b"].isin(schema.TIMED)
                & (rows["median_ms_a"] > 0) & (rows["median_ms_b"] > 0)]
    if both.empty:
        return CompareSummary("no row is timed in both runs", gpu_a, gpu_b, warnings)
    speed = _geomean(both["median_ms_a"] / both["median_ms_b"])
    n = len(both)
    over = f"geometric mean over {n} row{'s' * (n != 1)} timed in both"
    if abs(speed - 1) < 0.005:
        head = f"B and A take the same time ({over})"
    elif speed > 1:
        head = f"B is {f.ratio(speed)} faster than A ({over})"
    else:
        head = f"B is {f.ratio(1 / speed)} slower than A ({over})"
    return CompareSummary(head, gpu_a, gpu_b, warnings)
