// fa3_wgmma_ws.cu — the warp-specialized steps of issue 14's fa3 progression (steps a and b are
// in kernels/fa3_wgmma.cu; the shared configuration, epilogue, TMA and host helpers in fa3_fwd.cuh).
//
// Block: 3 warpgroups = 384 threads, one block per (query tile of BR = 128 rows, h, b).
//   * warpgroup 0, the producer: `setmaxnreg.dec` to 24 registers; one thread issues every TMA:
//     Q once (128 rows), then K[j] and V[j] into a ring of STAGES stages. Each stage has four
//     mbarriers: full_k/full_v (the TMA completes them: expect_tx of the full box bytes, OOB rows
//     zero-filled and counted) and empty_k/empty_v (each consumer warpgroup arrives once when its
//     wgmmas reading the tile have completed; the producer waits on them before refilling).
//   * warpgroups 1 and 2, the consumers: `setmaxnreg.inc` to 240 registers; 64 query rows each,
//     O in registers, the tile math of steps a/b (SS wgmma for S = QKᵀ, online softmax with exp2,
//     RS wgmma for O += PV with P from registers, V transposed), but software-pipelined by one
//     GEMM: iteration j issues S_j = Q K_jᵀ and O += P_{j-1} V_{j-1} back to back, so the tensor
//     cores see one block of work per iteration and the softmax of S_j follows it.
//   * No block-wide barrier after the prologue: the warpgroups meet only at mbarriers (and, in
//     step d, at the two scheduling barriers).
// Step (c), fa3_wgmma_c_kernel: the above; the two consumer warpgroups run freely.
// Step (d), fa3_wgmma_d_kernel: + pingpong (FlashAttention-3's warp_scheduler_barrier): consumer
//   warpgroup w waits on named barrier 1 + w before issuing its GEMM block and arrives on the other
//   one's after, so the GEMM blocks of the two alternate and one's softmax runs under the other's
//   GEMMs. Warpgroup 1 signals its own barrier once at the start to go first.
// Step (e), fa3_wgmma_e_kernel: (d) + intra-warpgroup overlap: wait only for S_j (wait_group 1),
//   run its softmax while O += P_{j-1} V_{j-1} is still in flight, and apply the rescale of O
//   (alpha_j) just before the next PV is issued.
// Step (e) with GEN (faprof_fa3_wgmma_e_fwd_ex, issue 36): GQA (K/V tensor maps over B·Hkv planes,
//   the producer asks for the KV head's plane), the general mask (KeyRange, fa3_fwd.cuh: the producer
//   and the consumers agree on the tile range [lo(q0) / BC, hi(q1) / BC], only crossing tiles are
//   masked), packed varlen (tensor maps over [total, heads, D], the sequence's start as row coordinate).
//
// Register budgets (static; `faprof build` reads the faprof:setmaxnreg lines below):
// faprof:setmaxnreg kernel=fa3_wgmma_c_kernel producer=24 consumer=240
// faprof:setmaxnreg kernel=fa3_wgmma_d_kernel producer=24 consumer=240
// faprof:setmaxnreg kernel=fa3_wgmma_e_kernel producer=24 consumer=240
// 128·24 + 256·240 = 64,512 of the SM's 65,536 registers; ptxas compiles the kernel for 384
// threads at one block per SM (at most 168 registers at launch), and the warpgroups re-partition.

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "fa3_common.cuh"
#include "fa3_fwd.cuh"
#include "faprof_kernels.h"

