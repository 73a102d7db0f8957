// fa3_wgmma.cu — FlashAttention forward on Hopper warpgroup MMA (wgmma.mma_async), built step by
// step toward FlashAttention-3 (Shah et al. 2024). Each step is its own kernel and launcher (and
// faprof variant), so that the progression can be profiled side by side; the tile math (the two
// GEMMs, masking, online softmax, epilogue) is shared and only the way tiles arrive changes.
//
// Common to every step:
//   * Grid (query tiles of BR = 64*NWG rows, H, B); NWG = 2 warpgroups, each owns 64 query rows,
//     keeps its O accumulator in registers and loops over BC-row K/V tiles (FA2's partition).
//   * Tiles sit in shared memory in the 128-byte swizzled layout of kernels/fa3_common.cuh.
//   * S = Q·Kᵀ: m64nBCk16 SS wgmma (Q and K both K-major descriptors), D/16 steps in one commit
//     group, then wgmma.wait_group 0 (no GEMM/softmax overlap yet: steps (d) and (e)).
//   * Online softmax in fp32 registers with exp2 (scale folded into one FFMA), row max/sum over
//     the 4 lanes of a quad, as in fa2_mma; mask only on the Sk tail tile and on tiles crossing a
//     warp's causal diagonal; a warpgroup whose rows all lie above a tile skips it; causal query
//     tiles run heaviest first.
//   * O += P·V: m64nDk16 RS wgmma; P is the S accumulator packed to f16x2/bf16x2 in registers
//     (its fragment is the A fragment), V is read MN-major from the same swizzled tile (transpose-B).
//   * Epilogue: 1/l, lse = m*scale + ln(l) (natural log, like fa2_mma), O staged through the
//     warp's own Q rows in shared memory and written with 16-byte stores.
//
// Step (a), fa3_wgmma_a_kernel: Q, K, V by cp.async (16-byte chunks, rows past S zero-filled), K
//   and V double-buffered as in fa2_mma (K[j+1] issued at the top of iteration j, V[j+1] after
//   its first barrier). cp.async writes through the generic proxy, so each thread fences
//   (fence.proxy.async) after its wait and before the barrier that hands the tile to wgmma.
// Step (b), fa3_wgmma_b_kernel: Q, K, V by TMA (cp.async.bulk.tensor.3d over [B·H, S, D] tensor
//   maps built on the host with 128-byte swizzle; rows past S are zero-filled by the hardware),
//   one 64-column box per swizzle block. K and V go through a ring of STAGES stages, each with an
//   mbarrier that the TMA completes (expect_tx bytes); thread 0 refills a stage right after the
//   block's one barrier per iteration, so STAGES tiles are in flight while the block computes.
//   No warp specialization yet (step (c)): every warpgroup computes and thread 0 also issues.
// Steps (c)-(e), warp specialization, pingpong and intra-warpgroup overlap: kernels/fa3_wgmma_ws.cu.
//
// Configs: D=64 and D=128 with BR = BC = 128 (2 warpgroups, 256 threads, 1 block per SM).
// sm_90a only: on other architectures the kernels are empty (they trap) and the launchers return
// cudaErrorNotSupported before launching. Requires scale > 0 (the running max is kept on raw
// scores) and 16-byte aligned q, k, v, o.

#include <cuda.h>  // CUtensorMap and its enums (types only: the encoder comes from the runtime)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled_v12000

#include <cstdint>
#include <type_traits>

#include "fa3_common.cuh"
#include "fa3_fwd.cuh"
#include "faprof_kernels.h"

namespace faprof_fa3 {

// faprof:launch kernel=fa3_wgmma_a_kernel D=A0 threads=128*A2 dyn_smem=2*A0*(64*A2+2*A3*A1)+1024
// faprof:launch kernel=fa3_wgmma_b_kernel D=A0 threads=128*A2 dyn_smem=2*A0*(64*A2+2*A3*A1)+1024+64
// (Config: kernels/fa3_fwd.cuh; its static_assert keeps these lines in step.)

#if FAPROF_SM90A
// One K/V tile for one warpgroup: S = Q Kᵀ, mask, online softmax, P -> registers; then (after
// `wait_v`, which makes V visible) O += P V. sQw: the warpgroup's Q rows; sK, sV: the tile.
template <bool BF16, class C, bool CAUSAL, class WaitV>
__device__ __forceinline__ void tile_step(RowState<C>& st, uint32_t sQw, uint32_t sK, uint32_t sV, int kv0, int Sk,
                                          int warp_row0, int g, int t, float scale_log2, WaitV wait_v) {
  constexpr int BC = C::BC, NT = C::NT, DT = C::DT;
  // ---- S = Q Kᵀ (fp32), one commit group of D/16 wgmmas ----
  float s[BC / 2];
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < C::KQ; ++ks) {
    const uint64_t da = make_desc(sQw + (ks >> 2) * C::BR * 128 + (ks & 3) * 32, 16, 1024);
    const uint64_t db = make_desc(sK + (ks >> 2) * BC * 128 + (ks & 3) * 32, 16, 1024);
    wgmma_ss<BC, BF16, 0>(s, da, db, ks > 0);
  }
  wgmma_commit();
  wgmma_wait<0>();
  fence_regs(s);

