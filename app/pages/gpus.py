"""GPUs: one scenario across GPUs, raw and as % of each GPU's peak, beside the seed report's published figures."""

from __future__ import annotations

import faprof_ui as ui
import plotly.graph_objects as go
import streamlit as st

from faprof import analysis as fd

ctx = ui.context()
df = ctx.measurements

st.title("GPUs")
if df.empty:
    ui.no_data("No measurements pass the filters (or none are loaded).", "faprof profile --scenario l4_causal")
    st.stop()

published_all = fd.published_figures(ctx.runs)
scenarios = sorted(df["scenario"].unique())
# A CPU-only run is a machine, not a GPU: it is drawn (as "CPU (no GPU)") but never counted as a GPU.
machines = {s: df.loc[df["scenario"] == s, "gpu"].unique() for s in scenarios}
gpus_per = {s: fd.machine_count(machines[s])[0] for s in scenarios}
has_pub = {s: int((published_all["scenario"] == s).sum()) if not published_all.empty else 0 for s in scenarios}
default = max(scenarios, key=lambda s: (gpus_per[s], len(machines[s]), has_pub[s]))
top = st.columns([3, 1, 3])
scenario = top[0].selectbox("Scenario", scenarios, index=scenarios.index(default), key="gpus_scenario",
                            format_func=lambda s: f"{s} ({fd.machines_phrase(machines[s])}"
                                                  f"{', published figures' if has_pub[s] else ''})")
meas = fd.gpu_comparison(df, scenario)
dtypes = sorted(meas["dtype"].dropna().unique()) if not meas.empty else []
dtype = None
if len(dtypes) > 1:  # one dtype at a time: fp16 and fp32 rows of one shape are different problems
    counts = meas["dtype"].value_counts()
    dtype = top[1].selectbox("dtype", dtypes, index=dtypes.index(max(dtypes, key=lambda d: (int(counts[d]), d == "fp16"))),
                             key="gpus_dtype")
    meas = meas[meas["dtype"] == dtype]
elif dtypes:
    top[1].selectbox("dtype", dtypes, key="gpus_dtype", disabled=True)
pub = published_all[published_all["scenario"] == scenario] if not published_all.empty else published_all
pub_plot = pub[pub["problem"].notna()] if not pub.empty else pub
if dtype is not None and not pub_plot.empty:
    pub_plot = pub_plot[pub_plot["problem"].str.contains(rf"\b{dtype}\b", regex=True)]

variants = sorted(meas["variant"].unique()) if not meas.empty else []
n_machines = meas["gpu"].nunique() if not meas.empty else 0
n_gpus = fd.machine_count(meas["gpu"])[0] if not meas.empty else 0
on_all = set(meas.groupby("variant")["gpu"].nunique().loc[lambda s: s == n_machines].index) if n_machines > 1 else set()
wanted = (set(meas["baseline"].astype(str)) if "baseline" in meas else set()) | \
    {str(v) for v in pub.get("maps_to", []) if v} | on_all
default_v = [v for v in variants if v in wanted] or variants[:4]
chosen = top[2].multiselect("Variants", variants, default=default_v, key="gpus_variants",
                            help="Preselected: the scenario's baseline, the variants its report's figures map to, and the "
                                 "variants measured on every GPU.")
meas = meas[meas["variant"].isin(chosen)] if chosen else meas
gpus = sorted(meas["gpu"].unique()) if not meas.empty else []

if n_gpus < 2:
    st.info(f"Scenario `{scenario}` was measured on {fd.machines_phrase(meas['gpu'] if not meas.empty else [])} in "
            f"these runs. Run `faprof profile --scenario {scenario}` on another GPU and load both bundles to compare "
            "them; the report's published figures are shown beside what is loaded.", icon=":material/info:")
st.caption("**measured (faprof, GPU)**: filled markers, one colour per variant, one marker shape and line style "
           "per GPU. **published (report NNN, GPU)**: figures quoted from the seed report the scenario reproduces, drawn "
           "as black/grey open stars on dotted lines: the report's numbers, not measurements. The legend groups "
           "the lines by source. A GPU that ran the scenario several times shows its newest run.")

order = fd.problem_order(df[(df["scenario"] == scenario) & ((df["dtype"] == dtype) if dtype else True)])
for p in pub_plot.get("problem", []):
    if p not in order:
        order.append(p)
