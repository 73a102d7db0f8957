"""Diff: two runs compared row by row (variant + problem), with a ratio and a Mann-Whitney U test."""

from __future__ import annotations

import math

import faprof_ui as ui
import plotly.graph_objects as go
import streamlit as st

from faprof import analysis as fd

ctx = ui.context()
df = ctx.measurements

st.title("Diff")
runs = ctx.runs.runs
if not df.empty:
    runs = runs[runs["run_id"].isin(df["run_id"].unique())]
if len(runs) < 2:
    ui.no_data("The Diff page compares two runs; fewer than two pass the filters.",
               f"faprof profile --scenario {ctx.scenario_hint() or 'smoke'}")
    st.stop()

titles = {r: fd.run_title(ctx.runs.manifests[r]) for r in runs["run_id"]}
ids = list(titles)
# Default pair: the two newest runs of the scenario measured most often (older one as A).
counts = runs["scenario"].value_counts()
same = runs[runs["scenario"] == counts.index[0]]["run_id"].tolist() if counts.iloc[0] >= 2 else ids[:2]
c = st.columns(2)
a_id = c[0].selectbox("Run A (reference)", ids, index=ids.index(same[1]), format_func=lambda r: titles[r], key="diff_a")
b_id = c[1].selectbox("Run B", ids, index=ids.index(same[0]), format_func=lambda r: titles[r], key="diff_b")
if a_id == b_id:
    st.warning("Pick two different runs.")
    st.stop()

d = fd.diff_runs(df[df["run_id"] == a_id], df[df["run_id"] == b_id])
both = d[d["ratio"].notna()] if not d.empty else d
if both.empty:
    ui.no_data("These two runs share no timed (variant, problem) pair: pick runs of the same scenario.")
    st.stop()

n_sig = int(both["significant"].sum())
c = st.columns(4)
c[0].metric("pairs compared", len(both))
c[1].metric("B faster (significant)", int((both["verdict"] == "B faster").sum()))
c[2].metric("B slower (significant)", int((both["verdict"] == "B slower").sum()))
n_unstable = int(both["verdict"].str.startswith(fd.UNSTABLE_VERDICT).sum())
c[3].metric("not tested (unstable timings)", n_unstable,
            help="Bimodal, drifting, or CPU rows past their stop rule in A or B: the test's assumption does not hold")

plot = both.assign(verdict_=[fd.UNSTABLE_VERDICT if v.startswith(fd.UNSTABLE_VERDICT) else
                             v if sig or v.startswith("too few") else "not significant"
                             for v, sig in zip(both["verdict"], both["significant"], strict=True)])
plot["label"] = plot["variant"] + " · " + plot["problem"]
plot = plot.sort_values("ratio")
colors = {"B faster": "#2e7d32", "B slower": "#d32f2f", "not significant": "#9e9e9e", "too few samples to test": "#c8b9b4",
          fd.UNSTABLE_VERDICT: "#f9a825"}
fig = go.Figure()
for verdict, g in plot.groupby("verdict_", sort=False):
    # Bars grow from 1 (no change) to the ratio, left when B is faster, right when slower.
    fig.add_trace(go.Bar(
        y=g["label"], x=g["ratio"] - 1.0, base=1.0, orientation="h", name=verdict,
        marker_color=colors.get(verdict, "#9e9e9e"),
        customdata=g[["ratio", "p_value", "median_ms_a", "median_ms_b"]].to_numpy(),
        hovertemplate="%{y}<br>B / A = %{customdata[0]:.3g}<br>p = %{customdata[1]:.2g}<br>"
                      "A %{customdata[2]:.4g} ms, B %{customdata[3]:.4g} ms<extra>%{fullData.name}</extra>"))
lo, hi = min(plot["ratio"].min(), 1.0), max(plot["ratio"].max(), 1.0)
ticks = ui.log_ticks(lo, hi)
pad = max(0.12 * math.log10(hi / lo), 0.004)  # decades: a narrow range (0.96 to 1.02) fills the axis
fig.update_xaxes(type="log", title="median B / median A (log; below 1: B is faster)",
                 tickvals=ticks, ticktext=[f"{v:g}" for v in ticks],
                 range=[math.log10(lo) - pad, math.log10(hi) + pad])
fig.update_layout(showlegend=True)
fig.update_yaxes(automargin=True, categoryorder="array", categoryarray=list(plot["label"]))
fig.add_vline(x=1.0, line_dash="dot", line_color="#555")
ui.show(ui.style(fig, title="Latency ratio per (variant, problem)", height=max(300, 90 + 24 * len(plot)),
                 legend_title="verdict at 5%"), key="diff_ratio")

st.subheader("Row by row")
ui.table(d, f"diff_{a_id}_vs_{b_id}",
         caption="`ratio` = B's median / A's (above 1: B is slower). `p_value`: two-sided Mann-Whitney U test on the "
                 "kept samples (normal approximation with tie and continuity corrections, numpy only; no p-value "
                 f"with fewer than {fd.MIN_SAMPLES_FOR_TEST} samples a side). `significant`: p < "
                 f"{fd.SIGNIFICANCE_LEVEL:g}. With thousands of samples tiny changes are significant: read the ratio too.")
if n_sig == 0:
    st.caption("No change is significant at 5%.")
