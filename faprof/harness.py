"""The measuring harness: correctness against a reference first, then careful timing.

Method (the numbers in a faprof table come from here):
- Inputs are fresh `torch.randn` draws for every (problem, run), seeded from the OS and the seed
  recorded; never zeros, which hide unwritten outputs and run faster than real data.
- Outputs are poisoned with NaN before the checked call (kernels get a NaN-filled `out`; torch
  baselines get NaN-filled memory recycled through the caching allocator), so an element the
  variant forgot to write fails the check.
- The reference is float64 attention on the CPU (`cpu_ref`) when that takes seconds, otherwise
  fp32 attention on the GPU computed one (b, h) slice at a time; each row says which.
- GPU timing uses CUDA events around each call, after a warm-up, with the L2 flushed before every
  repeat by writing a buffer of 2x the L2 size; repeats continue until the standard error is under
  `target_rel_sem` of the mean or the time budget runs out. All samples are kept.
- Also measured: host-clock end-to-end latency (call + synchronize), a CUDA-graph replay figure
  for launch-bound calls, and the peak memory of one call. CPU variants use the host clock.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from faprof.problem import AttentionProblem, torch_dtype
from faprof.scenarios import DEFAULT_TOLERANCE, TimingSettings, Tolerance

#: Problems whose float64 forward (+ backward) costs more than this are checked against an fp32
#: GPU reference instead of the CPU: 2e10 FLOP is a few seconds on a small host in float64.
CPU_REFERENCE_MAX_FLOPS = 2.0e10

#: Calls shorter than this are launch-bound enough that a CUDA-graph replay figure is worth
#: reporting next to the event timing (launch overhead is a few microseconds per kernel).
GRAPH_WORTHY_MS = 1.0

#: Host-clock CPU calls slower than this get only 3 timed repeats minimum (each is seconds).
SLOW_CPU_CALL_S = 0.5

#: Number of output elements kept per row, as in report 000's "first 10 elements" table.
SAMPLE_ELEMENTS = 10

_T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262,
          10: 2.228, 12: 2.179, 15: 2.131, 20: 2.086, 25: 2.060, 30: 2.042, 40: 2.021, 60: 2.000,
          120: 1.980}


def t_quantile_975(dof: int) -> float:
    """Two-sided 95% Student-t quantile for `dof` degrees of freedom (table, interpolated)."""
    if dof < 1:
        return float("nan")
    if dof in _T_975:
        return _T_975[dof]
    if dof > 120:
        return 1.960
    keys = sorted(_T_975)
    lo = max(k for k in keys if k < dof)
    hi = min(k for k in keys if k > dof)
    # interpolate in 1/dof, which is close to linear for t quantiles
    w = (1 / dof - 1 / hi) / (1 / lo - 1 / hi)
    return _T_975[hi] + w * (_T_975[lo] - _T_975[hi])


def summarize(samples: list[float]) -> dict[str, float]:
    """Median, mean, std (n-1), standard error, 95% CI of the mean, min, max, n, relative SEM."""
    n = len(samples)
    if n == 0:
        return {"n": 0}
    mean = statistics.fmean(samples)
    std = statistics.stdev(samples) if n > 1 else 0.0
    sem = std / math.sqrt(n) if n > 1 else float("nan")
    half = t_quantile_975(n - 1) * sem if n > 1 else float("nan")
    return {
        "n": n,
        "median": statistics.median(samples),
        "mean": mean,
        "std": std,
        "sem": sem,
        "ci95_low": mean - half,
        "ci95_high": mean + half,
        "min": min(samples),
        "max": max(samples),
        "rel_sem": sem / mean if mean > 0 and n > 1 else float("nan"),
    }


# ---------------------------------------------------------------------------- inputs
@dataclass
class Inputs:
    q: Any
    k: Any
    v: Any
    dout: Any
    seed: int


def make_inputs(problem: AttentionProblem, device: str, seed: int | None = None) -> Inputs:
    """Fresh random Q, K, V (and an upstream gradient dO) for `problem`, on `device`."""
    import torch

    if seed is None:
        seed = int.from_bytes(os.urandom(4), "little")
    g = torch.Generator(device="cpu").manual_seed(seed)
    dt = torch_dtype(problem.dtype)
    shape_q = (problem.B, problem.H, problem.Sq, problem.D)
    shape_k = (problem.B, problem.H, problem.Sk, problem.D)

    def draw(shape):
        # Drawn in fp32 on the CPU (reproducible from the seed on any device), then cast.
        return torch.randn(shape, generator=g, dtype=torch.float32).to(device=device, dtype=dt)

    return Inputs(q=draw(shape_q), k=draw(shape_k), v=draw(shape_k), dout=draw(shape_q), seed=seed)


# ------------------------------------------------------------------------- reference
@dataclass
class Reference:
    out: Any
    grads: tuple | None
    kind: str
    """'cpu_ref fp64' or 'gpu fp32'."""


def needs_grads(problem: AttentionProblem) -> bool:
    return problem.direction in ("bwd", "fwd_bwd")


def compute_reference(problem: AttentionProblem, inputs: Inputs, cuda_ok: bool) -> Reference:
    """The oracle for `problem` on `inputs`: float64 on the CPU when affordable, else fp32 on the GPU."""
    import torch

    from faprof.variants import _standard_attention

    factor = 3.5 if needs_grads(problem) else 1.0
    use_cpu = problem.fwd_flops() * factor <= CPU_REFERENCE_MAX_FLOPS or not cuda_ok
    scale = problem.softmax_scale
    if use_cpu:
        dev, dt, kind = "cpu", torch.float64, "cpu_ref fp64"
    else:
        dev, dt, kind = inputs.q.device, torch.float32, "gpu fp32"
    outs, gq, gk, gv = [], [], [], []
    # One (b, h) slice at a time on the GPU bounds the Sq x Sk scores to one head's worth.
    B, H = problem.B, problem.H
    slices = [(slice(None), slice(None))] if use_cpu else [(b, h) for b in range(B) for h in range(H)]
    for sl in slices:
        q, k, v = (t[sl].detach().to(dev, dt) for t in (inputs.q, inputs.k, inputs.v))
        if needs_grads(problem):
            q.requires_grad_(True)
            k.requires_grad_(True)
            v.requires_grad_(True)
            with torch.enable_grad():
                o = _standard_attention(q, k, v, problem.causal, scale)
                dq, dk, dv = torch.autograd.grad(o, (q, k, v), inputs.dout[sl].to(dev, dt))
            gq.append(dq)
            gk.append(dk)
            gv.append(dv)
            o = o.detach()
        else:
            with torch.no_grad():
                o = _standard_attention(q, k, v, problem.causal, scale)
        outs.append(o)
    if use_cpu:
        out = outs[0]
        grads = (gq[0], gk[0], gv[0]) if gq else None
    else:
        def stack(parts):
            return torch.stack(parts).reshape(B, H, *parts[0].shape)

        out = stack(outs)
        grads = (stack(gq), stack(gk), stack(gv)) if gq else None
    return Reference(out=out, grads=grads, kind=kind)


def compare(result, ref) -> tuple[float, float, float]:
    """(max abs error, norm-wise relative error, max |ref|) of `result` against `ref`.

    NaN anywhere in the result gives NaN errors (never a pass).
    """
    import torch

    if tuple(result.shape) != tuple(ref.shape):  # never let broadcasting hide a wrong shape
        return float("nan"), float("nan"), float(ref.abs().max())
    r = result.detach().to(ref.device, ref.dtype)
    if not torch.isfinite(r).all():
        return float("nan"), float("nan"), float(ref.abs().max())
    diff = r - ref
    ref_norm = float(torch.linalg.vector_norm(ref))
    rel = float(torch.linalg.vector_norm(diff)) / ref_norm if ref_norm > 0 else float(torch.linalg.vector_norm(diff))
    return float(diff.abs().max()), rel, float(ref.abs().max())


def within(max_abs: float, rel: float, ref_max: float, tol: Tolerance) -> bool:
    if math.isnan(max_abs) or math.isnan(rel):
        return False
    return rel <= tol.rtol and max_abs <= tol.atol * max(1.0, ref_max)


# -------------------------------------------------------------------------- running
def _prepare(problem: AttentionProblem, inputs: Inputs, device: str, variant_name: str):
    """Inputs on the variant's device and dtype (cpu_ref runs in float64), with grads if needed."""
    import torch

    dt = torch.float64 if variant_name == "cpu_ref" else torch_dtype(problem.dtype)
    # clone(): each variant gets its own copies, so one that writes into its inputs cannot change
    # what later variants on this problem see.
    ts = [t.detach().to(device=device, dtype=dt).contiguous().clone() for t in (inputs.q, inputs.k, inputs.v)]
    dout = inputs.dout.detach().to(device=device, dtype=dt)
    if needs_grads(problem):
        for t in ts:
            t.requires_grad_(True)
    return ts, dout


