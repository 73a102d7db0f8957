"""Did run B change against run A: the one two-run comparison every reader uses.

- `pair`: A's and B's rows matched on (variant, shape_id), and the GPU model for bundles of several;
  an outer join whose `_merge` column says where each row is (`how="inner"`: rows in both only);
- `median_ratio`: B's median over A's (above 1: B is slower);
- `mann_whitney`: the p-value of two-sided Mann-Whitney U on the kept samples (faprof.rows.stats),
  no verdict for a pair whose timings are unstable on a side (`is_unstable`);
- `shift` (`log_shift`, `verdict`): the Hodges-Lehmann shift of one row with its confidence interval,
  the interval that inverts the same U test, and its verdict against a threshold;
- `pool` (`decide`): each kernel judged on all its rows with the GPU model's between-run noise floor
  (faprof.rows.noise_floor): faster / slower / same / ambiguous;
- `compare`: all of it on two runs' rows: per row the ratio, the interval and the verdict, per
  kernel the pooled verdict.

Readers: `faprof compare` (faprof.report.compare formats the pairs and their test), the dashboard's
Diff page (faprof.analysis.diff), `faprof profile --quick` (`compare`: the delta against the
previous run), and the regression gate (faprof.gate), which adds its policy on top: which
rows gate (GPU clocks, not the host's), wrong and failed rows as regressions, undecided rows and
exit codes, timer and clock mismatches, re-timing, provenance.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from faprof.analysis.comparison.pool import RowShift, UnitDecision, decide
from faprof.analysis.comparison.shift import AMBIGUOUS, FASTER, SAME, SLOWER, Shift, log_and_se, log_shift
from faprof.model.schema import TIMED
from faprof.model.values import as_float
from faprof.rows import stats
from faprof.rows.noise_floor import NoiseFloor

#: The row keys two runs are matched on.
KEYS = ("variant", "shape_id")

#: Rows timed by these clocks have a between-run noise floor; host-clock (CPU) rows are judged on
#: their own samples and spread only.
GPU_TIMERS = ("cupti", "cuda_event")

#: A row in one run only, and a row not timed on both sides.
MISSING, UNTIMED = "missing", "untimed"

__all__ = ["AMBIGUOUS", "FASTER", "GPU_TIMERS", "KEYS", "MISSING", "SAME", "SLOWER", "UNTIMED", "Comparison",
           "compare", "is_unstable", "mann_whitney", "median_ratio", "pair"]


def pair(a: pd.DataFrame, b: pd.DataFrame, cols: Sequence[str] | None = None, how: str = "outer",
         on_gpu: bool = False) -> pd.DataFrame:
    """A's and B's rows matched on (variant, shape_id) (and gpu_name with `on_gpu`).

    Args:
        a, b: the two runs' measurement rows (A the reference).
        cols: the columns besides the keys to keep from each side (those a side lacks are left out);
            None keeps them all.
        how: "outer" (every row of either run) or "inner" (rows in both).
        on_gpu: match on the GPU model too.

    Returns:
        The merged rows, each side's columns suffixed _a and _b, and `_merge` ('both', 'left_only':
        in A only, 'right_only': in B only).
    """
    keys = [*KEYS, *(["gpu_name"] if on_gpu else [])]
    if cols is not None:
        a = a[[*keys, *[c for c in cols if c in a and c not in keys]]]
        b = b[[*keys, *[c for c in cols if c in b and c not in keys]]]
    return a.merge(b, on=keys, how=how, suffixes=("_a", "_b"), indicator=True)


def median_ratio(median_a: Any, median_b: Any) -> float:
    """B's median over A's (above 1: B is slower); nan where A's is not a positive number or B's is missing."""
    ma, mb = as_float(median_a), as_float(median_b)
    return mb / ma if ma > 0 and math.isfinite(mb) else math.nan


def is_unstable(x: Any) -> bool:
    """A row's `unstable` cell as a bool (missing: not judged, so not unstable)."""
    return x is True or (not pd.isna(x) and bool(x))


def mann_whitney(samples_a: Any, samples_b: Any, alpha: float = stats.SIGNIFICANCE_ALPHA,
                 min_samples: int = 3) -> tuple[float, bool | None]:
    """(p-value, significant) of two-sided Mann-Whitney U on two rows' kept samples (faprof.rows.stats);
    (nan, None) with fewer than `min_samples` on a side."""
    sa, sb = stats.as_samples(samples_a), stats.as_samples(samples_b)
    if len(sa) < min_samples or len(sb) < min_samples:
        return math.nan, None
    t = stats.significance(sa, sb, alpha)
    return t["p_value"], t["significant"]


