"""Timing: how long a variant's call takes on this machine, and whether the time can be trusted.

The harness (harness: correctness first through faprof.correctness, then the timed calls), the
kernel clock (cupti_timer: CUPTI activity records, CUDA events as the fallback), the GPU's clock
and enqueue lead (gpu_clock), NVML readings around a row (gpu_monitor), the defences of what was
timed (integrity: drained calls on new inputs, work outside the call; rotation: two input sets
alternated and checked) and the run's environment (env). The numbers a row's samples give
(statistics, stability, physical limits) are in faprof.rows, which the store reads too.
"""
