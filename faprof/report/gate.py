"""`faprof gate BASELINE CANDIDATE`: a CI regression gate over two run bundles: verdicts, provenance, why rows moved.

For every (variant, shape_id[, gpu_name]) row of the two bundles the gate gives one verdict:

- `faster` / `slower` / `same` / `ambiguous`: both sides timed; the Hodges-Lehmann interval of
  the candidate-over-baseline time ratio (`faprof.report.gate_stats`) against the practical
  threshold (`--threshold`, a scenario's `[gate] threshold`, else `DEFAULT_THRESHOLD`);
- `wrong` / `failed`: the candidate's row is wrong or failed: a regression, whatever the baseline;
- `untimed`: not timed on a side (unsupported, skipped, or failed on the baseline), listed only;
- `missing`: the row is in one bundle only, listed only.

Provenance comes first: GPU model, driver, CUDA/torch, cuDNN, nvcc, the SM clock during the rows,
power cap and throttle flags, the GPU timer and ncu. Different GPU models refuse (a FaprofError,
exit 2) unless `allow_mismatch`; every other difference is a warning, and rows whose SM clocks
differ get a clock-normalised ratio beside the raw one. Regressed rows get the ncu counters and
stall shares that moved most and the advisor findings that appeared or vanished, when both bundles
have ncu tables.

Exit codes (`GateResult.exit_code`): `EXIT_OK` nothing slower, `EXIT_REGRESSION` a row slower,
wrong or failed, `EXIT_AMBIGUOUS` no regression but rows the data cannot decide. Rows timed by the
host clock (CPU rows) get verdicts but gate nothing unless `include_host`: the same commit's
`cpu_ref` rows moved by 1.09-1.57x between two runs on one H200 (examples/runs/h200x2, run1 and
run2 of g1), which no threshold for GPU kernels would absorb.

Only bundles are read here; re-timing ambiguous rows is a callback (`Retime`) the caller passes in
(`faprof.run.gate.retime`), so this report stage never imports the run stage.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from faprof.errors import FaprofError
from faprof.measure import stats
from faprof.model.scenarios import gate_threshold
from faprof.model.schema import TIMED
from faprof.report.gate_stats import AMBIGUOUS, FASTER, SAME, SLOWER, Shift, log_shift, verdict
from faprof.report.gate_why import Nsight, why_moved
from faprof.store import Bundle

#: The relative change that counts when neither --threshold nor the scenario says: three runs of one
#: commit on one H200 (examples/runs/h200x2 run1-3, g1, 300 row pairs timed by CUPTI) differed by a
#: median 0.5%, 1.3% at the 95th percentile and 2.6% at most.
DEFAULT_THRESHOLD = 0.02

#: Exit code: no row slower, wrong or failed, and none ambiguous.
EXIT_OK = 0
#: Exit code: at least one gated row is slower, or a candidate row is wrong or failed.
EXIT_REGRESSION = 1
#: Exit code: no regression, but gated rows the data cannot decide and whose interval reaches past
#: +threshold (an interval crossing only the faster edge cannot be a regression) (2 is a usage
#: error, 3 is `faprof profile`'s failed rows).
EXIT_AMBIGUOUS = 4

#: Verdicts besides the four timing ones (faprof.report.gate_stats).
WRONG, FAILED, UNTIMED, MISSING = "wrong", "failed", "untimed", "missing"
#: Table order: regressions first, then what needs a look, then the rest.
VERDICT_ORDER = (WRONG, FAILED, SLOWER, AMBIGUOUS, FASTER, SAME, UNTIMED, MISSING)

#: SM clocks of the two rows differing by more than this get a clock-normalised ratio: a compute-bound
#: kernel's time follows the SM clock, and 1% is half the default threshold.
CLOCK_NOTE_REL = 0.01

#: Rows timed by these clocks gate; host-clock (CPU) rows only with include_host (see the module docstring).
GATED_TIMERS = ("cupti", "cuda_event")

#: Columns of GateResult.rows, in order.
GATE_COLUMNS = (
    "variant", "shape_id", "gpu_name", "dtype", "verdict", "regression", "undecided", "gated", "reason",
    "ratio", "ci_low", "ci_high", "ratio_of_medians", "ratio_equal_clock",
    "median_ms_baseline", "median_ms_candidate", "n_baseline", "n_candidate",
    "status_baseline", "status_candidate", "timer_baseline", "timer_candidate",
    "clock_mhz_baseline", "clock_mhz_candidate", "throttled_baseline", "throttled_candidate",
    "rerun_samples", "notes", "why",
)

#: Re-times (variant, shape_id) rows of the candidate on this machine; returns the new bundles.
Retime = Callable[[Bundle, list[tuple[str, str]]], list[Bundle]]


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


@dataclass(frozen=True)
class Check:
    """One provenance item of the two runs."""

    item: str
    """What is compared ('driver', 'SM clock during the rows (median)', ...)."""
    baseline: str
    """The baseline's value as text ('not recorded' when its bundle has none)."""
    candidate: str
    """The candidate's value as text."""
    level: str
    """'same', 'info' (differs, expected: commit, host), 'warn' (differs and can move times) or 'refuse'."""
    note: str = ""
    """What the difference means (warnings and refusals)."""


