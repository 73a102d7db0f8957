"""The report's "Why": the advisor's diagnosis, limited to what a user can act on.

The question is comparative (why is this kernel slower than the fastest?), so a finding that holds as
much for the fastest kernel at the same shape is not a defect of each variant but a note about the
shape (one query tile of work on 132 SMs is too few CTAs for every kernel): such findings are said
once per cause, with their shapes. Each variant the user can change (faprof's own kernels and user
kernels, not PyTorch's or the CPU reference) then gets one line: the cause that is its first
distinguishing finding on most shapes, with the evidence it rests on and the usual fix. Every
finding, the baselines' included, is in the appendix (`faprof explain RUN` prints them too).

The advisor is used through its public API only (`diagnose`, `summarize`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from faprof import advisor
from faprof.advisor.render import share_text, who
from faprof.analysis import short_labels
from faprof.model import schema
from faprof.report import fmt as f
from faprof.report import table_text as rt
from faprof.report.answer import LEVEL_WITHIN

#: Variant kinds whose code the user can change: faprof's CUDA kernels and user kernels.
ACTIONABLE_KINDS = ("cuda", "user")

#: Evidence quoted on the first screen is cut at this many characters (the appendix has all of it).
EVIDENCE_CHARS = 180

#: Finding kinds that name a cause (faprof.advisor.KINDS; 'term' is a term of the gap to the fastest kernel, in
#: advisors that split it); Nsight Compute's own rule texts and notes are quoted in the appendix only.
CAUSE_KINDS = ("correctness", "defect", "limit", "term", "position")

#: The variant name an advisor gives a note about a shape rather than a kernel (faprof.advisor.diagnose's
#: SHAPE_ROW, where it writes such notes itself): those rows are the section's shape notes as they are.
SHAPE_ROW = "(all)"


def _short(evidence: Any) -> str:
    first = str(evidence or "").split(" | ")[0].split("; ")[0].strip()
    return first if len(first) <= EVIDENCE_CHARS else first[: EVIDENCE_CHARS - 1].rstrip() + "…"


def fastest_diagnosed(df: pd.DataFrame, diag: pd.DataFrame) -> dict[str, str]:
    """shape_id -> the fastest variant at that shape among those the advisor has findings for (timed ok)."""
    t = df[(df["status"] == "ok") & (pd.to_numeric(df["median_ms"], errors="coerce") > 0)]
    seen = set(zip(diag["variant"], diag["shape_id"], strict=True))
    t = t[[(v, s) in seen for v, s in zip(t["variant"], t["shape_id"], strict=True)]]
    return {str(s): str(g.sort_values("median_ms").iloc[0]["variant"]) for s, g in t.groupby("shape_id")}


def split_shape_notes(df: pd.DataFrame, diag: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(findings that also hold for the fastest diagnosed variant at their shape, the rest).

    The fastest variant's own findings stay in the rest (they are its own causes)."""
    fastest = fastest_diagnosed(df, diag)
    # a finding is identified by its title: every ncu rule shares the cause 'ncu_rule'
    causes = {s: set(diag.loc[(diag["shape_id"] == s) & (diag["variant"] == v), "title"]) for s, v in fastest.items()}
    shared = [v != fastest.get(s) and c in causes.get(s, set())
              for v, s, c in zip(diag["variant"], diag["shape_id"], diag["title"], strict=True)]
    mask = pd.Series(shared, index=diag.index, dtype=bool)
    return diag[mask], diag[~mask]


