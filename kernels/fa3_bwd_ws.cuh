// fa3_bwd_ws.cuh — the warp-specialized Hopper backward (issue 28, steps c and d: kernels/fa3_bwd_c.cu,
// fa3_bwd_d.cu): the block configuration, the tile math of one consumer warpgroup, the TMA producer,
// the dQ write-back of each step and the kernel body and launcher both steps instantiate. The GEMM
// forms, fragment layouts, descriptors and the pre/post kernels are those of steps a/b
// (kernels/fa3_bwd.cuh, fa3_bwd_pre.cu); only the schedule around them is new.
//
// Block: 3 warpgroups = 384 threads over BN = 128 keys (grid and query-tile order as steps a/b).
//   * warpgroup 0, the producer: setmaxnreg.dec to 24 registers. Thread 0 issues every load: K and V
//     once (tensor maps, bar_kv), then per query tile Q and dO (tensor maps) and lse2, delta (1-D bulk
//     copies) into a ring of STAGES stages: full[s] completes on the TMA transactions, empty[s] on one
//     arrival per consumer warp once its wgmmas reading the stage are complete and its lse2/delta
//     reads done. Step d: warp 1 is the dQ writer (below); warps 2, 3 (and 1 in step c) exit.
//   * warpgroups 1 and 2, the consumers: setmaxnreg.inc to 240 registers; consumer cw owns keys
//     64·cw .. 64·cw + 63 of the block, dK and dV of them in registers, and per query tile at D=128
//     (BwdWsConfig::OVERLAP):
//       Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ issued back to back (two commit groups), wait for Sᵀ only;
//       Pᵀ = exp2(Sᵀ·scale·log2e − lse2) in fp32 while dPᵀ runs; dV += Pᵀ·dO issued, wait for dPᵀ
//       only; dSᵀ = Pᵀ ∘ (dPᵀ − delta) from the fp32 Pᵀ (steps a/b use the rounded Pᵀ) while dV runs;
//     at D=64, where that many live accumulators spilled, the order of steps a/b: Sᵀ, wait; Pᵀ
//       packed; dPᵀ and dV, wait; dSᵀ from the rounded Pᵀ;
//     then dSᵀ stored to one of two dSᵀ buffers (tile parity) and fenced for the async proxy;
//       dK += dSᵀ·Q issued; named barrier kBarDsReady over the 256 consumer threads (both halves of
//       dSᵀ stored); dQ block = dS·K issued; wait for everything; the stage released; dQ written
//       back (step c: red.global.add.v4 into dq_accum as steps a/b; step d: see below).
//     The two dSᵀ buffers let a warpgroup store tile i+1's dSᵀ while the other still reads tile i's
//     in its dQ GEMM: a warpgroup passes kBarDsReady of tile i+1 only after the other arrived there,
//     i.e. after that one's dQ GEMM of tile i completed, so buffer i%2 is free again at tile i+2.
//   * No block-wide barrier after the prologue: the warpgroups meet at mbarriers and named barriers.
//
// Step d's dQ write-back: the consumers' 64x64 dQ blocks go into an fp32 [BM][D] tile in shared
// memory whose 16-byte chunks are permuted within each row (chunk c of row r at c ^ 2·(r & 3),
// dq_swz_offset), which makes each warp's 8-byte stores of the accumulator fragment conflict-free
// (each half-warp covers 32 distinct banks); warp 1 of the producer warpgroup then adds the whole tile
// into dq_accum with one cp.reduce.async.bulk .add.f32 (TMA, 1-D: the tile's rows are contiguous in
// [B, H, Sq, D]; a tail tile reduces only its rows < Sq), so dq_accum holds dQ with the same chunk
// permutation per row and step d's convert kernel undoes it. Why not the tensor form with the TMA
// unit's 128-byte swizzle (chunk c ^ (r & 7)): there, the lanes t = 0,1 and t = 2,3 of rows g = 0..3
// land on the same four chunk positions, a 2-way conflict per half-warp. Handshake (named barriers,
// per tile): consumers [tile > 0: sync kBarDqEmpty + cw] store, fence.proxy.async, arrive kBarDqFull;
// writer: sync kBarDqFull, issue, commit, wait until the bulk copy has read shared memory, arrive
// kBarDqEmpty + 0 and + 1 (except after the last tile).
//
// Register budgets (static; `faprof build` reads the faprof:setmaxnreg lines of the step files):
// 128·24 + 256·240 = 64,512 = 384·168, the pool ptxas' launch count of 168 registers gives the block
// (__launch_bounds__(384, 1)); setmaxnreg.inc would wait forever for registers the pool lacks.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "fa3_bwd.cuh"
#include "fa3_common.cuh"
#include "fa3_fwd.cuh"

