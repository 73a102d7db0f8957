"""The CI gate's verdicts: one per compared row, then judged with its kernel's rows and the between-run noise.

A row timed on both sides gets a Hodges-Lehmann shift and a timing verdict (`judge_row`); rows not
timed on both sides get theirs from their status (`status_verdict`). `pool_verdicts` then judges the
timed rows of each kernel together (`faprof.analysis.comparison.pool`), and re-timed rows come in as further
candidate runs (`apply_reruns`). Only merged rows are read here (`faprof.gate` pairs them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from faprof.analysis import comparison
from faprof.analysis.comparison import pool as gate_pool
from faprof.analysis.comparison.pool import pct_text
from faprof.analysis.comparison.shift import (
    AMBIGUOUS,
    FASTER,
    SAME,
    SLOWER,
    Shift,
    log_and_se,
    log_shift,
    verdict,
)
from faprof.model.schema import TIMED
from faprof.model.values import as_float
from faprof.rows import stats
from faprof.rows.noise_floor import NoiseFloor

#: Verdicts besides the four timing ones (faprof.analysis.comparison.shift).
WRONG, FAILED, UNTIMED, MISSING = "wrong", "failed", "untimed", "missing"
#: Table order: regressions first, then what needs a look, then the rest.
VERDICT_ORDER = (WRONG, FAILED, SLOWER, AMBIGUOUS, FASTER, SAME, UNTIMED, MISSING)

#: SM clocks of the two rows differing by more than this get a clock-normalised ratio: a compute-bound
#: kernel's time follows the SM clock, and 1% is half the default threshold.
CLOCK_NOTE_REL = 0.01

#: Rows timed by these clocks gate; host-clock (CPU) rows only with include_host (faprof.gate's
#: docstring says why).
GATED_TIMERS = comparison.GPU_TIMERS

#: Columns of GateResult.rows, in order.
GATE_COLUMNS = (
    "variant", "shape_id", "gpu_name", "dtype", "verdict", "regression", "undecided", "gated", "reason",
    "ratio", "ci_low", "ci_high", "ratio_of_medians", "ratio_equal_clock",
    "median_ms_baseline", "median_ms_candidate", "n_baseline", "n_candidate",
    "status_baseline", "status_candidate", "timer_baseline", "timer_candidate",
    "clock_mhz_baseline", "clock_mhz_candidate", "throttled_baseline", "throttled_candidate",
    "rerun_samples", "notes", "why",
    # between-run noise (faprof.analysis.comparison.pool): the row's own interval with it, and its kernel's verdict
    "decided_by", "row_ci_low", "row_ci_high", "kernel_ratio", "kernel_ci_low", "kernel_ci_high", "kernel_rows",
    "candidate_runs",
)


@dataclass(frozen=True)
class GateOptions:
    """What `faprof gate` was asked."""

    threshold: float | None = None
    """The relative change that counts (0.02 = 2%); None: the scenario's [gate] threshold, else the default."""
    allow_mismatch: bool = False
    """Compare bundles of different GPU models (a warning instead of a refusal)."""
    include_host: bool = False
    """Let rows timed by the host clock (CPU rows) gate too."""
    equal_clocks: bool = False
    """Judge each row on cycles (time x SM clock) where both sides recorded their SM clock: for
    compute-bound kernels on GPUs whose clocks wander (power caps). A memory-bound kernel's time does
    not follow the SM clock, so there this invents changes: off by default."""
    confidence: float = stats.CONFIDENCE
    """Confidence level of each row's interval."""
    confirm: bool = False
    """With a retime callback: re-time the kernels that are slower or undecided, not only the undecided
    (`--confirm`); each re-time is a second candidate run in the between-run noise model."""
    noise_floor: str | None = None
    """The between-run noise floors: None faprof's recorded ones, a path a TOML file of them, 'none' no floor."""


def cell(r: Any, col: str) -> Any:
    """A merged row's value, None for a missing one (NaN, pd.NA: a column one bundle lacks)."""
    v = r.get(col) if hasattr(r, "get") else None
    if v is pd.NA or (isinstance(v, float) and math.isnan(v)):
        return None
    return v


def _is_host(timer: Any, device: Any) -> bool:
    if timer is not None:
        return timer not in GATED_TIMERS
    return device == "cpu"  # bundles written before rows recorded their timer


