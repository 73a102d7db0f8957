"""The nsys command lines faprof runs: one capture (`nsys profile ... python -m faprof.nsight.target`) and its export.

Each is built as a list in one function so that the tests can check the exact argv.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

#: Profile options, in argv order, each chosen on purpose:
#: - `-t cuda,nvtx -s none --cpuctxsw=none`: CUDA API + kernels and our NVTX ranges only; no CPU
#:   sampling or context switches (they cost overhead and report size and answer nothing here);
#: - `--capture-range=cudaProfilerApi`: record only between the target's cudaProfilerStart/Stop, so
#:   imports, input set-up and the first pair's warm-up stay out of the report;
#: - `--capture-range-end=stop`: stop recording at cudaProfilerStop and let the target finish on its
#:   own (it writes its plan file and exits). The default `stop-shutdown` kills the target at the
#:   stop instead, racing that write; a killed CUDA process was the suspect of the first try on the
#:   H100, where nsys wrote its report and then did not exit within 200 s;
#: - `--wait=primary`: wait for the target only, not for any process it re-parented, which would
#:   hold nsys open after the target is gone;
#: - `--cuda-graph-trace=node`: a variant that replays a CUDA graph shows its kernels one by one
#:   (the default shows the graph as one block, with no grid, registers or shared memory).
PROFILE_OPTIONS: tuple[str, ...] = (
    "-t", "cuda,nvtx",
    "-s", "none",
    "--cpuctxsw=none",
    "--capture-range=cudaProfilerApi",
    "--capture-range-end=stop",
    "--wait=primary",
    "--cuda-graph-trace=node",
)

#: Calls recorded per (variant, problem): enough for a median that one slow call does not move,
#: few enough that a scenario's report stays small (each call is a few NVTX and API records).
DEFAULT_ITERS = 10


def nsys_command(nsys: str | Path, report_base: str | Path, scenario: str | Path, variants: Sequence[str],
                 iters: int, plan_out: str | Path, shapes: Sequence[str] | None = None,
                 user_variants: Sequence[str] = (), python: str | None = None) -> list[str]:
    """The argv of one capture: `nsys profile <PROFILE_OPTIONS> -o BASE -f true python -m faprof.nsight.target ...`.

    Args:
        nsys: the nsys binary.
        report_base: report path without extension (nsys adds `.nsys-rep`).
        scenario: scenario name or .toml path, as the target's `--scenario`.
        variants: variant names to run (the target's `--variants`, comma-joined).
        iters: calls recorded per (variant, problem), each in its own `iter<i>` range.
        plan_out: where the target writes its plan (JSON: which pairs ran, and why not).
        shapes: only these shape_ids (default: every problem of the scenario).
        user_variants: files or modules registering user variants (`--user-variants`, repeated).
        python: interpreter for the target (default: this one).

    Returns:
        The argv list (no shell).
    """
    argv = [str(nsys), "profile", *PROFILE_OPTIONS, "-o", str(report_base), "-f", "true",
            python or sys.executable, "-m", "faprof.nsight.target",
            "--scenario", str(scenario), "--tool", "nsys", "--iters", str(int(iters)),
            "--variants", ",".join(variants), "--plan-out", str(plan_out)]
    if shapes:
        argv += ["--shapes", ",".join(shapes)]
    for spec in user_variants:
        argv += ["--user-variants", str(spec)]
    return argv


def export_command(nsys: str | Path, report: str | Path, sqlite_out: str | Path) -> list[str]:
    """The argv of `nsys export --type sqlite -o OUT REPORT`."""
    return [str(nsys), "export", "--type", "sqlite", "-o", str(sqlite_out), str(report)]


def report_path(report_base: str | Path) -> Path:
    """The report nsys writes for `-o report_base` (it adds `.nsys-rep`)."""
    return Path(f"{report_base}.nsys-rep")
