"""The runs `faprof gate` starts itself, on this machine's CPU: a candidate scenario profiled now, and
re-timing exactly the rows asked for (with the larger budget and tighter stop rule it promises).

These run real worker processes (torch on the CPU), a few seconds each: marked slow."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from faprof.cli import main
from faprof.run import gate_runs as gate_run
from faprof.store import Bundle, find_bundles

DATA = Path(__file__).parent / "data" / "bundles"
CPU_L4 = DATA / "20261121T193107Z_cpu_l4-causal"
H100_SMOKE = DATA / "20261121T192450Z_nvidia-h100-80gb-hbm3_smoke"


def test_candidate_kinds(tmp_path):
    assert gate_run.is_scenario("smoke", tmp_path)
    assert gate_run.is_scenario(str(tmp_path / "mine.toml"), tmp_path)
    assert not gate_run.is_scenario(str(CPU_L4), tmp_path)
    assert not gate_run.is_scenario("20261121T193107Z", DATA)  # a run id under --runs-dir


@pytest.mark.slow
def test_retime_runs_exactly_the_rows_asked_with_more_budget(tmp_path):
    shape = "b1_h1_sq128_sk128_d64_fp16_causal_fwd"
    pairs = [("torch_standard", shape), ("sdpa_math", shape)]
    new = gate_run.retime(Bundle(CPU_L4), pairs, tmp_path)
    assert len(new) == 1  # both variants need the same shape: one run
    rows = new[0].measurements()
    assert sorted(zip(rows["variant"], rows["shape_id"], strict=True)) == sorted(pairs)
    assert set(rows["status"]) == {"ok"}
    timing = new[0].manifest()["settings"]["timing"]
    recorded = Bundle(CPU_L4).manifest()["settings"]["timing"]
    assert timing["budget_s"] == pytest.approx(recorded["budget_s"] * gate_run.RERUN_BUDGET_FACTOR)
    assert timing["target_rel_ci"] == pytest.approx(recorded["target_rel_sem"] * gate_run.RERUN_CI_FACTOR)


@pytest.mark.slow
def test_a_scenario_candidate_is_profiled_into_out_then_gated(tmp_path):
    out = tmp_path / "runs"
    r = CliRunner().invoke(main, ["gate", str(H100_SMOKE), "smoke", "--variants", "torch_standard",
                                  "--allow-mismatch", "--out", str(out), "--json", str(tmp_path / "g.json")])
    assert r.exit_code == 0, r.output
    made = find_bundles(out)
    assert len(made) == 1 and "smoke" in made[0].run_id
    assert set(made[0].measurements()["variant"]) == {"torch_standard"}
    assert "different GPU models" in r.output  # the H100 bundle against this CPU: allowed, said
    assert "host-clock rows, not gated" in r.output.strip().splitlines()[-1]
