"""Reports from a run bundle in two layers: a report that fits a page or two, and an appendix with every table.

The report (report.md, the top of report.html) answers "how fast, against what, why" on its first screen:

1. **The answer**: per block of comparable rows (scenario group x dtype x direction) the fastest
   variant against the baseline, then one table of every variant against it: median with its CI
   at the largest shape, the ratio (geometric mean and range over shapes), TFLOP/s, % of peak,
   status (`answer`). A baseline that did not run is called missing; the ratios then say so.
2. **Why**: the advisor's diagnosis of the kernels the user can change, shape-level notes once (`why`).
3. **Against the published figures** of the seed report the scenario reproduces (`published`).
4. **Charts** chosen for the question: one per block (`charts`), **Notes** (correctness, unstable
   timings, rows not run: counts and reasons) and the **Method**, generated from the manifest (`method`).

`--focus VARIANT` makes it a report about one kernel against the rest: per shape its median against
the baseline and the fastest other variant, its causes only, its chart lines drawn thick.

The appendix (appendix.md, collapsed sections of report.html) holds every per-row table (`appendix`).
Every number comes from the bundle; published figures are labelled as the report's. Numbers are
formatted by `fmt` (units in headers, no `nan`, no positive exponents), data text is escaped so it
renders as written. Nothing is written until everything is rendered.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from faprof import analysis
from faprof.analysis import aliases
from faprof.correctness.wrong_text import explain_wrong_rows
from faprof.errors import FaprofError
from faprof.report import answer, appendix, observations, png, seed_figures, why
from faprof.report import charts as rc
from faprof.report import html as rh
from faprof.report.blocks import Block, blocks, shape_label, timed
from faprof.report.method import meta, method
from faprof.run import sanitize
from faprof.store import Bundle, csv_files, write_files

ChartHook = Callable[[str, str], str]

APPENDIX_FILE = "appendix.md"

NO_PLOTLY = "No charts (plotly is not installed: pip install plotly)."


@dataclass
class Run:
    """A bundle read once for a report: manifest, rows with speedups, blocks, ranking order, findings."""

    bundle: Bundle
    manifest: dict[str, Any]
    df: pd.DataFrame
    blocks: list[Block]
    focus: str | None = None
    order: list[str] = field(default_factory=list)
    diagnosis: why.Why | None = None

    @property
    def diag(self) -> pd.DataFrame:
        return self.diagnosis.diag if self.diagnosis is not None else pd.DataFrame()

    @property
    def gpu(self) -> str:
        return (self.manifest.get("env") or {}).get("gpu_name") or "CPU (no GPU)"

    @property
    def title(self) -> str:
        name = (self.manifest.get("scenario") or {}).get("name", "?")
        return f"{self.focus} against the rest: {name} on {self.gpu}" if self.focus else f"{name} on {self.gpu}"


def read_run(bundle: Bundle, focus: str | None = None) -> Run:
    """Everything a report needs from a bundle, with the advisor run once.

    Raises:
        FaprofError: the bundle has no timed rows (a sanitize bundle says so), or `focus` names a variant
            the run does not have.
    """
    m = bundle.manifest()
    meas = aliases.measurements(bundle)  # one kernel, one row: aliases named in the canonical row
    if meas.empty or "variant" not in meas:
        what = ("a `faprof sanitize` bundle: its findings are in sanitizer.parquet (`faprof export RUN --csv DIR`)"
                if m.get("kind") == "sanitize" else f"status {m.get('status')}")
        raise FaprofError(f"{bundle.path} has no timed rows to report ({what})")
    if focus is not None and focus not in set(meas["variant"]):
        raise FaprofError(f"--focus {focus!r}: no such variant in {bundle.run_id}; its variants: "
                          f"{', '.join(dict.fromkeys(meas['variant']))}")
    df = analysis.speedups.speedups_for(meas, m)
    run = Run(bundle, m, df, blocks(df), focus)
    run.order = list(dict.fromkeys(v for b in run.blocks for v in b.ranking["variant"]))
    run.diagnosis = why.section(bundle, df, run.order, focus)
    return run


# --------------------------------------------------------------------------------------- charts
def _chart_rows(b: Block) -> tuple[pd.DataFrame, list[str], dict[str, str], str]:
    t = timed(b.rows).sort_values("flops")
    t = t.assign(_shape=[shape_label(r) for _, r in t.iterrows()])
    order = list(dict.fromkeys(t["_shape"]))
    short, common = analysis.short_labels(order)
    return t, order, short, common


def build_charts(run: Run) -> list[Any]:
    """One chart per block with more than one shape: speed relative to the baseline per shape (the
    fastest variant per shape when the baseline did not run); empty without plotly."""
    if not rc.plotly_available():
        return []
    colors = analysis.variant_colors(run.df["variant"])
    lab = aliases.labels_of(run.df)
    out = []
    for b in run.blocks:
        if b.ranking.empty or (run.focus and run.focus not in set(b.ranking["variant"])):
            continue
        t, order, short, common = _chart_rows(b)
        if len(order) < 2:
            continue
        ref = t[t["variant"] == b.baseline].set_index("_shape")["median_ms"] if b.baseline_ran else \
            t.groupby("_shape")["median_ms"].min()
        t = t.assign(_rel=ref.reindex(t["_shape"]).to_numpy() / t["median_ms"].to_numpy())
        t = t.set_index("variant").loc[[v for v in b.ranking["variant"] if v in set(t["variant"])]].reset_index()
        notes = [common] if common else []
        if "device" in t and (t["device"] == "cuda").any() and (t["device"] != "cuda").any():
            # the CPU reference is the correctness oracle, 100-10,000x off the GPU kernels: it would squash them
            notes.append(f"{', '.join(dict.fromkeys(t.loc[t['device'] != 'cuda', 'variant']))} on the CPU not drawn")
            t = t[t["device"] == "cuda"]
        shared = f" ({'; '.join(notes)})" if notes else ""
        t = t.assign(variant=t["variant"].map(lambda v: lab.get(v, v)))  # legends name a kernel's aliases
        out.append(rc.speed_chart(f"{b.slug}-speed", f"{b.title}: speed relative to {b.reference}{shared}", t, order,
                                  short, {lab.get(k, k): c for k, c in colors.items()}, b.reference,
                                  highlight=lab.get(run.focus, run.focus) if run.focus else None))
    return out


# --------------------------------------------------------------------------------------- markdown
def _answer(run: Run) -> list[str]:
    parts = ["## The answer", ""]
    for b in run.blocks:
        if run.focus:
            parts += answer.focus_headline(b, run.focus)
            if run.focus in set(b.ranking["variant"]):  # timed here; else the headline says why not
                parts += [answer.focus_table(b, run.focus), ""]
        else:
            parts += answer.headline(b)
            table = answer.summary_table(b)
            if table:
                parts += [table.rstrip("\n"), ""]
        brief = run.diagnosis.brief(b.rows["shape_id"], answer.level_with_fastest(b)) if run.diagnosis is not None else ""
        if brief:
            parts += [brief, ""]
    return parts


def render_markdown(bundle: Bundle | Run, chart_hook: ChartHook | None = None, charts: list[Any] | None = None,
                    chart_note: str | None = None, focus: str | None = None, chart_lead: str | None = None) -> str:
    """The report proper as Markdown (the appendix is `render_appendix`).

    Args:
        bundle: the run bundle (or a Run already read).
        chart_hook: chart name, title -> the Markdown (or an HTML placeholder) for each chart in `charts`.
        chart_note: what the Charts section says when there are none.
        focus: a variant: the report is about it against the rest.
        chart_lead: a line before the charts (why they are links rather than images).
    """
    run = bundle if isinstance(bundle, Run) else read_run(bundle, focus)
    parts = [f"# {run.title}", "", meta(run.manifest, run.df), ""]
    parts += _answer(run)
    meas = run.df[run.df["variant"] == run.focus] if run.focus else run.df
    wrong = explain_wrong_rows(meas, run.bundle.read("error_maps"))
    if wrong:  # which bug each wrong row looks like, and where: before any timing is read
        parts += ["## Wrong results", "", "Each wrong row's bug signature and error map (`faprof explain RUN` prints "
                  "the same):", "", "```text", *wrong, "```", ""]
    parts += run.diagnosis.lines if run.diagnosis is not None else []
    if not run.focus:
        parts += seed_figures.section(run.df, run.manifest, run.gpu)
    parts += ["## Charts", ""]
    if charts and chart_hook is not None:
        parts += [chart_lead, ""] if chart_lead else []
        for c in charts:
            parts += [chart_hook(c.name, c.title), ""]
    else:
        parts += [chart_note or (NO_PLOTLY if not rc.plotly_available() else "The charts are in report.html."), ""]
    notes = observations.notes(run.df[run.df["variant"] == run.focus] if run.focus else run.df)
    if notes:
        parts += ["## Notes", "", *[f"- {x}" for x in notes], ""]
    parts += ["## Method", "", method(run.manifest, run.df), "",
              f"Every table of the run (per-row results, correctness, Nsight Compute per launch, every finding, the "
              f"environment): [{APPENDIX_FILE}]({APPENDIX_FILE}), or the Appendix of report.html.", ""]
    return "\n".join(parts).rstrip() + "\n"


def appendix_sections(run: Run) -> list[appendix.Section]:
    return appendix.sections(run.bundle, run.df, run.manifest, run.diag)


def render_appendix(bundle: Bundle | Run) -> str:
    """The appendix as Markdown: every table of the run."""
    run = bundle if isinstance(bundle, Run) else read_run(bundle)
    return appendix.markdown(run.title, appendix_sections(run))


def render_html(bundle: Bundle | Run, charts: list[Any] | None = None, focus: str | None = None) -> str:
    """The report and its appendix (collapsed) as one self-contained page with interactive charts."""
    run = bundle if isinstance(bundle, Run) else read_run(bundle, focus)
    charts = build_charts(run) if charts is None else charts
    script, divs = rc.html_divs(charts) if charts else ("", {})
    md = render_markdown(run, chart_hook=lambda name, title: f"<!--chart:{name}-->", charts=charts,
                         chart_note=NO_PLOTLY if not rc.plotly_available() else "No chart: every block has one shape.")
    md = md.replace(f"[{APPENDIX_FILE}]({APPENDIX_FILE}), or the Appendix of report.html", "the Appendix below")
    return rh.page(f"faprof report: {run.title}", md, appendix_sections(run), script, divs)


def _sanitize_files(bundle: Bundle, formats: tuple[str, ...]) -> dict[str, str | bytes]:
    files: dict[str, str | bytes] = {}
    md = sanitize.markdown(bundle)
    if "md" in formats:
        files["report.md"] = md
    if "html" in formats:
        files["report.html"] = rh.page("faprof sanitize", md, [])
    if "csv" in formats:
        files.update({f"csv/{name}": text for name, text in csv_files(bundle).items()})
    return files


def _markdown_with_charts(run: Run, charts: list[Any], with_html: bool,
                          notice: Callable[[str], None] | None) -> dict[str, str | bytes]:
    """report.md with its charts as PNG files, or (no kaleido, no browser, kaleido past its time limit) with
    each chart a link to its place in report.html; `notice` gets the reason in one line."""
    images, why_not = png.png_images(charts) if charts else ({}, "")
    if images:
        files: dict[str, str | bytes] = {f"charts/{name}.png": data for name, data in images.items()}
        files["report.md"] = render_markdown(run, chart_hook=lambda name, title: f"![{title}](charts/{name}.png)",
                                             charts=charts)
        return files
    if charts and with_html:
        if notice:
            notice(f"{why_not}; report.md links each chart to report.html")
        return {"report.md": render_markdown(run, chart_hook=lambda name, title: f"[{title}](report.html#chart-{name})",
                                             charts=charts, chart_lead=f"{why_not}; each chart opens in report.html:")}
    note = why_not or (NO_PLOTLY if not rc.plotly_available() else "No chart: every block has one shape.")
    if charts:
        note += "; `--format md,html` writes them, interactive, into report.html."
    if why_not and notice:
        notice(why_not)
    return {"report.md": render_markdown(run, chart_note=note)}


def render_files(bundle: Bundle, formats: tuple[str, ...] = ("md", "html", "csv"),
                 notice: Callable[[str], None] | None = None, focus: str | None = None) -> dict[str, str | bytes]:
    """Every file of the report, rendered in memory, by path relative to the report folder."""
    if bundle.manifest().get("kind") == "sanitize":  # a `faprof sanitize` bundle: its own short report
        return _sanitize_files(bundle, formats)
    run = read_run(bundle, focus)
    files: dict[str, str | bytes] = {}
    charts = build_charts(run) if {"md", "html"} & set(formats) else []
    if "md" in formats:
        files.update(_markdown_with_charts(run, charts, "html" in formats, notice))
        files[APPENDIX_FILE] = render_appendix(run)
    if "html" in formats:
        files["report.html"] = render_html(run, charts)
    if "csv" in formats:
        files.update({f"csv/{name}": text for name, text in csv_files(bundle).items()})
    return files


def write_reports(bundle: Bundle, dest: str | Path, formats: tuple[str, ...] = ("md", "html", "csv"),
                  notice: Callable[[str], None] | None = None, focus: str | None = None) -> list[Path]:
    """Render the report and write it under `dest`; a damaged bundle raises before anything is written."""
    return write_files(dest, render_files(bundle, formats, notice, focus))