def _timing_reason(v: str, s: Shift, threshold: float, confidence: float) -> str:
    pct = pct_text(threshold)
    ci = f"{s.ratio:.3f}x ({confidence:.0%} CI {s.low:.3f}-{s.high:.3f})"
    return {
        SLOWER: f"{ci}: the whole interval is above +{pct}",
        FASTER: f"{ci}: the whole interval is below -{pct}",
        SAME: f"{ci}: the whole interval is within ±{pct}",
        AMBIGUOUS: f"{ci}: the interval crosses ±{pct}; more samples (--rerun-ambiguous) can decide",
    }[v]


def status_verdict(r: Any) -> dict[str, Any] | None:
    """The verdict of a row that is not timed on both sides (missing, wrong, failed, untimed); None when it is."""
    out: dict[str, Any] = {"ratio": math.nan, "ci_low": math.nan, "ci_high": math.nan, "gated": False,
                           "regression": False, "undecided": False, "notes": []}
    where = r["_merge"]
    if where == "left_only":
        return {**out, "verdict": MISSING, "reason": "in the baseline only (not in the candidate)"}
    if where == "right_only":
        return {**out, "verdict": MISSING, "reason": "in the candidate only (a new row)"}
    sa, sb = cell(r, "status_a"), cell(r, "status_b")
    why_b = cell(r, "check_reason_b") or cell(r, "reason_b") or ""
    if sb == "wrong":
        also = " (wrong on the baseline too)" if sa == "wrong" else ""
        return {**out, "verdict": WRONG, "gated": True, "regression": True,
                "reason": f"wrong on the candidate{also}: {why_b}".rstrip(": ")}
    if sb == "failed":
        return {**out, "verdict": FAILED, "gated": True, "regression": True,
                "reason": f"failed on the candidate: {why_b}".rstrip(": ")}
    if sb == "untrusted":  # a time the GPU cannot reach (faprof.rows.limits): no result, so no pass
        return {**out, "verdict": FAILED, "gated": True, "regression": True,
                "reason": f"untrusted on the candidate: {why_b}".rstrip(": ")}
    if sb not in TIMED:
        side = "timed on the baseline; " if sa in TIMED else ""
        return {**out, "verdict": UNTIMED, "reason": f"{side}{sb} on the candidate: {why_b}".rstrip(": ")}
    if sa not in TIMED:
        return {**out, "verdict": UNTIMED, "reason": f"{sa} on the baseline: {cell(r, 'reason_a') or ''}".rstrip(": ")}
    return None


def judge_row(r: Any, samples_b: Any, threshold: float, options: GateOptions) -> dict[str, Any]:
    """One row's verdict, reason, interval and notes (samples_b: the candidate's, pooled after a re-time)."""
    done = status_verdict(r)
    if done is not None:
        return done
    ta, tb = cell(r, "timer_a"), cell(r, "timer_b")
    gated = options.include_host or not _is_host(tb, cell(r, "device_b"))
    notes: list[str] = []
    if cell(r, "status_a") == "wrong":
        notes.append("wrong on the baseline, right on the candidate")
    if not gated:
        notes.append("host clock: not gated (--include-host gates it)")
    ca, cb = as_float(cell(r, "sm_clock_mhz_a")), as_float(cell(r, "sm_clock_mhz_b"))
    clocks = ca > 0 and cb > 0
    b = np.asarray(samples_b, dtype=float)
    if options.equal_clocks and clocks:
        b = b * (cb / ca)  # cycles, not times: the candidate's times as they would be at the baseline's clock
    s = log_shift(stats.as_samples(r["samples_ms_a"]), b, options.confidence)
    out: dict[str, Any] = {"ratio": s.ratio, "ci_low": s.low, "ci_high": s.high, "gated": gated}
    if ta and tb and ta != tb:
        v, reason = AMBIGUOUS, (f"timed by {ta} in the baseline and {tb} in the candidate: the clocks differ "
                                "(CUDA events add a few µs to every call), so the times do not compare")
    elif not math.isfinite(s.ratio):
        v, reason = AMBIGUOUS, "no kept samples on one side (a bundle older than faprof's samples_ms): nothing to test"
    elif not s.has_interval:
        v, reason = AMBIGUOUS, (f"{s.ratio:.3f}x on {s.n_baseline} and {s.n_candidate} samples: too few for a "
                                f"{options.confidence:.0%} interval")
    else:
        v = verdict(s, threshold)
        reason = _timing_reason(v, s, threshold, options.confidence)
        out["shift"] = log_and_se(s, options.confidence)  # pooled with its kernel's rows (gate_pool)
    if options.equal_clocks and clocks:
        out["ratio_equal_clock"] = s.ratio
        notes.append(f"judged at equal SM clocks ({ca:.0f} vs {cb:.0f} MHz): {s.ratio * ca / cb:.3f}x in time")
    elif options.equal_clocks:
        notes.append("no SM clock recorded on a side: judged on time")
    elif clocks and abs(cb / ca - 1) > CLOCK_NOTE_REL and math.isfinite(s.ratio):
        out["ratio_equal_clock"] = s.ratio * cb / ca
        notes.append(f"SM clock {ca:.0f} -> {cb:.0f} MHz ({cb / ca - 1:+.1%}): {s.ratio * cb / ca:.3f}x at equal clocks")
    thr_a, thr_b = bool(cell(r, "throttled_a")), bool(cell(r, "throttled_b"))
    if thr_a != thr_b:
        side, reasons = ("candidate", cell(r, "throttle_reasons_b")) if thr_b else ("baseline", cell(r, "throttle_reasons_a"))
        notes.append(f"throttled in the {side} only ({reasons or 'reason not recorded'})")
    for side, sfx in (("baseline", "a"), ("candidate", "b")):
        if bool(cell(r, f"timing_flagged_{sfx}")):  # faprof.timing.integrity: work outside the call, stale output...
            notes.append(f"timing flagged in the {side}: {cell(r, f'timing_flag_reason_{sfx}')}")
    # an interval that stays under +threshold cannot hide a regression; one that reaches past it, or none, can
    may_regress = not s.has_interval or s.high > 1.0 + threshold or bool(ta and tb and ta != tb)
    return {**out, "verdict": v, "reason": reason, "regression": gated and v == SLOWER,
            "undecided": gated and v == AMBIGUOUS and may_regress, "notes": notes,
            "host": _is_host(tb, cell(r, "device_b"))}


