"""One ncu process: run it with its own session, stream its output to a log, report each profiled kernel.

Part of the ncu session (`faprof.nsight.ncu.run`): `collect` and the source-line pass run ncu
through `run_ncu`.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from faprof.nsight.ncu.find import PERMISSION_ERROR

_PROF_RE = re.compile(r'==PROF== Profiling "(?P<kernel>[^"]+)"(?:\s*-\s*(?P<id>\d+))?')
_PASSES_RE = re.compile(r"(\d+)\s+pass(?:es)?\s*$")
_METRIC_ERROR_RE = re.compile(
    r"(?i)(failed to find metric|invalid metric|unknown metric|metric .* not (found|supported))"
)

Progress = Callable[[str, dict[str, Any]], None]

#: Lines of ncu's output kept for messages (NcuRun.tail).
_TAIL_LINES = 40

#: ncu's ==ERROR== and ==WARNING== lines kept (NcuRun.errors, NcuRun.warnings): the last ones.
_KEPT_MESSAGES = 20


@dataclass
class NcuRun:
    """What one ncu process did."""

    returncode: int | None
    wall_s: float
    kernels: int
    timed_out: bool
    permission_denied: bool
    metric_error: bool
    errors: list[str]
    """ncu's ==ERROR== lines (the last 20)."""
    warnings: list[str]
    """ncu's ==WARNING== lines (the last 20)."""
    tail: list[str]
    passes: list[int] = field(default_factory=list)
    """Replay passes of each profiled kernel, as ncu printed them."""
    prof_times: list[float] = field(default_factory=list)
    """Seconds after the start at which each kernel's profile was done."""
    kernel_names: list[str] = field(default_factory=list)


@dataclass
class _Watch:
    """What ncu's output has said so far, read line by line while it runs."""

    t0: float
    progress: Progress
    expected: int | None
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    tail: list[str] = field(default_factory=list)
    passes: list[int] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    perm: bool = False
    metric: bool = False
    timeout: bool = False
    """Set by the timer thread that stopped ncu."""

    def take(self, line: str) -> None:
        """One line of ncu's output: permission and metric errors, messages, profiled kernels."""
        line = line.rstrip("\n")
        self.tail = (self.tail + [line])[-_TAIL_LINES:]
        if PERMISSION_ERROR in line:
            self.perm = True
        if line.startswith("==ERROR==") or line.startswith("==WARNING=="):
            (self.errors if line.startswith("==ERROR==") else self.warnings).append(line)
            if _METRIC_ERROR_RE.search(line):
                self.metric = True
        m = _PROF_RE.search(line)
        if m:
            self._profiled(m, line)

    def _profiled(self, m: re.Match[str], line: str) -> None:
        now = time.perf_counter() - self.t0
        self.times.append(now)
        self.names.append(m.group("kernel"))
        pm = _PASSES_RE.search(line)
        if pm:
            self.passes.append(int(pm.group(1)))
        expected, times = self.expected, self.times
        # the plan's count is an estimate (kernels per call are known only for pairs seen
        # on this GPU before): past it, say so rather than print "48/47"
        of = (f"/{expected}" if len(times) <= expected else f" (plan estimated {expected})") if expected else ""
        self.progress(
            "nsight",
            {
                "message": f"ncu: profiled kernel {len(times)}{of}: {m.group('kernel')}"
                + (f" ({pm.group(1)} passes)" if pm else "")
                + f", {now:.0f} s",
                "tool": "ncu",
                "kernels": len(times),
            },
        )

    def result(self, returncode: int | None) -> NcuRun:
        """The run as NcuRun (wall time up to now)."""
        return NcuRun(
            returncode=returncode,
            wall_s=time.perf_counter() - self.t0,
            kernels=len(self.times),
            timed_out=self.timeout,
            permission_denied=self.perm,
            metric_error=self.metric,
            errors=self.errors[-_KEPT_MESSAGES:],
            warnings=self.warnings[-_KEPT_MESSAGES:],
            tail=self.tail,
            passes=self.passes,
            prof_times=self.times,
            kernel_names=self.names,
        )


def run_ncu(
    argv: Sequence[str],
    log_path: Path,
    progress: Progress,
    timeout_s: float,
    env: Mapping[str, str] | None = None,
    expected: int | None = None,
) -> NcuRun:
    """Run ncu, stream its output to `log_path`, and report each profiled kernel through `progress`.

    The process gets its own session so a timeout or Ctrl-C stops ncu and the profiled target
    together (by the session's process group id, which is ncu's pid).
    """
    watch = _Watch(time.perf_counter(), progress, expected)
    with open(log_path, "w", encoding="utf-8", errors="replace") as log:
        log.write("$ " + " ".join(argv) + "\n")
        log.flush()
        proc = subprocess.Popen(
            list(argv),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            env=dict(env) if env is not None else None,
            start_new_session=True,
            errors="replace",
        )

        def stop() -> None:
            watch.timeout = True
            _kill_group(proc)

        timer = threading.Timer(timeout_s, stop)
        timer.daemon = True
        timer.start()
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                log.write(line)
                log.flush()
                watch.take(line)
            proc.wait()
        except BaseException:
            _kill_group(proc)
            raise
        finally:
            timer.cancel()
    return watch.result(proc.returncode)


def _kill_group(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
    except (ProcessLookupError, PermissionError):
        return
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
