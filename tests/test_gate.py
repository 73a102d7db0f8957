"""`faprof gate`: the interval against exact references, then verdicts on recorded H100 bundles.

Method: the Hodges-Lehmann interval's ranks are checked against enumeration of the Mann-Whitney
null distribution and against printed critical values; the gate runs on copies of real bundles
(examples/runs: `h100_headline` timed by CUPTI, `l4_causal` with ncu tables) in which one thing is
changed on purpose: one variant's kept samples scaled by 1.03 (a planted 3% slowdown), every row
resampled from its own recorded samples (the same code run twice), a GPU name, a driver, a clock,
a status. Each test states what the gate must say about exactly those rows.
"""

from __future__ import annotations

import itertools
import json
import math
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from faprof import advisor
from faprof.analysis.comparison.shift import (
    AMBIGUOUS,
    EXACT_MAX_PAIRS,
    FASTER,
    SAME,
    SLOWER,
    Shift,
    _u_pmf,
    log_shift,
    lower_rank,
    normal_rank,
    verdict,
)
from faprof.cli import main
from faprof.errors import FaprofError
from faprof.gate import (
    DEFAULT_THRESHOLD,
    EXIT_AMBIGUOUS,
    EXIT_OK,
    EXIT_REGRESSION,
    GateOptions,
    cudnn_version,
    parse_threshold,
    run_gate,
)
from faprof.gate.outputs import render_json, render_junit, render_markdown, result_dict
from faprof.gate.why_moved import MIN_COUNTER_CHANGE, Nsight, _calls, advisor_changes, counter_changes
from faprof.model.scenarios import gate_threshold, load_scenario
from faprof.store import Bundle

EXAMPLES = Path(__file__).parent.parent / "examples" / "runs"
HEADLINE = EXAMPLES / "20261123T082324Z_nvidia-h100-80gb-hbm3_h100-headline"
L4_NCU = EXAMPLES / "20261123T082512Z_nvidia-h100-80gb-hbm3_l4-causal"


def _copy(src: Path, tmp_path: Path, name: str) -> Bundle:
    dst = tmp_path / name
    shutil.copytree(src, dst)
    return Bundle(dst)


def _edit_rows(b: Bundle, fn) -> None:
    m = b.measurements()
    b.write("measurements", fn(m))


def _scale(b: Bundle, variant: str, factor: float) -> None:
    def fn(m: pd.DataFrame) -> pd.DataFrame:
        sel = (m["variant"] == variant) & m["samples_ms"].notna()
        m.loc[sel, "samples_ms"] = m.loc[sel, "samples_ms"].map(lambda s: np.asarray(s, dtype=float) * factor)
        m.loc[sel, "median_ms"] = m.loc[sel, "median_ms"] * factor
        return m
    _edit_rows(b, fn)


def _edit_env(b: Bundle, **changes) -> None:
    m = b.manifest()
    m["env"].update(changes)
    b.write_manifest(m)


def _gpu_timed(b: Bundle) -> pd.DataFrame:
    m = b.measurements()
    return m[m["status"].isin(["ok", "wrong"]) & m["timer"].isin(["cupti", "cuda_event"])]


# ---------------------------------------------------------------------------- the interval
def _u_by_enumeration(m: int, n: int) -> np.ndarray:
    """P(U = u) by listing every arrangement of m baseline and n candidate samples."""
    counts = np.zeros(m * n + 1)
    for pos in itertools.combinations(range(m + n), m):
        chosen, u, others = set(pos), 0, 0
        for k in range(m + n):
            if k in chosen:
                u += others
            else:
                others += 1
        counts[u] += 1
    return counts / counts.sum()


@pytest.mark.parametrize(("m", "n"), [(3, 4), (4, 5), (5, 5), (2, 7), (6, 3)])
def test_u_distribution_matches_enumeration(m, n):
    assert np.allclose(_u_pmf(m, n), _u_by_enumeration(m, n), atol=1e-15)


@pytest.mark.parametrize(("m", "n", "critical"), [(4, 4, 0), (5, 5, 2), (6, 6, 5), (8, 12, 22), (10, 10, 23), (20, 20, 127)])
def test_interval_ranks_match_printed_critical_values(m, n, critical):
    """Two-sided 5% critical values of U (Mann-Whitney tables): the interval starts one rank above."""
    assert lower_rank(m, n, 0.95) == (critical + 1, "exact")


