"""Running nsys: one capture under a timeout and a watchdog for an nsys that lingers, then the SQLite export."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from faprof import resources
from faprof.nsight.nsys.command import export_command, report_path

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


#: A .qdstrm path in nsys' log: in single or double quotes (spaces allowed), else up to the first blank.
_QDSTRM_IN_LOG = re.compile(r"'(/[^'\n]+?\.qdstrm)'|\"(/[^\"\n]+?\.qdstrm)\"|(/[^\s'\"]+\.qdstrm)")


def leftover_qdstrm(report_base: str | Path, log_text: str = "") -> list[Path]:
    """Raw captures (.qdstrm) nsys left for this report: beside it, or named in its log."""
    found = {Path(f"{report_base}.qdstrm")}
    # quoted as nsys prints them ("Generating '/tmp/nsys-report-1a2b.qdstrm'": the path may hold spaces), or bare
    for groups in _QDSTRM_IN_LOG.findall(log_text):
        found.add(Path(next(g for g in groups if g)))
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
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, cwd=cwd, start_new_session=True)
        try:
            done_at, stopped = _watch(proc, report, log_path, t0, timeout_s, say)
        except BaseException:
            _kill_group(proc, grace_s=2.0)
            raise
    wall = time.monotonic() - t0
    if done_at is None and report.exists():
        done_at = time.monotonic()
    log_text = log_path.read_text(errors="replace") if log_path.exists() else ""
    removed = [] if report.exists() else _remove_raw_captures(report_base, log_text)
    return CaptureResult(
        argv=list(argv), rc=None if stopped else proc.returncode, wall_s=wall,
        report=report if report.exists() else None,
        report_after_s=(done_at - t0) if done_at is not None else None, stopped=stopped,
        qdstrm_removed=removed, log_tail=log_text[-3000:],
    )


def _watch(proc: subprocess.Popen, report: Path, log_path: Path, t0: float, timeout_s: float,
           say: Callable[[str], None]) -> tuple[float | None, str]:
    """Wait for nsys; stop it once it lingers EXIT_GRACE_S after finishing its report, or past `timeout_s`.

    Returns:
        (when the report was seen finished, monotonic clock, or None; '' when nsys exited by
        itself, else 'lingered' or 'timeout').
    """
    done_at: float | None = None
    last_size, size_since = -1, t0
    while True:
        try:
            proc.wait(timeout=POLL_S)
            return done_at, ""
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
            _kill_group(proc)
            return done_at, "lingered"
        if now - t0 >= timeout_s:
            say(f"nsys ran past {timeout_s:.0f} s; stopping it")
            _kill_group(proc)
            return done_at, "timeout"


def _remove_raw_captures(report_base: str | Path, log_text: str) -> list[str]:
    """Delete the .qdstrm files a capture left without a report (they can be GBs); 'path (size)' of each."""
    removed: list[str] = []
    for q in leftover_qdstrm(report_base, log_text):
        try:
            size = q.stat().st_size
            q.unlink()
            removed.append(f"{q} ({size / 2**20:.0f} MiB)")
        except OSError:
            pass
    return removed


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
    out = without_progress((r.stdout or "") + (r.stderr or ""))
    if r.returncode != 0 or not sqlite_out.exists():
        return False, f"`{shlex.join(argv)}` failed (exit {r.returncode}): {out[-800:]}"
    return True, out


def without_progress(text: str) -> str:
    """nsys' output without its progress bars ('Processing 216 events: [====  40%  ]')."""
    lines = re.split(r"[\r\n]+", text)
    return "\n".join(ln for ln in lines if ln.strip() and not re.search(r"\[[= ]*\d+%[= ]*\]", ln)).strip()




def env_for_target() -> dict[str, str]:
    """This environment, with faprof's source tree first on PYTHONPATH (the target imports it)."""
    env = dict(os.environ)
    root = str(resources.package_parent())
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if root not in parts:
        env["PYTHONPATH"] = os.pathsep.join([root, *parts])
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env
