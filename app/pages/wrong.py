"""Wrong results: where a wrong kernel is wrong (its error map as a heatmap) and which bug it looks like."""

from __future__ import annotations

import faprof_ui as ui
import plotly.graph_objects as go
import streamlit as st

from faprof import analysis as fd
from faprof.correctness import wrong_text

ctx = ui.context()
maps = ctx.filter_table(ctx.runs.table("error_maps"))
meas = ctx.measurements

st.title("Wrong results")
st.caption("A row whose output fails the correctness check is `wrong`: faprof keeps an error map of each wrong output "
           "(by batch, head, row tile, head-dim column, causal mask, diagonal and last tile) and tests bug signatures "
           "against alternative references. `faprof explain RUN` prints the same sentences.")
n_wrong = int((meas["status"] == "wrong").sum()) if not meas.empty else 0
if maps.empty:
    if n_wrong:
        st.info(f"{n_wrong} wrong rows in these runs, but none has an error map: the runs were recorded before faprof "
                "kept them. Their reasons are on the Variants page; run `faprof profile` again to get maps and signatures.")
    else:
        ui.no_data("No wrong rows in these runs: every checked output matched the reference.")
    st.stop()

index = fd.maps_index(maps)
present = ctx.run_order(set(index["run_id"]))
titles = {r: fd.run_title(ctx.runs.manifests.get(r, {"run_id": r})) for r in present}
run_id = st.selectbox("Run", present, format_func=lambda r: titles[r], key="wrong_run")
idx = index[index["run_id"] == run_id]
rows = list(dict.fromkeys(zip(idx["variant"], idx["shape_id"], strict=True)))
variant, shape_id = st.selectbox("Wrong row", rows, format_func=lambda r: f"{r[0]} · {r[1]}", key="wrong_row")
row_maps = maps[(maps["run_id"] == run_id) & (maps["variant"] == variant) & (maps["shape_id"] == shape_id)]

m = meas[(meas["run_id"] == run_id) & (meas["variant"] == variant) & (meas["shape_id"] == shape_id)]
if not m.empty:
    lines = wrong_text.explain_wrong(m.iloc[0].to_dict(), row_maps.drop(columns=["run_id", "gpu", "scenario"],
                                                                         errors="ignore"))
    st.markdown(f"**{lines[0]}**")
    if len(lines) > 1:
        st.code("\n".join(lines[1:]), language=None)

c = st.columns(2)
inputs = list(dict.fromkeys(idx[(idx["variant"] == variant) & (idx["shape_id"] == shape_id)]["check_input"]))
check_input = c[0].selectbox("Input", inputs, key="wrong_input",
                             help="randn, or the adversarial input the row was also checked on")
outs = list(dict.fromkeys(row_maps[row_maps["check_input"] == check_input]["output"]))
output = c[1].selectbox("Output", outs, key="wrong_output")

grid = fd.map_grid(row_maps, check_input=check_input, output=output)
st.subheader(f"Error map: {output} on {check_input}")
st.caption("Share of wrong elements (over atol + rtol·|ref|) in each bin of each axis; hover for the bin's range, "
           "counts, max error and unwritten elements (the NaN poison still there). Axes have different numbers of bins.")
if not grid["axes"]:
    st.caption("This output has no map.")
else:
    fig = go.Figure(go.Heatmap(
        z=grid["z"], y=grid["axes"], x=list(range(grid["columns"])), text=grid["text"], texttemplate="%{text}",
        customdata=grid["hover"], hovertemplate="%{customdata}<extra></extra>", zmin=0, zmax=1,
        colorscale=[[0, "#e8f5e9"], [0.02, "#fff3e0"], [1, "#b71c1c"]], colorbar=dict(title="wrong", tickformat=".0%"),
        xgap=1, ygap=1))
    fig.update_xaxes(title="bin (in order along the axis)", showticklabels=False)
    fig.update_yaxes(autorange="reversed")
    ui.show(ui.style(fig, height=max(260, 80 + 46 * len(grid["axes"]))), key="wrong_heatmap")
ui.table(row_maps[(row_maps["check_input"] == check_input) & (row_maps["output"] == output)][
    ["axis", "bin", "lo", "hi", "n", "n_bad", "share_bad", "max_err", "n_unwritten"]], "error_map",
    caption="The map as recorded (bundle table `error_maps`).")
