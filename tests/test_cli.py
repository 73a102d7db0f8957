"""The CLI through click's CliRunner, and the smoke scenario end to end on the CPU."""

import json

import pandas as pd
import pytest
from click.testing import CliRunner

from faprof.cli import main
from faprof.store import Bundle, find_bundles

FAST = ["--budget", "0.05"]


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs")
    r = CliRunner().invoke(main, ["profile", "--scenario", "smoke", "--out", str(out), *FAST])
    assert r.exit_code == 0, r.output
    (bundle,) = find_bundles(out)
    return r, bundle


def test_smoke_runs_end_to_end_on_the_cpu(smoke_run):
    r, bundle = smoke_run
    df = bundle.measurements()
    m = bundle.manifest()
    assert m["status"] == "complete"
    assert m["env"]["python"] and m["env"]["torch"] and m["env"]["faprof"]
    # every (problem, variant) pair has a row
    assert len(df) == len(set(zip(df["variant"], df["shape_id"], strict=True)))
    assert set(df["status"]) <= {"ok", "wrong", "failed", "unsupported", "skipped"}
    import torch

    if not torch.cuda.is_available():
        cpu = df[df["variant"].isin(["cpu_ref", "torch_standard", "sdpa_math"])]
        assert (cpu["status"] == "ok").all(), cpu[["variant", "status", "reason"]]
        gpu_only = df[df["variant"].isin(["sdpa_flash", "sdpa_cudnn", "sdpa_efficient", "sdpa_auto"])]
        # skipped when only the missing GPU stops them; unsupported when they could not run it anyway
        skipped = gpu_only[gpu_only["status"] == "skipped"]
        assert not skipped.empty and skipped["reason"].str.contains("needs an NVIDIA GPU").all()
        unsupported = gpu_only[gpu_only["status"] == "unsupported"]
        assert unsupported["reason"].str.contains("dtypes").all()
        assert set(gpu_only["status"]) <= {"skipped", "unsupported"}
    ok = df[df["status"] == "ok"]
    assert (ok["median_ms"] > 0).all() and (ok["n"] >= 3).all()
    assert (ok["max_abs_err"] < 0.05).all()
    assert ok["reference"].isin(["cpu_ref fp64", "gpu fp32"]).all()
    # the printed table has the promised columns
    for col in ("variant", "shape", "status", "median ms", "TFLOP/s", "% peak", "speedup", "max err"):
        assert col in r.output
    assert "speedup = torch_standard's median" in r.output


def test_show_and_export(smoke_run, tmp_path):
    _, bundle = smoke_run
    r = CliRunner().invoke(main, ["show", str(bundle.path)])
    assert r.exit_code == 0 and "torch_standard" in r.output
    r = CliRunner().invoke(main, ["export", str(bundle.path), "--csv", str(tmp_path / "csv")])
    assert r.exit_code == 0, r.output
    csv = pd.read_csv(tmp_path / "csv" / "measurements.csv")
    assert len(csv) == len(bundle.measurements())
    assert json.loads((tmp_path / "csv" / "bundle_manifest.json").read_text())["status"] == "complete"


def test_resume_completes_an_interrupted_run(smoke_run, tmp_path):
    """Simulate a crash after some rows: drop rows, mark the run interrupted, resume, get them back."""
    import shutil

    _, bundle = smoke_run
    copy = tmp_path / bundle.path.name
    shutil.copytree(bundle.path, copy)
    b = Bundle(copy)
    df = b.measurements()
    kept = df.iloc[: len(df) // 2]
    b.write("measurements", kept)
    b.update_manifest(status="interrupted")
    r = CliRunner().invoke(main, ["profile", "--resume", str(copy)])
    assert r.exit_code == 0, r.output
    after = b.measurements()
    assert set(zip(after["variant"], after["shape_id"], strict=True)) == set(zip(df["variant"], df["shape_id"], strict=True))
    # the rows that had finished were kept as they were, not re-measured
    merged = after.merge(kept[["variant", "shape_id", "finished_utc"]], on=["variant", "shape_id"], suffixes=("", "_old"))
    assert (merged["finished_utc"] == merged["finished_utc_old"]).all()
    assert b.manifest()["status"] == "complete"
    assert any("resumed" in line for line in b.manifest()["log"])


def test_list_and_doctor():
    r = CliRunner().invoke(main, ["list"])
    assert r.exit_code == 0
    for word in ("l4_causal", "smoke", "sdpa_flash", "cpu_ref", "H100"):
        assert word in r.output
    r = CliRunner().invoke(main, ["doctor"])
    assert r.exit_code == 0 and "torch" in r.output and "python" in r.output


@pytest.mark.parametrize("args,needle", [
    (["profile", "--scenario", "no_such"], "no scenario named"),
    (["profile", "--scenario", "smoke", "--variants", "fa9"], "unknown variant"),
    (["profile"], "give --scenario"),
    (["export", "/nonexistent/run", "--csv", "/tmp/x"], "no run bundle"),
    (["show", "/nonexistent/run"], "no run bundle"),
])
def test_user_errors_exit_2_without_traceback(args, needle):
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 2, r.output
    assert needle in r.output
    assert "Traceback" not in r.output


def test_report_writes_markdown_html_and_csv(smoke_run, tmp_path):
    _, bundle = smoke_run
    r = CliRunner().invoke(main, ["report", str(bundle.path), "--out", str(tmp_path / "rep")])
    assert r.exit_code == 0, r.output
    md = (tmp_path / "rep" / "report.md").read_text()
    for section in ("## Environment", "## Method", "## Results", "## Correctness", "## Findings",
                    "### First output elements"):
        assert section in md, section
    # every measured row of the bundle appears in the results tables
    df = bundle.measurements()
    assert md.count("| torch_standard |") >= (df["variant"] == "torch_standard").sum()
    html = (tmp_path / "rep" / "report.html").read_text()
    assert "<table>" in html and "Findings" in html
    assert (tmp_path / "rep" / "csv" / "measurements.csv").exists()
    r = CliRunner().invoke(main, ["report", str(bundle.path), "--format", "pdf"])
    assert r.exit_code == 2 and "unknown report format" in r.output


def test_compare_two_runs(smoke_run):
    _, bundle = smoke_run
    r = CliRunner().invoke(main, ["compare", str(bundle.path), str(bundle.path)])
    assert r.exit_code == 0, r.output
    assert "1.000" in r.output  # a run against itself: every ratio is exactly 1


def test_unsupported_and_skipped_rows_carry_the_problems_work_counts(smoke_run):
    _, bundle = smoke_run
    df = bundle.measurements()
    not_run = df[df["status"].isin(["unsupported", "skipped"])]
    assert not not_run.empty
    assert (not_run["flops"] > 0).all() and (not_run["min_bytes"] > 0).all()
