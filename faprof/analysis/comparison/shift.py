"""The shift between two runs' timing samples with its CI, and the verdict (the statistics of the one
two-run comparison, `faprof.analysis.comparison`, which the regression gate uses).

Method: Hodges-Lehmann on log samples. For baseline samples a_1..a_m and candidate samples
b_1..b_n, every pairwise difference d_ij = log b_j - log a_i is formed; the estimate of the
candidate-over-baseline time ratio is exp(median d_ij), and its confidence interval is a pair of
order statistics of the d_ij whose ranks come from the null distribution of the Mann-Whitney U
statistic (exact below `EXACT_MAX_PAIRS` pairs, normal approximation above). Why this and not a
bootstrap of the ratio of medians:

- it is the interval that inverts the Mann-Whitney U test `faprof compare` and the dashboard
  already use, so the gate and `compare` never disagree about whether two rows differ;
- it is distribution-free under a scale shift (a change in the kernel multiplies its times) and
  robust to the heavy right tail of timings (clock dips, a late flush): an outlier moves a few of
  the m*n differences, not the median of them;
- it is exact and deterministic from the samples alone: no resampling, no seed, the same answer
  on every machine;
- it holds its coverage at the sample counts faprof keeps (10 samples for a slow call, the
  harness's `min_repeats`), where the bootstrap distribution of a median of 10 takes only a few
  distinct values and its percentile interval under-covers;
- on log times the threshold is symmetric: 2% slower and 2% faster are the same distance from 1.

`verdict` puts one row's interval against the practical threshold t: `slower` when the whole
interval lies above 1 + t, `faster` when it lies below 1 / (1 + t), `same` when it lies inside
[1 / (1 + t), 1 + t], and `ambiguous` when it crosses an edge. That interval covers the row's own
samples only; two runs of one commit differ by more (tests/data/gate/h100/same), so `faprof gate` gives it
only to rows it cannot judge with their kernel and the GPU's between-run noise
(`faprof.analysis.comparison.pool`, which also uses `hl_one_sample` below).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

#: Up to this many sample pairs (m * n) the exact null distribution of U sets the interval's ranks: it
#: costs a few milliseconds there, and below it the normal approximation drifts from the exact ranks
#: (at 2,500 pairs it is within 3 ranks, on the wide side; tests/test_gate.py).
EXACT_MAX_PAIRS = 2500

#: The gate's four timing verdicts.
FASTER, SLOWER, SAME, AMBIGUOUS = "faster", "slower", "same", "ambiguous"


@dataclass(frozen=True)
class Shift:
    """The candidate-over-baseline time ratio of one row, with its confidence interval."""

    ratio: float
    """exp(Hodges-Lehmann estimate of the shift in log time): 1.03 means the candidate takes 3% longer."""
    low: float
    """Lower end of the interval (nan when there are too few samples for one at this confidence)."""
    high: float
    """Upper end of the interval (nan likewise)."""
    n_baseline: int
    n_candidate: int
    method: str
    """'exact' or 'normal': how the interval's ranks were found."""

    @property
    def has_interval(self) -> bool:
        return math.isfinite(self.low) and math.isfinite(self.high)


def _u_pmf(m: int, n: int) -> np.ndarray:
    """P(U = u), u = 0..m*n, for the Mann-Whitney U of samples of sizes m and n with no ties.

    The number of arrangements with U = u is the coefficient of q^u in the Gaussian binomial
    [m+n choose m]_q = prod_{i=1..m} (1 - q^(n+i)) / (1 - q^i); each factor is applied in turn
    (dividing by 1 - q^i is a running sum with stride i), rescaled as it goes so that no
    coefficient overflows.
    """
    c = np.ones(1)
    for i in range(1, m + 1):
        prod = np.zeros(i * n + i + 1)
        prod[: c.size] += c
        prod[n + i: n + i + c.size] -= c
        for r in range(i):
            prod[r::i] = np.cumsum(prod[r::i])
        c = np.clip(prod[: i * n + 1], 0.0, None)  # the division is exact; clip rounding below zero
        c /= c.max()
    return c / c.sum()


