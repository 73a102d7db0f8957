"""The report's appendix tables: every measured number of a bundle, formatted for people.

Each function takes the measurements (with speedups, `analysis.speedups_for`) and returns a frame
of strings whose headers carry the units; `md_table` turns one into GitHub Markdown through
`DataFrame.to_markdown` (tabulate, with number parsing off so that no cell is reformatted).
Columns the harness may or may not write (iqr_ms, outliers, timer, sm_clock_mhz, throttled) are
shown when present and left out when not.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from faprof.analysis import aliases, labels
from faprof.analysis import speedups as analysis
from faprof.model import schema
from faprof.model.plan import also_label
from faprof.model.values import as_float
from faprof.report import fmt as f


def md_table(df: pd.DataFrame) -> str:
    """A GitHub-flavoured Markdown table; every cell as text that renders as written (f.md: '|', '*', '<' and
    edge underscores escaped), missing values as '–'."""
    if df is None or df.empty:
        return "_(no rows)_\n"
    cells = df.copy()
    for c in cells.columns:
        cells[c] = cells[c].map(lambda x: f.md(x).replace("\n", " "))
    cells.columns = [str(c) for c in cells.columns]
    return cells.to_markdown(index=False, tablefmt="github", disable_numparse=True) + "\n"


def shape(r: Any, dtype: bool = True) -> str:
    """'B=16 H=8 S=512 D=64 fp16 causal' (direction added when not forward; KV heads, window and layout
    where the problem has them)."""
    s = f"S={r['Sq']}" if r["Sq"] == r["Sk"] else f"Sq={r['Sq']} Sk={r['Sk']}"
    extra = labels.mask_text(r) + ("" if r["direction"] == "fwd" else f" {r['direction']}")
    return f"B={r['B']} {labels.heads_text(r)} {s} D={r['D']}" + (f" {r['dtype']}" if dtype else "") + extra


def _get(r: Any, col: str) -> Any:
    return r[col] if col in r.index else None


def _ci_half(r: Any) -> str:
    lo, hi = as_float(_get(r, "ci95_low_ms")), as_float(_get(r, "ci95_high_ms"))
    return f"±{f.ms((hi - lo) / 2)}" if lo == lo and hi == hi else f.MISSING


#: Optional timing columns: (column, header, formatter). Shown only when the bundle has them.
OPTIONAL_TIMING = (
    ("iqr_ms", "IQR ms", f.ms),
    ("outliers", "outliers", f.count),
    ("timer", "timer", f.text),
    ("sm_clock_mhz", "SM clock MHz", f.count),
    ("throttled", "throttled", f.text),
)


def vname(r: Any) -> str:
    """A row's variant, with the aliases its kernel also stands for ('fa3_wgmma_e (also fa3_bwd_a..d)')."""
    return also_label(str(r["variant"]), aliases.split(_get(r, "aliases")))


def results_frame(df: pd.DataFrame) -> pd.DataFrame:
    """The full results table of one group: every row, with the median's 95% CI and the speed ratio."""
    opt = [(c, h, fn) for c, h, fn in OPTIONAL_TIMING if c in df.columns and df[c].notna().any()]
    rows = []
    for _, r in df.iterrows():
        flag = {"wrong": " ⚠ wrong", "failed": " ✗ failed"}.get(r["status"], "")
        u = _get(r, "unstable")
        flag += " ≈ unstable" if u is not None and not pd.isna(u) and bool(u) else ""
        flag += f" {TIMING_FLAG_MARK} timing flagged" if flagged(r) else ""
        row = {
            "variant": vname(r) + flag, "shape": shape(r), "status": r["status"],
            "median ms": f.ms(_get(r, "median_ms")), "median 95% CI ms": _ci_half(r),
            "TFLOP/s": f.sig(_get(r, "tflops")), "% of peak": f.pct(_get(r, "pct_peak")),
            "speed vs baseline": f.ratio(_get(r, "speedup")), "baseline": f.text(_get(r, "baseline")),
            "max abs error": f.err(_get(r, "max_abs_err")), "repeats": f.count(_get(r, "n")),
        }
        for c, h, fn in opt:
            row[h] = fn(_get(r, c))
        rows.append(row)
    return pd.DataFrame(rows)


