"""Markdown and HTML reports from a run bundle: the seed reports' tables and findings, generated.

Sections (each only when the bundle has the data):
environment; method; results per group with speedups over the baseline; comparison against the
baseline (time and throughput ratios, as reports 003/004); correctness (max error, reference);
first output elements beside the reference (report 000); throughput against peak (report 003);
latency, tokens/s and peak memory (report 001); forward/backward and memory tables, bandwidth
utilization (report 002); published figures beside measured ones; Nsight findings; and
generated findings in plain words. Every number comes from the bundle; published figures are
labelled as the report's.
"""

from __future__ import annotations

import html
import math
from pathlib import Path
from typing import Any

import pandas as pd

from faprof import analysis
from faprof.store import Bundle

#: Relative standard error above which a timing is called noisy in the findings.
NOISY_REL_SEM = 0.02


def _f(x: Any, spec: str = ".3g") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return ""
    try:
        return format(x, spec)
    except (TypeError, ValueError):
        return str(x)


def md_table(df: pd.DataFrame) -> str:
    """A GitHub-flavoured Markdown table (no external dependency)."""
    if df.empty:
        return "_(no rows)_\n"
    cols = [str(c) for c in df.columns]
    lines = ["| " + " | ".join(cols) + " |", "| " + " | ".join("---" for _ in cols) + " |"]
    for _, r in df.iterrows():
        lines.append("| " + " | ".join(str(v).replace("|", "\\|") for v in r.tolist()) + " |")
    return "\n".join(lines) + "\n"


def _shape(r) -> str:
    s = f"S={r['Sq']}" if r["Sq"] == r["Sk"] else f"Sq={r['Sq']} Sk={r['Sk']}"
    extra = (" causal" if r["causal"] else "") + ("" if r["direction"] == "fwd" else f" {r['direction']}")
    return f"B={r['B']} H={r['H']} {s} D={r['D']} {r['dtype']}{extra}"


def results_frame(df: pd.DataFrame, baseline: str) -> pd.DataFrame:
    rows = []
    for _, r in df.iterrows():
        ci = ""
        if r.get("ci95_high_ms") is not None and not pd.isna(r.get("ci95_high_ms")):
            ci = _f((r["ci95_high_ms"] - r["ci95_low_ms"]) / 2, ".2g")
        flag = {"wrong": " ⚠ wrong", "failed": " ✗ failed"}.get(r["status"], "")
        rows.append({
            "variant": r["variant"] + flag, "shape": _shape(r), "status": r["status"],
            "median ms": _f(r.get("median_ms"), ".4g"), "±95% CI": ci,
            "GFLOP/s": _f(r["tflops"] * 1e3 if not pd.isna(r.get("tflops")) else None, ".4g"),
            "% peak": _f(r.get("pct_peak"), ".2f"),
            "speedup": (_f(r.get("speedup"), ".2f") + "x") if not pd.isna(r.get("speedup")) else "",
            "baseline": r.get("baseline") or baseline,
            "max abs err": _f(r.get("max_abs_err"), ".2e"), "n": _f(r.get("n"), ".0f"),
        })
    return pd.DataFrame(rows)


def baseline_comparison(df: pd.DataFrame, baseline: str) -> pd.DataFrame:
    """Reports 003/004's table: each variant's time and throughput beside the baseline's, with ratios."""
    t = df[df["status"].isin(analysis.TIMED)]
    base = t[t["variant"] == baseline].set_index("shape_id")
    rows = []
    for _, r in t[t["variant"] != baseline].iterrows():
        if r["shape_id"] not in base.index:
            continue
        b = base.loc[r["shape_id"]]
        rows.append({
            "variant": r["variant"], "shape": _shape(r),
            "time ms": _f(r["median_ms"], ".4g"), f"{baseline} ms": _f(b["median_ms"], ".4g"),
            "time ratio (variant/baseline)": _f(r["median_ms"] / b["median_ms"], ".2f"),
            "TFLOP/s": _f(r["tflops"], ".3g"), f"{baseline} TFLOP/s": _f(b["tflops"], ".3g"),
            "TFLOP/s ratio": _f(r["tflops"] / b["tflops"], ".2f"),
        })
    return pd.DataFrame(rows)


