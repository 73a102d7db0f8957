"""Timing integrity: GPU work a call causes outside its own launches, outputs that belong to other
inputs, and inputs a call overwrites.

The timed loop (faprof.timing.harness) counts the kernels each call launches from its own thread
(CUPTI correlation ids, or the call's host window), or the CUDA events around it on the current
stream. A call can look faster than it is five ways; this module catches each, and the row says so
(`timing_flagged`, `timing_flag_reason`; docs/measure/timing-integrity.md):

- work on another stream: CUPTI counts a launch whatever its stream; CUDA events (the fallback
  timer) do not, so an events-timed row is checked against a host-clock drain of the whole device;
- work launched by another host thread, or after the call returned: kernels linked to no call and
  not to the harness (its flush and lead are tagged) are work outside the calls. Isolated calls are
  then *drained* (Python threads the call started are joined, the whole device synchronized, and a
  short settle lets a worker launch what it was handed); every kernel that ran from the call's start
  to the drained end is the call's;
- work deferred to the next call: an output that is not written once the call and everything it
  started have finished (checked on fresh inputs in fresh storage, with a poisoned output);
- a result cached from earlier inputs (keyed by pointer): new values written into the same storage,
  and the output must be the new inputs' attention (checked on a sample of rows);
- output written into an input: the inputs are compared with their originals after the calls.

A row whose timed loop missed work is timed again drained: each sample is all the GPU work of one
isolated call (CUPTI), or its host-clock time to a drained device (events only: an upper bound).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from faprof.correctness import check as correctness
from faprof.correctness import errormap
from faprof.model.mask import TOP_LEFT_CAUSAL, allowed_rows
from faprof.model.problem import AttentionProblem
from faprof.model.scores import scores
from faprof.model.settings import Tolerance

#: Isolated, drained calls in the probe after the timed loop: enough for a median that one slow
#: call does not move, few enough to cost a few milliseconds per row.
PROBE_CALLS = 5

#: After a drained call's device synchronize, wait this long and synchronize again: a worker thread
#: the call handed its work to launches it within tens of microseconds of being woken.
SETTLE_S = 0.002

#: Work outside the calls' own launches counts when it exceeds this share of the calls' own time ...
OUTSIDE_REL = 0.02

#: ... and this absolute time per call (one stray tiny kernel of a library's lazy set-up is noise).
OUTSIDE_ABS_MS = 0.002

#: Host-clock drains (events-timed GPU rows, CPU rows) carry the host's own jitter: they flag a row
#: only when the drained time exceeds the timed median by this factor ...
HOST_GAP_FACTOR = 1.5

#: ... plus this much (the synchronize and Python around a drained call: tens of microseconds).
HOST_GAP_ABS_MS = 0.05

#: Query rows per sampled (b, h) slice the fresh-input check compares (first, last, spread between):
#: a stale or unwritten output is wrong everywhere, so a sample shows it at a fraction of a reference.
FRESH_ROWS = 16

#: Drained calls per batch of the re-timing loop (each is synchronized anyway; the batch only sets
#: how often the stop rule is looked at).
DRAINED_BATCH = 10

#: A call on new inputs that takes longer than the timed median by this share ...
ALONE_REL = 0.25

#: ... and this much (GPU rows; isolated calls of a few µs vary by about a microsecond) ...
ALONE_ABS_MS = 0.003

#: ... with even its fastest drained call above the median by half the share: the timed calls did less
#: work than a call on inputs never seen (faprof.timing.rotation).
ALONE_MIN_REL = ALONE_REL / 2

#: CPU rows (host clock, a loaded machine moves it by more than 1.5x): every drained call on new inputs
#: slower than the timed median by this factor, and by HOST_GAP_ABS_MS.
ALONE_HOST_FACTOR = 3.0

#: A call on inputs no call has seen: `fresh()` makes the inputs and returns the call on them.
Fresh = Callable[[], Callable[[], Any]]


def call_drained(fn: Callable[[], Any], cuda: bool) -> tuple[Any, int]:
    """(result, threads left running): one call, its threads joined, the device synchronized."""
    r, left = correctness.call_drained(fn)
    if cuda:
        import torch

        torch.cuda.synchronize()
    return r, left


@dataclass
class Drain:
    """Isolated, drained calls: what each call's own launches account for, and what ran beside them."""

    method: str
    """'cupti' (kernel records of the whole device) or 'host' (host clock to a drained device)."""
    drained_ms: list[float] = field(default_factory=list)
    """Per call: all its GPU work (cupti: own + outside kernels' durations; host: clock less the floor)."""
    own_ms: list[float] = field(default_factory=list)
    """Per call: the durations of the kernels it launched itself (cupti only)."""
    outside_kernels: int = 0
    """Kernels linked to no call, launched from the calls' start to their drained end or between calls."""
    stray_ms: float = 0.0
    """Durations of kernels linked to nothing that ran between the drained calls (ms, all calls)."""
    threads: int = 0
    """Calls that returned with a Python thread of theirs still running."""

    @property
    def median_ms(self) -> float:
        return statistics.median(self.drained_ms) if self.drained_ms else math.nan

    @property
    def outside_ms(self) -> float:
        """Median per call of the work outside its own launches."""
        if not self.own_ms:
            return 0.0
        return statistics.median(d - o for d, o in zip(self.drained_ms, self.own_ms, strict=True))


