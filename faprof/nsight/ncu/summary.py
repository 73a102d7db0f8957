"""ncu_summary: one row per profiled kernel launch, plus one "(all)" row per (variant, shape_id).

One of the derived tables of `faprof.nsight.ncu.tables` (import `summarize` and SUMMARY_COLUMNS from here).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import pandas as pd

from faprof.nsight.ncu.catalogue_core import ALL_KERNELS
from faprof.nsight.ncu.launch_metrics import (
    _dims,
    _Launch,
    _launches,
    _nan_sum,
    _problem_flops,
    _ratio,
    _sort_launches_first,
    hardware_flops,
    occupancy_limiter,
    plan_index,
)

#: Summary columns, in order (every one present in every summary, NaN where not collected).
SUMMARY_COLUMNS = (
    "variant",
    "shape_id",
    "kernel",
    "kernel_id",
    "launch",
    "kernels",
    "kernel_demangled",
    "nvtx",
    "cc",
    "duration_ms",
    "grid_size",
    "block_size",
    "grid",
    "block",
    "waves_per_sm",
    "registers_per_thread",
    "smem_static_bytes",
    "smem_dynamic_bytes",
    "smem_per_block_bytes",
    "smem_driver_bytes",
    "theoretical_occupancy_pct",
    "achieved_occupancy_pct",
    "occupancy_limiter",
    "occupancy_limit_registers",
    "occupancy_limit_shared_memory",
    "occupancy_limit_warps",
    "occupancy_limit_blocks",
    "sm_throughput_pct",
    "memory_throughput_pct",
    "dram_throughput_pct",
    "dram_read_bytes",
    "dram_write_bytes",
    "dram_bytes",
    "dram_gbs",
    "l2_hit_rate_pct",
    "l1_hit_rate_pct",
    "tensor_pipe_util_pct",
    "tensor_fp_util_pct",
    "tensor_hmma_inst",
    "tensor_gmma_inst",
    "smem_bank_conflicts_ld",
    "smem_bank_conflicts_st",
    "smem_bank_conflicts",
    "local_ld_sectors",
    "local_st_sectors",
    "spill_requests",
    "spill_inst",
    "global_ld_sectors",
    "global_ld_requests",
    "global_ld_sectors_per_request",
    "global_excessive_sectors",
    "smem_wavefronts",
    "smem_inst",
    "smem_wavefronts_per_inst",
    "smem_excessive_wavefronts",
    "fma_pipe_util_pct",
    "l2_throughput_pct",
    "replay_passes",
    "fp32_flops",
    "fp16_flops",
    "fp64_flops",
    "tensor_flops",
    "hw_flops",
    "tensor_flops_method",
    "analytic_flops",
    "hw_over_analytic",
    "hw_tflops",
    "analytic_tflops",
    "sm_clock_hz",
    "sm_count",
)

#: Columns an aggregate "(all)" row holds as the sum over its pair's launches.
_SUMMED_COLUMNS = (
    "dram_read_bytes",
    "dram_write_bytes",
    "dram_bytes",
    "smem_bank_conflicts_ld",
    "smem_bank_conflicts_st",
    "smem_bank_conflicts",
    "local_ld_sectors",
    "local_st_sectors",
    "spill_requests",
    "spill_inst",
    "global_ld_sectors",
    "global_ld_requests",
    "global_excessive_sectors",
    "smem_wavefronts",
    "smem_inst",
    "smem_excessive_wavefronts",
    "fp32_flops",
    "fp16_flops",
    "fp64_flops",
    "tensor_flops",
    "hw_flops",
    "tensor_hmma_inst",
    "tensor_gmma_inst",
)


def _advisor_counts(lz: _Launch) -> dict[str, float]:
    """The advisor's counters of one launch: local memory (spills), global coalescing, shared wavefronts.

    smem_wavefronts_per_inst: shared-memory wavefronts per shared load/store instruction (1 for
    conflict-free 32-bit accesses; 32 for a 32-way bank conflict; 2-4 for conflict-free 64/128-bit
    ones). global_ld_sectors_per_request: 4 when a warp's 32-bit loads are fully coalesced.
    """
    wl, ws = lz.get("smem_wavefronts_ld", False), lz.get("smem_wavefronts_st", False)
    il, is_ = lz.get("smem_inst_ld", False), lz.get("smem_inst_st", False)
    waves = _nan_sum([wl, ws]) if not (math.isnan(wl) and math.isnan(ws)) else math.nan
    inst = _nan_sum([il, is_]) if not (math.isnan(il) and math.isnan(is_)) else math.nan
    sectors, requests = lz.get("global_ld_sectors", False), lz.get("global_ld_requests", False)
    per_req = lz.get("global_ld_sectors_per_request", False)
    return {
        "local_ld_sectors": lz.get("local_ld_sectors", False),
        "local_st_sectors": lz.get("local_st_sectors", False),
        "spill_requests": lz.get("spill_requests", False),
        "spill_inst": lz.get("spill_inst", False),
        "global_ld_sectors": sectors,
        "global_ld_requests": requests,
        "global_ld_sectors_per_request": per_req if not math.isnan(per_req) else _ratio(sectors, requests),
        "global_excessive_sectors": lz.get("global_excessive_sectors", False),
        "smem_wavefronts": waves,
        "smem_inst": inst,
        "smem_wavefronts_per_inst": _ratio(waves, inst),
        "smem_excessive_wavefronts": lz.get("smem_excessive_wavefronts", False),
        "fma_pipe_util_pct": lz.get("fma_pipe_util"),
        "l2_throughput_pct": lz.get("l2_throughput"),
        "replay_passes": lz.get("replay_passes", False),
    }



def _throughput_columns(lz: _Launch, duration_s: float) -> dict[str, Any]:
    """A launch's throughputs, DRAM traffic and bandwidth, cache hit rates, tensor pipes and bank conflicts."""
    rd, wr = lz.get("dram_bytes_read"), lz.get("dram_bytes_write")
    dram = rd + wr if not (math.isnan(rd) or math.isnan(wr)) else math.nan
    bw = lz.get("dram_bytes_per_second")
    if math.isnan(bw) and not math.isnan(dram) and duration_s > 0:
        bw = dram / duration_s
    ld, st = lz.get("smem_bank_conflicts_ld", False), lz.get("smem_bank_conflicts_st", False)
    conflicts = lz.get("smem_bank_conflicts", False)
    if math.isnan(conflicts) and not (math.isnan(ld) and math.isnan(st)):
        conflicts = _nan_sum([ld, st])
    return {
        "sm_throughput_pct": lz.get("sm_throughput"),
        "memory_throughput_pct": lz.get("memory_throughput"),
        "dram_throughput_pct": lz.get("dram_throughput"),
        "dram_read_bytes": rd,
        "dram_write_bytes": wr,
        "dram_bytes": dram,
        "dram_gbs": bw / 1e9,
        "l2_hit_rate_pct": lz.get("l2_hit_rate"),
        "l1_hit_rate_pct": lz.get("l1_hit_rate"),
        "tensor_pipe_util_pct": lz.get("tensor_util"),
        "tensor_fp_util_pct": lz.get("tensor_fp_util"),
        "tensor_hmma_inst": lz.get("tensor_hmma_inst", False),
        "tensor_gmma_inst": lz.get("tensor_gmma_inst", False),
        "smem_bank_conflicts_ld": ld,
        "smem_bank_conflicts_st": st,
        "smem_bank_conflicts": conflicts,
    }