namespace faprof_fa3_bwd {

constexpr int kWsProducerRegs = 24;   // the TMA issue loop and the dQ writer need few registers
constexpr int kWsConsumerRegs = 240;  // dK, dV (D/2 each), Sᵀ, dPᵀ (BM/2 each), Pᵀ/dSᵀ fragments, dQ 32
constexpr int kWsLaunchRegs = 168;    // ptxas' count at launch for 384 threads, one block per SM
static_assert(128 * kWsProducerRegs + 256 * kWsConsumerRegs <= 384 * kWsLaunchRegs,
              "setmaxnreg re-partitions the block's launch pool: the budgets must fit it");

constexpr int kWsConsumerThreads = 256;
// One arrival per consumer warp on a stage's empty barrier: each warp releases the stage after its
// own wgmma wait and lse2/delta reads, with no assumption about the other warps of its warpgroup.
constexpr int kWsEmptyArrivals = kWsConsumerThreads / 32;
// Named barriers (0 is __syncthreads).
constexpr int kBarDsReady = 1;  // both consumer warpgroups stored their dSᵀ rows of the tile
constexpr int kBarDqFull = 2;   // step d: both dQ blocks of the tile are in shared memory (+ the writer warp)
constexpr int kBarDqEmpty = 3;  // step d: 3 + cw: the writer's bulk reduce has read the tile (cw's + the writer)
constexpr int kDqFullThreads = kWsConsumerThreads + 32;
constexpr int kDqEmptyThreads = 128 + 32;

template <int D_, int BM_, int STAGES_, bool DQ_SMEM_>
struct BwdWsConfig {
  static constexpr int D = D_;
  static constexpr int BN = 128;  // keys per block: two consumer warpgroups x 64
  static constexpr int BM = BM_;  // query rows per tile
  static constexpr int STAGES = STAGES_;  // Q/dO/lse2/delta ring depth
  static constexpr bool DQ_SMEM = DQ_SMEM_;  // step d: dQ through a shared-memory tile and a bulk reduce
  static constexpr int NWG = 2;  // consumer warpgroups
  static constexpr int THREADS = 128 * (NWG + 1);
  static constexpr int NQ = BM / 8;
  static constexpr int DT = D / 8;
  static constexpr int KD = D / 16;
  static constexpr int KQ = BM / 16;
  static constexpr int KN = BN / 16;
  static constexpr int DQ_NB = D / 64;
  // The in-warpgroup overlap of steps c/d (OVERLAP): Sᵀ and dPᵀ issued back to back, dV issued
  // under the dSᵀ math, dSᵀ from the fp32 Pᵀ. It keeps Sᵀ/Pᵀ in fp32, its packed copy and dPᵀ live
  // together beside dK and dV: 32 + 16 + 32 + 128 registers at D=128 (BM = 64), but 64 + 32 + 64 + 64
  // at D=64 (BM = 128), where ptxas (nvcc 13.0) spilled at 240 registers. D=64 runs the GEMMs of a
  // tile in the order of steps a/b instead (Sᵀ; Pᵀ packed; dPᵀ with dV; dSᵀ from the rounded Pᵀ).
  static constexpr bool OVERLAP = D == 128;
  static constexpr int K_BYTES = BN * D * 2;
  static constexpr int Q_BYTES = BM * D * 2;
  static constexpr int DS_BYTES = BN * BM * 2;
  static constexpr int DQ_BYTES = DQ_SMEM ? BM * D * 4 : 0;
  static constexpr int L_BYTES = 2 * BM * 4;  // lse2[BM], then delta[BM]
  static constexpr int OFF_V = K_BYTES;
  static constexpr int OFF_Q = 2 * K_BYTES;                 // Q stages
  static constexpr int OFF_DO = OFF_Q + STAGES * Q_BYTES;   // dO stages
  static constexpr int OFF_DS = OFF_DO + STAGES * Q_BYTES;  // dSᵀ buffers 0, 1
  static constexpr int OFF_DQ = OFF_DS + 2 * DS_BYTES;      // step d: the fp32 dQ tile
  static constexpr int OFF_L = OFF_DQ + DQ_BYTES;           // {lse2, delta} stages
  static constexpr int TILE_BYTES = OFF_L + STAGES * L_BYTES;
  static constexpr int SMEM_BYTES = TILE_BYTES + 1024;  // + slack to align the tiles to 1024 bytes
  static constexpr int BAR_BYTES = 64;                  // bar_kv, full[STAGES], empty[STAGES]

