"""Variants: latency, TFLOP/s, speedup, % of peak and error per variant in one run; the seed-style tables."""

from __future__ import annotations

import faprof_ui as ui
import numpy as np
import pandas as pd
import plotly.express as px
import plotly.graph_objects as go
import streamlit as st

from faprof import analysis as fd

ctx = ui.context()
df = ctx.measurements

st.title("Variants")
if df.empty:
    ui.no_data("No measurements pass the filters (or none are loaded).", f"faprof profile --scenario {ctx.scenario_hint() or 'smoke'}")
    st.stop()

# ------------------------------------------------------------------------------ choose a run
ids = ctx.run_order(df["run_id"].unique())  # the user's own runs first, newest first; the examples last
titles = {r: fd.run_title(ctx.runs.manifests[r]) for r in ids}
colors = ctx.colors
wanted_run = st.query_params.get("run")  # ?run=<run_id> links straight to a run
top = st.columns([3, 1, 2])
run_id = top[0].selectbox("Run", ids, index=ids.index(wanted_run) if wanted_run in ids else 0,
                          format_func=lambda r: titles[r], key="variants_run")
run = df[df["run_id"] == run_id].copy()
# One dtype at a time: fp16 and fp32 rows of the same shapes are different problems (and an fp32-only
# kernel must never be ranked against fp16 rows it could not run).
dtypes = sorted(run["dtype"].dropna().unique()) if "dtype" in run else []
if len(dtypes) > 1:
    timed_dt = fd.timed(run)["dtype"].value_counts()
    first = max(dtypes, key=lambda d: (int(timed_dt.get(d, 0)), d == "fp16"))
    dtype = top[1].selectbox("dtype", dtypes, index=dtypes.index(first), key="variants_dtype")
    run = run[run["dtype"] == dtype].copy()
elif dtypes:
    top[1].selectbox("dtype", dtypes, key="variants_dtype", disabled=True)
baselines = [str(b) for b in dict.fromkeys(run["baseline"].dropna()) if b] if "baseline" in run else []
baseline = " / ".join(baselines)  # a scenario may give some groups their own baseline
x_name = top[2].radio("x axis", list(fd.X_AXES), index=list(fd.X_AXES).index(fd.default_x_axis(run)),
                      horizontal=True, key="variants_x")
x = fd.X_AXES[x_name]
short, shared = fd.short_labels(fd.problem_order(run))
short = ui.tick_labels(short)
run["problem_x"] = run["problem"].map(short)
order = [short[p] for p in fd.problem_order(run)]
if x == "problem":
    x = "problem_x"
x_title = fd.label(x) if x != "problem_x" else (f"problem ({shared})" if shared else "problem")
config_short, _ = fd.short_labels(list(run["config"].unique()))
run["config_x"] = run["config"].map(config_short)
t = fd.timed(run)
bad = fd.flagged(run).drop(columns=["run"], errors="ignore")

n_wrong, n_failed = int((run["status"] == "wrong").sum()), int((run["status"] == "failed").sum())
if n_wrong or n_failed:
    st.warning(f"{n_wrong} wrong and {n_failed} failed rows in this run. Wrong rows are timed and drawn as red "
             "crosses; failed rows have no timing. Their reasons are in the table below.", icon=":material/warning:")


def line_chart(y: str, title: str, log_y: bool = True, key: str = "") -> go.Figure | None:
    """One line per variant (dashed by problem configuration on the sequence-length axis)."""
    d = t[pd.to_numeric(t[y], errors="coerce").notna()].copy() if y in t else t.iloc[0:0]
    if log_y:
        d = d[d[y] > 0]
    if d.empty:
        return None
    d = d.sort_values([x, "variant"]) if x != "problem_x" else d.assign(
        _o=d["problem_x"].map({p: i for i, p in enumerate(order)})).sort_values(["_o", "variant"])
    # Never join points of different directions, dtypes (or configurations) into one line: l20_fwd_bwd holds
    # forward, backward and fwd+bwd rows of the same shapes, l4_causal the same shapes in fp16 and fp32.
    series = fd.line_series(d, x, config_col="config_x")
    d = d.assign(line=series)
    dash = "line" if series.str.len().gt(0).any() else None
    fig = px.line(d, x=x, y=y, color="variant", line_dash=dash, line_group=dash, markers=True, log_y=log_y,
                  color_discrete_map=colors, category_orders={"problem_x": order},
                  labels={**fd.LABELS, y: fd.label(y), x: x_title, "line": "series"},
                  hover_data={"problem": True, "status": True, "median_ms": ":.4g", "n": True, x: False,
                              **({dash: True} if dash else {})})
    wrong = d[d["status"] == "wrong"]
    if not wrong.empty:
        fig.add_trace(go.Scatter(
            x=wrong[x], y=wrong[y], mode="markers", name="wrong result",
            marker=dict(symbol="x", size=15, color=ui.STATUS_COLORS["wrong"], line=dict(width=1, color="white")),
            text=wrong["variant"] + ": " + wrong["reason"].fillna(""), hovertemplate="%{text}<extra>wrong</extra>"))
    if x in ("seq_len", "kv_len", "flops"):
        vals = sorted(d[x].dropna().unique())
        fig.update_xaxes(type="log", tickvals=vals if x == "seq_len" and len(vals) <= 12 else None)
    else:
        ui.category_ticks(fig, len(order))
    return ui.style(fig, title=title, legend_title="variant" + (" and problem" if dash else ""), legend_below=True)


