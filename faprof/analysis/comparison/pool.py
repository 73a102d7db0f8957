"""Verdicts with between-run noise: each kernel judged on all its rows, each row against its kernel.

Part of the one two-run comparison (`faprof.analysis.comparison`); the regression gate
(`faprof.gate`) and `faprof profile --quick` judge rows with it.

Why: two runs of one commit on the H100 differ row by row by far more than either run's samples
say (a row's interval from its samples is 0.1-1% wide; between the runs the rows moved by 0.925x
to 1.042x: tests/data/gate/h100/same). The run-to-run part is noise the samples cannot see, so a
row's own interval cannot decide a 2% threshold. What can: the rows of one kernel (variant) move
together when its code changes, and their run-to-run noise is largely independent from row to row.

Method, per unit (a variant on one GPU model), on log time ratios (candidate over baseline):

1. Each row i has its shift d_i (the Hodges-Lehmann estimate of its samples, `comparison.shift`), with
   within-run standard error w_i; after re-timing (`--confirm`), d_i averages the candidate's runs.
2. Run-to-run noise per row and run, sigma: the GPU model's recorded floor (`faprof.rows.noise_floor`: row_sd,
   worth prior_df rows) updated by this comparison's own evidence, the spread of the unit's d_i
   around each other and the spread between re-timed runs of a row (Smyth's moderated variance):
   sigma~^2 = (prior_df * row_sd^2 + df * s^2) / (prior_df + df).
3. The unit's shift: the one-sample Hodges-Lehmann estimate of the d_i (the median of their
   pairwise means: robust to a row whose power state was unlike the others'), with standard error
   SE^2 = f * offset_sd^2 + (pi/3) * sum(f_i) / K^2 * sigma~^2 + sum(w_i^2) / K^2, where f_i = 1/runs
   of the baseline + 1/runs of the candidate (both sides' noise), f their mean and pi/3 the
   estimator's variance relative to the mean's. Two intervals, estimate +- q * SE with q from
   Student's t on the moderated degrees of freedom: the unit's own at the gate's confidence, and
   one adjusted for the number of units (Bonferroni: 1 - alpha / (2 * units)). A `slower` (or
   `faster`) verdict is a claim about one kernel among many, so it needs the adjusted interval: the
   chance that a comparison of the same code calls any kernel slower stays under alpha. `same` is a
   claim each kernel must make on its own for the gate to pass (the intersection-union principle),
   so it uses the unit's own interval.
4. Each row against the other rows of its unit (three or more rows): the difference between d_i
   and the others' estimate, with the others' moderated noise (left out, a row that moved alone
   cannot hide in the spread it makes), adjusted for the number of rows. A row that differs from
   the rest is judged alone, on d_i +- q * SE_i with SE_i^2 = w_i^2 + f_i * (sigma~_(-i)^2 + offset_sd^2);
   every other row takes its unit's verdict. Run-to-run noise has a heavy tail: in the recorded
   runs of one commit a single row moved away from its kernel's other rows by up to the floor's
   `row_max_move` (8.1% on the H100: sdpa_cudnn), and the next run can beat any record. So one
   candidate run never makes a row that moved alone slower (or faster): it is listed as ambiguous,
   and holds the gate only when it moved more than LONE_HOLD_FACTOR times the record. `--confirm`
   re-times it: past the threshold, alone, in every candidate run, it is slower (or faster).

Verdicts, for an estimate e, adjusted interval [lo', hi'] and own interval [lo, hi], against
T = log(1 + threshold):

- `slower`: e > T and lo' > 0: significantly slower, by more than the threshold as far as the data
  tell (a 3% slowdown is caught while the interval is narrower than +-3%; a whole interval above T
  would need more precision than one run a side gives on a power-capped GPU);
- `faster`: the mirror;
- `same`: |e| <= T and [lo, hi] within +-RESOLUTION * T: no change past the threshold, and one of
  RESOLUTION times it is ruled out;
- `ambiguous`: the rest. It holds the gate (exit 4, undecided) when e > T: it looks slower by more
  than the threshold, not significantly. An ambiguous kernel whose estimate is within the threshold
  (its rows too noisy to rule out RESOLUTION times it) is listed but does not hold the gate: on the
  H100, fa3_wgmma_e's rows move 2.4% a run, and one run a side cannot do better than +-3% for it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from faprof.analysis.comparison.shift import AMBIGUOUS, FASTER, SAME, SLOWER, hl_one_sample
from faprof.rows.noise_floor import NO_FLOOR, NoiseFloor, floor_for

#: `same` needs the interval inside +-2 x the threshold: a gate that could not have seen a change of
#: twice its threshold does not call the rows the same (it calls them ambiguous).
RESOLUTION = 2.0

#: The recorded floor never counts for more than this many rows: a kernel its runs did not include may
#: be much noisier than the kernels they did (fa3_wgmma_e 2.4% a row against sdpa_flash's 0.6% on one
#: H100), and 8 is one kernel's rows in h100_headline, so a kernel's own rows always weigh as much.
PRIOR_DF_MAX = 8.0

#: A row that moved alone in one candidate run holds the gate (exit 4) when it moved more than this many
#: times the largest same-code move on record: rows do move alone with no code change (8.1% on the
#: H100), so one run cannot call it a regression, but twice the record is not to be waved through.
LONE_HOLD_FACTOR = 2.0

#: Asymptotic variance of the one-sample Hodges-Lehmann estimate relative to the mean's under
#: normal noise (efficiency 3/pi = 0.955): its standard error is the mean's times sqrt(pi/3).
HL_VARIANCE_FACTOR = math.pi / 3.0


@dataclass(frozen=True)
class RowShift:
    """One timed row's shift, per candidate run, as the gate measured it."""

    index: int
    """The row's index in the gate's paired table."""
    variant: str
    gpu_name: str
    gated: bool
    host: bool
    """Timed by the host clock (no GPU floor applies)."""
    runs: tuple[tuple[float, float], ...]
    """Per candidate run (the bundle's first, then re-timed ones): (log ratio, its within-run standard error)."""

    @property
    def shift(self) -> float:
        return float(np.mean([d for d, _ in self.runs]))

    @property
    def within_se(self) -> float:
        """The within-run standard error of `shift` (the runs' errors averaged)."""
        return math.sqrt(sum(w * w for _, w in self.runs)) / len(self.runs)

    @property
    def f(self) -> float:
        """Noise factor of a shift against one baseline run: 1 (baseline) + 1 / candidate runs."""
        return 1.0 + 1.0 / len(self.runs)


