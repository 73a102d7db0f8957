"""What a measured row implies: FLOPs, TFLOP/s, GB/s, % of the GPU's peak and of its measured ceiling.

The one place faprof looks up a GPU's peaks for a row (`peak_for`, `peak_clock_for`, `bandwidth_for`):
the runner derives every row with it, and analyses and the advisor ask it rather than the database.
"""

from __future__ import annotations

import math
from typing import Any

from faprof.model import gpus
from faprof.model.problem import AttentionProblem


def peak_for(env: dict[str, Any], dtype: str, compute: str) -> tuple[float | None, str]:
    """The peak TFLOP/s used for '% of peak' on this run's GPU, and a label saying which one."""
    name = env.get("gpu_name")
    if not name:
        return None, "no GPU"
    spec = gpus.lookup(name)
    if spec is None:
        return None, "unknown GPU: measured figures only"
    return gpus.peak_tflops(spec, dtype, compute)


def peak_clock_for(env: dict[str, Any], compute: str = "cuda_core", dtype: str = "fp32") -> float | None:
    """The SM clock the GPU database's peak for (compute, dtype) assumes, if known."""
    name = env.get("gpu_name")
    spec = gpus.lookup(name) if name else None
    return spec.peak_clock_mhz(compute, dtype) if spec is not None and spec.known else None


def bandwidth_for(env: dict[str, Any]) -> float | None:
    """The GPU's datasheet DRAM bandwidth in GB/s, if known."""
    name = env.get("gpu_name")
    spec = gpus.lookup(name) if name else None
    return getattr(spec, "mem_bw_gbs", None) if spec else None


def ridge_for(env: dict[str, Any], dtype: str) -> float | None:
    """The GPU's ridge point in FLOP per byte: its tensor matmul ceiling over its DRAM bandwidth, measured
    (the run's matmul and copy ceilings) where the run has them, else from the datasheet."""
    ceil = env.get("ceilings") or {}
    key = f"matmul_{dtype}_tflops" if dtype in ("fp16", "bf16") else "matmul_fp32_tflops"
    if ceil.get(key) and ceil.get("copy_gbs"):
        return ceil[key] * 1e12 / (ceil["copy_gbs"] * 1e9)
    peak, _ = peak_for(env, dtype if dtype in ("fp16", "bf16") else "fp16", "tensor")
    bw = bandwidth_for(env)
    return peak * 1e12 / (bw * 1e9) if peak and bw else None


def derive(problem: AttentionProblem, variant, row: dict[str, Any], env: dict[str, Any]) -> dict[str, Any]:
    """Work counts and rates for one measured row: FLOPs, TFLOP/s, GB/s, % of peak, footprints, and
    which bound applies (a memory-bound row's headline is its GB/s against the measured copy ceiling)."""
    out: dict[str, Any] = {
        "bound": problem.bound(ridge_for(env, problem.dtype)),
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
        if ceil.get("copy_gbs"):
            out["copy_gbs"] = ceil["copy_gbs"]
            out["pct_copy"] = 100.0 * out["gbps"] / ceil["copy_gbs"]
        key = f"matmul_{problem.dtype}_tflops" if variant.compute == "tensor" and problem.dtype in ("fp16", "bf16") else "matmul_fp32_tflops"
        if variant.compute == "tensor" and problem.dtype == "fp32" and ceil.get("matmul_tf32_tflops"):
            key = "matmul_tf32_tflops"  # fp32 attention on tensor cores runs as (emulated) TF32
        if ceil.get(key):
            out["pct_measured_ceiling"] = 100.0 * out["tflops"] / ceil[key]
            out["measured_ceiling_tflops"] = ceil[key]
    return out
