// fa3_bwd_a.cu — step (a) of the Hopper backward (issue 28): FlashAttention-2's KV-block-parallel
// backward with all five GEMMs on wgmma.mma_async (the tile math and layouts: kernels/fa3_bwd.cuh),
// loads by cp.async.
//
// Kernels per call: fa3_bwd_preprocess_kernel (delta, lse2; kernels/fa3_bwd_pre.cu), dq_accum
// zeroed, fa3_bwd_a_kernel, fa3_bwd_convert_kernel.
//
// fa3_bwd_a_kernel: grid (key blocks of BN = 128, H, B), 256 threads = 2 warpgroups x 64 keys, one
// block per SM. K and V arrive once by cp.async; each query tile's Q, dO, lse2 and delta go through
// two buffers: at the top of step i the block waits for tile i, fences (cp.async writes through the
// generic proxy, wgmma reads through the async proxy), meets at a barrier — which also ends every
// warp's use of tile i−1's buffer and of sdS — and issues tile i+1 into the other buffer, so the copy
// runs under all of step i. Causal: a block starts at the first query tile that reaches its first
// key; tiles crossing the diagonal are masked, the others not.
//
// Configs: D=128 with BM = 64 query rows per step, D=64 with BM = 128 (see BwdCfg). sm_90a only: on
// other architectures the kernel is empty (it traps) and the launcher returns cudaErrorNotSupported
// before launching anything.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "fa3_bwd.cuh"
#include "faprof_kernels.h"

namespace faprof_fa3_bwd {

// BwdConfig<D, BM>: template integers (D, BM, causal); BN = 128.
// faprof:launch kernel=fa3_bwd_a_kernel D=A0 threads=256 dyn_smem=512*A0+8*A1*A0+256*A1+16*A1+1024
// (BwdConfig's static_assert keeps these in step with SMEM_BYTES: 4·BN·D + 8·BM·D + 2·BN·BM + 16·BM + 1024.)

template <typename T, class C, bool CAUSAL>
__global__ void __launch_bounds__(C::THREADS, 1)
fa3_bwd_a_kernel(const T* __restrict__ q,            // [B, H, Sq, D]
                 const T* __restrict__ k,            // [B, H, Sk, D]
                 const T* __restrict__ v,            // [B, H, Sk, D]
                 const T* __restrict__ dout,         // [B, H, Sq, D]
                 const float* __restrict__ lse2,     // [B, H, Sq_pad]
                 const float* __restrict__ delta,    // [B, H, Sq_pad]
                 float* __restrict__ dq_accum,       // [B, H, Sq, D], zeroed
                 T* __restrict__ dk,                 // [B, H, Sk, D]
                 T* __restrict__ dv,                 // [B, H, Sk, D]
                 int Sq, int Sk, int Sq_pad, float scale, float scale_log2) {
#if FAPROF_SM90A
  using faprof_fa3::cp_async_16;
  using faprof_fa3::cp_async_commit;
  using faprof_fa3::cp_async_wait;
  using faprof_fa3::load_tile_sw128;
  constexpr bool BF16 = std::is_same<T, __nv_bfloat16>::value;
  constexpr int D = C::D, BN = C::BN, BM = C::BM;
  extern __shared__ unsigned char smem_raw[];
  // SW128 blocks must start 1024-byte aligned (the descriptors' base offset is 0).
  unsigned char* smem =
      reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));

  const int tid = threadIdx.x;
  const int wg = tid >> 7;
  const int warp = (tid >> 5) & 3;
  const int lane = tid & 31;
  const int g = lane >> 2, t = lane & 3;
  const int bh = blockIdx.z * gridDim.y + blockIdx.y;
  const int n0 = blockIdx.x * BN;

  const T* qg = q + static_cast<size_t>(bh) * Sq * D;
  const T* dog = dout + static_cast<size_t>(bh) * Sq * D;
  const float* l2g = lse2 + static_cast<size_t>(bh) * Sq_pad;
  const float* dlg = delta + static_cast<size_t>(bh) * Sq_pad;

  const uint32_t s0 = smem_u32(smem);
  const uint32_t sK = s0, sV = s0 + C::OFF_V, sQ0 = s0 + C::OFF_Q, sdO0 = s0 + C::OFF_DO, sdS = s0 + C::OFF_DS;
  const uint32_t sL0 = s0 + C::OFF_L;

  const QueryTiles tiles(n0, Sq, BM, CAUSAL, blockIdx.x, gridDim.x);

  // Query tile m's Q, dO, lse2 and delta into buffer b (one cp.async group with the caller's commit).
  auto stage = [&](int b, int m) {
    const int r0 = m * BM;
    load_tile_sw128<BM, D, C::THREADS>(sQ0 + b * C::Q_BYTES, qg, r0, Sq, tid);
    load_tile_sw128<BM, D, C::THREADS>(sdO0 + b * C::Q_BYTES, dog, r0, Sq, tid);
    if (tid < BM / 2) {  // 2·BM floats = BM/2 chunks of 16 bytes, always in bounds (padded rows)
      const float* src = tid < BM / 4 ? l2g + r0 + 4 * tid : dlg + r0 + 4 * (tid - BM / 4);
      cp_async_16(sL0 + b * C::L_BYTES + 16 * tid, src, true);
    }
  };

  load_tile_sw128<BN, D, C::THREADS>(sK, k + static_cast<size_t>(bh) * Sk * D, n0, Sk, tid);
  load_tile_sw128<BN, D, C::THREADS>(sV, v + static_cast<size_t>(bh) * Sk * D, n0, Sk, tid);
  if (tiles.n_iter > 0) stage(0, tiles.tile(0));
  cp_async_commit();

  float acc_dk[D / 2], acc_dv[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) acc_dk[i] = acc_dv[i] = 0.f;

  float* dq_bh = dq_accum + static_cast<size_t>(bh) * Sq * D;
  for (int i = 0; i < tiles.n_iter; ++i) {
    const int buf = i & 1;
    const int q0 = tiles.tile(i) * BM;
    cp_async_wait<0>();           // tile i (and, at i = 0, K and V) has landed for this thread
    faprof_fa3::fence_proxy_async();
    __syncthreads();              // ... for every thread; every warp is done with step i−1
    if (i + 1 < tiles.n_iter) stage(buf ^ 1, tiles.tile(i + 1));
    cp_async_commit();
    bwd_tile<BF16, C, CAUSAL>(acc_dk, acc_dv, sK, sV, sQ0 + buf * C::Q_BYTES, sdO0 + buf * C::Q_BYTES, sdS,
                              reinterpret_cast<const float*>(smem + C::OFF_L + buf * C::L_BYTES), dq_bh, n0, q0, Sq,
                              Sk, scale_log2, wg, warp, g, t);
  }
  cp_async_wait<0>();  // a block with no query tile (causal, keys past every query) still has K, V in flight

  store_dkdv<T, C>(acc_dk, acc_dv, dk + static_cast<size_t>(bh) * Sk * D, dv + static_cast<size_t>(bh) * Sk * D, n0, Sk,
                   scale, wg, warp, g, t);
