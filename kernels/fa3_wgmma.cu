// fa3_wgmma.cu — FlashAttention forward on Hopper warpgroup MMA (wgmma.mma_async), built step by
// step toward FlashAttention-3 (Shah et al. 2024). This file holds step (a); later steps (TMA and
// an mbarrier ring, warp specialization, pingpong, intra-warpgroup overlap) are added beside it as
// separate kernels so that the progression can be profiled side by side.
//
// Step (a), fa3_wgmma_a_kernel: wgmma with synchronous (cp.async) loads.
//   * Grid (query tiles of BR = 64*NWG rows, H, B); NWG = 2 warpgroups, each owns 64 query rows,
//     keeps its O accumulator in registers and loops over BC-row K/V tiles (FA2's partition).
//   * Q, K, V tiles reach shared memory by cp.async (16-byte chunks, rows past S zero-filled) in
//     the 128-byte swizzled layout of kernels/fa3_common.cuh; K and V are double-buffered exactly
//     as in fa2_mma (K[j+1] issued at the top of iteration j, V[j+1] after its first barrier).
//     cp.async writes through the generic proxy, so every thread fences (fence.proxy.async) after
//     its wait and before the barrier that hands the tile to wgmma.
//   * S = Q·Kᵀ: m64nBCk16 SS wgmma (Q and K both K-major descriptors), D/16 steps in one commit
//     group, then wgmma.wait_group 0 (no overlap yet: that is steps (c)-(e)).
//   * Online softmax in fp32 registers with exp2 (scale folded into one FFMA), row max/sum over
//     the 4 lanes of a quad, as in fa2_mma; mask only on the Sk tail tile and on tiles crossing a
//     warp's causal diagonal; a warpgroup whose rows all lie above a tile skips it.
//   * O += P·V: m64nDk16 RS wgmma; P is the S accumulator packed to f16x2/bf16x2 in registers
//     (its fragment is the A fragment), V is read MN-major from the same swizzled tile (transpose-B).
//   * Epilogue: 1/l, lse = m*scale + ln(l) (natural log, like fa2_mma), O staged through the
//     warp's own Q rows in shared memory and written with 16-byte stores.
// Configs: D=64 and D=128 with BR = BC = 128 (2 warpgroups, 256 threads, 1 block per SM; shared
// memory 81 KB and 161 KB). sm_90a only: on other architectures the kernels are empty (they trap)
// and the launcher returns cudaErrorNotSupported before launching.
//
// Requires scale > 0 (the running max is kept on raw scores) and 16-byte aligned q, k, v, o.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "fa3_common.cuh"
#include "faprof_kernels.h"

namespace faprof_fa3 {

constexpr float kLog2e = 1.4426950408889634f;

// faprof:launch kernel=fa3_wgmma_a_kernel D=A0 threads=128*A2 dyn_smem=2*A0*(64*A2+4*A1)+1024
template <int D_, int BC_, int NWG_>
struct ConfigA {
  static constexpr int D = D_;         // head dim: N of PV, K of QKᵀ
  static constexpr int BC = BC_;       // keys per K/V tile: N of QKᵀ, K of PV
  static constexpr int NWG = NWG_;     // warpgroups per block, 64 query rows each
  static constexpr int BR = 64 * NWG;  // query rows per block
  static constexpr int THREADS = 128 * NWG;
  static constexpr int NT = BC / 8;    // n8 column tiles of S in a thread's fragment
  static constexpr int DT = D / 8;     // n8 column tiles of O
  static constexpr int KQ = D / 16;    // k16 steps of QKᵀ
  static constexpr int KP = BC / 16;   // k16 steps of PV
  static constexpr int STAGES = 2;     // cp.async stages for K and for V
  static constexpr int Q_BYTES = BR * D * 2;
  static constexpr int KV_BYTES = BC * D * 2;
  static constexpr int SMEM_BYTES = Q_BYTES + 2 * STAGES * KV_BYTES + 1024;  // + slack to align to 1024