def _flop_columns(flops: Mapping[str, Any], analytic: float, duration_s: float) -> dict[str, Any]:
    """A launch's FLOPs (`hardware_flops`), the pair's analytic count, and the hardware FLOP rate."""
    return {
        "fp32_flops": flops["fp32"],
        "fp16_flops": flops["fp16"],
        "fp64_flops": flops["fp64"],
        "tensor_flops": flops["tensor"],
        "hw_flops": flops["total"],
        "tensor_flops_method": flops["tensor_method"],
        "analytic_flops": analytic,
        "hw_tflops": flops["total"] / duration_s / 1e12 if duration_s > 0 else math.nan,
    }


def _launch_row(
    ident: Mapping[str, Any], lz: _Launch, plan_idx: Mapping[tuple[str, str], Mapping[str, Any]]
) -> dict[str, Any]:
    """One launch's ncu_summary row (SUMMARY_COLUMNS; NaN where the report lacks a metric)."""
    duration_s = lz.get("duration")
    static, dynamic = lz.get("smem_static"), lz.get("smem_dynamic")
    analytic = _problem_flops(plan_idx, ident["variant"], ident["shape_id"])
    row: dict[str, Any] = dict.fromkeys(SUMMARY_COLUMNS, math.nan)
    row.update(
        variant=ident["variant"],
        shape_id=ident["shape_id"],
        kernel=ident.get("kernel"),
        kernel_id=int(ident["kernel_id"]),
        launch=int(ident.get("launch", 0)),
        kernels=1,
        kernel_demangled=ident.get("kernel_demangled"),
        nvtx=ident.get("nvtx"),
        cc=lz.cc,
        duration_ms=duration_s * 1e3,
        grid_size=lz.get("grid_size", False),
        block_size=lz.get("block_size", False),
        grid=_dims(lz, "grid"),
        block=_dims(lz, "block"),
        waves_per_sm=lz.get("waves_per_sm", False),
        registers_per_thread=lz.get("registers_per_thread", False),
        smem_static_bytes=static,
        smem_dynamic_bytes=dynamic,
        smem_per_block_bytes=_nan_sum([static, dynamic])
        if not (math.isnan(static) and math.isnan(dynamic))
        else math.nan,
        smem_driver_bytes=lz.get("smem_driver"),
        theoretical_occupancy_pct=lz.get("theoretical_occupancy"),
        achieved_occupancy_pct=lz.get("achieved_occupancy"),
        occupancy_limiter=occupancy_limiter(lz),
        occupancy_limit_registers=lz.get("occupancy_limit_registers", False),
        occupancy_limit_shared_memory=lz.get("occupancy_limit_shared_memory", False),
        occupancy_limit_warps=lz.get("occupancy_limit_warps", False),
        occupancy_limit_blocks=lz.get("occupancy_limit_blocks", False),
        **_throughput_columns(lz, duration_s),
        **_advisor_counts(lz),
        **_flop_columns(hardware_flops(lz), analytic, duration_s),
        sm_clock_hz=lz.get("sm_clock"),
        sm_count=lz.get("sm_count", False),
    )
    return row


