"""Whether a row's timings are stable enough to trust its median: bimodal, drifting, or a CPU row
that missed its stop rule.

A median and its confidence interval describe one distribution that stays put while the samples
are taken. Three tests on a row's kept samples (in the order they were taken) say when that is not
so; a row that fails any of them is `unstable`, with the reason in words (`unstable_reason`):

- **Bimodal**: the samples fall into two groups, one slow and one fast. The log-samples are split
  in two where the split explains the most of their variance (Otsu's method, the best 2-means cut
  of sorted data); the row is bimodal when that share is at least `BIMODAL_MIN_SEPARATION`, the
  smaller group holds at least `BIMODAL_MIN_SHARE` of the samples (and `BIMODAL_MIN_COUNT`), and
  the two groups' medians are at least `MATERIAL_RATIO` apart. Which group holds the median then
  depends on chance: a second run can land anywhere between the two (the CPU runs of a freshly
  set-up machine: 0.15 ms calls with 13% of the samples at 4-32 ms).
- **Drifting**: the last third of the samples is slower or faster than the first third by at least
  `MATERIAL_RATIO` (the medians' ratio), and a two-sided Mann-Whitney U test between the two thirds
  says so at p < `DRIFT_ALPHA`. The machine changed under the measurement (another process, clock
  or thermal state), so the median depends on when the run stopped.
- **Missed stop rule** (CPU rows only): the host-clock timing stopped on its budget with the
  median's CI wider than the stop rule the run asked for (`target_rel_ci_host`, or the rule the
  bundle's faprof used: `host_stop_rule`). A GPU row that stops on its budget is not flagged for
  this: short kernels need more calls than a budget allows, and their CI is printed anyway.

Checked on the committed bundles' real samples (tests/test_stability.py): no CUPTI-timed GPU row of
the H100 and H200 bundles is flagged; the CPU runs' rows with preemption spikes are; of the
first-wave rows timed by CUDA events, the one with 11% of its calls at 2.8x the rest is bimodal.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from faprof.rows import stats

#: The two groups' medians (bimodal), or the last and first thirds' medians (drifting), must differ by
#: at least this factor: above the 1.31x range of SM clocks NVML recorded under power capping on the lent
#: H100 and H200 (1515-1980 MHz), so clock states alone never flag a GPU row (`throttled` reports them).
MATERIAL_RATIO = 1.4

#: The best two-group split must explain at least this share of the log-samples' variance. One normal
#: distribution gives 0.64, a uniform one 0.75, heavy single-sided tails less (a t(3): 0.41); two
#: separated groups approach 1.
BIMODAL_MIN_SEPARATION = 0.85

#: The smaller group must hold at least this share of the samples: fewer are a tail of outliers, which
#: the median ignores and Tukey's fences count (`outliers`).
BIMODAL_MIN_SHARE = 0.10

#: ... and at least this many samples (one or two slow calls are outliers, not a mode).
BIMODAL_MIN_COUNT = 3

#: Fewer samples than this say nothing about the shape of their distribution.
BIMODAL_MIN_SAMPLES = 10

#: Significance level of the drift test. Strict, because every row of a run is tested (about 200 in a
#: scenario): at 0.001 chance alone flags one row in five runs before the MATERIAL_RATIO test.
DRIFT_ALPHA = 0.001

#: Fewer samples than this cannot show a drift at DRIFT_ALPHA: with thirds of 8, the test's smallest
#: p-value (every late sample slower than every early one) is about 0.0009.
DRIFT_MIN_SAMPLES = 24

#: Timers whose rows are CPU rows (host clock): only they are held to their stop rule.
HOST_TIMERS = ("host", "host_drained")


@dataclass(frozen=True)
class Bimodal:
    """Two groups of samples: the smaller group's share and median, the larger group's median (ms),
    and the share of the log-variance the split explains."""

    share: float
    minority_ms: float
    majority_ms: float
    separation: float

    @property
    def low_ms(self) -> float:
        return min(self.minority_ms, self.majority_ms)

    @property
    def high_ms(self) -> float:
        return max(self.minority_ms, self.majority_ms)

    @property
    def ratio(self) -> float:
        return self.high_ms / self.low_ms if self.low_ms > 0 else math.inf


@dataclass(frozen=True)
class Drift:
    """The first and last thirds' medians (ms) and the Mann-Whitney p-value between them."""

    first_ms: float
    last_ms: float
    p_value: float

    @property
    def ratio(self) -> float:
        lo, hi = sorted((self.first_ms, self.last_ms))
        return hi / lo if lo > 0 else math.inf


