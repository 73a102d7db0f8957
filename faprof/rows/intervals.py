"""GPU busy time of a call from its kernels' (start, end) timestamps.

A call's GPU time is the time at least one of its kernels runs: the length of the union of the
kernels' intervals. On one stream without overlap that is the sum of the durations. It is not when
kernels overlap: a kernel launched with programmatic dependent launch (PDL, `cudaLaunchKernelEx`
with programmatic stream serialization; FlashAttention-3's and faprof's split-KV combine steps)
starts while its predecessor still runs and waits in `griddepcontrol.wait`, so its CUPTI/nsys
duration covers time the predecessor already counts. Summed, a split-KV decode whose combine
kernel is launched that way read 94 µs where CUDA events read 52 µs (H100, B=1 Hq=64 Hkv=8 Sq=1
Sk=32768 bf16, 2026-11-27); the union reads the time the GPU was busy for the call.
"""

from __future__ import annotations

from collections.abc import Iterable


def busy_ns(intervals: Iterable[tuple[int, int]]) -> int:
    """Length of the union of [start, end) intervals (any order, overlapping or not)."""
    total = 0
    spans = sorted(intervals)
    if not spans:
        return 0
    cur_s, cur_e = spans[0]
    for s, e in spans[1:]:
        if s > cur_e:  # a gap: close the current run of overlapping kernels
            total += cur_e - cur_s
            cur_s, cur_e = s, e
        elif e > cur_e:
            cur_e = e
    return int(total + cur_e - cur_s)