namespace faprof_fa3 {

constexpr int kProducerRegs = 24;
constexpr int kConsumerRegs = 240;
static_assert(128 * kProducerRegs + 256 * kConsumerRegs <= 65536, "the register file holds 64K registers");

// C = Config<D, BC, NWG = 2 consumer warpgroups, STAGES>; the block adds the producer warpgroup.
// faprof:launch kernel=fa3_wgmma_c_kernel D=A0 threads=128*A2+128 dyn_smem=2*A0*(64*A2+2*A3*A1)+1024+128
// faprof:launch kernel=fa3_wgmma_d_kernel D=A0 threads=128*A2+128 dyn_smem=2*A0*(64*A2+2*A3*A1)+1024+128
// faprof:launch kernel=fa3_wgmma_e_kernel D=A0 threads=128*A2+128 dyn_smem=2*A0*(64*A2+2*A3*A1)+1024+128
template <class C>
struct Ws {
  static constexpr int THREADS = C::THREADS + 128;  // + the producer warpgroup
  static constexpr int BAR_BYTES = 128;             // bar_q, then full_k, full_v, empty_k, empty_v rings
  static constexpr int SMEM = C::SMEM_BYTES + BAR_BYTES;
  static_assert(C::NWG == 2, "pingpong pairs two consumer warpgroups");
  static_assert(8 * (1 + 4 * C::STAGES) <= BAR_BYTES, "mbarriers must fit BAR_BYTES");
  static_assert(SMEM <= 227 * 1024, "exceeds the largest opt-in shared memory per block");
};

#if FAPROF_SM90A
// S = Q Kᵀ for one warpgroup, issued as one commit group (not waited for).
template <bool BF16, class C>
__device__ __forceinline__ void issue_qk(float (&s)[C::BC / 2], uint32_t sQw, uint32_t sK) {
#pragma unroll
  for (int ks = 0; ks < C::KQ; ++ks) {
    const uint64_t da = make_desc(sQw + (ks >> 2) * C::BR * 128 + (ks & 3) * 32, 16, 1024);
    const uint64_t db = make_desc(sK + (ks >> 2) * C::BC * 128 + (ks & 3) * 32, 16, 1024);
    wgmma_ss<C::BC, BF16, 0>(s, da, db, ks > 0);
  }
  wgmma_commit();
}

// O += P V (P: the A fragments in registers, V MN-major), one commit group (not waited for).
template <bool BF16, class C>
__device__ __forceinline__ void issue_pv(float (&acc_o)[C::D / 2], const uint32_t (&p)[C::KP][4], uint32_t sV) {
#pragma unroll
  for (int kk = 0; kk < C::KP; ++kk) {
    const uint64_t db = make_desc(sV + kk * 16 * 128, C::BC * 128, 1024);
    wgmma_rs<C::D, BF16, 1>(acc_o, p[kk], db, 1);
  }
  wgmma_commit();
}

// Mask the Sk tail tile and tiles crossing this warp's causal diagonal (as in steps a/b).
template <class C, bool CAUSAL>
__device__ __forceinline__ void mask_tile(float (&s)[C::BC / 2], int kv0, int Sk, int warp_row0, int g, int t) {
  if (kv0 + C::BC > Sk || (CAUSAL && kv0 + C::BC - 1 > warp_row0)) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = warp_row0 + g + 8 * h;
      const int lim = (CAUSAL ? min(Sk - 1, row) : Sk - 1) - kv0 - 2 * t;
#pragma unroll
      for (int nt = 0; nt < C::NT; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e)
          if (nt * 8 + e > lim) s[4 * nt + 2 * h + e] = -INFINITY;
    }
  }
}

// Online softmax of one tile in place (s becomes the unnormalised probabilities); returns the
// factor alpha[h] by which O's rows must be rescaled before this tile's PV is added.
template <class C>
__device__ __forceinline__ void softmax_tile(RowState<C>& st, float (&s)[C::BC / 2], float scale_log2,
                                             float (&alpha)[2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float m = st.row_m[h];
#pragma unroll
    for (int nt = 0; nt < C::NT; ++nt) m = fmaxf(m, fmaxf(s[4 * nt + 2 * h], s[4 * nt + 2 * h + 1]));
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
    const float base = (m == -INFINITY) ? 0.f : m * scale_log2;  // all keys so far masked: p = 0
    alpha[h] = fast_exp2(st.row_m[h] * scale_log2 - base);
    st.row_m[h] = m;
    float sum = 0.f;
#pragma unroll
    for (int nt = 0; nt < C::NT; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float pe = fast_exp2(fmaf(s[4 * nt + 2 * h + e], scale_log2, -base));
        s[4 * nt + 2 * h + e] = pe;
        sum += pe;
      }
    st.row_l[h] = st.row_l[h] * alpha[h] + sum;
  }
}