@dataclass
class GateResult:
    """The gate's answer: provenance, one verdict per row, what re-timing did."""

    baseline: dict[str, Any]
    """The baseline bundle: run_id, path, scenario, gpu_name, git_sha, has_ncu."""
    candidate: dict[str, Any]
    """The candidate bundle, likewise."""
    threshold: float
    """The relative change that counted."""
    threshold_source: str
    """Where it came from: '--threshold', the scenario's [gate] table, or 'default'."""
    confidence: float
    """Confidence level of the rows' intervals."""
    checks: list[Check]
    """Provenance, item by item."""
    rows: pd.DataFrame
    """One row per compared row (GATE_COLUMNS): regressions first, then undecided rows."""
    notes: list[str] = field(default_factory=list)
    """Things said once (ncu missing on a side, rows re-timed where)."""
    reruns: list[str] = field(default_factory=list)
    """Bundles written by --rerun-ambiguous."""

    @property
    def warnings(self) -> list[str]:
        return [c.note for c in self.checks if c.level == "warn" and c.note]

    def count(self, verdict_name: str, gated_only: bool = False) -> int:
        r = self.rows
        if r.empty:
            return 0
        sel = r["verdict"] == verdict_name
        if gated_only:
            sel &= r["gated"].astype(bool)
        return int(sel.sum())

    @property
    def regressions(self) -> pd.DataFrame:
        return self.rows[self.rows["regression"].astype(bool)] if not self.rows.empty else self.rows

    @property
    def undecided(self) -> pd.DataFrame:
        """Gated ambiguous rows whose interval reaches past +threshold: they may be regressions."""
        return self.rows[self.rows["undecided"].astype(bool)] if not self.rows.empty else self.rows

    @property
    def exit_code(self) -> int:
        if not self.regressions.empty:
            return EXIT_REGRESSION
        if not self.undecided.empty:
            return EXIT_AMBIGUOUS
        return EXIT_OK

    @property
    def outcome(self) -> str:
        """'fail', 'ambiguous' or 'pass' (the exit code in words)."""
        return {EXIT_REGRESSION: "fail", EXIT_AMBIGUOUS: "ambiguous"}.get(self.exit_code, "pass")


# ----------------------------------------------------------------------------- threshold
def parse_threshold(text: str) -> float:
    """`--threshold` as a fraction: '2%' or '0.02' -> 0.02.

    Raises:
        FaprofError: not a number, or outside (0, 1) as a fraction.
    """
    s = text.strip()
    try:
        value = float(s[:-1]) / 100.0 if s.endswith("%") else float(s)
    except ValueError:
        raise FaprofError(f"--threshold {text!r}: give a fraction (0.02) or a percentage (2%)") from None
    if not 0 < value < 1:
        raise FaprofError(f"--threshold {text!r}: the relative change that counts must be between 0 and 100% "
                          "(0.02 or 2% for two percent)")
    return value


