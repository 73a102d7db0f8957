"""Overview: the runs loaded (GPU, scenario, date, status, rows per status, versions)."""

from __future__ import annotations

import json

import faprof_ui as ui
import pandas as pd
import plotly.express as px
import streamlit as st

from faprof import analysis as fd
from faprof.model import schema

ctx = ui.context()
runs = ctx.runs.runs

st.title("faprof dashboard")
st.caption("Compares FlashAttention-style kernel variants and GPUs from faprof run bundles. "
           "It reads bundles only: measure with `faprof profile --scenario NAME`.")

if runs.empty:
    ui.no_data("No run bundles are loaded. Give folders on the command line (`faprof dashboard runs/`), "
               "or upload a bundle archive in the sidebar.", "faprof profile --scenario smoke")
    st.stop()

if ctx.filters.get("scenario"):
    runs = runs[runs["scenario"].isin(ctx.filters["scenario"])]

c = st.columns(4)
c[0].metric("runs", len(runs))
n_gpus, with_cpu = fd.machine_count(runs["gpu"])
c[1].metric("GPUs", n_gpus, help="Distinct GPUs among the runs" + (" (CPU-only runs are not counted)" if with_cpu else ""))
c[2].metric("scenarios", runs["scenario"].nunique())
c[3].metric("rows", int(runs["rows"].sum()))
bad = int(runs["wrong"].sum() + runs["failed"].sum())
if bad:
    st.warning(f"{int(runs['wrong'].sum())} wrong and {int(runs['failed'].sum())} failed rows: "
               "see the Variants page for their reasons.", icon=":material/warning:")

st.subheader("Runs")
cols = ["gpu", "scenario", "created", "status", "rows", *schema.STATUSES, "nsight", "faprof", "git_sha", "torch",
        "cuda", "driver", "origin", "run_id", "path"]
ui.table(runs[[c for c in cols if c in runs]], "runs",
         caption="One row per bundle; the counts are rows per status. `nsight`: Nsight tables the bundle holds.")

st.subheader("Rows per status")
long = runs.melt(id_vars=["run_id", "gpu", "scenario", "created"], value_vars=list(schema.STATUSES),
                 var_name="status", value_name="count")
long = long[long["count"] > 0]
long["run"] = long["gpu"] + " · " + long["scenario"] + " · " + long["created"].str.slice(0, 16)
fig = px.bar(long, y="run", x="count", color="status", orientation="h",
             color_discrete_map=ui.STATUS_COLORS, category_orders={"status": list(schema.STATUSES)},
             labels={"count": "rows (variant x problem)", "run": ""}, hover_data=["run_id"])
fig.update_yaxes(automargin=True, categoryorder="array",  # newest at the top, as in the table
                 categoryarray=list(dict.fromkeys(runs["gpu"] + " · " + runs["scenario"] + " · "
                                                  + runs["created"].str.slice(0, 16)))[::-1])
ui.show(ui.style(fig, height=max(220, 60 + 45 * len(runs)), legend_title="status"), key="status_bars")

san = fd.sanitizer_table(ctx.runs)
if not san.empty:
    st.subheader("compute-sanitizer")
    st.caption("`faprof sanitize` runs among these bundles: each tool's hazards on the variants' smallest shapes "
               "(memcheck, racecheck, initcheck, synccheck); findings are in each bundle's sanitizer.parquet.")
    st.dataframe(san, hide_index=True, use_container_width=True)

st.subheader("Environment of each run")
for r in runs.itertuples():
    m = ctx.runs.manifests.get(r.run_id, {})
    env = m.get("env") or {}
    with st.expander(f"{r.gpu} · {r.scenario} · {r.created} ({r.status})"):
        keys = ["gpu_name", "cc", "sms", "l2_bytes", "smi_driver", "smi_max_sm_clock_mhz", "torch", "torch_cuda",
                "cudnn", "nvcc", "python", "faprof", "git_sha", "host", "platform", "ceilings"]
        rows = [(k, json.dumps(env[k]) if isinstance(env.get(k), dict) else str(env.get(k))) for k in keys if k in env]
        st.dataframe(pd.DataFrame(rows, columns=["field", "value"]), hide_index=True)
        settings = m.get("settings") or {}
        st.caption(f"baseline `{(m.get('scenario') or {}).get('baseline', '')}` · ncu `{settings.get('ncu')}` · "
                   f"nsys `{settings.get('nsys')}` · bundle `{m.get('path', '')}`")
        if m.get("log"):
            st.code("\n".join(m["log"]), language=None)