  // ---- mask: the Sk tail tile and tiles crossing this warp's diagonal ----
  // s[4*nt + 2*h + e] is row warp_row0 + g + 8h, key kv0 + 8*nt + 2t + e.
  if (kv0 + BC > Sk || (CAUSAL && kv0 + BC - 1 > warp_row0)) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = warp_row0 + g + 8 * h;
      const int lim = (CAUSAL ? min(Sk - 1, row) : Sk - 1) - kv0 - 2 * t;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e)
          if (nt * 8 + e > lim) s[4 * nt + 2 * h + e] = -INFINITY;
    }
  }

  // ---- online softmax (fp32, exp2 with the scale folded in) ----
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float m = st.row_m[h];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) m = fmaxf(m, fmaxf(s[4 * nt + 2 * h], s[4 * nt + 2 * h + 1]));
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
    // A row with every key so far masked keeps m = -inf; offset by 0 so that p = 0, not NaN.
    const float base = (m == -INFINITY) ? 0.f : m * scale_log2;
    const float alpha = fast_exp2(st.row_m[h] * scale_log2 - base);
    st.row_m[h] = m;
    st.row_l[h] *= alpha;
#pragma unroll
    for (int dt = 0; dt < DT; ++dt) {
      st.acc_o[4 * dt + 2 * h] *= alpha;
      st.acc_o[4 * dt + 2 * h + 1] *= alpha;
    }
    float sum = 0.f;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float pe = fast_exp2(fmaf(s[4 * nt + 2 * h + e], scale_log2, -base));
        s[4 * nt + 2 * h + e] = pe;
        sum += pe;
      }
    st.row_l[h] += sum;
  }

  // P as the A fragments of PV: n8 tiles 2kk and 2kk+1 of S are the k16 step kk of A.
  uint32_t p[C::KP][4];
#pragma unroll
  for (int kk = 0; kk < C::KP; ++kk) {
    p[kk][0] = pack2<BF16>(s[8 * kk + 0], s[8 * kk + 1]);
    p[kk][1] = pack2<BF16>(s[8 * kk + 2], s[8 * kk + 3]);
    p[kk][2] = pack2<BF16>(s[8 * kk + 4], s[8 * kk + 5]);
    p[kk][3] = pack2<BF16>(s[8 * kk + 6], s[8 * kk + 7]);
  }

  wait_v();

  // ---- O += P V: RS wgmma, V MN-major (transpose-B), BC/16 steps in one commit group ----
  wgmma_fence();
  fence_regs(st.acc_o);
#pragma unroll
  for (int kk = 0; kk < C::KP; ++kk) {
    const uint64_t db = make_desc(sV + kk * 16 * 128, BC * 128, 1024);
    wgmma_rs<C::D, BF16, 1>(st.acc_o, p[kk], db, 1);
  }
  wgmma_commit();
  wgmma_wait<0>();
  fence_regs(st.acc_o);
}
#endif  // FAPROF_SM90A