template <class C>
__device__ __forceinline__ void rescale_o(RowState<C>& st, const float (&alpha)[2]) {
#pragma unroll
  for (int dt = 0; dt < C::DT; ++dt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      st.acc_o[4 * dt + 2 * h] *= alpha[h];
      st.acc_o[4 * dt + 2 * h + 1] *= alpha[h];
    }
}

// P as the A fragments of PV: n8 tiles 2kk and 2kk+1 of S are the k16 step kk of A.
template <bool BF16, class C>
__device__ __forceinline__ void pack_p(uint32_t (&p)[C::KP][4], const float (&s)[C::BC / 2]) {
#pragma unroll
  for (int kk = 0; kk < C::KP; ++kk)
#pragma unroll
    for (int i = 0; i < 4; ++i) p[kk][i] = pack2<BF16>(s[8 * kk + 2 * i], s[8 * kk + 2 * i + 1]);
}

// GEN (step e only): mask the tile with the general rule. Rows [r0, r0 + 15] of this warp; the tile
// needs the mask unless [kv0, kv0 + BC) lies inside [lo(r0 + 15), hi(r0)] (KeyRange's doc).
template <class C, bool CAUSAL>
__device__ __forceinline__ void mask_tile_gen(float (&s)[C::BC / 2], int kv0, const KeyRange<CAUSAL>& kr,
                                              int warp_row0, int g, int t) {
  if (kv0 + C::BC - 1 > kr.hi(warp_row0) || kv0 < kr.lo(warp_row0 + 15)) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = warp_row0 + g + 8 * h;
      const int lim = kr.hi(row) - kv0 - 2 * t;
      const int lim_lo = kr.lo(row) - kv0 - 2 * t;
#pragma unroll
      for (int nt = 0; nt < C::NT; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e)
          if (nt * 8 + e > lim || nt * 8 + e < lim_lo) s[4 * nt + 2 * h + e] = -INFINITY;
    }
  }
}

template <class C, bool CAUSAL, bool GEN>
__device__ __forceinline__ void mask_any(float (&s)[C::BC / 2], int kv0, int Sk, const KeyRange<CAUSAL>& kr,
                                         int warp_row0, int g, int t) {
  if constexpr (GEN) {
    mask_tile_gen<C, CAUSAL>(s, kv0, kr, warp_row0, g, t);
  } else {
    mask_tile<C, CAUSAL>(s, kv0, Sk, warp_row0, g, t);
  }
}

