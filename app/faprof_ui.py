"""What every dashboard page shares: loading (cached), the sidebar, tables with CSV downloads, chart style.

The entry file (`dashboard.py`) calls `setup()` once per rerun, before `st.navigation` runs the
page; pages call `context()` to get the loaded runs and the sidebar's filters. Data shaping lives
in `faprof.dashboard` (no Streamlit there), so what this module adds is presentation only.
"""

from __future__ import annotations

import hashlib
import math
import os
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import streamlit as st

from faprof import analysis as fd
from faprof.errors import FaprofError
from faprof.store import MANIFEST, find_bundles

RUNS_ENV = "FAPROF_RUNS"
"""Run folders to load, separated by the OS path separator (what tests and `faprof dashboard` may set;
paths after `--` on the `streamlit run` command line are added to them)."""

DEFAULT_RUNS_DIR = Path("runs")
"""Loaded when no folder is given and it exists: where `faprof profile` writes bundles by default."""

UPLOAD_ROOT = Path(tempfile.gettempdir()) / "faprof-dashboard-uploads"
"""Uploaded archives are unpacked under here, one folder per archive content hash."""

CTX_KEY = "_faprof_ctx"

STATUS_COLORS = {"ok": "#2e7d32", "wrong": "#d32f2f", "untrusted": "#6a1b9a", "failed": "#b71c1c",
                 "unsupported": "#f9a825", "skipped": "#9e9e9e"}
"""One colour per row status, the same on every page (red for the two that need attention)."""

STATUS_SYMBOLS = {"ok": "circle", "wrong": "x"}
"""Marker per timed status on the charts: a wrong row is drawn as a cross (and ringed in red)."""

PLOT_CONFIG = {"displaylogo": False, "toImageButtonOptions": {"format": "png", "scale": 2}}


# ----------------------------------------------------------------------------------- sources
def command_line_paths(argv: list[str] | None = None, environ: dict[str, str] | None = None) -> list[str]:
    """Run folders named for this session: $FAPROF_RUNS, then the arguments after `--`.

    `streamlit run app/dashboard.py -- A B` leaves sys.argv = [app/dashboard.py, A, B]; anything
    else in sys.argv (pytest's arguments under AppTest) is not ours and is ignored.
    """
    argv = sys.argv if argv is None else argv
    environ = os.environ if environ is None else environ
    paths = [p for p in environ.get(RUNS_ENV, "").split(os.pathsep) if p]
    if argv and Path(argv[0]).name == "dashboard.py" and Path(argv[0]).resolve().parent == Path(__file__).resolve().parent:
        paths += [a for a in argv[1:] if not a.startswith("-")]
    if not paths and DEFAULT_RUNS_DIR.is_dir():
        paths.append(str(DEFAULT_RUNS_DIR))
    return list(dict.fromkeys(paths))


@st.cache_data(show_spinner="unpacking the archive", max_entries=32)
def _unpack(digest: str, data: bytes) -> list[str]:
    dest = UPLOAD_ROOT / digest
    if dest.is_dir() and any(dest.rglob(MANIFEST)):
        return [str(b.path) for b in find_bundles(dest)]
    return [str(p) for p in fd.safe_extract(data, dest)]


@st.cache_data(show_spinner="loading run bundles", max_entries=8)
def load(sources: tuple[tuple[str, str], ...], stamp: tuple[tuple[str, float], ...]) -> fd.RunSet:
    """Load the bundles (cached; `stamp` changes when a bundle on disk changes)."""
    del stamp  # only part of the cache key
    return fd.load_runs(list(sources))