  static_assert(D == 64 || D == 128, "wgmma wrappers exist for N = 64 and 128 (PV's N is D)");
  static_assert(BC == 64 || BC == 128, "wgmma wrappers exist for N = 64 and 128 (QKᵀ's N is BC)");
  static_assert(SMEM_BYTES <= 227 * 1024, "exceeds the largest opt-in shared memory per block (sm_90)");
  static_assert(SMEM_BYTES == 2 * D * (64 * NWG + 4 * BC) + 1024, "keep the faprof:launch annotation in step");
};

template <typename T, class C, bool CAUSAL>
__global__ void __launch_bounds__(C::THREADS, 1)
fa3_wgmma_a_kernel(const T* __restrict__ q,  // [B, H, Sq, D]
                   const T* __restrict__ k,  // [B, H, Sk, D]
                   const T* __restrict__ v,  // [B, H, Sk, D]
                   T* __restrict__ o,        // [B, H, Sq, D]
                   float* __restrict__ lse,  // [B, H, Sq]
                   int Sq, int Sk, float scale, float scale_log2) {
#if FAPROF_SM90A
  constexpr bool BF16 = std::is_same<T, __nv_bfloat16>::value;
  constexpr int D = C::D, BR = C::BR, BC = C::BC, NT = C::NT, DT = C::DT;
  extern __shared__ unsigned char smem_raw[];
  // SW128 blocks must start 1024-byte aligned (the descriptors' base offset is 0).
  unsigned char* smem =
      reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));

  const int tid = threadIdx.x;
  const int wg = tid >> 7;              // warpgroup
  const int warp = (tid >> 5) & 3;      // warp inside the warpgroup
  const int lane = tid & 31;
  const int g = lane >> 2, t = lane & 3;
  const int qt = CAUSAL ? static_cast<int>(gridDim.x - 1 - blockIdx.x) : static_cast<int>(blockIdx.x);
  const int bh = blockIdx.z * gridDim.y + blockIdx.y;
  const int q0 = qt * BR;
  const int wg_row0 = q0 + 64 * wg;          // first query row of this warpgroup
  const int warp_row0 = wg_row0 + 16 * warp;  // first query row of this warp

  const T* qg = q + static_cast<size_t>(bh) * Sq * D;
  const T* kg = k + static_cast<size_t>(bh) * Sk * D;
  const T* vg = v + static_cast<size_t>(bh) * Sk * D;

  const uint32_t sQ = smem_u32(smem);
  const uint32_t sK = sQ + C::Q_BYTES;
  const uint32_t sV = sK + C::STAGES * C::KV_BYTES;

  int n_kv = (Sk + BC - 1) / BC;
  if (CAUSAL) n_kv = min(n_kv, (min(q0 + BR, Sq) - 1) / BC + 1);

  // Prologue: Q, K[0], V[0] in three commit groups.
  load_tile_sw128<BR, D, C::THREADS>(sQ, qg, q0, Sq, tid);
  cp_async_commit();
  load_tile_sw128<BC, D, C::THREADS>(sK, kg, 0, Sk, tid);
  cp_async_commit();
  load_tile_sw128<BC, D, C::THREADS>(sV, vg, 0, Sk, tid);
  cp_async_commit();

  float acc_o[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) acc_o[i] = 0.f;
  float row_m[2] = {-INFINITY, -INFINITY};  // rows g and g + 8 of the warp; m on raw scores
  float row_l[2] = {0.f, 0.f};
  const uint32_t sQw = sQ + wg * 64 * 128;  // this warpgroup's 64 rows inside each column block

  for (int j = 0; j < n_kv; ++j) {
    const int stage = j & 1;
    const uint32_t sKs = sK + stage * C::KV_BYTES;
    const uint32_t sVs = sV + stage * C::KV_BYTES;
    const int kv0 = j * BC;

    // K[j+1] into the stage K[j-1] used: every warpgroup waited for its QKᵀ of j-1 (wgmma.wait_group 0)
    // before the PV barrier of j-1.
    if (j + 1 < n_kv) load_tile_sw128<BC, D, C::THREADS>(sK + (stage ^ 1) * C::KV_BYTES, kg, kv0 + BC, Sk, tid);
    cp_async_commit();
    cp_async_wait<2>();  // all but {V[j], K[j+1]}: Q and K[j] have landed
    fence_proxy_async();
    __syncthreads();
    // V[j+1] into the stage V[j-1] used: the barrier above follows every warpgroup's PV of j-1.
    if (j + 1 < n_kv) load_tile_sw128<BC, D, C::THREADS>(sV + (stage ^ 1) * C::KV_BYTES, vg, kv0 + BC, Sk, tid);
    cp_async_commit();

    // Causal: a warpgroup whose rows all lie above this tile's first key has nothing to add.
    const bool active = CAUSAL ? kv0 <= wg_row0 + 63 : true;
    uint32_t p[C::KP][4];
    if (active) {
      // ---- S = Q Kᵀ (fp32), one commit group of D/16 wgmmas ----
      float s[BC / 2];
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < C::KQ; ++ks) {
        const uint64_t da = make_desc(sQw + (ks >> 2) * BR * 128 + (ks & 3) * 32, 16, 1024);
        const uint64_t db = make_desc(sKs + (ks >> 2) * BC * 128 + (ks & 3) * 32, 16, 1024);
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
      float base[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float m = row_m[h];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) m = fmaxf(m, fmaxf(s[4 * nt + 2 * h], s[4 * nt + 2 * h + 1]));
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
        // A row with every key so far masked keeps m = -inf; offset by 0 so that p = 0, not NaN.
        base[h] = (m == -INFINITY) ? 0.f : m * scale_log2;
        const float alpha = fast_exp2(row_m[h] * scale_log2 - base[h]);
        row_m[h] = m;
        row_l[h] *= alpha;
#pragma unroll
        for (int dt = 0; dt < DT; ++dt) {
          acc_o[4 * dt + 2 * h] *= alpha;
          acc_o[4 * dt + 2 * h + 1] *= alpha;
        }
        float sum = 0.f;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float pe = fast_exp2(fmaf(s[4 * nt + 2 * h + e], scale_log2, -base[h]));
            s[4 * nt + 2 * h + e] = pe;
            sum += pe;
          }
        row_l[h] += sum;
      }

      // P as the A fragments of PV: n8 tiles 2kk and 2kk+1 of S are the k16 step kk of A.
