"""The measuring harness: correctness against a reference first (faprof.correctness), then timing.

GPU time per call (the `median_ms` of every GPU row) is the time the call's kernels run (the union
of their intervals: the sum of their durations unless they overlap, faprof.rows.intervals)
from CUPTI activity records (faprof.cupti_timer), kernels attributed to calls by correlation id;
the first-start to last-end span is kept beside it (`span_ms`). CUDA events around each call are
kept as call latency (`event_ms`), and are the fallback timer where CUPTI cannot be used (the row's
`timer` and `timer_note` say which and why). Around the timed calls:

- Warm-up: at least 3 calls and `warmup_ms` of wall time.
- Before every repeat, outside the timed region: a flush that leaves the L2 clean (write a buffer
  of 2x the L2 size, then read a second 2x buffer, so no line of the call's data and no dirty line
  is left for the call to write back), then a GPU-side spin (`torch.cuda._sleep`) longer than the
  host needs to enqueue the call, so the GPU is busy when the start event records and the call's
  kernels run back to back as they would in a busy program.
- Repeats go on until the 95% CI of the median (distribution-free, faprof.stats) is within
  `target_rel_ci` of the median (at least `min_repeats`, `min_repeats_short` for calls under
  `short_call_ms`), or the budget runs out. All samples are kept. CPU variants stop on
  `target_rel_ci_host` (2%): host-clock times of a CPU call vary by more than 0.5% run to run.
- Per row: SM clock during the timed calls (GPU cycles of a spin per µs, calibrated right after
  them), temperature, and NVML throttle reasons before, between batches and after (faprof.gpu_monitor);
  rows timed while a slowdown reason was active are flagged `throttled`.
- Also measured: host-clock end-to-end latency (call + synchronize), the host's enqueue cost, a
  CUDA-graph replay figure for short calls, and the peak memory of one call. CPU variants use the
  host clock.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from faprof.correctness import adversarial, signatures, wrong_text
from faprof.correctness import check as correctness
from faprof.correctness.check import Inputs
from faprof.correctness.reference import Reference
from faprof.model.problem import AttentionProblem
from faprof.model.settings import DEFAULT_TOLERANCE, TimingSettings, Tolerance
from faprof.rows import limits, stability, stats
from faprof.timing import integrity, rotation
from faprof.timing.cupti_timer import CuptiUnavailable, KernelTimer, common_sig
from faprof.timing.gpu_clock import (
    ENQUEUE_BLOCKED_SHARE,
    ENQUEUE_SPIN_US,
    LEAD_FACTOR,
    LEAD_MIN_US,
    L2Flusher,
    cycles_per_us,
    host_enqueue_ms,
    peak_memory,
    sm_clock_mhz,
    time_e2e,
    time_graph,
)

#: Calls shorter than this are launch-bound enough that a CUDA-graph replay figure is worth
#: reporting next to the kernel time (launch overhead is a few microseconds per kernel).
GRAPH_WORTHY_MS = 1.0

#: Host-clock CPU calls slower than this get only 3 timed repeats minimum (each is seconds).
SLOW_CPU_CALL_S = 0.5

#: A batch's CUPTI records must cover at least this share of its calls, else the row falls back
#: to CUDA events (a call that launched no kernel has no GPU time to report).
CUPTI_MIN_COVERAGE = 0.9


def _open_timer(settings: TimingSettings) -> tuple[Any, str]:
    """(KernelTimer or None, note): CUPTI unless the settings say events or CUPTI is unavailable."""
    if settings.timer == "events":
        return None, "CUDA events requested (timing.timer = 'events')"

    try:
        return KernelTimer.open(), ""
    except CuptiUnavailable as e:
        return None, f"CUPTI unavailable: {e}"


#: Warm-up stops after this many calls even when `warmup_ms` has not passed (a call of a few
#: microseconds would otherwise make tens of thousands of calls in a long warm-up).
WARMUP_MAX_CALLS = 10_000

#: Timed calls in the first batch: few, so a slow call cannot spend the budget before the first
#: look at the stop rule; each later batch doubles, up to MAX_BATCH.
FIRST_BATCH = 10

#: The most timed calls between two looks at the stop rule.
MAX_BATCH = 100


@dataclass
class _CudaSamples:
    """The samples of one `time_cuda`: CUPTI kernel time (while the timer lasts) and CUDA events."""

    timer: Any
    """The KernelTimer, or None once events are the timer (asked for, unavailable, or fallen back)."""
    note: str
    """Why events are the timer ('' with CUPTI)."""
    kernel: list[float] = field(default_factory=list)
    span: list[float] = field(default_factory=list)
    nkern: list[int] = field(default_factory=list)
    event: list[float] = field(default_factory=list)
    last: Any = None
    """The last timed call's result (its outputs are copied when it is one of the checked calls)."""
    outside_ns: int = 0
    """Durations of kernels linked to no call and not to the harness, over the timed loop (CUPTI)."""
    calls: int = 0
    """Timed calls while CUPTI recorded (for `outside_ns` per call)."""
    rot: Any = None
    """The timed call's `rotation.Rotation` (which input set each call used), or None."""
    snap: Callable[[Any], list[Any]] | None = None
    """Copies a call's outputs (`correctness.snapshot`); None: no timed call is checked."""
    checks: list[tuple[int, int, list[Any]]] = field(default_factory=list)
    """(call number, input set, copies of its outputs) of the timed calls chosen to be checked."""
    sigs: list[Any] = field(default_factory=list)
    """The kernel signatures (`cupti_timer.KernelSig` tuples) of the first batch's calls."""
    batches: int = 0
    left: list[Any] = field(default_factory=list)
    """Python threads timed calls left running (an honest call leaves none): joined before a checked call,
    so no earlier call's thread writes the shared output buffer after the checked call's."""

    def primary(self) -> list[float]:
        """The samples the statistics are of: kernel time with CUPTI, else the events'."""
        return self.kernel if self.timer is not None else self.event