def drain_cupti(fn: Callable[[], Any], timer: Any, flusher: Callable[[], None] | None, n: int,
                fresh: Fresh | None = None) -> Drain:
    """`n` isolated calls, each after a flush and a synchronize, drained; every kernel of the device
    from the call's start to its drained end counted (CUPTI records, whatever stream or thread).
    With `fresh`, each call runs on new inputs (`fresh()` returns the call; its work is the harness's)."""
    import torch

    marks = []
    d = Drain("cupti")
    for cid in timer.new_ids(n):
        f = fn
        with timer.harness():
            if fresh is not None:
                f = fresh()
            if flusher is not None:
                flusher()
        torch.cuda.synchronize()
        t0 = timer.now()
        with correctness.NewThreads() as th, timer.call(cid):
            f()
        th.join()
        torch.cuda.synchronize()
        time.sleep(SETTLE_S)
        torch.cuda.synchronize()
        marks.append((cid, t0, timer.now()))
        d.threads += bool(th.left)
    got = timer.collect(expect=[m[0] for m in marks])
    unlinked = list(timer.last_unlinked)
    inside = set()
    for cid, t0, t1 in marks:
        own = got[cid].sum_ns if cid in got else 0
        out = [k for k in unlinked if t0 <= k[0] <= t1]
        inside.update(out)
        d.own_ms.append(own / 1e6)
        d.drained_ms.append((own + sum(e - s for s, e in out)) / 1e6)
    stray = [k for k in unlinked if k not in inside]
    d.outside_kernels = len(unlinked)
    d.stray_ms = sum(e - s for s, e in stray) / 1e6
    return d


def drain(fn: Callable[[], Any], timer: Any, flusher: Callable[[], None] | None, fresh: Fresh | None = None) -> Drain:
    """PROBE_CALLS drained calls of a GPU row (on new inputs with `fresh`): by CUPTI where `timer` is
    one, else by the host clock."""
    if timer is not None:
        return drain_cupti(fn, timer, flusher, PROBE_CALLS, fresh)
    return drain_host(fn, flusher, PROBE_CALLS, cuda=True, fresh=fresh)


def drain_host(fn: Callable[[], Any], flusher: Callable[[], None] | None, n: int, cuda: bool,
               fresh: Fresh | None = None) -> Drain:
    """`n` isolated calls timed by the host clock from the call to a drained device (threads joined,
    device synchronized), less the same clock around a call that does nothing (the floor); with
    `fresh`, each on new inputs made before its clock starts."""

    def once(f: Callable[[], Any]) -> tuple[float, Any, int]:
        if fresh is not None and f is fn:
            f = fresh()
        if flusher is not None:
            flusher()
        if cuda:
            import torch

            torch.cuda.synchronize()
        t = time.perf_counter()
        r, left = call_drained(f, cuda)
        return (time.perf_counter() - t) * 1e3, r, left

    floor = statistics.median(once(lambda: None)[0] for _ in range(max(3, n)))
    d = Drain("host")
    for _ in range(n):
        ms, _, left = once(fn)
        d.drained_ms.append(max(0.0, ms - floor))
        d.threads += bool(left)
    return d