  static_assert(D == 64 || D == 128, "wgmma wrappers exist for N = 64 and 128 (dV/dK's N is D)");
  static_assert(BM == 64 || BM == 128, "wgmma wrappers exist for N = 64 and 128 (Sᵀ's N is BM)");
  static_assert(BM * D == NWG * 64 * 64, "dQ [BM, D] must split into one 64x64 block per consumer warpgroup");
  static_assert(kSeqPad % BM == 0, "a query tile must lie inside the padded lse2/delta rows");
  static_assert(STAGES >= 2 && 8 * (1 + 2 * STAGES) <= BAR_BYTES, "2+ stages; the mbarriers must fit BAR_BYTES");
  static_assert(OFF_Q % 1024 == 0 && OFF_DO % 1024 == 0 && OFF_DS % 1024 == 0 && OFF_DQ % 1024 == 0 &&
                    Q_BYTES % 1024 == 0 && DS_BYTES % 1024 == 0,
                "every SW128 tile must start 1024-byte aligned");
  static_assert(OFF_L % 16 == 0 && L_BYTES % 16 == 0 && TILE_BYTES % 8 == 0, "bulk copies and mbarriers alignment");
  static_assert(SMEM_BYTES + BAR_BYTES <= 227 * 1024, "exceeds the largest opt-in shared memory per block");
  static_assert(SMEM_BYTES + BAR_BYTES ==
                    512 * D + STAGES * (4 * BM * D + 8 * BM) + 512 * BM + (DQ_SMEM ? 4 * BM * D : 0) + 1088,
                "keep the faprof:launch lines in step");
};

// Step c: three stages. Step d: the dQ tile takes 32 KiB, which leaves room for three stages at
// D=128 (226.6 KiB of 227) but two at D=64 (its dSᵀ buffers are twice as large).
template <int D>
using WsCfgC = BwdWsConfig<D, D == 128 ? 64 : 128, 3, false>;
template <int D>
using WsCfgD = BwdWsConfig<D, D == 128 ? 64 : 128, D == 128 ? 3 : 2, true>;

// Where accumulator register i (0..31) of lane `lane` in warp `warp` of consumer warpgroup cw lies
// in the [BM, D] dQ tile: the warpgroup's 64x64 block (cw / DQ_NB, cw % DQ_NB), then the m64nNk16
// accumulator fragment (fa3_common.cuh's header).
struct TilePos {
  int row, col;
};
template <int DQ_NB>
__host__ __device__ constexpr TilePos dq_frag_pos(int cw, int warp, int lane, int i) {
  return {64 * (cw / DQ_NB) + 16 * warp + lane / 4 + 8 * ((i >> 1) & 1),
          64 * (cw % DQ_NB) + 8 * (i >> 2) + 2 * (lane & 3) + (i & 1)};
}

// Step d's permutation of the 16-byte chunks (4 floats) of a dQ row: chunk k of row r sits at chunk
// k ^ 2·(r & 3). An involution, so the convert kernel applies it again to undo it. Rows are counted
// from a query tile's first row, a multiple of BM, so r mod 4 is the same counted from the head's
// first row.
__host__ __device__ constexpr int dq_swz_chunk(int r, int k) { return k ^ (2 * (r & 3)); }

// Byte offset of fp32 element (r, c) in step d's dQ tile ([rows][D] row-major, D floats a row) and,
// relative to the tile's first row, in dq_accum.
__host__ __device__ constexpr uint32_t dq_swz_offset(int D, int r, int c) {
  return static_cast<uint32_t>(r * D * 4 + (dq_swz_chunk(r, c >> 2) << 4) + (c & 3) * 4);
}

// The stores' addresses, computed the cheap way (tests/fa3_bwd_ws_layout.cu checks them against
// dq_swz_offset of dq_frag_pos, and against the SW128 layout, on the CPU). Registers 4nt + 2h and
// 4nt + 2h + 1 of a thread are row g + 8h, columns 8nt + 2t, +1 of its block: chunk 16nb + 2nt + t/2,
// which the permutation sends to 32·(nt ^ (g & 3)) bytes past the thread's chunk-0 address. Bits 5-7
// of every other term are zero, so that is the thread's base with (g & 3) in bits 5-6, XOR 32·nt;
// row g + 8 adds 8 rows. One base register per thread instead of 16 loop-invariant addresses.
template <int D>
__host__ __device__ constexpr uint32_t dq_thread_base(int cw, int warp, int lane) {
  constexpr int NB = D / 64;
  return static_cast<uint32_t>((64 * (cw / NB) + 16 * warp + lane / 4) * D * 4 + 256 * (cw % NB) +
                               16 * ((lane & 3) >> 1) + 8 * (lane & 1) + 32 * ((lane / 4) & 3));
}
template <int D>
__host__ __device__ constexpr uint32_t dq_store_offset(uint32_t base, int nt, int h) {
  return (base ^ static_cast<uint32_t>(32 * nt)) + static_cast<uint32_t>(h * 8 * D * 4);
}

// Likewise for dSᵀ in its SW128 tile ([BN rows][BM columns] as BM/64 blocks of [BN][64], chunk j of
// row r at j ^ (r & 7), fa3_common.cuh's sw128_offset): register r of dsf[kk] is row
// 64cw + 16warp + g + 8(r & 1), columns 8·n8 + 2t, +1 with n8 = 2kk + r/2; rows are g mod 8, so the
// chunk (n8 & 7) ^ g is the thread's base (g in bits 4-6, 4t in bits 2-3) XOR 16·(n8 & 7), then
// whole 128-byte rows and [BN][64] blocks added.
template <int BN>
__host__ __device__ constexpr uint32_t ds_thread_base(int cw, int warp, int lane) {
  return static_cast<uint32_t>((64 * cw + 16 * warp + lane / 4) * 128 + 16 * (lane / 4) + 4 * (lane & 3));
}
template <int BN>
__host__ __device__ constexpr uint32_t ds_store_offset(uint32_t base, int kk, int r) {
  const int n8 = 2 * kk + (r >> 1);
  return (base ^ static_cast<uint32_t>(16 * (n8 & 7))) + static_cast<uint32_t>((n8 >> 3) * BN * 128 + (r & 1) * 8 * 128);
}

#if FAPROF_SM90A
using faprof_fa3::fence_proxy_async;
using faprof_fa3::fence_regs;
using faprof_fa3::fence_regs_u;
using faprof_fa3::make_desc;
using faprof_fa3::mbar_arrive;
using faprof_fa3::mbar_arrive_expect_tx;
using faprof_fa3::mbar_init;
using faprof_fa3::mbar_wait;
using faprof_fa3::named_arrive;
using faprof_fa3::named_sync;
using faprof_fa3::tma_tile;
using faprof_fa3::wgmma_commit;
using faprof_fa3::wgmma_fence;
using faprof_fa3::wgmma_wait;

// 1-D bulk reduction shared -> global (the TMA unit): dst[0..bytes) += src[0..bytes) as f32, in the
// calling thread's bulk async-group. dst, src 16-byte aligned, bytes a multiple of 16.
__device__ __forceinline__ void bulk_reduce_add_f32(float* dst, uint32_t src, uint32_t bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst), "r"(src),
               "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// Until the bulk groups but the newest N have read their shared-memory source (it may be rewritten).
template <int N>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
// Until the bulk groups but the newest N are complete (their global writes performed).
template <int N>
__device__ __forceinline__ void bulk_wait() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}