def resolve_threshold(explicit: float | None, baseline: Bundle, candidate: Bundle) -> tuple[float, str]:
    """The threshold and where it came from: --threshold, else the candidate's scenario's (or the
    baseline's) `[gate] threshold`, else DEFAULT_THRESHOLD."""
    if explicit is not None:
        if not 0 < explicit < 1:
            raise FaprofError(f"threshold {explicit}: give a fraction between 0 and 1 (0.02 for 2%)")
        return explicit, "--threshold"
    for side, b in (("candidate", candidate), ("baseline", baseline)):
        scn = b.manifest().get("scenario") or {}
        raw = scn.get("raw")
        if isinstance(raw, dict):
            t = gate_threshold(raw, f"{b.path}/manifest.json scenario")
            if t is not None:
                return t, f"[gate] threshold of the {side}'s scenario {scn.get('name')}"
    return DEFAULT_THRESHOLD, "default"


# ----------------------------------------------------------------------------- rows
def _measurements(b: Bundle) -> pd.DataFrame:
    """A bundle's rows with the columns the gate reads (None where an older bundle lacks them)."""
    df = b.measurements().copy()
    env = b.manifest().get("env") or {}
    for c in ("gpu_name", "timer", "sm_clock_mhz", "throttled", "throttle_reasons", "samples_ms", "median_ms",
              "status", "reason", "check_reason", "dtype", "device"):
        if c not in df.columns:
            df[c] = None
    df["gpu_name"] = df["gpu_name"].where(df["gpu_name"].notna(), env.get("gpu_name") or "CPU only")
    return df


def _models(df: pd.DataFrame) -> list[str]:
    return sorted({str(g) for g in df["gpu_name"].dropna()})


def _pair_rows(da: pd.DataFrame, db: pd.DataFrame, join_on_gpu: bool) -> pd.DataFrame:
    keys = ["variant", "shape_id", *(["gpu_name"] if join_on_gpu else [])]
    m = da.merge(db, on=keys, how="outer", suffixes=("_a", "_b"), indicator=True)
    if not join_on_gpu:
        m["gpu_name"] = m["gpu_name_b"].where(m["gpu_name_b"].notna(), m["gpu_name_a"])
    return m


def _get(r: Any, col: str) -> Any:
    """A merged row's value, None for a missing one (NaN, pd.NA: a column one bundle lacks)."""
    v = r.get(col) if hasattr(r, "get") else None
    if v is pd.NA or (isinstance(v, float) and math.isnan(v)):
        return None
    return v


def _num(x: Any) -> float:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return float("nan")
    return v


def _is_host(timer: Any, device: Any) -> bool:
    if timer is not None:
        return timer not in GATED_TIMERS
    return device == "cpu"  # bundles written before rows recorded their timer


def pct_text(t: float) -> str:
    """A threshold as people write it: 0.02 -> '2%', 0.025 -> '2.5%'."""
    return f"{t:.0%}" if round(t * 100, 6).is_integer() else f"{t:.1%}"


def _timing_reason(v: str, s: Shift, threshold: float, confidence: float) -> str:
    pct = pct_text(threshold)
    ci = f"{s.ratio:.3f}x ({confidence:.0%} CI {s.low:.3f}-{s.high:.3f})"
    return {
        SLOWER: f"{ci}: the whole interval is above +{pct}",
        FASTER: f"{ci}: the whole interval is below -{pct}",
        SAME: f"{ci}: the whole interval is within ±{pct}",
        AMBIGUOUS: f"{ci}: the interval crosses ±{pct}; more samples (--rerun-ambiguous) can decide",
    }[v]