@functools.lru_cache(maxsize=256)  # rows share sample counts (10, 30, 70...): each pair is worked out once
def lower_rank(m: int, n: int, confidence: float) -> tuple[int, str]:
    """The 1-based rank C of the interval's lower end among the m*n sorted differences.

    The interval [d_(C), d_(mn+1-C)] covers the true shift with probability >= `confidence`:
    C - 1 is the largest u with P(U <= u) <= (1 - confidence) / 2 under the null.

    Args:
        m: baseline sample count.
        n: candidate sample count.
        confidence: e.g. 0.95.

    Returns:
        (C, method): C = 0 when no interval exists at this confidence (too few samples), and the
        method, 'exact' or 'normal'.
    """
    tail = (1.0 - confidence) / 2.0
    if m * n <= EXACT_MAX_PAIRS:
        cdf = np.cumsum(_u_pmf(min(m, n), max(m, n)))  # U's distribution is symmetric in m and n
        below = np.nonzero(cdf <= tail + 1e-12)[0]  # 1e-12: a cumulative sum's rounding must not drop a rank
        return (int(below[-1]) + 1 if below.size else 0), "exact"
    return normal_rank(m, n, confidence), "normal"


def normal_rank(m: int, n: int, confidence: float) -> int:
    """`lower_rank` from the normal approximation of U (mean mn/2, variance mn(m+n+1)/12, no tie
    correction: ties shrink the variance, so leaving it out only widens the interval)."""
    from scipy.stats import norm

    sigma = math.sqrt(m * n * (m + n + 1) / 12.0)
    c = math.floor(m * n / 2.0 - float(norm.ppf(0.5 + confidence / 2.0)) * sigma)
    return max(c, 0)


def positive_samples(x: Any) -> np.ndarray:
    """Finite, positive samples as a float array (a time of zero or below has no logarithm)."""
    arr = np.asarray(x if x is not None else [], dtype=float).ravel()
    return arr[np.isfinite(arr) & (arr > 0)]


def log_shift(baseline: Any, candidate: Any, confidence: float = 0.95) -> Shift:
    """Hodges-Lehmann estimate of candidate time over baseline time, with its interval.

    Args:
        baseline: the baseline row's kept samples (ms).
        candidate: the candidate row's kept samples (ms).
        confidence: the interval's confidence level.

    Returns:
        A Shift; ratio is nan when a side has no samples, low/high nan when there are too few
        for an interval at this confidence (5 and 5 are not enough at 95%).
    """
    a, b = positive_samples(baseline), positive_samples(candidate)
    m, n = a.size, b.size
    nan = float("nan")
    if m == 0 or n == 0:
        return Shift(nan, nan, nan, m, n, "none")
    d = np.subtract.outer(np.log(b), np.log(a)).ravel()
    total = d.size
    c, method = lower_rank(m, n, confidence)
    mid = [(total - 1) // 2, total // 2]
    ranks = sorted({*mid, *([c - 1, total - c] if c >= 1 else [])})
    part = np.partition(d, ranks)
    est = 0.5 * (part[mid[0]] + part[mid[1]])
    if c < 1:
        return Shift(math.exp(est), nan, nan, m, n, method)
    return Shift(math.exp(est), math.exp(part[c - 1]), math.exp(part[total - c]), m, n, method)


def verdict(shift: Shift, threshold: float) -> str:
    """faster / slower / same / ambiguous for an interval against the practical threshold.

    Args:
        shift: the row's Shift.
        threshold: the relative change that matters, e.g. 0.02 for 2%.

    Returns:
        One of FASTER, SLOWER, SAME, AMBIGUOUS (the last also when there is no interval).
    """
    if not shift.has_interval:
        return AMBIGUOUS
    up, down = 1.0 + threshold, 1.0 / (1.0 + threshold)
    if shift.low > up:
        return SLOWER
    if shift.high < down:
        return FASTER
    if shift.low >= down and shift.high <= up:
        return SAME
    return AMBIGUOUS


def log_and_se(shift: Shift, confidence: float) -> tuple[float, float]:
    """(log ratio, its within-run standard error) of a row's interval (half its width over the normal
    quantile): the row's run as the kernel pooling (`faprof.analysis.comparison.pool`) reads it."""
    from scipy.stats import norm

    return math.log(shift.ratio), (math.log(shift.high) - math.log(shift.low)) / (2.0 * float(norm.ppf(0.5 + confidence / 2.0)))


def hl_one_sample(x: Sequence[float] | np.ndarray) -> float:
    """The one-sample Hodges-Lehmann estimate: the median of the Walsh averages (x_i + x_j) / 2, i <= j."""
    a = np.asarray(x, dtype=float)
    i, j = np.triu_indices(a.size)
    return float(np.median((a[i] + a[j]) / 2.0))
