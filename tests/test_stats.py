"""Statistics of the harness on known samples."""

import math

import pytest

from faprof.harness import summarize, t_quantile_975


def test_summarize_known_samples():
    s = summarize([1.0, 2.0, 3.0, 4.0, 5.0])
    assert s["n"] == 5
    assert s["median"] == 3.0
    assert s["mean"] == 3.0
    assert s["std"] == pytest.approx(math.sqrt(2.5))
    sem = math.sqrt(2.5) / math.sqrt(5)
    assert s["sem"] == pytest.approx(sem)
    # 95% CI of the mean with Student's t, 4 degrees of freedom: 2.776
    assert s["ci95_low"] == pytest.approx(3.0 - 2.776 * sem)
    assert s["ci95_high"] == pytest.approx(3.0 + 2.776 * sem)
    assert s["rel_sem"] == pytest.approx(sem / 3.0)
    assert (s["min"], s["max"]) == (1.0, 5.0)


def test_summarize_even_count_median_and_single_sample():
    assert summarize([4.0, 1.0, 3.0, 2.0])["median"] == 2.5
    one = summarize([7.0])
    assert one["n"] == 1 and one["median"] == 7.0 and one["std"] == 0.0 and math.isnan(one["sem"])
    assert summarize([]) == {"n": 0}


@pytest.mark.parametrize("dof,t", [(1, 12.706), (4, 2.776), (10, 2.228), (30, 2.042), (1000, 1.960)])
def test_t_table(dof, t):
    assert t_quantile_975(dof) == pytest.approx(t)


def test_t_interpolation_is_between_neighbours():
    assert 2.042 > t_quantile_975(35) > 2.021


def test_speedups_use_each_groups_baseline():
    import pandas as pd

    from faprof.analysis import with_speedups

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
