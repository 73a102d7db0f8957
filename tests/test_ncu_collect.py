"""Nsight Compute sessions without a GPU: `collect()` and `faprof ncu RUN` against a fake ncu.

Method: a script stands in for ncu (it records its argv, prints ncu's progress lines with pass
counts, and copies a report recorded on an H100 into place), so every path a user hits runs end to
end here: no ncu, no GPU, no counter permission, no report, a kernel regex that matched nothing,
bad selectors, Ctrl-C, and a successful session whose tables, manifest keys (ncu.wall_s,
ncu.kernels, ncu.passes, the options and the plan) and cost cache are then checked; the re-run
of ncu alone on a bundle keeps its timing rows. The child reader is checked with a stand-in
ncu_report whose native code dies on one metric.
"""

from __future__ import annotations

import json
import os
import stat
import textwrap
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner
from fakes import PY_HEADER

from faprof import run as runner
from faprof.cli import main as cli_main
from faprof.errors import FaprofError
from faprof.model.options import NcuSelection
from faprof.model.scenarios import load_scenario
from faprof.nsight import ncu
from faprof.nsight.ncu import find as ncu_find
from faprof.nsight.ncu import run as ncu_run
from faprof.nsight.ncu import session_plan as ncu_plan
from faprof.nsight.ncu.catalogue import requested_metrics
from faprof.store import Bundle

DATA = Path(__file__).parent / "data" / "ncu"
GPU = "NVIDIA H100 80GB HBM3"


def _fake_exe(path: Path, body: str = "echo fake") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


@pytest.fixture
def no_installs(monkeypatch):
    monkeypatch.setattr(ncu_find, "CUDA_NCU_GLOBS", ())
    monkeypatch.setattr(ncu_find, "NSIGHT_NCU_GLOBS", ())


def _reader():
    try:
        mod, _ = ncu.load_report_module()
    except FaprofError as e:
        pytest.skip(f"ncu_report cannot load here: {e}")
    return mod


@pytest.fixture(scope="session")
def fa_basic_report(tmp_path_factory) -> Path:
    import gzip

    gz = DATA / "fa_basic.ncu-rep.gz"
    out = tmp_path_factory.mktemp("ncu_collect") / "fa_basic.ncu-rep"
    out.write_bytes(gzip.decompress(gz.read_bytes()))
    return out


FAKE_READER = textwrap.dedent("""\
    # A stand-in for Nsight Compute's extras/python/ncu_report.py whose native code dies on one metric.
    import os, signal

    class _M:
        def __init__(self, name, v): self.n, self.v = name, v
        def has_value(self): return True
        def value(self):
            if self.n == "dram__bytes_read.sum":
                os.kill(os.getpid(), signal.SIGSEGV)
            return self.v
        def unit(self): raise AssertionError("unit() must not be called on this reader copy")

    class _R:
        def __init__(self, n): self.n = n
        def name(self): return self.n

    class _D:
        def push_pop_ranges(self): return ("a", "b", "c")
        def push_pop_range(self, i): return _R(["fa2", "s1", "iter0"][i])

    class _S:
        def domains(self): return (0,)
        def domain_by_id(self, i): return _D()

    class IAction:
        NameBase_FUNCTION, NameBase_DEMANGLED = 0, 1
        def name(self, base=0): return "fa2_fwd_kernel"
        def nvtx_state(self): return _S()
        def metric_names(self):
            return ("dram__bytes_read.sum", "gpu__time_duration.sum", "launch__grid_size", "not__in_the_catalogue.sum")
        def metric_by_name(self, n): return _M(n, {"gpu__time_duration.sum": 1000.0}.get(n, 8.0))

    class _Range:
        def num_actions(self): return 1
        def action_by_idx(self, i): return IAction()

    class _Ctx:
        def num_ranges(self): return 1
        def range_by_idx(self, i): return _Range()

    def load_report(path): return _Ctx()

    if os.environ.get("FAKE_RULES") == "crash":  # a reader whose native rule code dies
        IAction.rule_results = lambda self: os.kill(os.getpid(), signal.SIGSEGV)
""")


def _fake_reader_env(tmp_path, monkeypatch):
    (tmp_path / "mod").mkdir()
    (tmp_path / "mod" / "ncu_report.py").write_text(FAKE_READER)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "mod"))
    monkeypatch.setenv("NCU", "")
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    report = tmp_path / "r.ncu-rep"
    report.write_bytes(b"fake")
    return report


