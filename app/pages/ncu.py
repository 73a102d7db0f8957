"""Nsight Compute: occupancy and its limiter, stall reasons, memory and compute throughput, roofline."""

from __future__ import annotations

import faprof_ui as ui
import numpy as np
import plotly.express as px
import plotly.graph_objects as go
import streamlit as st

from faprof import analysis as fd
from faprof.advisor import views as advisor_views

ctx = ui.context()
summary = ctx.filter_table(ctx.runs.table("ncu_summary"))
stalls = ctx.filter_table(ctx.runs.table("stalls"))
roof_t = ctx.filter_table(ctx.runs.table("roofline"))
metrics = ctx.filter_table(ctx.runs.table("ncu_metrics"))

st.title("Nsight Compute")
if summary.empty and stalls.empty and roof_t.empty and metrics.empty:
    ui.no_data("No Nsight Compute data in these runs.", fd.nsight_hint(ctx.scenario_hint(), "ncu"))
    st.stop()

present = ctx.run_order(set().union(*[set(t["run_id"]) for t in (summary, stalls, roof_t, metrics) if not t.empty]))
titles = {r: fd.run_title(ctx.runs.manifests.get(r, {"run_id": r})) for r in present}
run_id = st.selectbox("Run", present, format_func=lambda r: titles[r], key="ncu_run")


def of_run(t):
    return t[t["run_id"] == run_id] if not t.empty else t


st.subheader("Why: the advisor's ranked diagnosis")
summ_d, diag = advisor_views.diagnosis(ctx.runs, run_id)
if summ_d.empty:
    st.caption("No finding for this run (the advisor needs the run's folder; `faprof explain RUN` prints the same).")
else:
    st.caption("One row per (variant, cause), causes that are primary on most shapes first; the share is of the "
               "slowdown to the comparator (causes of a gap: never above 100%) or of the call's time. The same ranking "
               "as `faprof explain` and the report's Why section.")
    cols = [c for c in ("variant", "dtype", "title", "kind", "primary_on", "n_shapes", "max_gain_pct", "evidence",
                        "source", "fix") if c in summ_d.columns]
    st.dataframe(summ_d[cols]
                 .rename(columns={"title": "cause", "primary_on": "primary on (shapes)", "n_shapes": "seen on (shapes)",
                                  "max_gain_pct": "share, max (%)", "source": "where"}),
                 hide_index=True, use_container_width=True,
                 column_config={"share, max (%)": st.column_config.NumberColumn(format="%.0f")})

raw = {"ncu_summary": of_run(summary), "stalls": of_run(stalls), "roofline": of_run(roof_t), "ncu_metrics": of_run(metrics)}
summary, stalls, roof_t = (ctx.label_shapes(raw[n]) for n in ("ncu_summary", "stalls", "roofline"))

ALL = "every problem"
problems = sorted({p for t in (summary, stalls, roof_t) if "shape_id" in t for p in t["shape_id"].dropna().unique()})
c = st.columns([3, 2])
problem = c[0].selectbox("Problem", [ALL, *problems], index=1 if len(problems) == 1 else 0, key="ncu_problem")
kernels = c[1].radio("Kernels", ["longest kernel of each call", "every kernel launch"], horizontal=True,
                     key="ncu_kernels", help="torch_standard launches a GEMM, a softmax and small elementwise "
                                             "kernels; the longest one is where its time goes.")
if kernels.startswith("longest"):
    main = fd.main_launches(summary)
    summary, stalls, roof_t = (fd.only_launches(t, main) for t in (summary, stalls, roof_t))
if problem != ALL:
    # One problem: it need not be repeated in every bar's label.
    summary, stalls, roof_t = (t[t["shape_id"] == problem].drop(columns="shape_id") if "shape_id" in t else t
                               for t in (summary, stalls, roof_t))
st.caption("One bar per kernel launch: `variant · " + ("problem · " if problem == ALL else "") + "kernel`. "
           "Collected with `--ncu` (faprof's set) or `--ncu full` (`basic` has no stall reasons).")
if problem != ALL and not diag.empty:
    d1 = diag[diag["shape_id"] == problem]
    if not d1.empty:
        st.markdown("**Ranked findings for this problem** (rank 1: the primary cause)")
        d1 = d1.assign(gain_us=1e3 * d1["gap_ms"]) if "gap_ms" in d1.columns else d1
        st.dataframe(d1[[c for c in ("variant", "rank", "title", "kind", "parent", "estimated_gain_pct", "gain_us",
                                     "unit", "against", "evidence", "source", "fix") if c in d1.columns]]
                     .rename(columns={"title": "cause", "parent": "symptom of", "estimated_gain_pct": "share (%)",
                                      "gain_us": "est. gain (µs)"}),
                     hide_index=True, use_container_width=True,
                     column_config={"share (%)": st.column_config.NumberColumn(format="%.0f"),
                                    "est. gain (µs)": st.column_config.NumberColumn(format="%.1f")})

st.subheader("Occupancy and its limiter")
occ = fd.occupancy(summary)
if occ.empty:
    st.caption("No occupancy columns in this run's ncu_summary (collect with `--ncu full`).")
