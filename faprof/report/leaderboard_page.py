"""The leaderboard as a Markdown page (docs/kernels/leaderboard.md, written by scripts/analysis/leaderboard.py):
per scenario and GPU, every kernel's share of the measured ceiling over the shapes it ran, then per shape,
then the bundles read. The tables are faprof.analysis.leaderboard's."""

from __future__ import annotations

from typing import Any

import pandas as pd

from faprof.analysis.leaderboard import Leaderboard, created_text
from faprof.report import fmt as f

#: A reason in a table cell is cut to this many characters (the bundle has it whole).
REASON_CHARS = 110

CEILING_WORDS = {"copy": "copy bandwidth for a memory-bound shape (decode: achieved GB/s over the copy "
                         "bandwidth the run measured)",
                 "matmul": "matmul rate for a compute-bound one (prefill: achieved TFLOP/s over the run's measured "
                           "matmul of the row's dtype)"}


def _cut(text: str, n: int = REASON_CHARS) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 1].rstrip() + "…"


def _cell(text: Any) -> str:
    return f.md(str(text))  # f.md escapes the pipes already


def _shape_cell(r: pd.Series) -> str:
    if r["status"] == "ok":
        return f.pct(r["pct_ceiling"])
    if r["status"] == "wrong":
        return f"wrong ({f.pct(r['pct_ceiling'])})"
    return str(r["status"])


def markdown(lb: Leaderboard, command: str) -> str:
    """The page. `command` is the line that regenerates it (said at the top)."""
    out = ["# Leaderboard: every kernel against the measured ceiling", "",
           "<!-- generated: do not edit by hand; regenerate with the command below -->", "",
           "Every kernel faprof timed on today's problems (faprof's kernels, PyTorch's backends, the attention "
           "libraries' baselines, users' kernels) as a share of the ceiling the run itself measured on that GPU: "
           f"the {CEILING_WORDS['copy']}, the {CEILING_WORDS['matmul']}. A kernel's score is the geometric mean of its shares over the shapes it ran "
           "right; kernels timed right on every shape come first (a mean over fewer shapes is not comparable with "
           "theirs), wrong rows are shown and never scored. A decode share above 100% means the K/V cache was read "
           "faster than the copy kernel streams DRAM (part of it served from L2).", "",
           "Where several bundles ran a scenario on one GPU, each (kernel, shape) takes its row from the newest "
           "bundle that timed it; each kernel names the bundle(s) its rows came from and the version that ran "
           "(a library's from its row's `path`, PyTorch's and faprof's from the bundle's environment). "
           "Regenerate the page after committing new bundles:", "",
           "```bash", command, "```", ""]
    libs = lb.rows[lb.rows["who"] == "library"] if not lb.rows.empty else pd.DataFrame()
    if libs.empty or not (libs["status"] == "ok").any():
        out += ['!!! note "No library rows yet"',
                "    None of the bundles read has a timed row of the library baselines (`flashinfer_decode`, "
                "`flashinfer_prefill`, `fa4`: [Library baselines](../guide/libraries.md)); they appear here once a "
                "bundle of these scenarios run with the libraries installed is committed under `examples/runs/`.", ""]
    if lb.summary.empty:
        out += ["No bundle read has rows of the ranked scenarios.", ""]
    for scenario, part in lb.summary.groupby("scenario", sort=False):
        out += [f"## `{scenario}`", ""]
        for gpu, board in part.groupby("gpu", sort=False):
            out += _board(lb, str(scenario), str(gpu), board)
    out += _bundles(lb)
    return "\n".join(out).rstrip() + "\n"


def _board(lb: Leaderboard, scenario: str, gpu: str, board: pd.DataFrame) -> list[str]:
    shapes = lb.shapes.get((scenario, gpu), [])
    rows = lb.rows[(lb.rows["scenario"] == scenario) & (lb.rows["gpu"] == gpu)]
    ceilings = sorted(set(rows.loc[rows["status"] == "ok", "ceiling"]) or set(rows["ceiling"]))
    out = [f"### {gpu}", "", f"{len(shapes)} shape{'s' * (len(shapes) != 1)}; % of the measured "
           + " / ".join(ceilings) + " ceiling.", "",
           "| # | kernel | by | version | % of ceiling (geomean) | range | shapes | bundle |",
           "| ---: | --- | --- | --- | ---: | --- | ---: | --- |"]
    scored = board[board["shapes"] > 0]
    for i, (_, r) in enumerate(scored.iterrows(), start=1):
        rng = f"{f.pct(r['low'])}–{f.pct(r['high'])}" if r["shapes"] > 1 else ""
        shp = f"{r['shapes']}/{r['total']}" + (f", {r['wrong']} wrong" if r["wrong"] else "")
        bundles = ", ".join(f"`{b.rsplit('/', 1)[-1]}`" for b in str(r["bundles"]).split(", "))
        out.append(f"| {i} | `{r['variant']}` | {r['who']} | {_cell(r['version'])} | {f.pct(r['score'])} | {rng} | "
                   f"{shp} | {bundles} |")
    out.append("")
    unscored = board[board["shapes"] == 0]
    if not unscored.empty:
        out += ["Not timed right on any shape:", ""]
        out += [f"- `{r['variant']}` ({r['who']}): {_cell(_cut(r['not_run']))}" for _, r in unscored.iterrows()]
        out.append("")
    # per shape: kernels down, shapes across (s1, s2, ... named below)
    names = {sid: f"s{i}" for i, sid in enumerate(shapes, start=1)}
    out += ["| kernel | " + " | ".join(names[s] for s in shapes) + " |",
            "| --- | " + " | ".join("---:" for _ in shapes) + " |"]
    cells = rows.set_index(["variant", "shape_id"])
    for _, r in scored.iterrows():
        vals = [_shape_cell(cells.loc[(r["variant"], s)]) if (r["variant"], s) in cells.index else "–" for s in shapes]
        out.append(f"| `{r['variant']}` | " + " | ".join(vals) + " |")
    out.append("")
    labels = rows.drop_duplicates("shape_id").set_index("shape_id")["label"]
    out += [f"- {names[s]}: {_cell(labels.get(s, s))}" for s in shapes]
    out.append("")
    return out


def _bundles(lb: Leaderboard) -> list[str]:
    b = lb.bundles
    out = ["## Bundles read", "",
           f"{len(b)} bundle{'s' * (len(b) != 1)}; those that gave no row say why.", "",
           "| bundle | scenario | GPU | created | faprof | rows | note |", "| --- | --- | --- | --- | --- | ---: | --- |"]
    for _, r in b.iterrows():
        out.append(f"| `{r['bundle']}` | `{r['scenario']}` | {r['gpu']} | {created_text(r['created'])} | "
                   f"{r['faprof'] or '–'} | {r['rows']} | {r['note']} |")
    out.append("")
    return out
