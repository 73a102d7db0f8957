"""Tables derived from a report's metrics: ncu_summary, stalls, roofline (and the metric catalogue).

The catalogue itself (concepts -> metric names per compute capability, stall reasons, units) lives
in `faprof.nsight.ncu_catalogue`; its names are re-exported here, so `metrics.names_for(...)` and
`metrics.summarize(...)` are one import.

Derived tables (pure functions of the long metrics table that `faprof.nsight.ncu` reads from a
report, so the tests run them on recorded fixtures without a GPU):

- `summarize` -> ncu_summary: one row per kernel launch, plus one `kernel == "(all)"` row per
  (variant, shape_id) with the sums over its launches (duration, DRAM bytes, FLOPs, kernel count);
- `stall_table` -> stalls: each warp stall reason's share of the stall cycles of a launch;
- `roofline_table` -> roofline: arithmetic intensity and achieved FLOP/s per launch, with the
  ceilings from ncu's `*.peak_sustained` metrics and from faprof's GPU database.

A metric that a set did not collect gives NaN in every derived column that needs it, never an
exception: `--set basic` has no stall reasons, for instance.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pandas as pd

from faprof.model import gpus
from faprof.model.problem import AttentionProblem
from faprof.nsight.ncu.catalogue import (  # noqa: F401  (re-exported: metrics.X is the catalogue's X)
    ALL_KERNELS,
    CATALOGUE,
    CC_CHIPS,
    FLOPS_PER_INST,
    HMMA_16816_FLOPS,
    KEY_COLUMNS,
    KNOWN_CCS,
    NOT_A_STALL,
    OCCUPANCY_LIMITERS,
    PRECISION_OPS,
    STALL_REASONS,
    STALL_SOURCES,
    Concept,
    base_name,
    catalogue_metric_names,
    cc_key,
    concept,
    names_for,
    requested_metrics,
    stall_metric,
    unit_scale,
)

# ------------------------------------------------------------------------------- wide accessors


class _Launch:
    """The metrics of one kernel launch, read through the catalogue with units converted."""

    def __init__(self, values: Mapping[str, Any], units: Mapping[str, str], cc: str | None):
        self.values = values
        self.units = units
        self.cc = cc

    def raw(self, metric: str) -> float:
        v = self.values.get(metric)
        if v is None:
            return math.nan
        try:
            f = float(v)
        except (TypeError, ValueError):
            return math.nan
        return f

    def base(self, metric: str) -> float:
        """A metric in base units (seconds, bytes, bytes/second, cycles/second)."""
        v = self.raw(metric)
        if math.isnan(v):
            return v
        return v * unit_scale(self.units.get(metric))[0]

    def get(self, key: str, base_units: bool = True) -> float:
        """The first metric of concept `key` the launch holds, or NaN."""
        for name in names_for(key, self.cc):
            if name in self.values:
                v = self.base(name) if base_units else self.raw(name)
                if not math.isnan(v):
                    return v
        return math.nan

    def name_of(self, key: str) -> str | None:
        for name in names_for(key, self.cc):
            if name in self.values:
                return name
        return None


def _missing(x: Any) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x)) or x is pd.NA or x == ""


def _launches(metrics: pd.DataFrame) -> list[tuple[dict[str, Any], _Launch]]:
    """Group the long table by launch: (identity columns, accessor) per kernel launch, in report order."""
    if metrics.empty:
        return []
    out = []
    id_cols = [
        c
        for c in (
            "variant",
            "shape_id",
            "kernel",
            "kernel_demangled",
            "kernel_id",
            "launch",
            "nvtx",
            "cc",
            "gpu",
        )
        if c in metrics.columns
    ]
    for _, g in metrics.groupby("kernel_id", sort=True):
        first = g.iloc[0]
        ident = {c: (None if _missing(first[c]) else first[c]) for c in id_cols}
        values: dict[str, Any] = {}
        if "value" in g:
            num = g[g["value"].notna()]
            values.update(zip(num["metric"], num["value"], strict=True))
        units = dict(zip(g["metric"], g["unit"].fillna(""), strict=True)) if "unit" in g else {}
        cc = ident.get("cc") if isinstance(ident.get("cc"), str) and ident.get("cc") else None
        out.append((ident, _Launch(values, units, cc)))
    return out


# ---------------------------------------------------------------------------------- FLOP counting


def hardware_flops(launch: _Launch) -> dict[str, Any]:
    """FLOPs counted by the hardware for one launch, per precision, and how tensor FLOPs were counted.

    CUDA-core FLOPs are SASS thread instructions with all predicates true:
    fp32 = FADD + FMUL + 2*FFMA, fp16 = HADD + HMUL + 2*HFMA, fp64 = DADD + DMUL + 2*DFMA. Packed
    HFMA2/HADD2 instructions count once although they do two operations per thread, so fp16
    CUDA-core FLOPs can be undercounted by up to 2x, and ptxas also emits HFMA2 with zero operands
    to move constants into registers (ncu counts them: one per thread in tests/data/ncu's FFMA
    kernel), so fp16 CUDA-core FLOPs are approximate; special functions (exp, rsqrt) and integer
    work are not FLOPs. Tensor FLOPs are the tensor pipe's floating-point operations by source
    type (`tensor_ops_*`: fp16, bf16, tf32, fp64, fp8; 2 per multiply-add, HMMA and GMMA); when a
    report has none of those counters, warp-level HMMA instructions x HMMA_16816_FLOPS (exact for
    mma.sync m16n8k16 and wmma 16x16x16, double for an m16n8k8 kernel), less the HFMA2.MMA register
    moves where the chip counts them apart (the HMMA counter includes them). A precision is NaN when
    the report has none of its counters (ncu's basic set without faprof's extra metrics).

    Returns:
        {'fp32', 'fp16', 'fp64', 'tensor', 'total': FLOPs, 'tensor_method': str}.
    """
    out: dict[str, Any] = {}
    for prec, ops in PRECISION_OPS.items():
        total, seen = 0.0, False
        for op in ops:
            v = launch.get(f"inst_{op}", base_units=False)
            if not math.isnan(v):
                total += FLOPS_PER_INST[op] * v
                seen = True
        out[prec] = total if seen else math.nan
    ops_keys = [k for k in CATALOGUE if k.startswith("tensor_ops_")]
    found = {k: launch.get(k, base_units=False) for k in ops_keys if launch.name_of(k)}
    hmma = launch.get("tensor_hmma_inst", base_units=False)
    moves = launch.get("tensor_hmma_hfma2_inst", base_units=False)
    if not math.isnan(moves):
        hmma -= moves
    if found:
        out["tensor"] = _nan_sum(found.values())
        out["tensor_method"] = "tensor-pipe FLOP counters (sm__ops_path_tensor_src_*)"
    elif not math.isnan(hmma):
        out["tensor"] = hmma * HMMA_16816_FLOPS
        out["tensor_method"] = f"HMMA instructions x {HMMA_16816_FLOPS} (m16n8k16); GMMA not counted"
    else:
        out["tensor"] = math.nan
        out["tensor_method"] = "no tensor counters"
    known = [out[k] for k in ("fp32", "fp16", "fp64", "tensor") if not math.isnan(out[k])]
    out["total"] = sum(known) if known else math.nan
    return out


# --------------------------------------------------------------------------------- ncu_summary


def occupancy_limiter(launch: _Launch) -> str | None:
    """Which resource bounds the blocks per SM: the smallest launch__occupancy_limit_* (ties: first
    of OCCUPANCY_LIMITERS). None when the report has no occupancy limits."""
    best: tuple[float, str] | None = None
    for name in OCCUPANCY_LIMITERS:
        v = launch.get(f"occupancy_limit_{name}", base_units=False)
        if math.isnan(v):
            continue
        if best is None or v < best[0]:
            best = (v, name)
    return best[1] if best else None


def _problem_flops(
    plan: Mapping[tuple[str, str], Mapping[str, Any]] | None, variant: str, shape_id: str
) -> float:
    if not plan:
        return math.nan
    entry = plan.get((variant, shape_id))
    problem = entry.get("problem") if entry else None
    if not problem:
        return math.nan

    try:
        return AttentionProblem(**problem).flops()
    except Exception:  # a plan from another faprof version: no analytic count rather than no table
        return math.nan


def plan_index(plan: Mapping[str, Any] | None) -> dict[tuple[str, str], dict[str, Any]]:
    """The target's plan file (JSON) as {(variant, shape_id): entry}."""
    if not plan:
        return {}
    return {(p["variant"], p["shape_id"]): dict(p) for p in plan.get("pairs", [])}


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