def test_reader_crash_on_a_metric_is_survived(tmp_path, monkeypatch):
    report = _fake_reader_env(tmp_path, monkeypatch)
    df, info = ncu.read_report_isolated(report, tmp_path / "out.parquet")
    assert info["skipped_metrics"] == ["dram__bytes_read.sum"]
    assert "mod" in info["reader"]
    # only the catalogue's metrics are read: the fourth name is left in the report
    assert sorted(df["metric"]) == ["gpu__time_duration.sum", "launch__grid_size"]
    assert set(df["variant"]) == {"fa2"} and set(df["unit"]) == {""}  # no ncu to ask for units
    assert not info["rules_read"] and "rule_results" in info["rules_note"] and info["rules"].empty


def test_reader_crash_in_rule_results_reads_without_rules(tmp_path, monkeypatch):
    report = _fake_reader_env(tmp_path, monkeypatch)
    monkeypatch.setenv("FAKE_RULES", "crash")
    df, info = ncu.read_report_isolated(report, tmp_path / "out.parquet")
    assert not info["rules_read"] and "crashed reading rule results" in info["rules_note"]
    assert sorted(df["metric"]) == ["gpu__time_duration.sum", "launch__grid_size"]


def test_reader_failure_is_a_faprof_error(tmp_path):
    bad = tmp_path / "bad.ncu-rep"
    bad.write_bytes(b"not a report")
    with pytest.raises(FaprofError):
        ncu.read_report_isolated(bad, tmp_path / "out.parquet")


# ------------------------------------------------------------------------ collect() with fakes


FAKE_NCU = textwrap.dedent("""\
    {header}import json, os, shutil, sys
    args = sys.argv[1:]
    if args[:1] == ["--version"]:
        print("NVIDIA (R) Nsight Compute Command Line Profiler")
        print("Version 2025.3.1.0 (build 1) (public-release)")
        sys.exit(0)
    if args[:1] == ["--query-metrics"]:
        print("==ERROR== no device")
        sys.exit(1)
    with open(os.environ["FAKE_NCU_ARGS"], "w") as f:
        json.dump(args, f)
    mode = os.environ.get("FAKE_NCU_MODE", "ok")
    print("==PROF== Connected to process 1 (python)")
    if mode == "nomatch":  # a kernel regex that matched nothing: ncu profiles nothing and writes no report
        print("==WARNING== No kernels were profiled.")
        sys.exit(0)
    if mode == "perm":
        print("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU "
              "Performance Counters on the target device 0.")
        sys.exit(1)
    if mode == "noreport":
        print("==ERROR== The application returned an error code (1).")
        sys.exit(1)
    out = args[args.index("-o") + 1]
    plan = args[args.index("--plan-out") + 1]
    shutil.copy(os.environ["FAKE_NCU_REPORT"], out + ".ncu-rep")
    shutil.copy(os.environ["FAKE_NCU_PLAN"], plan)
    import time
    for i, k in enumerate(["naive_scores_kernel", "fa2_fwd_kernel", "fa2_fwd_kernel"]):
        time.sleep(0.05)
        print(f'==PROF== Profiling "{{k}}" - {{i}}: 0%....50%....100% - {{9 + i}} passes', flush=True)
    print("==PROF== Disconnected from process 1")
""")


