// fa3_bwd_c.cu — step (c) of the Hopper backward (issue 28): step (b) (kernels/fa3_bwd_b.cu) warp-
// specialized: a TMA producer warpgroup (setmaxnreg 24) filling a 3-stage Q/dO/lse2/delta ring whose
// stages the consumers hand back through empty mbarriers, two consumer warpgroups (setmaxnreg 240)
// that meet only at named barriers, double-buffered dSᵀ, Sᵀ and dPᵀ issued together, Pᵀ kept in
// fp32 for dSᵀ, and at D=128 dV issued under the dSᵀ math. dQ still goes to dq_accum by
// red.global.add.v4.f32 from the consumers (step d moves it to the TMA unit). The schedule, the
// barriers and why each is safe: kernels/fa3_bwd_ws.cuh.
//
// Kernels per call: fa3_bwd_preprocess_kernel (delta, lse2), dq_accum zeroed, fa3_bwd_c_kernel,
// fa3_bwd_convert_kernel (kernels/fa3_bwd_pre.cu). Configs: D=128 with BM = 64 query rows per tile,
// D=64 with BM = 128 (WsCfgC). sm_90a only: elsewhere the kernel is empty (it traps) and the launcher
// returns cudaErrorNotSupported before launching anything.

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "fa3_bwd.cuh"
#include "fa3_bwd_ws.cuh"
#include "faprof_kernels.h"

namespace faprof_fa3_bwd {

// BwdWsConfig<D, BM, STAGES, DQ_SMEM>: template integers (D, BM, STAGES, DQ_SMEM, causal).
// faprof:launch kernel=fa3_bwd_c_kernel D=A0 threads=384 dyn_smem=512*A0+A2*(4*A1*A0+8*A1)+512*A1+4*A3*A1*A0+1088
// faprof:setmaxnreg kernel=fa3_bwd_c_kernel producer=24 consumer=240
template <typename T, class C, bool CAUSAL>
__global__ void __launch_bounds__(C::THREADS, 1) fa3_bwd_c_kernel(FAPROF_BWD_WS_PARAMS) {
  static_assert(!C::DQ_SMEM, "step c adds dQ with red.global.add");
#if FAPROF_SM90A
  ws_body<T, C, CAUSAL>(&tm_q, &tm_k, &tm_v, &tm_do, lse2, delta, dq_accum, dk, dv, Sq, Sk, Sq_pad, scale, scale_log2);
#else
  __trap();  // sm_90a only (wgmma, TMA, setmaxnreg); the launcher refuses other devices before launching
#endif
}

template <class C>
cudaError_t dispatch_c(const BwdArgs& a) {
  if (a.bf16)
    return a.causal ? launch_ws<__nv_bfloat16, C>(a, fa3_bwd_c_kernel<__nv_bfloat16, C, true>)
                    : launch_ws<__nv_bfloat16, C>(a, fa3_bwd_c_kernel<__nv_bfloat16, C, false>);
  return a.causal ? launch_ws<__half, C>(a, fa3_bwd_c_kernel<__half, C, true>)
                  : launch_ws<__half, C>(a, fa3_bwd_c_kernel<__half, C, false>);
}

}  // namespace faprof_fa3_bwd

cudaError_t faprof_fa3_bwd_c(const void* q, const void* k, const void* v, const void* o, const void* dout,
                             const float* lse, void* dq, void* dk, void* dv, float* lse2, float* delta,
                             float* dq_accum, int B, int H, int Sq, int Sk, int D, float scale, bool causal, bool bf16,
                             cudaStream_t stream) {
  using namespace faprof_fa3_bwd;
  const BwdArgs a{q, k, v, o, dout, lse, dq, dk, dv, lse2, delta, dq_accum, B, H, Sq, Sk, D, scale, causal, bf16, stream};
  cudaError_t err = validate(a);
  if (err != cudaSuccess) return err;
  if ((err = preprocess(a)) != cudaSuccess) return err;
  err = D == 64 ? dispatch_c<WsCfgC<64>>(a) : dispatch_c<WsCfgC<128>>(a);
  if (err != cudaSuccess) return err;
  return convert_dq(a);
}