// ------------------------------------------------------------------------------------------------
// One query tile of one consumer warpgroup (see the header for the schedule). sdS: this tile's dSᵀ
// buffer; sL: this stage's lse2[BM] then delta[BM]. Returns with every wgmma of the tile complete
// (wait_group 0), dq holding the warpgroup's 64x64 dQ block (unscaled), and the stage no longer read.
// ------------------------------------------------------------------------------------------------
template <bool BF16, class C, bool CAUSAL>
__device__ __forceinline__ void ws_tile(float (&acc_dk)[C::D / 2], float (&acc_dv)[C::D / 2], float (&dq)[32],
                                        uint32_t sK, uint32_t sV, uint32_t sQ, uint32_t sdO, uint32_t sdS,
                                        const float* sL, int n0, int q0, int Sq, int Sk, float scale_log2, int cw,
                                        int warp, int g, int t) {
  constexpr int D = C::D, BN = C::BN, BM = C::BM;
  const int key_w = n0 + 64 * cw + 16 * warp;  // first key of this warp
  // As steps a/b: mask tiles with a tail or crossing this warp's causal diagonal; padding queries
  // and keys are masked explicitly so that no term depends on what the padding holds.
  const bool need_mask = key_w + 15 >= Sk || q0 + BM > Sq || (CAUSAL && key_w + 15 > q0);

  // ---- Sᵀ = K Qᵀ (and, OVERLAP, dPᵀ = V dOᵀ behind it): SS, both K-major, one commit group each ----
  float s[BM / 2], dp[BM / 2];
  auto issue_dp = [&] {
#pragma unroll
    for (int ks = 0; ks < C::KD; ++ks) {
      const uint32_t a_off = (ks >> 2) * BN * 128 + cw * 64 * 128 + (ks & 3) * 32;
      const uint32_t b_off = (ks >> 2) * BM * 128 + (ks & 3) * 32;
      faprof_fa3::wgmma_ss<BM, BF16, 0>(dp, make_desc(sV + a_off, 16, 1024), make_desc(sdO + b_off, 16, 1024),
                                        ks > 0);
    }
  };
  // dV += Pᵀ dO: RS, A = Pᵀ's packed fragments, B = the dO tile MN-major.
  auto issue_dv = [&](const uint32_t (&pf)[C::KQ][4]) {
#pragma unroll
    for (int kk = 0; kk < C::KQ; ++kk)
      faprof_fa3::wgmma_rs<D, BF16, 1>(acc_dv, pf[kk], make_desc(sdO + kk * 16 * 128, BM * 128, 1024), 1);
  };
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < C::KD; ++ks) {
    const uint32_t a_off = (ks >> 2) * BN * 128 + cw * 64 * 128 + (ks & 3) * 32;
    const uint32_t b_off = (ks >> 2) * BM * 128 + (ks & 3) * 32;
    faprof_fa3::wgmma_ss<BM, BF16, 0>(s, make_desc(sK + a_off, 16, 1024), make_desc(sQ + b_off, 16, 1024), ks > 0);
  }
  wgmma_commit();
  if constexpr (C::OVERLAP) {
    issue_dp();
    wgmma_commit();
    wgmma_wait<1>();  // Sᵀ; dPᵀ may still run
  } else {
    wgmma_wait<0>();
  }
  fence_regs(s);

  // ---- Pᵀ = exp2(Sᵀ·scale·log2e − lse2) ----
  // s[4nt + 2h + e] is key key_w + g + 8h, query q0 + 8nt + 2t + e: masked when x = 8nt + e is
  // >= hi[h] (query past Sq, or every query when the key is past Sk) or < lo[h] (causal: the query
  // precedes the key). The bounds pass through an empty asm after the wait so that the compiler
  // cannot evaluate the BM/2 predicates during the GEMMs and hold them in registers (it did, and
  // spilled).
  int hi[2], lo[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int key = key_w + g + 8 * h;
    hi[h] = key < Sk ? Sq - q0 - 2 * t : 0;
    lo[h] = CAUSAL ? key - q0 - 2 * t : -BM;
  }
  asm volatile("" : "+r"(hi[0]), "+r"(hi[1]), "+r"(lo[0]), "+r"(lo[1]));