def _poison_allocator(nbytes: int, device: str) -> None:
    """Fill `nbytes` of freed CUDA caching-allocator memory with NaN, so a torch op that allocates
    its output there and fails to write part of it shows NaN instead of stale valid values."""
    import torch

    if device != "cuda" or nbytes <= 0:
        return
    junk = torch.full((nbytes // 4 + 1,), float("nan"), dtype=torch.float32, device=device)
    del junk


def make_call(variant, problem: AttentionProblem, ts, dout, out=None) -> tuple[Callable[[], Any], Callable[[], Any]]:
    """(checked_call, timed_call) for the variant and direction.

    fwd: the forward. bwd: gradients for `dout` with the forward done once, outside the timing
    (retain_graph so the backward can be replayed). fwd_bwd: forward then backward.
    """
    import torch

    q, k, v = ts
    causal, scale = problem.causal, problem.softmax_scale
    if problem.direction == "fwd":
        def fwd():
            with torch.no_grad():
                return variant.fn(q, k, v, causal, scale, out)
        return fwd, fwd
    if problem.direction == "bwd":
        with torch.enable_grad():
            o = variant.fn(q, k, v, causal, scale)

        def bwd():
            with torch.enable_grad():
                return (o.detach(), *torch.autograd.grad(o, (q, k, v), dout, retain_graph=True))
        return bwd, bwd

    def fwd_bwd():
        with torch.enable_grad():
            o = variant.fn(q, k, v, causal, scale)
            return (o.detach(), *torch.autograd.grad(o, (q, k, v), dout))
    return fwd_bwd, fwd_bwd


def check_correctness(variant, problem, inputs, ref: Reference, device: str, tol: Tolerance) -> dict[str, Any]:
    """Run the variant once on poisoned outputs and compare with the reference."""
    import torch

    ts, dout = _prepare(problem, inputs, device, variant.name)
    out = None
    if variant.kind in ("cuda", "user") and problem.direction == "fwd":
        out = torch.full_like(ts[0], float("nan"))
    else:
        _poison_allocator(4 * problem.B * problem.H * problem.Sq * problem.D * 4, device)
    checked, _ = make_call(variant, problem, ts, dout, out)
    result = checked()
    if device == "cuda":
        torch.cuda.synchronize()
    names = ["out"]
    results = [result]
    refs = [ref.out]
    if problem.direction != "fwd":
        results = list(result)
        names = ["out", "dq", "dk", "dv"]
        assert ref.grads is not None, "a backward problem's reference carries gradients"
        refs = [ref.out, *ref.grads]
    per: dict[str, dict[str, float]] = {}
    worst_abs, worst_rel, ok = 0.0, 0.0, True
    for name, r, rf in zip(names, results, refs, strict=True):
        max_abs, rel, ref_max = compare(r, rf)
        good = within(max_abs, rel, ref_max, tol)
        per[name] = {"max_abs": max_abs, "rel": rel, "ok": good}
        ok = ok and good
        worst_abs = max_abs if math.isnan(max_abs) or math.isnan(worst_abs) else max(worst_abs, max_abs)
        worst_rel = rel if math.isnan(rel) or math.isnan(worst_rel) else max(worst_rel, rel)
    first = results[0].detach().reshape(-1)[:SAMPLE_ELEMENTS].to("cpu", torch.float64).tolist()
    ref_first = ref.out.detach().reshape(-1)[:SAMPLE_ELEMENTS].to("cpu", torch.float64).tolist()
    return {
        "correct": ok,
        "max_abs_err": worst_abs,
        "rel_err": worst_rel,
        "errors": per,
        "out_sample": first,
        "ref_sample": ref_first,
    }


class L2Flusher:
    """Writes a buffer of 2x the L2 size, so each timed repeat starts from a cold L2."""

    def __init__(self, l2_bytes: int, device: str = "cuda"):
        import torch

        self.buf = torch.empty(max(2 * l2_bytes, 1 << 20) // 4, dtype=torch.float32, device=device)

    def __call__(self) -> None:
        self.buf.fill_(1.0)


#: The GPU must already be busy when the start event is recorded, or the event pair also times
#: the host's launch overhead (seen on the H100: sdpa_flash at B=1 H=1 S=128 read 0.116 ms by plain
#: events and 0.019 ms by graph replay). Before each timed call the harness enqueues a spin of
#: LEAD_FACTOR x the call's host enqueue time (plus LEAD_MIN_US), so the CPU is ahead of the GPU.
LEAD_FACTOR = 2.0
LEAD_MIN_US = 20.0

_CYCLES_PER_US: float | None = None


def cycles_per_us() -> float:
    """Calibrate torch.cuda._sleep: GPU clock cycles per microsecond (at the current clocks)."""
    global _CYCLES_PER_US
    if _CYCLES_PER_US is None:
        import torch

        n = 2_000_000
        torch.cuda._sleep(n)  # warm
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        torch.cuda._sleep(n)
        b.record()
        torch.cuda.synchronize()
        _CYCLES_PER_US = n / (a.elapsed_time(b) * 1e3)
    return _CYCLES_PER_US


def host_enqueue_ms(fn: Callable[[], Any], calls: int = 5) -> float:
    """Median host time to *enqueue* one call (no synchronize): the launch cost the CPU pays."""
    import torch

    xs = []
    for _ in range(calls):
        torch.cuda.synchronize()
        torch.cuda._sleep(int(cycles_per_us() * 2000))  # keep the GPU busy so enqueue never blocks on it
        t = time.perf_counter()
        fn()
        xs.append((time.perf_counter() - t) * 1e3)
        torch.cuda.synchronize()
    return statistics.median(xs)


def time_cuda(fn: Callable[[], Any], settings: TimingSettings, flusher: L2Flusher | None) -> dict[str, Any]:
    """CUDA-event timing with warm-up, L2 flush, a GPU-side lead and adaptive repeats (ms)."""
    import torch

    # Warm-up: at least 3 calls and `warmup_ms` of wall time, so JIT, handles and clocks settle.
    t0 = time.perf_counter()
    calls = 0
    while calls < 3 or (time.perf_counter() - t0) * 1e3 < settings.warmup_ms:
        fn()
        calls += 1
        torch.cuda.synchronize()
        if calls >= 10_000:
            break
    enqueue_ms = host_enqueue_ms(fn)
    lead_cycles = int(cycles_per_us() * (LEAD_MIN_US + LEAD_FACTOR * enqueue_ms * 1e3))
    samples: list[float] = []
    batch = 10
    start_wall = time.perf_counter()
    stop_reason = "max_repeats"
    while len(samples) < settings.max_repeats:
        events = []
        batch = min(batch, settings.max_repeats - len(samples))
        for _ in range(batch):
            if flusher is not None:
                flusher()
            torch.cuda._sleep(lead_cycles)
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            events.append((s, e))
        torch.cuda.synchronize()
        samples.extend(s.elapsed_time(e) for s, e in events)
        st = summarize(samples)
        if len(samples) >= settings.min_repeats and st["rel_sem"] <= settings.target_rel_sem:
            stop_reason = "converged"
            break
        if time.perf_counter() - start_wall > settings.budget_s and len(samples) >= settings.min_repeats:
            stop_reason = "budget"
            break
        batch = min(100, batch * 2)
    return {"samples": samples, "stats": summarize(samples), "stop": stop_reason, "timer": "cuda_event",
            "host_enqueue_ms": enqueue_ms}


def time_host(fn: Callable[[], Any], settings: TimingSettings, sync: Callable[[], None] | None = None) -> dict[str, Any]:
    """Host-clock timing (CPU variants): the same statistics with time.perf_counter."""
    def once() -> float:
        t = time.perf_counter()
        fn()
        if sync:
            sync()
        return (time.perf_counter() - t) * 1e3

    first = once()  # warm-up, and a measure of how slow a call is
    min_rep = settings.min_repeats if first / 1e3 < SLOW_CPU_CALL_S else 3
    samples: list[float] = []
    start = time.perf_counter()
    stop = "max_repeats"
    while len(samples) < settings.max_repeats:
        samples.append(once())
        if len(samples) >= min_rep:
            st = summarize(samples)
            if st["rel_sem"] <= settings.target_rel_sem:
                stop = "converged"
                break
            if time.perf_counter() - start > settings.budget_s:
                stop = "budget"
                break
    return {"samples": samples, "stats": summarize(samples), "stop": stop, "timer": "host"}


def time_e2e(fn: Callable[[], Any], repeats: int) -> float:
    """Median host-clock latency of call + synchronize (what a user's Python code waits for)."""
    import torch

    xs = []
    for _ in range(max(1, repeats)):
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        xs.append((time.perf_counter() - t) * 1e3)
    return statistics.median(xs)


def time_graph(fn: Callable[[], Any], replays: int = 20) -> float | None:
    """Median per-call time of a CUDA-graph replay of `fn` (launch overhead removed), or None when
    the call cannot be captured (some backends sync or allocate in ways graphs refuse)."""
    import torch

    try:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):
                fn()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        g.replay()
        torch.cuda.synchronize()
        xs = []
        lead = int(cycles_per_us() * (LEAD_MIN_US + 30.0))
        for _ in range(replays):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(lead)
            a.record()
            g.replay()
            b.record()
            torch.cuda.synchronize()
            xs.append(a.elapsed_time(b))
        del g
        return statistics.median(xs)
    except Exception:
        torch.cuda.synchronize()
        return None


def peak_memory(fn: Callable[[], Any]) -> tuple[int, int]:
    """(peak bytes allocated during one call, bytes above what was allocated before it)."""
    import torch

    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    r = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    del r
    return int(peak), int(peak - before)


def measure(variant, problem: AttentionProblem, inputs: Inputs, ref: Reference | None, device: str,
            settings: TimingSettings, tol: Tolerance | None = None, l2_bytes: int = 0,
            flusher: L2Flusher | None = None, do_timing: bool = True) -> dict[str, Any]:
    """Check then time one variant on one problem. Returns the measurement fields of a row.

    Raises whatever the variant raises; the caller turns that into status 'failed' or 'unsupported'.
    """
    import torch

    tol = tol or DEFAULT_TOLERANCE[problem.dtype]
    row: dict[str, Any] = {"device": device, "seed": inputs.seed}
    if ref is not None:
        chk = check_correctness(variant, problem, inputs, ref, device, tol)
        row.update(
            correct=chk["correct"], max_abs_err=chk["max_abs_err"], rel_err=chk["rel_err"],
            errors=chk["errors"], out_sample=chk["out_sample"], ref_sample=chk["ref_sample"],
            reference=ref.kind, rtol=tol.rtol, atol=tol.atol,
        )
    if not do_timing:
        return row
    ts, dout = _prepare(problem, inputs, device, variant.name)
    out = torch.empty_like(ts[0]) if variant.kind in ("cuda", "user") and problem.direction == "fwd" else None
    _, timed = make_call(variant, problem, ts, dout, out)
    if device == "cuda":
        if flusher is None and settings.flush_l2 and l2_bytes:
            flusher = L2Flusher(l2_bytes)
        res = time_cuda(timed, settings, flusher if settings.flush_l2 else None)
        row["e2e_ms"] = time_e2e(timed, settings.e2e_repeats)
        row["host_enqueue_ms"] = res["host_enqueue_ms"]
        st = res["stats"]
        if settings.graph and st["median"] < GRAPH_WORTHY_MS and problem.direction == "fwd":
            row["graph_ms"] = time_graph(timed)
        row["peak_mem_bytes"], row["extra_mem_bytes"] = peak_memory(timed)
    else:
        res = time_host(timed, settings)
        st = res["stats"]
        row["e2e_ms"] = st["median"]
    row.update(
        timer=res["timer"], stop=res["stop"], samples_ms=res["samples"], n=st["n"], median_ms=st["median"],
        mean_ms=st["mean"], std_ms=st["std"], ci95_low_ms=st["ci95_low"], ci95_high_ms=st["ci95_high"],
        min_ms=st["min"], rel_sem=st["rel_sem"],
    )
    return row