def missed_work(d: Drain, timed_ms: float, timer: str, loop_outside_ms: float = 0.0,
                enqueue_ms: float = 0.0) -> str | None:
    """Why the timed median misses work the drained calls show, or None.

    Args:
        d: the drained calls.
        timed_ms: the timed loop's median (ms).
        timer: the timed loop's timer ('cupti', 'cuda_event', 'host').
        loop_outside_ms: kernels linked to no call during the timed loop, per call (ms).
        enqueue_ms: the host's enqueue cost of one call (host drains of GPU rows include it).
    """
    threads = (f"; {d.threads} of {len(d.drained_ms)} drained calls returned with a thread of theirs still running"
               if d.threads else "")
    if d.method == "cupti":
        own = statistics.median(d.own_ms) if d.own_ms else 0.0
        outside = max(d.outside_ms + d.stray_ms / max(1, len(d.drained_ms)), loop_outside_ms)
        if outside > OUTSIDE_REL * own + OUTSIDE_ABS_MS:
            return (f"GPU work outside the call's own launches: {d.outside_kernels} kernel(s) that no call launched "
                    f"from its own thread, {outside:.3g} ms per call beside its own {own:.3g} ms (launched by another "
                    f"thread or after the call returned){threads}")
        if timer == "cuda_event" and d.median_ms > HOST_GAP_FACTOR * timed_ms + OUTSIDE_ABS_MS:
            return (f"the CUDA events on the current stream read {timed_ms:.3g} ms but the call's kernels take "
                    f"{d.median_ms:.3g} ms in isolated calls on new inputs (work on another stream, or timed calls that "
                    f"do less work on inputs seen before){threads}")
        if own and alone_slower(d.own_ms, timed_ms):
            return alone_text(statistics.median(d.own_ms), timed_ms, "its own kernels take")
        return None
    gap = d.median_ms - enqueue_ms
    # a CPU row's host clock moves by more than HOST_GAP_FACTOR on a loaded machine: a call that left a
    # thread of its own running is judged there, and one whose every call on new inputs is far slower
    if timer == "host" and not d.threads:
        return alone_text(d.median_ms, timed_ms, "they take") if alone_slower_host(d, timed_ms) else None
    if gap > HOST_GAP_FACTOR * timed_ms + HOST_GAP_ABS_MS:
        where = "the device stays busy" if timer == "cuda_event" else "its work goes on"
        return (f"a call times {timed_ms:.3g} ms but {where} {gap:.3g} ms after it starts until drained "
                f"(work on another stream or thread, or timed calls that do less work than a call on new inputs){threads}")
    return None


def alone_slower(own_ms: list[float], timed_ms: float) -> bool:
    """Whether isolated calls on new inputs (their own kernels' times) take longer than the timed median by
    more than noise: the median by ALONE_REL + ALONE_ABS_MS, and the fastest of them by ALONE_MIN_REL."""
    if not own_ms or not timed_ms > 0:
        return False
    return (statistics.median(own_ms) > timed_ms * (1 + ALONE_REL) + ALONE_ABS_MS
            and min(own_ms) > timed_ms * (1 + ALONE_MIN_REL))


def alone_slower_host(d: Drain, timed_ms: float) -> bool:
    """`alone_slower` for CPU rows, whose host clock is noisier: every drained call above
    ALONE_HOST_FACTOR x the timed median + HOST_GAP_ABS_MS."""
    return bool(d.drained_ms) and timed_ms > 0 and min(d.drained_ms) > ALONE_HOST_FACTOR * timed_ms + HOST_GAP_ABS_MS


def alone_text(alone_ms: float, timed_ms: float, verb: str) -> str:
    return (f"the timed calls read {timed_ms:.3g} ms but isolated calls on new inputs ({verb} {alone_ms:.3g} ms) are "
            f"{alone_ms / timed_ms:.2g}x slower: the timed calls, on inputs seen before, do less work (work skipped when "
            "the inputs repeat, a result cached from earlier inputs, or work that depends on being called back to back)")