#pragma unroll
  for (int nt = 0; nt < C::NQ; ++nt) {
    const float2 l2 = *reinterpret_cast<const float2*>(sL + 8 * nt + 2 * t);
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int i = 4 * nt + 2 * h + e;
        const float p = fast_exp2(fmaf(s[i], scale_log2, -(e ? l2.y : l2.x)));
        s[i] = need_mask && (8 * nt + e >= hi[h] || 8 * nt + e < lo[h]) ? 0.f : p;
      }
  }
  // n8 tiles 2kk and 2kk+1 of the accumulator are k16 step kk of the RS A operand.
  uint32_t pf[C::KQ][4];
#pragma unroll
  for (int kk = 0; kk < C::KQ; ++kk)
#pragma unroll
    for (int r = 0; r < 4; ++r) pf[kk][r] = pack2<BF16>(s[8 * kk + 2 * r], s[8 * kk + 2 * r + 1]);

  // ---- dV += Pᵀ dO, and dPᵀ = V dOᵀ unless it is already running ----
  wgmma_fence();
  fence_regs(acc_dv);
  if constexpr (!C::OVERLAP) issue_dp();
  issue_dv(pf);
  wgmma_commit();
  if constexpr (C::OVERLAP)
    wgmma_wait<1>();  // dPᵀ; dV runs under the dSᵀ math
  else
    wgmma_wait<0>();
  fence_regs(dp);

  // ---- dSᵀ = Pᵀ ∘ (dPᵀ − delta): OVERLAP with the fp32 Pᵀ, else the rounded one (as steps a/b) ----
#pragma unroll
  for (int nt = 0; nt < C::NQ; ++nt) {
    const float2 dl = *reinterpret_cast<const float2*>(sL + BM + 8 * nt + 2 * t);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int i = 4 * nt + 2 * h;
      const float2 p = C::OVERLAP ? make_float2(s[i], s[i + 1]) : unpack2<BF16>(pf[nt >> 1][2 * (nt & 1) + h]);
      dp[i] = p.x * (dp[i] - dl.x);
      dp[i + 1] = p.y * (dp[i + 1] - dl.y);
    }
  }
  uint32_t dsf[C::KQ][4];
#pragma unroll
  for (int kk = 0; kk < C::KQ; ++kk)
#pragma unroll
    for (int r = 0; r < 4; ++r) dsf[kk][r] = pack2<BF16>(dp[8 * kk + 2 * r], dp[8 * kk + 2 * r + 1]);

  // ---- dSᵀ to this tile's buffer: register r of dsf[kk] is n8 tile 2kk + r/2, row g + 8(r%2) ----
  // The buffer's last readers, the dQ wgmmas of tile i−2, completed before kBarDsReady of tile i−1.
  // The base is opaque to the compiler so that it derives the 16 addresses per tile rather than
  // keeping them in registers across the loop (ptxas spilled such loop-invariant addresses).
  uint32_t ds_base = sdS + ds_thread_base<BN>(cw, warp, 4 * g + t);
  asm volatile("" : "+r"(ds_base));
#pragma unroll
  for (int kk = 0; kk < C::KQ; ++kk)
#pragma unroll
    for (int r = 0; r < 4; ++r)
      asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(ds_store_offset<BN>(ds_base, kk, r)), "r"(dsf[kk][r]) : "memory");
  fence_proxy_async();  // generic-proxy stores that wgmma (async proxy) reads next

  // ---- dK += dSᵀ Q: RS, B = the Q tile MN-major ----
  wgmma_fence();
  fence_regs(acc_dk);