# ----------------------------------------------------------------------------------- context
@dataclass
class Context:
    """What a page needs: the loaded runs and the sidebar's filter choices."""

    runs: fd.RunSet
    filters: dict[str, list[Any]] = field(default_factory=dict)
    sources: list[tuple[str, str]] = field(default_factory=list)

    @property
    def colors(self) -> dict[str, str]:
        """One colour per variant for every chart of the session: from every variant loaded, not the ones a
        chart happens to draw, so neighbouring charts (and pages) agree."""
        names = list(self.runs.measurements.get("variant", []))
        for t in self.runs.tables.values():
            names += list(t.get("variant", []))
        return fd.variant_colors(names)

    def run_order(self, among: Any = None) -> list[str]:
        """Run ids as pages offer them: the user's own runs before the examples, newest first."""
        return fd.run_order(self.runs.runs, among)

    @property
    def measurements(self) -> pd.DataFrame:
        """Measurement rows that pass the sidebar filters."""
        return fd.apply_filters(self.runs.measurements, self.filters)

    def filter_table(self, df: pd.DataFrame) -> pd.DataFrame:
        """An Nsight table limited to the runs, scenarios and variants the filters keep."""
        if df.empty:
            return df
        keep = {c: v for c, v in self.filters.items() if c in ("scenario", "variant") and v}
        return fd.apply_filters(df, keep)

    def label_shapes(self, df: pd.DataFrame) -> pd.DataFrame:
        """A table whose shape_id column reads as problem labels ('B=1 H=2 S=64 D=32 fp32') where known."""
        m = self.runs.measurements
        if df.empty or "shape_id" not in df or m.empty:
            return df
        names = dict(zip(m["shape_id"], m["problem"], strict=False))
        return df.assign(shape_id=df["shape_id"].map(names).fillna(df["shape_id"]))

    def scenario_hint(self) -> str | None:
        """The scenario to name in a 'run this to get the data' hint."""
        chosen = self.filters.get("scenario") or []
        if chosen:
            return str(chosen[0])
        runs = self.runs.runs
        if runs.empty:
            return None
        gpu_runs = runs[runs["gpu"] != "CPU (no GPU)"]
        return str((gpu_runs if not gpu_runs.empty else runs)["scenario"].iloc[0])


def setup() -> Context:
    """The shared sidebar (filters, then the data sources and the uploader) and the loaded runs."""
    st.set_page_config(page_title="faprof dashboard", page_icon="⚡", layout="wide")
    filters_box = st.sidebar.container()
    data_box = st.sidebar.expander("Data: run bundles", expanded=False)

    sources: list[tuple[str, str]] = [(p, "command line") for p in command_line_paths()]
    uploads = data_box.file_uploader(
        "Add bundle archives (.tar.gz from Bundle.archive)", type=["gz", "tgz", "tar"],
        accept_multiple_files=True, key="uploads",
        help="Archives are unpacked into a temporary folder; paths that would leave it are refused.")
    for up in uploads or []:
        data = up.getvalue()
        try:
            for p in _unpack(hashlib.sha256(data).hexdigest(), data):
                sources.append((p, "upload"))
        except FaprofError as e:
            data_box.error(f"{up.name}: {e}")
    if fd.EXAMPLES_DIR is not None:
        sources.append((str(fd.EXAMPLES_DIR), "example"))

    paths = [p for p, _ in sources]
    runs = load(tuple(sources), fd.fingerprint(paths))
    for origin in fd.ORIGINS:
        shown = [p for p, o in sources if o == origin]
        if shown:
            data_box.caption(f"**{origin}**: " + ", ".join(f"`{_short(p)}`" for p in shown))
    data_box.caption(f"{len(runs.runs)} runs loaded. Start with more: `faprof dashboard RUN_DIR ...`")
    for w in runs.warnings:
        data_box.warning(w)

    filters = _filters(filters_box, runs.measurements)
    ctx = Context(runs=runs, filters=filters, sources=sources)
    st.session_state[CTX_KEY] = ctx  # handed to this run's page (context() takes it)
    st.session_state.pop(_REROUTED, None)
    return ctx


def _short(path: str) -> str:
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


_FILTER_LABELS = {"scenario": "Scenario", "dtype": "dtype", "causal": "Mask", "D": "Head dim D",
                  "variant": "Variant", "direction": "Direction", "Hkv": "KV heads", "mask": "Mask (full name)",
                  "layout": "Layout", "bound": "Bound"}


def _filters(box, df: pd.DataFrame) -> dict[str, list[Any]]:
    box.markdown("**Filters** (empty = all)")
    options = fd.filter_options(df)
    out: dict[str, list[Any]] = {}
    for col in fd.FILTER_COLUMNS:
        opts = options.get(col, [])
        if not opts:
            continue
        fmt = (lambda v: "causal" if v else "full") if col == "causal" else str
        out[col] = box.multiselect(_FILTER_LABELS[col], opts, default=[], format_func=fmt,
                                   key=f"filter_{col}", placeholder="all")
    return out


APP_DIR = Path(__file__).resolve().parent