// The body of steps c, d (PINGPONG) and e (PINGPONG + OVERLAP); GEN: Fa3Gen's problems (step e).
template <typename T, class C, bool CAUSAL, bool PINGPONG, bool OVERLAP, bool GEN>
__device__ __forceinline__ void ws_body(const CUtensorMap* tm_q, const CUtensorMap* tm_k, const CUtensorMap* tm_v,
                                        T* __restrict__ o, float* __restrict__ lse, int Sq, int Sk, float scale,
                                        float scale_log2, const Fa3Gen& gp) {
  constexpr bool BF16 = std::is_same<T, __nv_bfloat16>::value;
  constexpr int D = C::D, BR = C::BR, BC = C::BC, STAGES = C::STAGES;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem =
      reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));

  const int tid = threadIdx.x;
  const int wg = tid >> 7;  // 0: producer, 1 and 2: consumers
  const int qt = CAUSAL ? static_cast<int>(gridDim.x - 1 - blockIdx.x) : static_cast<int>(blockIdx.x);
  const int bh = blockIdx.z * gridDim.y + blockIdx.y;
  const int q0 = qt * BR;
  // GEN: this block's sequence. Varlen: its lengths from cu_seqlens, its rows at packed row cu[b] + r of
  // head h's plane (make_map_packed); dense: the (b, h) plane from row 0. Non-GEN: the constants below.
  int sq = Sq, sk = Sk, q_row0 = q0, q_plane = bh, kv_row0 = 0, o_stride = D;
  size_t o_base = 0;
  float* lse_g = nullptr;
  if constexpr (GEN) {
    o_base = static_cast<size_t>(bh) * Sq * D;
    lse_g = lse + static_cast<size_t>(bh) * Sq;
    if (gp.cu_q != nullptr) {
      const int b = blockIdx.z, h = blockIdx.y, H = gridDim.y;
      const int qs = gp.cu_q[b], ks = gp.cu_k[b];
      sq = gp.cu_q[b + 1] - qs;
      sk = gp.cu_k[b + 1] - ks;
      if (q0 >= sq) return;  // past this sequence's end (block-uniform, before any barrier)
      q_row0 = qs + q0;
      q_plane = h;
      kv_row0 = ks;
      o_stride = H * D;
      o_base = (static_cast<size_t>(qs) * H + h) * D;
      lse_g = lse + static_cast<size_t>(h) * gp.total_q + qs;
    }
  }

  const uint32_t sQ = smem_u32(smem);
  const uint32_t sK = sQ + C::Q_BYTES;
  const uint32_t sV = sK + STAGES * C::KV_BYTES;
  const uint32_t bar_q = sQ + C::TILE_BYTES;
  const uint32_t full_k = bar_q + 8, full_v = full_k + 8 * STAGES;
  const uint32_t empty_k = full_v + 8 * STAGES, empty_v = empty_k + 8 * STAGES;

  int n_kv = (Sk + BC - 1) / BC;
  if (CAUSAL) n_kv = min(n_kv, (min(q0 + BR, Sq) - 1) / BC + 1);
  // GEN: K/V rows of KV head h / group (tensor maps over [B·Hkv, Sk, D]); KV tiles [j0, j0 + n_kv)
  // from the first key of the block's first row to the last key of its last row (none: n_kv = 0).
  int bkv = bh, j0 = 0;
  KeyRange<CAUSAL> kr{0, Sk, -1, -1};
  if constexpr (GEN) {
    const int hk = static_cast<int>(blockIdx.y) / gp.group;
    bkv = gp.cu_q != nullptr ? hk : static_cast<int>(blockIdx.z) * gp.Hkv + hk;  // packed: the head's plane
    kr = KeyRange<CAUSAL>{gp.bottom_right ? sk - sq : 0, sk, gp.left, gp.right};
    const int kv_lo = kr.lo(q0), kv_hi = kr.hi(min(q0 + BR, sq) - 1);
    j0 = kv_lo / BC;
    n_kv = kv_hi < kv_lo ? 0 : kv_hi / BC + 1 - j0;
  }

  if (tid == 0) {
    mbar_init(bar_q, 1);
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(full_k + 8 * s, 1);
      mbar_init(full_v + 8 * s, 1);
      mbar_init(empty_k + 8 * s, C::NWG);  // one arrival per consumer warpgroup
      mbar_init(empty_v + 8 * s, C::NWG);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    fence_proxy_async();
  }
  __syncthreads();  // barriers initialised before anyone waits on them; the last block-wide barrier

  if (wg == 0) {
    // ------------------------------------------------------------------ producer warpgroup
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegs));
    if (tid == 0) {
      mbar_arrive_expect_tx(bar_q, C::Q_BYTES);
      tma_tile<BR, D>(sQ, tm_q, q_row0, q_plane, bar_q);
      for (int j = 0; j < n_kv; ++j) {
        const int s = j % STAGES;
        const uint32_t use = j / STAGES;  // how often stage s was filled before
        if (use > 0) mbar_wait(empty_k + 8 * s, (use - 1) & 1);
        mbar_arrive_expect_tx(full_k + 8 * s, C::KV_BYTES);  // the whole box, OOB rows included
        tma_tile<BC, D>(sK + s * C::KV_BYTES, tm_k, kv_row0 + (j0 + j) * BC, bkv, full_k + 8 * s);
        if (use > 0) mbar_wait(empty_v + 8 * s, (use - 1) & 1);
        mbar_arrive_expect_tx(full_v + 8 * s, C::KV_BYTES);
        tma_tile<BC, D>(sV + s * C::KV_BYTES, tm_v, kv_row0 + (j0 + j) * BC, bkv, full_v + 8 * s);
      }
    }
    return;
  }

  // -------------------------------------------------------------------- consumer warpgroups
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegs));
  const int cw = wg - 1;  // consumer index: rows 64*cw .. 64*cw + 63 of the tile
  const int warp = (tid >> 5) & 3;
  const int lane = tid & 31;
  const int g = lane >> 2, t = lane & 3;
  const int warp_row0 = q0 + 64 * cw + 16 * warp;
  const bool leader = (tid & 127) == 0;  // arrives on the empty barriers for the warpgroup
  const uint32_t sQw = sQ + cw * 64 * 128;
  // Pingpong: named barrier 1 + cw is this warpgroup's turn, 1 + (cw ^ 1) the other's (256 threads:
  // 128 syncing + 128 arriving). Warpgroup 0 signals its own turn once so that it goes first.
  auto turn_wait = [&] {
    if constexpr (PINGPONG) named_sync(1 + cw, 256);
  };
  auto turn_pass = [&] {
    if constexpr (PINGPONG) named_arrive(1 + (cw ^ 1), 256);
  };
  auto finish = [&](RowState<C>& st) {
    if constexpr (GEN) {
      epilogue<T, C>(st, smem, o + o_base, lse_g, q0, 64 * cw + 16 * warp, sq, g, t, lane, scale, o_stride);
    } else {
      epilogue<T, C>(st, smem, o + static_cast<size_t>(bh) * Sq * D, lse + static_cast<size_t>(bh) * Sq, q0,
                     64 * cw + 16 * warp, Sq, g, t, lane, scale);
    }
  };
  RowState<C> st;
  st.init();
  if (GEN && n_kv == 0) {  // no row of the block sees a key: zeros and lse -inf (block-uniform)
    mbar_wait(bar_q, 0);   // the epilogue stages O through the Q tile: let its TMA land first
    finish(st);
    return;
  }
  if constexpr (PINGPONG) {
    if (cw == 0) named_arrive(1, 256);
  }

  float s[BC / 2];
  uint32_t p[C::KP][4];
  float alpha[2];
  mbar_wait(bar_q, 0);

  // Tile 0: S_0 alone.
  mbar_wait(full_k, 0);
  turn_wait();
  wgmma_fence();
  issue_qk<BF16, C>(s, sQw, sK);
  turn_pass();
  wgmma_wait<0>();
  fence_regs(s);
  if (leader) mbar_arrive(empty_k);
  mask_any<C, CAUSAL, GEN>(s, j0 * BC, Sk, kr, warp_row0, g, t);
  softmax_tile<C>(st, s, scale_log2, alpha);  // O = 0: no rescale needed
  pack_p<BF16, C>(p, s);

  for (int j = 1; j < n_kv; ++j) {
    const int sj = j % STAGES, sp = (j - 1) % STAGES;  // stages of tile j and tile j - 1
    mbar_wait(full_k + 8 * sj, (j / STAGES) & 1);
    mbar_wait(full_v + 8 * sp, ((j - 1) / STAGES) & 1);
    turn_wait();
    wgmma_fence();
    issue_qk<BF16, C>(s, sQw, sK + sj * C::KV_BYTES);
    fence_regs(s);
    if constexpr (OVERLAP) {
      rescale_o<C>(st, alpha);  // alpha_{j-1}, before P_{j-1} V_{j-1} is added
      fence_regs(st.acc_o);
      wgmma_fence();
    }
    issue_pv<BF16, C>(st.acc_o, p, sV + sp * C::KV_BYTES);
    turn_pass();
    if constexpr (OVERLAP) {
      wgmma_wait<1>();  // S_j is ready; PV_{j-1} may still run
      fence_regs(s);
      if (leader) mbar_arrive(empty_k + 8 * sj);
      mask_any<C, CAUSAL, GEN>(s, (j0 + j) * BC, Sk, kr, warp_row0, g, t);
      softmax_tile<C>(st, s, scale_log2, alpha);
      wgmma_wait<0>();
      fence_regs(st.acc_o);
      fence_regs_u(p);
      if (leader) mbar_arrive(empty_v + 8 * sp);
    } else {
      wgmma_wait<0>();
      fence_regs(s);
      fence_regs(st.acc_o);
      fence_regs_u(p);
      if (leader) {
        mbar_arrive(empty_k + 8 * sj);
        mbar_arrive(empty_v + 8 * sp);
      }
      mask_any<C, CAUSAL, GEN>(s, (j0 + j) * BC, Sk, kr, warp_row0, g, t);
      softmax_tile<C>(st, s, scale_log2, alpha);
      rescale_o<C>(st, alpha);
    }
    pack_p<BF16, C>(p, s);
  }

  // The last tile's PV.
  {
    const int sp = (n_kv - 1) % STAGES;
    mbar_wait(full_v + 8 * sp, ((n_kv - 1) / STAGES) & 1);
    turn_wait();
    if constexpr (OVERLAP) rescale_o<C>(st, alpha);
    fence_regs(st.acc_o);
    wgmma_fence();
    issue_pv<BF16, C>(st.acc_o, p, sV + sp * C::KV_BYTES);
    turn_pass();
    wgmma_wait<0>();
    fence_regs(st.acc_o);
    fence_regs_u(p);
  }
  finish(st);
}
#endif  // FAPROF_SM90A

