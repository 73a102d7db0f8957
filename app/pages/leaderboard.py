"""Leaderboard: every kernel of a scenario on a GPU as % of the ceiling its run measured (faprof.analysis.leaderboard,
the same tables as docs/kernels/leaderboard.md, over the runs loaded here)."""

from __future__ import annotations

import faprof_ui as ui
import streamlit as st

from faprof.analysis import leaderboard as board

ctx = ui.context()
meas = ctx.runs.measurements

st.title("Leaderboard")
st.caption("Every kernel (faprof's, PyTorch's, the attention libraries', yours) as a share of the ceiling its run "
           "measured on that GPU: the copy bandwidth for memory-bound shapes (decode), the matmul rate for "
           "compute-bound ones (prefill). Score: the geometric mean over the shapes a kernel ran right; kernels timed "
           "on every shape first. Each (kernel, shape) comes from the newest run that timed it.")

names = sorted(set(meas.get("scenario", [])) & set(board.SCENARIOS)) if not meas.empty else []
if not names:
    ui.no_data(f"No run of the leaderboard's scenarios ({', '.join(board.SCENARIOS)}) is loaded.",
               f"faprof profile --scenario {board.SCENARIOS[0]}")
    st.stop()

c = st.columns(2)
scenario = c[0].selectbox("Scenario", names, key="lb_scenario")
lb = board.build(meas, ctx.runs.manifests, [scenario])
gpus = list(dict.fromkeys(lb.summary["gpu"])) if not lb.summary.empty else []
if not gpus:
    ui.no_data(f"No row of {scenario} has a shape the scenario file has today.")
    st.stop()
gpu = c[1].selectbox("GPU", gpus, key="lb_gpu")

summary = lb.summary[(lb.summary["gpu"] == gpu)]
if not (summary["who"] == "library").any():
    st.info("No library baseline was timed here: `pip install 'faprof[flashinfer]'` / `'faprof[fa4]'` on the GPU "
            "machine, then run the scenario again.", icon=":material/info:")
ui.table(summary[["variant", "who", "version", "score", "low", "high", "shapes", "total", "wrong", "ceiling", "bundles",
                  "not_run"]], "leaderboard",
         labels={"who": "by", "score": "% of ceiling (geomean)", "low": "lowest %", "high": "highest %",
                 "shapes": "shapes ran right", "total": "shapes", "not_run": "not run (why)"},
         caption="% of the measured ceiling: copy for memory-bound shapes, matmul for compute-bound ones.")

st.subheader("Per shape")
rows = lb.rows[lb.rows["gpu"] == gpu]
order = lb.shapes.get((scenario, gpu), [])
labels = dict(zip(rows["shape_id"], rows["label"], strict=False))
wide = rows.pivot_table(index="variant", columns="shape_id", values="pct_ceiling", aggfunc="first")
wide = wide.reindex(index=[v for v in summary["variant"] if v in wide.index],
                    columns=[s for s in order if s in wide.columns])
wide.columns = [labels.get(s, s) for s in wide.columns]
ui.table(wide.reset_index(), "leaderboard_shapes", labels={k: k for k in wide.columns},
         caption="% of the measured ceiling per shape; empty where the kernel was not timed right (the CSV of the "
                 "first table says why).")