def _shape_lines(notes: pd.DataFrame, diag: pd.DataFrame, df: pd.DataFrame, fastest: dict[str, str]) -> list[str]:
    """One line per cause that also holds for the fastest kernel: its shapes and that kernel's evidence."""
    labels = {r["shape_id"]: rt.shape(r) for _, r in df.drop_duplicates("shape_id").iterrows()}
    out = []
    for title, g in notes[notes["kind"].isin(CAUSE_KINDS)].groupby("title", sort=False):
        shapes = list(dict.fromkeys(g["shape_id"]))
        who = fastest.get(shapes[0], "")
        own = diag[(diag["shape_id"] == shapes[0]) & (diag["variant"] == who) & (diag["title"] == title)]
        ev = f" ({f.md(who)}: {f.md(_short(own['evidence'].iloc[0]))})" if not own.empty else ""
        out.append(f"- **{f.md(title)}** at {_shapes_phrase([labels.get(s, s) for s in shapes])}: it holds for the fastest "
                   f"profiled kernel there too{ev}, so it describes the shape, not the {g['variant'].nunique()} other "
                   "kernel(s) it was found in.")
    return out


def _shapes_phrase(labels: list[str]) -> str:
    """'B=1 H=1 S=128, B=4 H=8 S=128 (D=64 causal; fp16, fp32)': shapes without the words they share."""
    dtypes = list(dict.fromkeys(w for lab in labels for w in lab.split() if w in ("fp16", "bf16", "fp32", "fp64")))
    bare = list(dict.fromkeys(" ".join(w for w in lab.split() if w not in dtypes) for lab in labels))
    short, common = short_labels(bare)
    tail = "; ".join(x for x in (common, ", ".join(dtypes)) if x)
    return f.md(", ".join(short[b] for b in bare) + (f" ({tail})" if tail else ""))


def _top_causes(rest: pd.DataFrame, df: pd.DataFrame, variants: list[str]) -> pd.DataFrame:
    """Per (variant, dtype): the cause that is the first distinguishing finding on most of its shapes.

    Returns:
        One row per (variant, dtype) in `variants`' order: the finding (title, evidence, fix, gain), `n` (shapes it
        leads on), `total` (shapes the variant was timed on in that dtype) and `shapes` (the shape ids it leads on).
    """
    named = rest[rest["kind"].isin(CAUSE_KINDS)]
    first = named.sort_values(["variant", "shape_id", "rank"]).drop_duplicates(["variant", "shape_id"])
    direction = df.drop_duplicates("shape_id").set_index("shape_id")["direction"]
    size = df.drop_duplicates("shape_id").set_index("shape_id")["flops"] if "flops" in df else pd.Series(dtype=float)
    first = first.assign(direction=first["shape_id"].map(direction).fillna("fwd"))
    rows = []
    for v in variants:
        for (dtype, dr), gd in first[first["variant"] == v].groupby(["dtype", "direction"], sort=False):
            counts = gd.groupby("title").agg(n=("shape_id", "nunique"), gain=("estimated_gain_pct", "max"))
            title = counts.sort_values(["n", "gain"], ascending=False).index[0]
            lead = gd[gd["title"] == title]
            # the figure quoted is the one at the largest of those shapes (the answer's table is at the largest)
            top = lead.assign(_size=lead["shape_id"].map(size)).sort_values(["_size", "estimated_gain_pct"],
                                                                          ascending=False).iloc[0].drop("_size")
            mine = df[(df["variant"] == v) & (df["dtype"] == dtype) & (df["direction"] == dr) & df["status"].isin(schema.TIMED)]
            rows.append({**top.to_dict(), "n": int(counts.loc[title, "n"]), "total": mine["shape_id"].nunique(),
                         "shapes": set(gd.loc[gd["title"] == title, "shape_id"])})
    return pd.DataFrame(rows)


def _gain(r: Any) -> str:
    """How much a finding explains, in the unit the advisor gave it: the gap to a faster kernel, or the call."""
    if r.get("unit") == "gap" and pd.notna(r.get("share_of_gap_pct")):
        return share_text({**r, "estimated_gain_pct": r["share_of_gap_pct"],
                                   "against": r.get("against") or "the fastest"})
    x = r.get("estimated_gain_pct")
    return f"up to {x:.0f}% of the call's time" if x is not None and pd.notna(x) else ""


#: At most this many variant lines in the Why section (a page holds about this many with their evidence); past
#: it, each variant keeps its first line (in the answer's order), and the rest are named, in the appendix.
MAX_VARIANT_LINES = 10