#if FAPROF_SM90A
#define FAPROF_WS_BODY(PINGPONG, OVERLAP) \
  ws_body<T, C, CAUSAL, PINGPONG, OVERLAP, GEN>(&tm_q, &tm_k, &tm_v, o, lse, Sq, Sk, scale, scale_log2, gp)
#else
#define FAPROF_WS_BODY(PINGPONG, OVERLAP) __trap()  // sm_90a only; the launcher refuses other devices
#endif

// One __global__ per step, so that ncu and nsys tell the steps apart by kernel name.
#define FAPROF_WS_KERNEL(NAME, PINGPONG, OVERLAP)                                                            \
  template <typename T, class C, bool CAUSAL, bool GEN = false>                                              \
  __global__ void __launch_bounds__(Ws<C>::THREADS, 1)                                                       \
      NAME(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,                \
           const __grid_constant__ CUtensorMap tm_v, T* __restrict__ o, float* __restrict__ lse, int Sq, int Sk, \
           float scale, float scale_log2, Fa3Gen gp) {                                                       \
    FAPROF_WS_BODY(PINGPONG, OVERLAP);                                                                       \
  }
FAPROF_WS_KERNEL(fa3_wgmma_c_kernel, false, false)
FAPROF_WS_KERNEL(fa3_wgmma_d_kernel, true, false)
FAPROF_WS_KERNEL(fa3_wgmma_e_kernel, true, true)
#undef FAPROF_WS_KERNEL
#undef FAPROF_WS_BODY