#: (file under pages/, title, icon), in menu order; the first is the default page.
PAGE_FILES = (
    ("overview.py", "Overview", ":material/dashboard:"),
    ("variants.py", "Variants", ":material/speed:"),
    ("gpus.py", "GPUs", ":material/memory:"),
    ("ncu.py", "Nsight Compute", ":material/analytics:"),
    ("timeline.py", "Timeline", ":material/view_timeline:"),
    ("diff.py", "Diff", ":material/compare_arrows:"),
    ("wrong.py", "Wrong results", ":material/error:"),
    ("leaderboard.py", "Leaderboard", ":material/leaderboard:"),
)

_REROUTED = "_faprof_rerouted"


def pages() -> list:
    """The st.Page list the entry file gives st.navigation."""
    return [st.Page(str(APP_DIR / "pages" / f), title=t, icon=i, default=(k == 0))
            for k, (f, t, i) in enumerate(PAGE_FILES)]


def context() -> Context:
    """The Context the entry file made in this script run (each page takes it once).

    When Streamlit ran the page file without the entry file, there is none. That happens when the
    first session after the server starts opens /<page> directly: seeing pages/ beside
    dashboard.py, Streamlit takes the app for an old-style (v1) multipage app and runs the page
    alone (AppTest does the same on every run). Calling st.navigation switches Streamlit to this
    app's navigation, and the rerun goes through dashboard.py to the same page (same url path).
    If the entry file still did not run (a page started on its own), the page sets itself up.
    """
    ctx = st.session_state.pop(CTX_KEY, None)
    if ctx is not None:
        return ctx
    if not st.session_state.get(_REROUTED):
        st.session_state[_REROUTED] = True
        st.navigation(pages())
        st.rerun()
    ctx = setup()
    st.session_state.pop(CTX_KEY, None)  # made for this run only
    st.session_state[_REROUTED] = True  # the entry file is not running this app: do not reroute again
    return ctx


# ------------------------------------------------------------------------------------ tables
_FORMATS = {
    "ms": "%.4g", "tflops": "%.4g", "pct": "%.3g", "speedup": "%.3gx", "err": "%.2e", "bytes": "%d",
}


def _column_config(df: pd.DataFrame, labels: dict[str, str] | None = None) -> dict[str, Any]:
    labels = labels or {}
    cfg: dict[str, Any] = {}
    for c in df.columns:
        if not isinstance(c, str):
            continue
        lc = c.lower()
        text = labels.get(c) or fd.label(c)
        if not pd.api.types.is_numeric_dtype(df[c]) or pd.api.types.is_bool_dtype(df[c]):
            if text != c:
                cfg[c] = st.column_config.Column(text)
            continue
        if lc.endswith("_ms") or "_ms_" in lc:
            fmt = _FORMATS["ms"]
        elif "pct" in lc:
            fmt = _FORMATS["pct"]
        elif "speedup" in lc or lc in ("ratio", "measured_reduction", "analytic_reduction", "bwd_over_fwd"):
            fmt = "%.3g"
        elif "err" in lc or lc in ("rtol", "atol", "p_value"):
            fmt = _FORMATS["err"]
        elif "bytes" in lc:
            fmt = "localized"
        elif lc in ("n", "rows", "problems") or lc.startswith("n_"):
            fmt = "%d"
        else:
            fmt = "%.4g"
        cfg[c] = st.column_config.NumberColumn(text, format=fmt)
    return cfg


def table(df: pd.DataFrame, name: str, caption: str | None = None, height: int | None = None,
          labels: dict[str, str] | None = None, download: pd.DataFrame | None = None) -> None:
    """A dataframe with readable headers and a 'Download CSV' button.

    Args:
        df: the table to show (array columns are left out of the view, kept in the CSV).
        name: the CSV's file name (and the button's key: unique per page).
        labels: headers for columns LABELS does not know (e.g. variant names as columns).
        download: a fuller table for the CSV than the one shown (default: `df`).
    """
    shown = fd.for_display(df)
    kwargs: dict[str, Any] = {"hide_index": True, "column_config": _column_config(shown, labels), "placeholder": "—"}
    if height:
        kwargs["height"] = height
    st.dataframe(shown, **kwargs)
    cols = st.columns([1, 4])
    cols[0].download_button("Download CSV", fd.csv_bytes(df if download is None else download), file_name=f"{name}.csv", mime="text/csv",
                            key=f"csv_{name}")
    if caption:
        cols[1].caption(caption)


# ------------------------------------------------------------------------------------ charts
LOG_DECADES_ONLY = 2.5
"""A log axis spanning more decades than this is labelled at powers of ten only (the 2 and 5
between them crowd the axis)."""