def _pair_row(variant: Any, shape_id: Any, g: pd.DataFrame) -> dict[str, Any]:
    """The "(all)" row of one (variant, shape_id): sums over its launch rows `g`, the pair's analytic
    FLOPs and the rates over the summed duration; per-launch-only columns stay NaN."""
    row: dict[str, Any] = dict.fromkeys(SUMMARY_COLUMNS, math.nan)
    duration_ms = _nan_sum(g["duration_ms"])
    hw = _nan_sum(g["hw_flops"])
    analytic = g["analytic_flops"].iloc[0]
    row.update(
        variant=variant,
        shape_id=shape_id,
        kernel=ALL_KERNELS,
        kernel_id=-1,
        launch=-1,
        kernels=len(g),
        cc=g["cc"].iloc[0],
        duration_ms=duration_ms,
        **{c: _nan_sum(g[c]) for c in _SUMMED_COLUMNS},
        analytic_flops=analytic,
        hw_over_analytic=hw / analytic if analytic and not math.isnan(analytic) else math.nan,
        hw_tflops=hw / (duration_ms * 1e-3) / 1e12 if duration_ms and duration_ms > 0 else math.nan,
        analytic_tflops=analytic / (duration_ms * 1e-3) / 1e12
        if duration_ms and duration_ms > 0
        else math.nan,
        sm_count=g["sm_count"].iloc[0],
    )
    if row["dram_bytes"] is not None and not math.isnan(row["dram_bytes"]) and duration_ms > 0:
        row["dram_gbs"] = row["dram_bytes"] / (duration_ms * 1e-3) / 1e9
    return row


def summarize(metrics: pd.DataFrame, plan: Mapping[str, Any] | None = None) -> pd.DataFrame:
    """ncu_summary: one row per profiled launch, plus a `kernel == "(all)"` row per (variant, shape_id).

    Args:
        metrics: the long table from `faprof.nsight.ncu.read_report` (ncu_metrics.parquet).
        plan: the target's plan (JSON dict) to join each (variant, shape_id) to its problem and
            its analytic FLOPs; None leaves analytic columns NaN.

    Returns:
        Columns SUMMARY_COLUMNS. Launch rows have `kernels == 1` and `launch` >= 0. Aggregate rows
        have kernel "(all)", launch -1, kernel_id -1, and hold sums over the pair's launches
        (duration, DRAM bytes, FLOPs, bank conflicts), `kernels` = number of launches, the analytic
        FLOPs and hw_over_analytic = hardware / analytic FLOPs; their per-launch-only columns
        (occupancy, grid...) are NaN. Launches without a variant (outside faprof's NVTX ranges)
        are left out. analytic_flops is the pair's count, repeated on each launch row.
    """
    plan_idx = plan_index(plan)
    rows: list[dict[str, Any]] = [
        _launch_row(ident, lz, plan_idx) for ident, lz in _launches(metrics) if ident.get("variant")
    ]
    if not rows:
        return pd.DataFrame(columns=list(SUMMARY_COLUMNS))
    launches = pd.DataFrame(rows, columns=list(SUMMARY_COLUMNS))
    agg_rows: list[dict[str, Any]] = [
        _pair_row(variant, shape_id, g)
        for (variant, shape_id), g in launches.groupby(["variant", "shape_id"], sort=False)
    ]
    out = pd.concat([launches, pd.DataFrame(agg_rows, columns=list(SUMMARY_COLUMNS))], ignore_index=True)
    out = _sort_launches_first(out)
    for c in ("kernel_id", "launch", "kernels"):
        out[c] = out[c].astype("int64")
    return out