def baseline_comparison(df: pd.DataFrame, baseline: str) -> pd.DataFrame:
    """Reports 003/004's table: each variant's time and throughput beside the baseline's."""
    t = df[df["status"].isin(schema.TIMED)]
    base = t[t["variant"] == baseline].drop_duplicates("shape_id").set_index("shape_id")
    rows = []
    for _, r in t[t["variant"] != baseline].iterrows():
        if r["shape_id"] not in base.index:
            continue
        b = base.loc[r["shape_id"]]
        rows.append({
            "variant": r["variant"], "shape": shape(r), "time ms": f.ms(r["median_ms"]),
            f"{baseline} ms": f.ms(b["median_ms"]), "speed vs baseline": f.ratio(b["median_ms"] / r["median_ms"]),
            "TFLOP/s": f.sig(r.get("tflops")), f"{baseline} TFLOP/s": f.sig(b.get("tflops")),
        })
    return pd.DataFrame(rows)


def correctness_frame(df: pd.DataFrame) -> pd.DataFrame:
    t = df[df["status"].isin(["ok", "wrong"])]
    return pd.DataFrame([{
        "variant": r["variant"], "shape": shape(r), "status": r["status"], "reference": f.text(r.get("reference")),
        "max abs error": f.err(r.get("max_abs_err")), "relative error": f.err(r.get("rel_err")),
        "rtol": f.err(r.get("rtol")), "atol": f.err(r.get("atol")), "input seed": f.integer(r.get("seed")),
    } for _, r in t.iterrows()])


def sample_frame(df: pd.DataFrame, shape_id: str) -> pd.DataFrame:
    """Report 000's 'first 10 elements' table for one problem: the reference and each variant."""
    t = df[(df["shape_id"] == shape_id) & df["status"].isin(schema.TIMED)]
    if t.empty or "out_sample" not in t:
        return pd.DataFrame()
    ref = next((r["ref_sample"] for _, r in t.iterrows() if r.get("ref_sample") is not None), None)
    if ref is None:
        return pd.DataFrame()
    out: dict[str, list[str]] = {"index": [str(i) for i in range(len(ref))], "reference": [f"{x:.6f}" for x in ref]}
    for _, r in t.iterrows():
        if r.get("out_sample") is not None:
            out[r["variant"]] = [f"{x:.6f}" for x in list(r["out_sample"])[: len(ref)]]
    return pd.DataFrame(out)


def throughput_frame(df: pd.DataFrame) -> pd.DataFrame:
    """Report 003's throughput analysis: min/max TFLOP/s and % of peak per variant and dtype."""
    t = df[df["status"].isin(schema.TIMED) & df["tflops"].notna()]
    if t.empty:
        return pd.DataFrame()
    rows = []
    for (v, dt), g in t.groupby(["variant", "dtype"], sort=True):
        pk = g["pct_peak"].dropna() if "pct_peak" in g else pd.Series(dtype=float)
        label = g["peak_label"].dropna() if "peak_label" in g else pd.Series(dtype=object)
        rows.append({"variant": v, "dtype": dt, "min TFLOP/s": f.sig(g["tflops"].min()),
                     "max TFLOP/s": f.sig(g["tflops"].max()),
                     "% of peak": f"{f.pct(pk.min())}–{f.pct(pk.max())}" if not pk.empty else f.MISSING,
                     "peak used": f.text(label.iloc[0]) if not label.empty else f.MISSING})
    return pd.DataFrame(rows)


def latency_frame(df: pd.DataFrame) -> pd.DataFrame:
    """Report 001's latency / tokens/s / peak memory table."""
    t = df[df["status"].isin(schema.TIMED)]
    return pd.DataFrame([{
        "variant": r["variant"], "shape": shape(r), "GPU median ms": f.ms(r["median_ms"]),
        "end-to-end ms (host clock)": f.ms(r.get("e2e_ms")), "CUDA-graph replay ms": f.ms(r.get("graph_ms")),
        "tokens/s": f.count(r.get("tokens_per_s")), "peak memory MiB": f.mib(r.get("peak_mem_bytes")),
        "extra memory MiB": f.mib(r.get("extra_mem_bytes")),
    } for _, r in t.iterrows()])


def bandwidth_frame(df: pd.DataFrame) -> pd.DataFrame:
    """Report 002's bandwidth utilization: minimum bytes over time against the GPU's bandwidth."""
    t = df[df["status"].isin(schema.TIMED) & (df["device"] == "cuda")]
    if t.empty or "gbps" not in t:
        return pd.DataFrame()
    return pd.DataFrame([{
        "variant": r["variant"], "shape": shape(r), "achieved GB/s (minimum bytes / time)": f.sig(r.get("gbps")),
        "datasheet GB/s": f.sig(r.get("mem_bw_gbs")), "% of datasheet": f.pct(r.get("pct_bw")),
    } for _, r in t.iterrows()])


