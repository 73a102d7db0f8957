"""GPU-side primitives of the timing harness: the L2 flush, the spin that keeps the GPU ahead of the
host, the SM clock, the host's enqueue cost, end-to-end and CUDA-graph replay times, peak memory.
faprof.timing.harness composes them into a measurement."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any


class L2Flusher:
    """Leaves the L2 holding none of the timed call's data and no dirty lines.

    Writing a 2x-L2 buffer evicts the call's lines but leaves the L2 full of dirty lines whose
    write-back the next kernel pays for (seen on the H100: a 16 MB read+write kernel took 13.5 µs
    after a write-only flush, 9.8 µs after this one, against a ~9.6 µs DRAM floor). Reading a second
    2x-L2 buffer after the write forces those write-backs here, outside the timed region, and
    leaves clean lines of a buffer the call never touches.
    """

    def __init__(self, l2_bytes: int, device: str = "cuda"):
        import torch

        n = max(2 * l2_bytes, 1 << 20) // 4
        self.write_buf = torch.empty(n, dtype=torch.float32, device=device)
        self.read_buf = torch.ones(n, dtype=torch.float32, device=device)
        self.sink = torch.empty((), dtype=torch.float32, device=device)

    def __call__(self) -> None:
        import torch

        self.write_buf.fill_(1.0)
        torch.sum(self.read_buf, dim=0, dtype=torch.float32, out=self.sink)


#: The GPU must already be busy when the start event is recorded, or the event pair also times
#: the host's launch overhead (seen on the H100: sdpa_flash at B=1 H=1 S=128 read 0.116 ms by plain
#: events and 0.019 ms by graph replay). Before each timed call the harness enqueues a spin of
#: LEAD_FACTOR x the call's host enqueue time (plus LEAD_MIN_US), so the CPU is ahead of the GPU.
LEAD_FACTOR = 2.0
LEAD_MIN_US = 20.0

_CYCLES_PER_US: float | None = None


def _spin_rate(cycles: int) -> float:
    """GPU cycles per microsecond of a `torch.cuda._sleep(cycles)`, timed with events (= SM MHz)."""
    import torch

    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    torch.cuda._sleep(cycles)
    b.record()
    torch.cuda.synchronize()
    return cycles / (a.elapsed_time(b) * 1e3)


def cycles_per_us() -> float:
    """Calibrate torch.cuda._sleep once per process: GPU clock cycles per microsecond."""
    global _CYCLES_PER_US
    if _CYCLES_PER_US is None:
        import torch

        torch.cuda._sleep(2_000_000)  # warm
        torch.cuda.synchronize()
        _CYCLES_PER_US = _spin_rate(2_000_000)
    return _CYCLES_PER_US


def sm_clock_mhz() -> float:
    """The SM clock now, from a ~2 ms spin (events add ~µs to 2 ms: well under 1%)."""
    return _spin_rate(int(cycles_per_us() * 2000))


#: The GPU spin (µs) host_enqueue_ms runs under each call, so an enqueue never waits for the GPU ...
ENQUEUE_SPIN_US = 2000

#: ... unless the call itself synchronizes (a cudaFree when the caching allocator trims, a copy to
#: the host): an enqueue this share of the spin or longer waited for the GPU, so it is not host cost.
ENQUEUE_BLOCKED_SHARE = 0.5


def host_enqueue_ms(fn: Callable[[], Any], calls: int = 5) -> float:
    """Median host time to *enqueue* one call (no synchronize): the launch cost the CPU pays."""
    import torch

    xs = []
    for _ in range(calls):
        torch.cuda.synchronize()
        torch.cuda._sleep(int(cycles_per_us() * ENQUEUE_SPIN_US))  # keep the GPU busy so enqueue never blocks on it
        t = time.perf_counter()
        fn()
        xs.append((time.perf_counter() - t) * 1e3)
        torch.cuda.synchronize()
    return statistics.median(xs)


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