def _status_verdict(r: Any) -> dict[str, Any] | None:
    """The verdict of a row that is not timed on both sides (missing, wrong, failed, untimed); None when it is."""
    out: dict[str, Any] = {"ratio": math.nan, "ci_low": math.nan, "ci_high": math.nan, "gated": False,
                           "regression": False, "undecided": False, "notes": []}
    where = r["_merge"]
    if where == "left_only":
        return {**out, "verdict": MISSING, "reason": "in the baseline only (not in the candidate)"}
    if where == "right_only":
        return {**out, "verdict": MISSING, "reason": "in the candidate only (a new row)"}
    sa, sb = _get(r, "status_a"), _get(r, "status_b")
    why_b = _get(r, "check_reason_b") or _get(r, "reason_b") or ""
    if sb == "wrong":
        also = " (wrong on the baseline too)" if sa == "wrong" else ""
        return {**out, "verdict": WRONG, "gated": True, "regression": True,
                "reason": f"wrong on the candidate{also}: {why_b}".rstrip(": ")}
    if sb == "failed":
        return {**out, "verdict": FAILED, "gated": True, "regression": True,
                "reason": f"failed on the candidate: {why_b}".rstrip(": ")}
    if sb not in TIMED:
        side = "timed on the baseline; " if sa in TIMED else ""
        return {**out, "verdict": UNTIMED, "reason": f"{side}{sb} on the candidate: {why_b}".rstrip(": ")}
    if sa not in TIMED:
        return {**out, "verdict": UNTIMED, "reason": f"{sa} on the baseline: {_get(r, 'reason_a') or ''}".rstrip(": ")}
    return None


def _judge(r: Any, samples_b: Any, threshold: float, options: GateOptions) -> dict[str, Any]:
    """One row's verdict, reason, interval and notes (samples_b: the candidate's, pooled after a re-time)."""
    done = _status_verdict(r)
    if done is not None:
        return done
    ta, tb = _get(r, "timer_a"), _get(r, "timer_b")
    gated = options.include_host or not _is_host(tb, _get(r, "device_b"))
    notes: list[str] = []
    if _get(r, "status_a") == "wrong":
        notes.append("wrong on the baseline, right on the candidate")
    if not gated:
        notes.append("host clock: not gated (--include-host gates it)")
    ca, cb = _num(_get(r, "sm_clock_mhz_a")), _num(_get(r, "sm_clock_mhz_b"))
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
    if options.equal_clocks and clocks:
        out["ratio_equal_clock"] = s.ratio
        notes.append(f"judged at equal SM clocks ({ca:.0f} vs {cb:.0f} MHz): {s.ratio * ca / cb:.3f}x in time")
    elif options.equal_clocks:
        notes.append("no SM clock recorded on a side: judged on time")
    elif clocks and abs(cb / ca - 1) > CLOCK_NOTE_REL and math.isfinite(s.ratio):
        out["ratio_equal_clock"] = s.ratio * cb / ca
        notes.append(f"SM clock {ca:.0f} -> {cb:.0f} MHz ({cb / ca - 1:+.1%}): {s.ratio * cb / ca:.3f}x at equal clocks")
    thr_a, thr_b = bool(_get(r, "throttled_a")), bool(_get(r, "throttled_b"))
    if thr_a != thr_b:
        side, reasons = ("candidate", _get(r, "throttle_reasons_b")) if thr_b else ("baseline", _get(r, "throttle_reasons_a"))
        notes.append(f"throttled in the {side} only ({reasons or 'reason not recorded'})")
    # an interval that stays under +threshold cannot hide a regression; one that reaches past it, or none, can
    may_regress = not s.has_interval or s.high > 1.0 + threshold or bool(ta and tb and ta != tb)
    return {**out, "verdict": v, "reason": reason, "regression": gated and v == SLOWER,
            "undecided": gated and v == AMBIGUOUS and may_regress, "notes": notes}


