"""Nsight Systems integration without a GPU: argv, finding nsys and its importer, the capture watchdog,
collect()'s paths, and the SQLite parser on real exports recorded on an H100.

Method: command lines are compared as exact lists. nsys and ldd are replaced by small scripts (ldd
replays the output recorded on the H100; a fake nsys replays the recorded report, plan and export).
The parser reads the real exports under tests/data/nsys/, recorded by
scripts/record/record_nsys_fixtures.sh on an H100 with nsys 2025.3.1 (export schema 3.20.3), next to the
`.nsys-rep` each came from: `smoke.*` (torch_standard, sdpa_flash, sdpa_math, naive, fa2 on the
smoke scenario, 10 calls each, plus the harness' measurements.parquet of the same run) and
`no_kernels.*` (a capture that starts but launches nothing). Its joins are checked against plain
SQL over the same file. The schema-variant tests edit *copies* of the real export into the shapes
older or newer nsys versions write (text in StringIds, names as text, columns or tables missing):
synthetic in that one respect, real in everything else.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import stat
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from fakes import PY_HEADER

from faprof.errors import FaprofError
from faprof.nsight import nsys
from faprof.nsight.nsys import capture as nsys_capture
from faprof.nsight.nsys import find as nsys_find
from faprof.nsight.nsys import read as nsys_read
from faprof.nsight.nsys import stage as nsys_stage

DATA = Path(__file__).parent / "data" / "nsys"
SMOKE_DB, SMOKE_PLAN = DATA / "smoke.sqlite", DATA / "smoke_plan.json"
SMOKE_MEASUREMENTS = DATA / "smoke_measurements.parquet"
NO_KERNELS_DB, NO_KERNELS_PLAN = DATA / "no_kernels.sqlite", DATA / "no_kernels_plan.json"
SMOKE_VARIANTS = ["torch_standard", "sdpa_flash", "sdpa_math", "naive", "fa2"]
FULL, CAUSAL, FP16, BWD = ("b1_h2_sq64_sk64_d32_fp32_full_fwd", "b2_h1_sq17_sk113_d32_fp32_causal_fwd",
                           "b1_h2_sq128_sk128_d64_fp16_causal_fwd", "b1_h2_sq64_sk64_d32_fp32_full_bwd")

#: What the H100 recording holds (counted with plain SQL when the fixture was made).
SMOKE_KERNELS_CAPTURED = 1171  # every kernel between cudaProfilerStart and Stop, warm-ups included
SMOKE_KERNELS_IN_CALLS = 900  # those launched inside an iter<i> range
SMOKE_ITERS = 10


def _exe(path: Path, body: str = "#!/bin/sh\nexit 0\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def _plan(path: Path = SMOKE_PLAN) -> dict:
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def smoke_kernels() -> pd.DataFrame:
    return nsys.read_kernels(SMOKE_DB, SMOKE_PLAN)


@pytest.fixture(scope="module")
def smoke_summary(smoke_kernels) -> pd.DataFrame:
    return nsys.summarize(smoke_kernels, pd.read_parquet(SMOKE_MEASUREMENTS), _plan())


def _row(df: pd.DataFrame, variant: str, shape_id: str) -> pd.Series:
    hit = df[(df["variant"] == variant) & (df["shape_id"] == shape_id)]
    assert len(hit) == 1, (variant, shape_id, len(hit))
    return hit.iloc[0]


# =============================================================================== argv
def test_nsys_command_is_the_exact_argv():
    argv = nsys.nsys_command("/opt/nsys", "/b/raw/nsys", "/s/smoke.toml", ["torch_standard", "naive"], 10,
                             "/b/raw/nsys_plan.json", python="/usr/bin/python3")
    assert argv == [
        "/opt/nsys", "profile", "-t", "cuda,nvtx", "-s", "none", "--cpuctxsw=none",
        "--capture-range=cudaProfilerApi", "--capture-range-end=stop", "--wait=primary", "--cuda-graph-trace=node",
        "-o", "/b/raw/nsys", "-f", "true",
        "/usr/bin/python3", "-m", "faprof.nsight.target", "--scenario", "/s/smoke.toml", "--tool", "nsys",
        "--iters", "10", "--variants", "torch_standard,naive", "--plan-out", "/b/raw/nsys_plan.json",
    ]


def test_nsys_command_with_shapes_user_variants_and_this_python():
    argv = nsys.nsys_command(Path("nsys"), Path("r"), "smoke", ["mine"], 3, Path("p.json"),
                             shapes=["s1", "s2"], user_variants=["a.py", "pkg.mod"])
    assert argv[:1] == ["nsys"]
    assert argv[argv.index(sys.executable):] == [
        sys.executable, "-m", "faprof.nsight.target", "--scenario", "smoke", "--tool", "nsys", "--iters", "3",
        "--variants", "mine", "--plan-out", "p.json", "--shapes", "s1,s2",
        "--user-variants", "a.py", "--user-variants", "pkg.mod"]


def test_export_command_is_the_exact_argv():
    assert nsys.export_command("/opt/nsys", "/b/raw/nsys.nsys-rep", "/b/raw/nsys.sqlite") == [
        "/opt/nsys", "export", "--type", "sqlite", "-o", "/b/raw/nsys.sqlite", "/b/raw/nsys.nsys-rep"]


# ========================================================================== find_nsys
def test_find_nsys_prefers_the_NSYS_variable_then_PATH(tmp_path):
    explicit = _exe(tmp_path / "explicit" / "nsys")
    on_path = _exe(tmp_path / "bin" / "nsys")
    assert nsys.find_nsys({"NSYS": str(explicit), "PATH": str(on_path.parent)}, globs=()) == explicit
    assert nsys.find_nsys({"NSYS": str(explicit.parent), "PATH": ""}, globs=()) == explicit  # a folder
    assert nsys.find_nsys({"PATH": str(on_path.parent)}, globs=()) == on_path
    # NSYS naming something that is not there falls through to PATH
    assert nsys.find_nsys({"NSYS": str(tmp_path / "gone"), "PATH": str(on_path.parent)}, globs=()) == on_path
    assert nsys.find_nsys({"PATH": str(tmp_path / "empty")}, globs=()) is None


def test_find_nsys_searches_installs_newest_first_then_inside_nsight_compute(tmp_path):
    old = _exe(tmp_path / "opt/nvidia/nsight-systems/2024.4.2/bin/nsys")
    new = _exe(tmp_path / "opt/nvidia/nsight-systems/2025.3.1/bin/nsys")
    ncu_copy = _exe(tmp_path / "opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64/nsys")
    globs = [str(tmp_path / "opt/nvidia/nsight-systems/*/bin/nsys"),
             str(tmp_path / "opt/nvidia/nsight-compute/*/host/target-linux-x64/nsys")]
    assert nsys.find_nsys({"PATH": ""}, globs=globs) == new
    new.unlink()
    assert nsys.find_nsys({"PATH": ""}, globs=globs) == old
    old.unlink()
    assert nsys.find_nsys({"PATH": ""}, globs=globs) == ncu_copy  # where the H100 machine has it
    ncu_copy.chmod(0o644)  # not executable: not a candidate
    assert nsys.find_nsys({"PATH": ""}, globs=globs) is None


def test_default_globs_cover_the_documented_installs():
    for pattern in ("/opt/nvidia/nsight-systems/*/bin/nsys", "/usr/local/cuda*/bin/nsys",
                    "/opt/nvidia/nsight-systems-cli/*/bin/nsys", "/opt/nvidia/nsight-compute/*/host/target-linux-x64/nsys"):
        assert pattern in nsys.NSYS_GLOBS
    # a full Nsight Systems install is preferred over the copy inside Nsight Compute
    assert nsys.NSYS_GLOBS.index("/opt/nvidia/nsight-systems/*/bin/nsys") < nsys.NSYS_GLOBS.index(
        "/opt/nvidia/nsight-compute/*/host/target-linux-x64/nsys")


# =========================================================================== importer
def test_find_importer_in_the_layouts_seen(tmp_path):
    # Nsight Compute 2025.3.1 on the H100: host/target-linux-x64/nsys, host/linux-desktop-glibc_2_11_3-x64/QdstrmImporter
    a = _exe(tmp_path / "ncu/host/target-linux-x64/nsys")
    ai = _exe(tmp_path / "ncu/host/linux-desktop-glibc_2_11_3-x64/QdstrmImporter")
    assert nsys.find_importer(a) == ai
    # Nsight Systems: target-linux-x64/nsys beside host-linux-x64/QdstrmImporter, bin/nsys a link
    b = _exe(tmp_path / "nsys/target-linux-x64/nsys")
    bi = _exe(tmp_path / "nsys/host-linux-x64/QdstrmImporter")
    assert nsys.find_importer(b) == bi
    link = tmp_path / "nsys/bin/nsys"
    link.parent.mkdir()
    link.symlink_to(b)
    assert nsys.find_importer(link) == bi
    # both in one folder
    c = _exe(tmp_path / "flat/nsys")
    ci = _exe(tmp_path / "flat/QdstrmImporter")
    assert nsys.find_importer(c) == ci


def test_missing_libraries_from_the_recorded_ldd_output():
    without = (DATA / "importer_ldd_without_libs.txt").read_text()
    with_libs = (DATA / "importer_ldd_with_libs.txt").read_text()
    assert nsys.missing_libraries(without) == ["libdw.so.1"]
    assert nsys.missing_libraries(with_libs) == []
    assert nsys.missing_libraries("\tlibdw.so.1 => not found\n\tlibelf.so.1 => not found\n\tlibdw.so.1 => not found\n") == [
        "libdw.so.1", "libelf.so.1"]


def test_importer_problem_names_libraries_packages_and_the_fix():
    msg = nsys.importer_problem(["libdw.so.1", "libelf.so.1"])
    assert msg.startswith("libdw.so.1 and libelf.so.1 (Debian/Ubuntu packages libdw1 and libelf1) — install")
    assert "dpkg -x" in msg and "LD_LIBRARY_PATH" in msg
    # libdw1 alone still needs libelf1 when unpacked by hand
    assert nsys.importer_problem(["libdw.so.1"]).startswith(
        "libdw.so.1 (Debian/Ubuntu package libdw1, which needs libelf1) — install libdw1 and libelf1")


def _fake_ldd(tmp_path: Path, output_file: Path) -> dict:
    _exe(tmp_path / "fakebin" / "ldd", f"{PY_HEADER}print(open({str(output_file)!r}).read(), end='')\n")
    return {"PATH": str(tmp_path / "fakebin")}


def test_check_importer_reports_what_is_missing(tmp_path, monkeypatch):
    exe = _exe(tmp_path / "host/target-linux-x64/nsys")
    imp = _exe(tmp_path / "host/linux-desktop-glibc_2_11_3-x64/QdstrmImporter")
    monkeypatch.setenv("PATH", _fake_ldd(tmp_path, DATA / "importer_ldd_without_libs.txt")["PATH"])
    ok, msg = nsys.check_importer(exe)
    assert not ok
    assert str(imp) in msg and "libdw.so.1" in msg and "libdw1" in msg and "libelf1" in msg and "dpkg -x" in msg
    monkeypatch.setenv("PATH", _fake_ldd(tmp_path, DATA / "importer_ldd_with_libs.txt")["PATH"])
    assert nsys.check_importer(exe) == (True, str(imp))


def test_check_importer_without_an_importer(tmp_path):
    ok, msg = nsys.check_importer(_exe(tmp_path / "alone/bin/nsys"))
    if nsys.find_importer(tmp_path / "alone/bin/nsys") is not None:
        pytest.skip("this machine has a system-wide QdstrmImporter")
    assert not ok and "QdstrmImporter" in msg and ".qdstrm" in msg


# ==================================================================== the capture run
def _fake_nsys(tmp_path: Path, profile_body: str, name: str = "nsys") -> Path:
    """A stand-in nsys: `profile ... -o BASE ...` runs profile_body (Python, with `base` and `argv`
    set); `export -o OUT REP` copies the recorded smoke export; `--version` answers."""
    return _exe(tmp_path / "fake" / name, f"""{PY_HEADER}import shutil, sys, time, json