def correctness_frame(df: pd.DataFrame) -> pd.DataFrame:
    t = df[df["status"].isin(["ok", "wrong"])]
    return pd.DataFrame([{
        "variant": r["variant"], "shape": _shape(r), "status": r["status"], "reference": r.get("reference"),
        "max abs err": _f(r.get("max_abs_err"), ".2e"), "rel err": _f(r.get("rel_err"), ".2e"),
        "tolerance (rtol, atol)": f"{_f(r.get('rtol'), '.0e')}, {_f(r.get('atol'), '.0e')}", "seed": r.get("seed"),
    } for _, r in t.iterrows()])


def sample_frame(df: pd.DataFrame, shape_id: str) -> pd.DataFrame:
    """Report 000's 'first 10 elements' table for one problem: the reference and each variant."""
    t = df[(df["shape_id"] == shape_id) & df["status"].isin(analysis.TIMED)]
    if t.empty or "out_sample" not in t:
        return pd.DataFrame()
    ref = next((r["ref_sample"] for _, r in t.iterrows() if r.get("ref_sample") is not None), None)
    if ref is None:
        return pd.DataFrame()
    out = {"index": list(range(len(ref))), "reference": [f"{x:.6f}" for x in ref]}
    for _, r in t.iterrows():
        if r.get("out_sample") is not None:
            out[r["variant"]] = [f"{x:.6f}" for x in list(r["out_sample"])[: len(ref)]]
    return pd.DataFrame(out)


def throughput_frame(df: pd.DataFrame) -> pd.DataFrame:
    """Report 003's throughput analysis: min/max GFLOP/s and % of peak per variant."""
    t = df[df["status"].isin(analysis.TIMED) & df["tflops"].notna()]
    if t.empty:
        return pd.DataFrame()
    rows = []
    for v, g in t.groupby("variant", sort=False):
        pk = g["pct_peak"].dropna() if "pct_peak" in g else pd.Series(dtype=float)
        rows.append({"variant": v, "min GFLOP/s": _f(g["tflops"].min() * 1e3, ".4g"),
                     "max GFLOP/s": _f(g["tflops"].max() * 1e3, ".4g"),
                     "% of peak": f"{_f(pk.min(), '.2f')}–{_f(pk.max(), '.2f')}" if not pk.empty else "",
                     "peak used": g["peak_label"].dropna().iloc[0] if "peak_label" in g and g["peak_label"].notna().any() else ""})
    return pd.DataFrame(rows).sort_values("variant")


def latency_frame(df: pd.DataFrame) -> pd.DataFrame:
    """Report 001's latency / tokens/s / peak memory table."""
    t = df[df["status"].isin(analysis.TIMED)]
    return pd.DataFrame([{
        "variant": r["variant"], "shape": _shape(r), "latency ms (GPU, median)": _f(r["median_ms"], ".4g"),
        "end-to-end ms (host)": _f(r.get("e2e_ms"), ".4g"), "graph replay ms": _f(r.get("graph_ms"), ".4g"),
        "tokens/s": _f(r.get("tokens_per_s"), ",.0f"),
        "peak memory MB": _f((r.get("peak_mem_bytes") or float("nan")) / 2**20, ".2f"),
        "extra memory MB": _f((r.get("extra_mem_bytes") or float("nan")) / 2**20, ".2f"),
    } for _, r in t.iterrows()])