def _row_record(r: Any, judged: dict[str, Any]) -> dict[str, Any]:
    ma, mb = _num(_get(r, "median_ms_a")), _num(_get(r, "median_ms_b"))
    na, nb = stats.as_samples(_get(r, "samples_ms_a")).size, stats.as_samples(_get(r, "samples_ms_b")).size
    rec = {
        "variant": r["variant"], "shape_id": r["shape_id"], "gpu_name": r["gpu_name"],
        "dtype": _get(r, "dtype_b") or _get(r, "dtype_a"),
        "ratio_of_medians": mb / ma if ma > 0 and math.isfinite(mb) else math.nan,
        "ratio_equal_clock": math.nan,
        "median_ms_baseline": ma, "median_ms_candidate": mb, "n_baseline": na, "n_candidate": nb,
        "status_baseline": _get(r, "status_a"), "status_candidate": _get(r, "status_b"),
        "timer_baseline": _get(r, "timer_a"), "timer_candidate": _get(r, "timer_b"),
        "clock_mhz_baseline": _num(_get(r, "sm_clock_mhz_a")), "clock_mhz_candidate": _num(_get(r, "sm_clock_mhz_b")),
        "throttled_baseline": _get(r, "throttled_a"), "throttled_candidate": _get(r, "throttled_b"),
        "rerun_samples": 0, "why": None,
    }
    rec.update(judged)
    return rec


# ----------------------------------------------------------------------------- provenance
def _s(x: Any) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "not recorded"
    return str(x)


def cudnn_version(v: Any) -> str:
    """torch.backends.cudnn.version()'s integer as a version: 91900 -> '9.19.0', 8907 -> '8.9.7'."""
    try:
        n = int(v)
    except (TypeError, ValueError):
        return _s(v)
    if n >= 10000:  # cuDNN 9 encodes major*10000 + minor*100 + patch
        return f"{n // 10000}.{n % 10000 // 100}.{n % 100}"
    return f"{n // 1000}.{n % 1000 // 100}.{n % 100}"


def _median_clock(rows: pd.DataFrame, col: str) -> float:
    v = pd.to_numeric(rows[col], errors="coerce").dropna() if col in rows else pd.Series(dtype=float)
    return float(v.median()) if not v.empty else math.nan


def _throttle_text(rows: pd.DataFrame, side: str) -> tuple[str, set[str]]:
    flags = rows.get(f"throttled_{side}")
    if flags is None or flags.isna().all():
        return "not recorded", set()
    thr = rows[flags.fillna(False).astype(bool)]
    reasons = {p.strip() for x in thr.get(f"throttle_reasons_{side}", pd.Series(dtype=object)).dropna()
               for p in str(x).split(",") if p.strip()}
    text = f"{len(thr)} of {len(rows)} rows" + (f" ({', '.join(sorted(reasons))})" if reasons else "")
    return text, reasons


def _ncu_text(m: dict[str, Any]) -> str:
    n = m.get("ncu") or {}
    if not n or n.get("status") not in ("ok", None) or not n.get("ncu_version"):
        return "not collected" if not n else f"{n.get('status')}"
    return f"{n.get('ncu_version')}, set {n.get('set')}, clock control {n.get('clock_control')}"


def _timing_text(m: dict[str, Any]) -> tuple[str, tuple[Any, Any]]:
    t = (m.get("settings") or {}).get("timing") or {}
    if not t:
        return "not recorded", (None, None)
    key = (t.get("flush_l2"), t.get("timer"))
    text = (f"L2 flush {'on' if t.get('flush_l2') else 'off'}, timer {t.get('timer', 'auto')}, "
            f"target CI {_num(t.get('target_rel_ci', t.get('target_rel_sem'))):.1%}, budget {t.get('budget_s')} s")
    return text, key