short, shared = fd.short_labels(order)
short = ui.tick_labels(short, count=len(order) // 2)  # a full-width chart fits twice as many level ticks
x_title = f"problem ({shared})" if shared else "problem"
colors = ctx.colors  # one colour per variant in every chart of the session
symbols = ["circle", "square", "diamond", "triangle-up", "triangle-down", "pentagon"]
gpu_symbol = {g: symbols[i % len(symbols)] for i, g in enumerate(gpus)}
gpu_dash = {g: ("solid", "dash", "longdash", "dashdot")[i % 4] for i, g in enumerate(gpus)}
pub_styles = [("star-open", "#000000"), ("star-triangle-up-open", "#555555"), ("hexagram-open", "#333333"),
              ("cross-open", "#777777")]


def comparison(y: str, pub_col: str | None, title: str, key: str) -> bool:
    """Measured lines per (GPU, variant) and published points per (report, subject) on one chart.

    The legend groups traces by source: 'measured (faprof, GPU)' and 'published (report NNN, GPU)'.
    """
    fig = go.Figure()
    rank = {p: i for i, p in enumerate(order)}
    m = meas[meas[y].notna() & (meas[y] > 0)] if y in meas else meas.iloc[0:0]
    m = m.assign(_line=fd.line_series(m, "problem"))  # directions (and dtypes) never share a line
    for (gpu, variant, line), g in m.groupby(["gpu", "variant", "_line"], sort=True):
        g = g.assign(_o=g["problem"].map(rank)).sort_values("_o")
        source = fd.measured_label(gpu)
        fig.add_trace(go.Scatter(
            x=g["problem"].map(short), y=g[y], mode="lines+markers", name=f"{variant} ({line})" if line else variant,
            legendgroup=source, legendgrouptitle_text=source,
            line=dict(color=colors.get(variant), width=2, dash=gpu_dash[gpu]),
            marker=dict(symbol=gpu_symbol[gpu], size=9, color=colors.get(variant)),
            customdata=g[["status", "median_ms", "problem"]].to_numpy(),
            hovertemplate="%{customdata[2]}<br>" + fd.label(y) + ": %{y:.4g}<br>status %{customdata[0]}, "
                          f"median %{{customdata[1]:.4g}} ms<extra>{variant}<br>{source}</extra>"))
    if pub_col is not None and not pub_plot.empty:
        p = pub_plot[pub_plot[pub_col].notna()]
        for i, ((source, subject), g) in enumerate(p.groupby(["source", "subject"], sort=True)):
            sym, col = pub_styles[i % len(pub_styles)]
            g = g.assign(_o=g["problem"].map(rank)).sort_values("_o")
            fig.add_trace(go.Scatter(
                x=g["problem"].map(short), y=g[pub_col], mode="lines+markers", name=subject,
                legendgroup=source, legendgrouptitle_text=source,
                line=dict(color=col, dash="dot", width=1.5), marker=dict(symbol=sym, size=13, color=col, line=dict(width=2)),
                customdata=g[["stat", "section", "problem"]].fillna("").to_numpy(),
                hovertemplate="%{customdata[2]}<br>" + fd.label(y) + ": %{y:.4g} %{customdata[0]}<br>%{customdata[1]}"
                              f"<extra>{subject}<br>{source}</extra>"))
    if not fig.data:
        return False
    fig.update_yaxes(type="log", title=fd.label(y))
    fig.update_xaxes(type="category", categoryorder="array", categoryarray=[short[o] for o in order], title=x_title)
    ui.category_ticks(fig, len(order), half_width=False)
    fig.update_layout(legend=dict(groupclick="toggleitem", tracegroupgap=12))
    # tall enough for every legend entry: one row per trace plus a title row and the gap per group
    # (two measured GPUs double the traces)
    groups = {tr.legendgroup for tr in fig.data if tr.legendgroup}
    height = max(480, ui.legend_height(fig) + len(groups) * (ui.LEGEND_ROW_PX + 2 + 12))
    ui.show(ui.style(fig, title=title, height=height), key=key)
    return True


st.subheader("Normalized: % of each GPU's peak")
if not comparison("pct_peak", "pct_peak", "% of peak (each GPU's own dense peak; log scale)", "gpus_pct_peak"):
    st.caption("No % of peak: the runs of this scenario ran on the CPU, or their GPUs are not in faprof's database.")
else:
    st.caption("Published points: faprof's FLOP count over the report's published latency, as % of the report GPU's "
               "peak in faprof's database (`faprof list gpus`), so they compare with measured points in one convention.")

st.subheader("Raw")
if not comparison("median_ms", "ms", "Latency (ms, log scale; lower is better)", "gpus_latency"):
    st.caption("No timed rows.")
if not comparison("tflops", "tflops", "Throughput (TFLOP/s, log scale; FlashAttention's FLOP count)", "gpus_tflops"):
    st.caption("No timed rows.")

st.subheader("Measured, side by side")
if meas.empty:
    st.caption("No timed rows for this scenario.")
else:
    values = ["median_ms", "tflops", "pct_peak"] + (["pct_measured_ceiling"] if "pct_measured_ceiling" in meas else [])
    wide = meas.pivot_table(index=["variant", "problem"], columns="gpu", values=values, aggfunc="median")
    wide.columns = [f"{fd.label(v)} · {g}" for v, g in wide.columns]
    wide = wide.reset_index()
    wide = wide.assign(_o=wide["problem"].map({p: i for i, p in enumerate(order)})).sort_values(["variant", "_o"]).drop(columns="_o")
    ui.table(wide, f"gpus_measured_{scenario}", caption="Medians per GPU (several runs on one GPU: the newest); % of peak "
             "against each GPU's own peak, % of measured ceiling against the matmul rate each run measured on its GPU. "
             "A bundle of several GPU models (`--gpus`) counts as one GPU per model.")

st.subheader("Published figures")
if pub.empty:
    st.caption(f"Scenario `{scenario}` quotes no published figures (its file has no [[published]] entries).")
else:
    cols = ["source", "subject", "what", "value", "unit", "stat", "problem", "maps_to", "section", "note", "ms",
            "tflops", "pct_peak"]
    ui.table(pub[cols], f"gpus_published_{scenario}",
             caption="Quoted from the report as published (value, unit, statistic); `ms`, `tflops` and `pct_peak` are "
                     "faprof's conversions of published latencies (FlashAttention FLOP count; causal halved). A "
                     "published throughput keeps the report's own FLOP count (see its note).")
