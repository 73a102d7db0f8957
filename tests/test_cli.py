"""The CLI through click's CliRunner, and the smoke scenario end to end on the CPU."""

import json
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from faprof.cli import main
from faprof.store import Bundle, find_bundles

FAST = ["--budget", "0.05"]
BUNDLES = Path(__file__).resolve().parent / "data" / "bundles"
H100_L4 = "20261121T192510Z_nvidia-h100-80gb-hbm3_l4-causal"
CPU_L4 = "20261121T193107Z_cpu_l4-causal"


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


def test_list_in_a_fresh_process_finds_every_scenario_valid():
    """In a new process nothing has filled the variant registry yet (in this one the tests' conftest
    has): `faprof list scenarios` must load the built-in variants before checking the scenarios."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "faprof", "list", "scenarios"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert "smoke" in r.stdout and "l4_causal" in r.stdout
    assert "invalid" not in r.stdout, r.stdout


@pytest.mark.parametrize("args,needle", [
    (["profile", "--scenario", "no_such"], "no scenario named"),
    (["profile", "--scenario", "smoke", "--variants", "fa9"], "unknown variant"),
    (["profile"], "give --scenario"),
    (["export", "/nonexistent/run", "--csv", "/tmp/x"], "no run bundle"),
    (["show", "/nonexistent/run"], "no run bundle"),
    (["profile", "--scenario", "smoke", "--variants", ""], "names no variant"),
    (["profile", "--scenario", "smoke", "--variants", " , "], "names no variant"),
    (["build", "--arch", "sm_75"], "the kernels need sm_80 or newer"),
    (["build", "--arch", "sm_80,sm_70"], "older than"),
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
    for section in ("## The answer", "## Why", "## Notes", "## Method", "[appendix.md](appendix.md)"):
        assert section in md, section
    appendix = (tmp_path / "rep" / "appendix.md").read_text()
    for section in ("## Results", "## Correctness", "## First output elements", "## Environment"):
        assert section in appendix, section
    # every measured row of the bundle appears in the appendix's results tables
    df = bundle.measurements()
    assert len(re.findall(r"^\| torch_standard( ≈ unstable)? +\|", appendix, re.M)) >= (df["variant"] == "torch_standard").sum()
    html = (tmp_path / "rep" / "report.html").read_text()
    text = re.sub(r"<script.*?</script>", "", html, flags=re.S)
    assert "<table>" in text and "<h2>Appendix</h2>" in text and "**" not in text and "<strong>" in text
    assert (tmp_path / "rep" / "csv" / "measurements.csv").exists()
    assert f"report: {tmp_path / 'rep' / 'report.md'}" in r.output  # where to look, said last
    r = CliRunner().invoke(main, ["report", str(bundle.path), "--format", "pdf"])
    assert r.exit_code == 2 and "unknown report format" in r.output
    # --format picks the files; the default folder is RUN/report
    only = tmp_path / "only_csv"
    r = CliRunner().invoke(main, ["report", str(bundle.path), "--out", str(only), "--format", "csv"])
    assert r.exit_code == 0 and sorted(p.name for p in only.iterdir()) == ["csv"]


def test_report_focus_is_about_one_variant(smoke_run, tmp_path):
    _, bundle = smoke_run
    r = CliRunner().invoke(main, ["report", str(bundle.path), "--out", str(tmp_path / "f"), "--focus", "sdpa_math",
                                  "--format", "md"])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "f" / "report.md").read_text().startswith("# sdpa_math against the rest: smoke on ")
    r = CliRunner().invoke(main, ["report", str(bundle.path), "--out", str(tmp_path / "g"), "--focus", "nope"])
    assert r.exit_code == 2 and "--focus 'nope': no such variant" in r.output and not (tmp_path / "g").exists()


def test_compare_two_runs(smoke_run):
    _, bundle = smoke_run
    r = CliRunner().invoke(main, ["compare", str(bundle.path), str(bundle.path)])
    assert r.exit_code == 0, r.output
    assert "B and A take the same time" in r.output  # a run against itself: every ratio is exactly 1
    assert "different GPUs" not in r.output and "different devices" not in r.output and "different dtypes" not in r.output


def test_compare_says_which_is_faster_and_warns_on_different_machines():
    """The H100 and CPU l4_causal fixture runs: the title names the faster run, the devices are called out."""
    r = CliRunner().invoke(main, ["compare", str(BUNDLES / CPU_L4), str(BUNDLES / H100_L4)])
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert re.search(r"B is [\d,.]+x faster than A \(geometric mean over \d+ rows timed in both", text), text
    assert "warning: different GPUs: A ran on CPU only, B on NVIDIA H100 80GB HBM3" in text
    assert "ran on different devices (cpu in A / cuda in B)" in text
    r = CliRunner().invoke(main, ["compare", str(BUNDLES / H100_L4), str(BUNDLES / CPU_L4)])
    assert re.search(r"B is [\d,.]+x slower than A", " ".join(r.output.split()))


def test_unsupported_and_skipped_rows_carry_the_problems_work_counts(smoke_run):
    _, bundle = smoke_run
    df = bundle.measurements()
    not_run = df[df["status"].isin(["unsupported", "skipped"])]
    assert not not_run.empty
    assert (not_run["flops"] > 0).all() and (not_run["min_bytes"] > 0).all()


def _one_error_line(output: str) -> str:
    lines = [ln for ln in output.splitlines() if ln.strip()]
    assert len(lines) == 1, output
    return lines[0]


def test_errors_are_never_wrapped_even_for_long_paths(tmp_path):
    """rich wraps at 80 columns off a terminal; errors go through click.echo and stay on one line."""
    long_dir = tmp_path / ("a_folder_name_long_enough_to_push_the_message_past_eighty_columns_" * 2)
    missing = long_dir / "missing_run"
    r = CliRunner().invoke(main, ["show", str(missing)])
    assert r.exit_code == 2
    line = _one_error_line(r.output)
    assert line.startswith("error: ") and str(missing) in line


def _corrupt_copy(tmp_path, table: str = "measurements") -> Path:
    run = tmp_path / "damaged_run"
    shutil.copytree(BUNDLES / H100_L4, run)
    p = run / f"{table}.parquet"
    p.write_bytes(p.read_bytes()[:3000])  # truncated: no parquet footer
    return run


@pytest.mark.parametrize("cmd", ["show", "report", "export", "compare"])
def test_a_corrupt_table_is_one_line_naming_the_file_and_nothing_is_written(tmp_path, cmd):
    run = _corrupt_copy(tmp_path)
    out = tmp_path / "out"
    args = {"show": ["show", str(run)], "report": ["report", str(run), "--out", str(out)],
            "export": ["export", str(run), "--csv", str(out)],
            "compare": ["compare", str(run), str(BUNDLES / H100_L4)]}[cmd]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 2, r.output
    line = _one_error_line(r.output)
    assert str(run / "measurements.parquet") in line and "damaged" in line and "Traceback" not in r.output
    assert not out.exists()
    assert not (run / "report").exists()  # the default report folder is not left behind either
    r = CliRunner().invoke(main, ["report", str(run)])
    assert r.exit_code == 2 and not (run / "report").exists()


@pytest.mark.parametrize("cmd", ["show", "report", "explain", "compare", "gate"])
def test_a_foreign_measurements_table_is_one_line_naming_the_file(tmp_path, cmd):
    """A valid parquet table without faprof's row columns is damage: one line naming the file and the
    columns it lacks, exit 2 (not a KeyError, "no timed rows" or "No findings")."""
    run = tmp_path / "foreign_run"
    shutil.copytree(BUNDLES / H100_L4, run)
    pd.DataFrame({"a": [1, 2], "b": ["x", "y"]}).to_parquet(run / "measurements.parquet")
    other = str(BUNDLES / H100_L4)
    args = {"show": ["show", str(run)], "report": ["report", str(run), "--out", str(tmp_path / "out")],
            "explain": ["explain", str(run)], "compare": ["compare", other, str(run)], "gate": ["gate", other, str(run)]}[cmd]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 2, r.output
    line = _one_error_line(r.output)
    assert line.startswith(f"error: {run / 'measurements.parquet'} has no variant, shape_id, status columns"), line
    assert "damaged" in line and not (tmp_path / "out").exists()


def test_a_damaged_manifest_is_one_line_too(tmp_path):
    run = tmp_path / "bad_manifest"
    shutil.copytree(BUNDLES / H100_L4, run)
    (run / "manifest.json").write_bytes(b"\xff\xfe not json")
    r = CliRunner().invoke(main, ["show", str(run)])
    assert r.exit_code == 2 and "manifest.json" in _one_error_line(r.output)


def test_nsight_notices_are_repeated_under_the_table(smoke_run, tmp_path, monkeypatch):
    """Without ncu/nsys (this machine) the run goes on; what was skipped is said again in the last lines."""
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.delenv("NCU", raising=False)
    r = CliRunner().invoke(main, ["profile", "--scenario", "smoke", "--variants", "cpu_ref,torch_standard,sdpa_flash",
                                  "--out", str(tmp_path), "--ncu", "basic", "--nsys", *FAST])
    assert r.exit_code == 3, r.output  # the Nsight Compute stage asked for made no tables (no ncu here)
    tail = r.output.strip().splitlines()[-5:]
    notices = [ln for ln in tail if ln.startswith("notice: ")]
    assert any("Nsight Compute" in n or "ncu" in n for n in notices), tail
    assert any("nsys" in n for n in notices), tail
    assert any(ln.startswith("bundle: ") for ln in tail)
    assert tail[-1].startswith("ncu (")  # the last line says why the exit code is 3


#: The file `faprof build` must compile again in the test below (the smallest: three plain kernels).
RECOMPILED = "naive.cu"


def test_build_table_is_readable_and_ptxas_results_are_cached(tmp_path, monkeypatch):
    """A fresh cache holding ptxas' output of every file but one: the CLI compiles that one (its cache key
    is the one the library computes) and reuses the rest, then a second run compiles nothing. The sm_80
    logs come from the shared ptxas cache that tests/test_build.py fills (compiled here if it is cold);
    a build from an empty cache ("compiled N (file, arch) pairs") is tests/test_wheel.py's, from the
    installed wheel."""
    from faprof.variants import build, ptxas

    if build.find_cuda_home() is None and shutil.which("nvcc") is None:
        pytest.skip("nvcc not found")
    files = sorted(build.KERNELS_DIR.glob("*.cu"))
    assert ptxas.resource_report(archs=("sm_80",)).attrs["pairs"] == len(files)  # in parallel, if cold
    nvcc = build.find_nvcc()
    nvcc_id = ptxas._nvcc_identity(nvcc)
    cache = tmp_path / "cache" / "ptxas"
    cache.mkdir(parents=True)
    for f in files:
        if f.name != RECOMPILED:
            log, _ = ptxas._cached_ptxas_log(nvcc, nvcc_id, f, "sm_80")
            (cache / f"{ptxas.ptxas_cache_key(nvcc_id, f, 'sm_80')}.log").write_text(log)
    monkeypatch.setenv("FAPROF_CACHE", str(tmp_path / "cache"))
    r = CliRunner().invoke(main, ["build", "--arch", "sm_80"])
    assert r.exit_code == 0, r.output
    text = r.output
    # full template arguments, causal and non-causal instantiations told apart, occupancy as a whole %
    assert re.search(r"MmaConfig<64, 128, 128, 4, false, 2,\s*│.*\n.*false>, true", text) or "false>, true" in text
    assert re.search(r"│\s+\d{1,3}% │", text) and "8.33333" not in text
    assert f"1 of {len(files)} (file, arch) compiles ran" in " ".join(text.split()), text[-800:]
    assert len(list(cache.glob("*.log"))) == len(files)  # the compiled one was stored
    r2 = CliRunner().invoke(main, ["build", "--arch", "sm_80"])
    assert r2.exit_code == 0 and "0 of " in r2.output and "reused ptxas output cached" in r2.output
    assert r2.output.split("ptxas resource usage")[1].split("(file, arch)")[0].count("│") > 0


def test_dashboard_binds_to_localhost_unless_told(tmp_path):
    pytest.importorskip("streamlit")
    r = CliRunner().invoke(main, ["dashboard", "--print-command"])
    assert r.exit_code == 0 and "--server.address 127.0.0.1" in r.output
    r = CliRunner().invoke(main, ["dashboard", "--print-command", "--host", "0.0.0.0"])
    assert "--server.address 0.0.0.0" in r.output


# ------------------------------------------------------------------- data bugs and messages (issue 26)
EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "runs"
SANITIZE = EXAMPLES / "20261123T061948Z_nvidia-h100-80gb-hbm3_sanitize-3-variants-smoke"
L4_NCU_NSYS = EXAMPLES / "20261123T053932Z_nvidia-h100-80gb-hbm3_l4-causal"


def _no_gpu() -> bool:
    import torch

    return not torch.cuda.is_available()


def test_export_writes_every_table_of_a_bundle(tmp_path):
    """'Every table' (README): ncu_rules too, and a sanitize bundle's sanitizer table."""
    r = CliRunner().invoke(main, ["export", str(L4_NCU_NSYS), "--csv", str(tmp_path / "l4")])
    assert r.exit_code == 0, r.output
    written = {p.name for p in (tmp_path / "l4").iterdir()}
    on_disk = {p.stem + ".csv" for p in L4_NCU_NSYS.glob("*.parquet")}
    assert on_disk <= written and "ncu_rules.csv" in written
    assert len(pd.read_csv(tmp_path / "l4" / "ncu_rules.csv")) == len(pd.read_parquet(L4_NCU_NSYS / "ncu_rules.parquet"))
    r = CliRunner().invoke(main, ["export", str(SANITIZE), "--csv", str(tmp_path / "san")])
    assert r.exit_code == 0, r.output
    assert "sanitizer.csv" in {p.name for p in (tmp_path / "san").iterdir()}