def time_drained(fn: Callable[[], Any], d: Drain, timer: Any, flusher: Callable[[], None] | None, cuda: bool,
                 stop: Callable[[list[float], float], str | None], max_repeats: int,
                 fresh: Fresh | None = None) -> tuple[list[float], str]:
    """Time drained calls (on new inputs with `fresh`) until `stop(samples, start)` says so: every sample
    all of one call's work.

    Returns:
        (samples in ms, stop reason), the probe's samples first.
    """
    samples = list(d.drained_ms)
    start = time.perf_counter()
    reason = "max_repeats"
    while len(samples) < max_repeats:
        n = min(DRAINED_BATCH, max_repeats - len(samples))
        more = (drain_cupti(fn, timer, flusher, n, fresh) if d.method == "cupti"
                else drain_host(fn, flusher, n, cuda, fresh))
        samples += more.drained_ms
        r = stop(samples, start)
        if r:
            reason = r
            break
    return samples, reason


def retime_if_missed(d: Drain, fn: Callable[[], Any], timer: Any, flusher: Callable[[], None] | None,
                     samples: list[float], used: str, stop: Callable[[list[float], float], str | None],
                     max_repeats: int, loop_outside_ms: float = 0.0,
                     enqueue_ms: float = 0.0, fresh: Fresh | None = None) -> tuple[list[float], dict[str, Any] | None]:
    """The timed loop's `samples` when the drained calls `d` show no missed work (`missed_work`), else
    drained samples (`time_drained`, on new inputs with `fresh`) and the flag: {'reason', 'timer', 'stop', 'note'}."""
    reason = missed_work(d, statistics.median(samples), used, loop_outside_ms, enqueue_ms)
    if reason is None:
        return samples, None
    again, why = time_drained(fn, d, timer, flusher, used != "host", stop, max_repeats, fresh)
    return again, {"reason": reason, "timer": f"{d.method}_drained", "stop": why, "note": drained_note(d)}


def drained_note(d: Drain) -> str:
    """The timer note of a row timed drained."""
    if d.method == "cupti":
        return ("timed drained: each sample is every kernel of the device from the call's start until its threads "
                "joined and the device was idle (CUPTI records), on inputs no call had seen, because the timed loop "
                "missed work")
    return ("timed drained: each sample is the host clock from the call to an idle device (threads joined, device "
            "synchronized; an upper bound), on inputs no call had seen, because the timed loop missed work")


# ------------------------------------------------------------------------ inputs and outputs
def written_text(names: list[str]) -> str:
    return (f"writes into its input{'s' if len(names) > 1 else ''} {', '.join(names)}: later calls ran on changed "
            "data (the timed calls did not repeat the checked call), and a caller's tensors are overwritten")


def _row_sample(n: int) -> list[int]:
    return sorted({round(i * (n - 1) / max(1, FRESH_ROWS - 1)) for i in range(min(n, FRESH_ROWS))})


def _slices(problem: AttentionProblem) -> tuple[list[int], list[int], list[int]]:
    """(batch indices, head indices, query rows) of the sample: slices (0, 0) and (B-1, H-1)."""
    pairs = list(dict.fromkeys(((0, 0), (problem.B - 1, problem.H - 1))))
    return [b for b, _ in pairs], [h for _, h in pairs], _row_sample(problem.Sq)


def _rows_reference(problem: AttentionProblem, q, k, v):
    """float64 attention of the sample's query rows on the CPU, [slices, rows, D] (one batched pass:
    on a small host every torch op counts)."""
    import torch

    bs, hs, rows = _slices(problem)
    qs = q[bs, hs][:, rows].detach().to("cpu", torch.float64)
    ks, vs = (t[bs, hs].detach().to("cpu", torch.float64) for t in (k, v))
    ok = allowed_rows(TOP_LEFT_CAUSAL, torch.tensor(rows), problem.Sq, ks.shape[-2]) if problem.causal else None
    s = scores(qs, ks, problem.softmax_scale, allowed=ok)
    return torch.matmul(torch.nan_to_num(torch.softmax(s, dim=-1), nan=0.0), vs)


@dataclass
class Sampled:
    """A call's output on a sample of rows against the attention of its inputs."""

    ok: bool
    unwritten: int
    """Sampled elements still holding the poison (never written)."""
    matches: bool
    """The sample equals `other` (within tolerance) where one was given."""
    total: int


