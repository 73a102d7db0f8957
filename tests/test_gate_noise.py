"""The gate's between-run noise floor: its estimator against exact references, then the recorded floors against their runs.

Method: the two-way analysis of variance is checked against the closed form for two runs (each
shape's difference between the runs) and, on simulated runs with known row noise and offset, for
being unbiased; Smyth's prior degrees of freedom against simulated variances drawn from the
scaled-F model with a known d0. The shipped floors (`faprof/data/gate_noise.toml`) must be what the
estimator gives on the bundles each floor names (recorded runs: tests/data/gate/h100 from
`scripts/gpu/gpu_gate_check.sh same slow` on the lent H100, examples/runs/h200x2 run1-3 on an H200).
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy.special import polygamma

from faprof.errors import FaprofError
from faprof.gate.noise import RunSet, _trigamma_inverse, anova_sums, estimate, prior_df, run_sets
from faprof.rows.noise_floor import NO_FLOOR, NoiseFloor, floor_for, load_floors, to_toml
from faprof.store import Bundle

ROOT = Path(__file__).parent.parent
H100 = Path(__file__).parent / "data" / "gate" / "h100"
SAME = sorted((H100 / "same").iterdir())  # two runs of h100_headline from one commit
SLOW = sorted((H100 / "slow").iterdir())  # the next two: gk slowed in the second


# ---------------------------------------------------------------------------- the estimator
def test_anova_of_two_runs_is_the_spread_of_the_shapes_differences():
    rng = np.random.default_rng(3)
    x = rng.normal(0, 0.02, (8, 2)) + rng.normal(0, 1, (8, 1))
    diff = x[:, 1] - x[:, 0]
    ss_res, ss_run = anova_sums(x)
    assert ss_res == pytest.approx(((diff - diff.mean()) ** 2).sum() / 2)  # var(x2 - x1) = 2 sigma^2
    assert ss_run == pytest.approx(8 * diff.mean() ** 2 / 2)


def _bundles(tmp_path: Path, x: np.ndarray, variants: list[str], gpu: str = "NVIDIA H100 80GB HBM3") -> list[Bundle]:
    """Runs as bundles: a copy of a recorded one whose rows of `variants` get the times exp(x[v][shape, run])."""
    out = []
    for run in range(x.shape[-1]):
        dst = tmp_path / f"run{run}"
        shutil.copytree(SAME[0], dst)
        b = Bundle(dst)
        m = b.measurements()
        for vi, v in enumerate(variants):
            sel = np.flatnonzero((m["variant"] == v).to_numpy())
            for si, i in enumerate(sel):
                t = float(np.exp(x[vi, si, run]))
                m.at[m.index[i], "samples_ms"] = np.full(10, t)
                m.at[m.index[i], "median_ms"] = t
        m["gpu_name"] = gpu
        b.write("measurements", m)
        out.append(b)
    return out


def test_estimate_recovers_known_row_noise_and_offset(tmp_path):
    """Four variants x 8 shapes x 12 runs drawn with row_sd 1% and offset_sd 0.5%: both are recovered. (The
    times, e^0.5 ms give or take 30%, are ones the H100 can reach on the bundle's B=4 H=16 S=4096 shapes:
    a faster one would be untrusted when read, faprof.rows.limits, and leave the estimate.)"""
    rng = np.random.default_rng(11)
    variants = ["fa2_mma", "fa3_wgmma_e", "sdpa_cudnn", "sdpa_flash"]
    runs = 12
    x = (rng.normal(0.5, 0.3, (4, 8, 1)) + rng.normal(0, 0.005, (4, 1, runs)) + rng.normal(0, 0.01, (4, 8, runs)))
    f = estimate([RunSet(tuple(_bundles(tmp_path, x, variants)), tuple(variants))])
    assert f.residual_df == 4 * 7 * (runs - 1) and f.offset_df == 4 * (runs - 1) and f.row_runs == 4 * 8 * runs
    assert f.row_sd == pytest.approx(0.01, rel=0.1)
    assert f.offset_sd == pytest.approx(0.005, rel=0.35)  # 44 degrees of freedom: a loose check
    assert math.isinf(f.prior_df) or f.prior_df > 20  # one noise level for every variant: no scatter beyond sampling


def test_prior_df_recovers_the_scatter_of_group_variances():
    """Variances drawn from Smyth's model (s0^2 * d0 / chi2(d0) true variances, each measured on 7 df)."""
    rng = np.random.default_rng(5)
    d0, s0, df, groups = 4.0, 0.01, 7, 4000
    true = s0 ** 2 * d0 / rng.chisquare(d0, groups)
    measured = true * rng.chisquare(df, groups) / df
    s0_hat, d0_hat = prior_df(measured, [df] * groups)
    assert d0_hat == pytest.approx(d0, rel=0.15)
    assert math.sqrt(s0_hat) == pytest.approx(s0, rel=0.05)
    _, none = prior_df(np.full(50, 1e-4) * rng.chisquare(df, 50) / df, [df] * 50)
    assert none > 30  # equal true variances: the prior is worth many rows (inf when the sample says so)