def probe_checker(variant: Any, device: str, tol: Tolerance) -> Callable[..., dict[str, Any]]:
    """check(probe, inputs, reference) for `adversarial.run`: the correctness check on a probe, each
    output's atol and eps raised by the rounding error an exact kernel may have on the probe's inputs
    beyond PyTorch's (`adversarial.rounding_slack`)."""

    def check(pr: adversarial.Probe, inp: adversarial.ProbeInputs, rf: Any) -> dict[str, Any]:
        slack = adversarial.rounding_slack(pr.problem, inp)
        ptol = dataclasses.replace(tol, output_slack=tuple(sorted(slack.items())))
        return correctness.check_correctness(variant, pr.problem, inp, rf, device, ptol, check_input=pr.name)

    return check


def time_cuda(fn: Callable[[], Any], settings: TimingSettings, flusher: L2Flusher | None,
              monitor: Any = None, snap: Callable[[Any], list[Any]] | None = None) -> dict[str, Any]:
    """Kernel time (CUPTI) and call latency (events) of `fn` with warm-up, clean-L2 flush, a
    GPU-side lead and adaptive repeats on the median's CI.

    Args:
        fn: one call of the variant (inputs bound); a `rotation.Rotation` alternates input sets, and
            its `fresh` inputs feed the drained calls.
        settings: the scenario's timing settings.
        flusher: the L2 flush run before every timed call (None: no flush).
        monitor: a GPU monitor read after every batch (None: none).
        snap: copies a call's outputs; with it, a few timed calls chosen at random have their outputs
            copied right after the call, outside the timed interval (`checks`).

    Returns:
        The samples and their statistics, the stop reason, the timer used and why, the side figures
        (enqueue cost, event and span medians, kernels per call, SM clock), the checked timed calls
        (`checks`: (call number, input set, outputs)) and the calls' kernel signature. Times in ms.
    """
    _warm_up(fn, settings.warmup_ms)
    enqueue_ms = host_enqueue_ms(fn)
    lead_cycles = int(cycles_per_us() * (LEAD_MIN_US + LEAD_FACTOR * enqueue_ms * 1e3))
    smp = _CudaSamples(*_open_timer(settings))
    smp.rot = fn if isinstance(fn, rotation.Rotation) else None
    smp.snap = snap
    batch = FIRST_BATCH
    start_wall = time.perf_counter()
    stop_reason = "max_repeats"
    flag: dict[str, Any] | None = None
    try:
        while len(smp.event) < settings.max_repeats:
            batch = min(batch, settings.max_repeats - len(smp.event))
            _timed_batch(fn, batch, smp, flusher, lead_cycles)
            if monitor is not None:
                monitor.read()
            reason = _stop_reason(smp.primary(), settings, start_wall)
            if reason:
                stop_reason = reason
                break
            batch = min(MAX_BATCH, batch * 2)
        used, primary = ("cupti" if smp.timer is not None else "cuda_event"), smp.primary()
        if smp.timer is None and settings.timer != "events":
            smp.timer, _ = _open_timer(settings)  # the loop fell back to events: CUPTI may still see the whole device
        # drained calls (faprof.timing.integrity), each on inputs no call has seen: GPU work the loop missed, or a
        # loop faster than calls on new inputs, makes the row timed again drained
        fresh = smp.rot.fresh if smp.rot is not None else None
        d = integrity.drain(fn, smp.timer, flusher, fresh)
        # a drained call's host time less its enqueue cost is its GPU work; an enqueue that waited for
        # the GPU is not host cost, and subtracting it hid a side stream's whole kernel time (H100,
        # gaming_stream under CUDA events: 0.75 ms drained, 0.002 ms timed, not flagged, 2026-11-27)
        host_cost = enqueue_ms if enqueue_ms < ENQUEUE_BLOCKED_SHARE * ENQUEUE_SPIN_US / 1e3 else 0.0
        primary, flag = integrity.retime_if_missed(d, fn, smp.timer, flusher, primary, used,
                                                   lambda xs, t0: _stop_reason(xs, settings, t0), settings.max_repeats,
                                                   smp.outside_ns / 1e6 / max(1, smp.calls), host_cost, fresh)
        if flag is not None:
            used, stop_reason = flag["timer"], flag["stop"]
    finally:
        if smp.timer is not None:
            smp.timer.close()
    clock = sm_clock_mhz()
    return {"samples": primary, "stats": stats.summarize(primary), "stop": stop_reason, "timer": used,
            "timer_note": "; ".join(x for x in (flag["note"] if flag else "", smp.note) if x), "host_enqueue_ms": enqueue_ms,
            "event_ms": statistics.median(smp.event), "span_ms": statistics.median(smp.span) if smp.span else None,
            "kernels_per_call": statistics.median(smp.nkern) if smp.nkern else None,
            "sm_clock_mhz": clock, "timing_flag": flag["reason"] if flag else None,
            "drained_ms": d.median_ms, "checks": smp.checks, "kernel_sig": common_sig(smp.sigs)}


