"""What a measurement row's numbers mean: pure functions of a row and the GPU database, no torch.

Sample statistics and the median's CI (stats), whether the samples are stable (stability), the
physical limits a row must not exceed (limits: FLOP/s and bytes/s against the GPU), throughput and
% of peak (derive), the between-run noise floors (noise_floor) and the union of kernel intervals
(intervals). The timing harness computes them when a row is written; the store recomputes them
when an older bundle is read, which is why they sit below both.
"""
