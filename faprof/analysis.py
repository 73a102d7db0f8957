"""Analysis of measurement tables: throughput, % of peak, bandwidth, speedups, scaling.

Each function takes a DataFrame (a bundle's measurements, or several merged) and returns a new
one; nothing here re-runs a kernel. The CLI, the reports and the app all call these.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from faprof.problem import AttentionProblem

#: Row statuses, in the order tables sort them.
STATUSES = ("ok", "wrong", "failed", "unsupported", "skipped")

#: Statuses that carry a timing (a wrong variant is still timed, and flagged).
TIMED = ("ok", "wrong")


def peak_for(env: dict[str, Any], dtype: str, compute: str) -> tuple[float | None, str]:
    """The peak TFLOP/s used for '% of peak' on this run's GPU, and a label saying which one."""
    from faprof import gpus

    name = env.get("gpu_name")
    if not name:
        return None, "no GPU"
    spec = gpus.lookup(name)
    if spec is None:
        return None, "unknown GPU: measured figures only"
    return gpus.peak_tflops(spec, dtype, compute)


def peak_clock_for(env: dict[str, Any], compute: str = "cuda_core", dtype: str = "fp32") -> float | None:
    """The SM clock the GPU database's peak for (compute, dtype) assumes, if known."""
    from faprof import gpus

    name = env.get("gpu_name")
    spec = gpus.lookup(name) if name else None
    return spec.peak_clock_mhz(compute, dtype) if spec is not None and spec.known else None


def bandwidth_for(env: dict[str, Any]) -> float | None:
    from faprof import gpus

    name = env.get("gpu_name")
    spec = gpus.lookup(name) if name else None
    return getattr(spec, "mem_bw_gbs", None) if spec else None


def derive(problem: AttentionProblem, variant, row: dict[str, Any], env: dict[str, Any]) -> dict[str, Any]:
    """Work counts and rates for one measured row: FLOPs, TFLOP/s, GB/s, % of peak, footprints."""
    out: dict[str, Any] = {
        "flops": problem.flops(),
        "min_bytes": problem.min_bytes(),
        "footprint_standard_bytes": problem.footprint_bytes("standard"),
        "footprint_flash_bytes": problem.footprint_bytes("flash"),
        "tokens": problem.tokens(),
    }
    ms = row.get("median_ms")
    if ms is None or not isinstance(ms, int | float) or math.isnan(ms) or ms <= 0:
        return out
    out["tflops"] = problem.flops() / (ms * 1e-3) / 1e12
    out["gbps"] = problem.min_bytes() / (ms * 1e-3) / 1e9
    out["tokens_per_s"] = problem.tokens() / (ms * 1e-3)
    if row.get("device") == "cuda":
        peak, label = peak_for(env, problem.dtype, variant.compute)
        boost = peak_clock_for(env, variant.compute, problem.dtype)
        if boost:
            label = f"{label} at {boost:.0f} MHz"
        out["peak_tflops"], out["peak_label"], out["peak_clock_mhz"] = peak, label, boost
        if peak:
            out["pct_peak"] = 100.0 * out["tflops"] / peak
            clock = row.get("sm_clock_mhz")
            if boost and isinstance(clock, int | float) and clock > 0 and not math.isnan(clock):
                # the datasheet peak scales with the clock: what this row could reach at the clock it ran at
                out["pct_peak_at_clock"] = 100.0 * out["tflops"] / (peak * clock / boost)
        bw = bandwidth_for(env)
        if bw:
            out["mem_bw_gbs"] = bw
            out["pct_bw"] = 100.0 * out["gbps"] / bw
        ceil = (env.get("ceilings") or {})
        key = f"matmul_{problem.dtype}_tflops" if variant.compute == "tensor" and problem.dtype in ("fp16", "bf16") else "matmul_fp32_tflops"
        if variant.compute == "tensor" and problem.dtype == "fp32" and ceil.get("matmul_tf32_tflops"):
            key = "matmul_tf32_tflops"  # fp32 attention on tensor cores runs as (emulated) TF32
        if ceil.get(key):
            out["pct_measured_ceiling"] = 100.0 * out["tflops"] / ceil[key]
            out["measured_ceiling_tflops"] = ceil[key]
    return out


