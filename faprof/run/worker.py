"""Fault containment: all variant code runs in a worker process that can die without the run.

A kernel that writes out of bounds corrupts its CUDA context: every later CUDA call in that
process fails. A kernel that hangs never returns. Either would take a whole run down if it ran in
the CLI's own process. So the CLI sends one task at a time to a `spawn`ed worker over a pipe and
waits with a timeout:

- the task raises an ordinary exception -> the worker answers with the error and lives on;
- the task raises a CUDA error that poisons the context -> the worker answers, then exits, and
  the parent starts a fresh one for the next task;
- the worker dies (segfault, os._exit, OOM-kill) or does not answer within the timeout -> the
  parent kills it, reports `WorkerDied` with the reason, and starts a fresh one. Before killing a
  worker that did not answer, the parent has it dump its Python stacks (faprof.run.stacks): the
  reason names where it sat, and `WorkerDied.stacks` holds every thread's stack.

The timeout is the task's own: it starts when the worker says it has begun the task. A fresh
worker first imports torch and faprof (seconds, and far more on a loaded machine), which is
bounded by START_TIMEOUT_S instead, so a replaced worker's start-up never reads as a hung task.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
import threading
import time
import traceback
import types
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from faprof import variants
from faprof.run import stacks, tasks
from faprof.run.tasks import is_fatal

#: At most this long for a fresh worker to import torch and faprof and say it is ready, and for a
#: started worker to pick up a task it was sent (a loaded 2-core machine took over 8 s to start one).
START_TIMEOUT_S = 300.0


class WorkerDied(Exception):
    """The worker process died or hung while running a task."""

    def __init__(self, message: str, stacks: str = ""):
        super().__init__(message)
        self.stacks = stacks
        """A hung worker's Python stacks, every thread (faulthandler's text), '' when it died or sent none."""


def _worker_main(conn, user_variant_specs: list[str], environ: dict[str, str] | None = None,
                 stacks_path: str | None = None) -> None:
    # Before anything can initialise CUDA: CUDA_VISIBLE_DEVICES pins this worker to its GPU.
    os.environ.update(environ or {})
    stacks.arm(stacks_path)  # first: a start that hangs in an import is dumped too

    for spec in user_variant_specs:
        variants.load_user_variants(spec)
    conn.send(("ready", None))
    state: dict[str, Any] = {}
    while True:
        try:
            task = conn.recv()
        except EOFError:
            return
        if task is None:
            return
        conn.send(("begun", None))  # the parent's timeout for this task starts now
        try:
            result = tasks.dispatch(task, state)
            conn.send(("ok", result))
        except BaseException as e:  # report everything; the parent decides what it means
            msg = f"{type(e).__name__}: {e}"
            fatal = is_fatal(msg)
            conn.send(("error", {"type": type(e).__name__, "message": str(e), "traceback": traceback.format_exc(),
                                 "fatal": fatal}))
            if fatal or isinstance(e, KeyboardInterrupt | SystemExit):
                conn.close()
                os._exit(3)


_MAIN_SWAP = threading.Lock()


@contextmanager
def _without_main_module() -> Iterator[None]:
    """A spawned worker needs nothing from the caller's `__main__` (its target lives in this module), but
    `spawn` imports it again in the child: a user's script that calls faprof without an
    `if __name__ == "__main__":` guard would run again in every worker, and a host that swapped in its own
    `__main__` (Streamlit runs the dashboard script as `__main__`) made every worker start re-run that
    script, 0.5 s to 5 s per start. So the start sees an empty `__main__`; a lock keeps two workers
    starting at once (one per GPU) from restoring each other's stand-in."""
    with _MAIN_SWAP:
        main = sys.modules.get("__main__")
        sys.modules["__main__"] = types.ModuleType("__main__")
        try:
            yield
        finally:
            if main is not None:
                sys.modules["__main__"] = main


