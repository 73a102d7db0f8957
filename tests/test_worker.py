"""Fault containment: a worker that dies, hangs or loses its CUDA context is replaced; the run goes on."""

import textwrap

from faprof.run.tasks import is_fatal
from faprof.run.worker import TaskError, Worker, WorkerDied


def test_dying_worker_is_reported_and_replaced():
    with Worker() as w:
        assert w.call({"op": "ping"}, timeout_s=120) == "pong"
        try:
            w.call({"op": "die", "code": 9}, timeout_s=60)
            raise AssertionError("expected WorkerDied")
        except WorkerDied as e:
            assert "exit code 9" in str(e)
        # a fresh worker answers the next task
        assert w.call({"op": "ping"}, timeout_s=120) == "pong"


def test_hanging_worker_is_killed_after_the_timeout():
    with Worker() as w:
        w.call({"op": "ping"}, timeout_s=120)
        try:
            w.call({"op": "sleep", "seconds": 600}, timeout_s=2)
            raise AssertionError("expected WorkerDied")
        except WorkerDied as e:
            assert "no answer within 2 s" in str(e)
        assert w.call({"op": "ping"}, timeout_s=120) == "pong"
        assert w.restarts == 1


def test_ordinary_error_keeps_the_worker():
    with Worker() as w:
        w.call({"op": "ping"}, timeout_s=120)
        pid = w.proc.pid
        try:
            w.call({"op": "bogus"}, timeout_s=60)
            raise AssertionError("expected TaskError")
        except TaskError as e:
            assert "unknown task op" in str(e)
        assert w.call({"op": "ping"}, timeout_s=60) == "pong"
        assert w.proc.pid == pid


def test_fatal_cuda_messages_are_recognised():
    assert is_fatal("RuntimeError: CUDA error: an illegal memory access was encountered")
    assert is_fatal("CUDA error: unspecified launch failure")
    assert not is_fatal("RuntimeError: No available kernel. Aborting execution.")


def test_profile_run_survives_variants_that_kill_or_hang_the_worker(tmp_path):
    """End to end: user variants that os._exit and hang are 'failed'; the variants after them still run."""
    from faprof import run as runner
    from faprof import variants
    from faprof.model.scenarios import parse_scenario

    plugin = tmp_path / "bad_variants.py"
    plugin.write_text(textwrap.dedent("""
        import os, time
        from faprof.variants import user_variant
        from faprof.variants.torch_variants import standard_attention as _standard_attention

        def dies(q, k, v, causal, scale, out=None):
            os._exit(7)          # as a crashing kernel takes its process down

        def hangs(q, k, v, causal, scale, out=None):
            time.sleep(3600)

        user_variant("test_dies", dies, device="cpu", dtypes=("fp32",))
        user_variant("test_hangs", hangs, device="cpu", dtypes=("fp32",))
    """))
    variants.load_user_variants(str(plugin))  # as `faprof profile --user-variants FILE` does first
    scen = parse_scenario({
        "name": "contain", "baseline": "torch_standard",
        "variants": ["test_dies", "torch_standard", "test_hangs", "sdpa_math"],
        "problems": [{"B": 1, "H": 1, "S": 16, "D": 8, "dtype": "fp32"}],
        "timing": {"budget_s": 0.05, "min_repeats": 3, "warmup_ms": 1, "e2e_repeats": 2},
    }, "test")
    opts = runner.ProfileOptions(out_dir=tmp_path / "runs", user_variants=[str(plugin)], task_timeout_s=10,
                                 ceilings=False)
    bundle = runner.profile(scen, opts)
    df = bundle.measurements().set_index("variant")
    assert df.loc["test_dies", "status"] == "failed" and "exit code 7" in df.loc["test_dies", "reason"]
    assert df.loc["test_hangs", "status"] == "failed" and "no answer within 10 s" in df.loc["test_hangs", "reason"]
    # where it hung: the variant's own line in the reason, every stack in the run's log
    assert "bad_variants.py:10 in hangs" in df.loc["test_hangs", "reason"], df.loc["test_hangs", "reason"]
    log = "\n".join(bundle.manifest().get("log", []))
    assert "test_hangs on" in log and 'bad_variants.py", line 10 in hangs' in log
    assert df.loc["torch_standard", "status"] == "ok" and df.loc["torch_standard", "max_abs_err"] < 1e-5
    assert df.loc["sdpa_math", "status"] == "ok"
    assert bundle.manifest()["status"] == "complete"


def test_a_slow_worker_start_does_not_count_against_the_task_timeout(tmp_path):
    """The task timeout starts when the worker begins the task: a fresh worker that takes longer to
    start (imports, a loaded machine) than the task's timeout still runs it, also after a crash
    replaced it (the flake that read a crash as 'no answer within 8 s (hung?)' on 2 loaded cores)."""
    slow = tmp_path / "slow_start.py"
    slow.write_text("import time\ntime.sleep(3)\n")  # a worker start longer than the 1 s task timeout
    with Worker([str(slow)]) as w:
        assert w.call({"op": "ping"}, timeout_s=1) == "pong"
        try:
            w.call({"op": "die", "code": 7}, timeout_s=1)
            raise AssertionError("expected WorkerDied")
        except WorkerDied as e:
            assert "exit code 7" in str(e)
        assert w.call({"op": "ping"}, timeout_s=1) == "pong"  # the replacement starts slowly too
        assert w.restarts == 1


def test_a_worker_start_does_not_run_the_callers_main_script_again(tmp_path, monkeypatch):
    """spawn imports the parent's `__main__` in the child: a user's script without a main guard (or a
    host such as Streamlit that runs its script as `__main__`) would run again in every worker."""
    import sys
    import types

    marker = tmp_path / "ran"
    script = tmp_path / "user_script.py"
    script.write_text(f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n")
    fake_main = types.ModuleType("__main__")
    fake_main.__file__ = str(script)
    monkeypatch.setitem(sys.modules, "__main__", fake_main)
    with Worker() as w:
        assert w.call({"op": "ping"}, timeout_s=120) == "pong"
    assert not marker.exists(), "the worker ran the caller's script"
    assert sys.modules["__main__"] is fake_main  # restored after the start
