"""Tables derived from a report's metrics: ncu_summary, stalls, roofline (and the metric catalogue).

The catalogue itself (concepts -> metric names per compute capability, stall reasons, units) lives
in `faprof.nsight.ncu.catalogue` (with `catalogue_core` and `catalogue_stalls`).

Derived tables (pure functions of the long metrics table that `faprof.nsight.ncu` reads from a
report, so the tests run them on recorded fixtures without a GPU):

- `summarize` -> ncu_summary: one row per kernel launch, plus one `kernel == "(all)"` row per
  (variant, shape_id) with the sums over its launches (duration, DRAM bytes, FLOPs, kernel count);
- `stall_table` -> stalls: each warp stall reason's share of the stall cycles of a launch;
- `roofline_table` -> roofline: arithmetic intensity and achieved FLOP/s per launch, with the
  ceilings from ncu's `*.peak_sustained` metrics and from faprof's GPU database.

A metric that a set did not collect gives NaN in every derived column that needs it, never an
exception: `--set basic` has no stall reasons, for instance.

The derived tables live one per module (import them from there): `summary` (ncu_summary), `roofline`
(roofline), this module (stalls), over `launch_metrics` (the per-launch accessor, hardware FLOPs).
"""

from __future__ import annotations

import pandas as pd

from faprof.nsight.ncu.catalogue_stalls import NOT_A_STALL, stall_metric

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