@dataclass
class UnitDecision:
    """A variant on one GPU model, judged on all its timed rows."""

    variant: str
    gpu_name: str
    rows: int
    gated: bool
    ratio: float
    """exp(one-sample Hodges-Lehmann estimate of the rows' log ratios)."""
    ci_low: float
    """The unit's own interval (the gate's confidence), what `same` is judged on."""
    ci_high: float
    adj_low: float
    """The interval adjusted for the number of units (Bonferroni), what `slower` and `faster` are judged on."""
    adj_high: float
    verdict: str
    undecided: bool
    row_spread: float
    """The rows' own run-to-run spread per run in this comparison (nan with one row)."""
    noise_sd: float
    """sigma~: the moderated run-to-run noise per row and run that the interval used."""
    floor: NoiseFloor
    df: float
    """Degrees of freedom of the interval (inf: the floor alone)."""
    q: float
    """The adjusted interval's multiplier (Student's t, Bonferroni over the units)."""
    candidate_runs: int
    """Most candidate runs behind a row (2 after --confirm re-timed it)."""
    reason: str = ""

    @property
    def regression(self) -> bool:
        return self.gated and self.verdict == SLOWER


@dataclass
class RowDecision:
    """A row's verdict with the between-run noise, and what decided it."""

    verdict: str
    reason: str
    decided_by: str
    """'kernel' (the unit's verdict) or 'row' (its own interval decided, or it disagreed with its unit)."""
    row_ci_low: float
    """The row's own interval with the run-to-run noise (ratio)."""
    row_ci_high: float
    undecided: bool
    unit: UnitDecision
    suspect: bool = False
    """Slower alone in one candidate run: --confirm re-times it."""