def fwd_bwd_frame(df: pd.DataFrame) -> pd.DataFrame:
    """Report 002's gradient table for every variant with forward and backward rows: each direction's
    time and TFLOP/s, backward over forward, and the measured forward+backward call."""
    fb = analysis.fwd_bwd_tables(df)
    if fb.empty:
        return fb
    return pd.DataFrame([{
        "variant": r["variant"],
        "shape": f"B={r['B']} H={r['H']} S={r['Sq']} D={r['D']} {r['dtype']}" + (" causal" if r["causal"] else ""),
        "forward ms": f.ms(r["fwd_ms"]), "backward ms": f.ms(r["bwd_ms"]), "forward+backward ms": f.ms(r.get("fwd_bwd_ms")),
        "backward / forward": f.ratio(r["bwd_over_fwd"]),
        "forward TFLOP/s": f.sig(r.get("fwd_tflops")), "backward TFLOP/s": f.sig(r.get("bwd_tflops")),
        "fwd+bwd TFLOP/s": f.sig(r.get("fwd_bwd_tflops")),
    } for _, r in fb.iterrows()])


def memory_frame(df: pd.DataFrame) -> pd.DataFrame:
    """Report 002's memory table in MiB: measured extra memory of a standard and a flash variant, and
    the analytic footprints, with the reduction factors."""
    mem = analysis.memory_table(df)
    if mem.empty:
        return mem
    out = pd.DataFrame({"shape": [shape(r) for _, r in mem.iterrows()]})
    for c in mem.columns:
        if c in ("B", "H", "Sq", "Sk", "D", "dtype", "causal", "direction"):
            continue
        if c.endswith("reduction"):
            out[c.replace("_", " ") + " (x)"] = [f.ratio(x) for x in mem[c]]
        elif c.startswith("footprint_"):
            out[f"analytic {c.split('_')[1]} footprint MiB"] = [f.mib(x) for x in mem[c]]
        else:
            out[f"{c} measured extra MiB"] = [f.mib(x) for x in mem[c]]
    return out


def scaling_frame(df: pd.DataFrame) -> pd.DataFrame:
    parts = [analysis.scaling(df, v, "B").assign(variant=v) for v in df["variant"].unique()]
    sc = pd.concat([p for p in parts if not p.empty], ignore_index=True) if any(not p.empty for p in parts) else pd.DataFrame()
    if sc.empty:
        return sc
    return pd.DataFrame([{
        **({"group": r["group"]} if "group" in r.index else {}),
        "variant": r["variant"], "shape (B varies)": f"H={r['H']} S={r['Sq']} D={r['D']} {r['dtype']}" + (" causal" if r["causal"] else ""),
        "B": f.integer(r["B"]), "median ms": f.ms(r["median_ms"]), "throughput vs smallest B": f.ratio(r["throughput_vs_smallest"]),
        "efficiency %": f.pct(r["efficiency_pct"]),
    } for _, r in sc.iterrows()])


def not_run_frame(df: pd.DataFrame) -> pd.DataFrame:
    """Rows that did not produce a timing, one line per (variant, status, reason)."""
    bad = df[~df["status"].isin(schema.TIMED)]
    if bad.empty:
        return pd.DataFrame()
    g = bad.groupby(["variant", "status", "reason"], dropna=False, sort=False).size().reset_index(name="n")
    return pd.DataFrame([{"variant": r["variant"], "status": r["status"], "shapes": str(r["n"]), "reason": f.text(r["reason"])}
                         for _, r in g.iterrows()])


def advisor_frame(adv: pd.DataFrame, df: pd.DataFrame) -> pd.DataFrame:
    if adv.empty:
        return adv
    labels = {r["shape_id"]: shape(r) for _, r in df.drop_duplicates("shape_id").iterrows()}
    return pd.DataFrame([{
        "variant": vname(r), "shape": labels.get(r["shape_id"], r["shape_id"]), "rank": str(r["rank"]),
        "cause": r["title"], "est. gain": f.pct(r["estimated_gain_pct"]) if pd.notna(r["estimated_gain_pct"]) else "–",
        "evidence": f.text(r["evidence"]), "what usually fixes it": f.text(r["fix"]),
    } for _, r in adv.iterrows()])


def _duration_us(r: Any) -> float:
    """A launch's duration in µs: faprof's ncu_summary has `duration_ms`; tables of other versions `duration_ns`."""
    ms = as_float(r.get("duration_ms"))
    return ms * 1e3 if ms == ms else as_float(r.get("duration_ns")) / 1e3


#: The mark of a row whose timing integrity check flagged it (faprof.timing.integrity).
TIMING_FLAG_MARK = "⚑"


