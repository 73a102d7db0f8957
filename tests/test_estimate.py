"""The time a GPU run's rows will take, said before the first row: from the rows' wall times in the last
complete run of the same scenario on the same GPU model (faprof.run.estimate)."""

from __future__ import annotations

from datetime import UTC, datetime

from faprof.run import estimate
from faprof.store import Bundle


def _run(out, scenario: str, gpu: str, walls: dict[tuple[str, str], float], status: str = "complete",
         when: int = 1) -> Bundle:
    b = Bundle.create(out, scenario, gpu, {"scenario": {"name": scenario}, "env": {"gpu_name": gpu}},
                      now=datetime(2026, 12, 5, 10, when, tzinfo=UTC))
    for (v, s), w in walls.items():
        b.append_measurement({"variant": v, "shape_id": s, "status": "ok", "gpu_name": gpu, "wall_s": w})
    b.compact()
    b.update_manifest(status=status)
    return b


def test_the_estimate_adds_the_last_runs_row_times_and_its_median_for_new_rows(tmp_path):
    _run(tmp_path, "decode", "NVIDIA H100", {("a", "s1"): 2.0, ("b", "s1"): 10.0, ("c", "s1"): 4.0}, when=1)
    _run(tmp_path, "decode", "NVIDIA H100", {("a", "s1"): 100.0}, status="interrupted", when=2)  # not complete
    _run(tmp_path, "decode", "NVIDIA H200", {("a", "s1"): 100.0}, when=3)  # another GPU
    line = estimate.estimate_line([("a", "s1"), ("b", "s1"), ("new", "s1")], tmp_path, "decode", "NVIDIA H100")
    assert "3 row(s) to time, about 16 s" in line  # 2 + 10 + the median row (4)
    assert "2 of the rows" in line and "median row, 4.0 s" in line


def test_without_an_earlier_run_it_says_so_instead_of_guessing(tmp_path):
    _run(tmp_path, "decode", "NVIDIA H100", {("a", "s1"): 2.0})
    line = estimate.estimate_line([("a", "s1")], tmp_path, "prefill", "NVIDIA H100")
    assert line.startswith("1 row(s) to time; no earlier complete run of prefill on NVIDIA H100")
