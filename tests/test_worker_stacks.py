"""A worker that does not answer in time is asked for its Python stacks before it is killed: the row's
reason names where it sat, the run's log keeps every thread's stack.

Method: real dumps only. A worker hangs in a task (the `sleep` hook, with a second thread parked on a
lock) and is dumped by faulthandler on the signal; the parser is read against a dump faulthandler
writes in this process, never against hand-written text. The end-to-end row and log are checked in
tests/test_worker.py (a user variant that hangs).
"""

from __future__ import annotations

import faulthandler
import os
import textwrap
import threading

import pytest

from faprof.run import stacks
from faprof.run.worker import Worker, WorkerDied

pytestmark = pytest.mark.skipif(stacks.DUMP_SIGNAL is None, reason="no SIGUSR1 on this platform")


def test_a_hung_task_names_where_its_thread_sat_and_keeps_every_stack(tmp_path):
    """A worker with a second thread parked on a lock hangs in a task: the reason is the task thread's
    innermost frames (the worker's own loop cut off), the other thread is counted, the dump has both;
    the dead worker's stacks file is removed and its replacement armed afresh."""
    plugin = tmp_path / "parks_a_thread.py"
    plugin.write_text(textwrap.dedent("""
        import threading

        _lock = threading.Lock()
        _lock.acquire()

        def parked_elsewhere():
            _lock.acquire()

        threading.Thread(target=parked_elsewhere, daemon=True).start()
    """))
    with Worker([str(plugin)]) as w:
        assert w.call({"op": "ping"}, timeout_s=120) == "pong"  # started and armed: the timeout is the task's
        path = w.stacks_path
        with pytest.raises(WorkerDied) as info:
            w.call({"op": "sleep", "seconds": 600}, timeout_s=2)
        e = info.value
        reason = str(e)
        assert reason.startswith("no answer within 2 s"), reason  # the pool's retry rule reads this start
        assert "where it sat: faprof/run/tasks.py:" in reason and "in dispatch" in reason, reason
        assert "_worker_main" not in reason and "multiprocessing" not in reason, reason
        assert "parked_elsewhere" not in reason and "other thread" in reason, reason
        assert "most recent call first" in e.stacks and "in parked_elsewhere" in e.stacks and "_worker_main" in e.stacks
        assert path is not None and not os.path.exists(path), "the dead worker's stacks file was left behind"
        assert w.call({"op": "ping"}, timeout_s=120) == "pong"
        assert w.stacks_path is not None and w.stacks_path != path and os.path.exists(w.stacks_path)
    assert w.stacks_path is None


def test_the_parser_reads_faulthandlers_own_dump(tmp_path):
    """threads() and summary() on a dump faulthandler wrote here: the named thread's innermost frames
    first, this test's frame below them, another thread kept apart."""
    gate, parked = threading.Event(), threading.Event()

    def park():
        parked.set()
        gate.wait(30)

    t = threading.Thread(target=park, daemon=True)
    t.start()
    parked.wait(30)
    out = tmp_path / "dump.txt"
    try:
        with open(out, "w") as f:
            faulthandler.dump_traceback(f, all_threads=True)
    finally:
        gate.set()
        t.join(30)
    dump = out.read_text()
    by_thread = stacks.threads(dump)
    main, other = f"0x{threading.main_thread().ident:016x}", f"0x{t.ident:016x}"
    assert set(by_thread) >= {main, other}
    assert by_thread[main][0].func == "test_the_parser_reads_faulthandlers_own_dump"
    assert any(f.func == "park" for f in by_thread[other])
    text = stacks.summary(dump, main, n=1)
    assert "test_worker_stacks.py:" in text, text
    assert "in test_the_parser_reads_faulthandlers_own_dump" in text and "park" not in text.split("(and")[0]
    assert stacks.summary("", main).startswith("unknown (no stack dump came back")


@pytest.mark.parametrize("path, want", [
    ("/usr/lib/python3/dist-packages/torch/_inductor/codecache.py", "torch/_inductor/codecache.py"),
    ("/opt/venv/lib/python3.11/site-packages/triton/compiler/compiler.py", "triton/compiler/compiler.py"),
    ("/root/.pyenv/versions/3.11.7/lib/python3.11/subprocess.py", "subprocess.py"),
    ("/work/clone/faprof/variants/flex.py", "faprof/variants/flex.py"),
    ("/tmp/x/my_kernels.py", "x/my_kernels.py"),
    ("<frozen importlib._bootstrap>", "<frozen importlib._bootstrap>"),
])
def test_frames_are_named_as_a_reader_knows_the_file(path, want):
    assert stacks.short_path(path) == want