def _warm_up(fn: Callable[[], Any], warmup_ms: float) -> None:
    """At least 3 synchronized calls and `warmup_ms` of wall time (at most WARMUP_MAX_CALLS calls)."""
    import torch

    t0 = time.perf_counter()
    calls = 0
    while calls < 3 or (time.perf_counter() - t0) * 1e3 < warmup_ms:
        fn()
        calls += 1
        torch.cuda.synchronize()
        if calls >= WARMUP_MAX_CALLS:
            break


def _timed_batch(fn: Callable[[], Any], n: int, smp: _CudaSamples, flusher: L2Flusher | None,
                 lead_cycles: int) -> None:
    """`n` timed calls, each after a flush and a GPU-side lead; their samples added to `smp`. The
    outputs of a few calls chosen at random (`_chosen`) are copied right after the call, outside the
    timed interval, into `smp.checks`.

    A batch whose CUPTI records cover less than CUPTI_MIN_COVERAGE of its calls closes the timer:
    from then on (and for the whole row) CUDA events are the timer, and `smp.note` says why.
    """
    import torch

    evs = []
    ids = smp.timer.new_ids(n) if smp.timer is not None else [0] * n
    chosen = rotation.chosen(n, smp.batches, len(smp.checks), smp.rot.sets if smp.rot is not None else 1) \
        if smp.snap is not None else set()
    first = len(smp.event)
    smp.batches += 1
    for j, cid in enumerate(ids):
        if j in chosen:  # outside the timed interval; a no-op unless earlier calls left threads running
            correctness.join_threads(smp.left)
            smp.left = []
        with smp.timer.harness() if smp.timer is not None else contextlib.nullcontext():
            if flusher is not None:
                flusher()
            torch.cuda._sleep(lead_cycles)
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        with correctness.NewThreads() as th:  # host-side only: which Python threads the call left running
            if smp.timer is not None:
                with smp.timer.call(cid):
                    smp.last = fn()
            else:
                smp.last = fn()
        e.record()
        evs.append((s, e))
        smp.left.extend(th.left)
        if j in chosen and smp.snap is not None:
            # the call's output once everything it started has finished (as the checked call is read)
            th.join()
            torch.cuda.synchronize()
            with smp.timer.harness() if smp.timer is not None else contextlib.nullcontext():
                smp.checks.append((first + j, smp.rot.last if smp.rot is not None else 0, smp.snap(smp.last)))
    torch.cuda.synchronize()
    smp.event.extend(s.elapsed_time(e) for s, e in evs)
    if smp.timer is None:
        return
    got = smp.timer.collect(expect=ids)
    seen = [got[i] for i in ids if i in got]
    if len(seen) < CUPTI_MIN_COVERAGE * len(ids):
        smp.note = (f"CUPTI recorded kernels for {len(seen)} of {len(ids)} calls "
                    f"(records: {smp.timer.last_counts}); CUDA events used")
        smp.timer.close()
        smp.timer = None
        smp.kernel, smp.span, smp.nkern = [], [], []
    else:
        smp.outside_ns += sum(e - s for s, e in smp.timer.last_unlinked)
        smp.calls += len(ids)
        smp.kernel.extend(c.sum_ns / 1e6 for c in seen)
        smp.span.extend(c.span_ns / 1e6 for c in seen)
        smp.nkern.extend(c.kernels for c in seen)
        if smp.batches == 1:
            smp.sigs = [c.sig for c in seen]


