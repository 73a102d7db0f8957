// fa3_bwd_d.cu — step (d) of the Hopper backward (issue 28): step (c) (kernels/fa3_bwd_c.cu) with the
// dQ write-back on the TMA unit: the consumers store their dQ blocks into an fp32 tile in shared
// memory (16-byte chunks permuted per row so that the stores are conflict-free) and warp 1 of the
// producer warpgroup adds the tile into dq_accum with one cp.reduce.async.bulk .add.f32 per query
// tile, instead of 8 red.global.add.v4 per consumer thread; the consumers go on to the next tile
// while the reduction runs. The handshake and why it is safe: kernels/fa3_bwd_ws.cuh.
//
// Kernels per call: fa3_bwd_preprocess_kernel (delta, lse2; kernels/fa3_bwd_pre.cu), dq_accum zeroed,
// fa3_bwd_d_kernel, fa3_bwd_d_convert_kernel (below: dq = dq_accum · scale with the chunk permutation
// undone). Configs: D=128 with BM = 64 and a 3-stage ring, D=64 with BM = 128 and 2 stages (WsCfgD:
// the 32 KiB dQ tile leaves no room for a third). sm_90a only, like step (c).

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "fa3_bwd.cuh"
#include "fa3_bwd_ws.cuh"
#include "faprof_kernels.h"

namespace faprof_fa3_bwd {

// BwdWsConfig<D, BM, STAGES, DQ_SMEM>: template integers (D, BM, STAGES, DQ_SMEM, causal).
// faprof:launch kernel=fa3_bwd_d_kernel D=A0 threads=384 dyn_smem=512*A0+A2*(4*A1*A0+8*A1)+512*A1+4*A3*A1*A0+1088
// faprof:setmaxnreg kernel=fa3_bwd_d_kernel producer=24 consumer=240
template <typename T, class C, bool CAUSAL>
__global__ void __launch_bounds__(C::THREADS, 1) fa3_bwd_d_kernel(FAPROF_BWD_WS_PARAMS) {
  static_assert(C::DQ_SMEM, "step d adds dQ through the shared-memory tile");
#if FAPROF_SM90A
  ws_body<T, C, CAUSAL>(&tm_q, &tm_k, &tm_v, &tm_do, lse2, delta, dq_accum, dk, dv, Sq, Sk, Sq_pad, scale, scale_log2);
#else
  __trap();  // sm_90a only (wgmma, TMA, setmaxnreg); the launcher refuses other devices before launching
#endif
}

// dq = dq_accum · scale in T with step d's chunk permutation undone: float4 i of the flat
// [B·H·Sq, D] dq_accum is chunk k' = i mod D/4 of row r = i / (D/4), i.e. row r mod Sq of its head,
// and holds columns 4·dq_swz_chunk(r mod Sq, k') .. +3 of dq's row r.
// faprof:launch kernel=fa3_bwd_d_convert_kernel threads=256 dyn_smem=0
template <typename T, int D>
__global__ void __launch_bounds__(256)
fa3_bwd_d_convert_kernel(const float* __restrict__ acc, T* __restrict__ dq, long long rows, int Sq, float scale) {
  constexpr bool BF16 = std::is_same<T, __nv_bfloat16>::value;
  constexpr int CPR = D / 4;  // 16-byte chunks per row
  const long long n = rows * CPR;
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int r = static_cast<int>(i / CPR);  // B·H·Sq_pad < 2^31 (validate)
    const int k = dq_swz_chunk(r % Sq, static_cast<int>(i % CPR));
    const float4 a = reinterpret_cast<const float4*>(acc)[i];
    uint2 o;
    o.x = pack2<BF16>(a.x * scale, a.y * scale);
    o.y = pack2<BF16>(a.z * scale, a.w * scale);
    *reinterpret_cast<uint2*>(dq + static_cast<size_t>(r) * D + 4 * k) = o;
  }
}

template <typename T, int D>
cudaError_t convert_d_t(const BwdArgs& a) {
  const long long rows = static_cast<long long>(a.B) * a.H * a.Sq;
  const long long quads = rows * (D / 4);
  const unsigned blocks = static_cast<unsigned>(quads / 256 + 1 < 65536 ? quads / 256 + 1 : 65536);
  fa3_bwd_d_convert_kernel<T, D><<<blocks, 256, 0, a.stream>>>(a.dq_accum, static_cast<T*>(a.dq), rows, a.Sq, a.scale);
  return cudaGetLastError();
}

cudaError_t convert_d(const BwdArgs& a) {
  if (a.bf16) return a.D == 64 ? convert_d_t<__nv_bfloat16, 64>(a) : convert_d_t<__nv_bfloat16, 128>(a);
  return a.D == 64 ? convert_d_t<__half, 64>(a) : convert_d_t<__half, 128>(a);
}

template <class C>
cudaError_t dispatch_d(const BwdArgs& a) {
  if (a.bf16)
    return a.causal ? launch_ws<__nv_bfloat16, C>(a, fa3_bwd_d_kernel<__nv_bfloat16, C, true>)
                    : launch_ws<__nv_bfloat16, C>(a, fa3_bwd_d_kernel<__nv_bfloat16, C, false>);
  return a.causal ? launch_ws<__half, C>(a, fa3_bwd_d_kernel<__half, C, true>)
                  : launch_ws<__half, C>(a, fa3_bwd_d_kernel<__half, C, false>);
}

}  // namespace faprof_fa3_bwd

cudaError_t faprof_fa3_bwd_d(const void* q, const void* k, const void* v, const void* o, const void* dout,
                             const float* lse, void* dq, void* dk, void* dv, float* lse2, float* delta,
                             float* dq_accum, int B, int H, int Sq, int Sk, int D, float scale, bool causal, bool bf16,
                             cudaStream_t stream) {
  using namespace faprof_fa3_bwd;
  const BwdArgs a{q, k, v, o, dout, lse, dq, dk, dv, lse2, delta, dq_accum, B, H, Sq, Sk, D, scale, causal, bf16, stream};
  cudaError_t err = validate(a);
  if (err != cudaSuccess) return err;
  if ((err = preprocess(a)) != cudaSuccess) return err;
  err = D == 64 ? dispatch_d<WsCfgD<64>>(a) : dispatch_d<WsCfgD<128>>(a);
  if (err != cudaSuccess) return err;
  return convert_d(a);
}