@dataclass
class Comparison:
    """Two runs compared: one row per (variant, shape_id), one decision per kernel."""

    rows: pd.DataFrame
    """variant, shape_id, status_a/_b, median_ms_a/_b, n_a/_b, ratio_of_medians, ratio (the Hodges-Lehmann
    estimate; its interval ci_low/ci_high with the between-run noise), verdict (faster / slower / same /
    ambiguous, or missing / untimed), reason, unstable ('A', 'B', 'A, B' or '': whose timings are unstable)."""
    kernels: list[UnitDecision] = field(default_factory=list)
    """Each variant judged on all its timed rows (`pool.decide`)."""
    notes: list[str] = field(default_factory=list)
    threshold: float = 0.0
    confidence: float = stats.CONFIDENCE

    def kernel(self, variant: str) -> UnitDecision | None:
        return next((u for u in self.kernels if u.variant == variant), None)


def _status_reason(r: dict[str, Any]) -> tuple[str, str]:
    if r["_merge"] == "left_only":
        return MISSING, "in A only"
    if r["_merge"] == "right_only":
        return MISSING, "in B only"
    return UNTIMED, f"not timed on both sides ({r.get('status_a')} / {r.get('status_b')})"


def compare(a: pd.DataFrame, b: pd.DataFrame, threshold: float, confidence: float = stats.CONFIDENCE,
            floors: Sequence[NoiseFloor] = ()) -> Comparison:
    """Two runs' rows compared with the gate's statistics: each row's Hodges-Lehmann shift, each kernel
    judged on all its rows with the between-run noise floor of its GPU model (`floors`; none for rows
    timed by the host clock), against `threshold`.

    Args:
        a, b: the measurement rows of run A (the reference) and run B.
        threshold: the relative change that counts (0.02: 2%).
        confidence: the intervals' confidence level.
        floors: the recorded noise floors (faprof.rows.noise_floor.load_floors); () judges on the
            runs' own samples and rows only.

    Returns:
        The Comparison. Rows timed by different clocks on the two sides are ambiguous (the times do
        not compare).
    """
    cols = ["status", "median_ms", "samples_ms", "timer", "gpu_name", "unstable"]
    m = pair(a, b, cols).reset_index(drop=True)
    records = m.to_dict("records")
    shifts: list[RowShift] = []
    own: dict[int, Shift] = {}
    for i, r in enumerate(records):
        if r["_merge"] != "both" or r.get("status_a") not in TIMED or r.get("status_b") not in TIMED:
            continue
        ta, tb = r.get("timer_a"), r.get("timer_b")
        s = log_shift(stats.as_samples(r.get("samples_ms_a")), stats.as_samples(r.get("samples_ms_b")), confidence)
        own[i] = s
        if isinstance(ta, str) and isinstance(tb, str) and ta != tb:
            continue
        if s.has_interval:
            gpu = r.get("gpu_name_b") if isinstance(r.get("gpu_name_b"), str) else "CPU only"
            shifts.append(RowShift(i, str(r["variant"]), gpu, True, tb not in GPU_TIMERS, (log_and_se(s, confidence),)))
    decisions, units, notes = decide(shifts, floors, threshold, confidence, use_floor=bool(floors))
    out = []
    for i, r in enumerate(records):
        sh = own.get(i)
        rec = {"variant": r["variant"], "shape_id": r["shape_id"], "status_a": r.get("status_a"),
               "status_b": r.get("status_b"), "median_ms_a": r.get("median_ms_a"), "median_ms_b": r.get("median_ms_b"),
               "n_a": len(stats.as_samples(r.get("samples_ms_a"))), "n_b": len(stats.as_samples(r.get("samples_ms_b"))),
               "ratio_of_medians": median_ratio(r.get("median_ms_a"), r.get("median_ms_b")),
               "ratio": sh.ratio if sh else math.nan, "ci_low": math.nan, "ci_high": math.nan,
               "unstable": ", ".join(x for x in ("A", "B") if is_unstable(r.get(f"unstable_{x.lower()}")))}
        d = decisions.get(i)
        if d is not None:
            rec.update(ci_low=d.row_ci_low, ci_high=d.row_ci_high, verdict=d.verdict, reason=d.reason)
        elif sh is not None:
            why = ("timed by different clocks on the two sides" if sh.has_interval
                   else f"{sh.n_baseline} and {sh.n_candidate} samples: too few for a {confidence:.0%} interval")
            rec.update(verdict=AMBIGUOUS, reason=why)
        else:
            rec["verdict"], rec["reason"] = _status_reason(r)
        out.append(rec)
    return Comparison(pd.DataFrame(out), units, notes, threshold, confidence)