def draw(fig: go.Figure | None, key: str, empty: str) -> None:
    if fig is None:
        st.caption(empty)
    else:
        ui.show(fig, key=key)


# Memory-bound problems (decode) lead with GB/s, compute-bound ones with TFLOP/s (faprof.analysis.bound_of).
memory_bound = fd.bound_of(t) == "memory"
st.subheader("Latency and " + ("bandwidth" if memory_bound else "throughput"))
c = st.columns(2)
with c[0]:
    draw(line_chart("median_ms", "Median latency (ms, lower is better)", key="lat"), "variants_latency",
         "No timed rows.")
with c[1]:
    if memory_bound:  # decode: the headline is bytes per second against the measured copy, not TFLOP/s
        draw(line_chart("gbps", "Achieved bandwidth (GB/s of the minimum traffic: K/V once per KV head)", key="gbs"),
             "variants_gbps", "No timed rows.")
    else:
        draw(line_chart("tflops", "Throughput (TFLOP/s, higher is better)", key="tfl"), "variants_tflops",
             "No timed rows.")
if n_failed:
    st.caption(f"{n_failed} failed rows are not on the charts (they have no timing).")

st.subheader(f"Speedup over the baseline ({baseline}) and % of peak")
c = st.columns(2)
with c[0]:
    fig = line_chart("speedup", f"Speedup over {baseline} (x, above 1 is faster)")
    if fig is not None:
        ui.hline(fig, 1.0, "baseline = 1x", position="right")
    draw(fig, "variants_speedup", f"No row has a timed {baseline} to compare with.")
with c[1]:
    fig = (line_chart("pct_copy", "% of the measured copy bandwidth (device-to-device copy, read + write)")
           if memory_bound else line_chart("pct_peak", "% of the GPU's peak"))
    draw(fig, "variants_pct_peak", "No % of peak: these rows ran on the CPU, or the GPU is not in faprof's database.")
    labels = sorted(t["peak_label"].dropna().unique()) if "peak_label" in t else []
    if fig is not None and labels:
        st.caption("Peak used: " + "; ".join(str(v) for v in labels) + " (`faprof list gpus`).")

st.subheader("Error against the reference")
err = t[(t["variant"] != "cpu_ref") & (pd.to_numeric(t["rel_err"], errors="coerce") > 0)
        & (pd.to_numeric(t["rtol"], errors="coerce") > 0)] if "rel_err" in t else t.iloc[0:0]
if err.empty:
    st.caption("No errors recorded (the reference itself has none).")
else:
    e = err.copy()
    e["err_over_tol"] = fd.error_ratio(e)
    e = e.assign(_o=e["problem_x"].map({p: i for i, p in enumerate(order)})).sort_values(["_o", "variant"])
    several = e["status"].nunique() > 1
    fig = px.scatter(e, x="problem_x", y="err_over_tol", color="variant", symbol="status" if several else None,
                     log_y=True, symbol_map=ui.STATUS_SYMBOLS, category_orders={"problem_x": order},
                     color_discrete_map=colors,
                     labels={**fd.LABELS, "err_over_tol": "error ÷ its bound",
                             "problem_x": f"problem ({shared})" if shared else "problem"},
                     hover_data={"problem": True, "rel_err": ":.2e", "rtol": ":g", "max_abs_err": ":.2e",
                                 "reference": True, "reason": True, "problem_x": False})
    fig.update_traces(marker=dict(size=10))
    ui.hline(fig, 1.0, "bound", color=ui.STATUS_COLORS["wrong"], dash="dash")
    vertical = ui.category_ticks(fig, len(order), half_width=False)
    ui.show(ui.style(fig, title="Max error over FlashAttention's bound (3 x PyTorch's error in the dtype + eps; log): above 1 fails",
                     legend_title="variant, status" if several else "variant", legend_below=vertical), key="variants_error")
    st.caption("Bound: max |out − ref| ≤ factor × PyTorch's max error computing the same attention in the "
               "problem's dtype + eps × max(1, max |ref|) (faprof/model/scenarios.py: DEFAULT_TOLERANCE). A row also fails when any element "
               "exceeds atol + rtol·|ref|, or a timed call's output differs from the checked one, so a wrong row can "
               "sit under the line. Rows without a PyTorch baseline error (older bundles, fp32 checked on the GPU) "
               "show ‖out − ref‖/‖ref‖ over rtol.")