from pathlib import Path
argv = sys.argv[1:]
if argv[:1] == ["--version"]:
    print("NVIDIA Nsight Systems version 2025.3.1.0-fake"); sys.exit(0)
if argv[:1] == ["export"]:
    shutil.copy({str(SMOKE_DB)!r}, argv[argv.index("-o") + 1]); sys.exit(0)
base = argv[argv.index("-o") + 1]
plan_out = argv[argv.index("--plan-out") + 1] if "--plan-out" in argv else None
{profile_body}
""")


def test_run_capture_stops_an_nsys_that_lingers_after_its_report(tmp_path, monkeypatch):
    monkeypatch.setattr(nsys_capture, "EXIT_GRACE_S", 1.0)
    log_text = (DATA / "smoke_nsys.log").read_text()
    fake = _fake_nsys(tmp_path, f"""
Path(base + ".nsys-rep").write_bytes(b"rep")
print({log_text!r}, flush=True)
time.sleep(600)
""")
    t0 = time.monotonic()
    cap = nsys.run_capture([str(fake), "profile", "-o", str(tmp_path / "r")], tmp_path / "r", tmp_path / "log")
    assert time.monotonic() - t0 < 20
    assert cap.stopped == "lingered" and cap.rc is None
    assert cap.report == tmp_path / "r.nsys-rep" and cap.ok
    assert cap.report_after_s is not None and cap.report_after_s < cap.wall_s


def test_leftover_qdstrm_reads_quoted_paths_with_spaces(tmp_path):
    """nsys quotes the paths it prints; a temporary folder with spaces in its name is still one path."""
    spaced = tmp_path / "a tmp dir" / "nsys-report-9f9f.qdstrm"
    spaced.parent.mkdir()
    spaced.write_bytes(b"x")
    log = f"Generating '{spaced}'\nImporter error status: Importation failed.\n"
    assert nsys.leftover_qdstrm(tmp_path / "r", log) == [spaced]
    assert nsys.leftover_qdstrm(tmp_path / "r", f'Generating "{spaced}"') == [spaced]
    if not any(c.isspace() for c in str(tmp_path)):  # an unquoted path ends at the first blank
        bare = tmp_path / "bare.qdstrm"
        bare.write_bytes(b"x")
        assert nsys.leftover_qdstrm(tmp_path / "r", f"{log}also {bare} here") == sorted([spaced, bare])


def test_run_capture_deletes_a_qdstrm_left_without_a_report(tmp_path):
    elsewhere = tmp_path / "tmp" / "nsys-report-1a2b.qdstrm"
    fake = _fake_nsys(tmp_path, f"""