def bandwidth_frame(df: pd.DataFrame) -> pd.DataFrame:
    """Report 002's bandwidth utilization: minimum bytes over time against the GPU's bandwidth."""
    t = df[df["status"].isin(analysis.TIMED) & (df["device"] == "cuda")]
    if t.empty or "gbps" not in t:
        return pd.DataFrame()
    return pd.DataFrame([{
        "variant": r["variant"], "shape": _shape(r), "achieved GB/s (min bytes / time)": _f(r.get("gbps"), ".4g"),
        "theoretical GB/s": _f(r.get("mem_bw_gbs"), ".4g"), "efficiency %": _f(r.get("pct_bw"), ".1f"),
    } for _, r in t.iterrows()])


def published_frame(df: pd.DataFrame, manifest: dict[str, Any]) -> pd.DataFrame:
    """Each published figure beside faprof's measurement of the same variant and shape, if any."""
    pubs = manifest.get("published") or []
    gpu = (manifest.get("env") or {}).get("gpu_name") or "CPU"
    rows = []
    for p in pubs:
        meas = ""
        shape = p.get("shape") or {}
        if p.get("maps_to") and p.get("what") in ("latency", "throughput"):
            t = df[(df["variant"] == p["maps_to"]) & df["status"].isin(analysis.TIMED)]
            for k, col in (("B", "B"), ("H", "H"), ("D", "D"), ("S", "Sq"), ("dtype", "dtype"), ("causal", "causal"),
                           ("direction", "direction")):
                if k in shape:
                    t = t[t[col] == shape[k]]
            if len(t) == 1:
                r = t.iloc[0]
                if p["what"] == "latency" and p.get("unit") == "ms":
                    meas = f"{r['median_ms']:.4g} ms"
                elif p["what"] == "throughput" and p.get("unit") == "TFLOP/s":
                    meas = f"{r['tflops']:.3g} TFLOP/s"
                elif p["what"] == "throughput" and p.get("unit") == "tokens/s":
                    meas = f"{r['tokens_per_s']:,.0f} tokens/s"
        rows.append({"published by the report": f"{p['value']:g} {p['unit']}".strip(), "what": p["what"],
                     "subject (report's words)": p["subject"], "report's GPU": p["gpu"],
                     "shape": ", ".join(f"{k}={v}" for k, v in shape.items()),
                     f"faprof measured on {gpu}": meas, "faprof variant": p.get("maps_to", "")})
    return pd.DataFrame(rows)


def findings(df: pd.DataFrame, baseline: str, bundle: Bundle | None = None) -> list[str]:
    """Plain-words findings, each backed by the table rows it names."""
    out: list[str] = []
    t = df[df["status"].isin(analysis.TIMED)]
    for status, word in (("wrong", "gave wrong results"), ("failed", "failed")):
        bad = df[df["status"] == status]
        for v, g in bad.groupby("variant"):
            reason = g["reason"].dropna().iloc[0] if g["reason"].notna().any() else ""
            out.append(f"**{v} {word}** on {len(g)} problem(s) ({reason}).")
    ok_all = df[df["status"].isin(["ok", "wrong"])]
    if not ok_all.empty and (ok_all["status"] == "ok").all():
        out.append(f"All {ok_all['variant'].nunique()} variants that ran are within tolerance of the reference "
                   f"(largest max abs error {ok_all['max_abs_err'].max():.2e}).")
    for _sid, g in t.groupby("shape_id", sort=False):
        g = g.sort_values("median_ms")
        best = g.iloc[0]
        msg = f"{_shape(best)}: fastest is **{best['variant']}** ({best['median_ms']:.4g} ms, {best['tflops']:.3g} TFLOP/s)"
        if len(g) > 1:
            worst = g.iloc[-1]
            msg += f"; slowest {worst['variant']} is {worst['median_ms'] / best['median_ms']:.1f}x slower"
        out.append(msg + ".")
    # ratio trend against each row's baseline (report 003: "the gap widens with size"), per dtype and direction
    if "speedup" in t:
        bcol = t["baseline"] if "baseline" in t else pd.Series(baseline, index=t.index)
        for (v, b, dt, dr), g in t.assign(_b=bcol).groupby(["variant", "_b", "dtype", "direction"]):
            if v == b:
                continue
            g = g.dropna(subset=["speedup"]).sort_values("flops")
            if len(g) >= 3:
                first, last = g.iloc[0]["speedup"], g.iloc[-1]["speedup"]
                if first > 0 and last > 0:
                    trend = "widens" if last < first * 0.8 else ("narrows" if last > first * 1.25 else "stays similar")
                    out.append(f"{v} ({dt}, {dr}) runs at {first:.2f}x → {last:.2f}x of {b}'s speed from the smallest to "
                               f"the largest problem: the gap {trend} with size.")
    noisy = t[t["rel_sem"] > NOISY_REL_SEM] if "rel_sem" in t else t.iloc[0:0]
    if not noisy.empty:
        out.append(f"{len(noisy)} timing(s) have a standard error above {NOISY_REL_SEM:.0%} of the mean "
                   f"(e.g. {noisy.iloc[0]['variant']} at {_shape(noisy.iloc[0])}); treat small differences there as noise.")
    if bundle is not None and bundle.has("ncu_summary"):
        out.extend(_ncu_findings(bundle.read("ncu_summary")))
    return out


