"""Text, Markdown and rich renderings of diagnose() / summarize() tables (`faprof explain`)."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from faprof.advisor.diagnose import summarize
from faprof.advisor.findings import over_gap
from faprof.model import schema
from faprof.model.plan import also_label
from faprof.model.values import as_float


def who(r: Any, variant: Any = None) -> str:
    """A row's variant, with the aliases its kernel also stands for: 'fa3_wgmma_e (also fa3_bwd_a..d)'."""
    get = r.get if hasattr(r, "get") else (lambda k, d=None: d)
    a = get("aliases")
    names = [n for n in str(a).split(schema.ALIAS_SEP) if n] if isinstance(a, str) else []
    return also_label(str(variant if variant is not None else get("variant")), names)


def _gain(x: Any) -> str:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return ""
    return "" if math.isnan(v) else f"{v:.0f}%"


def share_text(r: Any, prefix: str = "") -> str:
    """What a row's share is of, in words: '83% of the slowdown to sdpa_cudnn (+6.9 µs)' or '~12% of the call'."""
    gain = _gain(r.get("estimated_gain_pct") if hasattr(r, "get") else r["estimated_gain_pct"])
    if not gain:
        return ""
    unit = r.get("unit") if hasattr(r, "get") else None
    if unit == "gap":
        term = as_float(r.get("gap_ms"))
        share = float(r.get("estimated_gain_pct"))
        if share > 100 and not math.isnan(term):
            # a table from elsewhere (an older faprof's shares of the net gap): say the time, never a share above 100%
            return prefix + over_gap(term, term * 100 / share, r.get("against"))
        # a share of the slowdown (the gap's positive parts: 0..100%), with the part's own time
        us = f" ({1e3 * term:+.1f} µs)" if not math.isnan(term) else ""
        return f"{prefix}{gain} of the slowdown to {r.get('against')}{us}"
    if unit == "kernel":
        return f"{prefix}~{gain} of the kernel"
    return f"{prefix}~{gain} of the call"


