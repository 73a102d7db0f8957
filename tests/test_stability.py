"""Unstable timings are flagged: the three tests of faprof.rows.stability against samples whose shape is
known (drawn from stated distributions), then on the committed bundles' real samples: no CUPTI-timed GPU
row of the H100/H200 bundles is flagged, the CPU runs' bimodal rows are, and every row of every bundle
carries a verdict when it is read (bundles written before the flag get it from their kept samples)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from faprof.rows import stability
from faprof.store import Bundle, find_bundles

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "runs"
BUNDLES = ROOT / "tests" / "data" / "bundles"
CPU_L4 = BUNDLES / "20261121T193107Z_cpu_l4-causal"
EVENTS_L4 = EXAMPLES / "20261121T201056Z_nvidia-h100-80gb-hbm3_l4-causal"


def _rng() -> np.random.Generator:
    return np.random.default_rng(26)


# ------------------------------------------------------------------------------- known shapes
def test_two_separated_groups_are_bimodal_and_say_where_each_is():
    rng = _rng()
    fast = rng.lognormal(np.log(0.15), 0.05, 170)
    slow = rng.lognormal(np.log(16.0), 0.3, 30)  # 15% of the calls preempted, ~100x slower
    samples = rng.permutation(np.concatenate([fast, slow]))
    b = stability.bimodality(samples)
    assert stability.is_bimodal(b)
    assert b.share == pytest.approx(0.15, abs=0.01)
    assert b.minority_ms == pytest.approx(16.0, rel=0.1) and b.majority_ms == pytest.approx(0.15, rel=0.05)
    flag, why = stability.assess(samples, "host", "converged")
    assert flag and re.fullmatch(r"bimodal: 15% of the samples near 1[5-7] ms, the rest near 0\.15 ms", why), why


@pytest.mark.parametrize("name,samples", [
    ("one lognormal", _rng().lognormal(0.0, 0.3, 500)),
    ("one normal, wide", _rng().normal(1.0, 0.1, 500)),
    ("a few slow outliers", np.concatenate([_rng().normal(1.0, 0.01, 495), [3.0, 4.0, 5.0, 6.0, 9.0]])),
    ("two clock states 10% apart", np.concatenate([_rng().normal(1.0, 0.002, 300), _rng().normal(1.1, 0.002, 200)])),
    ("timestamps quantized to two values", np.array([5.152e-3] * 120 + [5.184e-3] * 80)),
])
def test_one_distribution_is_not_bimodal(name, samples):
    assert not stability.is_bimodal(stability.bimodality(samples)), name


def test_the_thresholds_sit_between_one_distribution_and_two_groups():
    """The separation of one normal is 2/pi = 0.64 and of a uniform 0.75 (Otsu's best cut), below the
    threshold; two groups 1.5x apart with little spread come out near 1."""
    rng = _rng()
    assert stability.bimodality(rng.lognormal(0, 0.5, 20000)).separation == pytest.approx(0.637, abs=0.01)
    assert stability.bimodality(np.exp(rng.uniform(0, 1, 20000))).separation == pytest.approx(0.75, abs=0.01)
    two = np.concatenate([rng.normal(1.0, 0.01, 300), rng.normal(1.5, 0.015, 100)])
    assert stability.bimodality(two).separation > 0.95
    assert stability.BIMODAL_MIN_SEPARATION > 0.75


def test_a_drift_is_found_in_time_order_and_only_when_material():
    rng = _rng()
    ramp = np.linspace(1.0, 2.0, 300) * rng.normal(1.0, 0.01, 300)  # the machine slows down by 2x
    d = stability.drift(ramp)
    assert stability.is_drifting(d) and d.last_ms > d.first_ms and d.p_value < 1e-10
    flag, why = stability.assess(ramp, "cupti", "converged")
    assert flag and "drifting: the last third of the samples 1.6x slower than the first" in why
    # the same samples shuffled: no order, no drift (the median is the same)
    assert not stability.is_drifting(stability.drift(rng.permutation(ramp)))
    # a real but small drift (3%, a clock settling) is significant and yet not material
    small = np.linspace(1.0, 1.03, 300) * rng.normal(1.0, 0.001, 300)
    d = stability.drift(small)
    assert d.p_value < stability.DRIFT_ALPHA and not stability.is_drifting(d)
    assert stability.drift(ramp[: stability.DRIFT_MIN_SAMPLES - 1]) is None


def test_only_cpu_rows_are_held_to_their_stop_rule():
    rng = _rng()
    samples = rng.normal(1.0, 0.05, 40)
    rule = stability.host_stop_rule({"target_rel_ci": 0.005, "target_rel_ci_host": 0.02})
    assert (rule.column, rule.target) == ("rel_ci", 0.02)
    flag, why = stability.assess(samples, "host", "budget", {"rel_ci": 0.031}, rule)
    assert flag and why == ("missed its stop rule: the median's 95% CI was ±3.1% when the timing stopped (budget), "
                            "the rule asks for ±2%")
    assert not stability.assess(samples, "host", "converged", {"rel_ci": 0.031}, rule)[0]
    assert not stability.assess(samples, "host", "budget", {"rel_ci": 0.015}, rule)[0]
    assert not stability.assess(samples, "cupti", "budget", {"rel_ci": 0.031}, rule)[0]  # GPU rows: not this test


@pytest.mark.parametrize("timing,expected", [
    ({"target_rel_ci": 0.005, "target_rel_ci_host": 0.02}, ("rel_ci", 0.02)),
    ({"target_rel_ci": 0.005}, ("rel_ci", 0.005)),  # one rule for every row (faprof of 2026-11-23 morning)
    ({"target_rel_sem": 0.005}, ("rel_sem", 0.005)),  # the first wave: the mean's standard error
    ({}, None),
])
def test_the_stop_rule_is_the_one_the_bundle_ran_with(timing, expected):
    rule = stability.host_stop_rule(timing)
    assert (None if rule is None else (rule.column, rule.target)) == expected


# ------------------------------------------------------------------------------- real samples
def _all_rows():
    for root in (EXAMPLES, BUNDLES):
        for b in find_bundles(root):
            df = b.measurements()
            if not df.empty and "samples_ms" in df:
                yield b, df[df["status"].isin(["ok", "wrong"])]


def test_no_cupti_timed_gpu_row_of_the_h100_and_h200_bundles_is_flagged():
    seen = 0
    for b, df in _all_rows():
        gpu = df[df["timer"] == "cupti"]
        seen += len(gpu)
        flagged = gpu[gpu["unstable"].astype(bool)]
        assert flagged.empty, (b.run_id, flagged[["variant", "shape_id", "unstable_reason"]].to_string())
    assert seen > 1500  # every CUPTI row of the committed bundles (1,927 when this was written)


def test_the_cpu_runs_bimodal_rows_are_flagged():
    df = Bundle(CPU_L4).measurements()
    row = df[(df["variant"] == "cpu_ref") & (df["shape_id"] == "b1_h1_sq128_sk128_d64_fp16_causal_fwd")].iloc[0]
    # 46 calls of ~0.16 ms, 7 of them preempted to 4-32 ms: the median holds, the next run's may not
    assert row["unstable"] and "bimodal: 15% of the samples near 16.1 ms, the rest near 0.159 ms" in row["unstable_reason"]
    timed = df[df["status"] == "ok"]
    assert timed["unstable"].all()  # a loaded CPU with a 0.1 s budget: none met its stop rule either
    assert timed["unstable_reason"].str.contains("bimodal").sum() >= 5


def test_a_first_wave_event_timed_row_with_a_slow_mode_is_flagged():
    """sdpa_efficient fp32 at B=16 S=512 (CUDA events, 2026-11-21): 11% of 2,050 calls took 2.8x the rest."""
    df = Bundle(EVENTS_L4).measurements()
    row = df[(df["variant"] == "sdpa_efficient") & (df["shape_id"] == "b16_h8_sq512_sk512_d64_fp32_causal_fwd")].iloc[0]
    assert row["timer"] == "cuda_event" and row["unstable"]
    assert row["unstable_reason"].startswith("bimodal: 11% of the samples near 0.5")


def test_every_timed_row_carries_a_verdict_when_read():
    for b, df in _all_rows():
        with_samples = df[df["samples_ms"].map(lambda s: s is not None and len(s) > 0)]
        assert with_samples["unstable"].notna().all(), b.run_id
        reasons = with_samples.loc[with_samples["unstable"].astype(bool), "unstable_reason"]
        assert reasons.str.len().gt(10).all(), b.run_id


# ----------------------------------------------------------------------------- where it shows
H100_L4 = BUNDLES / "20261121T192510Z_nvidia-h100-80gb-hbm3_l4-causal"


def test_compare_never_calls_a_difference_between_unstable_rows_significant():
    """The issue's case: a noisy CPU run against another run. Without the flag every row read 'significant'."""
    from faprof.report.compare import compare_runs, compare_summary

    a, b = Bundle(CPU_L4), Bundle(H100_L4)
    rows = compare_runs(a, b)
    both = rows[rows["status_a"].isin(["ok", "wrong"]) & rows["status_b"].isin(["ok", "wrong"])]
    assert not both.empty and (both["unstable"] != "").all()
    assert both["significant"].isna().all()  # not tested, rather than 'yes'
    assert (both["p_value"] < 0.05).all()  # what the test alone would have said
    summary = compare_summary(a, b, rows)
    assert "every one with unstable timings: not a reliable figure" in summary.headline
    assert any("have unstable timings in A or B" in w for w in summary.warnings)


def test_the_dashboards_diff_does_not_test_unstable_pairs_either():
    from faprof import analysis

    runs = analysis.load_runs([(CPU_L4, "command line"), (H100_L4, "command line")])
    m = runs.measurements
    d = analysis.diff_runs(m[m["run_id"] == CPU_L4.name], m[m["run_id"] == H100_L4.name])
    both = d[d["ratio"].notna()]
    assert both["verdict"].str.startswith(analysis.UNSTABLE_VERDICT).all() and not both["significant"].any()