def _ncu_findings(s: pd.DataFrame) -> list[str]:
    out: list[str] = []
    if s.empty:
        return out
    cols = set(s.columns)
    for _, r in s.iterrows():
        if "kernel" in cols and r.get("kernel") == "(all)":
            continue
        bits = []
        if "achieved_occupancy_pct" in cols and not pd.isna(r.get("achieved_occupancy_pct")):
            bits.append(f"achieved occupancy {r['achieved_occupancy_pct']:.0f}%")
        if "occupancy_limiter" in cols and isinstance(r.get("occupancy_limiter"), str):
            bits.append(f"limited by {r['occupancy_limiter']}")
        if "waves_per_sm" in cols and not pd.isna(r.get("waves_per_sm")) and r["waves_per_sm"] < 1:
            bits.append(f"{r['waves_per_sm']:.2f} waves per SM (the grid does not fill the GPU)")
        if "sm_throughput_pct" in cols and "memory_throughput_pct" in cols:
            sm, mem = r.get("sm_throughput_pct"), r.get("memory_throughput_pct")
            if not pd.isna(sm) and not pd.isna(mem):
                bits.append(f"SM {sm:.0f}% / memory {mem:.0f}% of peak")
        if bits:
            out.append(f"ncu, {r.get('variant')} {r.get('shape_id')} `{str(r.get('kernel'))[:60]}`: " + ", ".join(bits) + ".")
        if len(out) >= 30:
            break
    return out


