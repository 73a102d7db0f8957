"""Timing that cannot be gamed, on the CPU: each planted trick is flagged with its reason or timed in full.

Method: tests/gaming/gaming_variants.py registers test-only variants that compute correct attention
plus a 10 ms sleep (a floor no honest timer can miss, and no loaded machine can shrink) and game
the timer one way each: the work in a thread the call does not wait for (b), each call's work
deferred to the next (c, timed in full) or dropped when the inputs repeat (c), the output cached by
the inputs' data pointers (d), the output written into q (e); work on another stream (a) needs a
GPU (tests/test_timing_gaming_gpu.py). Each runs through `harness.measure` on one small problem;
the checks are on the row: the flag and its reason, the status, and the reported median against
the sleep floor (a lower bound, never a wall-clock ceiling). The runner test carries the flags
into a bundle, the report's appendix and its first-screen notes. The decision rules and the CUPTI
attribution of kernels no call launched are tested on synthetic records.
"""

from __future__ import annotations

import types
from pathlib import Path

import pytest

from faprof import variants
from faprof.correctness import check as correctness
from faprof.correctness.reference import compute_reference
from faprof.model.problem import AttentionProblem
from faprof.model.settings import DEFAULT_TOLERANCE, TimingSettings
from faprof.timing import cupti_timer, harness, integrity

GAMING = Path(__file__).parent / "gaming"

QUICK = TimingSettings(warmup_ms=0, budget_s=0.05, min_repeats=3, max_repeats=5, e2e_repeats=1)
PROBLEM = AttentionProblem(B=2, H=2, Sq=64, Sk=64, D=32, dtype="fp32", causal=True)


def _measure(name: str, problem: AttentionProblem = PROBLEM) -> dict:
    variants.load_user_variants(str(GAMING / "gaming_variants.py"))  # a fresh module: no pending work, no cache
    inputs = correctness.make_inputs(problem, "cpu", seed=11)
    ref = compute_reference(problem, inputs, cuda_ok=False)
    return harness.measure(variants.get(name), problem, inputs, ref, "cpu", QUICK, DEFAULT_TOLERANCE[problem.dtype])


def _floor_ms() -> float:
    import sys

    sys.path.insert(0, str(GAMING))
    import gaming_variants

    return gaming_variants.CPU_WORK_S * 1e3


def test_the_honest_twin_is_not_flagged_and_is_timed_above_its_floor():
    row = _measure("gaming_control")
    assert row["correct"] is True and row["timer"] == "host"
    assert row["timing_flagged"] is False and row["timing_flag_reason"] is None
    assert row["median_ms"] >= _floor_ms()


def test_work_in_a_thread_the_call_leaves_running_is_flagged_and_timed_drained():
    row = _measure("gaming_thread")
    assert row["correct"] is True  # the check joins the call's threads before it reads the output
    assert row["timing_flagged"] is True
    assert "returned with a thread of theirs still running" in row["timing_flag_reason"]
    assert row["timer"] == "host_drained" and "timed drained" in row["timer_note"]
    assert row["median_ms"] >= _floor_ms()  # every sample waited for the thread's work


def test_threads_left_by_earlier_calls_cannot_overwrite_the_checked_call(monkeypatch):
    """A call whose thread writes the shared output buffer after a jittered delay: threads of earlier timed
    calls (the other input set) could finish after the checked call's and leave their answer in the buffer.
    The checks wait for every thread the timed calls left before the checked call (seen as a flaky wrong row
    under the full suite on 2 cores before they did)."""
    import threading
    import time

    sys_path = str(GAMING)
    monkeypatch.syspath_prepend(sys_path)
    import gaming_variants as g

    calls = [0]

    def late(q, k, v, causal, scale, out=None):
        out = g._out(q, out)

        def write(delay: float) -> None:
            time.sleep(delay)
            g.work(q, k, v, causal, scale, out)

        # the earliest calls' threads write last: the timed loop's still write after the checked call's returned
        delay = max(0.0, 0.12 - 0.02 * calls[0])
        calls[0] += 1
        threading.Thread(target=write, args=(delay,), daemon=True).start()
        return out

    variants.register(variants.Variant("gaming_thread_late", "user", "TEST ONLY: a thread writing late", late,
                                       dtypes=("fp32",), directions=("fwd",), hidden=True, tags=("test",)),
                      replace=True)
    real_snapshot = correctness.snapshot

    def slow_snapshot(problem, result):  # a loaded machine: the copy of the checked outputs takes a while
        time.sleep(0.05)
        return real_snapshot(problem, result)

    monkeypatch.setattr(correctness, "snapshot", slow_snapshot)
    for _ in range(3):
        calls[0] = 0
        inputs = correctness.make_inputs(PROBLEM, "cpu", seed=11)
        ref = compute_reference(PROBLEM, inputs, cuda_ok=False)
        row = harness.measure(variants.get("gaming_thread_late"), PROBLEM, inputs, ref, "cpu", QUICK,
                              DEFAULT_TOLERANCE[PROBLEM.dtype])
        assert row["correct"] is True, row["check_reason"]
        assert row["timing_flagged"] is True and row["median_ms"] >= g.CPU_WORK_S * 1e3


