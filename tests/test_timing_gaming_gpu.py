"""Timing that cannot be gamed, on a GPU: each planted trick is flagged with its reason or timed in full.

Method: the variants of tests/gaming/gaming_variants.py on CUDA tensors: correct attention plus a
spin kernel of GPU_SPIN_CYCLES, moved or skipped one way each: a side stream the caller's never waits
on (a), a thread the call starts (b), work deferred to the next call (c; timed in full) or dropped
when the inputs repeat (c), an output cached by data pointer (d), the output written into q (e), an output
cached by the inputs' values (f), timed calls that skip (g, i) or halve (h) their work, and work done
on the host (j).
Each is measured by `harness.measure` with CUPTI (and the stream trick with CUDA events too, the
fallback timer that only sees the current stream) next to the honest twin `gaming_control` in the
same process. "Timed in full" is: the reported median at least HONEST_SHARE of the twin's (the
twin's CUPTI median moves by a few percent run to run); "flagged" is the flag with its reason.
scripts/gpu/gpu_timing_gaming.sh runs this file and prints the table of the same measurements.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from faprof import variants
from faprof.correctness import check as correctness
from faprof.correctness.reference import compute_reference
from faprof.model.problem import AttentionProblem
from faprof.model.settings import DEFAULT_TOLERANCE, TimingSettings
from faprof.timing import cupti_timer, harness

pytestmark = pytest.mark.gpu

GAMING = Path(__file__).parent / "gaming" / "gaming_variants.py"

QUICK = TimingSettings(warmup_ms=5, budget_s=0.3, min_repeats=10, max_repeats=200, e2e_repeats=3)
PROBLEM = AttentionProblem(B=2, H=8, Sq=512, Sk=512, D=64, dtype="fp16", causal=True)

#: A row is timed in full when its median is at least this share of the honest twin's (run-to-run
#: noise of a CUPTI median on an idle GPU is a few percent; a gamed timer reads far less).
HONEST_SHARE = 0.9


def measure(name: str, settings: TimingSettings = QUICK) -> dict:
    import torch

    variants.load_user_variants(str(GAMING))
    variants.get(name).fn.__globals__["reset"]()  # no pending work or cached output of an earlier test
    inputs = correctness.make_inputs(PROBLEM, "cuda", seed=23)
    ref = compute_reference(PROBLEM, inputs, cuda_ok=True)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    return harness.measure(variants.get(name), PROBLEM, inputs, ref, "cuda", settings,
                           DEFAULT_TOLERANCE[PROBLEM.dtype], l2_bytes=l2)


@pytest.fixture(scope="module")
def honest():
    ok, why = cupti_timer.probe()
    if not ok:
        pytest.fail(f"CUPTI timing unavailable on the GPU machine: {why}")
    row = measure("gaming_control")
    assert row["correct"] is True and row["timer"] == "cupti", row.get("timer_note")
    assert row["timing_flagged"] is False, row["timing_flag_reason"]
    return row


def _in_full(row: dict, honest: dict) -> None:
    assert row["median_ms"] >= HONEST_SHARE * honest["median_ms"], (row["median_ms"], honest["median_ms"], row["timer"])


def test_work_on_another_stream_is_counted_by_cupti(honest):
    row = measure("gaming_stream")
    assert row["correct"] is True and row["timer"] == "cupti"
    _in_full(row, honest)


def test_work_on_another_stream_is_timed_in_full_under_cuda_events(honest):
    # CUDA events on the call's stream miss work it leaves on another stream, unless that stream's work is
    # serialised before the closing event (a blocking stream behind the legacy default stream, the L2
    # flush's own work): then the events time it in full and nothing needs flagging. Either way the row
    # must hold the whole work: when the events missed it, the drained check flags the row and times it
    # drained. Seen on the H100 (2026-12-05): flagged in the gaming table's runs, not flagged in one run
    # of this test (its median was not recorded then): this test fails only if such a row is short.
    row = measure("gaming_stream", dataclasses.replace(QUICK, timer="events"))
    seen = {k: row.get(k) for k in ("timer", "median_ms", "drained_ms", "host_enqueue_ms", "timing_flag_reason")}
    _in_full(row, honest)
    if row["timing_flagged"]:
        assert "another stream" in row["timing_flag_reason"] and row["timer"] == "host_drained", seen
    else:
        assert row["timer"] == "cuda_event", seen


def test_work_in_another_thread_is_timed_in_full_and_flagged_when_it_runs_outside_the_call(honest):
    row = measure("gaming_thread")
    assert row["correct"] is True
    _in_full(row, honest)
    # a thread that launched everything inside the call's host window was counted as the call's (CUPTI's
    # fallback attribution): timed in full without a flag. One that launched after the call returned
    # (the usual case: the caller returns at once) is flagged and timed drained.
    if row["timing_flagged"]:
        assert "no call launched" in row["timing_flag_reason"] and row["timer"] == "cupti_drained"
    else:
        assert row["timer"] == "cupti"


def test_work_deferred_to_the_next_call_is_timed_in_full(honest):
    # timed in full; the fresh-input check may find the output incomplete when the call returns (then: wrong)
    row = measure("gaming_deferred")
    assert row["correct"] is True or "deferred" in row["check_reason"], row["check_reason"]
    _in_full(row, honest)


def test_work_dropped_when_the_inputs_repeat_gets_no_repeat_to_drop(honest):
    # the timed calls alternate two input sets (faprof.timing.rotation): the trick never fires in the timed
    # loop; the fresh-input check's call on the last-used tensors may still drop work (then: wrong, and why)
    row = measure("gaming_deferred_skip")
    assert row["input_sets"] == 2
    assert row["correct"] is True or "skipped when the inputs repeat" in row["check_reason"], row["check_reason"]
    _in_full(row, honest)


def test_a_result_cached_by_pointer_is_flagged_wrong(honest):
    row = measure("gaming_cache")
    assert row["timing_flagged"] is True and row["correct"] is False
    assert "returns a result of earlier inputs" in row["timing_flag_reason"]


def test_a_result_cached_by_content_is_timed_on_new_inputs(honest):
    row = measure("gaming_content_cache")
    assert row["timing_flagged"] is True and "new inputs" in row["timing_flag_reason"]
    assert row["timer"].endswith("_drained") and row["correct"] is True
    _in_full(row, honest)


def test_timed_calls_that_skip_their_work_are_wrong(honest):
    for name in ("gaming_skip_b2b", "gaming_skip_busy"):
        row = measure(name)
        assert row["correct"] is False, name
        assert ("returned the other input set's result" in row["check_reason"]
                or "output fails the check" in row["check_reason"]), (name, row["check_reason"])


def test_timed_calls_that_do_half_the_work_are_wrong(honest):
    row = measure("gaming_half_b2b")
    assert row["correct"] is False and "timed call" in row["check_reason"]


def test_a_call_computed_on_the_host_is_flagged(honest):
    row = measure("gaming_host")
    assert row["timing_flagged"] is True and "outside kernels" in row["timing_flag_reason"]
    assert row["host_ms"] > 5


def test_a_timed_call_faster_than_the_gpu_can_be_is_untrusted():
    # every call after the first does nothing, drained ones too: ~0 ms for 68.7 GFLOP, judged when the row is
    # written (faprof.rows.limits); its output check makes it wrong as well
    import torch

    from faprof.rows import limits
    from faprof.timing import env

    big = AttentionProblem(B=1, H=16, Sq=4096, Sk=4096, D=128, dtype="fp16", causal=True)
    variants.load_user_variants(str(GAMING))
    variants.get("gaming_skip_after").fn.__globals__["reset"]()
    inputs = correctness.make_inputs(big, "cuda", seed=5)
    ref = compute_reference(big, inputs, cuda_ok=True)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    row = harness.measure(variants.get("gaming_skip_after"), big, inputs, ref, "cuda", QUICK,
                          DEFAULT_TOLERANCE[big.dtype], l2_bytes=l2)
    e = env.gpu_env(0)
    row.update(status="ok" if row["correct"] else "wrong", flops=big.flops(), min_bytes=big.min_bytes(),
               dtype="fp16", gpu_name=torch.cuda.get_device_name(0))
    judged = limits.judge(row, e)
    assert judged.get("timing_flagged") is True and "physically impossible" in judged["timing_flag_reason"], row["median_ms"]


def test_output_written_into_an_input_is_flagged(honest):
    row = measure("gaming_inplace")
    assert row["timing_flagged"] is True and row["timing_flag_reason"].startswith("writes into its input q:")