def render_markdown(bundle: Bundle) -> str:
    m = bundle.manifest()
    df = analysis.speedups_for(bundle.measurements(), m)
    env = m.get("env", {})
    baseline = m["scenario"]["baseline"]
    timing = (m.get("settings") or {}).get("timing", {})
    parts = [f"# faprof report: {m['scenario']['name']} on {env.get('gpu_name') or 'CPU only'}\n",
             f"Run `{m['run_id']}`, status **{m.get('status')}**. Scenario: {m['scenario'].get('source') or m['scenario']['name']}.\n"]
    envrows = [("GPU", env.get("gpu_name")), ("compute capability", env.get("cc")), ("SMs", env.get("sms")),
               ("memory", f"{env['gpu_memory_bytes'] / 2**30:.0f} GiB" if env.get("gpu_memory_bytes") else None),
               ("L2", f"{env['l2_bytes'] / 2**20:.0f} MiB" if env.get("l2_bytes") else None),
               ("max SM clock MHz", env.get("smi_max_sm_clock_mhz")), ("driver", env.get("smi_driver")),
               ("CUDA (torch)", env.get("torch_cuda")), ("torch", env.get("torch")), ("nvcc", env.get("nvcc")),
               ("Python", env.get("python")), ("host", env.get("host")), ("CPU", env.get("cpu")),
               ("faprof", f"{env.get('faprof')} ({env.get('git_sha') or 'no git sha'})"),
               ("measured matmul ceiling TFLOP/s", _f((env.get("ceilings") or {}).get("matmul_fp16_tflops"), ".4g")),
               ("measured copy GB/s", _f((env.get("ceilings") or {}).get("copy_gbs"), ".4g"))]
    parts += ["## Environment\n", md_table(pd.DataFrame([{"": k, "value": v} for k, v in envrows if v not in (None, "")]))]
    parts += ["## Method\n",
              f"Each variant is checked against a reference (float64 on the CPU, or fp32 on the GPU for big problems) on "
              f"fresh random inputs with NaN-poisoned outputs before it is timed. GPU times are CUDA-event medians after "
              f"{timing.get('warmup_ms', '?')} ms of warm-up, with the L2 flushed before every repeat "
              f"({'on' if timing.get('flush_l2', True) else 'off'}), repeated until the standard error is under "
              f"{100 * timing.get('target_rel_sem', 0.005):.1f}% of the mean or {timing.get('budget_s', '?')} s per pair. "
              f"FLOPs: 4·B·H·Sq·Sk·D forward, halved when causal; backward 2.5x. Speedups are {baseline}'s median over the "
              f"variant's (above 1 = faster than {baseline}).\n"]
    parts.append("## Results\n")
    for group in (df["group"].dropna().unique() if "group" in df else [None]):
        g = df if group is None else df[df["group"] == group]
        if group:
            parts.append(f"### {group}\n")
        parts.append(md_table(results_frame(g, baseline)))
    for b in dict.fromkeys(df["baseline"].dropna()) if "baseline" in df else [baseline]:
        sub = df[df["baseline"] == b] if "baseline" in df else df
        cmp = baseline_comparison(sub, b)
        if not cmp.empty:
            parts += [f"## Against {b}\n", md_table(cmp)]
    parts += ["## Correctness\n", md_table(correctness_frame(df))]
    for sid in df["shape_id"].unique()[:2]:
        s = sample_frame(df, sid)
        if not s.empty and s.shape[1] > 2:
            parts += [f"### First output elements, {_shape(df[df['shape_id'] == sid].iloc[0])}\n", md_table(s)]
    th = throughput_frame(df)
    if not th.empty:
        parts += ["## Throughput against peak\n", md_table(th)]
    lat = latency_frame(df)
    if not lat.empty:
        parts += ["## Latency, throughput and memory\n", md_table(lat)]
    fb = analysis.fwd_bwd_table(df, baseline)
    if not fb.empty:
        parts += [f"## Forward and backward ({baseline})\n", md_table(fb.round(4))]
    mem = analysis.memory_table(df)
    if not mem.empty:
        for c in [c for c in mem.columns if c not in ("B", "H", "Sq", "Sk", "D", "dtype", "causal", "direction")]:
            if c.endswith("reduction"):
                mem[c] = mem[c].round(2)
            else:
                mem[c] = (mem[c] / 2**20).round(2)
        parts += ["## Memory (MiB: measured extra memory per call, and analytic footprints)\n", md_table(mem)]
    sc = pd.concat([analysis.scaling(df, v, "B").assign(variant=v) for v in df["variant"].unique()], ignore_index=True) \
        if not df.empty else pd.DataFrame()
    if not sc.empty:
        sc = sc[["variant", *[c for c in sc.columns if c != "variant"]]].round(3)
        parts += ["## Scaling over batch size (throughput relative to the smallest batch)\n", md_table(sc)]
    bw = bandwidth_frame(df)
    if not bw.empty:
        parts += ["## Bandwidth utilization (minimum bytes / time)\n", md_table(bw)]
    pub = published_frame(df, m)
    if not pub.empty:
        parts += ["## Published figures (quoted from the seed report) beside faprof's\n",
                  "The left columns are the report's own figures on its GPU, not faprof measurements.\n\n", md_table(pub)]
    parts += ["## Findings\n", "\n".join(f"- {x}" for x in findings(df, baseline, bundle)) + "\n"]
    adv = analysis.advise(df, bundle.read("ncu_summary"), bundle.read("stalls"), bundle.read("nsys_summary"))
    if not adv.empty:
        parts += ["## Why: the bottleneck advisor\n",
                  "Each finding quotes the measurement or Nsight metric it rests on; the suggestion is the usual fix.\n\n",
                  md_table(adv)]
    return "\n".join(parts)


