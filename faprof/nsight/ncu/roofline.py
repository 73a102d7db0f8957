"""roofline: arithmetic intensity and achieved FLOP/s per launch, under ncu's and the GPU database's roofs.

One of the derived tables of `faprof.nsight.ncu.tables` (import `roofline_table`, ROOFLINE_COLUMNS,
CEILING_SOURCES and the two ceiling functions from here).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import pandas as pd

from faprof.model import gpus
from faprof.nsight.ncu.catalogue import FLOPS_PER_INST
from faprof.nsight.ncu.catalogue_core import ALL_KERNELS
from faprof.nsight.ncu.launch_metrics import (
    _Launch,
    _launches,
    _nan_sum,
    _problem_flops,
    _sort_launches_first,
    hardware_flops,
    plan_index,
)

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


def _launch_points(
    metrics: pd.DataFrame, gpu_name: str | None
) -> tuple[list[dict[str, Any]], dict[tuple[str, str], list[dict[str, Any]]]]:
    """(one point per launch inside faprof's ranges, in report order; the same points by (variant, shape_id))."""
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
    return points, per_pair


def _pair_points(per_pair: Mapping[tuple[str, str], list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One aggregate "(all)" point per (variant, shape_id): FLOPs, DRAM bytes and duration summed."""
    points = []
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
    return points


def _point_rows(
    p: Mapping[str, Any],
    plan_idx: Mapping[tuple[str, str], Mapping[str, Any]],
    per_pair: Mapping[tuple[str, str], list[dict[str, Any]]],
) -> list[dict[str, Any]]:
    """The two roofline rows of one point: under ncu's ceilings and under the GPU database's."""
    rows = []
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
    return rows


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
    points, per_pair = _launch_points(metrics, gpu_name)
    points += _pair_points(per_pair)
    rows = [row for p in points for row in _point_rows(p, plan_idx, per_pair)]
    if not rows:
        return pd.DataFrame(columns=list(ROOFLINE_COLUMNS))
    out = pd.DataFrame(rows, columns=list(ROOFLINE_COLUMNS))
    return _sort_launches_first(out, ["ceiling_source"])