def verdict_of(est: float, se: float, q_adjusted: float, q_own: float, threshold: float) -> str:
    """slower / faster / same / ambiguous for a log-ratio estimate and its standard error (the rules in
    the module docstring: q_adjusted for slower and faster, q_own for same)."""
    t = math.log1p(threshold)
    if est > t and est - q_adjusted * se > 0:
        return SLOWER
    if est < -t and est + q_adjusted * se < 0:
        return FASTER
    if abs(est) <= t and abs(est) + q_own * se <= RESOLUTION * t:
        return SAME
    return AMBIGUOUS


def holds(verdict: str, est: float, threshold: float) -> bool:
    """Whether an ambiguous verdict may hide a regression: it looks slower by more than the threshold."""
    return verdict == AMBIGUOUS and est > math.log1p(threshold)


def _quantile(tail: float, df: float) -> float:
    from scipy.stats import norm, t

    if not math.isfinite(df) or df <= 0:  # df 0: one host row with no floor, only its own samples
        return float(norm.ppf(1.0 - tail))
    return float(t.ppf(1.0 - tail, df))


def _moderated(rows: Sequence[RowShift], floor: NoiseFloor) -> tuple[float, float, float]:
    """(sigma~^2, its degrees of freedom, the observed spread per run) for a unit's rows."""
    k = len(rows)
    ss, df = 0.0, 0
    if k >= 2:
        d = np.array([r.shift for r in rows])
        ss += float(((d - d.mean()) ** 2).sum()) / float(np.mean([r.f for r in rows]))  # per run, not per difference
        df += k - 1
    for r in rows:  # a row re-timed: its candidate runs differ by the run-to-run noise alone
        if len(r.runs) > 1:
            x = np.array([d for d, _ in r.runs])
            ss += float(((x - x.mean()) ** 2).sum())
            df += len(r.runs) - 1
    observed = math.sqrt(ss / df) if df else math.nan
    d0 = min(floor.prior_df, PRIOR_DF_MAX) if not floor.is_zero else 0.0
    if d0 + df == 0:
        return 0.0, 0.0, observed
    return (d0 * floor.row_sd ** 2 + ss) / (d0 + df), d0 + df, observed


def _unit(rows: Sequence[RowShift], floor: NoiseFloor, units: int, threshold: float, alpha: float) -> UnitDecision:
    """The unit's decision (steps 2 and 3 of the module docstring)."""
    k = len(rows)
    d = [r.shift for r in rows]
    est = hl_one_sample(d) if k > 1 else d[0]
    var, df, observed = _moderated(rows, floor)
    f = [r.f for r in rows]
    se = math.sqrt(float(np.mean(f)) * floor.offset_sd ** 2 + HL_VARIANCE_FACTOR * sum(f) / k ** 2 * var
                   + sum(r.within_se ** 2 for r in rows) / k ** 2)
    q, q_own = _quantile(alpha / (2.0 * max(units, 1)), df), _quantile(alpha / 2.0, df)
    v = verdict_of(est, se, q, q_own, threshold)
    gated = any(r.gated for r in rows)
    u = UnitDecision(rows[0].variant, rows[0].gpu_name, k, gated, math.exp(est), math.exp(est - q_own * se),
                     math.exp(est + q_own * se), math.exp(est - q * se), math.exp(est + q * se), v,
                     gated and holds(v, est, threshold), observed, math.sqrt(var), floor, df, q,
                     max(len(r.runs) for r in rows))
    u.reason = _unit_text(u, threshold, units)
    return u


