// TEST ONLY: the deliberately slowed copy for faprof gate's GPU check (see gate_attn.cuh).
// Profiled under the baseline's variant name, with the baseline's launcher name:
//   faprof profile --kernel gk=tests/gate/gate_attn_slow.cu:gate_attn ...
#include "faprof_attention.h"
#include "gate_attn.cuh"

FAPROF_KERNEL_INFO("dtypes=fp16,bf16;head_dims=64;compute=cuda_core");

// Every 16th K/V tile processed twice: about 1/16 = 6% more of the per-key work (the loads into
// shared memory are not repeated, so the call should be 4-6% slower, past the gate's default 2%).
constexpr int kExtraEvery = 16;

extern "C" FAPROF_LAUNCHER(gate_attn) {
    (void)lse;
    return gate::launch_gate_attn(q, k, v, out, B, H, Sq, Sk, D, scale, causal, dtype, stream, kExtraEvery);
}
