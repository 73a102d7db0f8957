"""Nsight Systems: run the profiled target under nsys, export SQLite, join kernels to NVTX ranges -> tables.

The harness says how long a variant takes; nsys says where the time goes: how many kernels a call
launches, how long each runs, how long the host takes to get each one started and how long the GPU
sits idle between them. Pipeline (`collect`, what `faprof profile --nsys` calls):

1. `find_nsys` / `check_importer`: nsys and the QdstrmImporter it needs to turn a capture into a
   report (without its libraries nsys leaves a multi-GB `.qdstrm` and no report: checked first).
2. `nsys_command`: one argv, `nsys profile ... python -m faprof.nsight.target ...`; the target runs
   every (variant, problem) in NVTX ranges `<variant>` > `<shape_id>` > `iter<i>` between
   cudaProfilerStart/Stop. `run_capture` runs it with a timeout and a watchdog for an nsys that
   has written its report but does not exit.
3. `export_command`: `nsys export --type sqlite`; `load_sqlite` reads the tables whatever the nsys
   version calls their columns.
4. `attribute_kernels` -> `nsys_kernels.parquet`: every kernel joined to its launching API call
   (correlationId) and through the call's time and thread to the innermost `iter<i>` range and its
   parents `<shape_id>` and `<variant>`.
5. One function per analysis, each returning a DataFrame (HolisticTraceAnalysis' style):
   `per_call`, `kernels_per_call`, `launch_overhead`, `idle_gaps`, `harness_agreement`; `summarize`
   joins them into `nsys_summary.parquet`. Nothing here plots.

Times in `nsys_kernels` are nanoseconds on nsys' session clock (`*_ns`); the summary is in
microseconds (`*_us`) except the two figures compared with the harness (`harness_ms`, `nsys_gpu_ms`).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shlex
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from faprof import resources
from faprof.checks import Check
from faprof.errors import FaprofError
from faprof.model import plan as run_plan
from faprof.model.schema import TIMED

# ----------------------------------------------------------------------------- constants
#: Environment variable naming the nsys binary (or the folder holding it); it wins over PATH.
NSYS_ENV = "NSYS"

#: Where Nsight Systems lands when it is not on PATH, most specific first. A full Nsight Systems
#: install comes before the copy that ships inside Nsight Compute (`host/target-linux-x64/nsys`),
#: which is where the H100 test machine has it. Within a pattern the newest version wins.
NSYS_GLOBS: tuple[str, ...] = (
    "/opt/nvidia/nsight-systems/*/bin/nsys",
    "/opt/nvidia/nsight-systems/*/target-linux-x64/nsys",
    "/opt/nvidia/nsight-systems-cli/*/bin/nsys",
    "/opt/nvidia/nsight-systems-cli/*/target-linux-x64/nsys",
    "/usr/local/cuda*/bin/nsys",
    "/usr/local/cuda*/nsight-systems-*/bin/nsys",
    "/usr/local/cuda*/nsight-systems-*/target-linux-x64/nsys",
    "/usr/lib/nsight-systems/bin/nsys",
    "/usr/lib/x86_64-linux-gnu/nsight-systems/target-linux-x64/nsys",
    "/opt/nvidia/nsight-compute/*/host/target-linux-x64/nsys",
    "/usr/local/cuda*/nsight-compute-*/host/target-linux-x64/nsys",
)

IMPORTER = "QdstrmImporter"

#: Shared libraries the importer is known to miss on slim images, and the Debian/Ubuntu package
#: that ships each (the H100 image lacks libdw1 and libelf1).
LIBRARY_PACKAGES: dict[str, str] = {
    "libdw.so.1": "libdw1",
    "libelf.so.1": "libelf1",
    "libz.so.1": "zlib1g",
    "liblzma.so.5": "liblzma5",
    "libbz2.so.1.0": "libbz2-1.0",
    "libzstd.so.1": "libzstd1",
    "libstdc++.so.6": "libstdc++6",
    "libgcc_s.so.1": "libgcc-s1",
}

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

#: Limit for the whole `nsys profile` run. The target runs each pair ~13 times (3 warm-up + 10);
#: even l20_fwd_bwd's largest shapes take seconds, so past this something hangs.
PROFILE_TIMEOUT_S = 900.0

#: Limit for `nsys export --type sqlite` (seconds for the reports faprof makes).
EXPORT_TIMEOUT_S = 300.0

#: Once nsys has printed that it generated the report, give it this long to exit by itself before
#: stopping it: the report is complete by then, and nothing nsys does afterwards is needed.
EXIT_GRACE_S = 20.0

#: A report file that exists and has not grown for this long counts as finished even when nsys
#: never printed "Generated:" (older versions word it differently).
REPORT_SETTLE_S = 60.0

#: How often the watchdog looks at the capture.
POLL_S = 0.5

#: After SIGTERM to nsys' process group, wait this long before SIGKILL.
TERM_GRACE_S = 10.0

#: NVTX event types (ENUM_NSYS_EVENT_TYPE) of ranges: push/pop and start/end. Read from the
#: export's enum table when it has one; these are the values every version so far has used.
NVTX_RANGE_EVENT_TYPES: dict[str, int] = {"NvtxPushPopRange": 59, "NvtxStartEndRange": 60}

#: Name of the innermost per-call range the target pushes (`iter0`, `iter1`, ...).
ITER_RANGE = re.compile(r"^iter(\d+)$")

#: Columns of nsys_kernels.parquet, in order.
KERNEL_COLUMNS: tuple[str, ...] = (
    "variant", "shape_id", "iteration", "kernel_index", "kernel", "kernel_short",
    "start_ns", "end_ns", "duration_ns", "grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z",
    "registers_per_thread", "static_smem_bytes", "dynamic_smem_bytes", "smem_bytes",
    "stream", "device", "correlation_id", "api", "api_start_ns", "api_end_ns", "launch_latency_ns",
    "iter_start_ns", "iter_end_ns", "global_tid", "nvtx_match",
)

#: Columns of nsys_summary.parquet, in order.
SUMMARY_COLUMNS: tuple[str, ...] = (
    "variant", "shape_id", "status", "reason", "iterations",
    "kernels_per_call", "kernels_per_call_min", "kernels_per_call_max", "kernel_names",
    "gpu_us", "gpu_us_min", "wall_us", "host_us", "busy_frac",
    "launch_us", "launch_us_max", "first_launch_us", "idle_us", "gap_us",
    "harness_ms", "nsys_gpu_ms", "harness_over_gpu", "harness_over_wall",
)

Progress = Callable[[str, dict[str, Any]], None]


# ------------------------------------------------------------------------ finding nsys
def _version_key(path: str) -> tuple[int, ...]:
    """Sort key: the version numbers in a path (`.../2025.3.1/...` > `.../2024.4.2/...`)."""
    return tuple(int(n) for n in re.findall(r"\d+", path))


def _executable(p: Path) -> bool:
    return p.is_file() and os.access(p, os.X_OK)


def find_nsys(environ: dict[str, str] | None = None, globs: Sequence[str] | None = None) -> Path | None:
    """The nsys binary to use, or None.

    Looks, in order, at `$NSYS` (a binary, or a folder holding `nsys` or `bin/nsys`), at PATH, then
    under the usual installs (`NSYS_GLOBS`: Nsight Systems installs, CUDA toolkits, and the copy
    inside Nsight Compute at `/opt/nvidia/nsight-compute/*/host/target-linux-x64/nsys`).

    Args:
        environ: environment to read NSYS and PATH from (default: os.environ).
        globs: install patterns to search (default: NSYS_GLOBS).

    Returns:
        The path of an executable nsys, or None when there is none.
    """
    env = os.environ if environ is None else environ
    explicit = env.get(NSYS_ENV)
    if explicit:
        p = Path(explicit).expanduser()
        for cand in (p, p / "nsys", p / "bin" / "nsys"):
            if _executable(cand):
                return cand
    on_path = shutil.which("nsys", path=env.get("PATH", ""))
    if on_path:
        return Path(on_path)
    for pattern in NSYS_GLOBS if globs is None else globs:
        for hit in sorted(glob.glob(pattern), key=_version_key, reverse=True):
            if _executable(Path(hit)):
                return Path(hit)
    return None


def nsys_version(nsys: Path) -> str | None:
    """'2025.3.1.90-...' from `nsys --version`, or None when it does not answer."""
    try:
        r = subprocess.run([str(nsys), "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = (r.stdout or "") + (r.stderr or "")
    m = re.search(r"version\s+(\S+)", text)
    return m.group(1) if m else (text.strip().splitlines()[0] if text.strip() else None)


def find_importer(nsys: Path) -> Path | None:
    """The QdstrmImporter that belongs to `nsys`: beside it, or in the install's host folder.

    Layouts: Nsight Systems has `target-linux-x64/nsys` (or `bin/nsys`, a link into it) beside
    `host-linux-x64/QdstrmImporter`; the copy inside Nsight Compute keeps both in
    `host/target-linux-x64/`; Debian splits them under /usr/lib.
    """
    starts = [Path(nsys)]
    real = Path(os.path.realpath(nsys))
    if real != Path(nsys):
        starts.append(real)
    candidates: list[Path] = []
    for n in starts:
        d = n.parent
        candidates += [d / IMPORTER, d.parent / "host-linux-x64" / IMPORTER]
        candidates += sorted(d.parent.glob(f"host-linux-*/{IMPORTER}"))
        candidates += sorted(d.parent.glob(f"*/{IMPORTER}"))
        candidates += sorted(d.parent.parent.glob(f"*/host-linux-*/{IMPORTER}"))
    candidates += [Path("/usr/lib/nsight-systems/host-linux-x64") / IMPORTER,
                   Path("/usr/lib/x86_64-linux-gnu/nsight-systems/host-linux-x64") / IMPORTER]
    for c in candidates:
        if _executable(c):
            return c
    return None


def missing_libraries(ldd_output: str) -> list[str]:
    """Library names `ldd` reports as 'not found', in its order."""
    missing = []
    for line in ldd_output.splitlines():
        m = re.match(r"\s*(\S+)\s*=>\s*not found", line)
        if m and m.group(1) not in missing:
            missing.append(m.group(1))
    return missing


#: Packages a missing library's package needs in turn: ldd cannot see them while the first one is
#: missing, and `dpkg -x` (unlike apt) does not pull them in. libdw1 links libelf.so.1.
PACKAGE_NEEDS: dict[str, tuple[str, ...]] = {"libdw1": ("libelf1",)}


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def importer_problem(missing: list[str]) -> str:
    """What to say when the importer cannot load `missing` (names from `missing_libraries`)."""
    direct = list(dict.fromkeys(LIBRARY_PACKAGES[m] for m in missing if m in LIBRARY_PACKAGES))
    extra = [n for p in direct for n in PACKAGE_NEEDS.get(p, ()) if n not in direct]
    pkgs = direct + extra
    where = ""
    if direct:
        where = f" (Debian/Ubuntu package{'s' if len(direct) > 1 else ''} {_and(direct)}"
        where += f", which need{'' if len(direct) > 1 else 's'} {_and(extra)})" if extra else ")"
    what = _and(pkgs) if pkgs else "the package that provides it"
    return (f"{_and(missing)}{where} — install {what} or unpack {'them' if len(pkgs) != 1 else 'it'} with dpkg -x "
            f"into a folder on LD_LIBRARY_PATH (e.g. apt-get download {' '.join(pkgs) or '<package>'}; "
            "dpkg -x each .deb into /opt/nsys-libs; "
            "export LD_LIBRARY_PATH=/opt/nsys-libs/usr/lib/x86_64-linux-gnu:$LD_LIBRARY_PATH)")


def check_importer(nsys: Path, environ: dict[str, str] | None = None) -> tuple[bool, str]:
    """Whether nsys can turn a capture into a report: its QdstrmImporter's libraries all resolve.

    Args:
        nsys: the nsys binary (`find_nsys`).
        environ: environment for `ldd` (LD_LIBRARY_PATH matters; default os.environ).

    Returns:
        (ok, message): the message names the importer, or exactly what is missing and what to do.
    """
    importer = find_importer(nsys)
    if importer is None:
        return False, (f"no {IMPORTER} found beside {nsys}: nsys would leave a raw .qdstrm capture and no "
                       "report; install the complete Nsight Systems (or point NSYS at one)")
    ldd = shutil.which("ldd")
    if ldd is None:
        return True, f"{importer} (its libraries were not checked: no ldd on this machine)"
    try:
        r = subprocess.run([ldd, str(importer)], capture_output=True, text=True, timeout=30,
                           env=dict(os.environ if environ is None else environ))
    except (OSError, subprocess.TimeoutExpired) as e:
        return True, f"{importer} (its libraries were not checked: ldd failed: {e})"
    missing = missing_libraries(r.stdout + r.stderr)
    if missing:
        return False, f"nsys' importer {importer} cannot load " + importer_problem(missing)
    return True, str(importer)


def doctor_checks() -> list:
    """`faprof doctor`'s lines for Nsight Systems: nsys found (with its version), importer usable."""

    nsys = find_nsys()
    if nsys is None:
        return [Check("nsys", "warn", "not found (PATH, $NSYS, Nsight Systems / Nsight Compute installs)",
                      "install Nsight Systems, or set NSYS=/path/to/nsys; `faprof profile --nsys` needs it")]
    version = nsys_version(nsys)
    checks = [Check("nsys", "ok" if version else "warn", f"{nsys} ({version or 'no answer to --version'})")]
    ok, message = check_importer(nsys)
    checks.append(Check("nsys importer", "ok" if ok else "fail", message,
                        "" if ok else "without it nsys writes a multi-GB .qdstrm and no report"))
    return checks