Path(base + ".qdstrm").write_bytes(b"x" * 4096)
Path({str(elsewhere)!r}).parent.mkdir(parents=True, exist_ok=True)
Path({str(elsewhere)!r}).write_bytes(b"x" * 4096)
print("Generating '{elsewhere}'")
print("Importer error status: Importation failed.")
""")
    cap = nsys.run_capture([str(fake), "profile", "-o", str(tmp_path / "r")], tmp_path / "r", tmp_path / "log")
    assert cap.report is None and cap.rc == 0 and cap.stopped == ""
    assert not (tmp_path / "r.qdstrm").exists() and not elsewhere.exists()
    assert len(cap.qdstrm_removed) == 2 and all(".qdstrm" in q for q in cap.qdstrm_removed)


def test_run_capture_times_out(tmp_path):
    fake = _fake_nsys(tmp_path, "time.sleep(600)")
    t0 = time.monotonic()
    cap = nsys.run_capture([str(fake), "profile", "-o", str(tmp_path / "r")], tmp_path / "r", tmp_path / "log",
                           timeout_s=1.5)
    assert time.monotonic() - t0 < 15
    assert cap.stopped == "timeout" and cap.report is None


def test_generated_line_of_the_real_log():
    assert nsys_capture._generated((DATA / "smoke_nsys.log").read_text())
    assert nsys_capture._generated((DATA / "cpu_only_nsys.log").read_text())  # "Generated:\n\tNo reports were generated"
    assert not nsys_capture._generated("Capture range started in the application.\n")


# ============================================================================= collect
@pytest.fixture()
def bundle(tmp_path):
    from faprof.store import Bundle

    b = Bundle.create(tmp_path / "runs", "smoke", "NVIDIA H100 80GB HBM3", {"scenario": {"name": "smoke"}})
    b.write("measurements", pd.read_parquet(SMOKE_MEASUREMENTS))
    return b


def _collect(bundle, monkeypatch, fake: Path | None, importer=(True, "QdstrmImporter"), cuda_ok=True,
             variants=SMOKE_VARIANTS):
    from faprof.model.options import ProfileOptions
    from faprof.model.scenarios import load_scenario

    monkeypatch.setattr(nsys_stage, "find_nsys", lambda: fake)
    monkeypatch.setattr(nsys_stage, "check_importer", lambda _n: importer)
    events: list[tuple[str, dict]] = []
    nsys.collect(bundle, load_scenario("smoke"), ProfileOptions(variants=variants),
                 lambda e, i: events.append((e, i)), cuda_ok)
    return events


def _warnings(events) -> list[str]:
    return [i["message"] for e, i in events if e == "warning"]


def test_collect_without_a_gpu_says_so_and_goes_on(bundle, monkeypatch):
    events = _collect(bundle, monkeypatch, None, cuda_ok=False)
    assert any("no CUDA GPU" in w for w in _warnings(events))
    assert bundle.manifest()["nsys"]["status"] == "skipped"
    assert not bundle.has("nsys_kernels")
    assert any("no CUDA GPU" in line for line in bundle.manifest()["log"])


def test_collect_without_nsys_says_where_it_looked(bundle, monkeypatch):
    events = _collect(bundle, monkeypatch, None)
    (w,) = _warnings(events)
    assert "nsys not found" in w and "NSYS=" in w
    assert bundle.manifest()["nsys"]["status"] == "skipped"


def test_collect_with_a_broken_importer_does_not_run_nsys(bundle, monkeypatch, tmp_path):
    ran = tmp_path / "nsys-was-run"
    fake = _fake_nsys(tmp_path, f"Path({str(ran)!r}).touch()")
    problem = "nsys' importer /x/QdstrmImporter cannot load " + nsys.importer_problem(["libdw.so.1"])
    events = _collect(bundle, monkeypatch, fake, importer=(False, problem))
    (w,) = _warnings(events)
    assert "libdw.so.1" in w and "libelf1" in w and ".qdstrm" in w
    assert not ran.exists()
    assert bundle.manifest()["nsys"]["status"] == "skipped"


def test_collect_end_to_end_on_the_recorded_capture(bundle, monkeypatch, tmp_path, smoke_kernels):
    log_text = (DATA / "smoke_nsys.log").read_text()
    fake = _fake_nsys(tmp_path, f"""