class Worker:
    """A restartable worker process. `call` runs one task in it and returns its result."""

    def __init__(self, user_variant_specs: list[str] | None = None, environ: dict[str, str] | None = None):
        self.user_variant_specs = list(user_variant_specs or [])
        self.environ = dict(environ or {})
        """Environment variables set in the worker before it imports anything (CUDA_VISIBLE_DEVICES)."""
        self.ctx = mp.get_context("spawn")
        self.proc: Any = None
        self.conn: Any = None
        self.restarts = 0
        self.stacks_path: str | None = None
        """The running worker's stacks file (faprof.run.stacks), removed when the worker is reaped."""

    def start(self) -> None:
        parent, child = self.ctx.Pipe()
        self.stacks_path = stacks.new_file()
        self.proc = self.ctx.Process(target=_worker_main, daemon=True,
                                     args=(child, self.user_variant_specs, self.environ, self.stacks_path))
        with _without_main_module():
            self.proc.start()
        child.close()
        self.conn = parent

    def alive(self) -> bool:
        return self.proc is not None and self.proc.is_alive()

    def call(self, task: dict[str, Any], timeout_s: float) -> Any:
        """Run `task`; return its result, raise `TaskError` for an ordinary failure, or `WorkerDied`
        when the worker crashed, poisoned its context or hung (it is then replaced).

        `timeout_s` bounds the task itself, from the moment the worker begins it; a fresh worker's
        start-up and the hand-over are bounded by START_TIMEOUT_S."""
        if not self.alive():
            self.start()
        try:
            self.conn.send(task)
        except (BrokenPipeError, OSError):
            self._replace()
            self.conn.send(task)
        started = False
        deadline = time.monotonic() + max(START_TIMEOUT_S, timeout_s)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                where, dump = self._stacks()
                self._kill()
                if started:
                    raise WorkerDied(f"no answer within {timeout_s:.0f} s (hung?); the worker was killed and "
                                     f"restarted; where it sat: {where}", dump)
                raise WorkerDied(f"the worker did not start the task within {START_TIMEOUT_S:.0f} s; it was killed "
                                 f"and restarted; where it sat: {where}", dump)
            try:
                ready = self.conn.poll(min(remaining, 0.5))
            except (EOFError, OSError):
                ready = False
            if ready:
                try:
                    kind, payload = self.conn.recv()
                except (EOFError, OSError):
                    code = self._reap()
                    self.restarts += 1
                    raise WorkerDied(f"the worker process died (exit code {code})") from None
                if kind == "ready":
                    continue
                if kind == "begun":
                    started = True
                    deadline = time.monotonic() + timeout_s
                    continue
                if kind == "ok":
                    return payload
                if payload.get("fatal"):
                    self._reap()
                    self.restarts += 1
                    raise WorkerDied(f"{payload['type']}: {payload['message']} (CUDA context lost; worker restarted)")
                raise TaskError(payload["type"], payload["message"], payload["traceback"])
            if not self.proc.is_alive():
                code = self._reap()
                self.restarts += 1
                raise WorkerDied(f"the worker process died (exit code {code})")

    def _stacks(self) -> tuple[str, str]:
        """(where the live worker's task thread sits, in one line; every thread's stack) before a kill."""
        if self.proc is None or not self.proc.is_alive():
            return "unknown (it had exited)", ""
        dump = stacks.request(self.proc.pid, self.stacks_path)
        return stacks.summary(dump, stacks.main_ident(self.stacks_path)), dump.strip()

    def _reap(self) -> int | None:
        if self.proc is None:
            return None
        self.proc.join(timeout=10)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(timeout=10)
        code = self.proc.exitcode
        self.proc = None
        stacks.discard(self.stacks_path)
        self.stacks_path = None
        return code

    def _kill(self) -> None:
        if self.proc is not None and self.proc.is_alive():
            self.proc.kill()
        self._reap()
        self.restarts += 1

    def _replace(self) -> None:
        self._kill()
        self.start()

    def close(self) -> None:
        if self.proc is not None and self.proc.is_alive():
            try:
                self.conn.send(None)
                self.proc.join(timeout=10)
            except (BrokenPipeError, OSError):
                pass
        if self.proc is not None:
            self._reap()

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class TaskError(Exception):
    """A task raised an ordinary exception in the worker (the worker lives on)."""

    def __init__(self, type_name: str, message: str, tb: str):
        super().__init__(f"{type_name}: {message}")
        self.type_name = type_name
        self.message = message
        self.tb = tb


class InProcess:
    """Same interface as Worker, running tasks in this process (for tests and `--no-isolate`)."""

    def __init__(self, user_variant_specs: list[str] | None = None):

        for spec in user_variant_specs or []:
            variants.load_user_variants(spec)
        self.state: dict[str, Any] = {}
        self.restarts = 0

    def call(self, task: dict[str, Any], timeout_s: float) -> Any:

        try:
            return tasks.dispatch(task, self.state)
        except Exception as e:
            raise TaskError(type(e).__name__, str(e), traceback.format_exc()) from e

    def close(self) -> None:
        pass

    def __enter__(self) -> InProcess:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