def flagged(r: Any) -> bool:
    """Whether a row's timing was flagged (work outside the call, stale or deferred output, inputs written)."""
    x = _get(r, "timing_flagged")
    return x is not None and not pd.isna(x) and bool(x)


def timing_flag_frame(df: pd.DataFrame) -> pd.DataFrame:
    """Rows whose timing was flagged, with the drained time and why (faprof.timing.integrity)."""
    if "timing_flagged" not in df:
        return pd.DataFrame()
    t = df[df["status"].isin((*schema.TIMED, "untrusted")) & df["timing_flagged"].fillna(False).astype(bool)]
    return pd.DataFrame([{"variant": r["variant"], "shape": shape(r), "status": r["status"], "median ms": f.ms(r.get("median_ms")),
                          "drained ms": f.ms(_get(r, "drained_ms")), "timer": f.text(r.get("timer")),
                          "why": f.text(r.get("timing_flag_reason"))} for _, r in t.iterrows()])


def unstable_frame(df: pd.DataFrame) -> pd.DataFrame:
    """Rows with unstable timings and why (faprof.rows.stability)."""
    if "unstable" not in df:
        return pd.DataFrame()
    t = df[df["status"].isin(schema.TIMED) & df["unstable"].fillna(False).astype(bool)]
    return pd.DataFrame([{"variant": r["variant"], "shape": shape(r), "median ms": f.ms(r.get("median_ms")),
                          "samples": f.count(r.get("n")), "timer": f.text(r.get("timer")),
                          "why": f.text(r.get("unstable_reason"))} for _, r in t.iterrows()])


def tolerance_frame(m: dict[str, Any]) -> pd.DataFrame:
    """The correctness tolerances the run used, per dtype."""
    tol = (m.get("settings") or {}).get("tolerance") or {}
    return pd.DataFrame([{"dtype": dt, **{k: f.err(v) for k, v in t.items()}} for dt, t in tol.items() if isinstance(t, dict)])


def ncu_frame(s: pd.DataFrame) -> pd.DataFrame:
    """One line per profiled kernel launch: occupancy, waves, SM and memory throughput."""
    if s.empty:
        return pd.DataFrame()
    per = s[s["kernel"] != "(all)"] if "kernel" in s else s
    rows = []
    for _, r in per.iterrows():
        rows.append({
            "variant": f.text(r.get("variant")), "shape_id": f.text(r.get("shape_id")),
            "kernel": f.text(r.get("kernel"))[:60], "duration µs": f.sig(_duration_us(r)),
            "achieved occupancy %": f.pct(r.get("achieved_occupancy_pct")),
            "occupancy limiter": f.text(r.get("occupancy_limiter")), "waves per SM": f.sig(r.get("waves_per_sm")),
            "SM throughput %": f.pct(r.get("sm_throughput_pct")), "memory throughput %": f.pct(r.get("memory_throughput_pct")),
        })
    return pd.DataFrame(rows)


def environment_frame(m: dict[str, Any]) -> pd.DataFrame:
    env = m.get("env", {}) or {}
    ceil = env.get("ceilings") or {}
    rows = [("GPU", env.get("gpu_name") or "none (CPU only)"), ("compute capability", env.get("cc")),
            ("SMs", env.get("sms")),
            ("memory", f"{env['gpu_memory_bytes'] / 2**30:.0f} GiB" if env.get("gpu_memory_bytes") else None),
            ("L2", f"{env['l2_bytes'] / 2**20:.0f} MiB" if env.get("l2_bytes") else None),
            ("max SM clock", f"{env['smi_max_sm_clock_mhz']} MHz" if env.get("smi_max_sm_clock_mhz") else None),
            ("driver", env.get("smi_driver")), ("CUDA (torch)", env.get("torch_cuda")), ("torch", env.get("torch")),
            ("nvcc", env.get("nvcc")), ("Python", env.get("python")), ("host", env.get("host")), ("CPU", env.get("cpu")),
            ("faprof", f"{env.get('faprof')} ({env.get('git_sha') or 'no git sha'})"),
            ("measured fp16 matmul ceiling", f"{f.sig(ceil['matmul_fp16_tflops'])} TFLOP/s" if ceil.get("matmul_fp16_tflops") else None),
            ("measured fp32 matmul ceiling", f"{f.sig(ceil['matmul_fp32_tflops'])} TFLOP/s" if ceil.get("matmul_fp32_tflops") else None),
            ("measured copy bandwidth", f"{f.sig(ceil['copy_gbs'])} GB/s" if ceil.get("copy_gbs") else None)]
    return pd.DataFrame([{"": k, "value": str(v)} for k, v in rows if v not in (None, "")])