#pragma unroll
      for (int kk = 0; kk < C::KP; ++kk) {
        p[kk][0] = pack2<BF16>(s[8 * kk + 0], s[8 * kk + 1]);
        p[kk][1] = pack2<BF16>(s[8 * kk + 2], s[8 * kk + 3]);
        p[kk][2] = pack2<BF16>(s[8 * kk + 4], s[8 * kk + 5]);
        p[kk][3] = pack2<BF16>(s[8 * kk + 6], s[8 * kk + 7]);
      }
    }

    cp_async_wait<2>();  // all but {K[j+1], V[j+1]}: V[j] has landed
    fence_proxy_async();
    __syncthreads();

    if (active) {
      // ---- O += P V: RS wgmma, V MN-major (transpose-B), BC/16 steps in one commit group ----
      wgmma_fence();
      fence_regs(acc_o);
#pragma unroll
      for (int kk = 0; kk < C::KP; ++kk) {
        const uint64_t db = make_desc(sVs + kk * 16 * 128, BC * 128, 1024);
        wgmma_rs<D, BF16, 1>(acc_o, p[kk], db, 1);
      }
      wgmma_commit();
      wgmma_wait<0>();
      fence_regs(acc_o);
    }
  }
  cp_async_wait<0>();

  // ---- epilogue: normalise, lse, stage O through this warp's own Q rows, 16-byte stores ----
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float l = row_l[h];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const float inv = l > 0.f ? 1.f / l : 0.f;
#pragma unroll
    for (int dt = 0; dt < DT; ++dt) {
      acc_o[4 * dt + 2 * h] *= inv;
      acc_o[4 * dt + 2 * h + 1] *= inv;
    }
    const int row = warp_row0 + g + 8 * h;
    if (t == 0 && row < Sq)
      lse[static_cast<size_t>(bh) * Sq + row] = l > 0.f ? row_m[h] * scale + __logf(l) : -INFINITY;
  }

  // The warp's rows of Q were last read by its warpgroup's wgmmas, all complete (wait_group 0).
  const int r_tile = 64 * wg + 16 * warp;  // the warp's first row inside the block's tile
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int dt = 0; dt < DT; ++dt)
      *reinterpret_cast<uint32_t*>(smem + sw128_offset(BR, r_tile + g + 8 * h, 8 * dt + 2 * t)) =
          pack2<BF16>(acc_o[4 * dt + 2 * h], acc_o[4 * dt + 2 * h + 1]);
  __syncwarp();
  T* og = o + static_cast<size_t>(bh) * Sq * D;
