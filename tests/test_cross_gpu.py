"""Two measured GPUs side by side: `faprof compare` and the dashboard's GPU split of one bundle.

There are no H200 bundles yet: two recorded H100 bundles of one scenario stand in for two GPUs'
runs, and a bundle holding rows of two GPU models is made from a recorded H100 bundle whose rows
are copied under a second, made-up GPU name (a test of the split, not a measurement).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from click.testing import CliRunner

from faprof import analysis as dashboard
from faprof.cli import main
from faprof.report.compare import compare_runs, gpu_models
from faprof.store import Bundle, load_many

DATA = Path(__file__).parent / "data" / "bundles"
SMOKE_A = DATA / "20261121T192450Z_nvidia-h100-80gb-hbm3_smoke"
SMOKE_B = DATA / "20261121T194831Z_nvidia-h100-80gb-hbm3_smoke"
L4 = DATA / "20261121T192510Z_nvidia-h100-80gb-hbm3_l4-causal"
OTHER = "OTHER GPU (relabelled copy)"


def _two_model_bundle(tmp_path) -> Bundle:
    src = Bundle(L4)
    rows = src.measurements()
    real = rows.assign(gpu_name=src.manifest()["env"]["gpu_name"])
    b = Bundle.create(tmp_path / "runs", "l4_causal", "mixed", {k: v for k, v in src.manifest().items()
                                                                if k not in ("run_id", "schema_version", "status")})
    b.write("measurements", pd.concat([real, real.assign(gpu_name=OTHER)], ignore_index=True))
    return b


def test_compare_shows_each_runs_own_peak_and_ceiling():
    res = CliRunner().invoke(main, ["compare", str(SMOKE_A), str(SMOKE_B)])
    assert res.exit_code == 0, res.output
    assert "A % peak" in res.output and "B % ceiling" in res.output
    df = compare_runs(Bundle(SMOKE_A), Bundle(SMOKE_B))
    a = Bundle(SMOKE_A).measurements().set_index(["variant", "shape_id"])
    r = df[df["status_a"] == "ok"].iloc[0]
    assert r["pct_peak_a"] == a.loc[(r["variant"], r["shape_id"]), "pct_peak"]
    assert r["pct_measured_ceiling_a"] == a.loc[(r["variant"], r["shape_id"]), "pct_measured_ceiling"]


def test_a_bundle_of_two_gpu_models_is_split_per_gpu(tmp_path):
    b = _two_model_bundle(tmp_path)
    assert gpu_models(b) == sorted(["NVIDIA H100 80GB HBM3", OTHER])
    merged, _ = load_many([b.path])
    assert set(merged["gpu"]) == {"NVIDIA H100 80GB HBM3", OTHER}
    side = dashboard.gpu_comparison(merged, "l4_causal")
    assert side.groupby("gpu").size().to_dict() == dict.fromkeys(set(merged["gpu"]), len(dashboard.timed(merged)) // 2)
    # compare the bundle with itself: A one model, B the other
    res = CliRunner().invoke(main, ["compare", str(b.path)])
    assert res.exit_code == 0, res.output
    assert "B and A take the same time" in res.output and OTHER in res.output
    # against another run, a bundle of two models needs a choice: one line, exit 2
    res = CliRunner().invoke(main, ["compare", str(b.path), str(L4)])
    assert res.exit_code == 2 and "choose one with --gpu-a/--gpu-b" in res.output
    res = CliRunner().invoke(main, ["compare", str(b.path), str(L4), "--gpu-a", OTHER])
    assert res.exit_code == 0, res.output


def test_speedups_are_per_gpu_model(tmp_path):
    from faprof.analysis import speedups as analysis

    b = _two_model_bundle(tmp_path)
    df = b.measurements()
    df.loc[df["gpu_name"] == OTHER, "median_ms"] *= 2  # the second model twice as slow everywhere
    out = analysis.speedups_for(df, b.manifest())
    one = out[out["gpu_name"] != OTHER].set_index(["variant", "shape_id"])["speedup"]
    two = out[out["gpu_name"] == OTHER].set_index(["variant", "shape_id"])["speedup"]
    pd.testing.assert_series_equal(one.sort_index(), two.sort_index())  # each against its own baseline