@pytest.fixture
def fake_env(tmp_path, monkeypatch, fa_basic_report):
    exe = _fake_exe(tmp_path / "bin" / "ncu")
    exe.write_text(FAKE_NCU.format(header=PY_HEADER))
    monkeypatch.setenv("NCU", str(exe))
    monkeypatch.setenv("FAKE_NCU_ARGS", str(tmp_path / "args.json"))
    monkeypatch.setenv("FAKE_NCU_REPORT", str(fa_basic_report))
    monkeypatch.setenv("FAPROF_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("FAKE_NCU_PLAN", str(DATA / "fa_basic_plan.json"))
    ncu._VERSION_CACHE.clear()
    ncu._QUERY_CACHE.clear()
    scenario = load_scenario("smoke")
    bundle = Bundle.create(
        tmp_path / "runs",
        "smoke",
        GPU,
        {
            "scenario": {"name": "smoke", "raw": scenario.raw},
            "env": {"gpu_name": GPU, "cc": "9.0"},
            "settings": {"variants": ["cpu_ref", "naive", "fa2"], "ncu": "basic", "user_variants": []},
        },
    )
    bundle.append_measurement({"variant": "fa2", "shape_id": "s", "status": "ok", "median_ms": 1.0})
    events: list[tuple[str, dict]] = []
    opts = runner.ProfileOptions(variants=["cpu_ref", "naive", "fa2"], out_dir=tmp_path / "runs")
    return {
        "bundle": bundle,
        "scenario": scenario,
        "opts": opts,
        "events": events,
        "args": tmp_path / "args.json",
        "progress": lambda e, i: events.append((e, i)),
    }


def _collect(env, cuda_ok=True, ncu_set="basic"):
    ncu.collect(env["bundle"], env["scenario"], env["opts"], ncu_set, env["progress"], cuda_ok)
    return env["bundle"].manifest()


def test_collect_without_ncu_warns_and_goes_on(fake_env, monkeypatch, no_installs):
    monkeypatch.setenv("NCU", "")
    monkeypatch.setenv("PATH", "")
    m = _collect(fake_env)
    assert m["ncu"]["status"] == "skipped" and "not found" in m["ncu"]["reason"]
    assert any(e == "warning" and "ncu" in i["message"] for e, i in fake_env["events"])
    assert any("not found" in line for line in m["log"])
    assert not fake_env["bundle"].has("ncu_summary")


def test_collect_without_gpu_warns_and_goes_on(fake_env):
    m = _collect(fake_env, cuda_ok=False)
    assert m["ncu"]["status"] == "skipped" and "GPU" in m["ncu"]["reason"]
    assert not fake_env["args"].exists()  # ncu never ran


def test_collect_without_counter_permission_explains_the_fix(fake_env, monkeypatch):
    monkeypatch.setenv("FAKE_NCU_MODE", "perm")
    m = _collect(fake_env)
    assert m["ncu"]["status"] == "no_permission"
    for words in ("ERR_NVGPUCTRPERM", "NVreg_RestrictProfilingToAdminUsers=0", "root"):
        assert words in m["ncu"]["reason"]
    assert any(
        e == "warning" and "NVreg_RestrictProfilingToAdminUsers" in i["message"]
        for e, i in fake_env["events"]
    )


def test_collect_without_report_says_why(fake_env, monkeypatch):
    monkeypatch.setenv("FAKE_NCU_MODE", "noreport")
    m = _collect(fake_env)
    assert m["ncu"]["status"] == "failed" and "returned an error code" in m["ncu"]["reason"]
    assert (fake_env["bundle"].path / "raw" / ncu.LOG_FILE).read_text().count("==ERROR==") == 1


def test_collect_runs_ncu_and_writes_the_tables(fake_env):
    _reader()
    m = _collect(fake_env)
    rec = m["ncu"]
    assert rec["status"] == "ok", rec
    args = json.loads(fake_env["args"].read_text())
    raw = fake_env["bundle"].path / "raw"
    # cpu_ref runs on the host: no NVTX range of it is profiled
    assert args[:10] == ["--nvtx", "--nvtx-include", "naive/", "--nvtx-include", "naive",
                        "--nvtx-include", "fa2/", "--nvtx-include", "fa2", "--set"]
    assert (
        args[args.index("--cache-control") + 1] == "all" and args[args.index("--clock-control") + 1] == "none"
    )
    assert "--import-source" not in args  # only the full set imports sources
    assert "--kernel-name" not in args  # no regex: every kernel in the ranges
    # the target runs only shapes a profiled variant supports (naive and fa2 take no fp16)
    assert args[args.index("--shapes") + 1].split(",") == rec["plan"]["shapes"]
    assert "b1_h2_sq128_sk128_d64_fp16_causal_fwd" not in rec["plan"]["shapes"]
    assert args[args.index("--scenario") + 1] == str(raw / ncu.SCENARIO_FILE)
    assert args[args.index("--variants") + 1] == "naive,fa2"
    assert args[args.index("--iters") + 1] == "1"
    assert rec["command"][1:] == args
    # the manifest keys of the issue: the stage's wall time, kernels profiled, passes per kernel
    assert rec["kernels"] == 3 and rec["passes"] == 10 and (rec["passes_min"], rec["passes_max"]) == (9, 11)
    assert rec["wall_s"] >= rec["profile_s"] > 0.1  # three kernels 50 ms apart, then the reading
    assert rec["options"] == {
        "set": "basic",
        "variants": None,
        "shapes": [],
        "kernel_regex": None,
        "launches": 1,
        "cache_control": "all",
        "clock_control": "none",
        "user_metrics": [],
        "extra_metrics": True,
    }
    assert rec["rerun"] == f"faprof ncu {fake_env['bundle'].path} --set basic"
    plan = rec["plan"]
    assert plan["variants"] == ["naive", "fa2"] and plan["left_out"] == {"cpu_ref": "runs on the CPU"}
    assert plan["kernels"] == len(plan["pairs"]) and "default guess" in plan["eta_source"]
    # no --query-metrics answer (no GPU here): every catalogue metric for sm_90 is asked for
    assert args[args.index("--metrics") + 1].split(",") == requested_metrics("9.0") == rec["metrics"]
    assert rec["reader_skipped_metrics"] == [] and "ncu_report" in rec["reader"] and rec["rules_read"]
    messages = [i["message"] for e, i in fake_env["events"] if e == "nsight"]
    assert messages[0].startswith("ncu plan: 2 variant(s) x ")
    assert messages[-1].startswith(f"ncu: profiled kernel 3/{plan['kernels']}: fa2_fwd_kernel (11 passes), ")
    b = fake_env["bundle"]
    for table in ncu_run.TABLES:
        assert rec["tables"][table] == len(b.read(table))
    assert not b.read("ncu_summary").empty and not b.read("roofline").empty
    rules = b.read("ncu_rules")
    assert list(rules.columns) == list(ncu.RULES_COLUMNS) and len(rules) > 0
    assert set(rules["variant"]) <= set(b.read("ncu_summary")["variant"])
    assert load_scenario(raw / ncu.SCENARIO_FILE).raw == fake_env["scenario"].raw
    assert len(b.measurements()) == 1  # the timing rows are not touched


def test_faprof_set_selectors_reach_ncu_and_the_target(fake_env):
    _reader()
    fake_env["opts"].ncu_select.variants = ["fa2"]
    fake_env["opts"].ncu_select.shapes = ["smallest"]
    fake_env["opts"].ncu_select.kernel = "fa2_.*"
    fake_env["opts"].ncu_select.launches = 2
    m = _collect(fake_env, ncu_set="faprof")
    rec = m["ncu"]
    assert rec["status"] == "ok", rec
    args = json.loads(fake_env["args"].read_text())
    assert args[:5] == ["--nvtx", "--nvtx-include", "fa2/", "--nvtx-include", "fa2"] and "naive/" not in args
    sections = [args[i + 1] for i, a in enumerate(args) if a == "--section"]
    assert sections == list(ncu.FAPROF_SECTIONS) and "--set" not in args
    assert args[args.index("--kernel-name") + 1] == "regex:fa2_.*"
    assert args[args.index("--kernel-name-base") + 1] == "function"
    assert args[args.index("--iters") + 1] == "2"
    # smallest per group: the smallest fp32 forward and the only backward shape; fa2 has no fp16
    shapes = args[args.index("--shapes") + 1].split(",")
    assert shapes == rec["plan"]["shapes"] and "b2_h1_sq17_sk113_d32_fp32_causal_fwd" in shapes
    assert rec["options"]["variants"] == ["fa2"] and rec["options"]["kernel_regex"] == "fa2_.*"
    assert rec["rerun"].endswith(
        "--set faprof --variants fa2 --shapes smallest --kernel 'fa2_.*' --launches 2"
    )


@pytest.mark.parametrize(
    "attr, value, words",
    [
        ("variants", ["fa9"], "unknown variant 'fa9'"),
        ("variants", ["sdpa_flash"], "not part of this run"),
        ("variants", ["cpu_ref"], "run(s) on the CPU"),
        ("shapes", ["b9_h9"], "unknown shape 'b9_h9'"),
        ("kernel", "fa2_(", "not a valid regular expression"),
        ("launches", 0, "--ncu-launches"),
    ],
)
def test_bad_selectors_skip_ncu_with_one_line(fake_env, attr, value, words):
    setattr(fake_env["opts"].ncu_select, attr, value)
    m = _collect(fake_env)
    assert m["ncu"]["status"] == "bad_input" and words in m["ncu"]["reason"], m["ncu"]["reason"]
    assert "\n" not in m["ncu"]["reason"]
    assert not fake_env["args"].exists()  # ncu never ran
    assert len(fake_env["bundle"].measurements()) == 1


def test_regex_matching_nothing_after_the_run(fake_env, monkeypatch):
    monkeypatch.setenv("FAKE_NCU_MODE", "nomatch")
    fake_env["opts"].ncu_select.kernel = "no_such_kernel"
    m = _collect(fake_env)
    assert m["ncu"]["status"] == "no_match"
    assert "'no_such_kernel' matched no kernel of naive, fa2" in m["ncu"]["reason"]


def test_regex_checked_against_kernels_seen_before(fake_env):
    _reader()
    assert _collect(fake_env)["ncu"]["status"] == "ok"  # learns the kernels of each pair
    fake_env["args"].unlink()
    fake_env["opts"].ncu_select.kernel = "flash_fwd"
    m = _collect(fake_env)
    assert m["ncu"]["status"] == "bad_input" and "matches none of the" in m["ncu"]["reason"]
    assert "fa2_fwd_kernel" in m["ncu"]["reason"] and not fake_env["args"].exists()


def test_second_plan_uses_what_the_first_session_measured(fake_env):
    _reader()
    first = _collect(fake_env)["ncu"]
    costs = ncu_plan.load_costs()
    entry = costs["gpus"][GPU]["sets"]["basic"]
    assert entry["kernels"] == 3 and entry["passes"] == 10
    assert 0.04 < entry["seconds_per_kernel"] < 5  # 50 ms apart in the fake
    pairs = costs["gpus"][GPU]["pairs"]
    assert pairs["naive|b1_h2_sq64_sk64_d32_fp32_full_fwd"]["kernels_per_call"] == 3  # the recorded report
    second = _collect(fake_env)["ncu"]["plan"]
    assert (
        "measured on this GPU" in second["eta_source"] and second["passes_source"] == "measured on this GPU"
    )
    assert second["kernels_known"] > 0 and second["kernels"] > first["plan"]["kernels"]
    assert second["eta_s"] == pytest.approx(
        second["overhead_s"] + second["kernels"] * second["seconds_per_kernel"], abs=0.2
    )


def test_ctrl_c_during_ncu_keeps_rows_and_says_how_to_rerun(fake_env, monkeypatch):
    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(ncu_run, "run_ncu", interrupted)
    with pytest.raises(KeyboardInterrupt):
        _collect(fake_env)
    rec = fake_env["bundle"].manifest()["ncu"]
    assert (
        rec["status"] == "interrupted"
        and f"faprof ncu {fake_env['bundle'].path} --set basic" in rec["reason"]
    )
    assert len(fake_env["bundle"].measurements()) == 1


# ------------------------------------------------------------------------ faprof ncu RUN


@pytest.fixture
def on_gpu(monkeypatch):
    monkeypatch.setattr(ncu_run, "this_gpu", lambda: (True, GPU))


def test_rerun_replaces_the_tables_and_keeps_the_rows(fake_env, on_gpu):
    _reader()
    b = fake_env["bundle"]
    assert _collect(fake_env)["ncu"]["status"] == "ok"
    rec = ncu_run.rerun(b, "faprof", runner.ProfileOptions(ncu_select=NcuSelection(variants=["fa2"])), fake_env["progress"])
    m = b.manifest()
    assert rec["status"] == "ok" and m["ncu"]["set"] == "faprof" and m["ncu_previous"][0]["set"] == "basic"
    assert m["ncu"]["plan"]["variants"] == ["fa2"] and len(b.measurements()) == 1


def test_failed_rerun_keeps_the_earlier_session(fake_env, on_gpu, monkeypatch):
    _reader()
    b = fake_env["bundle"]
    assert _collect(fake_env)["ncu"]["status"] == "ok"
    before = b.read("ncu_summary")
    monkeypatch.setenv("FAKE_NCU_MODE", "perm")
    rec = ncu_run.rerun(b, "full", runner.ProfileOptions(), fake_env["progress"])
    m = b.manifest()
    assert rec["status"] == "no_permission" and m["ncu"]["status"] == "ok" and m["ncu"]["set"] == "basic"
    assert m["ncu_failed"][0]["status"] == "no_permission"
    pd.testing.assert_frame_equal(b.read("ncu_summary"), before)


def test_rerun_refuses_another_gpu_and_bad_selectors_before_touching_the_bundle(fake_env, monkeypatch):
    b = fake_env["bundle"]
    before = b.manifest_path.read_text()
    monkeypatch.setattr(ncu_run, "this_gpu", lambda: (True, "NVIDIA L4"))
    with pytest.raises(FaprofError, match="measured on NVIDIA H100 80GB HBM3; this machine has NVIDIA L4"):
        ncu_run.rerun(b, "faprof", runner.ProfileOptions(), fake_env["progress"])
    monkeypatch.setattr(ncu_run, "this_gpu", lambda: (True, GPU))
    with pytest.raises(FaprofError, match="unknown shape 'nope'"):
        ncu_run.rerun(b, "faprof", runner.ProfileOptions(ncu_select=NcuSelection(shapes=["nope"])), fake_env["progress"])
    assert b.manifest_path.read_text() == before and not fake_env["args"].exists()


def test_cli_ncu_exit_codes(fake_env, on_gpu, monkeypatch, no_installs):
    _reader()
    path = str(fake_env["bundle"].path)
    r = CliRunner().invoke(cli_main, ["ncu", path, "--variants", "fa9"])
    assert r.exit_code == 2 and "unknown variant 'fa9'" in r.output
    r = CliRunner().invoke(cli_main, ["ncu", path, "--variants", "fa2", "--set", "basic"])
    assert r.exit_code == 0, r.output
    assert "ncu plan: 1 variant(s)" in r.output and "ncu: 3 kernel(s), 10 passes each" in r.output
    monkeypatch.setenv("NCU", "")
    monkeypatch.setenv("PATH", "")
    r = CliRunner().invoke(cli_main, ["ncu", path])
    assert r.exit_code == 3 and "ncu (skipped): Nsight Compute (ncu) not found" in r.output
    assert fake_env["bundle"].manifest()["ncu"]["status"] == "ok"  # the earlier session stays


def test_cli_profile_refuses_bad_selectors_before_running(tmp_path):
    r = CliRunner().invoke(
        cli_main, ["profile", "-s", "smoke", "--out", str(tmp_path), "--ncu", "--ncu-shapes", "x"]
    )
    assert r.exit_code == 2 and "unknown shape 'x'" in r.output and not any(tmp_path.iterdir())
    r = CliRunner().invoke(
        cli_main, ["profile", "-s", "smoke", "--out", str(tmp_path), "--ncu-variants", "fa2"]
    )
    assert r.exit_code == 2 and "add --ncu [SET]" in r.output


def test_doctor_checks_report_ncu_reader_and_counters(fake_env, monkeypatch):
    checks = {c.name: c for c in ncu.doctor_checks()}
    assert checks["ncu"].status == "ok" and "2025.3.1.0" in checks["ncu"].detail
    assert checks["ncu report reader"].status in ("ok", "warn")
    assert checks["ncu counters"].status in ("info", "ok", "warn", "fail")


def test_doctor_without_ncu(monkeypatch, no_installs):
    monkeypatch.setenv("NCU", "")
    monkeypatch.setenv("PATH", "")
    checks = {c.name: c for c in ncu.doctor_checks()}
    assert checks["ncu"].status == "warn" and "Nsight Compute" in checks["ncu"].hint
    assert checks["ncu counters"].status == "info"


def test_environment_settings_are_used_and_recorded(monkeypatch):
    monkeypatch.setenv("FAPROF_NCU_CLOCK_CONTROL", "base")
    s = ncu.NcuSettings.resolve(runner.ProfileOptions().ncu_select, load_scenario("smoke"), "full")
    assert s.clock_control == "base" and s.cache_control == "all" and s.ncu_set == "full"
    assert os.environ["FAPROF_NCU_CLOCK_CONTROL"] == "base"


def test_cli_profile_without_gpu_keeps_rows_and_exits_3(tmp_path, monkeypatch):
    monkeypatch.setenv("NCU", str(_fake_exe(tmp_path / "bin" / "ncu", 'echo "Version 2025.3.1.0"')))
    monkeypatch.setenv("FAPROF_CACHE", str(tmp_path / "cache"))
    tmp_path = tmp_path / "runs"
    r = CliRunner().invoke(
        cli_main,
        [
            "profile",
            "-s",
            "smoke",
            "--variants",
            "cpu_ref,fa2",
            "--out",
            str(tmp_path),
            "--ncu",
            "--budget",
            "0.05",
        ],
    )
    assert r.exit_code == 3, r.output
    assert "ncu (skipped): no CUDA GPU visible" in r.output
    (b,) = [Bundle.open(p) for p in tmp_path.iterdir()]
    m = b.manifest()
    assert m["status"] == "complete" and m["settings"]["ncu"] == "faprof" and m["ncu"]["status"] == "skipped"
    assert len(b.measurements()) == 8  # 4 shapes x 2 variants, every row kept