shutil.copy({str(DATA / "smoke.nsys-rep")!r}, base + ".nsys-rep")
shutil.copy({str(SMOKE_PLAN)!r}, plan_out)
print({log_text!r})
""")
    events = _collect(bundle, monkeypatch, fake)
    assert _warnings(events) == []
    info = bundle.manifest()["nsys"]
    raw = bundle.path / "raw"
    assert info["status"] == "complete" and info["rc"] == 0 and info["stopped"] == ""
    from faprof.model.scenarios import load_scenario

    assert info["command"] == nsys.nsys_command(fake, raw / "nsys", load_scenario("smoke").path,
                                                SMOKE_VARIANTS, nsys.DEFAULT_ITERS, raw / "nsys_plan.json")
    assert info["version"] == "2025.3.1.0-fake" and info["wall_s"] >= 0 and info["sqlite"] == "raw/nsys.sqlite"
    assert info["kernels_captured"] == SMOKE_KERNELS_CAPTURED and info["kernels_attributed"] == SMOKE_KERNELS_IN_CALLS
    assert info["export"]["EXPORT_PRODUCT_VERSION"].startswith("2025.3")
    kernels, summary = bundle.read("nsys_kernels"), bundle.read("nsys_summary")
    assert (kernels["run_id"] == bundle.run_id).all()
    pd.testing.assert_frame_equal(kernels.drop(columns="run_id"), smoke_kernels)
    ok = summary[summary["status"] == "ok"]
    assert len(ok) == 13 and ok["harness_over_gpu"].notna().all()
    assert any(e == "nsight" and "exporting" in i["message"] for e, i in events)


def test_collect_when_no_pair_runs_on_the_gpu(bundle, monkeypatch, tmp_path):
    # what nsys 2025.3.1 did on the H100 for `--variants cpu_ref`: the capture never started
    log_text = (DATA / "cpu_only_nsys.log").read_text()
    fake = _fake_nsys(tmp_path, f"""
