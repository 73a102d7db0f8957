"""One kernel launch's metrics read through the catalogue, its hardware FLOPs, and the tables' shared helpers.

The helpers: NaN-aware sums and ratios, the plan's index, the launches-first row order.

Part of `faprof.nsight.ncu.tables` (the derived tables: ncu_summary in `summary`, roofline in
`roofline`, stalls there): pure functions of the long ncu_metrics table.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pandas as pd

from faprof.model.problem import AttentionProblem
from faprof.model.values import as_float
from faprof.nsight.ncu.catalogue import (
    CATALOGUE,
    FLOPS_PER_INST,
    HMMA_16816_FLOPS,
    PRECISION_OPS,
    names_for,
    unit_scale,
)
from faprof.nsight.ncu.catalogue_core import OCCUPANCY_LIMITERS

# ------------------------------------------------------------------------------- wide accessors


class _Launch:
    """The metrics of one kernel launch, read through the catalogue with units converted."""

    def __init__(self, values: Mapping[str, Any], units: Mapping[str, str], cc: str | None):
        self.values = values
        self.units = units
        self.cc = cc

    def raw(self, metric: str) -> float:
        return as_float(self.values.get(metric))

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


# ------------------------------------------------------------------------ shared by the tables


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
        return AttentionProblem.from_dict(problem).flops()
    except Exception:  # a plan from another faprof version: no analytic count rather than no table
        return math.nan


def plan_index(plan: Mapping[str, Any] | None) -> dict[tuple[str, str], dict[str, Any]]:
    """The target's plan file (JSON) as {(variant, shape_id): entry}."""
    if not plan:
        return {}
    return {(p["variant"], p["shape_id"]): dict(p) for p in plan.get("pairs", [])}



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


def _sort_launches_first(df: pd.DataFrame, extra: Sequence[str] = ()) -> pd.DataFrame:
    """Rows by (variant, shape_id), its launches in order, then its "(all)" row."""
    order = df["launch"].where(df["launch"] >= 0, 1 << 30)
    df = df.assign(_order=order).sort_values(["variant", "shape_id", "_order", *extra], kind="stable")
    return df.drop(columns="_order").reset_index(drop=True)