def row_record(r: Any, judged: dict[str, Any]) -> dict[str, Any]:
    """One row of GateResult.rows (GATE_COLUMNS): the merged row's figures, its verdict's fields over them."""
    ma, mb = as_float(cell(r, "median_ms_a")), as_float(cell(r, "median_ms_b"))
    na, nb = stats.as_samples(cell(r, "samples_ms_a")).size, stats.as_samples(cell(r, "samples_ms_b")).size
    rec = {
        "variant": r["variant"], "shape_id": r["shape_id"], "gpu_name": r["gpu_name"],
        "dtype": cell(r, "dtype_b") or cell(r, "dtype_a"),
        "ratio_of_medians": comparison.median_ratio(ma, mb),
        "ratio_equal_clock": math.nan,
        "median_ms_baseline": ma, "median_ms_candidate": mb, "n_baseline": na, "n_candidate": nb,
        "status_baseline": cell(r, "status_a"), "status_candidate": cell(r, "status_b"),
        "timer_baseline": cell(r, "timer_a"), "timer_candidate": cell(r, "timer_b"),
        "clock_mhz_baseline": as_float(cell(r, "sm_clock_mhz_a")), "clock_mhz_candidate": as_float(cell(r, "sm_clock_mhz_b")),
        "throttled_baseline": cell(r, "throttled_a"), "throttled_candidate": cell(r, "throttled_b"),
        "rerun_samples": 0, "why": None, "decided_by": None, "row_ci_low": math.nan, "row_ci_high": math.nan,
        "kernel_ratio": math.nan, "kernel_ci_low": math.nan, "kernel_ci_high": math.nan, "kernel_rows": 0,
        "candidate_runs": 1,
    }
    rec.update({k: v for k, v in judged.items() if k in GATE_COLUMNS})
    return rec


def pool_verdicts(paired: pd.DataFrame, judged: dict[int, dict[str, Any]],
                  extra: dict[int, list[tuple[float, float]]], floors: list[NoiseFloor], threshold: float,
                  options: GateOptions) -> tuple[dict[int, dict[str, Any]], list[gate_pool.UnitDecision], list[str]]:
    """The rows' final verdicts: timed rows judged with their kernel and the between-run noise
    (`gate_pool.decide`), every other row as `judge_row` left it."""
    shifts = [gate_pool.RowShift(i, str(paired.at[i, "variant"]), str(paired.at[i, "gpu_name"]), bool(j["gated"]),
                                 bool(j.get("host")), (j["shift"], *extra.get(i, [])))
              for i, j in judged.items() if j.get("shift") is not None]
    decisions, units, notes = gate_pool.decide(shifts, floors, threshold, options.confidence,
                                               use_floor=(options.noise_floor or "").lower() != "none")
    final = {}
    for i, j in judged.items():
        d = decisions.get(i)
        if d is None:
            final[i] = j
            continue
        runs = (j["shift"], *extra.get(i, []))
        final[i] = {**j, "verdict": d.verdict, "reason": d.reason, "regression": j["gated"] and d.verdict == SLOWER,
                    "undecided": d.undecided, "decided_by": d.decided_by, "row_ci_low": d.row_ci_low,
                    "row_ci_high": d.row_ci_high, "kernel_ratio": d.unit.ratio, "kernel_ci_low": d.unit.ci_low,
                    "kernel_ci_high": d.unit.ci_high, "kernel_rows": d.unit.rows, "candidate_runs": len(runs),
                    "suspect": d.suspect,
                    "ratio": math.exp(float(np.mean([x for x, _ in runs])))}
    return final, units, notes


