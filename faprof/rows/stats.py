"""Statistics of timing samples: the median with a distribution-free CI, spread, outliers, tests.

Kernel timings are heavy-tailed (a few samples at 2-3x the median from clock changes, preemption
or a late flush are normal), so faprof leads with the median and gives it a confidence interval
that assumes nothing about the distribution: the order-statistic interval of the median (the
binomial construction, `scipy.stats.quantile_test`). The mean, its standard error and the
standard deviation are kept as secondary columns only.

Two rows (two runs of one variant and problem, or two variants) are compared with one method
everywhere (`faprof compare`, the dashboard's Diff page): the ratio of medians, and the two-sided
Mann-Whitney U test on the kept samples (`scipy.stats.mannwhitneyu`), significant at
`SIGNIFICANCE_ALPHA`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

#: Confidence level of every interval faprof prints.
CONFIDENCE = 0.95

#: Significance level of the two-sample test used by `compare` and the dashboard's Diff page.
SIGNIFICANCE_ALPHA = 0.05

#: Tukey's fences: a sample is an outlier when it lies more than this many IQRs outside the quartiles.
OUTLIER_IQR = 1.5


def as_samples(v: Any) -> np.ndarray:
    """A row's kept samples (a list, an array, or a JSON string as CSV exports hold them) as a float
    array; empty for a missing or unreadable value."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return np.array([], dtype=float)
    if isinstance(v, str):
        import json

        try:
            v = json.loads(v)
        except ValueError:
            return np.array([], dtype=float)
    try:
        return np.asarray(list(v), dtype=float)
    except (TypeError, ValueError):
        return np.array([], dtype=float)


def median_ci(samples: Sequence[float] | np.ndarray, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Distribution-free confidence interval of the median: a pair of order statistics.

    The interval [x_(l), x_(u)] covers the population median with probability >= `confidence` for
    any continuous distribution (the number of samples below the median is Binomial(n, 1/2)).
    Needs n >= 6 at 95%; with fewer samples no such interval exists and (nan, nan) is returned.
    The median itself always lies inside the interval.
    """
    from scipy import stats as sps

    x = np.asarray(samples, dtype=float)
    x = x[np.isfinite(x)]
    n = x.size
    if n < 2:
        return float("nan"), float("nan")
    res = sps.quantile_test(x, q=float(np.median(x)), p=0.5)
    ci = res.confidence_interval(confidence)
    low, high = float(ci.low), float(ci.high)
    if not (math.isfinite(low) and math.isfinite(high)):
        return float("nan"), float("nan")
    return low, high


def summarize(samples: Sequence[float] | np.ndarray) -> dict[str, Any]:
    """Median with its 95% CI, quartiles, IQR, outliers (Tukey), mean, SEM, std, min, max, n.

    `rel_ci` is the CI's half-width over the median (the stop rule's quantity): the larger of the
    two sides, since the interval need not be symmetric.
    """
    x = np.asarray(samples, dtype=float)
    x = x[np.isfinite(x)]
    n = int(x.size)
    if n == 0:
        return {"n": 0}
    med = float(np.median(x))
    q1, q3 = (float(v) for v in np.percentile(x, [25, 75]))
    iqr = q3 - q1
    lo_fence, hi_fence = q1 - OUTLIER_IQR * iqr, q3 + OUTLIER_IQR * iqr
    outliers = int(np.count_nonzero((x < lo_fence) | (x > hi_fence)))
    mean = float(x.mean())
    std = float(x.std(ddof=1)) if n > 1 else 0.0
    sem = std / math.sqrt(n) if n > 1 else float("nan")
    low, high = median_ci(x)
    half = max(med - low, high - med) if math.isfinite(low) else float("nan")
    return {
        "n": n,
        "median": med,
        "ci95_low": low,
        "ci95_high": high,
        "rel_ci": half / med if med > 0 and math.isfinite(half) else float("nan"),
        "q1": q1,
        "q3": q3,
        "iqr": iqr,
        "outliers": outliers,
        "mean": mean,
        "std": std,
        "sem": sem,
        "rel_sem": sem / mean if mean > 0 and n > 1 else float("nan"),
        "min": float(x.min()),
        "max": float(x.max()),
    }


def significance(a: Sequence[float] | np.ndarray | None, b: Sequence[float] | np.ndarray | None,
                 alpha: float = SIGNIFICANCE_ALPHA) -> dict[str, Any]:
    """Compare two sets of timing samples: ratio of medians (b / a) and Mann-Whitney U's p-value.

    Returns {'ratio', 'p_value', 'significant', 'method'}; with fewer than 3 samples on a side
    there is no test ('p_value' nan, 'significant' None). `ratio` > 1 means b is slower.
    """
    from scipy import stats as sps

    xa = np.asarray(a if a is not None else [], dtype=float)
    xb = np.asarray(b if b is not None else [], dtype=float)
    xa, xb = xa[np.isfinite(xa)], xb[np.isfinite(xb)]
    out: dict[str, Any] = {"ratio": float("nan"), "p_value": float("nan"), "significant": None,
                           "method": "Mann-Whitney U (two-sided) on the samples; ratio of medians"}
    if xa.size and xb.size and np.median(xa) > 0:
        out["ratio"] = float(np.median(xb) / np.median(xa))
    if xa.size >= 3 and xb.size >= 3:
        if np.array_equal(np.unique(xa), np.unique(xb)) and np.unique(xa).size == 1:
            p = 1.0  # identical constant samples: no evidence of a difference
        else:
            p = float(sps.mannwhitneyu(xa, xb, alternative="two-sided", method="asymptotic").pvalue)
        out["p_value"] = p
        out["significant"] = bool(p < alpha)
    return out


def enough_samples(n: int, median_ms: float, min_repeats: int, min_repeats_short: int, short_call_ms: float) -> bool:
    """Whether `n` samples meet the floor: `min_repeats`, or `min_repeats_short` for calls under
    `short_call_ms` (short calls are cheap and noisy, so they always get more)."""
    floor = max(min_repeats, min_repeats_short) if median_ms < short_call_ms else min_repeats
    return n >= floor
