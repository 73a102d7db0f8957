"""Timeline: the Nsight Systems kernel timeline of one problem, one lane per variant, and the per-call summary."""

from __future__ import annotations

import faprof_ui as ui
import plotly.express as px
import plotly.graph_objects as go
import streamlit as st

from faprof import analysis as fd

ctx = ui.context()
kernels = ctx.filter_table(ctx.runs.table("nsys_kernels"))
summary = ctx.filter_table(ctx.runs.table("nsys_summary"))

st.title("Timeline")
if kernels.empty and summary.empty:
    ui.no_data("No Nsight Systems data in these runs.", fd.nsight_hint(ctx.scenario_hint(), "nsys"))
    st.stop()

present = ctx.run_order((set(kernels["run_id"]) if not kernels.empty else set())
                        | (set(summary["run_id"]) if not summary.empty else set()))
titles = {r: fd.run_title(ctx.runs.manifests.get(r, {"run_id": r})) for r in present}
top = st.columns([3, 3, 1])
run_id = top[0].selectbox("Run", present, format_func=lambda r: titles[r], key="tl_run")
k_run = kernels[kernels["run_id"] == run_id] if not kernels.empty else kernels
s_run = summary[summary["run_id"] == run_id] if not summary.empty else summary

if not k_run.empty:
    meas = ctx.runs.measurements
    labels = {}
    if not meas.empty:
        labels = dict(zip(meas["shape_id"], meas["problem"], strict=False))
    shapes = sorted(k_run["shape_id"].unique(), key=lambda s: labels.get(s, s))
    shape_id = top[1].selectbox("Problem", shapes, format_func=lambda s: labels.get(s, s), key="tl_shape")
    n_iter = int(k_run["iteration"].nunique()) if "iteration" in k_run else 1
    iters = top[2].number_input("Calls", min_value=1, max_value=max(1, n_iter), value=1,
                                key="tl_iters", help="Recorded calls shown per variant")
    tl = fd.timeline(k_run, run_id, shape_id, int(iters))
    if tl.empty:
        st.caption("No kernels recorded for this problem.")
    else:
        palette = px.colors.qualitative.Plotly + px.colors.qualitative.Set2
        fig = go.Figure()
        for i, (kname, g) in enumerate(tl.groupby("kernel", sort=False)):
            fig.add_trace(go.Bar(
                y=g["variant"], x=g["duration_us"], base=g["start_us"], orientation="h",
                name=fd.clip(fd.short_kernel(kname), 30),  # the full name is in the hover and the table
                marker=dict(color=palette[i % len(palette)], line=dict(width=0.5, color="white")),
                customdata=g[["iteration", "duration_us", "launch_latency_us"]].to_numpy(),
                hovertemplate=f"{kname[:80]}<br>" + "call %{customdata[0]}<br>start %{base:.2f} µs, "
                              "%{customdata[1]:.2f} µs<br>launch latency %{customdata[2]:.2f} µs<extra>%{y}</extra>"))
        fig.update_layout(barmode="overlay", bargap=0.35)
        fig.update_xaxes(title="time since the variant's first kernel (µs)", rangemode="tozero")
        fig.update_yaxes(title="", automargin=True, categoryorder="category descending")
        ui.show(ui.style(fig, title=f"Kernels of {labels.get(shape_id, shape_id)} "
                               + ("(first call)" if int(iters) == 1 else f"(first {int(iters)} calls)"),
                         height=max(260, 110 + 55 * tl["variant"].nunique(), ui.legend_height(fig)),
                         legend_title="kernel"), key="tl_gantt")
        st.caption("Each lane is one variant, aligned at its first kernel; gaps are time the GPU sat idle between "
                   "kernels (launch overhead, host work).")
        with st.expander(f"Kernels shown ({len(tl)})"):
            ui.table(tl, f"timeline_{run_id}_{shape_id}")

st.subheader("Per call (medians over the recorded calls)")
if s_run.empty:
    st.caption("No nsys_summary in this run.")
else:
    s = s_run.copy()
    meas = ctx.runs.measurements
    if not meas.empty:
        s["problem"] = s["shape_id"].map(dict(zip(meas["shape_id"], meas["problem"], strict=False))).fillna(s["shape_id"])
    else:
        s["problem"] = s["shape_id"]
    have = [c for c in ("gpu_us", "idle_us") if c in s]
    ok = s[s[have[0]].notna()] if have else s.iloc[0:0]
    if not ok.empty:
        short, shared = fd.short_labels(list(dict.fromkeys(ok["problem"])))
        ok = ok.assign(lane=ok["problem"].map(short) + " · " + ok["variant"])
        long = ok.melt(id_vars=["lane", "variant", "problem"], value_vars=have, var_name="part", value_name="us")
        long["part"] = long["part"].map({"gpu_us": "kernels running", "idle_us": "GPU idle between kernels"})
        fig = px.bar(long, x="us", y="lane", color="part", orientation="h",
                     labels={"us": "time per call (µs)", "lane": f"problem ({shared}) · variant" if shared else "",
                             "part": ""},
                     color_discrete_map={"kernels running": "#1f77b4", "GPU idle between kernels": "#ff7f0e"},
                     category_orders={"lane": list(ok["lane"])[::-1]}, hover_data={"problem": True, "lane": False})
        fig.update_yaxes(automargin=True)
        ui.show(ui.style(fig, title="GPU busy and idle time per call (median)", height=max(260, 90 + 24 * len(ok))),
                key="tl_summary")
    cols = [c for c in ("variant", "problem", "status", "reason", "iterations", "kernels_per_call", "kernel_names", "gpu_us",
                        "wall_us", "host_us", "busy_frac", "launch_us", "idle_us", "gap_us", "harness_ms", "nsys_gpu_ms",
                        "harness_over_gpu") if c in s]
    ui.table(s[cols], f"nsys_summary_{run_id}",
             caption="µs per call; `harness_ms` is faprof's timed median beside nsys' kernel time (`nsys_gpu_ms`).")