def provenance(a: Bundle, b: Bundle, paired: pd.DataFrame, models: tuple[list[str], list[str]],
               allow_mismatch: bool) -> list[Check]:
    """The two runs' provenance, item by item, each marked same / info / warn / refuse.

    Args:
        a: the baseline bundle.
        b: the candidate bundle.
        paired: the rows of both (as `_pair_rows` makes them).
        models: the GPU models the baseline's and the candidate's rows ran on.
        allow_mismatch: different GPU models warn instead of refusing.

    Returns:
        The checks, GPU model first.
    """
    ma, mb = a.manifest(), b.manifest()
    ea, eb = ma.get("env") or {}, mb.get("env") or {}
    checks: list[Check] = []

    def add(item: str, va: Any, vb: Any, level_if_differs: str, note: str = "") -> None:
        sa, sb = _s(va), _s(vb)
        checks.append(Check(item, sa, sb, "same" if sa == sb else level_if_differs, "" if sa == sb else note))

    ga, gb = ", ".join(models[0]), ", ".join(models[1])
    if ga == gb:
        checks.append(Check("GPU model", ga, gb, "same"))
    else:
        level = "warn" if allow_mismatch else "refuse"
        checks.append(Check("GPU model", ga, gb, level,
                            f"different GPU models (baseline {ga}, candidate {gb}): the ratios compare machines, not code"))
    add("driver", ea.get("smi_driver") or ea.get("cuda_driver"), eb.get("smi_driver") or eb.get("cuda_driver"), "warn",
        "different drivers: kernel times can move with the driver")
    add("CUDA (torch's)", ea.get("torch_cuda"), eb.get("torch_cuda"), "warn",
        "different CUDA versions: SDPA's and cuBLAS's kernels differ between releases")
    add("torch", ea.get("torch"), eb.get("torch"), "warn", "different torch versions: the SDPA backends' kernels may differ")
    add("cuDNN", cudnn_version(ea.get("cudnn")) if ea.get("cudnn") else None,
        cudnn_version(eb.get("cudnn")) if eb.get("cudnn") else None, "warn",
        "different cuDNN versions: sdpa_cudnn's kernels differ between releases")
    add("nvcc", ea.get("nvcc"), eb.get("nvcc"), "warn", "different nvcc: faprof's and user kernels were compiled differently")
    add("max SM clock (MHz)", ea.get("smi_max_sm_clock_mhz"), eb.get("smi_max_sm_clock_mhz"), "warn",
        "different maximum SM clocks: another SKU or locked application clocks")
    add("power cap (W)", ea.get("smi_power_limit_w"), eb.get("smi_power_limit_w"), "warn",
        "different power caps: large kernels run at the clock the cap allows")
    timed = paired[paired["_merge"].eq("both") & paired["status_a"].isin(TIMED)
                   & paired["status_b"].isin(TIMED)] if "status_a" in paired else paired.iloc[0:0]
    ca, cb = _median_clock(timed, "sm_clock_mhz_a"), _median_clock(timed, "sm_clock_mhz_b")
    clock_level = "same"
    if math.isfinite(ca) and math.isfinite(cb) and abs(cb / ca - 1) > CLOCK_NOTE_REL:
        clock_level = "warn"
    elif not (math.isfinite(ca) and math.isfinite(cb)) and (math.isfinite(ca) or math.isfinite(cb)):
        clock_level = "info"
    checks.append(Check("SM clock during the rows (median)", f"{ca:.0f} MHz" if math.isfinite(ca) else "not recorded",
                        f"{cb:.0f} MHz" if math.isfinite(cb) else "not recorded", clock_level,
                        f"the rows ran at different SM clocks ({ca:.0f} vs {cb:.0f} MHz, median): see each row's "
                        "ratio at equal clocks" if clock_level == "warn" else ""))
    (ta, ra), (tb, rb) = _throttle_text(timed, "a"), _throttle_text(timed, "b")
    level = "same" if ta == tb else ("info" if ra == rb else "warn")
    checks.append(Check("throttled rows (NVML clock events)", ta, tb, level,
                        f"throttle reasons differ ({', '.join(sorted(ra)) or 'none'} vs {', '.join(sorted(rb)) or 'none'})"
                        if level == "warn" else ""))
    tim_a = Counter(str(t) for t in timed.get("timer_a", pd.Series(dtype=object)).dropna())
    tim_b = Counter(str(t) for t in timed.get("timer_b", pd.Series(dtype=object)).dropna())
    fa = ", ".join(f"{k} {v}" for k, v in sorted(tim_a.items())) or "not recorded"
    fb = ", ".join(f"{k} {v}" for k, v in sorted(tim_b.items())) or "not recorded"
    checks.append(Check("GPU timer (rows)", fa, fb, "same" if set(tim_a) == set(tim_b) else "warn",
                        "" if set(tim_a) == set(tim_b) else
                        "the rows were timed by different clocks: rows whose timers differ are ambiguous"))
    tsa, key_a = _timing_text(ma)
    tsb, key_b = _timing_text(mb)
    checks.append(Check("timing settings", tsa, tsb, "same" if tsa == tsb else ("warn" if key_a != key_b else "info"),
                        "the L2 flush or the timer setting differs: the runs measured different things"
                        if key_a != key_b else ""))
    na, nb = _ncu_text(ma), _ncu_text(mb)
    checks.append(Check("ncu", na, nb, "same" if na == nb else "info", ""))
    add("scenario", (ma.get("scenario") or {}).get("name"), (mb.get("scenario") or {}).get("name"), "warn",
        "different scenarios: only the (variant, shape) rows both ran are compared")
    add("faprof commit", ea.get("git_sha"), eb.get("git_sha"), "info")
    add("host", ea.get("host"), eb.get("host"), "info")
    return checks