def test_show_prints_a_sanitize_bundle():
    r = CliRunner().invoke(main, ["show", str(SANITIZE)])
    assert r.exit_code == 0, r.output
    for tool in ("memcheck", "racecheck", "initcheck", "synccheck"):
        assert f"{tool}: ERROR SUMMARY 0" in r.output
    assert "compute-sanitizer:" in r.output


def test_compare_on_a_sanitize_bundle_is_one_line():
    r = CliRunner().invoke(main, ["compare", str(SANITIZE), str(BUNDLES / H100_L4)])
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert _one_error_line(r.output).startswith("error: 20261123T061948Z") and "`faprof sanitize` bundle" in r.output


def test_build_table_leaves_role_registers_out_where_a_kernel_has_none():
    from faprof.cli import build_table

    rows = pd.DataFrame([
        {"file": "fa2.cu", "name": "fa2_fwd_kernel", "template_args": "64", "D": 64, "arch": "sm_90", "threads": 128,
         "registers": 72, "role_registers": float("nan"), "smem_static_bytes": 0, "dyn_smem_bytes": 16384,
         "stack_frame_bytes": 0, "spill_store_bytes": 0, "spill_load_bytes": 0, "blocks_per_sm": 4, "occupancy_pct": 25,
         "limiter": "registers"},
        {"file": "fa3_wgmma_ws.cu", "name": "ws_kernel", "template_args": "128", "D": 128, "arch": "sm_90", "threads": 384,
         "registers": 168, "role_registers": "producer 24, consumer 240", "smem_static_bytes": 0, "dyn_smem_bytes": 0,
         "stack_frame_bytes": 0, "spill_store_bytes": 0, "spill_load_bytes": 0, "blocks_per_sm": 1, "occupancy_pct": 19,
         "limiter": "registers"}])
    from rich.console import Console

    console = Console(width=250, record=True)
    console.print(build_table(rows))
    text = console.export_text()
    assert "(nan)" not in text and "72 " in text and "168 (producer 24, consumer 240)" in text


