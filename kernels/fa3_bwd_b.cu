// fa3_bwd_b.cu — step (b) of the Hopper backward (issue 28): step (a) (kernels/fa3_bwd_a.cu) with
// every load on the TMA unit, as the forward's step (b) does for K and V (kernels/fa3_wgmma.cu).
//
// fa3_bwd_b_kernel: the tile math of kernels/fa3_bwd.cuh unchanged; what differs is how tiles arrive:
//   * K and V: once, cp.async.bulk.tensor.3d over [B·H, Sk, D] tensor maps (128-byte swizzle, boxes
//     of [BN rows][64 columns], rows past Sk zero-filled by the hardware), completing on bar_kv;
//   * Q and dO of a query tile: the same kind of tensor maps with [BM rows][64] boxes; its lse2 and
//     delta: two 1-D bulk copies (cp.async.bulk) of BM floats from the padded workspaces. All four
//     complete on the mbarrier of one of two ring stages (expect_tx: the full boxes, out-of-bounds
//     rows included, plus 2·BM·4 bytes).
//   * Thread 0 issues tiles 0 and 1 in the prologue, and tile i+2 into stage i%2 right after the
//     barrier that ends step i (every warp's wgmmas reading the stage waited, its lse2/delta read),
//     so one tile is always in flight while the block computes the other. No warp specialization
//     yet (a later step): every warpgroup computes and thread 0 also issues.
//
// Configs, sm_90a only, and the query-tile order (causal start, non-causal stagger): as step (a).

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "fa3_bwd.cuh"
#include "faprof_kernels.h"

namespace faprof_fa3_bwd {

// BwdConfig<D, BM>: template integers (D, BM, causal); 64 bytes of mbarriers after the tiles.
// faprof:launch kernel=fa3_bwd_b_kernel D=A0 threads=256 dyn_smem=512*A0+8*A1*A0+256*A1+16*A1+1024+64

template <typename T, class C, bool CAUSAL>
__global__ void __launch_bounds__(C::THREADS, 1)
fa3_bwd_b_kernel(const __grid_constant__ CUtensorMap tm_q,   // [B·H, Sq, D], box [BM rows][64]
                 const __grid_constant__ CUtensorMap tm_k,   // [B·H, Sk, D], box [BN rows][64]
                 const __grid_constant__ CUtensorMap tm_v,   // [B·H, Sk, D], box [BN rows][64]
                 const __grid_constant__ CUtensorMap tm_do,  // [B·H, Sq, D], box [BM rows][64]
                 const float* __restrict__ lse2,             // [B, H, Sq_pad]
                 const float* __restrict__ delta,            // [B, H, Sq_pad]
                 float* __restrict__ dq_accum,               // [B, H, Sq, D], zeroed
                 T* __restrict__ dk,                         // [B, H, Sk, D]
                 T* __restrict__ dv,                         // [B, H, Sk, D]
                 int Sq, int Sk, int Sq_pad, float scale, float scale_log2) {
#if FAPROF_SM90A
  using faprof_fa3::mbar_arrive_expect_tx;
  using faprof_fa3::mbar_init;
  using faprof_fa3::mbar_wait;
  using faprof_fa3::tma_tile;
  constexpr bool BF16 = std::is_same<T, __nv_bfloat16>::value;
  constexpr int D = C::D, BN = C::BN, BM = C::BM;
  constexpr uint32_t STAGE_TX = 2 * C::Q_BYTES + C::L_BYTES;  // Q, dO boxes (OOB rows counted), lse2, delta
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem =
      reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));

  const int tid = threadIdx.x;
  const int wg = tid >> 7;
  const int warp = (tid >> 5) & 3;
  const int lane = tid & 31;
  const int g = lane >> 2, t = lane & 3;
  const int bh = blockIdx.z * gridDim.y + blockIdx.y;
  const int n0 = blockIdx.x * BN;

  const uint32_t s0 = smem_u32(smem);
  const uint32_t sK = s0, sV = s0 + C::OFF_V, sQ0 = s0 + C::OFF_Q, sdO0 = s0 + C::OFF_DO, sdS = s0 + C::OFF_DS;
  const uint32_t sL0 = s0 + C::OFF_L;
  const uint32_t bar_kv = s0 + C::TILE_BYTES;  // then full[0], full[1]
  const uint32_t full = bar_kv + 8;

  const QueryTiles tiles(n0, Sq, BM, CAUSAL, blockIdx.x, gridDim.x);
  const float* l2g = lse2 + static_cast<size_t>(bh) * Sq_pad;
  const float* dlg = delta + static_cast<size_t>(bh) * Sq_pad;

  auto issue = [&](int i) {  // thread 0: query tile of step i into stage i % 2
    const int st = i & 1;
    const int r0 = tiles.tile(i) * BM;
    const uint32_t bar = full + 8 * st;
    mbar_arrive_expect_tx(bar, STAGE_TX);
    tma_tile<BM, D>(sQ0 + st * C::Q_BYTES, &tm_q, r0, bh, bar);
    tma_tile<BM, D>(sdO0 + st * C::Q_BYTES, &tm_do, r0, bh, bar);
    bulk_load(sL0 + st * C::L_BYTES, l2g + r0, BM * 4, bar);
    bulk_load(sL0 + st * C::L_BYTES + BM * 4, dlg + r0, BM * 4, bar);
  };
  if (tid == 0) {
    mbar_init(bar_kv, 1);
    mbar_init(full, 1);
    mbar_init(full + 8, 1);
    // Make the initialised barriers visible to the async proxy (the TMA unit completes them).
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    faprof_fa3::fence_proxy_async();
    mbar_arrive_expect_tx(bar_kv, 2 * C::K_BYTES);
    tma_tile<BN, D>(sK, &tm_k, n0, bh, bar_kv);
    tma_tile<BN, D>(sV, &tm_v, n0, bh, bar_kv);
    for (int i = 0; i < 2 && i < tiles.n_iter; ++i) issue(i);
  }
  __syncthreads();  // the barriers are initialised before anyone waits on them

  float acc_dk[D / 2], acc_dv[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) acc_dk[i] = acc_dv[i] = 0.f;
  mbar_wait(bar_kv, 0);  // also for a block with no query tile: no copy is left in flight at exit

  float* dq_bh = dq_accum + static_cast<size_t>(bh) * Sq * D;
  for (int i = 0; i < tiles.n_iter; ++i) {
    const int st = i & 1;
    const int q0 = tiles.tile(i) * BM;
    mbar_wait(full + 8 * st, (i >> 1) & 1);  // the (i/2)-th fill of stage st
    bwd_tile<BF16, C, CAUSAL>(acc_dk, acc_dv, sK, sV, sQ0 + st * C::Q_BYTES, sdO0 + st * C::Q_BYTES, sdS,
                              reinterpret_cast<const float*>(smem + C::OFF_L + st * C::L_BYTES), dq_bh, n0, q0, Sq,
                              Sk, scale_log2, wg, warp, g, t);
    // Every warp is done with stage st (its wgmmas waited, its lse2/delta read) and with sdS.
    __syncthreads();
    if (tid == 0 && i + 2 < tiles.n_iter) issue(i + 2);
  }

  store_dkdv<T, C>(acc_dk, acc_dv, dk + static_cast<size_t>(bh) * Sk * D, dv + static_cast<size_t>(bh) * Sk * D, n0, Sk,
                   scale, wg, warp, g, t);