def test_work_deferred_to_the_next_call_is_timed_in_full():
    row = _measure("gaming_deferred")
    assert row["correct"] is True and row["timing_flagged"] is False
    assert row["median_ms"] >= _floor_ms()  # each call does the previous call's work


def test_work_dropped_when_the_inputs_repeat_gets_no_repeat_to_drop():
    # the timed calls alternate two input sets (faprof.timing.rotation): no call repeats the last one's
    # tensors, so the trick never fires and every call is timed in full
    row = _measure("gaming_deferred_skip")
    assert row["input_sets"] == 2
    assert row["median_ms"] >= _floor_ms()
    assert row["correct"] is True and row["timing_flagged"] is False


def test_a_result_cached_by_pointer_is_flagged_wrong():
    row = _measure("gaming_cache")
    assert row["timing_flagged"] is True and row["correct"] is False
    assert "returns a result of earlier inputs" in row["timing_flag_reason"]
    assert "cache keyed by pointer" in row["check_reason"]


def test_a_result_cached_by_content_is_timed_on_new_inputs():
    # a cache keyed by the inputs' values serves both timed input sets; calls on new inputs cannot be served
    row = _measure("gaming_content_cache")
    assert row["correct"] is True and row["timing_flagged"] is True
    assert "isolated calls on new inputs" in row["timing_flag_reason"]
    assert "result cached from earlier inputs" in row["timing_flag_reason"]
    assert row["timer"] == "host_drained" and row["median_ms"] >= _floor_ms()


def test_timed_calls_that_skip_their_work_are_wrong():
    # back-to-back calls (the timing loop's) leave the output buffer as the previous call left it: the
    # other input set's answer, which the check of the timed calls names; or, when even the first call on
    # the buffer came right after another call (a loaded machine), what the buffer held before: a failed check
    row = _measure("gaming_skip_b2b")
    assert row["correct"] is False and row["timed_checked"] >= 1
    assert ("returned the other input set's result" in row["check_reason"]
            or "output fails the check" in row["check_reason"]), row["check_reason"]


def test_timed_calls_that_do_half_the_work_are_wrong():
    row = _measure("gaming_half_b2b")
    assert row["correct"] is False
    assert "timed call" in row["check_reason"] and "fails the check" in row["check_reason"]


def test_honest_timed_calls_are_checked_on_both_input_sets():
    row = _measure("gaming_control")
    assert row["input_sets"] == 2 and row["timed_checked"] >= 1 and row["repeatable"] is True


def test_output_written_into_an_input_is_flagged():
    row = _measure("gaming_inplace")
    assert row["timing_flagged"] is True
    assert row["timing_flag_reason"].startswith("writes into its input q:")
    assert "repeatable" not in row and row["correct"] is True  # timed outputs of changed inputs are not compared as a race test


def test_a_torch_variant_is_not_flagged():
    variants.load_user_variants(str(GAMING / "gaming_variants.py"))
    inputs = correctness.make_inputs(PROBLEM, "cpu", seed=3)
    ref = compute_reference(PROBLEM, inputs, cuda_ok=False)
    row = harness.measure(variants.get("torch_standard"), PROBLEM, inputs, ref, "cpu", QUICK, DEFAULT_TOLERANCE["fp32"])
    assert row["correct"] is True and row["timing_flagged"] is False


# ------------------------------------------------------------------ rules on synthetic records
def _drain(method: str, drained, own=(), outside=0, stray=0.0, threads=0) -> integrity.Drain:
    return integrity.Drain(method, list(drained), list(own), outside, stray, threads)


def test_cupti_rule_flags_kernels_no_call_launched_and_only_those():
    assert integrity.missed_work(_drain("cupti", [1.0] * 5, [1.0] * 5), 1.0, "cupti") is None
    why = integrity.missed_work(_drain("cupti", [1.5] * 5, [1.0] * 5, outside=5, threads=5), 1.0, "cupti")
    assert why and "5 kernel(s) that no call launched" in why and "0.5 ms per call" in why
    assert "5 of 5 drained calls returned with a thread" in why
    # kernels between the drained calls, or during the timed loop, count too
    assert integrity.missed_work(_drain("cupti", [1.0] * 5, [1.0] * 5, outside=5, stray=2.5), 1.0, "cupti")
    assert integrity.missed_work(_drain("cupti", [1.0] * 5, [1.0] * 5), 1.0, "cupti", loop_outside_ms=0.3)
    # below OUTSIDE_REL of the call and OUTSIDE_ABS_MS: noise (a library's one-off tiny kernel)
    assert integrity.missed_work(_drain("cupti", [1.001] * 5, [1.0] * 5, outside=1), 1.0, "cupti") is None