# ----------------------------------------------------------------------------- the gate
def _info(b: Bundle) -> dict[str, Any]:
    m = b.manifest()
    env = m.get("env") or {}
    return {"run_id": b.run_id, "path": str(b.path), "scenario": (m.get("scenario") or {}).get("name"),
            "gpu_name": env.get("gpu_name"), "git_sha": env.get("git_sha"), "has_ncu": not b.read("ncu_summary").empty}


def _pooled(rerun: dict[tuple[str, str], dict[str, Any]], key: tuple[str, str], old: Any) -> tuple[np.ndarray, int]:
    new = stats.as_samples(rerun[key].get("samples_ms")) if key in rerun else np.array([])
    return np.concatenate([stats.as_samples(old), new]), int(new.size)


def _rerun_rows(bundles: Sequence[Bundle], want_gpu: dict[tuple[str, str], str], cand_sha: Any,
                notes: list[str]) -> dict[tuple[str, str], dict[str, Any]]:
    """The re-timed rows by (variant, shape_id): those on the candidate's GPU model only."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for nb in bundles:
        env = nb.manifest().get("env") or {}
        if cand_sha and env.get("git_sha") and env.get("git_sha") != cand_sha:
            notes.append(f"re-timed at commit {env.get('git_sha')}, the candidate was measured at {cand_sha}: "
                         "the re-timed rows measure this tree's code")
        for r in _measurements(nb).to_dict("records"):
            key = (r["variant"], r["shape_id"])
            if key not in want_gpu:
                continue
            if str(r["gpu_name"]) != want_gpu[key]:
                notes.append(f"{key[0]} {key[1]} was re-timed on {r['gpu_name']}, not the candidate's "
                             f"{want_gpu[key]}: its samples are not pooled")
                continue
            out[key] = r
    return out


def run_gate(baseline: Bundle, candidate: Bundle, options: GateOptions | None = None,
             retime: Retime | None = None) -> GateResult:
    """Gate CANDIDATE against BASELINE.

    Args:
        baseline: the reference bundle (in CI, usually a committed one).
        candidate: the bundle of the change under test.
        options: threshold, --allow-mismatch, --include-host, confidence.
        retime: when given, ambiguous gated rows are re-timed through it (on this machine) and
            their new samples pooled with the candidate's before the verdict is given again.

    Returns:
        The GateResult: regressions first, then undecided rows, then the rest in VERDICT_ORDER,
        the largest ratio first within each.

    Raises:
        FaprofError: the GPU models differ without allow_mismatch (one line naming the flag), a
            bad threshold, or bundles with no rows.
    """
    options = options or GateOptions()
    da, db = _measurements(baseline), _measurements(candidate)
    if da.empty or db.empty:
        empty = baseline if da.empty else candidate
        raise FaprofError(f"{empty.path} has no measurements: nothing to gate (finish the run with "
                          f"`faprof profile --resume {empty.path}`)")
    threshold, source = resolve_threshold(options.threshold, baseline, candidate)
    ma_models, mb_models = _models(da), _models(db)
    join_on_gpu = not (options.allow_mismatch and len(ma_models) == 1 and len(mb_models) == 1)
    paired = _pair_rows(da, db, join_on_gpu)
    checks = provenance(baseline, candidate, paired, (ma_models, mb_models), options.allow_mismatch)
    refused = [c for c in checks if c.level == "refuse"]
    if refused:
        c = refused[0]
        raise FaprofError(f"refusing to gate: {c.note}; run both on one GPU model, or pass --allow-mismatch "
                          "to compare anyway")
    paired = paired.reset_index(drop=True)
    notes: list[str] = []
    samples_b = {i: stats.as_samples(r.get("samples_ms_b")) for i, r in paired.iterrows()}
    judged = {i: _judge(r, samples_b[i], threshold, options) for i, r in paired.iterrows()}
    reruns: list[str] = []
    rerun_n: dict[int, int] = {}
    if retime is not None:
        todo = {i: (paired.at[i, "variant"], paired.at[i, "shape_id"]) for i, j in judged.items() if j["undecided"]}
        if todo:
            new_bundles = retime(candidate, list(dict.fromkeys(todo.values())))
            reruns = [str(nb.path) for nb in new_bundles]
            want = {key: str(paired.at[i, "gpu_name_b"] if "gpu_name_b" in paired else paired.at[i, "gpu_name"])
                    for i, key in todo.items()}
            got = _rerun_rows(new_bundles, want, (candidate.manifest().get("env") or {}).get("git_sha"), notes)
            for i, key in todo.items():
                r = paired.loc[i]
                if key not in got:
                    judged[i]["notes"].append("re-timing gave no row on the candidate's GPU model")
                    continue
                status = got[key].get("status")
                if status not in TIMED or status == "wrong":
                    judged[i] = {**judged[i], "verdict": WRONG if status == "wrong" else FAILED, "regression": True,
                                 "reason": f"{status} when re-timed here: {got[key].get('check_reason') or got[key].get('reason') or ''}"}
                    continue
                pooled, n_new = _pooled(got, key, r.get("samples_ms_b"))
                rerun_n[i] = n_new
                judged[i] = _judge(r, pooled, threshold, options)
                judged[i]["notes"].append(f"re-timed here: {n_new} more samples pooled with the candidate's")
    records = []
    for i, r in paired.iterrows():
        rec = _row_record(r, judged[i])
        rec["rerun_samples"] = rerun_n.get(i, 0)
        if i in rerun_n:
            rec["n_candidate"] += rerun_n[i]
        records.append(rec)
    rows = pd.DataFrame(records, columns=list(GATE_COLUMNS))
    _attach_why(rows, baseline, candidate, notes)
    order = {v: k + 2 for k, v in enumerate(VERDICT_ORDER)}
    rank = rows["verdict"].map(order).where(~rows["undecided"].astype(bool), 1).where(~rows["regression"].astype(bool), 0)
    rows = rows.assign(_o=rank, _r=-rows["ratio"].fillna(0.0))
    rows = rows.sort_values(["_o", "_r", "variant", "shape_id"], kind="stable").drop(columns=["_o", "_r"])
    return GateResult(_info(baseline), _info(candidate), threshold, source, options.confidence, checks,
                      rows.reset_index(drop=True), notes, reruns)


def _attach_why(rows: pd.DataFrame, baseline: Bundle, candidate: Bundle, notes: list[str]) -> None:
    """Fill `why` on the regressed slower rows from both bundles' ncu tables (a note when a side has none)."""
    slower = rows.index[(rows["verdict"] == SLOWER) & rows["regression"].astype(bool)]
    if len(slower) == 0:
        return
    na, nb = Nsight.of(baseline), Nsight.of(candidate)
    if na.summary.empty or nb.summary.empty:
        sides = [s for s, n in (("baseline", na), ("candidate", nb)) if n.summary.empty]
        which = "neither bundle has any" if len(sides) == 2 else f"the {sides[0]} has none"
        notes.append(f"why rows moved needs ncu tables on both sides and {which} "
                     "(profile with --ncu, or run `faprof ncu RUN` on the bundle)")
        return
    for i in slower:
        rows.at[i, "why"] = why_moved(na, nb, rows.at[i, "variant"], rows.at[i, "shape_id"])