#else
  __trap();  // sm_90a only (wgmma, TMA); the launcher refuses other devices before launching
#endif
}

template <typename T, class C, bool CAUSAL>
cudaError_t launch_b(const BwdArgs& a) {
  constexpr bool BF16 = std::is_same<T, __nv_bfloat16>::value;
  CUtensorMap mq, mk, mv, mdo;
  const int BH = a.B * a.H;
  cudaError_t err = faprof_fa3::make_map(&mq, a.q, BF16, BH, a.Sq, C::D, C::BM);
  if (err == cudaSuccess) err = faprof_fa3::make_map(&mk, a.k, BF16, BH, a.Sk, C::D, C::BN);
  if (err == cudaSuccess) err = faprof_fa3::make_map(&mv, a.v, BF16, BH, a.Sk, C::D, C::BN);
  if (err == cudaSuccess) err = faprof_fa3::make_map(&mdo, a.dout, BF16, BH, a.Sq, C::D, C::BM);
  if (err != cudaSuccess) return err;
  auto kernel = fa3_bwd_b_kernel<T, C, CAUSAL>;
  constexpr int smem = C::SMEM_BYTES + C::BAR_BYTES;
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return err;
  const dim3 grid((a.Sk + C::BN - 1) / C::BN, a.H, a.B);
  kernel<<<grid, C::THREADS, smem, a.stream>>>(mq, mk, mv, mdo, a.lse2, a.delta, a.dq_accum, static_cast<T*>(a.dk),
                                               static_cast<T*>(a.dv), a.Sq, a.Sk, padded_seq(a.Sq), a.scale,
                                               a.scale * kLog2e);
  return cudaGetLastError();
}

template <class C>
cudaError_t dispatch_b(const BwdArgs& a) {
  if (a.bf16) return a.causal ? launch_b<__nv_bfloat16, C, true>(a) : launch_b<__nv_bfloat16, C, false>(a);
  return a.causal ? launch_b<__half, C, true>(a) : launch_b<__half, C, false>(a);
}

}  // namespace faprof_fa3_bwd

cudaError_t faprof_fa3_bwd_b(const void* q, const void* k, const void* v, const void* o, const void* dout,
                             const float* lse, void* dq, void* dk, void* dv, float* lse2, float* delta,
                             float* dq_accum, int B, int H, int Sq, int Sk, int D, float scale, bool causal, bool bf16,
                             cudaStream_t stream) {
  using namespace faprof_fa3_bwd;
  const BwdArgs a{q, k, v, o, dout, lse, dq, dk, dv, lse2, delta, dq_accum, B, H, Sq, Sk, D, scale, causal, bf16, stream};
  cudaError_t err = validate(a);
  if (err != cudaSuccess) return err;
  if ((err = preprocess(a)) != cudaSuccess) return err;
  err = D == 64 ? dispatch_b<BwdCfg<64>>(a) : dispatch_b<BwdCfg<128>>(a);
  if (err != cudaSuccess) return err;
  return convert_dq(a);
}