def with_speedups(df: pd.DataFrame, baseline: str, group_baselines: dict[str, str] | None = None) -> pd.DataFrame:
    """Add `baseline` (the variant each row is compared with), `baseline_ms` and `speedup` =
    baseline median / row median, per (run, shape_id); >1 means faster than the baseline.

    `group_baselines` maps a group name to its own baseline (rows of other groups use `baseline`).
    Only timed rows of the baseline count; rows without a timed baseline get NaN.
    """
    if df.empty:
        return df.assign(speedup=pd.Series(dtype=float))
    keys = ["shape_id"] + (["run_id"] if "run_id" in df.columns else [])
    out = df.drop(columns=[c for c in ("baseline", "baseline_ms", "speedup") if c in df.columns])
    groups = out["group"] if "group" in out.columns else pd.Series("", index=out.index)
    out["baseline"] = [(group_baselines or {}).get(g, baseline) for g in groups]
    base = out[out["status"].isin(TIMED)][[*keys, "variant", "median_ms"]]
    base = base.rename(columns={"variant": "baseline", "median_ms": "baseline_ms"})
    out = out.merge(base, on=[*keys, "baseline"], how="left")
    out["speedup"] = out["baseline_ms"] / out["median_ms"]
    out.loc[~out["status"].isin(TIMED), "speedup"] = float("nan")
    return out


def baselines_of(manifest: dict[str, Any]) -> tuple[str, dict[str, str]]:
    """(the scenario's baseline, {group: baseline} for groups with their own) from a bundle manifest."""
    scen = manifest.get("scenario", {})
    default = scen.get("baseline", "")
    groups = {}
    for i, g in enumerate((scen.get("raw") or {}).get("groups", []) or []):
        # unnamed groups are called "groups[i]", as scenarios._group names them
        if isinstance(g, dict) and g.get("baseline"):
            groups[g.get("name", f"groups[{i}]")] = g["baseline"]
    return default, groups


def speedups_for(bundle_measurements: pd.DataFrame, manifest: dict[str, Any]) -> pd.DataFrame:
    """with_speedups using the baselines the bundle's scenario names."""
    default, groups = baselines_of(manifest)
    return with_speedups(bundle_measurements, default, groups)


def ranking(df: pd.DataFrame) -> pd.DataFrame:
    """Variants ranked by median TFLOP/s over the timed rows (for README-style tables)."""
    t = df[df["status"].isin(TIMED)]
    if t.empty:
        return pd.DataFrame()
    agg = t.groupby("variant").agg(
        rows=("shape_id", "count"), median_tflops=("tflops", "median"), max_tflops=("tflops", "max"),
        median_pct_peak=("pct_peak", "median") if "pct_peak" in t else ("tflops", "size"),
        median_speedup=("speedup", "median") if "speedup" in t else ("tflops", "size"),
        wrong=("status", lambda s: int((s == "wrong").sum())),
    )
    return agg.sort_values("median_tflops", ascending=False).reset_index()


def scaling(df: pd.DataFrame, variant: str, axis: str = "B") -> pd.DataFrame:
    """Strong/weak scaling as in report 002: throughput over an axis relative to its smallest value.

    For each group of rows that differ only in `axis`, speedup vs smallest = (work/time) ratio and
    efficiency = speedup / (axis ratio).
    """
    t = df[(df["variant"] == variant) & df["status"].isin(TIMED)].copy()
    if t.empty:
        return pd.DataFrame()
    others = [c for c in ("B", "H", "Sq", "Sk", "D", "dtype", "causal", "direction") if c != axis]
    rows = []
    for _, g in t.groupby(others):
        if len(g) < 2:
            continue
        g = g.sort_values(axis)
        base = g.iloc[0]
        for _, r in g.iterrows():
            ratio = r[axis] / base[axis]
            thr_speedup = (r["flops"] / r["median_ms"]) / (base["flops"] / base["median_ms"])
            rows.append({**{c: r[c] for c in others}, axis: r[axis], "median_ms": r["median_ms"],
                         "throughput_vs_smallest": thr_speedup, "efficiency_pct": 100 * thr_speedup / ratio})
    return pd.DataFrame(rows)