def _dims(launch: _Launch, prefix: str) -> str | None:
    xyz = [launch.get(f"{prefix}_dim_{a}", base_units=False) for a in "xyz"]
    if any(math.isnan(v) for v in xyz):
        return None
    return "({}, {}, {})".format(*(int(v) for v in xyz))


def _nan_sum(values: Iterable[float]) -> float:
    vals = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return float(sum(vals)) if vals else math.nan


def _ratio(a: float, b: float) -> float:
    return a / b if not (math.isnan(a) or math.isnan(b)) and b > 0 else math.nan


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
    rows: list[dict[str, Any]] = []
    for ident, lz in _launches(metrics):
        if not ident.get("variant"):
            continue
        duration_s = lz.get("duration")
        flops = hardware_flops(lz)
        rd, wr = lz.get("dram_bytes_read"), lz.get("dram_bytes_write")
        dram = rd + wr if not (math.isnan(rd) or math.isnan(wr)) else math.nan
        bw = lz.get("dram_bytes_per_second")
        if math.isnan(bw) and not math.isnan(dram) and duration_s > 0:
            bw = dram / duration_s
        static, dynamic = lz.get("smem_static"), lz.get("smem_dynamic")
        ld, st = lz.get("smem_bank_conflicts_ld", False), lz.get("smem_bank_conflicts_st", False)
        conflicts = lz.get("smem_bank_conflicts", False)
        if math.isnan(conflicts) and not (math.isnan(ld) and math.isnan(st)):
            conflicts = _nan_sum([ld, st])
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
            sm_throughput_pct=lz.get("sm_throughput"),
            memory_throughput_pct=lz.get("memory_throughput"),
            dram_throughput_pct=lz.get("dram_throughput"),
            dram_read_bytes=rd,
            dram_write_bytes=wr,
            dram_bytes=dram,
            dram_gbs=bw / 1e9,
            l2_hit_rate_pct=lz.get("l2_hit_rate"),
            l1_hit_rate_pct=lz.get("l1_hit_rate"),
            tensor_pipe_util_pct=lz.get("tensor_util"),
            tensor_fp_util_pct=lz.get("tensor_fp_util"),
            tensor_hmma_inst=lz.get("tensor_hmma_inst", False),
            tensor_gmma_inst=lz.get("tensor_gmma_inst", False),
            smem_bank_conflicts_ld=ld,
            smem_bank_conflicts_st=st,
            smem_bank_conflicts=conflicts,
            **_advisor_counts(lz),
            fp32_flops=flops["fp32"],
            fp16_flops=flops["fp16"],
            fp64_flops=flops["fp64"],
            tensor_flops=flops["tensor"],
            hw_flops=flops["total"],
            tensor_flops_method=flops["tensor_method"],
            analytic_flops=analytic,
            hw_tflops=flops["total"] / duration_s / 1e12 if duration_s > 0 else math.nan,
            sm_clock_hz=lz.get("sm_clock"),
            sm_count=lz.get("sm_count", False),
        )
        rows.append(row)
    if not rows:
        return pd.DataFrame(columns=list(SUMMARY_COLUMNS))
    launches = pd.DataFrame(rows, columns=list(SUMMARY_COLUMNS))
    agg_rows: list[dict[str, Any]] = []
    for (variant, shape_id), g in launches.groupby(["variant", "shape_id"], sort=False):
        row = dict.fromkeys(SUMMARY_COLUMNS, math.nan)
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
            **{
                c: _nan_sum(g[c])
                for c in (
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
            },
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
        agg_rows.append(row)
    out = pd.concat([launches, pd.DataFrame(agg_rows, columns=list(SUMMARY_COLUMNS))], ignore_index=True)
    out = _sort_launches_first(out)
    for c in ("kernel_id", "launch", "kernels"):
        out[c] = out[c].astype("int64")
    return out


def _sort_launches_first(df: pd.DataFrame, extra: Sequence[str] = ()) -> pd.DataFrame:
    """Rows by (variant, shape_id), its launches in order, then its "(all)" row."""
    order = df["launch"].where(df["launch"] >= 0, 1 << 30)
    df = df.assign(_order=order).sort_values(["variant", "shape_id", "_order", *extra], kind="stable")
    return df.drop(columns="_order").reset_index(drop=True)


# --------------------------------------------------------------------------------------- stalls

STALL_COLUMNS = (
    "variant",
    "shape_id",
    "kernel",
    "kernel_id",
    "launch",
    "source",
    "reason",
    "metric",
    "value",
    "share",
)


def stall_table(metrics: pd.DataFrame) -> pd.DataFrame:
    """stalls: per launch and per source, every stall reason's value and share of the total.

    Args:
        metrics: the long ncu_metrics table.

    Returns:
        Columns STALL_COLUMNS. `source` is 'warp_state' (WarpStateStats: average stall cycles per
        issued instruction, `--set detailed`/`full`) or 'pc_sampling' (SourceCounters: samples,
        `--set full`); `share` = value / sum of the launch's values of that source, so the shares
        of one (launch, source) sum to 1. 'selected' (a warp issuing) is not a stall and is left
        out. Empty (with the columns) when the report has no stall metrics (`--set basic`).
    """
    if metrics.empty:
        return pd.DataFrame(columns=list(STALL_COLUMNS))
    m = metrics[metrics["value"].notna() & metrics["metric"].str.contains("issue_stalled", regex=False)]
    m = m[m["variant"].notna() & (m["variant"] != "")]
    rows = []
    for name in m["metric"].unique():
        parsed = stall_metric(name)
        if parsed is None or parsed[1] in NOT_A_STALL:
            continue
        sub = m[m["metric"] == name]
        for r in sub.itertuples(index=False):
            rows.append(
                {
                    "variant": r.variant,
                    "shape_id": r.shape_id,
                    "kernel": r.kernel,
                    "kernel_id": int(r.kernel_id),
                    "launch": int(r.launch),
                    "source": parsed[0],
                    "reason": parsed[1],
                    "metric": name,
                    "value": float(r.value),
                }
            )
    if not rows:
        return pd.DataFrame(columns=list(STALL_COLUMNS))
    df = pd.DataFrame(rows)
    total = df.groupby(["kernel_id", "source"])["value"].transform("sum")
    df["share"] = (df["value"] / total).where(total > 0)
    df = df.sort_values(
        ["variant", "shape_id", "launch", "source", "value"], ascending=[True, True, True, True, False]
    )
    return df[list(STALL_COLUMNS)].reset_index(drop=True)


# ------------------------------------------------------------------------------------- roofline

ROOFLINE_COLUMNS = (
    "variant",
    "shape_id",
    "kernel",
    "kernel_id",
    "launch",
    "precision",
    "flops",
    "flops_source",
    "dram_bytes",
    "duration_s",
    "arithmetic_intensity",
    "achieved_flops_per_s",
    "ceiling_source",
    "ceiling_label",
    "peak_flops_per_s",
    "peak_dram_bytes_per_s",
    "ridge_intensity",
    "roof_flops_per_s",
    "pct_of_roof",
    "bound",
)

#: Where a roofline ceiling comes from.
CEILING_SOURCES = {
    "ncu": "Nsight Compute's peak_sustained metrics x the clock measured during the kernel",
    "gpu_db": "faprof's GPU database (datasheet peaks at the boost clock)",
}


def ncu_ceilings(launch: _Launch) -> dict[str, float]:
    """Peaks from ncu for one launch: FLOP/s per CUDA-core precision and DRAM bytes/s.

    fp32 = FFMA per cycle (summed over the GPU's SMs) x 2 FLOPs x SM clock during the kernel;
    fp64 and fp16 (HFMA counted once, as in `hardware_flops`) likewise; tensor = dense fp16 tensor
    FLOPs per cycle x SM clock, of the warp-group (wgmma) path when the kernel issued GMMA
    instructions, else of the warp-level (mma.sync) path; DRAM = bytes per DRAM cycle at peak x DRAM
    clock. NaN where the report lacks a term.
    """
    sm_hz = launch.get("sm_clock")
    gmma = launch.get("tensor_gmma_inst", False)
    tensor = launch.get("peak_tensor_mma_per_cycle", False)
    if not math.isnan(gmma) and gmma > 0 and not math.isnan(launch.get("peak_tensor_gmma_per_cycle", False)):
        tensor = launch.get("peak_tensor_gmma_per_cycle", False)
    out = {
        "fp32": launch.get("peak_ffma_per_cycle", False) * FLOPS_PER_INST["ffma"] * sm_hz,
        "fp64": launch.get("peak_dfma_per_cycle", False) * FLOPS_PER_INST["dfma"] * sm_hz,
        "fp16": launch.get("peak_hfma_per_cycle", False) * FLOPS_PER_INST["hfma"] * sm_hz,
        "tensor": tensor * sm_hz,
        "dram": launch.get("peak_dram_bytes_per_cycle", False) * launch.get("dram_clock"),
    }
    return out


def gpu_db_ceilings(gpu_name: str | None, tensor_dtype: str = "fp16") -> tuple[dict[str, float], str]:
    """Peaks from faprof's GPU database: FLOP/s per precision and DRAM bytes/s, and the row's name."""
    out = dict.fromkeys(("fp32", "fp64", "fp16", "tensor", "dram"), math.nan)
    if not gpu_name:
        return out, "no GPU name"

    spec = gpus.lookup(gpu_name)
    if spec is None:
        return out, f"{gpu_name}: not in the GPU database"
    for prec, (dtype, compute) in {
        "fp32": ("fp32", "cuda_core"),
        "fp64": ("fp64", "cuda_core"),
        "tensor": (tensor_dtype, "tensor"),
    }.items():
        peak, _ = gpus.peak_tflops(spec, dtype, compute)
        if peak:
            out[prec] = peak * 1e12
    if spec.mem_bw_gbs:
        out["dram"] = spec.mem_bw_gbs * 1e9
    return out, spec.name


def _dominant_precision(flops: Mapping[str, float]) -> str:
    best, best_v = "fp32", 0.0
    for prec in ("tensor", "fp32", "fp16", "fp64"):
        v = flops.get(prec, math.nan)
        if not math.isnan(v) and v > best_v:
            best, best_v = prec, v
    return best


def roofline_table(
    metrics: pd.DataFrame, plan: Mapping[str, Any] | None = None, gpu_name: str | None = None
) -> pd.DataFrame:
    """roofline: one point per launch (and per (variant, shape_id) aggregate) under two ceilings.

    Args:
        metrics: the long ncu_metrics table.
        plan: the target's plan, for the analytic FLOPs used when no FLOP counter was collected
            and for the dtype of tensor ceilings.
        gpu_name: the GPU (as torch names it) for the database ceilings; default: the report's.

    Returns:
        Columns ROOFLINE_COLUMNS, two rows per point: `ceiling_source` 'ncu' and 'gpu_db'
        (CEILING_SOURCES). `precision` is the point's dominant FLOP kind (tensor, fp32, fp16,
        fp64) and picks the FLOP ceiling; `flops` are hardware-counted (`flops_source`
        'hardware') or, when no counter was collected, the problem's analytic FLOPs ('analytic',
        for the aggregate rows and single-kernel pairs only). arithmetic_intensity = flops / DRAM
        bytes; roof = min(peak FLOP/s, intensity x peak bandwidth); bound = 'memory' left of the
        ridge point, 'compute' right of it.
    """
    plan_idx = plan_index(plan)
    points = []
    per_pair: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for ident, lz in _launches(metrics):
        if not ident.get("variant"):
            continue
        counted = hardware_flops(lz)
        rd, wr = lz.get("dram_bytes_read"), lz.get("dram_bytes_write")
        dram = rd + wr if not (math.isnan(rd) or math.isnan(wr)) else math.nan
        duration = lz.get("duration")
        if math.isnan(dram):
            bw = lz.get("dram_bytes_per_second")
            dram = bw * duration if not math.isnan(bw) else math.nan
        p = {
            "variant": ident["variant"],
            "shape_id": ident["shape_id"],
            "kernel": ident.get("kernel"),
            "kernel_id": int(ident["kernel_id"]),
            "launch": int(ident.get("launch", 0)),
            "flops_by": counted,
            "dram_bytes": dram,
            "duration_s": duration,
            "ceilings": ncu_ceilings(lz),
            "gpu": gpu_name or ident.get("gpu"),
        }
        points.append(p)
        per_pair.setdefault((p["variant"], p["shape_id"]), []).append(p)
    for (variant, shape_id), ps in per_pair.items():
        flops_by = {
            k: _nan_sum(q["flops_by"][k] for q in ps) for k in ("fp32", "fp16", "fp64", "tensor", "total")
        }
        points.append(
            {
                "variant": variant,
                "shape_id": shape_id,
                "kernel": ALL_KERNELS,
                "kernel_id": -1,
                "launch": -1,
                "flops_by": flops_by,
                "dram_bytes": _nan_sum(q["dram_bytes"] for q in ps),
                "duration_s": _nan_sum(q["duration_s"] for q in ps),
                "ceilings": ps[0]["ceilings"],
                "gpu": ps[0]["gpu"],
                "single": len(ps) == 1,
            }
        )
    rows = []
    for p in points:
        entry = plan_idx.get((p["variant"], p["shape_id"])) or {}
        problem: dict[str, Any] = entry.get("problem") or {}
        flops, source = float(p["flops_by"]["total"]), "hardware"
        if math.isnan(flops) or flops <= 0:
            pair_pts = per_pair.get((p["variant"], p["shape_id"]), [])
            if p["kernel"] == ALL_KERNELS or len(pair_pts) == 1:
                flops, source = _problem_flops(plan_idx, p["variant"], p["shape_id"]), "analytic"
        precision = _dominant_precision(p["flops_by"])
        tensor_dtype = str(problem.get("dtype")) if problem.get("dtype") in ("fp16", "bf16") else "fp16"
        db, db_label = gpu_db_ceilings(p["gpu"], tensor_dtype)
        ai = flops / p["dram_bytes"] if p["dram_bytes"] and not math.isnan(p["dram_bytes"]) else math.nan
        achieved = flops / p["duration_s"] if p["duration_s"] and p["duration_s"] > 0 else math.nan
        for csrc, ceil, label in (("ncu", p["ceilings"], "ncu peak_sustained"), ("gpu_db", db, db_label)):
            peak, bw = ceil.get(precision, math.nan), ceil.get("dram", math.nan)
            ridge = peak / bw if bw and not math.isnan(bw) else math.nan
            roof = (
                min(peak, ai * bw) if not (math.isnan(peak) or math.isnan(ai) or math.isnan(bw)) else math.nan
            )
            rows.append(
                {
                    "variant": p["variant"],
                    "shape_id": p["shape_id"],
                    "kernel": p["kernel"],
                    "kernel_id": p["kernel_id"],
                    "launch": p["launch"],
                    "precision": precision,
                    "flops": flops,
                    "flops_source": source,
                    "dram_bytes": p["dram_bytes"],
                    "duration_s": p["duration_s"],
                    "arithmetic_intensity": ai,
                    "achieved_flops_per_s": achieved,
                    "ceiling_source": csrc,
                    "ceiling_label": label,
                    "peak_flops_per_s": peak,
                    "peak_dram_bytes_per_s": bw,
                    "ridge_intensity": ridge,
                    "roof_flops_per_s": roof,
                    "pct_of_roof": 100.0 * achieved / roof if roof and roof > 0 else math.nan,
                    "bound": (
                        None
                        if math.isnan(ai) or math.isnan(ridge)
                        else ("memory" if ai < ridge else "compute")
                    ),
                }
            )
    if not rows:
        return pd.DataFrame(columns=list(ROOFLINE_COLUMNS))
    out = pd.DataFrame(rows, columns=list(ROOFLINE_COLUMNS))
    return _sort_launches_first(out, ["ceiling_source"])