# --------------------------------------------------------------------------- commands
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
    return Path(f"{report_base}.nsys-rep")


# ----------------------------------------------------------------------------- running
@dataclass
class CaptureResult:
    """What one `nsys profile` run left behind."""

    argv: list[str]
    rc: int | None
    """nsys' exit status (None when faprof had to stop it)."""
    wall_s: float
    report: Path | None
    """The .nsys-rep, when nsys made one."""
    report_after_s: float | None = None
    """Seconds from the start until nsys said it had generated the report (or the file settled)."""
    stopped: str = ""
    """'' when nsys exited by itself; 'timeout' or 'lingered' when faprof stopped it."""
    qdstrm_removed: list[str] = field(default_factory=list)
    """Raw captures deleted because no report came out of them (the importer failed)."""
    log_tail: str = ""

    @property
    def ok(self) -> bool:
        return self.report is not None


def _kill_group(proc: subprocess.Popen, grace_s: float = TERM_GRACE_S) -> None:
    """SIGTERM nsys' process group (nsys, and the target if still there), then SIGKILL."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        try:
            proc.wait(timeout=grace_s)
            return
        except subprocess.TimeoutExpired:
            continue


def _tail(path: Path, n: int = 4000) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - n))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def _generated(log_text: str) -> bool:
    """nsys prints 'Generated:' followed by the report path once the report is written."""
    return bool(re.search(r"^\s*Generated:", log_text, re.MULTILINE))


def leftover_qdstrm(report_base: str | Path, log_text: str = "") -> list[Path]:
    """Raw captures (.qdstrm) nsys left for this report: beside it, or named in its log."""
    found = {Path(f"{report_base}.qdstrm")}
    found |= {Path(p) for p in re.findall(r"['\"]?(/[^\s'\"]+\.qdstrm)['\"]?", log_text)}
    return sorted(p for p in found if p.is_file())


def run_capture(argv: list[str], report_base: str | Path, log_path: str | Path, timeout_s: float = PROFILE_TIMEOUT_S,
                env: dict[str, str] | None = None, cwd: str | Path | None = None,
                on_message: Callable[[str], None] | None = None) -> CaptureResult:
    """Run `nsys profile` with a timeout, and stop an nsys that lingers after writing its report.

    nsys runs in its own session (process group) with stdout+stderr in `log_path`. Every POLL_S the
    watchdog checks: nsys exited -> done; nsys printed 'Generated:' (or the report stopped growing
    for REPORT_SETTLE_S) and has not exited EXIT_GRACE_S later -> stop it and keep the report; past
    `timeout_s` -> stop it. Afterwards, a .qdstrm without a report means the importer failed: the
    .qdstrm (it can be GBs) is deleted and listed in the result.

    Returns:
        CaptureResult (report None when no .nsys-rep was made).
    """
    say = on_message or (lambda _m: None)
    report = report_path(report_base)
    if report.exists():
        report.unlink()
    log_path = Path(log_path)
    t0 = time.monotonic()
    done_at: float | None = None
    last_size, size_since = -1, t0
    stopped = ""
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, cwd=cwd, start_new_session=True)
        try:
            while True:
                try:
                    proc.wait(timeout=POLL_S)
                    break
                except subprocess.TimeoutExpired:
                    pass
                now = time.monotonic()
                if done_at is None:
                    if _generated(_tail(log_path)) and report.exists():
                        done_at = now
                    elif report.exists():
                        size = report.stat().st_size
                        if size != last_size:
                            last_size, size_since = size, now
                        elif now - size_since >= REPORT_SETTLE_S:
                            done_at = now
                if done_at is not None and now - done_at >= EXIT_GRACE_S:
                    say(f"nsys wrote {report.name} but had not exited {EXIT_GRACE_S:.0f} s later; stopping it")
                    stopped = "lingered"
                    _kill_group(proc)
                    break
                if now - t0 >= timeout_s:
                    say(f"nsys ran past {timeout_s:.0f} s; stopping it")
                    stopped = "timeout"
                    _kill_group(proc)
                    break
        except BaseException:
            _kill_group(proc, grace_s=2.0)
            raise
    wall = time.monotonic() - t0
    if done_at is None and report.exists():
        done_at = time.monotonic()
    log_text = log_path.read_text(errors="replace") if log_path.exists() else ""
    removed: list[str] = []
    if not report.exists():
        for q in leftover_qdstrm(report_base, log_text):
            try:
                size = q.stat().st_size
                q.unlink()
                removed.append(f"{q} ({size / 2**20:.0f} MiB)")
            except OSError:
                pass
    return CaptureResult(
        argv=list(argv), rc=None if stopped else proc.returncode, wall_s=wall,
        report=report if report.exists() else None,
        report_after_s=(done_at - t0) if done_at is not None else None, stopped=stopped,
        qdstrm_removed=removed, log_tail=log_text[-3000:],
    )


def run_export(nsys: str | Path, report: str | Path, sqlite_out: str | Path,
               timeout_s: float = EXPORT_TIMEOUT_S, env: dict[str, str] | None = None) -> tuple[bool, str]:
    """Export a report to SQLite. Returns (ok, nsys' output or the reason it failed)."""
    sqlite_out = Path(sqlite_out)
    if sqlite_out.exists():
        sqlite_out.unlink()  # nsys export refuses to overwrite without -f
    argv = export_command(nsys, report, sqlite_out)
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, env=env,
                           stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return False, f"`{shlex.join(argv)}` ran past {timeout_s:.0f} s"
    except OSError as e:
        return False, f"`{shlex.join(argv)}` could not start: {e}"
    out = _without_progress((r.stdout or "") + (r.stderr or ""))
    if r.returncode != 0 or not sqlite_out.exists():
        return False, f"`{shlex.join(argv)}` failed (exit {r.returncode}): {out[-800:]}"
    return True, out


def _without_progress(text: str) -> str:
    """nsys' output without its progress bars ('Processing 216 events: [====  40%  ]')."""
    lines = re.split(r"[\r\n]+", text)
    return "\n".join(ln for ln in lines if ln.strip() and not re.search(r"\[[= ]*\d+%[= ]*\]", ln)).strip()


# ----------------------------------------------------------------------- reading SQLite
@dataclass
class NsysTrace:
    """The tables of one nsys SQLite export, with column names made the same for every version."""

    kernels: pd.DataFrame
    """One row per kernel: start, end, device, stream, correlation_id, pid, kernel, kernel_short, grid/block, ..."""
    api: pd.DataFrame
    """CUDA API calls (runtime and driver): correlation_id, start, end, global_tid, pid, api."""
    ranges: pd.DataFrame
    """Closed NVTX ranges: start, end, text, global_tid, pid."""
    meta: dict[str, Any] = field(default_factory=dict)
    """Export metadata (META_DATA_EXPORT), table names, GPUs."""
    notes: list[str] = field(default_factory=list)
    """What the reader had to work around (absent tables, old column names)."""


#: Canonical column -> names it has had in nsys exports, first match wins.
_KERNEL_ALIASES: dict[str, tuple[str, ...]] = {
    "start": ("start",), "end": ("end",),
    "device": ("deviceId", "device"), "stream": ("streamId", "stream"),
    "correlation_id": ("correlationId",), "global_pid": ("globalPid", "globalTid"),
    "grid_x": ("gridX",), "grid_y": ("gridY",), "grid_z": ("gridZ",),
    "block_x": ("blockX",), "block_y": ("blockY",), "block_z": ("blockZ",),
    "registers_per_thread": ("registersPerThread", "registers"),
    "static_smem_bytes": ("staticSharedMemory",), "dynamic_smem_bytes": ("dynamicSharedMemory",),
}
_KERNEL_NAME_COLUMNS = ("demangledName", "name", "mangledName", "shortName")
_API_ALIASES: dict[str, tuple[str, ...]] = {
    "start": ("start",), "end": ("end",), "correlation_id": ("correlationId",),
    "global_tid": ("globalTid", "globalThreadId"), "name": ("nameId", "name"),
}
_NVTX_ALIASES: dict[str, tuple[str, ...]] = {
    "start": ("start",), "end": ("end",), "global_tid": ("globalTid", "globalThreadId"),
    "event_type": ("eventType",), "text": ("text",), "text_id": ("textId",),
}

#: Tables where nsys puts CUDA API calls: runtime and driver calls share the RUNTIME table in
#: the exports seen so far; a DRIVER table is read too where an export has one.
_API_TABLES = ("CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_DRIVER")
_KERNEL_TABLE = "CUPTI_ACTIVITY_KIND_KERNEL"
_NVTX_TABLE = "NVTX_EVENTS"


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _columns(con: sqlite3.Connection, table: str) -> list[str]:
    return [r[1] for r in con.execute(f"PRAGMA table_info({_q(table)})")]


def _select(con: sqlite3.Connection, table: str, aliases: dict[str, tuple[str, ...]], notes: list[str],
            extra: Iterable[str] = ()) -> pd.DataFrame:
    """SELECT each canonical column from the first alias the table has (NULL when none)."""
    cols = set(_columns(con, table))
    parts = []
    for canon, names in aliases.items():
        hit = next((n for n in names if n in cols), None)
        if hit is None:
            parts.append(f"NULL AS {_q(canon)}")
            if canon not in ("text", "text_id", "global_pid"):
                notes.append(f"{table} has no {'/'.join(names)} column")
        else:
            if hit != names[0]:
                notes.append(f"{table}: read {canon} from {hit} (older name)")
            parts.append(f"{_q(hit)} AS {_q(canon)}")
    parts += [_q(c) for c in extra if c in cols]
    return pd.read_sql_query(f"SELECT {', '.join(parts)} FROM {_q(table)}", con)


def _pid(gtid: pd.Series) -> pd.Series:
    """The process id inside nsys' global thread/process id (bits 24..47; above them: host/VM ids)."""
    return (pd.to_numeric(gtid, errors="coerce").astype("Int64") // (1 << 24)) % (1 << 24)


def _resolve_names(values: pd.Series, strings: dict[int, str]) -> pd.Series:
    """Names stored as StringIds ids (newer exports) or as text (older ones) -> text."""
    def one(v: Any) -> Any:
        if v is None or (isinstance(v, float) and np.isnan(v)):
            return None
        if isinstance(v, int | np.integer) or (isinstance(v, float) and float(v).is_integer()):
            return strings.get(int(v), str(int(v)))
        return str(v)
    return values.map(one)


def load_sqlite(path: str | Path) -> NsysTrace:
    """Read the kernels, CUDA API calls and NVTX ranges of an nsys SQLite export.

    Handles the differences between nsys versions: names as StringIds ids or as text (`textId` vs
    `text`, `nameId` vs `name`), `demangledName` missing in some exports (falls back to `name`,
    `mangledName`, `shortName`), event types from ENUM_NSYS_EVENT_TYPE when present, and tables
    that nsys leaves out when they would be empty (a capture without kernels has no KERNEL table).

    Raises:
        FaprofError: the file is missing or not an SQLite database.
    """

    path = Path(path)
    if not path.is_file():
        raise FaprofError(f"nsys export {path} does not exist")
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")}
    except sqlite3.DatabaseError as e:
        raise FaprofError(f"{path} is not an SQLite export of an nsys report ({e}); export it again with "
                          "`nsys export --type sqlite`") from None
    notes: list[str] = []
    try:
        strings: dict[int, str] = {}
        if "StringIds" in tables:
            strings = dict(con.execute("SELECT id, value FROM StringIds").fetchall())
        else:
            notes.append("no StringIds table: names are read as text")
        meta: dict[str, Any] = {"tables": sorted(tables)}
        if "META_DATA_EXPORT" in tables:
            meta.update({str(k): v for k, v in con.execute("SELECT name, value FROM META_DATA_EXPORT").fetchall()})
        if "TARGET_INFO_GPU" in tables:
            gcols = _columns(con, "TARGET_INFO_GPU")
            want = [c for c in ("id", "name", "smCount", "busLocation") if c in gcols]
            if want:
                meta["gpus"] = [dict(zip(want, r, strict=True)) for r in
                                con.execute(f"SELECT {', '.join(_q(c) for c in want)} FROM TARGET_INFO_GPU")]

        # ---- kernels
        if _KERNEL_TABLE in tables:
            k = _select(con, _KERNEL_TABLE, _KERNEL_ALIASES, notes)
            kcols = _columns(con, _KERNEL_TABLE)
            name_cols = [c for c in _KERNEL_NAME_COLUMNS if c in kcols]
            raw = pd.read_sql_query(
                f"SELECT {', '.join(_q(c) for c in name_cols) or 'NULL AS none'} FROM {_KERNEL_TABLE}", con)
            full = pd.Series([None] * len(raw), dtype=object)
            for c in [c for c in name_cols if c != "shortName"] or name_cols:
                full = full.where(full.notna(), _resolve_names(raw[c], strings))
            if "demangledName" not in kcols:
                notes.append(f"{_KERNEL_TABLE} has no demangledName; kernel names come from {name_cols or 'nowhere'}")
            k["kernel"] = full.values
            k["kernel_short"] = (_resolve_names(raw["shortName"], strings).values if "shortName" in kcols
                                 else full.map(_short_name).values)
            k["pid"] = _pid(k["global_pid"])
        else:
            notes.append(f"no {_KERNEL_TABLE} table: the capture holds no kernels")
            k = pd.DataFrame(columns=[*_KERNEL_ALIASES, "kernel", "kernel_short", "pid"])

        # ---- CUDA API calls
        frames = []
        for t in _API_TABLES:
            if t in tables:
                a = _select(con, t, _API_ALIASES, notes)
                a["api"] = _resolve_names(a.pop("name"), strings)
                frames.append(a)
        if frames:
            api = pd.concat(frames, ignore_index=True)
        else:
            notes.append("no CUDA API table (CUPTI_ACTIVITY_KIND_RUNTIME): kernels cannot be joined to NVTX ranges")
            api = pd.DataFrame(columns=["start", "end", "correlation_id", "global_tid", "api"])
        api["pid"] = _pid(api["global_tid"])

        # ---- NVTX ranges
        if _NVTX_TABLE in tables:
            n = _select(con, _NVTX_TABLE, _NVTX_ALIASES, notes)
            types = dict(NVTX_RANGE_EVENT_TYPES)
            if "ENUM_NSYS_EVENT_TYPE" in tables:
                ecols = _columns(con, "ENUM_NSYS_EVENT_TYPE")
                if {"id", "name"} <= set(ecols):
                    found = dict(con.execute("SELECT name, id FROM ENUM_NSYS_EVENT_TYPE").fetchall())
                    types.update({k_: found[k_] for k_ in NVTX_RANGE_EVENT_TYPES if k_ in found})
            if n["event_type"].notna().any():
                n = n[n["event_type"].isin(list(types.values()))]
            text = n["text"].astype(object)
            if n["text_id"].notna().any():
                by_id = _resolve_names(n["text_id"], strings)
                text = text.where(text.notna() & (text.astype(str) != ""), by_id)
            n = n.assign(text=text)
            n = n[n["end"].notna() & n["start"].notna()]
            n = n[pd.to_numeric(n["end"]) >= pd.to_numeric(n["start"])]
            ranges = n[["start", "end", "text", "global_tid"]].reset_index(drop=True)
        else:
            notes.append(f"no {_NVTX_TABLE} table: no NVTX ranges were recorded")
            ranges = pd.DataFrame(columns=["start", "end", "text", "global_tid"])
        ranges["pid"] = _pid(ranges["global_tid"])
    finally:
        con.close()
    for df, cols in ((k, ("start", "end")), (api, ("start", "end")), (ranges, ("start", "end"))):
        for c in cols:
            df[c] = pd.to_numeric(df[c], errors="coerce").astype("Int64")
    return NsysTrace(kernels=k.reset_index(drop=True), api=api, ranges=ranges, meta=meta, notes=notes)


def _short_name(name: Any) -> Any:
    """'void ns::kern<T>(args)' -> 'kern' (for exports without shortName)."""
    if not isinstance(name, str):
        return name
    s = re.sub(r"\(.*$", "", name)
    depth, out = 0, []
    for ch in s:
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif depth == 0:
            out.append(ch)
    return "".join(out).split()[-1].split("::")[-1] if "".join(out).split() else name


# ---------------------------------------------------------------------------- joining
def _iter_ranges(ranges: pd.DataFrame) -> pd.DataFrame:
    """`iter<i>` ranges with their parents: the innermost enclosing range on the same thread
    (`shape_id`) and the one enclosing that (`variant`). Ranges nest as a stack per thread."""
    cols = ["global_tid", "pid", "start", "end", "iteration", "shape_id", "variant"]
    if ranges.empty:
        return pd.DataFrame(columns=cols)
    r = ranges.dropna(subset=["start", "end", "text"])
    is_iter = r["text"].astype(str).str.match(ITER_RANGE.pattern)
    rows = []
    for tid, group in r.groupby("global_tid", sort=False):
        g = group.sort_values(["start", "end"], ascending=[True, False])
        starts, ends = _i64(g["start"]), _i64(g["end"])
        texts = g["text"].astype(str).to_numpy()
        for i in np.flatnonzero(is_iter.loc[g.index].to_numpy()):
            enclosing = np.flatnonzero((starts <= starts[i]) & (ends >= ends[i]))
            enclosing = enclosing[enclosing != i]
            if len(enclosing) < 2:
                continue
            # sorted by (start, -end): the last enclosing ones are the innermost
            shape_i, variant_i = enclosing[-1], enclosing[-2]
            rows.append((tid, g["pid"].iloc[i], int(starts[i]), int(ends[i]),
                         int(ITER_RANGE.match(texts[i]).group(1)), texts[shape_i], texts[variant_i]))  # type: ignore[union-attr]
    return pd.DataFrame(rows, columns=cols)


def _i64(values: pd.Series) -> np.ndarray:
    """A column as int64 numpy, NA as -1 (never a real time, thread or process id)."""
    return pd.to_numeric(values, errors="coerce").astype("Int64").fillna(-1).to_numpy(dtype=np.int64)


def _match_intervals(keys: np.ndarray, starts: np.ndarray, ends: np.ndarray, key_iv: np.ndarray,
                     start_iv: np.ndarray, end_iv: np.ndarray) -> np.ndarray:
    """For each call (key, [start, end]) the index of the interval of the same key containing it,
    or -1. Intervals of one key must not overlap (the target's iter ranges never do)."""
    out = np.full(len(keys), -1, dtype=np.int64)
    if len(key_iv) == 0 or len(keys) == 0:
        return out
    order = np.lexsort((start_iv, key_iv))
    ks, ss, es = key_iv[order], start_iv[order], end_iv[order]
    for key in np.unique(keys):
        lo, hi = np.searchsorted(ks, key, "left"), np.searchsorted(ks, key, "right")
        if lo == hi:
            continue
        sel = np.flatnonzero(keys == key)
        pos = np.searchsorted(ss[lo:hi], starts[sel], "right") - 1
        ok = (pos >= 0) & (ends[sel] <= es[lo:hi][np.clip(pos, 0, None)])
        out[sel[ok]] = order[lo + pos[ok]]
    return out


def attribute_kernels(trace: NsysTrace, plan: dict[str, Any] | None = None) -> pd.DataFrame:
    """nsys_kernels: every kernel launched inside an `iter<i>` range, with its variant, shape and call.

    A kernel is joined to the API call that launched it (same correlationId and process); the call's
    [start, end] lies inside the innermost `iter<i>` range on the same thread (`nvtx_match`
    'thread'). Calls made on another thread of the process (autograd runs CUDA backward ops on its
    own device thread, with no NVTX ranges) fall back to the `iter<i>` range of the process that
    contains them in time (`nvtx_match` 'process'): the target runs calls one at a time, so its
    iter ranges never overlap. Kernels outside every iter range (the warm-up) are left out.

    Args:
        trace: `load_sqlite`'s result.
        plan: the target's plan (JSON dict); when given, ranges whose (variant, shape_id) it does not
            list are left out (another program's NVTX ranges).

    Returns:
        A DataFrame with KERNEL_COLUMNS (empty, with the columns, when nothing matched).
    """
    k, api, ranges = trace.kernels, trace.api, trace.ranges
    empty = pd.DataFrame({c: pd.Series(dtype=_KERNEL_DTYPES.get(c, "object")) for c in KERNEL_COLUMNS})
    if k.empty or api.empty or ranges.empty:
        return empty
    calls = api.dropna(subset=["correlation_id", "start", "end"]).drop_duplicates(["correlation_id", "pid"])
    m = k.merge(calls[["correlation_id", "pid", "start", "end", "global_tid", "api"]].rename(
        columns={"start": "api_start_ns", "end": "api_end_ns"}), on=["correlation_id", "pid"], how="inner")
    if m.empty:
        # exports without a pid in the kernel table: correlation ids alone (one profiled process)
        m = k.drop(columns=["pid"]).merge(calls[["correlation_id", "pid", "start", "end", "global_tid", "api"]].rename(
            columns={"start": "api_start_ns", "end": "api_end_ns"}), on="correlation_id", how="inner")
    if m.empty:
        return empty
    it = _iter_ranges(ranges)
    if plan is not None and not it.empty:
        pairs = {(p["variant"], p["shape_id"]) for p in plan.get("pairs", [])}
        it = it[[(v, s) in pairs for v, s in zip(it["variant"], it["shape_id"], strict=True)]].reset_index(drop=True)
    if it.empty:
        return empty
    a_start, a_end = _i64(m["api_start_ns"]), _i64(m["api_end_ns"])
    i_start, i_end = _i64(it["start"]), _i64(it["end"])
    by_thread = _match_intervals(_i64(m["global_tid"]), a_start, a_end, _i64(it["global_tid"]), i_start, i_end)
    by_process = _match_intervals(_i64(m["pid"]), a_start, a_end, _i64(it["pid"]), i_start, i_end)
    idx = np.where(by_thread >= 0, by_thread, by_process)
    keep = idx >= 0
    m = m[keep].reset_index(drop=True)
    idx = idx[keep]
    m["nvtx_match"] = np.where(by_thread[keep] >= 0, "thread", "process")
    for c in ("variant", "shape_id", "iteration"):
        m[c] = it[c].to_numpy()[idx]
    m["iter_start_ns"], m["iter_end_ns"] = i_start[idx], i_end[idx]
    m = m.rename(columns={"start": "start_ns", "end": "end_ns"})
    m["duration_ns"] = m["end_ns"] - m["start_ns"]
    m["launch_latency_ns"] = m["start_ns"] - m["api_start_ns"]
    m["smem_bytes"] = (pd.to_numeric(m["static_smem_bytes"], errors="coerce").astype("Int64")
                       + pd.to_numeric(m["dynamic_smem_bytes"], errors="coerce").astype("Int64"))
    m = m.sort_values(["variant", "shape_id", "iteration", "start_ns"], kind="stable").reset_index(drop=True)
    m["kernel_index"] = m.groupby(["variant", "shape_id", "iteration"]).cumcount()
    out = m[list(KERNEL_COLUMNS)].copy()
    for c, dt in _KERNEL_DTYPES.items():
        if c in out and dt != "object":
            out[c] = pd.to_numeric(out[c], errors="coerce").astype(dt)
    # keep the plan's order of variants and shapes where there is one
    if plan is not None:
        order = {(p["variant"], p["shape_id"]): i for i, p in enumerate(plan.get("pairs", []))}
        out = out.assign(_o=[order.get((v, s), 1 << 30) for v, s in zip(out["variant"], out["shape_id"], strict=True)])
        out = out.sort_values(["_o", "iteration", "kernel_index"], kind="stable").drop(columns="_o").reset_index(drop=True)
    return out


_KERNEL_DTYPES: dict[str, str] = {
    "iteration": "Int64", "kernel_index": "Int64", "start_ns": "Int64", "end_ns": "Int64", "duration_ns": "Int64",
    "grid_x": "Int64", "grid_y": "Int64", "grid_z": "Int64", "block_x": "Int64", "block_y": "Int64", "block_z": "Int64",
    "registers_per_thread": "Int64", "static_smem_bytes": "Int64", "dynamic_smem_bytes": "Int64", "smem_bytes": "Int64",
    "stream": "Int64", "device": "Int64", "correlation_id": "Int64", "api_start_ns": "Int64", "api_end_ns": "Int64",
    "launch_latency_ns": "Int64", "iter_start_ns": "Int64", "iter_end_ns": "Int64", "global_tid": "Int64",
}


def read_kernels(sqlite_path: str | Path, plan: dict[str, Any] | str | Path | None = None) -> pd.DataFrame:
    """`attribute_kernels(load_sqlite(path), plan)`: the one way in from a file (plan: dict or JSON path)."""
    plan_dict = json.loads(Path(plan).read_text()) if isinstance(plan, str | Path) else plan
    return attribute_kernels(load_sqlite(sqlite_path), plan_dict)


# --------------------------------------------------------------------------- analyses
_CALL = ["variant", "shape_id", "iteration"]
_PAIR = ["variant", "shape_id"]


def per_call(kernels: pd.DataFrame) -> pd.DataFrame:
    """One row per call (variant, shape_id, iteration).

    Columns: kernels (launched by the call), gpu_ns (sum of kernel durations), wall_ns (first launch
    call's start to the last kernel's end), host_ns (the call's `iter<i>` range: host time),
    first_launch_ns (first launch call's start to the first kernel's start), idle_ns (GPU idle
    between the call's consecutive kernels, summed; overlapping kernels count 0).
    """
    cols = [*_CALL, "kernels", "gpu_ns", "wall_ns", "host_ns", "first_launch_ns", "idle_ns"]
    if kernels.empty:
        return pd.DataFrame(columns=cols)
    gaps = idle_gaps(kernels)
    idle = gaps.groupby(_CALL)["gap_ns"].sum() if not gaps.empty else pd.Series(dtype="float64")
    g = kernels.sort_values([*_CALL, "start_ns"]).groupby(_CALL, sort=False)
    out = pd.DataFrame({
        "kernels": g.size(),
        "gpu_ns": g["duration_ns"].sum(),
        "wall_ns": g["end_ns"].max() - g["api_start_ns"].min(),
        "host_ns": g["iter_end_ns"].first() - g["iter_start_ns"].first(),
        "first_launch_ns": g["start_ns"].first() - g["api_start_ns"].first(),
    })
    out["idle_ns"] = idle.reindex(out.index).fillna(0) if len(idle) else 0
    return out.reset_index()[cols]


def kernels_per_call(kernels: pd.DataFrame) -> pd.DataFrame:
    """Per (variant, shape_id): kernels per call (median, min, max over calls) and the kernels'
    short names in launch order of the first recorded call."""
    cols = [*_PAIR, "kernels_per_call", "kernels_per_call_min", "kernels_per_call_max", "kernel_names"]
    if kernels.empty:
        return pd.DataFrame(columns=cols)
    calls = per_call(kernels)
    g = calls.groupby(_PAIR, sort=False)["kernels"]
    out = pd.DataFrame({"kernels_per_call": g.median(), "kernels_per_call_min": g.min(), "kernels_per_call_max": g.max()})
    first = kernels.sort_values([*_CALL, "kernel_index"]).groupby(_PAIR, sort=False)
    names = first.apply(lambda d: list(d[d["iteration"] == d["iteration"].min()]["kernel_short"].astype(str)),
                        include_groups=False)
    out["kernel_names"] = names.reindex(out.index)
    return out.reset_index()[cols]


def launch_overhead(kernels: pd.DataFrame) -> pd.DataFrame:
    """Per (variant, shape_id): launch latency, the launch call's start to the kernel's start
    (median and max over every kernel, in µs), and the first kernel's of each call (median).

    The per-kernel figure is nsys_kernels' `launch_latency_ns`. It holds the host's launch cost and
    any wait for the stream: a kernel queued behind its predecessor starts late for that reason.
    CUDA tracing itself lengthens every API call (on the H100 a traced cudaLaunchKernel took 7-11 µs):
    compare launch figures between variants of one capture, not with untraced timings.
    """
    cols = [*_PAIR, "launch_us", "launch_us_max", "first_launch_us"]
    if kernels.empty:
        return pd.DataFrame(columns=cols)
    g = kernels.groupby(_PAIR, sort=False)["launch_latency_ns"]
    out = pd.DataFrame({"launch_us": g.median() / 1e3, "launch_us_max": g.max() / 1e3})
    first = per_call(kernels).groupby(_PAIR, sort=False)["first_launch_ns"].median() / 1e3
    out["first_launch_us"] = first.reindex(out.index)
    return out.reset_index()[cols]


def idle_gaps(kernels: pd.DataFrame) -> pd.DataFrame:
    """One row per pair of consecutive kernels of a call: the GPU idle time between them.

    gap_ns = next kernel's start - the latest end so far in the call, floored at 0 (kernels that
    overlap on several streams leave no gap).
    """
    cols = [*_CALL, "kernel_index", "kernel", "next_kernel", "gap_ns"]
    if kernels.empty:
        return pd.DataFrame(columns=cols)
    k = kernels.sort_values([*_CALL, "start_ns"]).reset_index(drop=True)
    end_so_far = k.groupby(_CALL, sort=False)["end_ns"].cummax()
    prev_end = end_so_far.groupby([k[c] for c in _CALL], sort=False).shift(1)
    gap = (k["start_ns"] - prev_end).clip(lower=0)
    prev_name = k.groupby(_CALL, sort=False)["kernel_short"].shift(1)
    out = pd.DataFrame({**{c: k[c] for c in _CALL}, "kernel_index": k["kernel_index"] - 1,
                        "kernel": prev_name, "next_kernel": k["kernel_short"], "gap_ns": gap})
    return out[prev_end.notna()].reset_index(drop=True)[cols]


def harness_agreement(summary: pd.DataFrame, measurements: pd.DataFrame | None) -> pd.DataFrame:
    """harness_ms (the bundle's CUDA-event median of the same variant and shape) beside nsys' figures.

    harness_over_gpu = harness_ms / nsys_gpu_ms (median kernel time per call); harness_over_wall
    compares with the call's GPU wall span. The events bracket the whole call, gaps included, and
    the harness flushes the L2 before each repeat while nsys' calls run back to back on a warm L2:
    expect harness_over_gpu a little above 1, and well above 1 for launch-bound calls (on the H100
    the smoke shapes' 5-40 µs of kernels read 1.6-1.9x: event overhead and launch gaps). nsys'
    tracing makes every launch slower (7-11 µs per cudaLaunchKernel), which stretches the wall span of
    launch-bound calls: harness_over_wall below 1 says so, and that the capture's gaps overstate the
    untraced ones; kernel durations are not affected. NaN when the bundle has no timed row for the pair.
    """
    cols = [*_PAIR, "harness_ms", "nsys_gpu_ms", "harness_over_gpu", "harness_over_wall"]
    if summary.empty:
        return pd.DataFrame(columns=cols)
    out = summary[_PAIR].copy()
    out["nsys_gpu_ms"] = pd.to_numeric(summary["gpu_us"], errors="coerce") / 1e3
    wall_ms = pd.to_numeric(summary["wall_us"], errors="coerce") / 1e3
    harness = pd.Series(np.nan, index=out.index)
    if measurements is not None and not measurements.empty and {"variant", "shape_id", "median_ms"} <= set(measurements):
        meas = measurements
        if "status" in meas:

            meas = meas[meas["status"].isin(TIMED)]
        lookup = meas.drop_duplicates(_PAIR, keep="last").set_index(_PAIR)["median_ms"]
        harness = pd.Series([lookup.get((v, s), np.nan) for v, s in zip(out["variant"], out["shape_id"], strict=True)],
                            index=out.index, dtype="float64")
    out["harness_ms"] = harness
    out["harness_over_gpu"] = out["harness_ms"] / out["nsys_gpu_ms"]
    out["harness_over_wall"] = out["harness_ms"] / wall_ms
    return out[cols]


def summarize(kernels: pd.DataFrame, measurements: pd.DataFrame | None = None,
              plan: dict[str, Any] | None = None) -> pd.DataFrame:
    """nsys_summary: one row per (variant, shape_id), medians over the recorded calls.

    Columns (SUMMARY_COLUMNS): status ('ok'; 'no kernels' when the pair ran but launched none;
    'not run' with the target's reason), iterations, kernels per call, gpu_us (kernel time per
    call), wall_us (first launch to last kernel end), host_us (the call on the host), busy_frac
    (gpu_us / wall_us), launch overhead, idle_us (sum of gaps per call) and gap_us (median gap),
    and the harness agreement. Pairs come from the plan when given, else from the kernels.
    """
    rows: list[tuple[str, str]] = []
    reasons: dict[tuple[str, str], tuple[str, str]] = {}
    planned_iters: dict[tuple[str, str], int] = {}
    if plan is not None:
        for p in plan.get("pairs", []):
            key = (p["variant"], p["shape_id"])
            rows.append(key)
            reasons[key] = ("no kernels", "") if p.get("ran") else ("not run", p.get("reason", ""))
            planned_iters[key] = int(p.get("iters", 0)) if p.get("ran") else 0
    if not kernels.empty:
        for key in kernels[_PAIR].drop_duplicates().itertuples(index=False, name=None):
            if key not in reasons:
                rows.append(key)
    base = pd.DataFrame(list(dict.fromkeys(rows)), columns=_PAIR)
    if base.empty:
        return pd.DataFrame({c: pd.Series(dtype="object") for c in SUMMARY_COLUMNS})
    if not kernels.empty:
        calls = per_call(kernels)
        g = calls.groupby(_PAIR, sort=False)
        timing = pd.DataFrame({
            "iterations": g.size(),
            "gpu_us": g["gpu_ns"].median() / 1e3, "gpu_us_min": g["gpu_ns"].min() / 1e3,
            "wall_us": g["wall_ns"].median() / 1e3, "host_us": g["host_ns"].median() / 1e3,
            "busy_frac": (calls["gpu_ns"] / calls["wall_ns"]).groupby([calls[c] for c in _PAIR], sort=False).median(),
            "idle_us": g["idle_ns"].median() / 1e3,
        }).reset_index()
        gaps = idle_gaps(kernels)
        gap = (gaps.groupby(_PAIR, sort=False)["gap_ns"].median() / 1e3).rename("gap_us").reset_index()
        base = (base.merge(timing, on=_PAIR, how="left").merge(kernels_per_call(kernels), on=_PAIR, how="left")
                .merge(launch_overhead(kernels), on=_PAIR, how="left").merge(gap, on=_PAIR, how="left"))
    for c in SUMMARY_COLUMNS:
        if c not in base:
            base[c] = None if c == "kernel_names" else np.nan
    status = [("ok", "") if pd.notna(g_) else reasons.get((v, s), ("no kernels", ""))
              for v, s, g_ in zip(base["variant"], base["shape_id"], base["gpu_us"], strict=True)]
    base["status"] = [st for st, _ in status]
    base["reason"] = [r for _, r in status]
    # calls recorded: counted from the kernels; a pair that ran but launched none made plan["iters"]
    iters = pd.to_numeric(base["iterations"], errors="coerce")
    fallback = pd.Series([planned_iters.get((v, s), 0) for v, s in zip(base["variant"], base["shape_id"], strict=True)],
                         index=base.index)
    base["iterations"] = iters.fillna(fallback).astype("int64")
    agree = harness_agreement(base, measurements)
    for c in ("harness_ms", "nsys_gpu_ms", "harness_over_gpu", "harness_over_wall"):
        base[c] = agree[c].to_numpy()
    for c in SUMMARY_COLUMNS:
        if c not in ("variant", "shape_id", "status", "reason", "kernel_names", "iterations"):
            base[c] = pd.to_numeric(base[c], errors="coerce").astype("float64")
    return base[list(SUMMARY_COLUMNS)]


# ---------------------------------------------------------------------------- collect
def _env_for_target() -> dict[str, str]:
    """This environment, with faprof's source tree first on PYTHONPATH (the target imports it)."""
    env = dict(os.environ)
    root = str(resources.package_parent())
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if root not in parts:
        env["PYTHONPATH"] = os.pathsep.join([root, *parts])
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


#: What the manifest keeps of an export's metadata (the rest is paths and export settings).
_EXPORT_META = ("EXPORT_PRODUCT_VERSION", "EXPORT_SCHEMA_VERSION", "gpus")

_EMPTY_TRACE = NsysTrace(kernels=pd.DataFrame(), api=pd.DataFrame(), ranges=pd.DataFrame())


def _read_plan(path: Path) -> dict[str, Any] | None:
    """The target's plan file, or None when it did not write one (or wrote it half)."""
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _warn(bundle, progress: Progress, message: str, manifest: dict[str, Any]) -> None:
    """Say why nsys' part of the run did not (fully) happen: progress, the bundle's log, the manifest."""
    progress("warning", {"message": f"nsys: {message}"})
    bundle.log(f"nsys: {message}")
    bundle.update_manifest(nsys={**bundle.manifest().get("nsys", {}), **manifest, "message": message})


def collect(bundle, scenario, options, progress: Progress, cuda_ok: bool, iters: int = DEFAULT_ITERS,
            timeout_s: float = PROFILE_TIMEOUT_S) -> None:
    """`faprof profile --nsys`: capture the scenario under nsys, export, write nsys_kernels / nsys_summary.

    Never raises for a problem of the machine (no GPU, no nsys, broken importer, nsys failing or
    hanging): it says so through `progress('warning', ...)` and the bundle's log, records it in the
    manifest's `nsys` entry, and returns so the run goes on. Ctrl-C still interrupts.

    Args:
        bundle: the run's Bundle. scenario: the Scenario. options: the run's ProfileOptions
            (variants, user_variants). progress: the run's progress callback.
        cuda_ok: whether the worker saw a CUDA GPU.
        iters: calls recorded per (variant, problem).
        timeout_s: limit for `nsys profile`.
    """

    if not cuda_ok:
        _warn(bundle, progress, "no CUDA GPU here, so there is nothing for Nsight Systems to capture; skipped",
              {"status": "skipped"})
        return
    nsys = find_nsys()
    if nsys is None:
        _warn(bundle, progress, "nsys not found (PATH, $NSYS, /opt/nvidia/nsight-systems, /usr/local/cuda*, "
              "/opt/nvidia/nsight-compute/*/host/target-linux-x64); install Nsight Systems or set NSYS=/path/to/nsys. "
              "Skipped", {"status": "skipped"})
        return
    version = nsys_version(nsys)
    ok, message = check_importer(nsys)
    if not ok:
        _warn(bundle, progress, f"{message}. Skipped (without it nsys writes a multi-GB .qdstrm and no report)",
              {"status": "skipped", "nsys": str(nsys), "version": version})
        return
    names = list(dict.fromkeys(v.name for _, v in run_plan.plan(scenario, options.variants)))
    spec = str(scenario.path) if getattr(scenario, "path", None) else scenario.name
    raw = bundle.raw_dir()
    base, plan_path, log_path, sqlite_path = raw / "nsys", raw / "nsys_plan.json", raw / "nsys.log", raw / "nsys.sqlite"
    argv = nsys_command(nsys, base, spec, names, iters, plan_path, user_variants=options.user_variants)
    record: dict[str, Any] = {"status": "running", "nsys": str(nsys), "version": version, "command": argv,
                              "command_line": shlex.join(argv), "iters": iters, "importer": message}
    bundle.update_manifest(nsys=record)
    progress("nsight", {"message": f"nsys: capturing {len(names)} variant(s) x {len(scenario.problems)} shape(s), "
                                   f"{iters} calls each"})
    try:
        cap = run_capture(argv, base, log_path, timeout_s=timeout_s, env=_env_for_target(),
                          on_message=lambda m: progress("nsight", {"message": f"nsys: {m}"}))
    except OSError as e:
        _warn(bundle, progress, f"could not start {nsys}: {e}", {**record, "status": "failed"})
        return
    record.update(wall_s=round(cap.wall_s, 2), rc=cap.rc, stopped=cap.stopped,
                  report_after_s=None if cap.report_after_s is None else round(cap.report_after_s, 2),
                  report=str(cap.report.relative_to(bundle.path)) if cap.report else None, log="raw/nsys.log")
    if cap.stopped == "lingered":
        bundle.log(f"nsys: wrote its report after {cap.report_after_s:.0f} s but did not exit; stopped it "
                   f"(the report is complete)")
    plan = _read_plan(plan_path)
    if cap.report is None:
        ran = [p for p in (plan or {}).get("pairs", []) if p.get("ran")]
        if cap.qdstrm_removed:
            _, imp = check_importer(nsys)
            why = (f"nsys left a raw capture and no report: its importer failed ({imp}). Deleted "
                   f"{', '.join(cap.qdstrm_removed)}")
        elif cap.stopped == "timeout":
            why = f"nsys ran past {timeout_s:.0f} s without writing a report; stopped it (see raw/nsys.log)"
        elif plan is not None and not ran:
            why = ("no (variant, shape) pair ran on the GPU, so the capture never started and nsys made no report; "
                   "nsys_summary lists each pair and why")
            bundle.write("nsys_summary", summarize(attribute_kernels(_EMPTY_TRACE), bundle.measurements(), plan)
                         .assign(run_id=bundle.run_id))
        else:
            last = _without_progress(cap.log_tail).splitlines()
            why = (f"nsys made no report (exit {cap.rc}{', the target did not finish' if plan is None else ''}): "
                   f"{last[-1] if last else 'no output'} (see raw/nsys.log)")
        _warn(bundle, progress, why, {**record, "status": "failed" if plan is None or ran else "empty",
                                      "qdstrm_removed": cap.qdstrm_removed})
        return
    progress("nsight", {"message": f"nsys: report written in {cap.wall_s:.0f} s; exporting to SQLite"})
    t0 = time.monotonic()
    ok, out = run_export(nsys, cap.report, sqlite_path, env=_env_for_target())
    record["export_s"] = round(time.monotonic() - t0, 2)
    if not ok:
        _warn(bundle, progress, out, {**record, "status": "failed"})
        return
    record["sqlite"] = str(sqlite_path.relative_to(bundle.path))
    try:
        trace = load_sqlite(sqlite_path)
        kernels = attribute_kernels(trace, plan).assign(run_id=bundle.run_id)
        summary = summarize(kernels, bundle.measurements(), plan).assign(run_id=bundle.run_id)
    except Exception as e:  # a parser bug must not cost the measurements already taken
        _warn(bundle, progress, f"could not read {sqlite_path.name}: {type(e).__name__}: {e}",
              {**record, "status": "failed"})
        return
    bundle.write("nsys_kernels", kernels)
    bundle.write("nsys_summary", summary)
    n_all, n_in = len(trace.kernels), len(kernels)
    record.update(status="complete", kernels_captured=n_all, kernels_attributed=n_in,
                  export={k: trace.meta[k] for k in _EXPORT_META if k in trace.meta}, notes=trace.notes)
    bundle.update_manifest(nsys=record)
    if n_all == 0:
        msg = "the capture holds no kernels (no variant ran on the GPU?); nsys_summary lists the pairs and why"
        progress("warning", {"message": f"nsys: {msg}"})
        bundle.log(f"nsys: {msg}")
    else:
        bundle.log(f"nsys: {n_in} of {n_all} captured kernels fell inside iter ranges "
                   f"({n_all - n_in} in warm-up or outside the measured calls)")
        progress("nsight", {"message": f"nsys: {n_in} kernels in {summary['status'].eq('ok').sum()} (variant, shape) "
                                       f"pairs -> nsys_kernels, nsys_summary"})


# ------------------------------------------------------------------------------- CLI
def main(argv: list[str] | None = None) -> int:
    """`python -m faprof.nsight.nsys capture|parse ...`: the pieces of `collect`, by hand.

    capture: run the target under nsys into OUT (report, SQLite, plan, log, timings.json, tables).
    parse: print the summary of an existing export.
    """
    ap = argparse.ArgumentParser(prog="python -m faprof.nsight.nsys", description=(main.__doc__ or "").splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("capture")
    c.add_argument("--scenario", required=True)
    c.add_argument("--variants", required=True)
    c.add_argument("--shapes", default=None)
    c.add_argument("--iters", type=int, default=DEFAULT_ITERS)
    c.add_argument("--user-variants", action="append", default=[])
    c.add_argument("--out", type=Path, required=True)
    c.add_argument("--name", default="nsys")
    c.add_argument("--timeout", type=float, default=PROFILE_TIMEOUT_S)
    p = sub.add_parser("parse")
    p.add_argument("sqlite", type=Path)
    p.add_argument("--plan", type=Path, default=None)
    p.add_argument("--measurements", type=Path, default=None)
    a = ap.parse_args(argv)
    pd.set_option("display.width", 250)
    pd.set_option("display.max_columns", 30)
    if a.cmd == "parse":
        plan = json.loads(a.plan.read_text()) if a.plan else None
        kernels = read_kernels(a.sqlite, plan)
        meas = pd.read_parquet(a.measurements) if a.measurements else None
        print(summarize(kernels, meas, plan).drop(columns=["kernel_names"]).to_string())
        return 0
    nsys = find_nsys()
    if nsys is None:
        print("nsys not found", file=sys.stderr)
        return 2
    ok, message = check_importer(nsys)
    print(f"nsys {nsys} ({nsys_version(nsys)}); importer: {message}", flush=True)
    a.out.mkdir(parents=True, exist_ok=True)
    base, plan_path = a.out / a.name, a.out / f"{a.name}_plan.json"
    cmd = nsys_command(nsys, base, a.scenario, a.variants.split(","), a.iters, plan_path,
                       shapes=a.shapes.split(",") if a.shapes else None, user_variants=a.user_variants)
    print(shlex.join(cmd), flush=True)
    cap = run_capture(cmd, base, a.out / f"{a.name}.log", timeout_s=a.timeout, env=_env_for_target(),
                      on_message=lambda m: print(m, flush=True))
    timings: dict[str, Any] = {"argv": cmd, "rc": cap.rc, "wall_s": cap.wall_s, "report_after_s": cap.report_after_s,
                               "stopped": cap.stopped, "qdstrm_removed": cap.qdstrm_removed}
    if cap.report is not None:
        t0 = time.monotonic()
        ok, out = run_export(nsys, cap.report, a.out / f"{a.name}.sqlite", env=_env_for_target())
        timings.update(export_ok=ok, export_s=time.monotonic() - t0, export_out=out[-2000:])
        if ok:
            plan = json.loads(plan_path.read_text()) if plan_path.exists() else None
            kernels = read_kernels(a.out / f"{a.name}.sqlite", plan)
            summary = summarize(kernels, None, plan)
            kernels.to_parquet(a.out / f"{a.name}_kernels.parquet", index=False)
            summary.to_parquet(a.out / f"{a.name}_summary.parquet", index=False)
            print(summary.drop(columns=["kernel_names"]).to_string())
    (a.out / f"{a.name}_timings.json").write_text(json.dumps(timings, indent=1, default=str))
    print(json.dumps({k: v for k, v in timings.items() if k != "argv"}, default=str))
    return 0 if cap.report is not None else 1


if __name__ == "__main__":
    sys.exit(main())