def _tidy_log_axes(fig) -> None:
    for axis in ("x", "y"):
        layout_axis = getattr(fig.layout, f"{axis}axis")
        if layout_axis.type != "log" or layout_axis.tickvals is not None:
            continue
        values: list[float] = []
        for shape in fig.layout.shapes or ():  # reference lines (add_hline) widen the axis too
            for key in (f"{axis}0", f"{axis}1"):
                v = getattr(shape, key, None)
                if getattr(shape, f"{axis}ref", None) == axis and isinstance(v, int | float) and v > 0:
                    values.append(float(v))
        for tr in fig.data:
            vals = getattr(tr, axis, None)
            if vals is None:
                continue
            base = getattr(tr, "base", None) if axis == "x" else None
            if base is not None:
                continue
            values += [float(v) for v in vals if isinstance(v, int | float) and v > 0 and math.isfinite(v)]
        if not values:
            continue
        lo, hi = min(values), max(values)
        if lo < SMALLEST_PLAIN_TICK:
            layout_axis.update(exponentformat="power")  # 10⁻⁴, not plotly's SI '100µ'
        if math.log10(hi / lo) > LOG_DECADES_ONLY:
            layout_axis.update(dtick=1)  # powers of ten only
            continue
        # Narrow: 1, 2, 5 in each decade, written out (plotly would label them '2', '5' without the decade).
        ticks = log_ticks(lo, hi)
        if len(ticks) >= 2:
            layout_axis.update(tickvals=ticks, ticktext=[f"{v:g}" for v in ticks])


#: Log-axis ticks: 1, 2, 5 x 10^k, or on a narrow range evenly spaced round values; at least
#: MIN_LOG_TICKS (a ratio axis from 0.96 to 1.02 needs 0.96, 0.98, 1, 1.02, not a lone 1), at most MAX_LOG_TICKS.
MIN_LOG_TICKS = 3
MAX_LOG_TICKS = 7
NARROW_LOG_DECADES = 0.5
"""Below this span (a factor of ~3), log-axis ticks are evenly spaced round values (0.9, 0.95, 1, 1.05)."""


def log_ticks(lo: float, hi: float) -> list[float]:
    """Tick values m x 10^k covering [lo, hi] (a little beyond) for a log axis, with m from the
    coarsest mantissa set that gives at least MIN_LOG_TICKS ticks inside the range."""
    if math.log10(hi / lo) > LOG_DECADES_ONLY:
        return [10.0**k for k in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)]
    ticks: list[float] = []
    if math.log10(hi / lo) > NARROW_LOG_DECADES:
        ticks = [m * 10.0**k for k in range(math.floor(math.log10(lo)) - 1, math.ceil(math.log10(hi)) + 1)
                 for m in (1, 2, 5) if lo / 1.5 <= m * 10.0**k <= hi * 1.5]
        if len(ticks) >= MIN_LOG_TICKS:
            return ticks
    # A narrow range (a ratio axis from 0.96 to 1.02): evenly spaced round values, 1 among them,
    # the coarsest step that gives MIN_LOG_TICKS, then every other one while there are too many.
    for step in (10.0**e * m for e in range(1, -5, -1) for m in (5, 2, 1)):
        ticks = [round(i * step, 10) for i in range(math.ceil(lo / 1.01 / step), math.floor(hi * 1.01 / step) + 1) if i > 0]
        if len(ticks) >= MIN_LOG_TICKS:
            break
    while len(ticks) > MAX_LOG_TICKS:
        keep = min(range(len(ticks)), key=lambda i: abs(ticks[i] - 1.0)) % 2
        ticks = ticks[keep::2]
    return ticks


SMALLEST_PLAIN_TICK = 2e-4
"""Data below this reaches the 1e-4 tick, which plotly writes as '100µ': such a log axis writes powers of ten."""

LEGEND_ROW_PX = 19
"""Height of one row of a horizontal legend (11 px font)."""

HALF_WIDTH_PX = 440
"""Width a horizontal legend gets in a half-page chart (wide layout, sidebar open, 1440 px window)."""


def _legend_rows(fig, legend_title: str | None) -> int:
    """How many rows a horizontal legend takes: items packed left to right, ~6.2 px a character."""
    names = [str(tr.name) for tr in fig.data if tr.showlegend is not False and tr.name]
    x, rows = (len(legend_title) * 6.5 + 10) if legend_title else 0.0, 1
    for n in dict.fromkeys(names):
        w = 42 + 6.2 * len(n)
        if x + w > HALF_WIDTH_PX and x > 0:
            rows, x = rows + 1, 0.0
        x += w
    return rows