def _within_page(top: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """`top`'s rows to print (every variant's first, then the others in order, up to MAX_VARIANT_LINES) and
    the labels of those left for the appendix."""
    if len(top) <= MAX_VARIANT_LINES:
        return top, []
    first = ~top["variant"].duplicated()
    keep = first.copy()
    for i in top.index[~first]:
        if int(keep.sum()) >= MAX_VARIANT_LINES:
            break
        keep[i] = True
    left = [f"{r['variant']} ({r['dtype']}{'' if r['direction'] == 'fwd' else ' ' + r['direction']})"
            for _, r in top[~keep].iterrows()]
    return top[keep], left


def _variant_lines(top: pd.DataFrame) -> list[str]:
    if top.empty:
        return []
    # variants with the same leading cause in the same dtype and direction (the steps of one progression) share a line
    cols = ["dtype", "direction", "title", "fix"]
    top = top.assign(_cause=top[cols].astype(str).agg("|".join, axis=1))
    lead = top.drop_duplicates("_cause")
    shown, left = _within_page(lead)
    more = [f"- Also diagnosed, in the appendix: {', '.join(left)}."] if left else []
    return [_line(r, top[(top["_cause"] == r["_cause"]) & (top.index != i)]) for i, r in shown.iterrows()] + more


def _line(r: Any, same: pd.DataFrame) -> str:
    """One variant's leading cause; `same`: the later variants whose leading cause it is too (their share quoted)."""
    likewise = "; ".join(f"{who(o)} (on {o['n']} of {o['total']} shapes" + (f"; {_gain(o)}" if _gain(o) else "") + ")"
                         for _, o in same.iterrows())
    return (f"- **{who(r)}** ({r['dtype']}{'' if r['direction'] == 'fwd' else ' ' + r['direction']}): "
            f"{f.md(r['title'])} on {r['n']} of {r['total']} shapes"
            + (f"; {_gain(r)}" if _gain(r) else "")
            + f": {f.md(_short(r['evidence']))}."
            + (f" Where: {f.md(r['source'])}." if isinstance(r.get("source"), str) and r.get("source") else "")
            + f" Fix: {f.md(r['fix'])}."
            + (f" The same cause leads for {f.md(likewise)}." if likewise else ""))


@dataclass
class Why:
    """The diagnosis of a run, split for the report: every finding, the shape notes, each changeable
    variant's leading distinguishing cause, and the section's lines."""

    diag: pd.DataFrame
    lines: list[str]
    top: pd.DataFrame = field(default_factory=pd.DataFrame)
    notes: pd.DataFrame = field(default_factory=pd.DataFrame)

    def brief(self, shape_ids: Iterable[str], level: Iterable[str] = ()) -> str:
        """One line for a block's first screen: each changeable variant's leading cause on these shapes, and
        the causes that belong to the shapes ('' when the advisor has nothing to say there). Variants in
        `level` (level with the block's fastest) are named as such, without a cause: there is no gap."""
        ids, level = set(shape_ids), list(level)
        rows = [r for _, r in self.top.iterrows() if r["shapes"] & ids] if not self.top.empty else []
        parts = [f"{r['variant']}: {f.md(r['title'])} ({_gain(r) or 'see Why'})" for r in rows if r["variant"] not in level]
        even = [v for v in level if any(r["variant"] == v for r in rows)]
        if even:
            parts.append(f"level with the fastest (within {100 * (LEVEL_WITHIN - 1):.0f}% over these shapes): {', '.join(even)}")
        shared = list(dict.fromkeys(_bare(t) for t in self.notes.loc[
            self.notes["shape_id"].isin(ids) & _shape_kinds(self.notes), "title"])) if not self.notes.empty else []
        if shared:
            parts.append(f"for every kernel at some shapes: {f.md(', '.join(shared))}")
        return ("**Why**: " + "; ".join(parts) + " (details below).") if parts else ""


def _shape_kinds(notes: pd.DataFrame) -> pd.Series:
    """Rows that are causes about a shape: the advisor's own shape notes (variant '(all)', kind 'note') or a
    cause kind."""
    return notes["kind"].isin(CAUSE_KINDS) | (notes["variant"] == SHAPE_ROW)


def _bare(title: Any) -> str:
    """A shape note's title without the advisor's 'the shape: ' prefix."""
    return str(title).removeprefix("the shape: ")


def _advisor_shape_lines(notes: pd.DataFrame, df: pd.DataFrame) -> list[str]:
    """Shape notes the advisor wrote itself (variant SHAPE_ROW): one line per cause, with their shapes."""
    labels = {r["shape_id"]: rt.shape(r) for _, r in df.drop_duplicates("shape_id").iterrows()}
    out = []
    for title, g in notes[_shape_kinds(notes)].groupby(notes["title"].map(_bare), sort=False):
        shapes = list(dict.fromkeys(g["shape_id"]))
        out.append(f"- **{f.md(title)}** at {_shapes_phrase([labels.get(s, s) for s in shapes])}: "
                   f"{f.md(_short(g['evidence'].iloc[0]))}.")
    return out


def section(bundle: Any, df: pd.DataFrame, order: list[str], focus: str | None = None) -> Why:
    """The Why section and every finding (for the appendix).

    Args:
        bundle: the run bundle (the advisor reads its Nsight tables).
        df: its measurement rows (with `variant_kind`).
        order: variants in the order the report ranked them.
        focus: only this variant's causes (a `--focus` report).
    """
    have = [name for name, t in (("Nsight Compute", bundle.read("ncu_summary")), ("Nsight Systems", bundle.read("nsys_summary")))
            if not t.empty]
    return from_diagnosis(advisor.diagnose(bundle), df, order, have, focus)


def from_diagnosis(diag: pd.DataFrame, df: pd.DataFrame, order: list[str], have: list[str],
                   focus: str | None = None) -> Why:
    """The Why section from the advisor's findings (`section` without the bundle: tests give it findings).

    Args:
        diag: `faprof.advisor.diagnose`'s rows; df, order, focus: as `section`; have: the Nsight tools the run has.
    """
    lines = ["## Why", ""]
    if not have:
        lines += ["From the timings alone: this run has no Nsight data, so occupancy, memory throughput and stall reasons "
                  "are unknown (`faprof profile --ncu --nsys` adds them).", ""]
    if diag.empty:
        return Why(diag, [*lines, "No diagnosis from this run's data.", ""])
    if have:
        lines += [f"From the timings and {' and '.join(have)}: causes ranked by the share of the time they explain; "
                  "what also holds for the fastest profiled kernel at a shape is said once, as a note on the shape.", ""]
    own_notes = diag[diag["variant"] == SHAPE_ROW]
    notes, rest = split_shape_notes(df, diag[diag["variant"] != SHAPE_ROW])
    kinds = df.drop_duplicates("variant").set_index("variant")["variant_kind"] if "variant_kind" in df else pd.Series(dtype=object)
    mine = [v for v in order if (focus is None or v == focus) and kinds.get(v, "cuda") in ACTIONABLE_KINDS]
    top = _top_causes(rest, df, mine)
    if not own_notes.empty:  # the advisor said what belongs to the shapes: its notes, as written
        notes = own_notes if not focus else own_notes[own_notes["shape_id"].isin(set(df.loc[df["variant"] == focus, "shape_id"]))]
        shape = _advisor_shape_lines(notes, df)
    else:
        notes = notes[notes["variant"].isin(mine)] if focus else notes
        shape = _shape_lines(notes, diag, df, fastest_diagnosed(df, diag))
    lines += _variant_lines(top) or [f"- No cause distinguishes {', '.join(mine) or 'the kernels you can change'} from the "
                                     "fastest kernel at any shape."]
    if shape:
        lines += ["", "Notes on shapes:", "", *shape]
    others = sorted(set(diag["variant"]) - set(mine) - {SHAPE_ROW})
    if others and focus is None:
        lines += ["", f"Baselines you do not write ({', '.join(others)}) are diagnosed in the appendix."]
    return Why(diag, [*lines, ""], top, notes)