// ------------------------------------------------------------------------------- step (a)
template <typename T, class C, bool CAUSAL>
__global__ void __launch_bounds__(C::THREADS, 1)
fa3_wgmma_a_kernel(const T* __restrict__ q,  // [B, H, Sq, D]
                   const T* __restrict__ k,  // [B, H, Sk, D]
                   const T* __restrict__ v,  // [B, H, Sk, D]
                   T* __restrict__ o,        // [B, H, Sq, D]
                   float* __restrict__ lse,  // [B, H, Sq]
                   int Sq, int Sk, float scale, float scale_log2) {
#if FAPROF_SM90A
  static_assert(C::STAGES == 2, "step (a) double-buffers K and V");
  constexpr bool BF16 = std::is_same<T, __nv_bfloat16>::value;
  constexpr int D = C::D, BR = C::BR, BC = C::BC;
  extern __shared__ unsigned char smem_raw[];
  // SW128 blocks must start 1024-byte aligned (the descriptors' base offset is 0).
  unsigned char* smem =
      reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));

  const int tid = threadIdx.x;
  const int wg = tid >> 7;          // warpgroup
  const int warp = (tid >> 5) & 3;  // warp inside the warpgroup
  const int lane = tid & 31;
  const int g = lane >> 2, t = lane & 3;
  const int qt = CAUSAL ? static_cast<int>(gridDim.x - 1 - blockIdx.x) : static_cast<int>(blockIdx.x);
  const int bh = blockIdx.z * gridDim.y + blockIdx.y;
  const int q0 = qt * BR;
  const int wg_row0 = q0 + 64 * wg;           // first query row of this warpgroup
  const int warp_row0 = wg_row0 + 16 * warp;  // first query row of this warp

  const T* qg = q + static_cast<size_t>(bh) * Sq * D;
  const T* kg = k + static_cast<size_t>(bh) * Sk * D;
  const T* vg = v + static_cast<size_t>(bh) * Sk * D;

  const uint32_t sQ = smem_u32(smem);
  const uint32_t sK = sQ + C::Q_BYTES;
  const uint32_t sV = sK + 2 * C::KV_BYTES;

  int n_kv = (Sk + BC - 1) / BC;
  if (CAUSAL) n_kv = min(n_kv, (min(q0 + BR, Sq) - 1) / BC + 1);

  // Prologue: Q, K[0], V[0] in three commit groups.
  load_tile_sw128<BR, D, C::THREADS>(sQ, qg, q0, Sq, tid);
  cp_async_commit();
  load_tile_sw128<BC, D, C::THREADS>(sK, kg, 0, Sk, tid);
  cp_async_commit();
  load_tile_sw128<BC, D, C::THREADS>(sV, vg, 0, Sk, tid);
  cp_async_commit();

  RowState<C> st;
  st.init();
  const uint32_t sQw = sQ + wg * 64 * 128;  // this warpgroup's 64 rows inside each column block

  for (int j = 0; j < n_kv; ++j) {
    const int stage = j & 1;
    const int kv0 = j * BC;
    // K[j+1] into the stage K[j-1] used: every warpgroup waited for its QKᵀ of j-1 (wgmma.wait_group 0)
    // before the V barrier of j-1.
    if (j + 1 < n_kv) load_tile_sw128<BC, D, C::THREADS>(sK + (stage ^ 1) * C::KV_BYTES, kg, kv0 + BC, Sk, tid);
    cp_async_commit();
    cp_async_wait<2>();  // all but {V[j], K[j+1]}: Q and K[j] have landed
    fence_proxy_async();
    __syncthreads();
    // V[j+1] into the stage V[j-1] used: the barrier above follows every warpgroup's PV of j-1.
    if (j + 1 < n_kv) load_tile_sw128<BC, D, C::THREADS>(sV + (stage ^ 1) * C::KV_BYTES, vg, kv0 + BC, Sk, tid);
    cp_async_commit();

    auto wait_v = [] {
      cp_async_wait<2>();  // all but {K[j+1], V[j+1]}: V[j] has landed
      fence_proxy_async();
      __syncthreads();
    };
    // Causal: a warpgroup whose rows all lie above this tile's first key has nothing to add; it
    // only takes part in the copies and barriers.
    if (!CAUSAL || kv0 <= wg_row0 + 63) {
      tile_step<BF16, C, CAUSAL>(st, sQw, sK + stage * C::KV_BYTES, sV + stage * C::KV_BYTES, kv0, Sk, warp_row0, g,
                                 t, scale_log2, wait_v);
    } else {
      wait_v();
    }
  }
  cp_async_wait<0>();
  epilogue<T, C>(st, smem, o + static_cast<size_t>(bh) * Sq * D, lse + static_cast<size_t>(bh) * Sq, q0,
                 64 * wg + 16 * warp, Sq, g, t, lane, scale);
#else
  __trap();  // sm_90a only (wgmma); the launcher refuses other devices before launching
#endif
}

// ------------------------------------------------------------------------------- step (b)

