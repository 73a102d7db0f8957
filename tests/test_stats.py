"""Statistics of the harness on known samples."""

import math
import statistics

import numpy as np
import pytest

from faprof.rows.stats import enough_samples, median_ci, significance, summarize


def test_summarize_known_samples():
    s = summarize([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0])
    assert s["n"] == 10 and s["median"] == 5.5 and s["mean"] == 5.5
    # order-statistic interval of the median, n=10 at >=95%: x_(2)..x_(9) covers with 97.9%
    # (x_(3)..x_(8) only 89.1%), so [2, 9]
    assert (s["ci95_low"], s["ci95_high"]) == (2.0, 9.0)
    assert s["rel_ci"] == pytest.approx(3.5 / 5.5)
    assert s["q1"] == pytest.approx(3.25) and s["q3"] == pytest.approx(7.75) and s["iqr"] == pytest.approx(4.5)
    assert s["outliers"] == 0
    assert s["std"] == pytest.approx(statistics.stdev(range(1, 11)))
    assert (s["min"], s["max"]) == (1.0, 10.0)


def test_median_ci_coverage_matches_the_binomial():
    # the interval's coverage for n=10 is P(2 <= Bin(10, 1/2) <= 8) = 1 - 2*(1 + 10)/1024
    from scipy import stats as sps

    cover = sps.binom.cdf(8, 10, 0.5) - sps.binom.cdf(1, 10, 0.5)
    assert cover == pytest.approx(1 - 22 / 1024) and cover >= 0.95


def test_median_is_always_inside_its_ci_on_heavy_tailed_samples():
    rng = np.random.default_rng(7)
    for n in (6, 7, 30, 31, 200, 2050):
        # a body near 10 us and 11% of samples at 2.5-3x (as one l4_causal row had)
        x = rng.normal(10.0, 0.1, n)
        tail = rng.random(n) < 0.11
        x[tail] *= rng.uniform(2.5, 3.0, tail.sum())
        s = summarize(x)
        assert s["ci95_low"] <= s["median"] <= s["ci95_high"], n
    # the mean's t-interval misses the median on such data: the reason the CI changed
    m = x.mean()
    half = 1.96 * x.std(ddof=1) / math.sqrt(x.size)
    assert not (m - half <= np.median(x) <= m + half)


def test_outliers_and_too_few_samples():
    s = summarize([1.0, 1.0, 1.1, 0.9, 1.0, 1.05, 0.95, 9.0])
    assert s["outliers"] == 1
    few = summarize([3.0, 1.0, 2.0])
    assert few["median"] == 2.0 and math.isnan(few["ci95_low"]) and math.isnan(few["rel_ci"])
    assert summarize([]) == {"n": 0}
    assert all(math.isnan(v) for v in median_ci([1.0]))


def test_significance_is_mann_whitney_with_ratio_of_medians():
    from scipy import stats as sps

    rng = np.random.default_rng(3)
    a, b = rng.normal(1.0, 0.02, 40), rng.normal(1.05, 0.02, 40)
    r = significance(a, b)
    assert r["ratio"] == pytest.approx(np.median(b) / np.median(a))
    assert r["p_value"] == pytest.approx(sps.mannwhitneyu(a, b, alternative="two-sided", method="asymptotic").pvalue)
    assert r["significant"] is True
    same = significance(a, rng.permutation(a))
    assert same["significant"] is False and same["ratio"] == pytest.approx(1.0)
    assert significance([1.0, 2.0], [1.0, 2.0])["significant"] is None  # too few samples: no verdict


def test_stop_floor_for_short_calls():
    assert not enough_samples(10, 0.05, 10, 30, 0.1)  # a 50 us call needs 30
    assert enough_samples(30, 0.05, 10, 30, 0.1)
    assert enough_samples(10, 0.5, 10, 30, 0.1)  # a 0.5 ms call: min_repeats


def test_old_bundles_get_the_median_ci_on_read(tmp_path):
    import pandas as pd

    from faprof.store import upgrade_statistics

    rng = np.random.default_rng(1)
    x = list(rng.lognormal(0, 0.3, 50))
    # a row as written before: the mean's interval, which does not contain the median
    df = pd.DataFrame([{"variant": "v", "shape_id": "s", "median_ms": float(np.median(x)), "ci95_low_ms": 1.2,
                        "ci95_high_ms": 1.3, "samples_ms": x}])
    up = upgrade_statistics(df)
    assert up.at[0, "ci95_low_ms"] <= up.at[0, "median_ms"] <= up.at[0, "ci95_high_ms"]
    assert "recomputed" in up.at[0, "stats_note"]


def test_speedups_use_each_groups_baseline():
    import pandas as pd

    from faprof.analysis.speedups import with_speedups

    df = pd.DataFrame([
        {"variant": "flash", "shape_id": "h", "group": "fp16", "status": "ok", "median_ms": 1.0},
        {"variant": "mine", "shape_id": "h", "group": "fp16", "status": "ok", "median_ms": 4.0},
        {"variant": "eff", "shape_id": "f", "group": "fp32", "status": "ok", "median_ms": 2.0},
        {"variant": "mine", "shape_id": "f", "group": "fp32", "status": "ok", "median_ms": 1.0},
        {"variant": "bad", "shape_id": "f", "group": "fp32", "status": "failed", "median_ms": None},
    ])
    out = with_speedups(df, "flash", {"fp32": "eff"}).set_index(["variant", "shape_id"])
    assert out.loc[("mine", "h"), "speedup"] == 0.25 and out.loc[("mine", "h"), "baseline"] == "flash"
    assert out.loc[("mine", "f"), "speedup"] == 2.0 and out.loc[("mine", "f"), "baseline"] == "eff"
    assert out.loc[("eff", "f"), "speedup"] == 1.0
    assert pd.isna(out.loc[("bad", "f"), "speedup"])


def test_no_committed_bundle_has_a_median_outside_its_ci():
    from pathlib import Path

    from faprof.store import find_bundles

    root = Path(__file__).resolve().parent.parent
    checked = 0
    for folder in (root / "examples" / "runs", root / "tests" / "data"):
        for b in find_bundles(folder):
            df = b.measurements()
            if "median_ms" not in df or "ci95_low_ms" not in df:
                continue
            t = df[df["median_ms"].notna() & df["ci95_low_ms"].notna()]
            bad = t[(t["median_ms"] < t["ci95_low_ms"]) | (t["median_ms"] > t["ci95_high_ms"])]
            assert bad.empty, (b.path.name, bad[["variant", "shape_id", "median_ms", "ci95_low_ms", "ci95_high_ms"]])
            checked += len(t)
    assert checked > 500
