"""The report's charts: plotly figures per block of comparable rows, as HTML divs or PNG bytes.

A block is one (group, dtype, direction) of a run: the rows that a ranking compares. Each block
gets two figures: the speed of every variant relative to the block's baseline (geometric mean
over the block's shapes, the headline ranking drawn), and the median time per shape on a log
axis. Layouts leave room for their labels (automargin, angled ticks when there are many) and
put the legend below the plot, so nothing is cut at the report's width.

plotly is optional for the report: without it the report says so and has no charts. PNGs (for
the Markdown report) need kaleido and a Chrome/Chromium it can start; without them the Markdown
links to the HTML report instead (`png_images` returns None and a reason).
"""

from __future__ import annotations

import contextlib
import importlib.util
import warnings
from dataclasses import dataclass
from typing import Any

import pandas as pd

from faprof.report import fmt as f

#: Pixel size of a chart in the Markdown report's PNGs and the HTML report's divs.
CHART_WIDTH, CHART_HEIGHT = 960, 440

#: Above this many x categories the tick labels are angled.
ANGLE_TICKS_ABOVE = 4


@dataclass
class Chart:
    """One figure of the report: a file-safe name, a title, and the plotly figure."""

    name: str
    title: str
    figure: Any


def plotly_available() -> bool:
    return importlib.util.find_spec("plotly") is not None


#: Title placement: left-aligned, inside the figure's padding.
TITLE = {"x": 0.01, "xref": "container", "xanchor": "left"}


def _layout(fig: Any, title: str, n_categories: int, y_title: str, log_y: bool = False) -> None:
    """Legend to the right of the plot (plotly reserves its width), ticks angled when there are many."""
    fig.update_layout(
        title={"text": title, **TITLE}, width=CHART_WIDTH, height=CHART_HEIGHT, template="plotly_white",
        margin={"l": 70, "r": 20, "t": 60, "b": 40}, legend={"title": {"text": "variant"}}, font={"size": 12},
    )
    fig.update_xaxes(automargin=True, tickangle=-30 if n_categories > ANGLE_TICKS_ABOVE else 0)
    fig.update_yaxes(automargin=True, title_text=y_title, type="log" if log_y else "linear",
                     dtick=1 if log_y else None)


def ranking_chart(name: str, title: str, ranking: pd.DataFrame, baseline: str | None) -> Chart:
    """Horizontal bars: each variant's speed relative to the baseline (geometric mean)."""
    import plotly.graph_objects as go


    r = ranking.sort_values("score")
    colors = ["#777" if v == baseline else ("#1b9e77" if s >= 1 else "#d95f02") for v, s in zip(r["variant"], r["score"], strict=True)]
    # Dots, not bars: on a log axis a bar's length depends on where the axis starts and means nothing.
    fig = go.Figure(go.Scatter(x=r["score"], y=r["variant"], mode="markers+text", marker={"color": colors, "size": 11},
                               text=[f.ratio(s) for s in r["score"]], textposition="middle right", cliponaxis=False,
                               hovertemplate="%{y}: %{x:.3g}x<extra></extra>"))
    ref = f"{baseline}'s speed" if baseline else "the fastest variant's speed per shape"
    lo, hi = float(r["score"].min()), float(r["score"].max())
    import math

    fig.update_layout(title={"text": title, **TITLE}, width=CHART_WIDTH, height=max(260, 90 + 28 * len(r)),
                      template="plotly_white", margin={"l": 70, "r": 40, "t": 60, "b": 50}, showlegend=False,
                      font={"size": 12})
    fig.update_xaxes(type="log", automargin=True, dtick=1, title_text=f"speed relative to {ref} (log scale; 1 = same)",
                     range=[math.log10(min(lo, 1)) - 0.15, math.log10(max(hi, 1)) + 0.35])
    fig.update_yaxes(automargin=True)
    fig.add_vline(x=1, line_dash="dot", line_color="#999", layer="below")
    return Chart(name, title, fig)


def time_chart(name: str, title: str, rows: pd.DataFrame, order: list[str], short: dict[str, str]) -> Chart:
    """Median time per shape (log y), one line per variant, shapes ordered by FLOPs."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for v, g in rows.groupby("variant", sort=False):
        g = g.set_index("_shape").reindex(order).dropna(subset=["median_ms"])
        fig.add_trace(go.Scatter(x=[short[s] for s in g.index], y=g["median_ms"], mode="lines+markers", name=str(v),
                                 hovertemplate=f"{v}<br>%{{x}}<br>%{{y:.4g}} ms<extra></extra>"))
    fig.update_xaxes(categoryorder="array", categoryarray=[short[s] for s in order])
    _layout(fig, title, len(order), "median time, ms (log scale)", log_y=True)
    return Chart(name, title, fig)


def html_divs(charts: list[Chart]) -> tuple[str, dict[str, str]]:
    """plotly.js (once, inline: the page works offline) and one div per chart, by name."""
    import plotly.io as pio
    from plotly.offline import get_plotlyjs

    script = f"<script type=\"text/javascript\">{get_plotlyjs()}</script>"
    divs = {c.name: pio.to_html(c.figure, full_html=False, include_plotlyjs=False, div_id=f"chart-{c.name}",
                                config={"displaylogo": False, "responsive": True}) for c in charts}
    return script, divs


def png_images(charts: list[Chart]) -> tuple[dict[str, bytes] | None, str]:
    """PNG bytes per chart name through kaleido, or (None, why not)."""
    if not charts:
        return {}, ""
    if importlib.util.find_spec("kaleido") is None:
        return None, "PNG charts need kaleido (pip install 'faprof[report]'); the HTML report has the charts"
    import kaleido
    import plotly.io as pio

    out: dict[str, bytes] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # No browser, or one already started: to_image then starts its own (and says what is missing).
        with contextlib.suppress(Exception):
            kaleido.start_sync_server(silence_warnings=True)
        try:
            for c in charts:
                out[c.name] = pio.to_image(c.figure, format="png", width=c.figure.layout.width or CHART_WIDTH,
                                           height=c.figure.layout.height or CHART_HEIGHT, scale=1)
        except Exception as e:  # noqa: BLE001 - kaleido reports a missing Chrome in several ways
            first = " ".join(str(e).split())[:160]
            return None, (f"PNG charts could not be rendered ({type(e).__name__}: {first}); "
                          "the HTML report has the charts")
        finally:
            with contextlib.suppress(Exception):
                kaleido.stop_sync_server(silence_warnings=True)
    return out, ""