template <typename T, class C, bool CAUSAL>
__global__ void __launch_bounds__(C::THREADS, 1)
fa3_wgmma_b_kernel(const __grid_constant__ CUtensorMap tm_q,  // [B·H, Sq, D], box [BR rows][64]
                   const __grid_constant__ CUtensorMap tm_k,  // [B·H, Sk, D], box [BC rows][64]
                   const __grid_constant__ CUtensorMap tm_v,  // [B·H, Sk, D], box [BC rows][64]
                   T* __restrict__ o,                         // [B, H, Sq, D]
                   float* __restrict__ lse,                   // [B, H, Sq]
                   int Sq, int Sk, float scale, float scale_log2) {
#if FAPROF_SM90A
  constexpr bool BF16 = std::is_same<T, __nv_bfloat16>::value;
  constexpr int D = C::D, BR = C::BR, BC = C::BC, STAGES = C::STAGES;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem =
      reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));

  const int tid = threadIdx.x;
  const int wg = tid >> 7;
  const int warp = (tid >> 5) & 3;
  const int lane = tid & 31;
  const int g = lane >> 2, t = lane & 3;
  const int qt = CAUSAL ? static_cast<int>(gridDim.x - 1 - blockIdx.x) : static_cast<int>(blockIdx.x);
  const int bh = blockIdx.z * gridDim.y + blockIdx.y;
  const int q0 = qt * BR;
  const int wg_row0 = q0 + 64 * wg;
  const int warp_row0 = wg_row0 + 16 * warp;

  const uint32_t sQ = smem_u32(smem);
  const uint32_t sK = sQ + C::Q_BYTES;
  const uint32_t sV = sK + STAGES * C::KV_BYTES;
  const uint32_t bar_q = sQ + C::TILE_BYTES;  // then full_k[STAGES], full_v[STAGES]
  const uint32_t bar_k = bar_q + 8;
  const uint32_t bar_v = bar_k + 8 * STAGES;

  int n_kv = (Sk + BC - 1) / BC;
  if (CAUSAL) n_kv = min(n_kv, (min(q0 + BR, Sq) - 1) / BC + 1);

  auto issue_kv = [&](int j) {  // thread 0: K[j], V[j] into stage j % STAGES
    const int s = j % STAGES;
    mbar_arrive_expect_tx(bar_k + 8 * s, C::KV_BYTES);
    tma_tile<BC, D>(sK + s * C::KV_BYTES, &tm_k, j * BC, bh, bar_k + 8 * s);
    mbar_arrive_expect_tx(bar_v + 8 * s, C::KV_BYTES);
    tma_tile<BC, D>(sV + s * C::KV_BYTES, &tm_v, j * BC, bh, bar_v + 8 * s);
  };
  if (tid == 0) {
    mbar_init(bar_q, 1);
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(bar_k + 8 * s, 1);
      mbar_init(bar_v + 8 * s, 1);
    }
    // Make the initialised barriers visible to the async proxy (the TMA unit completes them).
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    fence_proxy_async();
    mbar_arrive_expect_tx(bar_q, C::Q_BYTES);
    tma_tile<BR, D>(sQ, &tm_q, q0, bh, bar_q);
    for (int j = 0; j < STAGES && j < n_kv; ++j) issue_kv(j);
  }
  __syncthreads();  // the barriers are initialised before anyone waits on them

  RowState<C> st;
  st.init();
  const uint32_t sQw = sQ + wg * 64 * 128;
  mbar_wait(bar_q, 0);

  for (int j = 0; j < n_kv; ++j) {
    const int s = j % STAGES;
    const uint32_t parity = (j / STAGES) & 1;
    const int kv0 = j * BC;
    if (!CAUSAL || kv0 <= wg_row0 + 63) {
      mbar_wait(bar_k + 8 * s, parity);
      tile_step<BF16, C, CAUSAL>(st, sQw, sK + s * C::KV_BYTES, sV + s * C::KV_BYTES, kv0, Sk, warp_row0, g, t,
                                 scale_log2, [&] { mbar_wait(bar_v + 8 * s, parity); });
    }
    // Every warpgroup is done with stage s (its wgmmas waited); refill it with tile j + STAGES.
    __syncthreads();
    if (tid == 0 && j + STAGES < n_kv) issue_kv(j + STAGES);
  }
  epilogue<T, C>(st, smem, o + static_cast<size_t>(bh) * Sq * D, lse + static_cast<size_t>(bh) * Sq, q0,
                 64 * wg + 16 * warp, Sq, g, t, lane, scale);
#else
  __trap();  // sm_90a only (wgmma, TMA); the launcher refuses other devices before launching
#endif
}

// ------------------------------------------------------------------------------------------------
// Host side
// ------------------------------------------------------------------------------------------------
template <int D>
using CfgA = Config<D, 128, 2, 2>;
template <int D>
using CfgB = Config<D, 128, 2, 2>;