@pytest.mark.parametrize("y", [0.05, 0.5, 2.0, 20.0])
def test_trigamma_inverse_inverts_trigamma(y):
    assert float(polygamma(1, _trigamma_inverse(y))) == pytest.approx(y, rel=1e-8)


def test_estimate_refuses_what_cannot_give_a_floor(tmp_path):
    with pytest.raises(FaprofError, match="two or more runs"):
        estimate([RunSet((Bundle(SAME[0]),))])
    with pytest.raises(FaprofError, match="not timed in every run"):
        estimate([RunSet((Bundle(SAME[0]), Bundle(SLOW[0])), ("fa3_wgmma_e",))])
    rng = np.random.default_rng(0)
    a = _bundles(tmp_path / "a", rng.normal(0, 0.01, (1, 8, 1)), ["fa2_mma"])
    b = _bundles(tmp_path / "b", rng.normal(0, 0.01, (1, 8, 1)), ["fa2_mma"], gpu="NVIDIA H200")
    with pytest.raises(FaprofError, match="per GPU model"):
        estimate([RunSet((*a, *b), ("fa2_mma",))])


# ---------------------------------------------------------------------------- the recorded floors
def test_shipped_floors_are_what_their_runs_give():
    """faprof/data/gate_noise.toml is data, not opinion: each floor is re-estimated from the bundles it names."""
    floors = load_floors()
    assert {f.gpu_name for f in floors} == {"NVIDIA H100 80GB HBM3", "NVIDIA H200"}
    for f in floors:
        again = estimate(run_sets(f, ROOT), f.note)
        assert again.row_sd == pytest.approx(f.row_sd, abs=5e-7)
        assert again.offset_sd == pytest.approx(f.offset_sd, abs=5e-7)
        assert again.prior_df == pytest.approx(f.prior_df, abs=5e-5)
        assert (again.residual_df, again.offset_df, again.row_runs) == (f.residual_df, f.offset_df, f.row_runs)
        assert again.variants == pytest.approx(f.variants, abs=5e-7)


def test_h100_floor_records_the_power_capped_spread():
    """The H100's rows move run to run by 0.6% (sdpa_flash) to 2.4% (fa3_wgmma_e): 1.35% pooled, a weak prior."""
    h100, _ = floor_for("NVIDIA H100 80GB HBM3", load_floors())
    assert h100.row_sd == pytest.approx(0.0135, abs=5e-4)
    assert h100.variants["fa3_wgmma_e"] > 3 * h100.variants["sdpa_flash"]
    assert 1 < h100.prior_df < 4  # the kernels' spreads differ: the floor counts as about two rows
    assert all(Path(ROOT / b).is_dir() for src in h100.sources for b in src.bundles)


def test_a_gpu_without_a_floor_borrows_the_noisiest_and_says_how_to_record_one():
    floors = load_floors()
    f, note = floor_for("NVIDIA L4", floors)
    assert f.gpu_name == "NVIDIA H100 80GB HBM3"  # 1.35% a row against the H200's 0.33%
    assert "NVIDIA L4" in note and "scripts/analysis/gate_noise_floor.py" in note and "--noise-floor" in note
    assert floor_for("NVIDIA H200", floors) == (next(x for x in floors if x.gpu_name == "NVIDIA H200"), "")
    assert floor_for("NVIDIA H200", [])[0] is NO_FLOOR


def test_floors_round_trip_through_toml(tmp_path):
    floors = load_floors()
    p = tmp_path / "noise.toml"
    p.write_text(to_toml(floors, "a header\nof two lines"))
    again = load_floors(p)
    for a, b in zip(floors, again, strict=True):
        assert (a.gpu_name, a.sources, a.note) == (b.gpu_name, b.sources, b.note)
        assert (a.row_sd, a.offset_sd) == pytest.approx((b.row_sd, b.offset_sd), abs=1e-6)
    inf = NoiseFloor("X", 0.01, 0.0, math.inf, 0.05, 7, 1, 16, floors[0].sources)
    p.write_text(to_toml([inf]))
    assert math.isinf(load_floors(p)[0].prior_df)


