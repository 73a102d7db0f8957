"""Benchmarks of the harness' own timing on a GPU (run on the GPU machine; prints a table).

1. The L2 flush: an elementwise kernel that reads and writes 16 MB (fits in L2), timed by CUPTI
   kernel records warm (no flush), after a write-only flush (faprof's old flush: `fill_` of 2x L2,
   which leaves dirty lines), and after faprof's flush (write, then read a second 2x-L2 buffer).
   The DRAM floor is the bytes moved over the GPU's streaming bandwidth, measured here by a 1 GiB
   device copy. A clean flush puts the kernel near the floor.
2. The timer floor: an empty kernel timed by CUDA events and by CUPTI's kernel record.
Everything is timed through the harness' own loop (faprof.harness.time_cuda).

    python scripts/gpu/timing_check.py [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> int:
    import torch

    from faprof.timing import gpu_clock, harness

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path)
    ap.add_argument("--reps", type=int, default=200)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("timing_check: no CUDA GPU", file=sys.stderr)
        return 2
    props = torch.cuda.get_device_properties(0)
    l2 = props.L2_cache_size
    from faprof.model.settings import TimingSettings

    # Timed through the harness' own loop (batches of calls, each after the given flush and the
    # GPU-side lead), so the figures are what a faprof row would read.
    settings = TimingSettings(warmup_ms=20, budget_s=1.0, min_repeats=a.reps, max_repeats=a.reps, graph=False)
    res: dict[str, float | str] = {"gpu": props.name, "l2_bytes": l2}

    def kernel_us(fn, flush=None, timer="cupti") -> float:
        import dataclasses

        r = harness.time_cuda(fn, dataclasses.replace(settings, timer=timer), flush)
        if timer == "cupti" and r["timer"] != "cupti":
            raise SystemExit(f"timing_check: CUPTI unavailable: {r['timer_note']}")
        return r["stats"]["median"] * 1e3

    # -- the flush
    n = 16 * 2**20 // 4
    x = torch.randn(n, device="cuda")
    y = torch.empty_like(x)

    def work():
        torch.add(x, 1.0, out=y)

    old = torch.empty(2 * l2 // 4, device="cuda")
    new = gpu_clock.L2Flusher(l2)
    warm = kernel_us(work)
    old_us = kernel_us(work, flush=lambda: old.fill_(1.0))
    new_us = kernel_us(work, flush=new)
    # streaming bandwidth: a 1 GiB copy kernel (torch.add into another buffer), bytes read + written
    big = torch.randn(2**28, device="cuda")
    big2 = torch.empty_like(big)
    copy_us = kernel_us(lambda a=big, b=big2: torch.add(a, 1.0, out=b))
    bw = 2 * big.numel() * 4 / (copy_us * 1e-6)
    floor_us = 2 * n * 4 / bw * 1e6
    res.update(flush_warm_us=warm, flush_old_us=old_us, flush_new_us=new_us, dram_floor_us=floor_us,
               copy_gbs=bw / 1e9)
    del big, big2

    # -- the timer floor: an empty kernel by CUDA events (the harness' fallback) and by CUPTI
    def empty_kernel():
        torch.cuda._sleep(0)

    res.update(event_empty_kernel_us=kernel_us(empty_kernel, timer="events"),
               cupti_empty_kernel_us=kernel_us(empty_kernel))

    print(f"\n=== timing check on {props.name} (medians of {a.reps}) ===")
    print("16 MB read + 16 MB write elementwise kernel (CUPTI kernel time):")
    print(f"  warm L2                       {warm:8.2f} us")
    print(f"  after write-only flush (old)  {old_us:8.2f} us  ({old_us / floor_us:.2f}x the DRAM floor)")
    print(f"  after write+read flush (new)  {new_us:8.2f} us  ({new_us / floor_us:.2f}x the DRAM floor)")
    print(f"  DRAM floor                    {floor_us:8.2f} us  (32 MiB at {bw / 1e9:.0f} GB/s, streaming 1 GiB in + 1 GiB out)")
    print("timer floor (an empty kernel, harness loop):")
    print(f"  CUDA events around it   {res['event_empty_kernel_us']:6.2f} us")
    print(f"  CUPTI kernel record     {res['cupti_empty_kernel_us']:6.2f} us")
    if a.out:
        a.out.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
