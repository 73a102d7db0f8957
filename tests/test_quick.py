"""`faprof profile --quick`: the delta line against the previous run, the previous-run lookup, the bundle written.

Method: quick bundles are planted from a recorded H100 run (tests/data/gate/h100/same: one kernel's rows,
its samples scaled by a known factor, a `quick` record in the manifest) to check the verdict words and the
lookup without a GPU; one real quick run on the CPU (a torch function given as FILE.py:FUNCTION) checks
that the bundle is a normal one, that only the kernel ran, and that the second run prints its delta.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from fakes import TORCH_ATTN_KERNEL

from faprof.cli import main
from faprof.errors import FaprofError
from faprof.gate.quick_delta import delta, delta_lines, previous_run
from faprof.run.request import ProfileRequest, resolve
from faprof.store import Bundle, device_of

H100 = Path(__file__).parent / "data" / "gate" / "h100" / "same"
SRC = sorted(H100.iterdir())[0]
KERNEL = "fa2_mma"


def _quick(out: Path, name: str, factor: float, started: float, status: str = "complete",
           kernel: str = KERNEL, scenario: str | None = None, gpu: str | None = None) -> Bundle:
    """A quick bundle of KERNEL's rows of SRC, samples times `factor`."""
    dst = out / name
    shutil.copytree(SRC, dst)
    b = Bundle(dst)
    m = b.measurements()
    m = m[m["variant"] == KERNEL].reset_index(drop=True)
    m["samples_ms"] = m["samples_ms"].map(lambda s: np.asarray(s, dtype=float) * factor)
    m["median_ms"] = m["median_ms"] * factor
    m["variant"] = kernel
    b.write("measurements", m)
    man = json.loads((dst / "manifest.json").read_text())
    man.update(status=status, run_id=name, quick={"kernel": kernel, "started_s": started})
    if scenario:
        man["scenario"]["name"] = scenario
    if gpu:
        man["env"]["gpu_name"] = gpu
    (dst / "manifest.json").write_text(json.dumps(man))
    return b


@pytest.mark.parametrize(("factor", "word"), [(1.10, "slower"), (0.90, "faster"), (1.0, "same")])
def test_delta_line_says_faster_slower_or_same(tmp_path, factor, word):
    a = _quick(tmp_path, "a", 1.0, 1.0)
    b = _quick(tmp_path, "b", factor, 2.0)
    lines = delta_lines(a, b, KERNEL, tmp_path)
    assert lines[0].startswith(f"delta vs a: {word} - {factor:.3f}x the previous time"), lines[0]
    assert "threshold ±2%" in lines[0]
    c = delta(a, b, KERNEL)
    assert len(c.rows) == 8 and c.kernel(KERNEL) is not None  # h100_headline: 8 shapes of the kernel


def test_no_previous_run_says_so(tmp_path):
    b = _quick(tmp_path, "b", 1.0, 2.0)
    line = delta_lines(None, b, KERNEL, tmp_path)
    assert line == [f"delta: no previous quick run of {KERNEL} on this scenario and device under {tmp_path}: "
                    "this run is the one the next --quick run compares with"]


def test_previous_run_is_the_last_complete_quick_run_of_the_kernel_scenario_and_device(tmp_path):
    first = _quick(tmp_path, "first", 1.0, 1.0)
    last = _quick(tmp_path, "last", 1.0, 3.0)
    _quick(tmp_path, "interrupted", 1.0, 4.0, status="interrupted")
    _quick(tmp_path, "other_kernel", 1.0, 5.0, kernel="other")
    _quick(tmp_path, "other_scenario", 1.0, 6.0, scenario="l4_causal")
    _quick(tmp_path, "other_gpu", 1.0, 7.0, gpu="NVIDIA H200")
    shutil.copytree(SRC, tmp_path / "full_run")  # a full profile run of the kernel: not a quick run
    new = _quick(tmp_path, "new", 1.0, 8.0)
    m = new.manifest()
    scn, dev = m["scenario"]["name"], device_of(m)
    assert dev == "NVIDIA H100 80GB HBM3"
    assert previous_run(tmp_path, KERNEL, scn, dev, before=new).path == last.path
    assert previous_run(tmp_path, KERNEL, scn, dev, before=last).path == first.path
    assert previous_run(tmp_path, KERNEL, scn, dev, before=first) is None
    assert previous_run(tmp_path, KERNEL, scn, dev).path == new.path
    assert previous_run(tmp_path / "nothing here", KERNEL, scn, dev) is None


def test_quick_refuses_what_it_does_not_do(tmp_path):
    with pytest.raises(FaprofError, match="one --kernel"):
        resolve(ProfileRequest(quick=True, out_dir=tmp_path))
    with pytest.raises(FaprofError, match="drop --variants, --ncu"):
        resolve(ProfileRequest(quick=True, kernels=("a.py:f",), variants="fa2_mma", ncu="basic", out_dir=tmp_path))


PY_KERNEL = TORCH_ATTN_KERNEL


def test_quick_run_on_the_cpu_writes_a_bundle_and_compares_with_the_previous_one(tmp_path, monkeypatch):
    monkeypatch.setenv("FAPROF_CACHE", str(tmp_path / "cache"))
    src = tmp_path / "mine.py"
    src.write_text(PY_KERNEL)
    out = tmp_path / "runs"
    argv = ["profile", "--kernel", f"{src}:attn", "--quick", "--out", str(out), "--budget", "0.02"]
    first = CliRunner().invoke(main, argv)
    assert first.exit_code == 0, first.output
    assert "delta: no previous quick run of mine" in first.output
    second = CliRunner().invoke(main, argv)
    assert second.exit_code == 0, second.output
    (b1, _), (b2, m2) = sorted(((b, b.manifest()) for b in map(Bundle, out.iterdir())),
                               key=lambda x: x[1]["quick"]["started_s"])
    assert f"delta vs {b1.run_id}: " in second.output
    assert m2["status"] == "complete" and m2["scenario"]["name"] == "smoke" and m2["quick"]["kernel"] == "mine"
    s = m2["settings"]
    assert s["variants"] == ["mine"] and s["ncu"] == "none" and s["nsys"] is False  # only the kernel, no Nsight
    assert s["timing"]["budget_s"] == 0.02
    rows = b2.measurements()
    assert set(rows["variant"]) == {"mine"} and (rows["status"] == "ok").sum() == 2  # smoke's two fp32 fwd shapes
    for cmd in (["explain", str(b2.path)], ["report", str(b2.path), "--format", "md", "--out", str(tmp_path / "r")]):
        r = CliRunner().invoke(main, cmd)
        assert r.exit_code == 0, (cmd, r.output)


def test_an_interval_past_1000x_is_written_as_a_bound():
    from faprof.analysis.comparison.pool import ratio_interval_text

    assert ratio_interval_text(0.981, 1.0204) == "0.981-1.020"
    assert ratio_interval_text(0.0, 1.4763e16) == "<0.001->1000"
    assert ratio_interval_text(0.5, float("inf")) == "0.500->1000"