def test_too_few_samples_give_no_interval_and_an_ambiguous_verdict():
    assert lower_rank(3, 3, 0.95)[0] == 0  # P(U = 0) = 1/20 > 2.5%
    s = log_shift([1.0, 1.1, 1.2], [2.0, 2.1, 2.2])
    assert math.isfinite(s.ratio) and not s.has_interval
    assert verdict(s, 0.02) == AMBIGUOUS


@pytest.mark.parametrize(("m", "n"), [(50, 50), (25, 100), (10, 250)])
def test_normal_ranks_are_close_to_exact_where_they_take_over(m, n):
    """At the switch-over (2,500 pairs) the normal rank is at most 3 below the exact one (a slightly
    wider interval), never above it (a narrower one)."""
    assert m * n <= EXACT_MAX_PAIRS < (m + 1) * n
    assert 0 <= lower_rank(m, n, 0.95)[0] - normal_rank(m, n, 0.95) <= 3
    assert lower_rank(m + 1, n, 0.95)[1] == "normal"


def test_estimate_and_interval_against_brute_force():
    rng = np.random.default_rng(7)
    a = rng.lognormal(0.0, 0.02, 12)
    b = rng.lognormal(0.03, 0.02, 9)
    d = sorted(math.log(y) - math.log(x) for x in a for y in b)
    c, _ = lower_rank(12, 9, 0.95)
    s = log_shift(a, b)
    assert s.ratio == pytest.approx(math.exp((d[53] + d[54]) / 2) if len(d) % 2 == 0 else math.exp(d[len(d) // 2]))
    assert s.low == pytest.approx(math.exp(d[c - 1]))
    assert s.high == pytest.approx(math.exp(d[len(d) - c]))


def test_a_scaled_copy_is_estimated_exactly():
    x = np.asarray(pd.read_parquet(HEADLINE / "measurements.parquet").query("variant == 'fa2_mma'")["samples_ms"].iloc[0])
    s = log_shift(x, x * 1.03)
    assert s.ratio == pytest.approx(1.03, rel=1e-12)
    assert s.low < 1.03 < s.high


@pytest.mark.parametrize(("low", "high", "expected"), [
    (1.021, 1.05, SLOWER), (1.0, 1.019, SAME), (0.981, 1.0199, SAME), (0.95, 0.979, FASTER),
    (1.01, 1.03, AMBIGUOUS), (0.97, 0.99, AMBIGUOUS), (0.97, 1.03, AMBIGUOUS),
])
def test_verdict_zones(low, high, expected):
    assert verdict(Shift((low + high) / 2, low, high, 10, 10, "exact"), 0.02) == expected


# ---------------------------------------------------------------------------- verdicts
def test_a_planted_3_percent_slowdown_is_caught_on_exactly_those_rows(tmp_path):
    base = Bundle(HEADLINE)
    cand = _copy(HEADLINE, tmp_path, "cand")
    _scale(cand, "fa2_mma", 1.03)
    res = run_gate(base, cand)
    assert res.threshold == DEFAULT_THRESHOLD and res.threshold_source == "default"
    planted = set(_gpu_timed(base).query("variant == 'fa2_mma'")["shape_id"])
    assert len(planted) == 8
    slower = res.rows[res.rows["verdict"] == SLOWER]
    assert set(zip(slower["variant"], slower["shape_id"], strict=True)) == {("fa2_mma", s) for s in planted}
    assert slower["regression"].all() and slower["ratio"].between(1.0299, 1.0301).all()
    others = res.rows[res.rows["status_baseline"].isin(["ok"]) & (res.rows["variant"] != "fa2_mma")
                      & res.rows["gated"]]
    assert (others["verdict"] == SAME).all() and len(others) == len(_gpu_timed(base)) - 8
    assert res.exit_code == EXIT_REGRESSION
    assert any("ncu tables" in n for n in res.notes)  # neither side has ncu: said once, no why


def test_same_code_resampled_twenty_times_raises_no_alarm(tmp_path):
    """20 pairs of runs drawn from the recorded samples (each row resampled with replacement, its own n)."""
    src = Bundle(HEADLINE).measurements()
    verdicts: list[str] = []
    for seed in range(20):
        rng = np.random.default_rng(seed)
        sides = []
        for side in ("a", "b"):
            b = _copy(HEADLINE, tmp_path / str(seed), side)

            def draw(m: pd.DataFrame, rng: np.random.Generator = rng) -> pd.DataFrame:
                m = m.copy()
                m["samples_ms"] = [None if s is None else rng.choice(np.asarray(s), size=len(s), replace=True)
                                   for s in src["samples_ms"]]
                return m
            _edit_rows(b, draw)
            sides.append(b)
        res = run_gate(*sides)
        assert res.regressions.empty, res.regressions[["variant", "shape_id", "ratio", "ci_low", "ci_high"]]
        assert res.exit_code in (EXIT_OK, EXIT_AMBIGUOUS)
        verdicts += list(res.rows[res.rows["gated"] & res.rows["status_baseline"].eq("ok")]["verdict"])
    counts = pd.Series(verdicts).value_counts()
    assert SLOWER not in counts and FASTER not in counts
    assert counts.get(SAME, 0) >= 0.95 * len(verdicts), counts


def test_a_faster_kernel_does_not_hold_the_gate(tmp_path):
    """(An undecided kernel needs real run-to-run noise: tests/test_gate_pool.py plants one in a recorded pair.)"""
    cand = _copy(HEADLINE, tmp_path, "cand")
    _scale(cand, "fa3_wgmma_e", 1 / 1.021)
    res = run_gate(Bundle(HEADLINE), cand)
    timed = res.rows[(res.rows["variant"] == "fa3_wgmma_e") & res.rows["status_baseline"].eq("ok")]
    assert (timed["verdict"] == FASTER).all() and not timed["undecided"].any()
    assert res.exit_code == EXIT_OK


def test_wrong_and_failed_candidate_rows_are_regressions_missing_rows_are_listed(tmp_path):
    cand = _copy(HEADLINE, tmp_path, "cand")
    shape = "b4_h16_sq4096_sk4096_d128_fp16_full_fwd"

    def fn(m: pd.DataFrame) -> pd.DataFrame:
        m.loc[(m["variant"] == "fa2_wmma") & (m["shape_id"] == shape), ["status", "check_reason"]] = \
            ["wrong", "max |err| 0.31 > 3 x PyTorch's error"]
        m.loc[(m["variant"] == "sdpa_flash") & (m["shape_id"] == shape), ["status", "reason"]] = ["failed", "illegal address"]
        return m[~((m["variant"] == "sdpa_efficient") & (m["shape_id"] == shape))]
    _edit_rows(cand, fn)
    res = run_gate(Bundle(HEADLINE), cand)
    row = res.rows.set_index(["variant", "shape_id"])
    assert row.loc[("fa2_wmma", shape), "verdict"] == "wrong" and row.loc[("fa2_wmma", shape), "regression"]
    assert "0.31" in row.loc[("fa2_wmma", shape), "reason"]
    assert row.loc[("sdpa_flash", shape), "verdict"] == "failed" and "illegal address" in row.loc[("sdpa_flash", shape), "reason"]
    assert row.loc[("sdpa_efficient", shape), "verdict"] == "missing"
    assert not row.loc[("sdpa_efficient", shape), "regression"]
    assert set(res.regressions["variant"]) == {"fa2_wmma", "sdpa_flash"}
    assert res.exit_code == EXIT_REGRESSION


def test_a_candidate_row_faster_than_the_gpu_can_be_fails_the_gate(tmp_path):
    cand = _copy(HEADLINE, tmp_path, "cand")
    shape = "b4_h16_sq4096_sk4096_d128_fp16_full_fwd"

    def fn(m: pd.DataFrame) -> pd.DataFrame:
        at = (m["variant"] == "fa3_wgmma_e") & (m["shape_id"] == shape)
        m.loc[at, "median_ms"] = m.loc[at, "median_ms"] / 20  # ~11,000 TFLOP/s, written as ok by an older faprof
        m.loc[at, "samples_ms"] = m.loc[at, "samples_ms"].map(lambda xs: [x / 20 for x in xs])
        return m
    _edit_rows(cand, fn)
    res = run_gate(Bundle(HEADLINE), cand)
    row = res.rows.set_index(["variant", "shape_id"]).loc[("fa3_wgmma_e", shape)]
    assert row["verdict"] == "failed" and row["regression"] and "physically impossible" in row["reason"]
    assert res.exit_code == EXIT_REGRESSION


def test_host_clock_rows_gate_only_when_asked(tmp_path):
    cand = _copy(L4_NCU, tmp_path, "cand")
    _scale(cand, "cpu_ref", 1.5)
    res = run_gate(Bundle(L4_NCU), cand)
    cpu = res.rows[res.rows["variant"] == "cpu_ref"]
    assert (cpu["verdict"] == SLOWER).all() and not cpu["gated"].any() and not cpu["regression"].any()
    assert res.exit_code == EXIT_OK
    res = run_gate(Bundle(L4_NCU), cand, GateOptions(include_host=True))
    assert set(res.regressions["variant"]) == {"cpu_ref"} and res.exit_code == EXIT_REGRESSION


def test_rows_timed_by_different_clocks_are_undecided(tmp_path):
    cand = _copy(HEADLINE, tmp_path, "cand")

    def fn(m: pd.DataFrame) -> pd.DataFrame:
        m.loc[m["variant"] == "fa2_mma", "timer"] = "cuda_event"
        return m
    _edit_rows(cand, fn)
    res = run_gate(Bundle(HEADLINE), cand)
    fa2 = res.rows[(res.rows["variant"] == "fa2_mma") & res.rows["status_baseline"].eq("ok")]
    assert (fa2["verdict"] == AMBIGUOUS).all() and fa2["undecided"].all()
    assert "cupti in the baseline and cuda_event in the candidate" in fa2["reason"].iloc[0]
    assert next(c for c in res.checks if c.item == "GPU timer (rows)").level == "warn"


# ---------------------------------------------------------------------------- provenance
def test_another_gpu_model_is_refused_in_one_line_naming_the_flag(tmp_path):
    cand = _copy(HEADLINE, tmp_path, "cand")
    _edit_rows(cand, lambda m: m.assign(gpu_name="NVIDIA H200"))
    _edit_env(cand, gpu_name="NVIDIA H200")
    with pytest.raises(FaprofError, match="--allow-mismatch") as e:
        run_gate(Bundle(HEADLINE), cand)
    assert "\n" not in str(e.value) and "NVIDIA H200" in str(e.value)
    res = run_gate(Bundle(HEADLINE), cand, GateOptions(allow_mismatch=True))
    gpu = next(c for c in res.checks if c.item == "GPU model")
    assert gpu.level == "warn" and "compare machines" in gpu.note
    assert (res.rows.loc[res.rows["status_baseline"].eq("ok") & res.rows["gated"], "verdict"] == SAME).all()


def test_driver_cudnn_and_power_cap_differences_warn_without_refusing(tmp_path):
    cand = _copy(HEADLINE, tmp_path, "cand")
    _edit_env(cand, smi_driver="575.57.08", cudnn=90800, smi_power_limit_w="500.00")
    res = run_gate(Bundle(HEADLINE), cand)
    levels = {c.item: c for c in res.checks}
    assert levels["driver"].level == "warn" and levels["driver"].candidate == "575.57.08"
    assert (levels["cuDNN"].baseline, levels["cuDNN"].candidate) == ("9.19.0", "9.8.0")
    assert levels["power cap (W)"].level == "warn"
    assert levels["GPU model"].level == "same" and levels["faprof commit"].level == "same"
    assert len(res.warnings) == 3 and res.exit_code == EXIT_OK


def test_cudnn_versions_read_as_versions():
    assert cudnn_version(91900) == "9.19.0"
    assert cudnn_version(8907) == "8.9.7"
    assert cudnn_version(None) == "not recorded"


def test_different_sm_clocks_get_a_clock_normalised_ratio(tmp_path):
    cand = _copy(HEADLINE, tmp_path, "cand")
    _edit_rows(cand, lambda m: m.assign(sm_clock_mhz=m["sm_clock_mhz"] * 0.95))
    _scale(cand, "fa2_mma", 1 / 0.95)  # the same cycles at a 5% lower clock
    res = run_gate(Bundle(HEADLINE), cand)
    fa2 = res.rows[(res.rows["variant"] == "fa2_mma") & res.rows["status_baseline"].eq("ok")]
    assert (fa2["verdict"] == SLOWER).all()  # the gate judges time, as users see it
    assert np.allclose(fa2["ratio_equal_clock"], 1.0, atol=1e-9)  # ...and says the cycles did not change
    assert "at equal clocks" in fa2["notes"].iloc[0][0]
    assert next(c for c in res.checks if c.item.startswith("SM clock")).level == "warn"


def test_at_equal_clocks_the_same_cycles_are_the_same(tmp_path):
    cand = _copy(HEADLINE, tmp_path, "cand")
    _edit_rows(cand, lambda m: m.assign(sm_clock_mhz=m["sm_clock_mhz"] * 0.95))
    _scale(cand, "fa2_mma", 1 / 0.95)
    res = run_gate(Bundle(HEADLINE), cand, GateOptions(equal_clocks=True))
    fa2 = res.rows[(res.rows["variant"] == "fa2_mma") & res.rows["status_baseline"].eq("ok")]
    assert (fa2["verdict"] == SAME).all() and np.allclose(fa2["ratio"], 1.0)
    # every other row kept its time at a 5% lower clock: 5% fewer cycles, faster at equal clocks
    others = res.rows[res.rows["gated"] & res.rows["status_baseline"].eq("ok") & (res.rows["variant"] != "fa2_mma")]
    assert (others["verdict"] == FASTER).all()
    assert "judged at equal SM clocks" in fa2["notes"].iloc[0][0]


def test_a_row_throttled_on_one_side_says_so(tmp_path):
    cand = _copy(HEADLINE, tmp_path, "cand")
    base_rows = Bundle(HEADLINE).measurements()
    quiet = base_rows[(base_rows["throttled"] == False) & base_rows["status"].eq("ok")].iloc[0]  # noqa: E712

    def fn(m: pd.DataFrame) -> pd.DataFrame:
        sel = (m["variant"] == quiet["variant"]) & (m["shape_id"] == quiet["shape_id"])
        m.loc[sel, ["throttled", "throttle_reasons"]] = [True, "hw_thermal_slowdown"]
        return m
    _edit_rows(cand, fn)
    res = run_gate(Bundle(HEADLINE), cand)
    row = res.rows[(res.rows["variant"] == quiet["variant"]) & (res.rows["shape_id"] == quiet["shape_id"])].iloc[0]
    assert "throttled in the candidate only (hw_thermal_slowdown)" in row["notes"]
    assert next(c for c in res.checks if c.item.startswith("throttled")).level == "warn"


# ---------------------------------------------------------------------------- threshold
def test_scenario_gate_threshold_is_validated(tmp_path):
    assert gate_threshold({"gate": {"threshold": 0.05}}, "x.toml") == 0.05
    assert gate_threshold({}, "x.toml") is None
    for bad in (2, 0, 1.0, "2%", True):
        with pytest.raises(FaprofError, match=r"x.toml: key 'gate.threshold': expected a fraction between 0 and 1"):
            gate_threshold({"gate": {"threshold": bad}}, "x.toml")
    with pytest.raises(FaprofError, match="gate.margin"):
        gate_threshold({"gate": {"margin": 0.1}}, "x.toml")
    with pytest.raises(FaprofError, match="key 'gate'"):
        gate_threshold({"gate": 0.02}, "x.toml")
    f = tmp_path / "s.toml"
    f.write_text((Path(__file__).parent.parent / "scenarios" / "smoke.toml").read_text() + "\n[gate]\nthreshold = 0.04\n")
    assert load_scenario(f).gate_threshold == 0.04
    assert load_scenario("smoke").gate_threshold is None


def test_the_candidates_scenario_threshold_applies_and_the_flag_overrides_it(tmp_path):
    cand = _copy(HEADLINE, tmp_path, "cand")
    _scale(cand, "fa2_mma", 1.03)
    m = cand.manifest()
    m["scenario"]["raw"]["gate"] = {"threshold": 0.05}
    cand.write_manifest(m)
    res = run_gate(Bundle(HEADLINE), cand)
    assert res.threshold == 0.05 and "h100_headline" in res.threshold_source
    assert res.exit_code == EXIT_OK and (res.rows.loc[res.rows["variant"] == "fa2_mma", "verdict"] != SLOWER).all()
    res = run_gate(Bundle(HEADLINE), cand, GateOptions(threshold=0.02))
    assert res.threshold_source == "--threshold" and res.exit_code == EXIT_REGRESSION


@pytest.mark.parametrize(("text", "value"), [("2%", 0.02), ("0.02", 0.02), ("0.5%", 0.005), (" 5% ", 0.05)])
def test_threshold_flag_takes_a_fraction_or_a_percentage(text, value):
    assert parse_threshold(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["2", "abc", "0", "-1%", "150%"])
def test_threshold_flag_rejects_what_is_not_a_relative_change(text):
    with pytest.raises(FaprofError, match="--threshold"):
        parse_threshold(text)


# ---------------------------------------------------------------------------- why it moved
def _regress_with_counters(tmp_path) -> tuple[Bundle, Bundle]:
    """l4_causal with ncu; the candidate's fa2_mma 5% slower, with more registers, less occupancy
    and a stall share moved from long_scoreboard to short_scoreboard."""
    cand = _copy(L4_NCU, tmp_path, "cand")
    _scale(cand, "fa2_mma", 1.05)
    s = cand.read("ncu_summary")
    k = (s["variant"] == "fa2_mma") & (s["kernel"] != "(all)")
    s.loc[k, "registers_per_thread"] = 168.0
    s.loc[k, "achieved_occupancy_pct"] *= 0.75
    s.loc[k, "duration_ms"] *= 1.05
    s.loc[k, "l2_hit_rate_pct"] *= 1.001  # below MIN_COUNTER_CHANGE: must not be listed
    cand.write("ncu_summary", s)
    st = cand.read("stalls")
    sel = st["variant"] == "fa2_mma"
    st.loc[sel & (st["reason"] == "long_scoreboard"), "share"] -= 0.1
    st.loc[sel & (st["reason"] == "short_scoreboard"), "share"] += 0.1
    cand.write("stalls", st)
    return Bundle(L4_NCU), cand


def test_regressed_rows_list_the_counters_and_stalls_that_moved(tmp_path):
    base, cand = _regress_with_counters(tmp_path)
    res = run_gate(base, cand)
    slower = res.rows[res.rows["verdict"] == SLOWER]
    assert set(slower["variant"]) == {"fa2_mma"} and len(slower) == 5
    for _, r in slower.iterrows():
        why = r["why"]
        names = [c["counter"] for c in why["counters"]]
        # registers 255 -> 168 is the largest relative change, then the occupancy (-25%), then the duration (+5%)
        assert names[:3] == ["registers_per_thread", "achieved_occupancy_pct", "duration_ms"]
        assert "l2_hit_rate_pct" not in names
        assert all(abs(c["rel_change"]) >= MIN_COUNTER_CHANGE for c in why["counters"])
        stalls = {s["reason"]: round(s["change"], 6) for s in why["stalls"]}
        assert stalls == {"long_scoreboard": -0.1, "short_scoreboard": 0.1}
        assert "registers 255 -> 168" in why["summary"] and "stall" in why["summary"]


def test_advisor_changes_are_the_difference_of_the_two_diagnoses(tmp_path):
    base, cand = _regress_with_counters(tmp_path)
    da, db = advisor.diagnose(base), advisor.diagnose(cand)
    kinds = ("correctness", "defect", "limit", "position")
    for shape in sorted(set(db.loc[db["variant"] == "fa2_mma", "shape_id"])):
        got = advisor_changes(da, db, "fa2_mma", shape)

        def causes(d: pd.DataFrame, s: str = shape) -> set[tuple[str, str]]:
            sel = d[(d["variant"] == "fa2_mma") & (d["shape_id"] == s) & d["kind"].isin(kinds)]
            return set(zip(sel["cause"], sel["title"], strict=True))
        assert {(c["cause"], c["title"]) for c in got if c["change"] == "new"} == causes(db) - causes(da)
        assert {(c["cause"], c["title"]) for c in got if c["change"] == "gone"} == causes(da) - causes(db)


def test_a_kernel_that_appears_is_listed_first():
    row = {"kernel": "k", "launch": 0, "duration_ms": 1.0, "registers_per_thread": 64.0}
    extra = {"kernel": "extra", "launch": 1, "duration_ms": 0.5, "registers_per_thread": 32.0}
    total = {**row, "kernel": "(all)", "launch": -1}
    a = _calls(pd.DataFrame([row, total]).assign(variant="v", shape_id="s"), "v", "s")
    b = _calls(pd.DataFrame([{**row, "registers_per_thread": 96.0}, extra, total]).assign(variant="v", shape_id="s"),
               "v", "s")
    assert list(a) == [("k", 0)] and list(b) == [("k", 0), ("extra", 0)]  # the (all) row is not a kernel
    got = counter_changes(a, b)
    assert got[0]["counter"] == "kernel" and got[0]["kernel"] == "extra"
    assert got[1]["counter"] == "registers_per_thread" and got[1]["rel_change"] == pytest.approx(0.5)


def test_why_needs_ncu_on_both_sides(tmp_path):
    cand = _copy(L4_NCU, tmp_path, "cand")
    _scale(cand, "fa2_mma", 1.05)
    (cand.path / "ncu_summary.parquet").unlink()
    res = run_gate(Bundle(L4_NCU), cand)
    assert res.rows.loc[res.rows["verdict"] == SLOWER, "why"].isna().all()
    assert any("the candidate has none" in n for n in res.notes)
    assert Nsight.of(cand).summary.empty


# ---------------------------------------------------------------------------- outputs
def test_junit_json_and_markdown_parse_and_agree(tmp_path):
    base, cand = _regress_with_counters(tmp_path)
    res = run_gate(base, cand)
    root = ET.fromstring(render_junit(res))
    cases = root.findall("./testsuite/testcase")
    assert len(cases) == len(res.rows) == int(root.get("tests"))
    failed = [c for c in cases if c.find("failure") is not None]
    assert len(failed) == int(root.get("failures")) == len(res.regressions) == 5
    assert {c.get("classname") for c in failed} == {"faprof.gate.fa2_mma"}
    assert "registers 255 -> 168" in failed[0].find("failure").text
    doc = json.loads(render_json(res))
    assert doc["outcome"] == "fail" and doc["exit_code"] == EXIT_REGRESSION
    assert [r["verdict"] for r in doc["rows"]] == list(res.rows["verdict"])
    assert doc["counts"][SLOWER] == 5 and doc["provenance"][0]["item"] == "GPU model"
    assert doc == result_dict(res)
    md = render_markdown(res)
    assert md.startswith("## faprof gate: FAIL (exit 1)")
    assert md.count("| fa2_mma | `") >= 5 and "### Why they moved" in md and "### Provenance" in md


def test_cli_writes_the_three_files_and_exits_with_the_gates_code(tmp_path):
    cand = _copy(HEADLINE, tmp_path, "cand")
    _scale(cand, "fa2_mma", 1.03)
    out = {k: tmp_path / f"gate.{k}" for k in ("md", "xml", "json")}
    r = CliRunner().invoke(main, ["gate", str(HEADLINE), str(cand.path), "--markdown", str(out["md"]),
                                  "--junit", str(out["xml"]), "--json", str(out["json"])])
    assert r.exit_code == EXIT_REGRESSION, r.output
    last = r.output.strip().splitlines()[-1]
    assert last.startswith("gate: FAIL (exit 1): 8 slower (fa2_mma)")
    assert "Provenance" in r.output and "fa2_mma" in r.output
    assert ET.parse(out["xml"]).getroot().get("failures") == "8"
    assert json.loads(out["json"].read_text())["counts"]["slower"] == 8
    assert out["md"].read_text().startswith("## faprof gate: FAIL")


def test_cli_same_bundle_passes(tmp_path):
    r = CliRunner().invoke(main, ["gate", str(HEADLINE), str(HEADLINE)])
    assert r.exit_code == EXIT_OK, r.output
    assert r.output.strip().splitlines()[-1].startswith("gate: PASS (exit 0)")


def test_cli_refuses_another_gpu_model_with_exit_2(tmp_path):
    cand = _copy(HEADLINE, tmp_path, "cand")
    _edit_rows(cand, lambda m: m.assign(gpu_name="NVIDIA H200"))
    r = CliRunner().invoke(main, ["gate", str(HEADLINE), str(cand.path)])
    assert r.exit_code == 2
    assert r.output.strip().count("\n") == 0 and "--allow-mismatch" in r.output
    r = CliRunner().invoke(main, ["gate", str(HEADLINE), str(cand.path), "--allow-mismatch"])
    assert r.exit_code == EXIT_OK, r.output


def test_cli_scenario_options_need_a_scenario_candidate():
    r = CliRunner().invoke(main, ["gate", str(HEADLINE), str(HEADLINE), "--variants", "fa2_mma"])
    assert r.exit_code == 2 and "CANDIDATE is a scenario" in r.output


# ---------------------------------------------------------------------------- re-timing
#: Two recorded runs of one commit on the H100 (tests/data/gate): fa3_wgmma_e's rows move 2.4% a run there.
SAME_RUNS = sorted((Path(__file__).parent / "data" / "gate" / "h100" / "same").iterdir())


def _undecided_pair(tmp_path: Path) -> tuple[Bundle, Bundle]:
    """A 3% slowdown planted in fa3_wgmma_e's second real run: past the threshold, not significantly."""
    cand = _copy(SAME_RUNS[1], tmp_path, "cand")
    _scale(cand, "fa3_wgmma_e", 1.03)
    return Bundle(SAME_RUNS[0]), cand


def test_rerun_ambiguous_retimes_only_the_undecided_kernel_as_a_second_run(tmp_path):
    base, cand = _undecided_pair(tmp_path)
    assert run_gate(base, cand).exit_code == EXIT_AMBIGUOUS
    asked: list[list[tuple[str, str]]] = []

    def retime(b: Bundle, pairs: list[tuple[str, str]]) -> list[Bundle]:
        asked.append(pairs)
        new = _copy(SAME_RUNS[0], tmp_path, f"rerun{len(asked)}")
        rng = np.random.default_rng(0)

        def fn(m: pd.DataFrame) -> pd.DataFrame:
            keep = m[[(v, s) in pairs for v, s in zip(m["variant"], m["shape_id"], strict=True)]].copy()
            # 200 new samples 3.5% slower than the baseline's median: a second run that decides the kernel
            keep["samples_ms"] = [np.median(s) * 1.035 * rng.lognormal(0, 0.002, 200) for s in keep["samples_ms"]]
            return keep
        _edit_rows(new, fn)
        return [new]
    res = run_gate(base, cand, retime=retime)
    planted = _gpu_timed(cand).query("variant == 'fa3_wgmma_e'")
    assert len(asked) == 1 and set(asked[0]) == {("fa3_wgmma_e", s) for s in planted["shape_id"]}
    rows = res.rows[res.rows["variant"] == "fa3_wgmma_e"].set_index("shape_id").loc[planted["shape_id"]]
    assert (rows["rerun_samples"] == 200).all()
    assert (rows["n_candidate"] == planted.set_index("shape_id")["n"].astype(int) + 200).all()
    assert (rows["verdict"] == SLOWER).all() and res.exit_code == EXIT_REGRESSION
    assert len(res.reruns) == 1


def test_rerun_on_another_gpu_model_is_not_pooled(tmp_path):
    base, cand = _undecided_pair(tmp_path)

    def retime(b: Bundle, pairs: list[tuple[str, str]]) -> list[Bundle]:
        new = _copy(SAME_RUNS[0], tmp_path, "elsewhere")
        _edit_rows(new, lambda m: m.assign(gpu_name="NVIDIA H200"))
        return [new]
    res = run_gate(base, cand, retime=retime)
    assert res.exit_code == EXIT_AMBIGUOUS
    assert any("not pooled" in n for n in res.notes)