def _stop_reason(primary: list[float], settings: TimingSettings, start_wall: float) -> str | None:
    """'converged' (the median's CI is narrow enough), 'budget' (time is up), or None: time more calls."""
    st = stats.summarize(primary)
    enough = stats.enough_samples(st["n"], st["median"], settings.min_repeats, settings.min_repeats_short,
                                  settings.short_call_ms)
    if enough and st["rel_ci"] <= settings.target_rel_ci:
        return "converged"
    if time.perf_counter() - start_wall > settings.budget_s and enough:
        return "budget"
    return None


def time_host(fn: Callable[[], Any], settings: TimingSettings, sync: Callable[[], None] | None = None,
              snap: Callable[[Any], list[Any]] | None = None) -> dict[str, Any]:
    """Host-clock timing (CPU variants): the same statistics with time.perf_counter. With `fn` a
    `rotation.Rotation`, calls alternate input sets and the drained calls run on new inputs; with
    `snap`, the last timed call's outputs are copied for the check (`checks`)."""
    def once() -> tuple[float, Any]:
        t = time.perf_counter()
        r = fn()
        if sync:
            sync()
        return (time.perf_counter() - t) * 1e3, r

    with correctness.NewThreads() as loop:  # threads the timed calls leave running (an honest call: none)
        first, _ = once()  # warm-up, and a measure of how slow a call is
        min_rep = settings.min_repeats if first / 1e3 < SLOW_CPU_CALL_S else 3
        samples: list[float] = []
        start = time.perf_counter()
        stop = "max_repeats"
        check_at = min_rep
        while len(samples) < settings.max_repeats:
            ms, _ = once()
            samples.append(ms)
            if len(samples) >= check_at:
                # the stop rule's statistics cost ~1 ms (scipy's quantile test): evaluate them as the
                # sample grows by a tenth, not after every sub-millisecond CPU call
                check_at = len(samples) + max(1, len(samples) // 10)
                st = stats.summarize(samples)
                if st["rel_ci"] <= settings.target_rel_ci_host:
                    stop = "converged"
                    break
                if time.perf_counter() - start > settings.budget_s:
                    stop = "budget"
                    break
    rot = fn if isinstance(fn, rotation.Rotation) else None
    checks = []
    # calls like the timed ones, one on each input set (one for a slow call), each read once everything it
    # started has finished, after every thread the timed calls left running has (none would write the shared
    # output buffer after the checked call's)
    loop.join()
    if snap is not None:
        for j in range(min(rot.sets if rot else 1, 1 if first / 1e3 >= SLOW_CPU_CALL_S else 2)):
            r, _ = correctness.call_drained(fn)
            checks.append((len(samples) + j, rot.last if rot else 0, snap(r)))
    fresh = rot.fresh if rot is not None else None
    # drained calls on new inputs: a call that hands its work to a thread, or a loop on inputs seen before that
    # is much faster than a call on new ones (integrity.missed_work); the probe's others only when one tells
    quick = first / 1e3 < SLOW_CPU_CALL_S
    d = integrity.drain_host(fn, None, 1, cuda=False, fresh=fresh)
    if quick and (d.threads or integrity.alone_slower_host(d, statistics.median(samples))):
        d = integrity.drain_host(fn, None, integrity.PROBE_CALLS, cuda=False, fresh=fresh)
    samples, flag = integrity.retime_if_missed(d, fn, None, None, samples, "host",
                                               lambda xs, t0: _host_stop(xs, settings, t0), settings.max_repeats,
                                               fresh=fresh)
    out = {"timer": "host", "timer_note": "", "timing_flag": None, "drained_ms": d.median_ms}
    if flag is not None:
        stop = flag["stop"]
        out.update(timer=flag["timer"], timer_note=flag["note"], timing_flag=flag["reason"])
    return {"samples": samples, "stats": stats.summarize(samples), "stop": stop,
            "checks": checks, **out}


def _host_stop(samples: list[float], settings: TimingSettings, start: float) -> str | None:
    """The CPU rows' stop rule on `samples` (for drained re-timing)."""
    st = stats.summarize(samples)
    if len(samples) >= 3 and st["rel_ci"] <= settings.target_rel_ci_host:
        return "converged"
    if time.perf_counter() - start > settings.budget_s and len(samples) >= 3:
        return "budget"
    return None


def measure(variant, problem: AttentionProblem, inputs: Inputs, ref: Reference | None, device: str,
            settings: TimingSettings, tol: Tolerance | None = None, l2_bytes: int = 0,
            flusher: L2Flusher | None = None, do_timing: bool = True, monitor: Any = None,
            probes: adversarial.ProbeSet | None = None) -> dict[str, Any]:
    """Check then time one variant on one problem. Returns the measurement fields of a row.

    With `probes` (the problem's adversarial inputs, faprof.correctness.adversarial), the variant is
    also checked on each of them; a wrong one makes the row wrong and is named in `check_input`.
    Wrong rows carry their error maps and bug signatures (faprof.correctness.wrong_text.row_fields).

    Raises whatever the variant raises; the caller turns that into status 'failed' or 'unsupported'.
    """
    tol = tol or DEFAULT_TOLERANCE[problem.dtype]
    row: dict[str, Any] = {"device": device, "seed": inputs.seed}
    checked_outputs = None
    if ref is not None:
        checked_outputs = _check(row, variant, problem, inputs, ref, device, tol, probes)
    written, randn_ok = row.pop("_written", []), row.pop("_randn_ok", False)
    if not do_timing:
        return row
    with correctness.NewThreads() as th:
        res, st, (ts, out) = _time(row, variant, problem, inputs, device, settings, l2_bytes, flusher, monitor)
    th.join()  # a thread of the last calls' must not write `out` under the checks below
    if device == "cuda":
        import torch

        torch.cuda.synchronize()
    written = sorted(set(written) | set(correctness.inputs_written(ts, inputs)))
    flags = [x for x in (res.get("timing_flag"), integrity.written_text(written) if written else None,
                         limits.host_time({**row, "median_ms": st["median"], "timer": res["timer"]})) if x]
    # a call that changed its inputs made its timed outputs from other data: comparing them is no race test
    if checked_outputs is not None and res.get("checks") and not written:
        _check_timed(row, variant, problem, checked_outputs, res["checks"], ref, tol, res.get("input_sets", 1))
    # after a passing randn check (a stale cache may already have failed an adversarial probe: this names
    # why); dense problems with 2022's mask only, the ones integrity's sampled reference computes
    if checked_outputs is not None and randn_ok and problem.direction == "fwd" and not written and not problem.features():
        stale = integrity.fresh_check(variant, problem, ts, out, device, tol, checked_outputs[0], inputs.seed)
        if stale is not None:
            flags.append(stale)
            row["correct"] = False
            row["check_reason"] = "; ".join(x for x in (row.get("check_reason"), stale) if x)
    row.update(timing_flagged=bool(flags), timing_flag_reason="; ".join(flags) or None, drained_ms=res.get("drained_ms"))
    row.update(
        timer=res["timer"], timer_note=res["timer_note"], stop=res["stop"], samples_ms=res["samples"], n=st["n"],
        median_ms=st["median"], ci95_low_ms=st["ci95_low"], ci95_high_ms=st["ci95_high"], rel_ci=st["rel_ci"],
        q1_ms=st["q1"], q3_ms=st["q3"], iqr_ms=st["iqr"], outliers=st["outliers"],
        mean_ms=st["mean"], std_ms=st["std"], rel_sem=st["rel_sem"], min_ms=st["min"],
    )
    # Bimodal, drifting, or a CPU row that missed its stop rule: the median alone would mislead.
    row["unstable"], why = stability.assess(res["samples"], res["timer"], res["stop"], st,
                                            stability.host_stop_rule(dataclasses.asdict(settings)))
    row["unstable_reason"] = why or None
    return row


def _check(row: dict[str, Any], variant, problem: AttentionProblem, inputs: Inputs, ref: Reference, device: str,
           tol: Tolerance, probes: adversarial.ProbeSet | None) -> Any:
    """The correctness fields of `row` (randn inputs, then the probes); returns the checked outputs."""
    chk = correctness.check_correctness(variant, problem, inputs, ref, device, tol)
    checked_outputs = chk.pop("checked_outputs")
    row["_written"], row["_randn_ok"] = chk.pop("inputs_written"), chk["correct"]
    row.update(
        correct=chk["correct"], max_abs_err=chk["max_abs_err"], rel_err=chk["rel_err"],
        errors=chk["errors"], out_sample=chk["out_sample"], ref_sample=chk["ref_sample"],
        reference=ref.kind, rtol=tol.rtol, atol=tol.atol, tol_factor=tol.factor, tol_eps=tol.eps,
        check_reason=chk["check_reason"], lse_checked=chk["lse_checked"],
        baseline_max_err=ref.baseline_err.get("out"),
    )
    wrong_on = [] if chk["correct"] else ["randn"]
    maps, sigs = list(chk["error_map"]), list(chk["signatures"])
    if probes is not None:
        cuda_ok = device == "cuda"
        adv = adversarial.run(probes, lambda p: variant.supports(p, cuda_available=cuda_ok),
                              probe_checker(variant, device, tol))
        row["probes"] = json.dumps(adv["probes"])
        wrong_on += adv["failed"]
        maps += adv["error_map"]
        sigs += adv["signatures"]
        # a batch (head) wrong in the whole run and right alone on the same inputs: where the work sits matters
        sigs += [sg.to_dict() for sg in signatures.slice_signatures(problem, adv["probes"], maps)]
        if adv["failed"]:
            # the reason quotes one failure in full (randn's, else the first input's), names the rest
            first = [] if wrong_on[0] == "randn" else adv["reasons"][:1]
            rest = adv["failed"] if wrong_on[0] == "randn" else adv["failed"][1:]
            also = [f"also wrong on {', '.join(rest)}"] if rest else []
            row["correct"] = False
            row["check_reason"] = "; ".join(x for x in (row["check_reason"], *first, *also) if x)
    row.update(_wrong_fields(row, wrong_on, maps, sigs))
    return checked_outputs


def _time(row: dict[str, Any], variant, problem: AttentionProblem, inputs: Inputs, device: str,
          settings: TimingSettings, l2_bytes: int, flusher: L2Flusher | None,
          monitor: Any) -> tuple[dict[str, Any], dict[str, Any], tuple[list[Any], Any]]:
    """Time the call (GPU: CUPTI/events, e2e, graph, memory, monitor; CPU: the host clock) into `row`;
    returns the timer's result, its statistics and the timed call's (inputs, output buffer)."""
    import torch

    ts, dout = correctness.prepare(problem, inputs, device, variant.name)
    out = torch.empty_like(ts[0]) if variant.kind in ("cuda", "user") and problem.direction == "fwd" else None
    # timed calls alternate over the checked inputs and their negation (faprof.timing.rotation)
    timed = rotation.Rotation(variant, problem, ts, dout, out, inputs.args)
    row["input_sets"] = timed.sets
    def snap(r: Any) -> list[Any]:
        return correctness.snapshot(problem, r)
    if variant.path_of is not None:  # after the checked call: lazy libraries (flex) have built their kernel
        row["path"] = variant.path_of(problem, *ts[:3], getattr(inputs, "args", None))
    if device != "cuda":
        res = time_host(timed, settings, snap=snap)
        timed.release()
        row["e2e_ms"] = res["stats"]["median"]
        res["input_sets"] = row["input_sets"]
        if timed.note:
            res["timer_note"] = "; ".join(x for x in (res.get("timer_note"), timed.note) if x)
        return res, res["stats"], (ts, out)
    if flusher is None and settings.flush_l2 and l2_bytes:
        flusher = L2Flusher(l2_bytes)
    if monitor is not None:
        monitor.read()
    res = time_cuda(timed, settings, flusher if settings.flush_l2 else None, monitor, snap=snap)
    res["input_sets"] = row["input_sets"]
    row["l2_flushed"] = bool(settings.flush_l2 and flusher is not None)
    row["e2e_ms"] = time_e2e(timed, settings.e2e_repeats)
    for k in ("host_enqueue_ms", "event_ms", "span_ms", "kernels_per_call", "sm_clock_mhz", "kernel_sig"):
        row[k] = res[k]
    st = res["stats"]
    # host time outside kernels per call: what a caller waits for beyond the kernels (faprof.rows.limits)
    row["host_ms"] = row["e2e_ms"] - st["median"] if row["e2e_ms"] and st["median"] else None
    if settings.graph and st["median"] < GRAPH_WORTHY_MS and problem.direction == "fwd":
        row["graph_ms"] = time_graph(timed)
    timed.release()  # set B freed: the peak memory is one call's on the checked inputs, as a caller's
    row["peak_mem_bytes"], row["extra_mem_bytes"] = peak_memory(timed)
    if monitor is not None:
        monitor.read()
        row.update(monitor.summary())
    if timed.note:
        res["timer_note"] = "; ".join(x for x in (res.get("timer_note"), timed.note) if x)
    return res, st, (ts, out)


def _check_timed(row: dict[str, Any], variant, problem: AttentionProblem, checked_outputs: Any,
                 checks: list[tuple[int, int, list[Any]]], ref: Reference | None, tol: Tolerance, sets: int = 1) -> None:
    """The checked timed calls' outputs against their input set's expected outputs (faprof.timing.rotation):
    a difference makes the row wrong (work skipped or partial in timed calls, a stale result, a race)."""
    if row.get("correct") is False:
        # set B's outputs are set A's negated for attention, not for every bug: a wrong kernel's timed calls are
        # compared on the checked inputs only (a difference there is still a race)
        checks = [c for c in checks if c[1] == 0]
    row["timed_checked"] = len(checks)
    repeatable = True

    def against(which: int, outs: list[Any]) -> dict[str, Any]:
        return correctness.check_repeat(variant, problem, rotation.expected(problem, checked_outputs, which),
                                        tuple(outs) if len(outs) > 1 else outs[0], rotation.expected_ref(ref, which),
                                        tol)

    for n, which, outs in checks:
        rep = against(which, outs)
        repeatable &= rep["repeatable"]
        if rep["repeat_ok"]:
            continue
        row["repeatable"] = False
        call = f"timed call {n + 1} (input set {rotation.set_name(which)})"
        other = 1 - which
        if sets > 1 and against(other, outs)["repeat_ok"]:
            reason = (f"{call} returned the other input set's result: the output buffer still held an earlier "
                      "call's answer, so the timed calls skip their work (or serve a stale result)")
        else:
            reason = rep["repeat_reason"].replace("a timed call's", f"{call}:", 1)
        _timed_wrong(row, problem, rotation.expected(problem, checked_outputs, which), outs, reason)
        return
    row["repeatable"] = repeatable


def _timed_wrong(row: dict[str, Any], problem: AttentionProblem, expected: list[Any], outs: list[Any],
                 reason: str) -> None:
    """Make `row` wrong because a timed call's outputs `outs` differ from `expected` (its set's checked outputs)."""
    row["correct"] = False
    row["check_reason"] = "; ".join(x for x in (row.get("check_reason"), reason) if x)
    names = correctness._outputs(problem, tuple(outs) if len(outs) > 1 else outs[0])[0]
    race = signatures.race_signature(names, expected, outs)
    old = json.loads(row["signatures"]) if row.get("signatures") else []
    maps = json.loads(row["error_map"]) if row.get("error_map") else []
    wrong_on = row["check_input"].split(", ") if row.get("check_input") else []
    row.update(_wrong_fields(row, wrong_on or ["randn (timed call)"], maps,
                             [race.to_dict(), *old] if race is not None else old))


def _wrong_fields(row: dict[str, Any], wrong_on: list[str], maps: list[dict[str, Any]],
                  sigs: list[dict[str, Any]]) -> dict[str, Any]:
    """check_input, error_map, signatures, bug_signature of a row, and its check_reason with the best
    signature named once."""
    f = wrong_text.row_fields(wrong_on, maps, sigs)
    text = f.pop("signature_text")
    # the signature clause goes last, once (a repeat failure found after it is added before it)
    parts = [x for x in (row.get("check_reason") or "").split("; ") if x and not x.startswith("looks like ")]
    f["check_reason"] = "; ".join([*parts, text] if text else parts) or row.get("check_reason")
    return f
