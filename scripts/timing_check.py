"""Benchmarks of the harness' own timing on a GPU (run on the GPU machine; prints a table).

1. The L2 flush: an elementwise kernel that reads and writes 16 MB (fits in L2), timed by CUPTI
   kernel records warm (no flush), after a write-only flush (faprof's old flush: `fill_` of 2x L2,
   which leaves dirty lines), and after faprof's flush (write, then read a second 2x-L2 buffer).
   The DRAM floor is the bytes moved over the GPU's streaming bandwidth, measured here by a 1 GiB
   device copy. A clean flush puts the kernel near the floor.
2. The timer floor: an empty event pair, an event pair around an empty kernel, and CUPTI's record
   of the same empty kernel.

    python scripts/timing_check.py [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    import torch

    from faprof import cupti_timer, harness

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path)
    ap.add_argument("--reps", type=int, default=200)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("timing_check: no CUDA GPU", file=sys.stderr)
        return 2
    props = torch.cuda.get_device_properties(0)
    l2 = props.L2_cache_size
    torch.zeros(1, device="cuda").add_(1.0)  # a CUDA context and a first kernel before CUPTI is enabled
    torch.cuda.synchronize()
    timer = cupti_timer.KernelTimer.open()
    res: dict[str, float | str] = {"gpu": props.name, "l2_bytes": l2}

    def kernel_us(fn, before=None, reps=a.reps) -> float:
        xs = []
        for _ in range(reps):
            if before is not None:
                before()
            (cid,) = timer.new_ids(1)
            with timer.call(cid):
                fn()
            torch.cuda.synchronize()
            got = timer.collect(expect=[cid])
            if cid not in got:
                raise SystemExit(f"timing_check: CUPTI attributed no kernel to the call: {timer.last_counts}")
            xs.append(got[cid].sum_ns / 1e3)
        return statistics.median(xs)

    # -- the flush (a few tagged warm-up calls first: CUPTI's first records after enabling can be late)
    for _ in range(3):
        (cid0,) = timer.new_ids(1)
        with timer.call(cid0):
            torch.cuda._sleep(1000)
        torch.cuda.synchronize()
        timer.collect(expect=[cid0], wait_s=0.5)
    n = 16 * 2**20 // 4
    x = torch.randn(n, device="cuda")
    y = torch.empty_like(x)

    def work():
        torch.add(x, 1.0, out=y)

    old = torch.empty(2 * l2 // 4, device="cuda")
    new = harness.L2Flusher(l2)
    warm = kernel_us(work, before=work)
    old_us = kernel_us(work, before=lambda: old.fill_(1.0))
    new_us = kernel_us(work, before=new)
    # streaming bandwidth: a 1 GiB copy, bytes read + written
    big = torch.randn(2**28, device="cuda")
    big2 = torch.empty_like(big)
    copy_us = kernel_us(lambda a=big, b=big2: b.copy_(a), reps=20)
    bw = 2 * big.numel() * 4 / (copy_us * 1e-6)
    floor_us = 2 * n * 4 / bw * 1e6
    res.update(flush_warm_us=warm, flush_old_us=old_us, flush_new_us=new_us, dram_floor_us=floor_us,
               copy_gbs=bw / 1e9)
    del big, big2

    # -- the timer floor
    def ev_pair(fn) -> float:
        xs = []
        for _ in range(a.reps):
            torch.cuda._sleep(int(harness.cycles_per_us() * 50))
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            torch.cuda.synchronize()
            xs.append(s.elapsed_time(e) * 1e3)
        return statistics.median(xs)

    def empty_kernel():
        torch.cuda._sleep(0)

    res.update(event_empty_pair_us=ev_pair(lambda: None), event_empty_kernel_us=ev_pair(empty_kernel),
               cupti_empty_kernel_us=kernel_us(empty_kernel))
    timer.close()

    print(f"\n=== timing check on {props.name} (medians of {a.reps}) ===")
    print("16 MB read + 16 MB write elementwise kernel (CUPTI kernel time):")
    print(f"  warm L2                       {warm:8.2f} us")
    print(f"  after write-only flush (old)  {old_us:8.2f} us  ({old_us / floor_us:.2f}x the DRAM floor)")
    print(f"  after write+read flush (new)  {new_us:8.2f} us  ({new_us / floor_us:.2f}x the DRAM floor)")
    print(f"  DRAM floor                    {floor_us:8.2f} us  (32 MiB at {bw / 1e9:.0f} GB/s, 1 GiB copy)")
    print("timer floor:")
    print(f"  empty CUDA-event pair              {res['event_empty_pair_us']:6.2f} us")
    print(f"  event pair around an empty kernel  {res['event_empty_kernel_us']:6.2f} us")
    print(f"  CUPTI record of that empty kernel  {res['cupti_empty_kernel_us']:6.2f} us")
    if a.out:
        a.out.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