def render_html(bundle: Bundle) -> str:
    """The Markdown report as a standalone HTML page (tables rendered, no external assets)."""
    md = render_markdown(bundle)
    body: list[str] = []
    in_table = False
    rows: list[list[str]] = []

    def flush():
        nonlocal rows
        if rows:
            head, *rest = rows
            h = "".join(f"<th>{html.escape(c)}</th>" for c in head)
            b = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rest)
            body.append(f"<table><thead><tr>{h}</tr></thead><tbody>{b}</tbody></table>")
        rows = []

    for line in md.splitlines():
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip("|").split(" | ")]
            if all(set(c) <= {"-"} for c in cells):
                continue
            rows.append(cells)
            in_table = True
            continue
        if in_table:
            flush()
            in_table = False
        if line.startswith("#"):
            level = len(line) - len(line.lstrip("#"))
            body.append(f"<h{level}>{html.escape(line.lstrip('#').strip())}</h{level}>")
        elif line.startswith("- "):
            body.append(f"<li>{html.escape(line[2:]).replace('**', '')}</li>")
        elif line.strip():
            body.append(f"<p>{html.escape(line)}</p>")
    flush()
    style = ("body{font-family:system-ui,sans-serif;margin:2em;max-width:1400px}table{border-collapse:collapse;"
             "margin:1em 0;font-size:13px}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}"
             "th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}")
    return f"<!doctype html><html><head><meta charset='utf-8'><title>faprof report</title><style>{style}</style></head><body>{''.join(body)}</body></html>"


def write_reports(bundle: Bundle, dest: str | Path, formats: tuple[str, ...] = ("md", "html", "csv")) -> list[Path]:
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    written = []
    if "md" in formats:
        p = dest / "report.md"
        p.write_text(render_markdown(bundle), encoding="utf-8")
        written.append(p)
    if "html" in formats:
        p = dest / "report.html"
        p.write_text(render_html(bundle), encoding="utf-8")
        written.append(p)
    if "csv" in formats:
        from faprof.store import export_csv

        written += export_csv(bundle, dest / "csv")
    return written


def compare_runs(a: Bundle, b: Bundle) -> pd.DataFrame:
    """Row-by-row comparison of two runs on (variant, shape_id): medians, ratio, and whether the
    95% confidence intervals overlap (a quick significance read; the app runs a proper test)."""
    da, db = a.measurements(), b.measurements()
    keys = ["variant", "shape_id"]
    cols = [*keys, "status", "median_ms", "ci95_low_ms", "ci95_high_ms", "tflops"]
    m = da[[c for c in cols if c in da]].merge(db[[c for c in cols if c in db]], on=keys, suffixes=("_a", "_b"))
    m["ratio_b_over_a"] = m["median_ms_b"] / m["median_ms_a"]
    overlap = ~((m["ci95_high_ms_b"] < m["ci95_low_ms_a"]) | (m["ci95_low_ms_b"] > m["ci95_high_ms_a"]))
    known = m[["ci95_low_ms_a", "ci95_high_ms_a", "ci95_low_ms_b", "ci95_high_ms_b"]].notna().all(axis=1)
    m["ci_overlap"] = overlap.astype("boolean").where(known, pd.NA)
    return m