def ratio_interval_text(lo: float, hi: float) -> str:
    """An interval of time ratios as text, '0.981-1.020'; bounds past 1000x either way (a few noisy samples
    on the host clock) are written '<0.001' / '>1000' rather than as a 17-digit number."""
    def one(x: float) -> str:
        if not math.isfinite(x) or x > 1e3:
            return ">1000"
        return "<0.001" if x < 1e-3 else f"{x:.3f}"

    return f"{one(lo)}-{one(hi)}"


def pct_text(t: float) -> str:
    """A threshold as people write it: 0.02 -> '2%', 0.025 -> '2.5%'."""
    return f"{t:.0%}" if round(t * 100, 6).is_integer() else f"{t:.1%}"


def _unit_text(u: UnitDecision, threshold: float, units: int) -> str:
    rows = f"{u.variant}'s {u.rows} row{'s' if u.rows != 1 else ''} together"
    ci = f"{u.ratio:.3f}x (interval {ratio_interval_text(u.ci_low, u.ci_high)} with run-to-run noise {u.noise_sd:.1%} a row"
    adj = f"; {u.adj_low:.3f}-{u.adj_high:.3f} adjusted for {units} kernels" if units > 1 else ""
    pct, res = pct_text(threshold), pct_text(math.expm1(RESOLUTION * math.log1p(threshold)))
    return f"{rows}: {ci}{adj}): " + {
        SLOWER: f"slower by more than {pct}, and significantly",
        FASTER: f"faster by more than {pct}, and significantly",
        SAME: f"within ±{pct}, and a change of ±{res} is ruled out",
        AMBIGUOUS: (f"looks slower by more than {pct}, not significantly (--confirm re-times it)" if u.undecided
                    else f"looks faster by more than {pct}, not significantly"
                    if math.log(u.ratio) < -math.log1p(threshold) else
                    f"within ±{pct}, but too noisy to rule out ±{res}"),
    }[u.verdict]


def decide(shifts: Sequence[RowShift], floors: Sequence[NoiseFloor], threshold: float, confidence: float,
           use_floor: bool = True) -> tuple[dict[int, RowDecision], list[UnitDecision], list[str]]:
    """Verdicts for the timed rows, each kernel on all its rows (the method in the module docstring).

    Args:
        shifts: every row timed on both sides with the same clock, with its shift per candidate run.
        floors: the recorded noise floors (`faprof.rows.noise_floor.load_floors`).
        threshold: the relative change that counts (0.02).
        confidence: 1 - alpha, the gate's confidence level.
        use_floor: False judges on the rows' own samples and spread only (`--noise-floor none`).

    Returns:
        (row decisions by row index, one decision per unit, notes said once: a borrowed floor).
    """
    alpha = 1.0 - confidence
    groups: dict[tuple[str, str, bool], list[RowShift]] = {}
    for s in shifts:
        groups.setdefault((s.variant, s.gpu_name, s.host), []).append(s)
    notes: list[str] = []
    out: dict[int, RowDecision] = {}
    units: list[UnitDecision] = []
    n_rows = len(shifts)
    for (_, gpu, host), rows in groups.items():
        if host or not use_floor:
            floor = NO_FLOOR
        else:
            floor, note = floor_for(gpu, floors)
            if note and note not in notes:
                notes.append(note)
        unit = _unit(rows, floor, len(groups), threshold, alpha)
        units.append(unit)
        for r in rows:
            out[r.index] = _row(r, [o for o in rows if o is not r], unit, n_rows, alpha, threshold)
    return out, units, notes