#pragma unroll
  for (int i = 0; i < 16 * (D / 8) / 32; ++i) {
    const int idx = lane + 32 * i;
    const int r = r_tile + idx / (D / 8);
    const int c = (idx % (D / 8)) * 8;
    const uint4 val = *reinterpret_cast<const uint4*>(smem + sw128_offset(BR, r, c));
    if (q0 + r < Sq) *reinterpret_cast<uint4*>(og + static_cast<size_t>(q0 + r) * D + c) = val;
  }
#else
  __trap();  // sm_90a only (wgmma); the launcher refuses other devices before launching
#endif
}

// ------------------------------------------------------------------------------------------------
// Host side
// ------------------------------------------------------------------------------------------------
using CfgAD64 = ConfigA<64, 128, 2>;
using CfgAD128 = ConfigA<128, 128, 2>;

struct Args {
  const void* q;
  const void* k;
  const void* v;
  void* o;
  float* lse;
  int B, H, Sq, Sk;
  float scale;
  cudaStream_t stream;
};

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

template <class C>
cudaError_t dispatch_a(const Args& a, bool causal, bool bf16) {
  if (bf16) return causal ? launch_a<__nv_bfloat16, C, true>(a) : launch_a<__nv_bfloat16, C, false>(a);
  return causal ? launch_a<__half, C, true>(a) : launch_a<__half, C, false>(a);
}

// Shape/pointer checks; returns cudaSuccess when the call may proceed, sets *nothing_to_do for
// empty problems, cudaErrorNotSupported on a GPU that is not compute capability 9.0.
inline cudaError_t validate(const Args& a, int D, bool* nothing_to_do) {
  *nothing_to_do = false;
  if (D != 64 && D != 128) return cudaErrorInvalidValue;
  if (a.B < 0 || a.H < 0 || a.Sq < 0 || a.Sk < 0) return cudaErrorInvalidValue;
  if (a.B == 0 || a.H == 0 || a.Sq == 0) {
    *nothing_to_do = true;
    return cudaSuccess;
  }
  if (a.Sk == 0) return cudaErrorInvalidValue;                                   // softmax over no keys
  if (!(a.scale > 0.f) || a.scale == INFINITY) return cudaErrorInvalidValue;     // raw-score running max
  if (a.B > 65535 || a.H > 65535) return cudaErrorInvalidValue;                 // grid.z / grid.y limits
  const uintptr_t bits = reinterpret_cast<uintptr_t>(a.q) | reinterpret_cast<uintptr_t>(a.k) |
                         reinterpret_cast<uintptr_t>(a.v) | reinterpret_cast<uintptr_t>(a.o);
  if ((bits & 15u) != 0 || a.lse == nullptr) return cudaErrorInvalidValue;     // 16-byte cp.async / stores
  return require_sm90a();
}

}  // namespace faprof_fa3

/// Step (a) of fa3_wgmma: wgmma with cp.async loads. q [B,H,Sq,D], k/v [B,H,Sk,D], o [B,H,Sq,D]
/// (fp16 or bf16, contiguous), lse [B,H,Sq] fp32. D in {64, 128}.
cudaError_t faprof_fa3_wgmma_a_fwd(const void* q, const void* k, const void* v, void* o, float* lse, int B, int H,
                                   int Sq, int Sk, int D, float scale, bool causal, bool bf16, cudaStream_t stream) {
  using namespace faprof_fa3;
  const Args a{q, k, v, o, lse, B, H, Sq, Sk, scale, stream};
  bool nothing_to_do = false;
  const cudaError_t err = validate(a, D, &nothing_to_do);
  if (err != cudaSuccess || nothing_to_do) return err;
  return D == 64 ? dispatch_a<CfgAD64>(a, causal, bf16) : dispatch_a<CfgAD128>(a, causal, bf16);
}