#else
  __trap();  // sm_90a only (wgmma); the launcher refuses other devices before launching
#endif
}

template <typename T, class C, bool CAUSAL>
cudaError_t launch_a(const BwdArgs& a) {
  auto kernel = fa3_bwd_a_kernel<T, C, CAUSAL>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::SMEM_BYTES);
  if (err != cudaSuccess) return err;
  const dim3 grid((a.Sk + C::BN - 1) / C::BN, a.H, a.B);
  kernel<<<grid, C::THREADS, C::SMEM_BYTES, a.stream>>>(
      static_cast<const T*>(a.q), static_cast<const T*>(a.k), static_cast<const T*>(a.v),
      static_cast<const T*>(a.dout), a.lse2, a.delta, a.dq_accum, static_cast<T*>(a.dk), static_cast<T*>(a.dv), a.Sq,
      a.Sk, padded_seq(a.Sq), a.scale, a.scale * kLog2e);
  return cudaGetLastError();
}

template <class C>
cudaError_t dispatch_a(const BwdArgs& a) {
  if (a.bf16) return a.causal ? launch_a<__nv_bfloat16, C, true>(a) : launch_a<__nv_bfloat16, C, false>(a);
  return a.causal ? launch_a<__half, C, true>(a) : launch_a<__half, C, false>(a);
}

}  // namespace faprof_fa3_bwd

cudaError_t faprof_fa3_bwd_a(const void* q, const void* k, const void* v, const void* o, const void* dout,
                             const float* lse, void* dq, void* dk, void* dv, float* lse2, float* delta,
                             float* dq_accum, int B, int H, int Sq, int Sk, int D, float scale, bool causal, bool bf16,
                             cudaStream_t stream) {
  using namespace faprof_fa3_bwd;
  const BwdArgs a{q, k, v, o, dout, lse, dq, dk, dv, lse2, delta, dq_accum, B, H, Sq, Sk, D, scale, causal, bf16, stream};
  cudaError_t err = validate(a);
  if (err != cudaSuccess) return err;
  if ((err = preprocess(a)) != cudaSuccess) return err;
  err = D == 64 ? dispatch_a<BwdCfg<64>>(a) : dispatch_a<BwdCfg<128>>(a);
  if (err != cudaSuccess) return err;
  return convert_dq(a);
}