// ------------------------------------------------------------------------------------------------
// Host side
// ------------------------------------------------------------------------------------------------
template <int D>
using CfgWs = Config<D, 128, 2, 2>;

enum class WsStep { C, D, E };

template <WsStep STEP, typename T, class C, bool CAUSAL>
cudaError_t launch_ws(const Args& a) {
  constexpr bool BF16 = std::is_same<T, __nv_bfloat16>::value;
  CUtensorMap mq, mk, mv;
  const int BH = a.B * a.H;
  cudaError_t err = make_map(&mq, a.q, BF16, BH, a.Sq, C::D, C::BR);
  if (err == cudaSuccess) err = make_map(&mk, a.k, BF16, BH, a.Sk, C::D, C::BC);
  if (err == cudaSuccess) err = make_map(&mv, a.v, BF16, BH, a.Sk, C::D, C::BC);
  if (err != cudaSuccess) return err;
  auto kernel = STEP == WsStep::C   ? fa3_wgmma_c_kernel<T, C, CAUSAL>
                : STEP == WsStep::D ? fa3_wgmma_d_kernel<T, C, CAUSAL>
                                    : fa3_wgmma_e_kernel<T, C, CAUSAL>;
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Ws<C>::SMEM);
  if (err != cudaSuccess) return err;
  const dim3 grid((a.Sq + C::BR - 1) / C::BR, a.H, a.B);
  kernel<<<grid, Ws<C>::THREADS, Ws<C>::SMEM, a.stream>>>(mq, mk, mv, static_cast<T*>(a.o), a.lse, a.Sq, a.Sk,
                                                           a.scale, a.scale * kLog2e,
                                                           Fa3Gen{1, a.H, -1, -1, 0, nullptr, nullptr, 0, 0});
  return cudaGetLastError();
}