#pragma unroll
  for (int kk = 0; kk < C::KQ; ++kk)
    faprof_fa3::wgmma_rs<D, BF16, 1>(acc_dk, dsf[kk], make_desc(sQ + kk * 16 * 128, BM * 128, 1024), 1);
  wgmma_commit();

  // ---- both warpgroups' dSᵀ rows are in the buffer (dQ reads all BN keys) ----
  named_sync(kBarDsReady, kWsConsumerThreads);

  // ---- dQ block (mb, nb) = dS[64 queries, BN keys] · K[BN keys, 64 columns]: SS, A and B MN-major ----
  const int mb = cw / C::DQ_NB, nb = cw % C::DQ_NB;
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < C::KN; ++kk) {
    const uint64_t da = make_desc(sdS + mb * BN * 128 + kk * 16 * 128, BN * 128, 1024);
    const uint64_t db = make_desc(sK + nb * BN * 128 + kk * 16 * 128, BN * 128, 1024);
    wgmma_sst<64, BF16, 1, 1>(dq, da, db, kk > 0);
  }
  wgmma_commit();
  wgmma_wait<0>();  // dK and dQ of this tile (and dV, OVERLAP)
  fence_regs(dq);
  fence_regs(acc_dk);
  fence_regs(acc_dv);
  fence_regs_u(pf);
  fence_regs_u(dsf);
}

// Step c: dq_accum += the warpgroup's dQ block, one 16-byte reduction per n8 tile (as steps a/b:
// lanes t and t^1 swap halves so that the even lane holds row g, columns 2t..2t+3, the odd lane
// row g + 8, the same columns).
template <class C>
__device__ __forceinline__ void dq_red_add(const float (&dq)[32], float* __restrict__ dq_bh, int q0, int Sq, int cw,
                                           int warp, int g, int t) {
  const int mb = cw / C::DQ_NB, nb = cw % C::DQ_NB;
  const bool even = (t & 1) == 0;
  const int row = q0 + 64 * mb + 16 * warp + g + (even ? 0 : 8);
  float* dst = dq_bh + static_cast<size_t>(row) * C::D + 64 * nb + 2 * (t & ~1);
#pragma unroll
  for (int dt = 0; dt < 8; ++dt) {
    const float sx = even ? dq[4 * dt + 2] : dq[4 * dt + 0];
    const float sy = even ? dq[4 * dt + 3] : dq[4 * dt + 1];
    const float rx = __shfl_xor_sync(0xffffffffu, sx, 1);
    const float ry = __shfl_xor_sync(0xffffffffu, sy, 1);
    if (row < Sq) {
      if (even)
        red_add_v4(dst + 8 * dt, dq[4 * dt + 0], dq[4 * dt + 1], rx, ry);
      else
        red_add_v4(dst + 8 * dt, rx, ry, dq[4 * dt + 2], dq[4 * dt + 3]);
    }
  }
}

// Step d: the warpgroup's dQ block into the shared dQ tile (dq_swz_offset), 8-byte stores; the base
// opaque to the compiler as for the dSᵀ stores.
template <class C>
__device__ __forceinline__ void dq_to_smem(const float (&dq)[32], uint32_t sdQ, int cw, int warp, int lane) {
  uint32_t base = sdQ + dq_thread_base<C::D>(cw, warp, lane);  // sdQ is 1024-aligned: bits 5-7 stay the base's
  asm volatile("" : "+r"(base));
#pragma unroll
  for (int nt = 0; nt < 8; ++nt)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(dq_store_offset<C::D>(base, nt, h)),
                   "f"(dq[4 * nt + 2 * h]), "f"(dq[4 * nt + 2 * h + 1])
                   : "memory");
}

// The producer thread: K, V once, then every query tile of the block into the ring.
template <class C>
__device__ __forceinline__ void ws_produce(const CUtensorMap* tm_q, const CUtensorMap* tm_k, const CUtensorMap* tm_v,
                                           const CUtensorMap* tm_do, const float* l2g, const float* dlg,
                                           const QueryTiles& tiles, int n0, int bh, uint32_t s0) {
  constexpr uint32_t STAGE_TX = 2 * C::Q_BYTES + C::L_BYTES;  // Q, dO boxes (OOB rows counted), lse2, delta
  const uint32_t bar_kv = s0 + C::TILE_BYTES, full = bar_kv + 8, empty = full + 8 * C::STAGES;
  mbar_arrive_expect_tx(bar_kv, 2 * C::K_BYTES);
  tma_tile<C::BN, C::D>(s0, tm_k, n0, bh, bar_kv);
  tma_tile<C::BN, C::D>(s0 + C::OFF_V, tm_v, n0, bh, bar_kv);
  for (int i = 0; i < tiles.n_iter; ++i) {
    const int st = i % C::STAGES;
    const int use = i / C::STAGES;  // how often stage st was filled before
    if (use > 0) mbar_wait(empty + 8 * st, (use - 1) & 1);
    const int r0 = tiles.tile(i) * C::BM;
    const uint32_t bar = full + 8 * st;
    const uint32_t sl = s0 + C::OFF_L + st * C::L_BYTES;
    mbar_arrive_expect_tx(bar, STAGE_TX);
    tma_tile<C::BM, C::D>(s0 + C::OFF_Q + st * C::Q_BYTES, tm_q, r0, bh, bar);
    tma_tile<C::BM, C::D>(s0 + C::OFF_DO + st * C::Q_BYTES, tm_do, r0, bh, bar);
    bulk_load(sl, l2g + r0, C::BM * 4, bar);
    bulk_load(sl + C::BM * 4, dlg + r0, C::BM * 4, bar);
  }
}