def test_events_rows_are_checked_against_the_whole_device():
    # CUPTI sees the side stream's kernels that the current stream's events never waited for
    why = integrity.missed_work(_drain("cupti", [2.0] * 5, [2.0] * 5), 0.01, "cuda_event")
    assert why and "another stream" in why
    assert integrity.missed_work(_drain("cupti", [2.0] * 5, [2.0] * 5), 2.0, "cuda_event") is None
    # without CUPTI: the host clock to a drained device, less the enqueue cost
    assert integrity.missed_work(_drain("host", [2.0] * 5), 0.01, "cuda_event", enqueue_ms=0.02)
    assert integrity.missed_work(_drain("host", [0.06] * 5), 0.01, "cuda_event", enqueue_ms=0.05) is None


def test_cpu_rows_need_a_thread_left_running_or_every_new_input_call_far_slower():
    # a loaded CPU's clock moves by more than HOST_GAP_FACTOR: a gap under ALONE_HOST_FACTOR never flags a CPU row
    assert integrity.missed_work(_drain("host", [25.0] * 5), 10.0, "host") is None
    assert integrity.missed_work(_drain("host", [50.0, 50.0, 25.0]), 10.0, "host") is None  # one call within it
    why = integrity.missed_work(_drain("host", [50.0] * 5, threads=5), 0.2, "host")
    assert why and "goes on 50 ms" in why
    why = integrity.missed_work(_drain("host", [50.0] * 5), 10.0, "host")
    assert why and "isolated calls on new inputs" in why and "5x slower" in why


def test_cupti_rule_flags_timed_calls_faster_than_calls_on_new_inputs():
    # isolated calls on new inputs take their own kernels' time; the timed loop, on inputs seen before, less
    assert integrity.missed_work(_drain("cupti", [1.0] * 5, [1.0] * 5), 0.9, "cupti") is None  # noise
    assert integrity.missed_work(_drain("cupti", [0.4] * 5, [0.4] * 5), 0.2, "cupti")
    # one slow isolated call is not enough: the fastest must be slower too
    assert integrity.missed_work(_drain("cupti", [2.0, 2.0, 2.0, 1.0, 1.0], [2.0, 2.0, 2.0, 1.0, 1.0]), 1.0, "cupti") is None
    # microsecond kernels: ALONE_ABS_MS of slack
    assert integrity.missed_work(_drain("cupti", [0.0075] * 5, [0.0075] * 5), 0.005, "cupti") is None


def test_cupti_collect_separates_the_harness_the_calls_and_kernels_no_call_launched():
    """collect() on records as CUPTI delivers them: the flush and lead (tagged HARNESS_ID) belong to
    nobody, a kernel launched inside call 1 is its, and one with no link and no launch in a call's
    host window is work outside the calls."""
    c = cupti_timer._COLLECTOR
    c.take()
    timer = object.__new__(cupti_timer.KernelTimer)
    timer._cupti = types.SimpleNamespace(activity_flush_all=lambda _: None)
    timer._windows = [(100, 200, 1)]
    sig = ("k", "1,1,1", "32,1,1", 40, 0)
    c.kernels = [(10, 150, 160, sig), (11, 90, 99, sig), (12, 300, 340, sig), (13, 170, 180, sig)]
    c.links = {10: 1, 11: cupti_timer.HARNESS_ID}
    c.api = {13: 120}  # launched from another thread inside call 1's host window: call 1's
    got = timer.collect()
    assert set(got) == {1} and got[1].kernels == 2 and got[1].sum_ns == 20 and got[1].sig == (sig, sig)
    assert timer.last_unlinked == [(300, 340)]
    assert timer.last_counts["unlinked"] == 1


# ------------------------------------------------------------------ through the runner and the report
@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    from faprof.run import ProfileOptions, profile

    out = tmp_path_factory.mktemp("runs")
    options = ProfileOptions(out_dir=out, isolate=False, ceilings=False,
                             user_variants=[str(GAMING / "gaming_variants.py")])
    return profile(GAMING / "gaming_cpu.toml", options)


def test_the_bundle_and_the_report_show_every_flag(bundle):
    from faprof.report import appendix as _  # noqa: F401  (the report package loads its sections)
    from faprof.report import observations, table_text
    from faprof.report.writer import render_appendix

    df = bundle.measurements()
    flagged = set(df[df["timing_flagged"].fillna(False).astype(bool)]["variant"])
    assert flagged == {"gaming_thread", "gaming_cache", "gaming_inplace", "gaming_content_cache", "gaming_skip_b2b",
                       "gaming_half_b2b"}
    assert not df[~df["variant"].isin(flagged)]["timing_flagged"].fillna(False).astype(bool).any()
    assert set(df[df["status"] == "wrong"]["variant"]) == {"gaming_cache", "gaming_skip_b2b", "gaming_half_b2b"}
    text = render_appendix(bundle)
    assert "Flagged timings" in text and "returns a result of earlier inputs" in text
    assert "gaming_thread ⚑ timing flagged" in table_text.md_table(table_text.results_frame(df))
    note = [n for n in observations.notes(df) if "flagged timings" in n]
    assert note and "gaming_cache (1)" in note[0]
