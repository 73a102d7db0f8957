"""The report's appendix: every table of the bundle, one section each, for `appendix.md` and the HTML
report's collapsed sections.

Each section is (title, Markdown body); empty tables are left out. Per-row details live here, never on
the first screen: every result with its CI, correctness, output samples, throughput, latency and
memory, forward/backward, scaling, bandwidth, trends, unstable timings with their reasons, rows not
run, every advisor finding (the baselines' included), Nsight Compute per launch, environment and
tolerances.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from faprof import advisor
from faprof.advisor.render import who
from faprof.analysis import aliases
from faprof.report import fmt as f
from faprof.report import table_text as rt
from faprof.report.observations import trends
from faprof.store import Bundle

Section = tuple[str, str]


def _results(df: pd.DataFrame) -> list[Section]:
    out = []
    groups = df["group"].fillna("") if "group" in df else pd.Series("", index=df.index)
    for g in dict.fromkeys(groups):
        title = f"Results: {g}" if g else "Results"
        intro = ("Times in ms (median; ± the half-width of the median's 95% CI); TFLOP/s with faprof's FLOP count; "
                 "speed vs baseline = the baseline's median / the row's; ≈: unstable timings; "
                 f"{rt.TIMING_FLAG_MARK}: flagged timing (why: Flagged timings).\n\n")
        out.append((title, intro + rt.md_table(rt.results_frame(df[groups == g]))))
    for b in dict.fromkeys(df["baseline"].dropna()) if "baseline" in df else []:
        cmp = rt.baseline_comparison(df[df["baseline"] == b], b)
        if not cmp.empty:
            out.append((f"Against {b}", rt.md_table(cmp)))
    return out


def _samples(df: pd.DataFrame) -> list[Section]:
    out = []
    for sid in df["shape_id"].unique()[:2]:
        s = rt.sample_frame(df, sid)
        if not s.empty and s.shape[1] > 2:
            out.append((f"First output elements, {rt.shape(df[df['shape_id'] == sid].iloc[0])}", rt.md_table(s)))
    return out


def sections(bundle: Bundle, df: pd.DataFrame, m: dict[str, Any], diag: pd.DataFrame) -> list[Section]:
    """Every appendix section of a run, in reading order.

    Args:
        bundle: the run bundle (its Nsight tables).
        df: its measurement rows with speedups.
        m: its manifest.
        diag: the advisor's findings (`faprof.advisor.diagnose`), possibly empty.
    """
    out = _results(df)
    out.append(("Correctness", rt.md_table(rt.correctness_frame(df))))
    out += _samples(df)
    frames = (("Throughput against peak", rt.throughput_frame(df)),
              ("Latency, tokens/s and memory", rt.latency_frame(df)),
              ("Forward and backward", rt.fwd_bwd_frame(df)),
              ("Memory (MiB: measured extra memory per call, and analytic footprints)", rt.memory_frame(df)),
              ("Scaling over batch size", rt.scaling_frame(df)),
              ("Bandwidth utilization", rt.bandwidth_frame(df)),
              ("Unstable timings", rt.unstable_frame(df)),
              ("Flagged timings (work outside the call, stale or deferred output, inputs written)",
               rt.timing_flag_frame(df)),
              ("Rows not run", rt.not_run_frame(df)))
    out += [(title, rt.md_table(frame)) for title, frame in frames if not frame.empty]
    tr = trends(df)
    if tr:
        out.append(("How the ratios change with size", "\n".join(f"- {x}" for x in tr) + "\n"))
    if not diag.empty:
        out.append(("Every advisor finding", "Ranked per variant and shape (rank 1 is the primary cause); each finding quotes "
                    "the measurement or Nsight metric it rests on.\n\n" + rt.md_table(rt.advisor_frame(diag, df))))
        out.append(("Advisor summary per variant and cause", rt.md_table(_summary(diag))))
    ncu = rt.ncu_frame(aliases.without_aliases(bundle.read("ncu_summary"), df))  # one kernel, one row
    if not ncu.empty:
        out.append(("Nsight Compute, per kernel launch", rt.md_table(ncu)))
    out.append(("Environment", rt.md_table(rt.environment_frame(m))))
    tol = rt.tolerance_frame(m)
    if not tol.empty:
        out.append(("Correctness tolerances per dtype", rt.md_table(tol)))
    return out


def _summary(diag: pd.DataFrame) -> pd.DataFrame:
    s = advisor.summarize(diag)
    s = s.assign(max_gain_pct=s["max_gain_pct"].map(f.pct), variant=[who(r) for _, r in s.iterrows()])
    cols = [c for c in ("variant", "dtype", "title", "primary_shapes", "n_shapes", "max_gain_pct", "fix") if c in s]
    return s[cols].rename(columns={"title": "cause", "primary_shapes": "primary on", "n_shapes": "seen on (shapes)",
                                   "max_gain_pct": "est. gain, max (%)"})


def markdown(title: str, secs: list[Section]) -> str:
    """The appendix as one Markdown file."""
    parts = [f"# {title}: appendix", ""]
    for name, body in secs:
        parts += [f"## {name}", "", body.rstrip(), ""]
    return "\n".join(parts).rstrip() + "\n"