def rows_to_retime(paired: pd.DataFrame, judged: dict[int, dict[str, Any]], final: dict[int, dict[str, Any]],
                   confirm: bool) -> dict[int, tuple[str, str]]:
    """The rows to re-time: every timed row of a kernel (variant, GPU model) with an undecided row, or, when
    confirming, with a slower one or one that moved alone (a kernel is judged on all its rows, so all of
    them get a second run)."""
    def flagged(f: dict[str, Any]) -> bool:
        return bool(f["undecided"]) or (confirm and ((f["verdict"] == SLOWER and bool(f["regression"]))
                                                     or bool(f.get("suspect"))))

    units = {(paired.at[i, "variant"], paired.at[i, "gpu_name"]) for i, f in final.items() if flagged(f)}
    return {i: (paired.at[i, "variant"], paired.at[i, "shape_id"]) for i, j in judged.items()
            if (paired.at[i, "variant"], paired.at[i, "gpu_name"]) in units
            and (j.get("shift") is not None or flagged(final[i]))}


def add_rerun(r: pd.Series, got: dict[str, Any], threshold: float, options: GateOptions, judged: dict[str, Any],
              runs: list[tuple[float, float]]) -> None:
    """A re-timed row as a second candidate run: its shift against the baseline, judged like the first."""
    r2 = r.copy()
    for col in ("samples_ms", "sm_clock_mhz", "timer", "throttled", "throttle_reasons", "status", "device"):
        r2[f"{col}_b"] = got.get(col)
    again = judge_row(r2, stats.as_samples(got.get("samples_ms")), threshold, options)
    if again.get("shift") is None:
        judged["notes"].append(f"re-timed here, but not comparable: {again['reason']}")
        return
    if judged.get("shift") is None:  # the candidate's own run did not compare (another timer): the re-time does
        judged.update(shift=again["shift"], ratio=again["ratio"], ci_low=again["ci_low"], ci_high=again["ci_high"],
                      notes=[*judged["notes"], "re-timed here: the re-time replaces the candidate's run, which did "
                                               "not compare"])
        return
    runs.append(again["shift"])
    judged["notes"].append(f"re-timed here: {math.exp(again['shift'][0]):.3f}x in the second run "
                           f"({stats.as_samples(got.get('samples_ms')).size} samples)")


def apply_reruns(paired: pd.DataFrame, todo: dict[int, tuple[str, str]], got: dict[tuple[str, str], dict[str, Any]],
                 judged: dict[int, dict[str, Any]], extra: dict[int, list[tuple[float, float]]], threshold: float,
                 options: GateOptions) -> dict[int, int]:
    """The re-timed rows into the rows' verdicts: a wrong or failed re-time is that verdict, a timed one a
    further candidate run (`add_rerun`); a row re-timing did not give gets a note.

    Args:
        paired: the merged rows; todo: row index -> (variant, shape_id) re-timed.
        got: the re-timed rows by (variant, shape_id), on the candidate's GPU model only.
        judged: each row's verdict from `judge_row`, updated in place.
        extra: per row, the re-timed runs' (shift, error), appended to.
        threshold, options: as the rows were judged.

    Returns:
        The re-timed sample count per row that got a timed re-time.
    """
    rerun_n: dict[int, int] = {}
    for i, key in todo.items():
        status = got[key].get("status") if key in got else None
        if key not in got:
            judged[i]["notes"].append("re-timing gave no row on the candidate's GPU model")
        elif status not in TIMED or status == "wrong":
            judged[i] = {**judged[i], "verdict": WRONG if status == "wrong" else FAILED, "regression": True,
                         "reason": f"{status} when re-timed here: {got[key].get('check_reason') or got[key].get('reason') or ''}"}
            judged[i].pop("shift", None)
        else:
            add_rerun(paired.loc[i], got[key], threshold, options, judged[i], extra.setdefault(i, []))
            rerun_n[i] = stats.as_samples(got[key].get("samples_ms")).size
    return rerun_n