shutil.copy({str(DATA / "cpu_only_plan.json")!r}, plan_out)
print({log_text!r})
""")
    events = _collect(bundle, monkeypatch, fake, variants=["cpu_ref"])
    (w,) = _warnings(events)
    assert "no (variant, shape) pair ran on the GPU" in w
    assert bundle.manifest()["nsys"]["status"] == "empty"
    summary = bundle.read("nsys_summary")
    assert summary["status"].tolist() == ["not run"]
    assert summary["reason"].tolist() == ["runs on the CPU: no kernels to profile"]


def test_collect_reports_an_importer_failure_after_the_run(bundle, monkeypatch, tmp_path):
    fake = _fake_nsys(tmp_path, """
Path(base + ".qdstrm").write_bytes(b"q" * 1024)
print("Importer error status: Importation failed.")
""")
    events = _collect(bundle, monkeypatch, fake)
    (w,) = _warnings(events)
    assert "raw capture and no report" in w and "Deleted" in w
    assert not list((bundle.path / "raw").glob("*.qdstrm"))
    assert bundle.manifest()["nsys"]["status"] == "failed"


def test_doctor_checks(monkeypatch, tmp_path):
    monkeypatch.setattr(nsys_find, "find_nsys", lambda: None)
    (c,) = nsys.doctor_checks()
    assert c.name == "nsys" and c.status == "warn" and "NSYS=" in c.hint
    fake = _fake_nsys(tmp_path, "")
    monkeypatch.setattr(nsys_find, "find_nsys", lambda: fake)
    monkeypatch.setattr(nsys_find, "check_importer", lambda _n: (False, "cannot load libdw.so.1"))
    found, importer = nsys.doctor_checks()
    assert (found.status, importer.status) == ("ok", "fail")
    assert "2025.3.1.0-fake" in found.detail and "libdw.so.1" in importer.detail


# ============================================================== parser on the real export
def test_load_sqlite_reads_the_real_export():
    t = nsys.load_sqlite(SMOKE_DB)
    assert t.notes == []
    assert len(t.kernels) == SMOKE_KERNELS_CAPTURED
    assert t.meta["EXPORT_SCHEMA_VERSION"] == "3.20.3"
    assert t.meta["gpus"][0]["name"] == "NVIDIA H100 80GB HBM3"
    assert t.kernels["kernel"].notna().all() and t.kernels["kernel_short"].notna().all()
    assert set(t.api["api"].dropna()) >= {"cudaLaunchKernel_v7000", "cuProfilerStart"}
    assert {"faprof_warmup", "torch_standard", "naive", FULL, "iter0", "iter9"} <= set(t.ranges["text"])


def test_every_kernel_in_a_call_is_attributed_as_plain_sql_joins_it(smoke_kernels):
    k = smoke_kernels
    assert len(k) == SMOKE_KERNELS_IN_CALLS
    assert list(k.columns) == list(nsys.KERNEL_COLUMNS)
    with sqlite3.connect(f"file:{SMOKE_DB}?mode=ro", uri=True) as con:
        # the API call inside an iter range of the same thread ...
        same_thread = dict(con.execute("""
            SELECT k.correlationId, n.text FROM CUPTI_ACTIVITY_KIND_KERNEL k
            JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = k.correlationId
            JOIN NVTX_EVENTS n ON n.globalTid = r.globalTid AND n.start <= r.start AND r.end <= n.end
            WHERE n.text LIKE 'iter%'""").fetchall())
        # ... or of the same process (autograd's thread runs the backward's launches)
        same_process = dict(con.execute("""
            SELECT k.correlationId, n.text FROM CUPTI_ACTIVITY_KIND_KERNEL k
            JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = k.correlationId
            JOIN NVTX_EVENTS n ON (n.globalTid >> 24) = (r.globalTid >> 24) AND n.start <= r.start AND r.end <= n.end
            WHERE n.text LIKE 'iter%'""").fetchall())
    by_thread = k[k["nvtx_match"] == "thread"]
    assert dict(zip(by_thread["correlation_id"], "iter" + by_thread["iteration"].astype(str), strict=True)) == same_thread
    assert dict(zip(k["correlation_id"], "iter" + k["iteration"].astype(str), strict=True)) == same_process
    # the backward's kernels are all launched from another thread than the NVTX ranges
    assert set(k.loc[k["nvtx_match"] == "process", "shape_id"]) == {BWD}


def test_kernels_table_values_for_naive(smoke_kernels):
    naive = smoke_kernels[(smoke_kernels["variant"] == "naive") & (smoke_kernels["shape_id"] == FULL)]
    assert len(naive) == 3 * SMOKE_ITERS
    first = naive[naive["iteration"] == 0].sort_values("kernel_index")
    assert first["kernel_short"].tolist() == ["naive_scores_kernel", "naive_softmax_kernel", "naive_pv_kernel"]
    assert first["kernel"].iloc[0].startswith("naive_scores_kernel(const float *")  # demangled, with arguments
    scores = first.iloc[0]
    assert (scores.grid_x, scores.grid_y, scores.grid_z, scores.block_x, scores.block_y, scores.block_z) == (2, 2, 2, 32, 8, 1)
    assert (scores.registers_per_thread, scores.static_smem_bytes, scores.dynamic_smem_bytes) == (64, 8448, 0)
    assert scores.smem_bytes == 8448 and scores.device == 0 and scores.api == "cudaLaunchKernel_v7000"
    k = smoke_kernels
    assert (k["duration_ns"] == k["end_ns"] - k["start_ns"]).all() and (k["duration_ns"] > 0).all()
    assert (k["launch_latency_ns"] == k["start_ns"] - k["api_start_ns"]).all() and (k["launch_latency_ns"] > 0).all()
    assert ((k["iter_start_ns"] <= k["api_start_ns"]) & (k["api_end_ns"] <= k["iter_end_ns"])).all()


def test_per_call_and_gaps_add_up(smoke_kernels):
    calls = nsys.per_call(smoke_kernels)
    assert len(calls) == 13 * SMOKE_ITERS
    # the recording's kernels run one after another on one stream: busy time is the sum of durations
    sums = smoke_kernels.groupby(["variant", "shape_id", "iteration"])["duration_ns"].sum().astype("int64")
    got_ns = calls.set_index(["variant", "shape_id", "iteration"])["gpu_ns"].astype("int64")
    assert got_ns.sort_index().equals(sums.sort_index())
    assert (calls["wall_ns"] >= calls["gpu_ns"]).all() and (calls["host_ns"] > 0).all()
    gaps = nsys.idle_gaps(smoke_kernels)
    assert len(gaps) == len(smoke_kernels) - len(calls)  # k kernels per call leave k - 1 gaps
    idle = gaps.groupby(["variant", "shape_id", "iteration"])["gap_ns"].sum()
    got = calls.set_index(["variant", "shape_id", "iteration"])["idle_ns"]
    assert (got.reindex(idle.index) == idle).all() and (got.drop(idle.index) == 0).all()
    # one call: kernel time + idle gaps + first launch latency span the wall time exactly (one stream)
    one = calls.iloc[0]
    assert one.wall_ns == one.gpu_ns + one.idle_ns + one.first_launch_ns


def test_summary_on_the_real_capture(smoke_summary):
    s = smoke_summary
    assert list(s.columns) == list(nsys.SUMMARY_COLUMNS)
    assert list(zip(s["variant"], s["shape_id"], strict=True)) == [(p["variant"], p["shape_id"]) for p in _plan()["pairs"]]
    ok = s[s["status"] == "ok"]
    assert len(ok) == 13 and (ok["iterations"] == SMOKE_ITERS).all()
    assert (ok["kernels_per_call_min"] == ok["kernels_per_call_max"]).all()
    expected = {("naive", FULL): 3, ("naive", CAUSAL): 3, ("fa2", FULL): 1, ("fa2", CAUSAL): 1,
                ("sdpa_flash", FP16): 1, ("torch_standard", FULL): 4, ("torch_standard", CAUSAL): 9}
    for (v, sh), n in expected.items():
        assert _row(s, v, sh).kernels_per_call == n, (v, sh)
    assert list(_row(s, "sdpa_flash", FP16).kernel_names) == ["flash_fwd_kernel"]
    naive = _row(s, "naive", FULL)
    assert naive.idle_us > 0 and naive.gap_us > 0 and 0 < naive.busy_frac < 1
    assert naive.wall_us > naive.gpu_us and naive.launch_us > 0
    assert _row(s, "fa2", FULL).idle_us == 0 and pd.isna(_row(s, "fa2", FULL).gap_us)  # one kernel: no gap
    # the harness' median of the same pair, unchanged, and the ratio built from it
    meas = pd.read_parquet(SMOKE_MEASUREMENTS).set_index(["variant", "shape_id"])
    for r in ok.itertuples():
        assert r.harness_ms == meas.loc[(r.variant, r.shape_id), "median_ms"]
        assert r.nsys_gpu_ms == pytest.approx(r.gpu_us / 1e3)
        assert r.harness_over_gpu == pytest.approx(r.harness_ms / r.nsys_gpu_ms)
        # these tiny calls: the events' span includes launch gaps; never below the kernels' own time
        assert 1.0 < r.harness_over_gpu < 3.0
    skipped = s[s["status"] == "not run"]
    assert len(skipped) == 7 and skipped["reason"].str.contains("supports").all()
    assert skipped["harness_ms"].isna().all() and (skipped["iterations"] == 0).all()


def test_agreement_is_nan_without_measurements(smoke_kernels):
    s = nsys.summarize(smoke_kernels)
    assert len(s) == 13 and s["harness_ms"].isna().all() and s["harness_over_gpu"].isna().all()
    assert s["gpu_us"].notna().all()


def test_launch_overhead_and_kernels_per_call_tables(smoke_kernels):
    lo = nsys.launch_overhead(smoke_kernels)
    assert len(lo) == 13 and (lo["launch_us"] > 0).all() and (lo["launch_us_max"] >= lo["launch_us"]).all()
    naive = smoke_kernels[(smoke_kernels["variant"] == "naive") & (smoke_kernels["shape_id"] == FULL)]
    assert _row(lo, "naive", FULL).launch_us == pytest.approx(naive["launch_latency_ns"].median() / 1e3)
    kpc = nsys.kernels_per_call(smoke_kernels)
    assert list(_row(kpc, "naive", CAUSAL).kernel_names) == ["naive_scores_kernel", "naive_softmax_kernel", "naive_pv_kernel"]


# =================================================================== capture without kernels
def test_a_capture_without_kernels():
    t = nsys.load_sqlite(NO_KERNELS_DB)
    assert t.kernels.empty and any("no kernels" in n for n in t.notes)
    assert t.ranges["text"].tolist() == ["no_kernels", FULL, "iter0", "iter1", "iter2"]
    k = nsys.attribute_kernels(t, _plan(NO_KERNELS_PLAN))
    assert k.empty and list(k.columns) == list(nsys.KERNEL_COLUMNS)
    for f in (nsys.per_call, nsys.kernels_per_call, nsys.launch_overhead, nsys.idle_gaps):
        assert f(k).empty
    s = nsys.summarize(k, None, _plan(NO_KERNELS_PLAN))
    assert s[["variant", "status", "iterations"]].values.tolist() == [["no_kernels", "no kernels", 3]]
    assert nsys.summarize(k).empty and list(nsys.summarize(k).columns) == list(nsys.SUMMARY_COLUMNS)


# ========================================================================= schema variants
def _copy(tmp_path: Path, src: Path = SMOKE_DB) -> Path:
    dst = tmp_path / src.name
    shutil.copy(src, dst)
    return dst


def _edit(db: Path, *sql: str) -> None:
    con = sqlite3.connect(db)
    for statement in sql:
        con.executescript(statement)
    con.commit()
    con.close()


def test_nvtx_text_stored_in_StringIds(tmp_path, smoke_kernels):
    """Newer exports keep NVTX text in StringIds (textId) and leave `text` NULL."""
    db = _copy(tmp_path)
    _edit(db, """
        INSERT INTO StringIds (id, value) SELECT 1000000 + rowid, text FROM NVTX_EVENTS WHERE text IS NOT NULL;
        UPDATE NVTX_EVENTS SET textId = 1000000 + rowid, text = NULL WHERE text IS NOT NULL;""")
    pd.testing.assert_frame_equal(nsys.read_kernels(db, SMOKE_PLAN), smoke_kernels)


def test_names_as_text_and_old_column_names(tmp_path, smoke_kernels):
    """Older exports: API names as text in `name`, kernel names as text, no globalPid, no enum table."""
    db = _copy(tmp_path)
    _edit(db,
          "ALTER TABLE CUPTI_ACTIVITY_KIND_RUNTIME ADD COLUMN name TEXT;",
          "UPDATE CUPTI_ACTIVITY_KIND_RUNTIME SET name = (SELECT value FROM StringIds WHERE id = nameId);",
          "ALTER TABLE CUPTI_ACTIVITY_KIND_RUNTIME DROP COLUMN nameId;",
          "ALTER TABLE CUPTI_ACTIVITY_KIND_KERNEL ADD COLUMN name TEXT;",
          "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET name = (SELECT value FROM StringIds WHERE id = demangledName);",
          "ALTER TABLE CUPTI_ACTIVITY_KIND_KERNEL DROP COLUMN demangledName;",
          "ALTER TABLE CUPTI_ACTIVITY_KIND_KERNEL DROP COLUMN globalPid;",
          "DROP TABLE ENUM_NSYS_EVENT_TYPE;")
    t = nsys.load_sqlite(db)
    assert any("older name" in n for n in t.notes) and any("demangledName" in n for n in t.notes)
    got = nsys.attribute_kernels(t, _plan())
    pd.testing.assert_frame_equal(got, smoke_kernels)


def test_missing_columns_become_empty_not_errors(tmp_path):
    db = _copy(tmp_path)
    _edit(db, "ALTER TABLE CUPTI_ACTIVITY_KIND_KERNEL DROP COLUMN registersPerThread;",
          "ALTER TABLE CUPTI_ACTIVITY_KIND_KERNEL DROP COLUMN dynamicSharedMemory;")
    t = nsys.load_sqlite(db)
    assert any("registersPerThread" in n for n in t.notes)
    k = nsys.attribute_kernels(t, _plan())
    assert len(k) == SMOKE_KERNELS_IN_CALLS
    assert k["registers_per_thread"].isna().all() and k["smem_bytes"].isna().all()
    assert k["static_smem_bytes"].notna().all()


def test_no_runtime_table_means_no_join(tmp_path):
    db = _copy(tmp_path)
    _edit(db, "DROP TABLE CUPTI_ACTIVITY_KIND_RUNTIME;")
    t = nsys.load_sqlite(db)
    assert any("CUPTI_ACTIVITY_KIND_RUNTIME" in n for n in t.notes)
    assert nsys.attribute_kernels(t).empty


def test_unclosed_ranges_and_foreign_ranges_are_ignored(tmp_path, smoke_kernels):
    db = _copy(tmp_path)
    _edit(db, """
        INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid)
        SELECT start, NULL, 59, 'iter0', globalTid FROM NVTX_EVENTS WHERE text = 'naive' LIMIT 1;""")
    pd.testing.assert_frame_equal(nsys.read_kernels(db, SMOKE_PLAN), smoke_kernels)
    # without the plan, ranges of pairs the target did not list are kept; with it, dropped
    plan = _plan()
    plan["pairs"] = [p for p in plan["pairs"] if p["variant"] != "naive"]
    assert "naive" not in set(nsys.read_kernels(SMOKE_DB, plan)["variant"])


def test_not_an_export(tmp_path):
    bad = tmp_path / "x.sqlite"
    bad.write_text("not a database")
    with pytest.raises(FaprofError, match="not an SQLite export"):
        nsys.load_sqlite(bad)
    with pytest.raises(FaprofError, match="does not exist"):
        nsys.load_sqlite(tmp_path / "missing.sqlite")


def test_short_name_for_exports_without_shortName():
    assert nsys_read._short_name("void at::native::vectorized_elementwise_kernel<4, float>(int, T2)") == \
        "vectorized_elementwise_kernel"
    assert nsys_read._short_name("naive_pv_kernel(const float *, float *)") == "naive_pv_kernel"
    assert nsys_read._short_name(None) is None


def test_recorded_reports_are_small():
    for f in DATA.glob("*.nsys-rep"):
        assert f.stat().st_size < 2 * 2**20 and f.with_suffix(".sqlite").exists()
    for f in DATA.glob("*.sqlite"):
        assert f.stat().st_size < 2 * 2**20


def test_overlapping_kernels_leave_no_gap(smoke_kernels):
    """Kernels on two streams can overlap: the idle gap is floored at 0, never negative. (The real
    capture has one stream per call; this moves the second kernel of one real naive call back so
    that it starts while the first still runs.)"""
    call = smoke_kernels[(smoke_kernels["variant"] == "naive") & (smoke_kernels["shape_id"] == FULL)
                         & (smoke_kernels["iteration"] == 1)].copy()
    first_end = call["end_ns"].iloc[0]
    call.loc[call.index[1], ["start_ns", "stream"]] = [first_end - 500, 99]
    gaps = nsys.idle_gaps(call)
    assert gaps["gap_ns"].iloc[0] == 0 and (gaps["gap_ns"] >= 0).all()


# ========================================================================= the package's shape
def test_python_m_parse_prints_the_summary_of_the_real_export():
    """`python -m faprof.nsight.nsys parse` (nsys/__main__.py) reads the H100 recording as collect does."""
    import subprocess

    r = subprocess.run([sys.executable, "-m", "faprof.nsight.nsys", "parse", str(SMOKE_DB), "--plan", str(SMOKE_PLAN)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    want = nsys.summarize(nsys.read_kernels(SMOKE_DB, _plan()), None, _plan())
    for v, s in zip(want["variant"], want["shape_id"], strict=True):
        assert v in r.stdout and s in r.stdout
    assert "kernels_per_call" in r.stdout and "harness_over_gpu" in r.stdout


def test_the_facade_is_the_parts():
    """`nsys.X` is the part's own object (a monkeypatch of a part is seen through the facade's callers)."""
    from faprof.nsight.nsys import command, tables

    assert nsys.collect is nsys_stage.collect and callable(nsys.collect)
    assert nsys.find_nsys is nsys_find.find_nsys and nsys.run_capture is nsys_capture.run_capture
    assert nsys.load_sqlite is nsys_read.load_sqlite and nsys.summarize is tables.summarize
    assert nsys.nsys_command is command.nsys_command
    assert set(nsys.__all__) <= set(dir(nsys))


def test_per_call_counts_overlapping_kernels_once(smoke_kernels):
    """A kernel started before the previous one ends (programmatic dependent launch) is not counted
    twice: the call's gpu_ns is the union of its kernels' intervals."""
    calls = nsys.per_call(smoke_kernels)
    key = ["variant", "shape_id", "iteration"]
    multi = smoke_kernels.groupby(key).filter(lambda g: len(g) >= 2)
    one = multi.set_index(key).index[0]
    k = smoke_kernels.set_index(key).loc[one].sort_values("start_ns").reset_index()
    shifted = smoke_kernels.copy()
    sel = (shifted[key].apply(tuple, axis=1) == one) & (shifted["start_ns"] == k.loc[1, "start_ns"])
    # the second kernel now starts half-way through the first, its end unchanged
    shifted.loc[sel, "start_ns"] = k.loc[0, "start_ns"] + k.loc[0, "duration_ns"] // 2
    shifted.loc[sel, "duration_ns"] = shifted.loc[sel, "end_ns"] - shifted.loc[sel, "start_ns"]
    got = nsys.per_call(shifted).set_index(key).loc[one, "gpu_ns"]
    before = calls.set_index(key).loc[one, "gpu_ns"]
    summed = int(shifted[sel | (shifted[key].apply(tuple, axis=1) == one)]["duration_ns"].sum())
    assert got < summed  # the overlap is not counted twice
    # originally back to back: the second kernel's own duration is replaced by what it adds past the first's end
    e0, e1 = k.loc[0, "end_ns"], k.loc[1, "end_ns"]
    assert got == before - k.loc[1, "duration_ns"] + max(0, e1 - e0)