else:
    lim = occ.drop_duplicates("key")[["key", "limiter"]]
    occ = occ.assign(text=[f"limited by {lm}" if m == "theoretical" and lm else ""
                           for m, lm in zip(occ["metric"], occ["limiter"], strict=True)])
    fig = px.bar(occ, y="key", x="value", color="metric", barmode="group", orientation="h", text="text",
                 labels={"value": "occupancy (% of the SM's warp slots)", "key": "", "metric": ""},
                 hover_data={"limiter": True, "text": False},
                 color_discrete_map={"achieved": "#1f77b4", "theoretical": "#aec7e8"})
    fig.update_traces(textposition="outside", cliponaxis=False, textfont_size=11)
    fig.update_xaxes(range=[0, 135], tickvals=[0, 25, 50, 75, 100], ticksuffix="%")
    fig.update_yaxes(automargin=True)
    ui.show(ui.style(fig, title="Achieved vs theoretical occupancy, and what limits it",
                     height=max(240, 80 + 46 * len(lim))), key="ncu_occupancy")

st.subheader("Compute and memory throughput")
thr = fd.throughput(summary)
if thr.empty:
    st.caption("No throughput columns in this run's ncu_summary.")
else:
    fig = px.bar(thr, y="key", x="value", color="metric", barmode="group", orientation="h",
                 labels={"value": "% of peak throughput", "key": "", "metric": "unit"})
    fig.update_traces(texttemplate="%{x:.1f}%", textposition="outside", cliponaxis=False, textfont_size=10)
    fig.update_xaxes(range=[0, min(105.0, max(10.0, float(thr["value"].max()) * 1.25))], ticksuffix="%")
    fig.update_yaxes(automargin=True)
    ui.show(ui.style(fig, title="Speed of light: SM and memory throughput (% of peak)",
                     height=max(260, 80 + 22 * len(thr))), key="ncu_throughput")

st.subheader("Warp stall reasons")
sources = fd.stall_sources(stalls)
source = None
if len(sources) > 1:
    source = st.radio("Stall source", sources, horizontal=True, key="ncu_stall_source",
                      format_func=lambda x: {"warp_state": "warp state (every instruction)",
                                             "pc_sampling": "PC sampling"}.get(x, x))
sh = fd.stall_shares(stalls, source)
if sh.empty:
    st.caption("No stall reasons in this run (`stalls`: collect with `--ncu full`).")
else:
    fig = px.bar(sh, y="key", x="share_pct", color="reason", orientation="h",
                 labels={"share_pct": "share of stall cycles (%)", "key": "", "reason": "stall reason"},
                 category_orders={"reason": list(sh["reason"].cat.categories)},
                 color_discrete_sequence=px.colors.qualitative.Alphabet)
    fig.update_xaxes(range=[0, 100], ticksuffix="%")
    fig.update_yaxes(automargin=True)
    ui.show(ui.style(fig, title="Where warps wait (stacked to 100% per kernel launch)", legend_title="stall reason",
                     height=max(280, 90 + 40 * sh["key"].nunique(), ui.legend_height(fig))), key="ncu_stalls")

st.subheader("Roofline")
csrc = fd.ceiling_sources(roof_t)
chosen_src = None
if len(csrc) > 1:
    chosen_src = st.radio("Ceilings", csrc, horizontal=True, key="ncu_ceiling_source",
                          format_func=lambda x: {"ncu": "ncu peaks at the measured clock",
                                                 "gpu_db": "datasheet (faprof's GPU database)"}.get(x, x))
rl = fd.roofline(roof_t, chosen_src)
if rl.points.empty:
    st.caption("No roofline table in this run (`roofline`: collect with `--ncu full`).")
else:
    pts = rl.points
    has_prec = pts["precision"].astype(str).str.len().gt(0).any()
    fig = px.scatter(pts, x="intensity", y="tflops", color="variant" if pts["variant"].notna().any() else None,
                     color_discrete_map=ctx.colors,
                     symbol="precision" if has_prec else None, log_x=True, log_y=True,
                     hover_data={"key": True, "bound": True},
                     labels={"intensity": "arithmetic intensity (FLOP per DRAM byte, measured)",
                             "tflops": "achieved TFLOP/s", "precision": "FLOP kind"})
    fig.update_traces(marker=dict(size=11, line=dict(width=1, color="white")))
    xs = np.logspace(np.log10(max(pts["intensity"].min() / 10, 1e-3)), np.log10(pts["intensity"].max() * 100), 200)
    compute, memory = rl.compute, rl.memory
    if not compute or not memory:  # the table carries no ceilings: the GPU database's and the run's own
        db = fd.gpu_ceilings(ctx.runs.manifests.get(run_id, {}), "fp16")
        compute = compute or {k: v for k, v in db.items() if k.endswith("tflops")}
        memory = memory or {k: v for k, v in db.items() if k.endswith("gbs")}
    bw = max(memory.values()) if memory else None
    dashes = ["solid", "dash", "dot", "dashdot"]
    for i, (name, tf) in enumerate(sorted(compute.items(), key=lambda kv: -kv[1])):
        ys = fd.roofline_curve(tf, bw, xs) if bw else np.full_like(xs, tf)
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", name=f"{name}: {tf:.4g} TFLOP/s",
                                 line=dict(color="#444", dash=dashes[i % len(dashes)], width=1.2)))
    if bw:
        st.caption(f"Memory ceiling: {', '.join(f'{k} {v:.4g} GB/s' for k, v in memory.items())}; "
                   f"ceilings from {rl.source or 'the table'}.")
    top = max([*compute.values(), float(pts["tflops"].max())]) * 3
    fig.update_yaxes(range=[np.log10(max(float(pts["tflops"].min()) / 10, 1e-6)), np.log10(top)])
    ui.show(ui.style(fig, title="Achieved TFLOP/s against arithmetic intensity, under the roofs", height=520,
                     legend_title="variant / ceiling"), key="ncu_roofline")

st.subheader("Tables")
for name, t in raw.items():
    if not t.empty:
        with st.expander(f"{name} ({len(t)} rows)"):
            ui.table(t, f"{name}_{run_id}")