template <typename T, class C, bool CAUSAL>
cudaError_t launch_a(const Args& a) {
  auto kernel = fa3_wgmma_a_kernel<T, C, CAUSAL>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::SMEM_BYTES);
  if (err != cudaSuccess) return err;
  const dim3 grid((a.Sq + C::BR - 1) / C::BR, a.H, a.B);
  kernel<<<grid, C::THREADS, C::SMEM_BYTES, a.stream>>>(
      static_cast<const T*>(a.q), static_cast<const T*>(a.k), static_cast<const T*>(a.v), static_cast<T*>(a.o),
      a.lse, a.Sq, a.Sk, a.scale, a.scale * kLog2e);
  return cudaGetLastError();
}

template <typename T, class C, bool CAUSAL>
cudaError_t launch_b(const Args& a) {
  constexpr bool BF16 = std::is_same<T, __nv_bfloat16>::value;
  CUtensorMap mq, mk, mv;
  const int BH = a.B * a.H;
  cudaError_t err = make_map(&mq, a.q, BF16, BH, a.Sq, C::D, C::BR);
  if (err == cudaSuccess) err = make_map(&mk, a.k, BF16, BH, a.Sk, C::D, C::BC);
  if (err == cudaSuccess) err = make_map(&mv, a.v, BF16, BH, a.Sk, C::D, C::BC);
  if (err != cudaSuccess) return err;
  auto kernel = fa3_wgmma_b_kernel<T, C, CAUSAL>;
  constexpr int smem = C::SMEM_BYTES + C::BAR_BYTES;
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return err;
  const dim3 grid((a.Sq + C::BR - 1) / C::BR, a.H, a.B);
  kernel<<<grid, C::THREADS, smem, a.stream>>>(mq, mk, mv, static_cast<T*>(a.o), a.lse, a.Sq, a.Sk, a.scale,
                                               a.scale * kLog2e);
  return cudaGetLastError();
}


template <class C, bool STEP_B>
cudaError_t dispatch(const Args& a, bool causal, bool bf16) {
  if constexpr (STEP_B) {
    if (bf16) return causal ? launch_b<__nv_bfloat16, C, true>(a) : launch_b<__nv_bfloat16, C, false>(a);
    return causal ? launch_b<__half, C, true>(a) : launch_b<__half, C, false>(a);
  } else {
    if (bf16) return causal ? launch_a<__nv_bfloat16, C, true>(a) : launch_a<__nv_bfloat16, C, false>(a);
    return causal ? launch_a<__half, C, true>(a) : launch_a<__half, C, false>(a);
  }
}


template <bool STEP_B>
cudaError_t fwd(const void* q, const void* k, const void* v, void* o, float* lse, int B, int H, int Sq, int Sk,
                int D, float scale, bool causal, bool bf16, cudaStream_t stream) {
  const Args a{q, k, v, o, lse, B, H, Sq, Sk, scale, stream};
  bool nothing_to_do = false;
  const cudaError_t err = validate(a, D, &nothing_to_do);
  if (err != cudaSuccess || nothing_to_do) return err;
  if constexpr (STEP_B) {
    return D == 64 ? dispatch<CfgB<64>, true>(a, causal, bf16) : dispatch<CfgB<128>, true>(a, causal, bf16);
  } else {
    return D == 64 ? dispatch<CfgA<64>, false>(a, causal, bf16) : dispatch<CfgA<128>, false>(a, causal, bf16);
  }
}

}  // namespace faprof_fa3

/// Step (a) of fa3_wgmma: wgmma with cp.async loads. q [B,H,Sq,D], k/v [B,H,Sk,D], o [B,H,Sq,D]
/// (fp16 or bf16, contiguous), lse [B,H,Sq] fp32. D in {64, 128}.
cudaError_t faprof_fa3_wgmma_a_fwd(const void* q, const void* k, const void* v, void* o, float* lse, int B, int H,
                                   int Sq, int Sk, int D, float scale, bool causal, bool bf16, cudaStream_t stream) {
  return faprof_fa3::fwd<false>(q, k, v, o, lse, B, H, Sq, Sk, D, scale, causal, bf16, stream);
}

/// Step (b): step (a) with TMA loads and an mbarrier ring for K/V. Same arguments.
cudaError_t faprof_fa3_wgmma_b_fwd(const void* q, const void* k, const void* v, void* o, float* lse, int B, int H,
                                   int Sq, int Sk, int D, float scale, bool causal, bool bf16, cudaStream_t stream) {
  return faprof_fa3::fwd<true>(q, k, v, o, lse, B, H, Sq, Sk, D, scale, causal, bf16, stream);
}
