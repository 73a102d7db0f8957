"""Runs without a GPU and output that is not a terminal: progress lines, what CPU timings mean, the CPU
rows' budget, their memory, and the warning before GPU rows are skipped."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from faprof.cli import main
from faprof.cli import profiling as cli_run
from faprof.model.problem import AttentionProblem
from faprof.model.settings import TimingSettings
from faprof.run import cpu
from faprof.store import find_bundles

TINY = """
name = "tiny"
baseline = "torch_standard"
variants = ["torch_standard", "sdpa_math", "fa2"]

[defaults]
dtype = "fp32"
D = 32
direction = "fwd"

[[groups]]
name = "forward"
problems = [{ B = 1, H = 1, S = 32 }, { B = 1, H = 2, S = 48, causal = true }]

[timing]
warmup_ms = 2
budget_s = 0.1
min_repeats = 5
max_repeats = 50
e2e_repeats = 3
"""


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.fixture
def tiny(tmp_path):
    path = tmp_path / "tiny.toml"
    path.write_text(TINY)
    return path


# ------------------------------------------------------------------------- progress lines
class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_row_lines_are_at_most_one_per_interval_and_always_the_last():
    clock = FakeClock()
    lines = cli_run.RowLines(every_s=10, clock=clock)
    lines.start(total=6, done=0)
    said = []
    for t in (2, 4, 11, 13, 30, 31):  # rows finish at these times
        clock.t = t
        said.append(lines.row({"variant": "torch_standard", "label": "B=1 H=1 S=32 D=32", "status": "ok"}))
    assert [s is not None for s in said] == [False, False, True, False, True, True]
    assert said[2] == "rows 3/6, 11s elapsed, ~11s left (last: torch_standard B=1 H=1 S=32 D=32 -> ok)"
    assert said[4].startswith("rows 5/6, 30s elapsed, ~6s left")
    assert said[5].startswith("rows 6/6, 31s elapsed, done")


def test_row_lines_estimate_from_this_sessions_rows_when_resumed():
    clock = FakeClock()
    lines = cli_run.RowLines(every_s=10, clock=clock)
    clock.t = 5  # reading the environment
    lines.start(total=100, done=90)  # a resumed run: 90 rows from before
    clock.t = 25
    line = lines.row({"variant": "v", "label": "s", "status": "ok"})
    assert line is not None and line.startswith("rows 91/100, 25s elapsed, ~3m00s left")


def test_profile_prints_progress_lines_when_stdout_is_not_a_terminal(tiny, tmp_path):
    r = CliRunner().invoke(main, ["profile", "--scenario", str(tiny), "--out", str(tmp_path / "runs"),
                                  "--budget", "0.02", "--no-isolate"])
    assert r.exit_code == 0, r.output
    assert "rows 6/6, " in r.output and " elapsed, done (last: " in r.output


# ------------------------------------------------------------------------- a run without a GPU
@pytest.mark.skipif(_cuda(), reason="what a run without a GPU says")
def test_a_cpu_run_says_what_its_timings_mean_and_what_it_skips_once(tiny, tmp_path):
    r = CliRunner().invoke(main, ["profile", "--scenario", str(tiny), "--out", str(tmp_path / "runs"), "--no-isolate"])
    assert r.exit_code == 0, r.output
    out = r.output
    assert out.count("no GPU on this machine: 2 row(s) need a GPU and will be skipped; 4 CPU row(s) will run, ~") == 1
    assert out.count("CPU timings: no GPU here") == 1
    assert "not of the next run's" in out and "frequency scaling" in out
    # the scenario's 0.1 s is raised for the CPU's noise, said and recorded
    assert "after 0.5 s per row (the scenario's 0.1 s" in out
    (bundle,) = find_bundles(tmp_path / "runs")
    assert bundle.manifest()["settings"]["timing"]["budget_s"] == cpu.CPU_BUDGET_MIN_S
    assert any("2 row(s) need a GPU" in line for line in bundle.manifest()["log"])


@pytest.mark.skipif(_cuda(), reason="what a run without a GPU says")
def test_budget_flag_is_kept_on_the_cpu(tiny, tmp_path):
    r = CliRunner().invoke(main, ["profile", "--scenario", str(tiny), "--out", str(tmp_path / "runs"),
                                  "--budget", "0.02", "--no-isolate", "--variants", "torch_standard"])
    assert r.exit_code == 0, r.output
    assert "after 0.02 s per row;" in r.output
    (bundle,) = find_bundles(tmp_path / "runs")
    assert bundle.manifest()["settings"]["timing"]["budget_s"] == 0.02


def test_cpu_budget_is_kept_within_its_bounds():
    assert cpu.cpu_timing(TimingSettings(budget_s=0.1)).budget_s == cpu.CPU_BUDGET_MIN_S
    assert cpu.cpu_timing(TimingSettings(budget_s=1.0)).budget_s == 1.0
    assert cpu.cpu_timing(TimingSettings(budget_s=30.0)).budget_s == cpu.CPU_BUDGET_MAX_S


# ------------------------------------------------------------------------- memory
def test_row_memory_counts_the_float64_scores_and_the_inputs():
    p = AttentionProblem(B=2, H=8, Sq=4096, Sk=4096, D=64, dtype="fp16")
    shape, call = cpu.row_bytes(p, "torch_standard")
    scores64 = 2 * 8 * 4096 * 4096 * 8
    inputs = 3 * 2 * 8 * 4096 * 64 * 2
    assert shape >= scores64 + inputs
    assert shape < 4 * scores64  # S, its masked copy and P at most, plus the inputs
    assert call >= 2 * 8 * 4096 * 4096 * 2  # the variant's own fp16 scores
    # cpu_ref's call works in float64 too; a backward holds more matrices
    assert cpu.row_bytes(p, "cpu_ref")[1] > call
    assert cpu.row_bytes(p.with_(direction="bwd"), "torch_standard")[0] > shape


def test_a_row_too_big_for_the_ram_is_refused_with_the_numbers():
    p = AttentionProblem(B=2, H=8, Sq=4096, Sk=4096, D=64, dtype="fp16")
    shape, call = cpu.row_bytes(p, "torch_standard")
    reason = cpu.memory_refusal(p, "torch_standard", available=int(7.8e9))
    assert reason is not None
    assert reason.startswith(f"needs ~{cpu.gb(shape + call)} of RAM") and "this machine has 7.8 GB available" in reason
    assert cpu.memory_refusal(p, "torch_standard", available=100 * (shape + call)) is None
    # the shape's inputs and reference already in memory: only the call's part is new
    assert cpu.memory_refusal(p, "torch_standard", shape_loaded=True, available=int(2 * call)) is None


def test_available_memory_is_read():
    n = cpu.available_bytes()
    assert n is None or n > 0


@pytest.mark.skipif(_cuda(), reason="CPU rows on a machine without a GPU")
def test_cpu_rows_that_do_not_fit_the_ram_are_skipped_with_the_reason(tiny, tmp_path, monkeypatch):
    monkeypatch.setattr(cpu, "available_bytes", lambda: 1000)  # a machine with 1 kB free
    r = CliRunner().invoke(main, ["profile", "--scenario", str(tiny), "--out", str(tmp_path / "runs"),
                                  "--budget", "0.02", "--no-isolate"])
    assert r.exit_code == 0, r.output
    assert "4 CPU row(s) need more RAM than is available and will be skipped" in r.output
    (bundle,) = find_bundles(tmp_path / "runs")
    df = bundle.measurements()
    cpu_rows = df[df["variant"].isin(["torch_standard", "sdpa_math"])]
    assert (cpu_rows["status"] == "skipped").all()
    assert cpu_rows["reason"].str.contains(r"needs ~\d+ MB of RAM .* this machine has 0 MB available").all()
