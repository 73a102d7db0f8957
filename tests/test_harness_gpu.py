"""The harness on a real GPU: CUPTI kernel time, the clean flush, races and the clock record."""

from __future__ import annotations

import pytest
from testonly import TESTONLY_VARIANTS

from faprof import variants
from faprof.correctness import check as correctness
from faprof.correctness.reference import compute_reference
from faprof.model.problem import AttentionProblem
from faprof.model.settings import DEFAULT_TOLERANCE, TimingSettings
from faprof.timing import cupti_timer, gpu_clock, harness

pytestmark = pytest.mark.gpu

QUICK = TimingSettings(warmup_ms=5, budget_s=0.3, min_repeats=10, max_repeats=200, e2e_repeats=3)


def _measure(name: str, problem: AttentionProblem, settings: TimingSettings = QUICK, monitor=None):
    import torch

    from faprof.variants import build

    v = variants.get(name)
    if v.needs_extension:
        build.load()
    inputs = correctness.make_inputs(problem, "cuda", seed=17)
    ref = compute_reference(problem, inputs, cuda_ok=True)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    return harness.measure(v, problem, inputs, ref, "cuda", settings, DEFAULT_TOLERANCE[problem.dtype],
                           l2_bytes=l2, monitor=monitor)


def test_a_racy_kernel_is_wrong_and_its_atomic_twin_is_right():
    p = AttentionProblem(B=2, H=4, Sq=512, Sk=512, D=64, dtype="fp32", causal=False)
    variants.load_user_variants(str(TESTONLY_VARIANTS))  # tests/kernels/race.cu, its own extension
    good = _measure("_race_atomic", p)
    assert good["correct"] is True, good.get("check_reason")
    bad = _measure("_race_plain", p)
    assert bad["correct"] is False
    assert bad["check_reason"]


def test_cupti_times_kernels_and_events_read_higher_on_tiny_calls():
    ok, why = cupti_timer.probe()
    if not ok:
        pytest.fail(f"CUPTI timing unavailable on the GPU machine: {why}")
    p = AttentionProblem(B=1, H=1, Sq=128, Sk=128, D=64, dtype="fp16", causal=True)
    from faprof.timing.gpu_monitor import Monitor

    row = _measure("sdpa_flash", p, monitor=Monitor.open())
    assert row["timer"] == "cupti", row["timer_note"]
    assert row["kernels_per_call"] >= 1
    # a ~5 us kernel: the event pair carries its few-us floor on top of the kernel's duration
    assert row["median_ms"] < row["event_ms"]
    assert row["span_ms"] >= row["median_ms"] * 0.999
    assert row["ci95_low_ms"] <= row["median_ms"] <= row["ci95_high_ms"]
    assert row["n"] >= QUICK.min_repeats_short
    assert 200 < row["sm_clock_mhz"] < 4000
    assert row["nvml"] == "ok" and row["temp_c_before"] is not None


def test_events_fallback_when_asked():
    p = AttentionProblem(B=1, H=2, Sq=256, Sk=256, D=64, dtype="fp16")
    import dataclasses

    row = _measure("sdpa_flash", p, dataclasses.replace(QUICK, timer="events"))
    assert row["timer"] == "cuda_event" and "events requested" in row["timer_note"]
    assert row["median_ms"] == pytest.approx(row["event_ms"], rel=1e-9)


def test_a_multi_kernel_call_sums_its_kernels():
    p = AttentionProblem(B=2, H=4, Sq=256, Sk=256, D=64, dtype="fp16", causal=True)
    row = _measure("torch_standard", p)
    assert row["timer"] == "cupti", row["timer_note"]
    assert row["kernels_per_call"] >= 3  # matmul, mask/softmax, matmul
    assert row["span_ms"] >= row["median_ms"]


def test_flush_leaves_no_data_of_the_call_in_l2():
    import torch

    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    x = torch.randn(l2 // 32, device="cuda")  # x and y are an eighth of the L2 each: warm, both stay in it
    y = torch.empty_like(x)
    f = gpu_clock.L2Flusher(l2)
    timer = cupti_timer.KernelTimer.open()
    try:
        def once(flush: bool) -> float:
            torch.add(x, 1.0, out=y)  # a kernel (copy_ would be a memcpy, not a kernel record)
            torch.cuda.synchronize()
            if flush:
                f()
            (cid,) = timer.new_ids(1)
            with timer.call(cid):
                torch.add(x, 1.0, out=y)
            torch.cuda.synchronize()
            return timer.collect(expect=[cid])[cid].sum_ns

        warm = sorted(once(False) for _ in range(20))[10]
        cold = sorted(once(True) for _ in range(20))[10]
    finally:
        timer.close()
    assert cold > 1.2 * warm  # from DRAM after the flush, from L2 without it
