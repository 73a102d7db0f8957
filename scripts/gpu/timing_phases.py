"""Where the timing stage's wall time goes (run on a GPU machine): wraps the harness's phases with
wall clocks, runs `faprof profile` in this process (--no-isolate) and prints seconds per phase.

    python scripts/gpu/timing_phases.py [--scenario l4_causal] [--out DIR] [profile args...]
"""

from __future__ import annotations

import functools
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

SPENT: dict[str, float] = defaultdict(float)
CALLS: dict[str, int] = defaultdict(int)


def timed(fn, key: str):
    """`fn`, adding its wall time and calls to SPENT[key] / CALLS[key]."""
    @functools.wraps(fn)
    def inner(*a, **k):
        t = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            SPENT[key] += time.perf_counter() - t
            CALLS[key] += 1

    return inner


def wrap(mod, name: str) -> None:
    setattr(mod, name, timed(getattr(mod, name), f"{mod.__name__.split('.')[-1]}.{name}"))


def main() -> int:
    from faprof.cli import main as cli
    from faprof.correctness import check as correctness
    from faprof.correctness import reference
    from faprof.run import local as runner
    from faprof.timing import cupti_timer, gpu_monitor, harness

    for n in ("time_cuda", "time_e2e", "time_graph", "peak_memory", "host_enqueue_ms", "sm_clock_mhz", "time_host",
              "measure"):
        wrap(harness, n)
    for n in ("check_correctness", "check_repeat", "make_inputs"):
        wrap(correctness, n)
    wrap(reference, "compute_reference")  # faprof.run.tasks calls both through their modules
    wrap(runner, "run_one")  # faprof.run.local calls it by this name (imported from faprof.run.finish)
    cupti_timer.KernelTimer.collect = timed(cupti_timer.KernelTimer.collect, "KernelTimer.collect")
    harness.L2Flusher.__call__ = timed(harness.L2Flusher.__call__, "L2Flusher.__call__")
    gpu_monitor.Monitor.read = timed(gpu_monitor.Monitor.read, "Monitor.read")
    args = sys.argv[1:] or ["--scenario", "l4_causal"]
    t = time.perf_counter()
    try:
        cli(["profile", "--no-isolate", "--allow-failures", *args], standalone_mode=False)
    finally:
        total = time.perf_counter() - t
        print(f"\n{'phase':34s} {'calls':>6s} {'seconds':>8s}")
        for k, v in sorted(SPENT.items(), key=lambda kv: -kv[1]):
            print(f"{k:34s} {CALLS[k]:6d} {v:8.2f}")
        print(f"{'(whole command)':34s} {'':6s} {total:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