// Step (e) for Fa3Gen's problems: K/V tensor maps over [B·Hkv, Sk, D].
template <typename T, class C, bool CAUSAL>
cudaError_t launch_e_gen(const Args& a, const Fa3Gen& gp) {
  constexpr bool BF16 = std::is_same<T, __nv_bfloat16>::value;
  CUtensorMap mq, mk, mv;
  cudaError_t err;
  if (gp.cu_q != nullptr) {  // packed [total, heads, D]: one plane per head, rows are tokens
    err = make_map_packed(&mq, a.q, BF16, gp.total_q, a.H, C::D, C::BR);
    if (err == cudaSuccess) err = make_map_packed(&mk, a.k, BF16, gp.total_k, gp.Hkv, C::D, C::BC);
    if (err == cudaSuccess) err = make_map_packed(&mv, a.v, BF16, gp.total_k, gp.Hkv, C::D, C::BC);
  } else {
    err = make_map(&mq, a.q, BF16, a.B * a.H, a.Sq, C::D, C::BR);
    if (err == cudaSuccess) err = make_map(&mk, a.k, BF16, a.B * gp.Hkv, a.Sk, C::D, C::BC);
    if (err == cudaSuccess) err = make_map(&mv, a.v, BF16, a.B * gp.Hkv, a.Sk, C::D, C::BC);
  }
  if (err != cudaSuccess) return err;
  auto kernel = fa3_wgmma_e_kernel<T, C, CAUSAL, true>;
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Ws<C>::SMEM);
  if (err != cudaSuccess) return err;
  const dim3 grid((a.Sq + C::BR - 1) / C::BR, a.H, a.B);
  kernel<<<grid, Ws<C>::THREADS, Ws<C>::SMEM, a.stream>>>(mq, mk, mv, static_cast<T*>(a.o), a.lse, a.Sq, a.Sk,
                                                           a.scale, a.scale * kLog2e, gp);
  return cudaGetLastError();
}

template <class C>
cudaError_t dispatch_e_gen(const Args& a, const Fa3Gen& gp, bool causal, bool bf16) {
  if (bf16) return causal ? launch_e_gen<__nv_bfloat16, C, true>(a, gp) : launch_e_gen<__nv_bfloat16, C, false>(a, gp);
  return causal ? launch_e_gen<__half, C, true>(a, gp) : launch_e_gen<__half, C, false>(a, gp);
}

template <WsStep STEP, class C>
cudaError_t dispatch_ws(const Args& a, bool causal, bool bf16) {
  if (bf16) return causal ? launch_ws<STEP, __nv_bfloat16, C, true>(a) : launch_ws<STEP, __nv_bfloat16, C, false>(a);
  return causal ? launch_ws<STEP, __half, C, true>(a) : launch_ws<STEP, __half, C, false>(a);
}

template <WsStep STEP>
cudaError_t fwd_ws(const void* q, const void* k, const void* v, void* o, float* lse, int B, int H, int Sq, int Sk,
                   int D, float scale, bool causal, bool bf16, cudaStream_t stream) {
  const Args a{q, k, v, o, lse, B, H, Sq, Sk, scale, stream};
  bool nothing_to_do = false;
  const cudaError_t err = validate(a, D, &nothing_to_do);
  if (err != cudaSuccess || nothing_to_do) return err;
  return D == 64 ? dispatch_ws<STEP, CfgWs<64>>(a, causal, bf16) : dispatch_ws<STEP, CfgWs<128>>(a, causal, bf16);
}

}  // namespace faprof_fa3