// Step d's writer warp: per tile, the dQ tile's valid rows added into dq_accum by one bulk reduce.
template <class C>
__device__ __forceinline__ void ws_dq_writer(float* __restrict__ dq_bh, const QueryTiles& tiles, int Sq,
                                             uint32_t sdQ, int lane) {
  for (int i = 0; i < tiles.n_iter; ++i) {
    named_sync(kBarDqFull, kDqFullThreads);  // both consumer warpgroups stored and fenced
    if (lane == 0) {
      const int q0 = tiles.tile(i) * C::BM;
      const int rows = min(C::BM, Sq - q0);
      bulk_reduce_add_f32(dq_bh + static_cast<size_t>(q0) * C::D, sdQ, static_cast<uint32_t>(rows * C::D * 4));
      bulk_commit();
      bulk_wait_read<0>();  // the tile may be overwritten
    }
    __syncwarp();
    if (i + 1 < tiles.n_iter) {  // nobody waits after the last tile: leave no arrival pending
      named_arrive(kBarDqEmpty, kDqEmptyThreads);
      named_arrive(kBarDqEmpty + 1, kDqEmptyThreads);
    }
  }
  if (lane == 0) bulk_wait<0>();  // every reduction performed before the block exits
}

// The kernel body of steps c (C::DQ_SMEM false) and d.
template <typename T, class C, bool CAUSAL>
__device__ __forceinline__ void ws_body(const CUtensorMap* tm_q, const CUtensorMap* tm_k, const CUtensorMap* tm_v,
                                        const CUtensorMap* tm_do, const float* __restrict__ lse2,
                                        const float* __restrict__ delta, float* __restrict__ dq_accum,
                                        T* __restrict__ dk, T* __restrict__ dv, int Sq, int Sk, int Sq_pad,
                                        float scale, float scale_log2) {
  constexpr bool BF16 = std::is_same<T, __nv_bfloat16>::value;
  constexpr int D = C::D, BM = C::BM, STAGES = C::STAGES;
  extern __shared__ unsigned char smem_raw[];
  // SW128 blocks must start 1024-byte aligned (the descriptors' base offset is 0).
  unsigned char* smem =
      reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));

  const int tid = threadIdx.x;
  const int wg = tid >> 7;  // 0: producer, 1 and 2: consumers
  const int warp = (tid >> 5) & 3;
  const int lane = tid & 31;
  const int bh = blockIdx.z * gridDim.y + blockIdx.y;
  const int n0 = blockIdx.x * C::BN;
  const uint32_t s0 = smem_u32(smem);
  const uint32_t bar_kv = s0 + C::TILE_BYTES, full = bar_kv + 8, empty = full + 8 * STAGES;
  const QueryTiles tiles(n0, Sq, BM, CAUSAL, blockIdx.x, gridDim.x);
  float* dq_bh = dq_accum + static_cast<size_t>(bh) * Sq * D;

  if (tid == 0) {
    mbar_init(bar_kv, 1);
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(full + 8 * s, 1);
      mbar_init(empty + 8 * s, kWsEmptyArrivals);
    }
    // Make the initialised barriers visible to the async proxy (the TMA unit completes them).
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    fence_proxy_async();
  }
  __syncthreads();  // barriers initialised before anyone waits on them; the last block-wide barrier

  if (wg == 0) {
    // -------------------------------------------------------------------- producer warpgroup
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kWsProducerRegs));
    if (warp == 0) {
      if (lane == 0)
        ws_produce<C>(tm_q, tm_k, tm_v, tm_do, lse2 + static_cast<size_t>(bh) * Sq_pad,
                      delta + static_cast<size_t>(bh) * Sq_pad, tiles, n0, bh, s0);
    } else if constexpr (C::DQ_SMEM) {
      if (warp == 1) ws_dq_writer<C>(dq_bh, tiles, Sq, s0 + C::OFF_DQ, lane);
    }
    return;  // warps 2, 3 (and 1 in step c) have nothing to do
  }

  // ---------------------------------------------------------------------- consumer warpgroups
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kWsConsumerRegs));
  const int cw = wg - 1;
  const int g = lane >> 2, t = lane & 3;
  float acc_dk[D / 2], acc_dv[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) acc_dk[i] = acc_dv[i] = 0.f;
  mbar_wait(bar_kv, 0);  // also for a block with no query tile: no copy is left in flight at exit

  for (int i = 0; i < tiles.n_iter; ++i) {
    const int st = i % STAGES;
    const int q0 = tiles.tile(i) * BM;
    mbar_wait(full + 8 * st, (i / STAGES) & 1);  // the (i / STAGES)-th fill of stage st
    float dq[32];
    ws_tile<BF16, C, CAUSAL>(acc_dk, acc_dv, dq, s0, s0 + C::OFF_V, s0 + C::OFF_Q + st * C::Q_BYTES,
                             s0 + C::OFF_DO + st * C::Q_BYTES, s0 + C::OFF_DS + (i & 1) * C::DS_BYTES,
                             reinterpret_cast<const float*>(smem + C::OFF_L + st * C::L_BYTES), n0, q0, Sq, Sk,
                             scale_log2, cw, warp, g, t);
    // This warp's wgmmas on the stage are complete and its lse2/delta read: hand the stage back.
    __syncwarp();
    if (lane == 0) mbar_arrive(empty + 8 * st);
    if constexpr (C::DQ_SMEM) {
      if (i > 0) named_sync(kBarDqEmpty + cw, kDqEmptyThreads);  // the writer has read tile i−1
      dq_to_smem<C>(dq, s0 + C::OFF_DQ, cw, warp, lane);
      fence_proxy_async();  // generic-proxy stores that the bulk reduce (async proxy) reads next
      named_arrive(kBarDqFull, kDqFullThreads);
    } else {
      dq_red_add<C>(dq, dq_bh, q0, Sq, cw, warp, g, t);
    }
  }

  store_dkdv<T, C>(acc_dk, acc_dv, dk + static_cast<size_t>(bh) * Sk * D, dv + static_cast<size_t>(bh) * Sk * D, n0, Sk,
                   scale, cw, warp, g, t);
}
#endif  // FAPROF_SM90A

