"""The report's charts: plotly figures per block of comparable rows, as HTML divs or PNG bytes.

A block is one (group, dtype, direction) of a run: the rows that a ranking compares. Each block gets
one figure chosen for the question: every variant's speed relative to the block's baseline per shape
(or, without a timed baseline, its median time per shape). Each variant has one colour in every chart
of the report (`faprof.analysis.variant_colors`). Layouts leave room for their labels (automargin,
angled ticks when there are many) and a legend beside the plot, so nothing is cut at the report's width.

plotly is optional for the report: without it the report says so and has no charts. PNGs of these
figures (for the Markdown report) are `faprof.report.png`'s.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Any

import pandas as pd

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
                     dtick=1 if log_y else None, exponentformat="power")  # 10⁻⁴, not plotly's SI '100µ'


def speed_chart(name: str, title: str, rows: pd.DataFrame, order: list[str], short: dict[str, str],
                colors: dict[str, str], reference: str, highlight: str | None = None) -> Chart:
    """Each variant's speed relative to the reference per shape (log y, 1 = the reference), one line per
    variant in its session colour; `highlight` (a focus report's variant) is drawn thick, the rest thin.

    Args:
        rows: one row per (variant, shape) with `_shape` (the shape's label) and `_rel` (the ratio).
        order: the shapes' labels by FLOPs; short: label -> tick label.
        reference: what 1 is, in words ("sdpa_flash's speed").
    """
    import plotly.graph_objects as go

    fig = go.Figure()
    for v, g in rows.groupby("variant", sort=False):
        g = g.set_index("_shape").reindex(order).dropna(subset=["_rel"])
        wide = highlight is None or v == highlight
        fig.add_trace(go.Scatter(x=[short[x] for x in g.index], y=g["_rel"], mode="lines+markers", name=str(v),
                                 line={"color": colors.get(str(v)), "width": 3 if v == highlight else 2 if wide else 1},
                                 opacity=1.0 if wide else 0.45, marker={"size": 8 if wide else 5},
                                 hovertemplate=f"{v}<br>%{{x}}<br>%{{y:.3g}}x<extra></extra>"))
    fig.add_hline(y=1, line_dash="dot", line_color="#777")
    fig.update_xaxes(categoryorder="array", categoryarray=[short[x] for x in order])
    _layout(fig, title, len(order), f"speed relative to {reference} (log; 1 = same)", log_y=True)
    return Chart(name, title, fig)


def html_divs(charts: list[Chart]) -> tuple[str, dict[str, str]]:
    """plotly.js (once, inline: the page works offline) and one div per chart, by name."""
    import plotly.io as pio
    from plotly.offline import get_plotlyjs

    script = f"<script type=\"text/javascript\">{get_plotlyjs()}</script>"
    divs = {c.name: pio.to_html(c.figure, full_html=False, include_plotlyjs=False, div_id=f"chart-{c.name}",
                                config={"displaylogo": False, "responsive": True}) for c in charts}
    return script, divs