/// Step (c) of fa3_wgmma: step (b) with a TMA producer warpgroup (setmaxnreg 24) and two consumer
/// warpgroups (setmaxnreg 240) meeting at full/empty mbarriers. Same arguments as step (a).
cudaError_t faprof_fa3_wgmma_c_fwd(const void* q, const void* k, const void* v, void* o, float* lse, int B, int H,
                                   int Sq, int Sk, int D, float scale, bool causal, bool bf16, cudaStream_t stream) {
  return faprof_fa3::fwd_ws<faprof_fa3::WsStep::C>(q, k, v, o, lse, B, H, Sq, Sk, D, scale, causal, bf16, stream);
}

/// Step (d): step (c) with pingpong scheduling of the two consumer warpgroups' GEMMs.
cudaError_t faprof_fa3_wgmma_d_fwd(const void* q, const void* k, const void* v, void* o, float* lse, int B, int H,
                                   int Sq, int Sk, int D, float scale, bool causal, bool bf16, cudaStream_t stream) {
  return faprof_fa3::fwd_ws<faprof_fa3::WsStep::D>(q, k, v, o, lse, B, H, Sq, Sk, D, scale, causal, bf16, stream);
}

/// Step (e): step (d) with the softmax of S_j overlapping O += P_{j-1} V_{j-1} inside a warpgroup.
cudaError_t faprof_fa3_wgmma_e_fwd(const void* q, const void* k, const void* v, void* o, float* lse, int B, int H,
                                   int Sq, int Sk, int D, float scale, bool causal, bool bf16, cudaStream_t stream) {
  return faprof_fa3::fwd_ws<faprof_fa3::WsStep::E>(q, k, v, o, lse, B, H, Sq, Sk, D, scale, causal, bf16, stream);
}

/// Step (e) for the problems beyond 2022's (faprof_kernels.h, FaprofAttnEx): GQA/MQA, causal and
/// windows aligned to either corner, dense or packed varlen (no soft-cap: the launcher returns
/// cudaErrorInvalidValue). Dense: q/o [B, H, Sq, D], k/v [B, Hkv, Sk, D], lse [B, H, Sq]; varlen: q/o
/// [total_q, H, D], k/v [total_k, Hkv, D], lse [H, total_q], Sq/Sk the longest sequence's lengths.
cudaError_t faprof_fa3_wgmma_e_fwd_ex(const void* q, const void* k, const void* v, void* o, float* lse, int B, int H,
                                      int Sq, int Sk, int D, float scale, bool causal, bool bf16,
                                      const FaprofAttnEx& ex, cudaStream_t stream) {
  using namespace faprof_fa3;
  const Args a{q, k, v, o, lse, B, H, Sq, Sk, scale, stream};
  bool nothing_to_do = false;
  const cudaError_t err = validate(a, D, &nothing_to_do);
  if (err != cudaSuccess || nothing_to_do) return err;
  if (ex.Hkv <= 0 || H % ex.Hkv != 0 || static_cast<long long>(B) * ex.Hkv > 2147483647LL) return cudaErrorInvalidValue;
  if ((ex.cu_seqlens_q == nullptr) != (ex.cu_seqlens_k == nullptr) || ex.softcap != 0.f) return cudaErrorInvalidValue;
  if (ex.cu_seqlens_q != nullptr && (ex.total_q <= 0 || ex.total_k <= 0)) return cudaErrorInvalidValue;
  // A window side past Sq + Sk keys is the same mask, and keeps i + off ± side far from int overflow.
  const auto side = [&](int w) { return w < 0 ? -1 : static_cast<int>(std::min<long long>(w, 0LL + Sq + Sk)); };
  const Fa3Gen gp{H / ex.Hkv, ex.Hkv, side(ex.window_left), side(ex.window_right), ex.bottom_right ? 1 : 0,
                  ex.cu_seqlens_q, ex.cu_seqlens_k, ex.total_q, ex.total_k};
  return D == 64 ? dispatch_e_gen<CfgWs<64>>(a, gp, causal, bf16) : dispatch_e_gen<CfgWs<128>>(a, gp, causal, bf16);
}