// The kernels' parameters (both steps).
#define FAPROF_BWD_WS_PARAMS                                                                                      \
  const __grid_constant__ CUtensorMap tm_q,      /* [B·H, Sq, D], box [BM rows][64] */                           \
      const __grid_constant__ CUtensorMap tm_k,  /* [B·H, Sk, D], box [BN rows][64] */                           \
      const __grid_constant__ CUtensorMap tm_v,  /* [B·H, Sk, D], box [BN rows][64] */                           \
      const __grid_constant__ CUtensorMap tm_do, /* [B·H, Sq, D], box [BM rows][64] */                           \
      const float* __restrict__ lse2,            /* [B, H, Sq_pad] */                                            \
      const float* __restrict__ delta,           /* [B, H, Sq_pad] */                                            \
      float* __restrict__ dq_accum,              /* [B, H, Sq, D], zeroed (step d: chunks permuted per row) */   \
      T* __restrict__ dk,                        /* [B, H, Sk, D] */                                             \
      T* __restrict__ dv,                        /* [B, H, Sk, D] */                                             \
      int Sq, int Sk, int Sq_pad, float scale, float scale_log2

template <typename T>
using WsKernel = void (*)(CUtensorMap, CUtensorMap, CUtensorMap, CUtensorMap, const float*, const float*, float*, T*,
                          T*, int, int, int, float, float);

// Tensor maps, shared memory opt-in and the launch of one warp-specialized kernel instantiation.
template <typename T, class C>
cudaError_t launch_ws(const BwdArgs& a, WsKernel<T> kernel) {
  constexpr bool BF16 = std::is_same<T, __nv_bfloat16>::value;
  CUtensorMap mq, mk, mv, mdo;
  const int BH = a.B * a.H;
  cudaError_t err = faprof_fa3::make_map(&mq, a.q, BF16, BH, a.Sq, C::D, C::BM);
  if (err == cudaSuccess) err = faprof_fa3::make_map(&mk, a.k, BF16, BH, a.Sk, C::D, C::BN);
  if (err == cudaSuccess) err = faprof_fa3::make_map(&mv, a.v, BF16, BH, a.Sk, C::D, C::BN);
  if (err == cudaSuccess) err = faprof_fa3::make_map(&mdo, a.dout, BF16, BH, a.Sq, C::D, C::BM);
  if (err != cudaSuccess) return err;
  constexpr int smem = C::SMEM_BYTES + C::BAR_BYTES;
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return err;
  const dim3 grid((a.Sk + C::BN - 1) / C::BN, a.H, a.B);
  kernel<<<grid, C::THREADS, smem, a.stream>>>(mq, mk, mv, mdo, a.lse2, a.delta, a.dq_accum, static_cast<T*>(a.dk),
                                               static_cast<T*>(a.dv), a.Sq, a.Sk, padded_seq(a.Sq), a.scale,
                                               a.scale * kLog2e);
  return cudaGetLastError();
}

}  // namespace faprof_fa3_bwd