def fwd_bwd_table(df: pd.DataFrame, variant: str) -> pd.DataFrame:
    """Report 002's 'Forward | Backward | ratio | total' table from fwd and bwd rows of one variant."""
    t = df[(df["variant"] == variant) & df["status"].isin(TIMED)]
    if t.empty:
        return pd.DataFrame()
    cols = ["B", "H", "Sq", "Sk", "D", "dtype", "causal"]
    f = t[t["direction"] == "fwd"][[*cols, "median_ms"]].rename(columns={"median_ms": "fwd_ms"})
    b = t[t["direction"] == "bwd"][[*cols, "median_ms"]].rename(columns={"median_ms": "bwd_ms"})
    fb = t[t["direction"] == "fwd_bwd"][[*cols, "median_ms"]].rename(columns={"median_ms": "fwd_bwd_ms"})
    out = f.merge(b, on=cols, how="inner").merge(fb, on=cols, how="left")
    out["bwd_over_fwd"] = out["bwd_ms"] / out["fwd_ms"]
    return out


def memory_table(df: pd.DataFrame, standard: str = "torch_standard", flash: str = "sdpa_flash") -> pd.DataFrame:
    """Report 002's memory table: measured peak extra memory of a standard and a flash variant per
    sequence length, beside the analytic footprints, and the reduction factor."""
    t = df[df["status"].isin(TIMED) & df["variant"].isin([standard, flash])]
    if t.empty or "extra_mem_bytes" not in t:
        return pd.DataFrame()
    cols = ["B", "H", "Sq", "Sk", "D", "dtype", "causal", "direction"]
    piv = t.pivot_table(index=cols, columns="variant", values="extra_mem_bytes", aggfunc="first").reset_index()
    an = t.drop_duplicates(cols)[[*cols, "footprint_standard_bytes", "footprint_flash_bytes"]]
    out = piv.merge(an, on=cols, how="left")
    if standard in out and flash in out:
        out["measured_reduction"] = out[standard] / out[flash]
    out["analytic_reduction"] = out["footprint_standard_bytes"] / out["footprint_flash_bytes"]
    return out


# ------------------------------------------------------------------------------ the advisor
#: Thresholds of the advisor, each with its reason.
#: A grid with fewer blocks than SMs leaves SMs idle for the whole kernel (report 003: 2 CTAs on 58 SMs).
ADVISE_MIN_BLOCKS_PER_SM = 1.0
#: Under this theoretical occupancy a latency-bound kernel rarely has enough warps to hide memory latency.
ADVISE_LOW_OCCUPANCY_PCT = 25.0
#: DRAM or SM throughput above this share of peak means that unit is the bottleneck.
ADVISE_BUSY_PCT = 60.0
#: When both SM and memory throughput are under this, the kernel is latency-bound (neither is busy).
ADVISE_IDLE_PCT = 40.0
#: Hardware FLOPs this much above the analytic count mean wasted work (masked tiles, recomputation).
ADVISE_EXTRA_FLOPS = 1.3
#: A stall reason with at least this share of stall cycles is worth naming.
ADVISE_STALL_SHARE = 0.2
#: When enqueuing a call costs the host at least this fraction of the call's GPU time, the host
#: cannot keep the GPU fed in a loop of such calls: launch overhead bounds the throughput.
ADVISE_LAUNCH_BOUND = 1.0

#: What each warp stall reason means and what usually fixes it (Nsight Compute's stall reasons).
STALL_ADVICE = {
    "long_scoreboard": ("warps wait for global/local memory (L1TEX) results",
                        "prefetch the next tile with cp.async / TMA, keep more loads in flight, check for register spills"),
    "short_scoreboard": ("warps wait for shared memory or special-function (exp) results",
                         "fewer dependent shared-memory reads (ldmatrix, registers), exp2 with the scale folded in"),
    "mio_throttle": ("the shared-memory instruction queue is full",
                     "wider shared-memory accesses (128-bit, ldmatrix) and fewer of them"),
    "lg_throttle": ("the global-memory instruction queue is full",
                    "vectorize global loads (16 bytes per thread) or stage through cp.async"),
    "barrier": ("warps wait at __syncthreads", "fewer block-wide barriers, balance work between warps"),
    "math_pipe_throttle": ("a math pipe is saturated", "good when it is the tensor pipe; otherwise move math to tensor cores"),
    "wait": ("fixed-latency dependencies between instructions", "more independent work per warp (ILP), unroll"),
    "not_selected": ("warps are ready but another was picked: the scheduler is busy", "compute-bound at issue"),
    "selected": ("warps are issuing", "compute-bound at issue"),
    "no_instructions": ("instruction-cache misses or branch targets", "smaller unrolled code"),
    "tex_throttle": ("the texture/L1 pipe is full", "fewer or wider memory instructions"),
    "membar": ("memory fences", "fewer fences"),
    "branch_resolving": ("branch target computation", "fewer divergent branches"),
    "dispatch_stall": ("the dispatcher stalled", "rare; check for pipe conflicts"),
    "drain": ("stores draining at exit", "normal at kernel end"),
    "sleeping": ("warps sleeping (nanosleep or barrier arrive/wait)", "check producer/consumer balance"),
    "gmma": ("waiting on warpgroup MMA (wgmma) results", "deeper pipelining of wgmma"),
    "warpgroup_arrive": ("waiting at warpgroup arrive", "balance warpgroups"),
}