def _sampled(problem: AttentionProblem, result: Any, ts: list[Any], tol: Tolerance, other: Any = None) -> Sampled:
    import torch

    bs, hs, rows = _slices(problem)
    ref = _rows_reference(problem, *ts)
    got = correctness._outputs(problem, result)[1][0][bs, hs][:, rows].detach()
    unwritten = int(errormap.unwritten_mask(got).sum())
    g = got.to("cpu", torch.float64)
    t = tol.for_output("out")
    bound = t.atol + t.rtol * ref.abs()
    finite = bool(torch.isfinite(g).all())
    ok = finite and bool(((g - ref).abs() <= bound).all())
    matches = other is not None and finite and bool(
        ((g - other[bs, hs][:, rows].detach().to("cpu", torch.float64)).abs() <= bound).all())
    return Sampled(ok, unwritten, matches, g.numel())


def _fresh(t: Any, gen: Any, new_storage: bool) -> Any:
    """`t` itself with new random values, or a new tensor of them."""
    dst = t if not new_storage else t.detach().clone()
    dst.normal_(generator=gen)
    return dst


def fresh_check(variant: Any, problem: AttentionProblem, ts: list[Any], out: Any, device: str, tol: Tolerance,
                earlier: Any, seed: int = 0) -> str | None:
    """Whether a forward call's output belongs to its inputs when they change: why not, or None.

    First the timed storage gets new values (a cache keyed by pointer returns the earlier output:
    stale); then new storage with new values (a call that defers its work leaves its output unwritten
    until the next call). Each call is drained, its output poisoned first, and compared on a sample
    of rows with the float64 attention of its own inputs.

    Args:
        variant: the variant (called through `correctness.make_call`).
        problem: a forward problem.
        ts: the timed call's q, k, v (their contents are replaced).
        out: the timed call's output buffer, or None.
        earlier: the checked call's output on the original inputs (what a stale result equals).
    """
    import torch

    cuda = device == "cuda"
    # not the inputs' own seed: make_inputs draws from a generator seeded with it, so the same seed
    # here would write the same values back
    gen = torch.Generator(device=ts[0].device).manual_seed((seed * 1_000_003 + 0x5EED) % (1 << 62))
    with torch.no_grad():
        fresh = [_fresh(t, gen, False) for t in ts]  # the same tensors: a call keyed on them sees a repeat
    if out is not None:
        out.copy_(errormap.poison_like(out))
    _, call = correctness.make_call(variant, problem, fresh, None, out)
    res, _ = call_drained(call, cuda)
    s = _sampled(problem, res, fresh, tol, earlier)
    if not s.ok and s.matches:
        return ("returns a result of earlier inputs: after new values were written into the same q, k, v storage "
                "its output still equals the earlier inputs' (a cache keyed by pointer?), so timed calls on "
                "unchanged inputs may skip the work")
    if not s.ok:
        return _not_its_own(problem, call, res, fresh, tol, s, cuda, "once new values were written into the inputs' storage")
    with torch.no_grad():
        new = [_fresh(t, gen, True) for t in ts]
    out2 = errormap.poison_like(out) if out is not None else None
    _, call2 = correctness.make_call(variant, problem, new, None, out2)
    res2, _ = call_drained(call2, cuda)
    s2 = _sampled(problem, res2, new, tol)
    if s2.ok:
        return None
    return _not_its_own(problem, call2, res2, new, tol, s2, cuda, "on fresh inputs in fresh storage")


def _not_its_own(problem: AttentionProblem, call: Callable[[], Any], res: Any, ts: list[Any], tol: Tolerance,
                 s: Sampled, cuda: bool, when: str) -> str:
    """The reason a drained call's output was wrong: deferred (the next call on the same tensors
    completes it) or plainly wrong."""
    call_drained(call, cuda)  # the next call on the same inputs
    if s.unwritten and _sampled(problem, res, ts, tol).ok:
        return (f"its output is not complete when the call and all the work it started have finished ({_what(s)} "
                f"{when}), and is after the next call: the work is deferred to the next call")
    if s.unwritten:
        return (f"its output is not written when the call and all the work it started have finished ({_what(s)} "
                f"{when}): work deferred, or skipped when the inputs repeat")
    return f"wrong {when} ({_what(s)})"


def _what(s: Sampled) -> str:
    if s.unwritten:
        return f"{s.unwritten} of {s.total} sampled output elements never written"
    return "sampled output rows differ from the attention of the call's inputs"