def legend_height(fig) -> int:
    """Pixels a vertical legend needs for every entry (a chart shorter than this cuts entries off)."""
    n = sum(1 for tr in fig.data if tr.showlegend is not False and tr.name)
    # the legend may use the plot area only: title and margins (~70 px), the x axis (~60 px), then a row per entry
    return 140 + (LEGEND_ROW_PX + 2) * n


def style(fig, title: str | None = None, height: int = 420, legend_title: str | None = None,
          legend_below: bool = False):
    """One look for every chart: white background, title, readable margins, log axes labelled at
    powers of ten when they span several decades; the legend on the right, or below the plot for
    half-width charts (where a legend on the right would squeeze the plot)."""
    _tidy_log_axes(fig)
    legend: dict[str, Any] = dict(title=dict(text=legend_title) if legend_title else None, font=dict(size=11))
    legend_h = 0
    if legend_below:  # above the plot, in fact: below it, it would collide with long tick labels
        legend.update(orientation="h", yanchor="bottom", y=1.0, xanchor="left", x=0)
        legend_h = _legend_rows(fig, legend_title) * LEGEND_ROW_PX + 8
    fig.update_layout(
        title=dict(text=title, x=0, xanchor="left", y=0.99, yanchor="top", yref="container", font=dict(size=15))
        if title else None,
        height=height + legend_h, template="plotly_white",
        margin=dict(l=10, r=10, t=(46 if title else 16) + legend_h, b=10),
        legend=legend, hoverlabel=dict(namelength=-1),
    )
    return fig


def hline(fig, y: float, text: str, color: str = "#555", dash: str = "dot", log: bool = True,
          position: str = "left") -> None:
    """A horizontal reference line with its label on the line (plotly's add_hline misplaces the
    label on log axes, where annotations take log10 of the value)."""
    fig.add_hline(y=y, line_dash=dash, line_color=color, line_width=1.2)
    fig.add_annotation(x=0.01 if position == "left" else 0.99, xref="paper", y=math.log10(y) if log else y, yref="y",
                       text=text, showarrow=False, xanchor=position, yanchor="bottom",
                       font=dict(size=11, color=color), bgcolor="rgba(255,255,255,0.7)")


def wrap_label(text: str, width: int = 16) -> str:
    """A tick label broken onto two lines (at a space near the middle) when longer than `width`."""
    if len(text) <= width or " " not in text:
        return text
    mid = len(text) // 2
    spaces = [i for i, ch in enumerate(text) if ch == " "]
    cut = min(spaces, key=lambda i: abs(i - mid))
    return text[:cut] + "<br>" + text[cut + 1:]


HALF_WIDTH_CATEGORIES = 6
"""A half-width chart shows this many category ticks level (two-line labels); more are angled."""


def tick_labels(short: dict[str, str], count: int | None = None) -> dict[str, str]:
    """Category tick labels: wrapped onto two short lines while few enough to stand level, else one
    line (angled by category_ticks)."""
    n = len(short) if count is None else count
    return {k: wrap_label(v, width=8) for k, v in short.items()} if n <= HALF_WIDTH_CATEGORIES else dict(short)


def category_ticks(fig, n: int, half_width: bool = True) -> bool:
    """Level ticks when they fit, angled ones up to twice that, vertical ones beyond (a label then
    needs only its line height across the axis: l20_fwd_bwd's 29 shapes); automargin makes room
    for them either way. Returns whether they are vertical: the labels then take a few hundred
    pixels of the chart's height, so a legend beside the plot should go above it (`style`'s
    legend_below)."""
    level = HALF_WIDTH_CATEGORIES if half_width else 2 * HALF_WIDTH_CATEGORIES
    vertical = n > 2 * level
    fig.update_xaxes(tickangle=0 if n <= level else -90 if vertical else -40, automargin=True)
    return vertical


def show(fig, key: str) -> None:
    """Draw a plotly figure across the page width."""
    st.plotly_chart(fig, key=key, config=PLOT_CONFIG, theme=None)


def no_data(message: str, command: str | None = None) -> None:
    """Say that a page's data is absent, and what to run to produce it."""
    st.info(message + (f"\n\nRun `{command}` to collect it." if command else ""), icon=":material/info:")