st.subheader("Wrong and failed rows")
if bad.empty:
    st.success("Every row that ran matched the reference (no wrong or failed rows).", icon=":material/check_circle:")
else:
    ui.table(bad, f"flagged_{run_id}", caption="Wrong: timed, but the output differs from the reference beyond the "
             "dtype's tolerance. Failed: the call raised or crashed; the reason is its error.")
skipped = fd.not_run(run)
if not skipped.empty:
    with st.expander(f"Not run: {int(skipped['problems'].sum())} rows unsupported or skipped"):
        ui.table(skipped, f"not_run_{run_id}")

st.subheader("Ranking (median TFLOP/s over the problems every ranked variant ran, per dtype and direction)")
rank = fd.ranking_table(t)
if rank.empty:
    st.caption("No timed rows to rank.")
else:
    ui.table(rank, f"ranking_{run_id}", caption=f"`problems`: how many problems the ranking is over (every ranked variant "
             f"ran them all); `ranked` False: the variant ran too few of them (the count) to be ranked with the rest. "
             f"`wrong`: rows of the variant that failed the check. Speedup is over {baseline}.")

fb = fd.fwd_bwd_tables(run)
st.subheader("Forward and backward")
if fb.empty:
    st.caption("No variant has both forward and backward rows in this run (scenario `l20_fwd_bwd` measures them).")
else:
    ui.table(fb, f"fwd_bwd_{run_id}", caption="Median ms of each direction; `bwd_over_fwd` is backward / forward.")

mem = fd.memory_tables(run, baselines[0] if baselines else None)
st.subheader("Memory: standard vs flash attention")
if mem.empty:
    st.caption("No peak-memory measurements to compare (they come from CUDA runs with torch_standard and sdpa_flash).")
else:
    ui.table(mem, f"memory_{run_id}", labels={v: f"{v}: extra memory (bytes, measured)" for v in
                                              ("torch_standard", "sdpa_flash", *baselines)}, caption="Extra device memory of one call (bytes, measured) beside the analytic "
             "footprints; reductions are standard / flash.")

st.subheader("Roofline from timing (minimum traffic)")
rf = fd.roofline_from_timing(run)
if rf.empty:
    st.caption("No GPU rows in this run: a roofline needs a GPU's peak and bandwidth.")
else:
    manifest = ctx.runs.manifests[run_id]
    ceilings: dict[str, float] = {}
    for dt in sorted(rf["dtype"].unique()):  # one compute roof per dtype present (tensor for fp16/bf16)
        ceilings.update(fd.gpu_ceilings(manifest, dt, "tensor" if dt in ("fp16", "bf16") else "cuda_core"))
    fig = px.scatter(rf, x="intensity", y="tflops", color="variant", color_discrete_map=colors,
                     symbol="status" if rf["status"].nunique() > 1 else None, symbol_map=ui.STATUS_SYMBOLS,
                     log_x=True, log_y=True, labels={**fd.LABELS, "intensity": "arithmetic intensity (FLOP/byte of minimum traffic)"},
                     hover_data={"problem": True, "median_ms": ":.4g", "dtype": True})
    fig.update_traces(marker=dict(size=10))
    xs = np.logspace(np.log10(max(rf["intensity"].min() / 4, 1e-2)), np.log10(rf["intensity"].max() * 40), 200)
    for kind, dash, color in (("datasheet", "solid", "#444"), ("measured", "dash", "#999")):
        bws = [v for k, v in ceilings.items() if k.startswith(kind) and k.endswith("gbs")]
        for k, v in sorted(((k, v) for k, v in ceilings.items() if k.startswith(kind) and k.endswith("tflops")),
                           key=lambda kv: -kv[1]):
            if not bws:
                continue
            fig.add_trace(go.Scatter(x=xs, y=fd.roofline_curve(v, bws[0], xs), mode="lines",
                                     line=dict(color=color, dash=dash, width=1.3),
                                     name=f"{k.replace(' tflops', '')} {v:.0f} TFLOP/s ({bws[0]:.0f} GB/s)"))
    ui.show(ui.style(fig, title="Achieved TFLOP/s against FLOPs per byte of minimum traffic, under the GPU's roofs",
                     height=460, legend_title="variant / roof"), key="variants_roofline")
    st.caption("Intensity counts each input read once and each output written once, so real kernels sit left of "
               "these points; Nsight Compute measures the real traffic (see the Nsight Compute page).")

st.subheader("All rows of this run")
show_cols = ["variant", "problem", "status", "median_ms", "ci95_low_ms", "ci95_high_ms", "n", "tflops", "pct_peak",
             "speedup", "baseline", "max_abs_err", "rel_err", "reference", "e2e_ms", "graph_ms", "extra_mem_bytes", "reason"]
ui.table(run[[c for c in show_cols if c in run]], f"rows_{run_id}", download=run.drop(columns=["problem_x", "config_x"]),
         caption="The CSV holds every column of the rows (raw samples as JSON lists).")
