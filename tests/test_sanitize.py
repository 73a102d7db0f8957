"""`faprof sanitize`: the compute-sanitizer text parser and the missing-tool message on the CPU; the
real tool on the GPU (a recorded report of faprof's faulting test kernel must parse into the same
total as the tool's own ERROR SUMMARY).

The CPU parser tests use short strings BUILT HERE from the line format that NVIDIA's Compute
Sanitizer documentation describes (the ===== prefix, a report's first line, indented `at ... in
FILE:LINE` continuation lines, the summary lines). They are not recorded tool output: no GPU or
compute-sanitizer exists on the CPU machine. Real output is checked by the GPU tests below and by
scripts/gpu/gpu_kernel_check.sh, which keeps the tool's raw text in each bundle.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from testonly import TESTONLY_VARIANTS, load_testonly

from faprof.cli import main
from faprof.errors import FaprofError
from faprof.run import sanitize
from faprof.variants import build

P = "========= "  # the documented prefix of every compute-sanitizer line


def _doc_format(*lines: str) -> str:
    """Lines in compute-sanitizer's documented text layout (constructed, not recorded)."""
    return "\n".join(P + ln if ln else "=========" for ln in lines) + "\n"


def test_memcheck_report_new_location_format():
    text = _doc_format(
        "COMPUTE-SANITIZER",
        "Invalid __global__ write of size 4 bytes",
        "    at my_kernel(float *)+0x70 in /src/my_attn.cu:42",
        "    by thread (3,0,0) in block (0,0,0)",
        "    Address 0x7f0000000010 is out of bounds",
        "",
        "Invalid __global__ write of size 4 bytes",
        "    at my_kernel(float *)+0x70 in /src/my_attn.cu:42",
        "    by thread (4,0,0) in block (0,0,0)",
        "",
        "ERROR SUMMARY: 2 errors",
    )
    df = sanitize.parse_output("app output line\n" + text, "memcheck")
    assert len(df) == 1
    r = df.iloc[0]
    assert (r.tool, r.severity, r.kind, r.kernel, r.source, r["count"]) == (
        "memcheck", "error", "Invalid __global__ write", "my_kernel(float *)", "/src/my_attn.cu:42", 2)
    assert sanitize.error_summary(text) == 2


def test_racecheck_old_location_format_and_hazard_counts():
    text = _doc_format(
        "COMPUTE-SANITIZER",
        "Error: Race reported between Write access at 0x1a0 in /src/k.cu:17:tile_kernel(float*)",
        "    and Read access at 0x2b0 in /src/k.cu:21:tile_kernel(float*) [96 hazards]",
        "",
        "Warning: Race reported between Read access at 0x2b0 in /src/k.cu:21:tile_kernel(float*)",
        "    and Write access at 0x1a0 in /src/k.cu:17:tile_kernel(float*) [4 hazards]",
        "",
        "RACECHECK SUMMARY: 2 hazards displayed (1 error, 1 warning)",
        "ERROR SUMMARY: 1 error",
    )
    df = sanitize.parse_output(text, "racecheck").set_index("severity")
    assert df.loc["error", "kind"] == "race write-read" and df.loc["error", "count"] == 96
    assert df.loc["warning", "kind"] == "race read-write" and df.loc["warning", "count"] == 4
    assert set(df["source"]) == {"/src/k.cu:17", "/src/k.cu:21"}
    assert set(df["kernel"]) == {"tile_kernel(float*)"}
    assert sanitize.error_summary(text) == 1


def test_api_error_initcheck_synccheck_and_no_file():
    text = _doc_format(
        'Program hit cudaErrorLaunchFailure (error 719) due to "unspecified launch failure" on CUDA API call '
        "to cudaStreamSynchronize.",
        "    Saved host backtrace up to driver entry point at error",
        "",
        "Uninitialized __global__ memory read of size 4 bytes",
        "    at reader+0x40 in reader.cu:9",
        "",
        "Barrier error detected. Divergent thread(s) in warp",
        "    at sync_kernel+0x90",
        "",
        "ERROR SUMMARY: 3 errors",
    )
    df = sanitize.parse_output(text, "memcheck")
    assert list(df["kind"]) == ["api error cudaErrorLaunchFailure", "Uninitialized __global__ memory read",
                                "Barrier error detected. Divergent thread(s) in warp"]
    assert list(df["kernel"]) == ["", "reader", "sync_kernel"]
    assert list(df["source"]) == ["", "reader.cu:9", ""]