def _clean(samples: Any) -> np.ndarray:
    x = np.asarray(samples if samples is not None else [], dtype=float)
    return x[np.isfinite(x) & (x > 0)]


def bimodality(samples: Any) -> Bimodal | None:
    """The best split of the samples into a fast and a slow group (Otsu on log time).

    Args:
        samples: one row's kept samples (ms), any order.

    Returns:
        The split, whether or not it passes the thresholds (`is_bimodal` decides); None with fewer
        than BIMODAL_MIN_SAMPLES samples or no spread at all.
    """
    x = np.sort(np.log(_clean(samples)))
    n = x.size
    kmin = max(BIMODAL_MIN_COUNT, math.ceil(BIMODAL_MIN_SHARE * n))
    if n < BIMODAL_MIN_SAMPLES or n - kmin < kmin or x.var() <= 0:
        return None
    csum = np.cumsum(x)
    k = np.arange(kmin, n - kmin + 1)
    m_low, m_high = csum[k - 1] / k, (csum[-1] - csum[k - 1]) / (n - k)
    between = k * (n - k) / n**2 * (m_high - m_low) ** 2
    i = int(np.argmax(between))
    cut = int(k[i])
    low, high = float(np.exp(np.median(x[:cut]))), float(np.exp(np.median(x[cut:])))
    slow_minority = n - cut < cut
    return Bimodal(share=min(cut, n - cut) / n, minority_ms=high if slow_minority else low,
                   majority_ms=low if slow_minority else high, separation=float(between[i] / x.var()))


def is_bimodal(b: Bimodal | None) -> bool:
    return b is not None and b.separation >= BIMODAL_MIN_SEPARATION and b.ratio >= MATERIAL_RATIO


def drift(samples: Any) -> Drift | None:
    """First third against last third of the samples, in the order they were taken.

    Returns:
        The two medians and the two-sided Mann-Whitney p-value; None with fewer than DRIFT_MIN_SAMPLES.
    """
    x = _clean(samples)
    third = x.size // 3
    if x.size < DRIFT_MIN_SAMPLES:
        return None
    first, last = x[:third], x[-third:]
    p = float(stats.significance(first, last)["p_value"])  # the one two-sample test (faprof.rows.stats)
    return Drift(first_ms=float(np.median(first)), last_ms=float(np.median(last)), p_value=p)


def is_drifting(d: Drift | None) -> bool:
    return d is not None and d.p_value < DRIFT_ALPHA and d.ratio >= MATERIAL_RATIO


@dataclass(frozen=True)
class StopRule:
    """The rule a CPU row's timing stops on: the statistic (a row column), its target, and its name."""

    column: str
    target: float
    what: str


def host_stop_rule(timing: dict[str, Any] | None) -> StopRule | None:
    """The stop rule the bundle's faprof applied to CPU rows, from the manifest's timing settings.

    `target_rel_ci_host` (the median's CI, CPU rows apart), else `target_rel_ci` (one rule for every
    row), else `target_rel_sem` (faprof before the median's CI: the mean's standard error). None when
    the settings name none.
    """
    t = timing or {}
    for key, col, what in (("target_rel_ci_host", "rel_ci", "the median's 95% CI"),
                           ("target_rel_ci", "rel_ci", "the median's 95% CI"),
                           ("target_rel_sem", "rel_sem", "the mean's standard error")):
        if isinstance(t.get(key), int | float) and t[key] > 0:
            return StopRule(col, float(t[key]), what)
    return None