def _num(x: Any) -> float:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return float("nan")
    return v


def advise(measurements: pd.DataFrame, ncu_summary: pd.DataFrame | None = None, stalls: pd.DataFrame | None = None,
           nsys_summary: pd.DataFrame | None = None) -> pd.DataFrame:
    """Why each (variant, shape) is as fast as it is, and what to change: one row per finding.

    Columns: variant, shape_id, kernel, category, finding (the evidence, with numbers), suggestion.
    Uses whatever tables the bundle has: the harness's timings (launch-bound calls, wrong results),
    the ncu summary (grid size vs SMs, occupancy and its limiter, SM vs DRAM throughput, bank
    conflicts, hardware vs analytic FLOPs), the stall reasons and the nsys timeline (kernels per
    call, idle gaps). Every finding quotes the figures it rests on.
    """
    rows: list[dict[str, Any]] = []

    def add(v, sid, kernel, cat, finding, suggestion):
        rows.append({"variant": v, "shape_id": sid, "kernel": kernel, "category": cat, "finding": finding,
                     "suggestion": suggestion})

    m = measurements if measurements is not None else pd.DataFrame()
    for _, r in m.iterrows():
        if r.get("status") == "wrong":
            add(r["variant"], r["shape_id"], "", "correctness",
                f"output differs from the {r.get('reference')} reference: max abs {_num(r.get('max_abs_err')):.3g}, "
                f"rel {_num(r.get('rel_err')):.3g}", "fix correctness before reading any timing")
        enq, med, g = _num(r.get("host_enqueue_ms")), _num(r.get("median_ms")), _num(r.get("graph_ms"))
        if enq == enq and med == med and med > 0 and enq >= ADVISE_LAUNCH_BOUND * med:
            graph = f"; a CUDA-graph replay takes {g:.4g} ms (warm L2)" if g == g else ""
            add(r["variant"], r["shape_id"], "", "launch overhead",
                f"the host needs {enq:.3g} ms to enqueue a call whose GPU work takes {med:.4g} ms{graph}",
                "capture the call in a CUDA graph, fuse kernels, or cut host-side work per call")

    s = ncu_summary if ncu_summary is not None else pd.DataFrame()
    if not s.empty:
        per = s[s["kernel"] != "(all)"] if "kernel" in s else s
        for _, r in per.iterrows():
            v, sid, k = r.get("variant"), r.get("shape_id"), str(r.get("kernel"))
            grid, sms = _num(r.get("grid_size")), _num(r.get("sm_count"))
            if grid == grid and sms == sms and grid < ADVISE_MIN_BLOCKS_PER_SM * sms:
                add(v, sid, k, "parallelism",
                    f"grid of {grid:.0f} blocks on {sms:.0f} SMs: {sms - grid:.0f} SMs have nothing to do "
                    f"({100 * grid / sms:.1f}% of the SMs busy)",
                    "launch more blocks: a block per query tile per head (FA2's grid), or split the K/V loop")
            occ, lim = _num(r.get("achieved_occupancy_pct")), r.get("occupancy_limiter")
            theo, waves = _num(r.get("theoretical_occupancy_pct")), _num(r.get("waves_per_sm"))
            if waves == waves and waves < 1 and grid == grid and sms == sms and grid >= sms:
                add(v, sid, k, "parallelism",
                    f"the grid fills {100 * waves:.0f}% of one wave ({grid:.0f} blocks; achieved occupancy {occ:.1f}%): "
                    f"the SMs could hold more resident blocks than there are",
                    "more, smaller blocks (smaller query tiles) or more work per launch (batch heads)")
            if theo == theo and theo < ADVISE_LOW_OCCUPANCY_PCT:
                add(v, sid, k, "occupancy",
                    f"theoretical occupancy {theo:.1f}% (achieved {occ:.1f}%), limited by {lim}: "
                    f"{_num(r.get('registers_per_thread')):.0f} registers/thread, "
                    f"{_num(r.get('smem_per_block_bytes')) / 1024:.1f} KiB shared memory/block",
                    {"registers": "cap registers (__launch_bounds__) or keep fewer values live",
                     "shared memory": "smaller tiles or fewer pipeline stages per block"}.get(str(lim),
                    "more warps per block or more blocks per SM") + " — or accept it if the kernel hides latency with ILP")
            smt, dram = _num(r.get("sm_throughput_pct")), _num(r.get("dram_throughput_pct"))
            memt = _num(r.get("memory_throughput_pct"))
            if dram == dram and dram >= ADVISE_BUSY_PCT:
                add(v, sid, k, "memory-bound",
                    f"DRAM at {dram:.0f}% of peak ({_num(r.get('dram_gbs')):.0f} GB/s) while the SMs are at {smt:.0f}%",
                    "move fewer bytes: keep the score matrix on chip (fuse), reuse K/V tiles across more queries")
            elif smt == smt and smt >= ADVISE_BUSY_PCT:
                tp = _num(r.get("tensor_pipe_util_pct"))
                extra = f"; tensor pipe {tp:.0f}%" if tp == tp else ""
                add(v, sid, k, "compute-bound", f"SM throughput {smt:.0f}% of peak{extra}",
                    "use tensor cores (mma) if the math is on CUDA cores; otherwise the kernel is near its roof")
            elif smt == smt and memt == memt and smt < ADVISE_IDLE_PCT and memt < ADVISE_IDLE_PCT and (grid != grid or grid >= sms):
                add(v, sid, k, "latency-bound",
                    f"neither compute ({smt:.0f}%) nor memory ({memt:.0f}%) is busy: warps are waiting",
                    "more independent work in flight per SM (occupancy, ILP, async copies); see the stall reasons")
            bc = _num(r.get("smem_bank_conflicts"))
            if bc == bc and bc > 0:
                add(v, sid, k, "bank conflicts", f"{bc:,.0f} shared-memory bank conflicts",
                    "pad or XOR-swizzle shared-memory rows so a warp's accesses hit distinct banks")

        # Hardware vs analytic FLOPs per call: on the per-(variant, shape) rows ("(all)") when the
        # summary has them, else on single launches.
        calls = s[s["kernel"] == "(all)"] if "kernel" in s and (s["kernel"] == "(all)").any() else per
        for _, r in calls.iterrows():
            ratio = _num(r.get("hw_over_analytic"))
            if ratio == ratio and ratio > ADVISE_EXTRA_FLOPS:
                add(r.get("variant"), r.get("shape_id"), str(r.get("kernel")), "wasted work",
                    f"the hardware executed {ratio:.2f}x the analytic FLOPs per call (masked or padded tiles "
                    f"computed, recomputation, or index arithmetic counted as FP)",
                    "skip tiles that are fully masked (causal block skipping), avoid padding waste and recomputation")

    st = stalls if stalls is not None else pd.DataFrame()
    if not st.empty and "share" in st:
        src = "warp_state" if (st["source"] == "warp_state").any() else st["source"].iloc[0]
        st = st[(st["source"] == src) & (st["kernel"] != "(all)")]
        for (v, sid, k), g in st.groupby(["variant", "shape_id", "kernel"], sort=False):
            top = g.sort_values("share", ascending=False).iloc[0]
            if top["share"] >= ADVISE_STALL_SHARE:
                what, fix = STALL_ADVICE.get(top["reason"], (top["reason"], ""))
                add(v, sid, k, "stalls", f"top stall reason {top['reason']} ({100 * top['share']:.0f}% of stall cycles): {what}", fix)

    ns = nsys_summary if nsys_summary is not None else pd.DataFrame()
    if not ns.empty:
        for _, r in ns.iterrows():
            kpc, idle = _num(r.get("kernels_per_call")), _num(r.get("idle_us"))
            if kpc == kpc and kpc > 1:
                add(r.get("variant"), r.get("shape_id"), "", "kernels per call",
                    f"{kpc:.0f} kernels per call" + (f", {idle:.1f} µs idle between them per call" if idle == idle else ""),
                    "fuse the kernels so intermediates stay on chip and launches disappear")
    return pd.DataFrame(rows, columns=["variant", "shape_id", "kernel", "category", "finding", "suggestion"])