def test_ncu_selectors_name_the_torch_baselines_ncu_leaves_out():
    r = CliRunner().invoke(main, ["profile", "--scenario", "smoke", "--variants", "torch_standard", "--ncu", *FAST])
    assert r.exit_code == 2, r.output
    line = _one_error_line(r.output)
    assert "torch_standard" in line and "--ncu-variants torch_standard" in line
    assert "no selected variant supports" not in line


def test_an_unknown_variant_draws_no_progress_bar_first():
    r = CliRunner().invoke(main, ["profile", "--scenario", "smoke", "--variants", "fa9", *FAST])
    assert r.exit_code == 2
    assert _one_error_line(r.output).startswith("error: unknown variant 'fa9'")  # no 'profiling ━━━ 0/?' above it


@pytest.mark.skipif(not _no_gpu(), reason="checks the message on a machine without a GPU")
def test_ncu_on_a_kernel_bundle_without_a_gpu_says_there_is_no_gpu(tmp_path):
    run = tmp_path / "kernels_small"
    shutil.copytree(EXAMPLES / "20261123T061814Z_nvidia-h100-80gb-hbm3_kernels-small", run)
    m = json.loads((run / "manifest.json").read_text())
    m["settings"]["user_variants"] = [str(EXAMPLES.parent / "kernels" / "simple_attn.cu")]  # this checkout's copy
    (run / "manifest.json").write_text(json.dumps(m))
    r = CliRunner().invoke(main, ["ncu", str(run)])
    assert r.exit_code == 2, r.output
    line = _one_error_line(r.output)
    assert "no CUDA GPU visible here" in line and "NVIDIA H100 80GB HBM3" in line and "FAPROF_CUDA_ARCH" not in line