_GOOD = ("[[floor]]\ngpu_name = 'X'\nrow_sd = 0.01\noffset_sd = 0.0\nprior_df = 2.0\nrow_max_move = 0.05\n"
         "residual_df = 1\noffset_df = 1\nrow_runs = 4\nruns = [{bundles = ['a', 'b']}]\n")


@pytest.mark.parametrize(("text", "match"), [
    ("[[floor]]\ngpu_name = 'X'\n", "key 'row_sd' is missing"),
    (_GOOD.replace("row_sd = 0.01", "row_sd = '1%'"), "key 'row_sd' has the wrong type"),
    (_GOOD.replace("prior_df = 2.0", "prior_df = 'lots'"), "key 'prior_df': expected a number"),
    (_GOOD.replace("['a', 'b']", "['only-one']"), "two or more paths"),
    (_GOOD.replace("row_sd = 0.01", "row_sd = -0.01"), "must be >= 0"),
    ("floor = 1\n", "one or more \\[\\[floor\\]\\] tables"),
    ("[[floor]\n", "is not TOML"),
])
def test_a_bad_floor_file_says_what_is_wrong(tmp_path, text, match):
    good = tmp_path / "good.toml"
    good.write_text(_GOOD)
    assert load_floors(good)[0].row_max_move == 0.05  # the unbroken file loads: each case breaks one thing
    p = tmp_path / "noise.toml"
    p.write_text(text)
    with pytest.raises(FaprofError, match=match):
        load_floors(p)


def test_a_missing_floor_file_is_an_error(tmp_path):
    with pytest.raises(FaprofError, match="noise floor file"):
        load_floors(tmp_path / "nope.toml")


def _run_script(argv: list[str]) -> int:
    """scripts/analysis/gate_noise_floor.py run as `python3 gate_noise_floor.py ARGV...`: its exit code."""
    import runpy
    import sys

    old, sys.argv = sys.argv, ["gate_noise_floor.py", *argv]
    try:
        with pytest.raises(SystemExit) as e:
            runpy.run_path(str(ROOT / "scripts" / "analysis" / "gate_noise_floor.py"), run_name="__main__")
    finally:
        sys.argv = old
    return e.value.code


def test_recorded_runs_reestimate_from_the_script(tmp_path):
    """scripts/analysis/gate_noise_floor.py writes what `estimate` gives, keeping another GPU model's floor in the file."""
    out = tmp_path / "noise.toml"
    shutil.copy(ROOT / "faprof" / "data" / "gate_noise.toml", out)
    assert _run_script(["--runs", str(SLOW[0]), str(SLOW[1]), "variants=fa2_mma,sdpa_flash",
                        "--note", "slow stage only", "--out", str(out)]) == 0
    floors = {f.gpu_name: f for f in load_floors(out)}
    expect = estimate([RunSet((Bundle(SLOW[0]), Bundle(SLOW[1])), ("fa2_mma", "sdpa_flash"))])
    assert floors["NVIDIA H100 80GB HBM3"].row_sd == pytest.approx(expect.row_sd, abs=5e-7)
    assert floors["NVIDIA H100 80GB HBM3"].note == "slow stage only"
    assert "NVIDIA H200" in floors  # the other model's floor is kept


def test_the_script_makes_the_folder_it_writes_into(tmp_path):
    """The ci-gate tutorial writes perf/noise.toml in a checkout that has no perf/ yet."""
    out = tmp_path / "perf" / "noise.toml"
    assert _run_script(["--runs", str(SLOW[0]), str(SLOW[1]), "--out", str(out)]) == 0
    assert [f.gpu_name for f in load_floors(out)] == ["NVIDIA H100 80GB HBM3"]


def test_a_floor_that_cannot_be_written_is_printed_and_exits_2(tmp_path, capsys):
    blocker = tmp_path / "perf"
    blocker.write_text("a file where the folder would go")
    assert _run_script(["--runs", str(SLOW[0]), str(SLOW[1]), "--out", str(blocker / "noise.toml")]) == 2
    got = capsys.readouterr()
    assert "could not write" in got.err and "NVIDIA H100 80GB HBM3" in got.out


def test_measurements_of_the_fixtures_are_the_recorded_runs():
    """The fixtures are the bundles gpu_gate_check.sh wrote (same commit, same GPU, CUPTI), not edited copies."""
    for b in (*SAME, *SLOW):
        m = pd.read_parquet(b / "measurements.parquet")
        assert set(m["gpu_name"]) == {"NVIDIA H100 80GB HBM3"}
        assert set(m.loc[m["status"] == "ok", "timer"]) == {"cupti"}
        assert Bundle(b).manifest()["env"]["git_sha"] == "2e568b6595f9-dirty"