def _ms(x: float) -> str:
    return f"{x:.3g} ms" if x < 1000 else f"{x:,.0f} ms"


def _sig3(x: float) -> str:
    """3 significant digits without exponents: 0.5, 38.8, 4,690."""
    return f"{x:.3g}" if x < 1000 else f"{x:,.0f}"


def assess(samples: Any, timer: Any = None, stop: Any = None, row_stats: dict[str, Any] | None = None,
           rule: StopRule | None = None) -> tuple[bool, str]:
    """Whether one row's timings are unstable, and why.

    Args:
        samples: the row's kept samples (ms) in the order they were taken.
        timer: the row's timer ('cupti', 'cuda_event', 'host'); only host rows are held to `rule`.
        stop: why the timing stopped ('converged', 'budget', 'max_repeats').
        row_stats: the row's statistics (`rel_ci`, `rel_sem`) for the stop rule.
        rule: the CPU rows' stop rule (`host_stop_rule`).

    Returns:
        (unstable, reason): the reason names every test the row fails, with its figures; '' when stable.
    """
    reasons = []
    b = bimodality(samples)
    if is_bimodal(b):
        assert b is not None
        reasons.append(f"bimodal: {100 * b.share:.0f}% of the samples near {_ms(b.minority_ms)}, "
                       f"the rest near {_ms(b.majority_ms)}")
    d = drift(samples)
    if is_drifting(d):
        assert d is not None
        word = "slower" if d.last_ms > d.first_ms else "faster"
        reasons.append(f"drifting: the last third of the samples {d.ratio:.2g}x {word} than the first "
                       f"({_ms(d.last_ms)} vs {_ms(d.first_ms)}, Mann-Whitney p = {d.p_value:.1g})")
    if rule is not None and str(timer) in HOST_TIMERS and stop != "converged":
        value = (row_stats or {}).get(rule.column)
        if isinstance(value, int | float) and math.isfinite(value) and value > rule.target:
            reasons.append(f"missed its stop rule: {rule.what} was ±{_sig3(100 * value)}% when the timing stopped "
                           f"({stop or 'on its budget'}), the rule asks for ±{_sig3(100 * rule.target)}%")
    return bool(reasons), "; ".join(reasons)


def fill(df: Any, timing: dict[str, Any] | None) -> Any:
    """Rows of a measurements table without a stability verdict (written before faprof had one) get it
    from their kept samples; rows that have one keep it.

    Args:
        df: a measurements DataFrame (`samples_ms`, `timer`, `stop`, `rel_ci`, `rel_sem`).
        timing: the bundle manifest's timing settings (for the CPU rows' stop rule).

    Returns:
        The table with `unstable` (bool, NA for untimed rows) and `unstable_reason`.
    """
    if df.empty or "samples_ms" not in df.columns:
        return df
    df = df.copy()
    if "unstable" not in df.columns:
        df["unstable"] = None
    if "unstable_reason" not in df.columns:
        df["unstable_reason"] = None
    todo = df["unstable"].isna() & df["samples_ms"].map(lambda s: s is not None and hasattr(s, "__len__") and len(s) > 0)
    rule = host_stop_rule(timing)
    for i in df.index[todo]:
        r = df.loc[i]
        flag, why = assess(r["samples_ms"], r.get("timer"), r.get("stop"),
                           {"rel_ci": r.get("rel_ci"), "rel_sem": r.get("rel_sem")}, rule)
        df.at[i, "unstable"] = flag
        df.at[i, "unstable_reason"] = why or None
    df["unstable"] = df["unstable"].astype("boolean")
    return df
