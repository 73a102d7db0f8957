"""Where a hung worker sits: its Python stacks, dumped on a signal before the parent kills it.

The worker registers `faulthandler` on DUMP_SIGNAL with a file the parent named. faulthandler writes
from the signal handler itself, in C, so it dumps a worker stuck in a C call (a compile, a CUDA
call, a lock) as well as one looping in Python. On a task's timeout the parent sends the signal,
reads what was written and only then kills the worker: the row's reason names the innermost frames
of the thread that ran the task, and the run's log keeps every thread's stack.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import re
import signal
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import TextIO

#: The signal a worker dumps its stacks on (SIGUSR1; absent on Windows, where no dump is asked for).
DUMP_SIGNAL = getattr(signal, "SIGUSR1", None)

#: How long the parent waits for a dump. faulthandler writes it in milliseconds; a worker blocked in
#: the kernel (uninterruptible I/O) never runs the handler, and the reason then says no dump came.
DUMP_WAIT_S = 3.0

#: The dump is taken as complete once the file has not grown for this long.
DUMP_SETTLE_S = 0.1

#: Frames of the task's thread named in a row's reason, innermost first (the full stack goes to the log).
REASON_FRAMES = 4

#: faprof frames named after those, outward from the innermost one below them: which variant, which
#: harness step (check, probe, timing) led there.
FAPROF_FRAMES = 3

#: First line of a stacks file: the identity of the thread that runs the tasks (faulthandler names
#: threads by their pthread identity, as `threading` does).
MAIN_MARK = "faprof worker main thread"

_THREAD_RE = re.compile(r"^(?:Current thread|Thread) (0x[0-9a-fA-F]+)")
_FRAME_RE = re.compile(r'^\s+File "(?P<file>.*)", line (?P<line>\d+) in (?P<func>.+)$')

_ARMED: list[TextIO] = []  # the worker's open stacks file: faulthandler writes to its descriptor


def new_file() -> str | None:
    """A fresh, empty stacks file for one worker process (None where no signal can ask for a dump)."""
    if DUMP_SIGNAL is None:
        return None
    fd, path = tempfile.mkstemp(prefix="faprof-worker-", suffix=".stacks")
    os.close(fd)
    return path


def arm(path: str | None) -> None:
    """In the worker: dump every thread's stack to `path` when DUMP_SIGNAL arrives."""
    if path is None or DUMP_SIGNAL is None:
        return
    f = open(path, "a", encoding="utf-8")  # noqa: SIM115 (open for the process's life: faulthandler writes to its fd)
    f.write(f"{MAIN_MARK} 0x{threading.main_thread().ident or 0:016x}\n")
    f.flush()
    faulthandler.register(DUMP_SIGNAL, file=f, all_threads=True, chain=False)
    _ARMED.append(f)


def request(pid: int, path: str | None, wait_s: float = DUMP_WAIT_S) -> str:
    """In the parent: ask process `pid` for its stacks and return the dump ('' when none came)."""
    if path is None or DUMP_SIGNAL is None:
        return ""
    try:
        start = os.path.getsize(path)
        os.kill(pid, DUMP_SIGNAL)
    except OSError:
        return ""
    deadline = time.monotonic() + wait_s
    size, settled = start, time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(DUMP_SETTLE_S / 2)
        now = os.path.getsize(path)
        if now != size:
            size, settled = now, time.monotonic()
        elif size > start and time.monotonic() - settled >= DUMP_SETTLE_S:
            break
    with open(path, encoding="utf-8", errors="replace") as f:
        f.seek(start)
        return f.read()


def main_ident(path: str | None) -> str | None:
    """The task thread's identity the worker wrote first in its stacks file ('0x...'), if any."""
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            first = f.readline()
    except OSError:
        return None
    return first.split()[-1] if first.startswith(MAIN_MARK) else None


def discard(path: str | None) -> None:
    """Remove a reaped worker's stacks file."""
    if path is not None:
        with contextlib.suppress(OSError):
            os.unlink(path)


@dataclass
class Frame:
    file: str
    line: int
    func: str

    def short(self) -> str:
        return f"{short_path(self.file)}:{self.line} in {self.func}"


def threads(dump: str) -> dict[str, list[Frame]]:
    """faulthandler's dump as {thread identity: frames, innermost first}."""
    out: dict[str, list[Frame]] = {}
    current: list[Frame] | None = None
    for line in dump.splitlines():
        m = _THREAD_RE.match(line)
        if m:
            current = out.setdefault(m.group(1).lower(), [])
            continue
        f = _FRAME_RE.match(line)
        if f and current is not None:
            current.append(Frame(f["file"], int(f["line"]), f["func"]))
    return out


def short_path(path: str) -> str:
    """A frame's file as the reader knows it: from the package (`torch/...`, `faprof/...`) or the stdlib
    module's name, else its last two parts."""
    p = path.replace("\\", "/")
    for marker in ("/site-packages/", "/dist-packages/"):
        if marker in p:
            return p.rsplit(marker, 1)[1]
    m = re.search(r"/lib/python3\.\d+/(.+)$", p)
    if m:
        return m.group(1)
    parts = p.split("/")
    if "faprof" in parts[:-1]:
        return "/".join(parts[len(parts) - 1 - parts[::-1].index("faprof"):])
    return "/".join(parts[-2:])


def summary(dump: str, main: str | None, n: int = REASON_FRAMES) -> str:
    """One line for a row's reason: the task thread's innermost frames and, when they are not faprof's,
    the faprof frames below them (which variant and harness step called what hangs)."""
    by_thread = threads(dump)
    if not by_thread:
        return "unknown (no stack dump came back: the worker did not run its signal handler)"
    frames = by_thread.get(main.lower()) if main else None
    if frames is None:
        frames = next(iter(by_thread.values()))
    # the worker's loop and what started the process sit under every task: cut there
    cut = next((i for i, f in enumerate(frames) if _is_worker_loop(f.file)), len(frames))
    frames = frames[:cut]
    if not frames:
        return "the worker's own loop (between tasks)"
    text = " <- ".join(f.short() for f in frames[:n])
    ours = [f for f in frames[n:] if _is_faprof(f.file) and not _is_plumbing(f.file)][:FAPROF_FRAMES]
    if ours:
        text += " ... called from " + " <- ".join(f.short() for f in ours)
    others = len(by_thread) - 1
    return text + (f" (and {others} other thread{'s' if others != 1 else ''})" if others > 0 else "")


def _is_faprof(path: str) -> bool:
    return short_path(path).startswith("faprof/")


def _is_plumbing(path: str) -> bool:
    """The worker's loop and task dispatch: under every task, never the answer to 'called from where'."""
    p = path.replace("\\", "/")
    return p.endswith(("/faprof/run/worker.py", "/faprof/run/tasks.py"))


def _is_worker_loop(path: str) -> bool:
    return path.replace("\\", "/").endswith("/faprof/run/worker.py")