def _row(r: RowShift, others: list[RowShift], unit: UnitDecision, n_rows: int, alpha: float,
         threshold: float) -> RowDecision:
    """A row against the other rows of its unit (step 4 of the module docstring)."""
    d = r.shift
    var, df, _ = _moderated(others, unit.floor) if len(others) >= 2 else (unit.noise_sd ** 2, unit.df, math.nan)
    q, q_own = _quantile(alpha / (2.0 * max(n_rows, 1)), df), _quantile(alpha / 2.0, df)
    se = math.sqrt(r.within_se ** 2 + r.f * (var + unit.floor.offset_sd ** 2))
    lo, hi = math.exp(d - q_own * se), math.exp(d + q_own * se)
    alone = f"this row alone {math.exp(d):.3f}x (interval {ratio_interval_text(lo, hi)} with run-to-run noise)"
    if len(others) < 2:  # one or two rows: nothing to set a row against, the unit decides
        reason = unit.reason if not others else f"{unit.reason}; {alone}"
        return RowDecision(unit.verdict, reason, "kernel", lo, hi, r.gated and unit.undecided, unit)
    rest = [o.shift for o in others]
    k = len(others)
    se_diff = math.sqrt(r.within_se ** 2 + r.f * var + HL_VARIANCE_FACTOR * sum(o.f for o in others) / k ** 2 * var
                        + sum(o.within_se ** 2 for o in others) / k ** 2)  # the shared offset cancels
    move = abs(d - hl_one_sample(rest))
    if move <= q * se_diff:
        return RowDecision(unit.verdict, f"{unit.reason}; {alone}", "kernel", lo, hi, r.gated and unit.undecided, unit)
    own = verdict_of(d, se, q, q_own, threshold)
    pct = pct_text(threshold)
    if own in (SLOWER, FASTER):
        sign = 1.0 if own == SLOWER else -1.0
        word = "slower" if own == SLOWER else "faster"
        if len(r.runs) > 1 and all(sign * x > math.log1p(threshold) for x, _ in r.runs):
            return RowDecision(own, f"{alone}: moved unlike the rest of its kernel, {word} by more than {pct} on its "
                                    f"own in every one of its {len(r.runs)} candidate runs; {unit.reason}", "row",
                               lo, hi, False, unit)
        record = unit.floor.row_max_move
        hold = own == SLOWER and r.gated and move > LONE_HOLD_FACTOR * record
        if len(r.runs) > 1:
            seen = "but not in every candidate run"
        elif hold:
            seen = (f"{move:.1%} away from its kernel's other rows, more than {LONE_HOLD_FACTOR:g}x the {record:.1%} "
                    "a row moved alone in same-code runs on record")
        else:
            seen = f"within {LONE_HOLD_FACTOR:g}x the {record:.1%} a row moved alone in same-code runs on record"
        confirm = " (--confirm re-times it)" if own == SLOWER and len(r.runs) == 1 else ""
        return RowDecision(AMBIGUOUS, f"{alone}: moved unlike the rest of its kernel, {word} by more than {pct} "
                                      f"in one run, {seen}{confirm}; {unit.reason}", "row", lo, hi, hold, unit,
                           suspect=own == SLOWER and len(r.runs) == 1 and r.gated)
    return RowDecision(own, f"{alone}: moved unlike the rest of its kernel, {own} on its own; {unit.reason}", "row",
                       lo, hi, r.gated and holds(own, d, threshold), unit)


def units_table(units: Sequence[UnitDecision]) -> list[dict[str, Any]]:
    """The units as plain records (the gate's `kernels` table)."""
    return [{"variant": u.variant, "gpu_name": u.gpu_name, "rows": u.rows, "gated": u.gated, "verdict": u.verdict,
             "regression": u.regression, "undecided": u.undecided, "ratio": u.ratio, "ci_low": u.ci_low,
             "ci_high": u.ci_high, "adj_low": u.adj_low, "adj_high": u.adj_high, "row_spread": u.row_spread, "noise_sd": u.noise_sd, "df": u.df, "q": u.q,
             "floor_gpu": u.floor.gpu_name, "floor_row_sd": u.floor.row_sd, "floor_offset_sd": u.floor.offset_sd,
             "candidate_runs": u.candidate_runs, "reason": u.reason} for u in units]