def _md(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def select(diag: pd.DataFrame, variant: str | None = None, shape: str | None = None) -> pd.DataFrame:
    """Rows of one variant and/or shape (None: all)."""
    d = diag
    if variant:
        d = d[d["variant"] == variant]
    if shape:
        d = d[d["shape_id"] == shape]
    return d


def render_markdown(diag: pd.DataFrame, summary: pd.DataFrame | None = None, per_shape: bool = False) -> str:
    """Markdown: the aggregated table (one row per variant and cause, per dtype), or with per_shape
    the ranked findings of each (variant, shape)."""
    if diag.empty:
        return "No findings: the bundle has no timed rows with Nsight data the advisor can read.\n"
    parts: list[str] = []
    if per_shape:
        for (v, sid), g in diag.groupby(["variant", "shape_id"], sort=False):
            parts.append(f"#### {who(g.iloc[0], v)} · {sid}\n")
            parts.append("| # | cause | kernel | share | evidence | where | fix |\n|---|---|---|---|---|---|---|")
            for _, r in g.sort_values("rank").iterrows():
                star = "**" if r["primary"] else ""
                parts.append(f"| {r['rank']} | {star}{_md(r['title'])}{star} | {_md(r['kernel'])[:40]} | "
                             f"{_md(share_text(r))} | {_md(r['evidence'])} | {_md(_where(r, ''))} | "
                             f"{_md(r['fix'])} |")
            parts.append("")
        return "\n".join(parts) + "\n"

    s = summary if summary is not None else summarize(diag)
    for dtype, g in s.groupby(s["dtype"].fillna(""), sort=False):
        if dtype:
            parts.append(f"#### {dtype}\n")
        parts.append("| variant | cause | primary on | also on | max gain | evidence (largest) | where | fix |\n"
                     "|---|---|---|---|---|---|---|---|")
        for _, r in g.iterrows():
            prim = set(filter(None, str(r["primary_shapes"]).split(", ")))
            also = [x for x in str(r["shapes"]).split(", ") if x and x not in prim]
            parts.append(f"| {_md(who(r))} | {_md(r['title'])} | {_md(r['primary_shapes']) or '—'} | "
                         f"{_md(', '.join(also)) or '—'} | {_gain(r['max_gain_pct'])} | {_md(r['evidence'])} | "
                         f"{_md(_where(r))} | {_md(r['fix'])} |")
        parts.append("")
    return "\n".join(parts) + "\n"


def _where(r: Any, missing: str = "—") -> str:
    """A finding's source location, or `missing` where it has none (None, NaN or empty in the table)."""
    src = r.get("source")
    return src if isinstance(src, str) and src else missing


def render_text(diag: pd.DataFrame, summary: pd.DataFrame | None = None, per_shape: bool = False,
                width: int = 100) -> str:
    """Plain text: the same views as render_markdown, wrapped to `width` columns."""
    import textwrap

    if diag.empty:
        return "No findings: the bundle has no timed rows with Nsight data the advisor can read.\n"
    out: list[str] = []

    def para(label: str, text: Any) -> None:
        out.extend(textwrap.wrap(str(text), width=width, initial_indent=f"    {label}: ",
                                 subsequent_indent=" " * (6 + len(label))))

    if per_shape:
        for (v, sid), g in diag.groupby(["variant", "shape_id"], sort=False):
            out.append(f"{who(g.iloc[0], v)} · {sid}")
            for _, r in g.sort_values("rank").iterrows():
                mark = "PRIMARY" if r["primary"] else f"{r['rank']:>7}"
                out.append(f"  {mark}  {r['title']}" + share_text(r, "  ")
                           + (f"  [{str(r['kernel'])[:48]}]" if r["kernel"] else ""))
                para("evidence", r["evidence"])
                if _where(r, ""):
                    para("where", r["source"])
                para("fix", r["fix"])
            out.append("")
        return "\n".join(out) + "\n"

    s = summary if summary is not None else summarize(diag)
    for (dt, v), g in s.groupby([s["dtype"].fillna(""), "variant"], sort=False):
        out.append(who(g.iloc[0], v) + (f" ({dt})" if dt else ""))
        for _, r in g.iterrows():
            gain = _gain(r["max_gain_pct"])
            prim = r["primary_shapes"]
            out.append(f"  {r['title']}" + (f"  up to ~{gain}" if gain else "")
                       + (f"  primary on {prim}" if prim else f"  on {r['shapes']}"))
            para("evidence", r["evidence"])
            if _where(r, ""):
                para("where", r["source"])
            para("fix", r["fix"])
        out.append("")
    return "\n".join(out) + "\n"


def rich_table(diag: pd.DataFrame, summary: pd.DataFrame | None = None, per_shape: bool = False, title: str = ""):
    """A rich Table of the same view (for the CLI)."""
    from rich.table import Table

    t = Table(title=title or None, header_style="bold", show_lines=True)
    if per_shape:
        for c in ("variant · shape", "#", "cause", "est. gain", "evidence", "where", "fix"):
            t.add_column(c, overflow="fold")
        for _, r in diag.sort_values(["variant", "shape_id", "rank"], kind="stable").iterrows():
            cause = f"[bold]{r['title']}[/]" if r["primary"] else str(r["title"])
            t.add_row(f"{who(r)}\n{r['shape_id']}", str(r["rank"]), cause, share_text(r),
                      str(r["evidence"]), _where(r), str(r["fix"]))
        return t

    s = summary if summary is not None else summarize(diag)
    for c in ("variant", "cause", "primary on", "max gain", "evidence (largest)", "where", "fix"):
        t.add_column(c, overflow="fold")
    for _, r in s.iterrows():
        cause = f"[bold]{r['title']}[/]" if r["primary_shapes"] else str(r["title"])
        t.add_row(f"{who(r)}\n({r['dtype'] or ''})", cause, str(r["primary_shapes"]) or "—",
                  _gain(r["max_gain_pct"]), str(r["evidence"]), _where(r), str(r["fix"]))
    return t
