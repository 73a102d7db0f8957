"""A user variant that runs 'on the GPU' but launches no kernel: it returns its query tensor.

Used by scripts/record/record_nsys_fixtures.sh to record a real nsys capture that starts (the target
calls cudaProfilerStart and pushes its NVTX ranges) and holds no kernels at all.
"""

from faprof.variants import user_variant


def _no_kernels(q, k, v, causal, scale, out=None):
    return q  # no kernel launched: the capture has NVTX ranges and API calls, no kernels


user_variant("no_kernels", _no_kernels, description="returns q; launches no kernel (nsys fixture)",
             dtypes=("fp32",), directions=("fwd",))
