// TEST ONLY: the baseline of faprof gate's GPU check (see gate_attn.cuh): no extra work.
//   faprof profile --kernel gk=tests/gate/gate_attn.cu ...
#include "faprof_attention.h"
#include "gate_attn.cuh"

FAPROF_KERNEL_INFO("dtypes=fp16,bf16;head_dims=64;compute=cuda_core");

extern "C" FAPROF_LAUNCHER(gate_attn) {
    (void)lse;  // this kernel returns no log-sum-exp (faprof passes NULL)
    return gate::launch_gate_attn(q, k, v, out, B, H, Sq, Sk, D, scale, causal, dtype, stream, /*extra_every=*/0);
}