def test_clean_run_and_unfinished_run():
    clean = _doc_format("COMPUTE-SANITIZER", "ERROR SUMMARY: 0 errors")
    df = sanitize.parse_output(clean, "synccheck")
    assert df.empty and list(df.columns) == list(sanitize.COLUMNS)
    assert sanitize.error_summary(clean) == 0
    assert sanitize.error_summary(_doc_format("COMPUTE-SANITIZER")) is None  # killed before the summary


def test_parse_tools():
    assert sanitize.parse_tools(None) == list(sanitize.TOOLS)
    assert sanitize.parse_tools("racecheck, memcheck,racecheck") == ["racecheck", "memcheck"]
    with pytest.raises(FaprofError, match="choose from"):
        sanitize.parse_tools("memchek")


def test_sanitizer_command():
    cmd = sanitize.sanitizer_command("/cuda/bin/compute-sanitizer", "racecheck", ["python3", "-m", "x"])
    assert cmd == ["/cuda/bin/compute-sanitizer", "--tool", "racecheck", "--print-limit",
                   str(sanitize.PRINT_LIMIT), "python3", "-m", "x"]


@pytest.fixture
def no_sanitizer(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setattr(build, "find_cuda_home", lambda: None)
    monkeypatch.setattr(sanitize, "DEFAULT_CUDA_ROOTS", (tmp_path / "no-cuda",))


def test_missing_compute_sanitizer_is_one_clear_line(no_sanitizer, tmp_path):
    with pytest.raises(FaprofError, match="compute-sanitizer was not found"):
        sanitize.find_compute_sanitizer()
    r = CliRunner().invoke(main, ["sanitize", "fa2", "--out", str(tmp_path / "runs")])
    assert r.exit_code == 2 and "compute-sanitizer was not found" in r.output
    assert not (tmp_path / "runs").exists()


def test_found_on_cuda_home(tmp_path, monkeypatch):
    tool = tmp_path / "bin" / "compute-sanitizer"
    tool.parent.mkdir()
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    assert sanitize.find_compute_sanitizer() == str(tool)


# --------------------------------------------------------------------------- GPU: the real tool
@pytest.mark.gpu
def test_memcheck_finds_the_planted_fault(tmp_path):
    """faprof's test-only kernel writes to an unmapped address: memcheck must report it, with the
    source line from -lineinfo, and the parsed rows must add up to the tool's own ERROR SUMMARY."""
    # The test-only kernel is its own extension (tests/kernels/): built here, outside the sanitizer,
    # so the target under memcheck only loads it from the cache.
    load_testonly().load_extension()
    r = CliRunner().invoke(main, ["sanitize", "_fault_oob", "--scenario", "smoke", "--tool", "memcheck",
                                  "--user-variants", str(TESTONLY_VARIANTS), "--out", str(tmp_path)])
    assert r.exit_code == 3, r.output
    from faprof.store import find_bundles

    (bundle,) = find_bundles(tmp_path)
    df = bundle.read("sanitizer")
    text = (bundle.path / "raw" / "sanitizer_memcheck.txt").read_text()
    hits = df[df["kernel"].str.contains("fault_oob_kernel")]
    assert not hits.empty, text[-3000:]
    assert hits["source"].str.contains(r"fault\.cu:\d+").all()
    assert int(df["count"].sum()) == sanitize.error_summary(text)


def test_recorded_h100_outputs_parse():
    """compute-sanitizer's own output, recorded on the H100 (faprof sanitize naive,fa1,fa2 on smoke's
    smallest shape): racecheck closes with a RACECHECK SUMMARY, not an ERROR SUMMARY."""
    data = Path(__file__).parent / "data" / "sanitizer"
    race = (data / "h100_racecheck_naive_fa1_fa2.txt").read_text()
    mem = (data / "h100_memcheck_naive_fa1_fa2.txt").read_text()
    assert sanitize.error_summary(race) == 0 and sanitize.parse_output(race, "racecheck").empty
    assert sanitize.error_summary(mem) == 0 and sanitize.parse_output(mem, "memcheck").empty


def test_report_of_a_recorded_sanitize_bundle(tmp_path):
    from faprof.report.writer import write_reports
    from faprof.store import Bundle

    root = Path(__file__).resolve().parent.parent / "examples" / "runs"
    b = Bundle.open(next(root.glob("*sanitize-3-variants-smoke")))
    # racecheck's total comes from its recorded raw output (RACECHECK SUMMARY), not the manifest's null
    t = sanitize.tool_totals(b).set_index("tool")
    assert t.loc["racecheck", "status"] == "clean" and t.loc["memcheck", "hazards"] == 0
    written = write_reports(b, tmp_path / "rep")
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "# compute-sanitizer: naive, fa1, fa2" in md and "| racecheck |" in md.replace("  ", " ").replace("  ", " ")
    assert any(p.name == "report.html" for p in written)