@pytest.mark.skipif(not _no_gpu(), reason="the rows of a machine without a GPU")
def test_doctor_without_a_gpu_still_shows_the_timer_and_clock_rows():
    r = CliRunner().invoke(main, ["doctor"])
    assert r.exit_code == 0
    rows = {ln.split("│")[1].strip(): ln for ln in r.output.splitlines() if ln.count("│") >= 3}
    assert "host clock" in rows["gpu timer"] and "no GPU" in rows["clocks (NVML)"]


def test_latest_passes_over_an_interrupted_run_and_says_so(tmp_path):
    """`show latest` shows the newest complete run, and names the newer interrupted one in a note."""
    shutil.copytree(BUNDLES / H100_L4, tmp_path / H100_L4)
    newer = tmp_path / "20261122T000000Z_cpu_l4-causal"
    shutil.copytree(BUNDLES / CPU_L4, newer)
    m = json.loads((newer / "manifest.json").read_text())
    (newer / "manifest.json").write_text(json.dumps({**m, "run_id": newer.name, "status": "interrupted"}))
    r = CliRunner().invoke(main, ["show", "latest", "--runs-dir", str(tmp_path)])
    assert r.exit_code == 0, r.output
    first = r.output.splitlines()[0]
    assert first.startswith("note: latest: " + H100_L4) and f"{newer.name} (interrupted)" in first
    assert "NVIDIA H100 80GB HBM3 (complete)" in r.output


def test_the_timing_footer_names_cpu_times_as_such():
    """A run without GPU rows says its times are the host clock's, never "GPU times"; a mixed run says both."""
    r = CliRunner().invoke(main, ["show", str(BUNDLES / CPU_L4)])
    assert r.exit_code == 0, r.output
    assert "CPU times: host clock: 15 rows" in r.output.splitlines() and "GPU times" not in r.output
    r = CliRunner().invoke(main, ["show", str(BUNDLES / H100_L4)])
    footer = [ln for ln in r.output.splitlines() if "times: " in ln]
    assert footer and footer[0].startswith("GPU times: ") and "host clock" not in footer[0].split("CPU times: ")[0]
