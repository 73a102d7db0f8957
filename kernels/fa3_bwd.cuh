// fa3_bwd.cuh — what the Hopper backward steps (kernels/fa3_bwd_a.cu, fa3_bwd_b.cu, issue 28) share:
// the tile configuration, the wgmma wrappers with a transposed (MN-major) A operand, the math of one
// query tile (five GEMMs on wgmma), the dK/dV epilogue and the host-side argument checks. The
// pre/post-processing kernels (delta, lse2, dq convert) are in kernels/fa3_bwd_pre.cu.
//
// Algorithm (FlashAttention-2's backward, Dao 2023, Algorithm 2, "KV-block parallel"): a block owns
// BN = 128 keys (two warpgroups of 64 keys each), keeps dK and dV of its keys in registers and loops
// over the query tiles of BM rows that can see them. Everything is computed transposed, keys as the
// wgmma M dimension, so that a warpgroup owns 64 whole keys and dK/dV need no reduction:
//
//   GEMM                   form  A (M x K)                         B (K x N)                        checked by
//   Sᵀ  = K·Qᵀ   [64, BM]  SS    K rows of the warpgroup, K-major  Q tile, K-major ([row][d])       form of fwd QKᵀ (H100); diag SS B K-major N=BM K=D
//   dPᵀ = V·dOᵀ  [64, BM]  SS    V rows, K-major                   dO tile, K-major                 same form
//   dV += Pᵀ·dO  [64, D]   RS    Pᵀ from registers (accumulator)   dO tile, MN-major (transpose-B)  form of fwd P·V (H100); diag RS B MN-major N=D K=BM
//   dK += dSᵀ·Q  [64, D]   RS    dSᵀ from registers                Q tile, MN-major                 same form
//   dQ  = dS·K   [64, 64]  SS    dS = (dSᵀ in smem)ᵀ, MN-major A   K tile, MN-major                 new form: diag SS-At N=64 K=128
//                                (transpose-A bit)
// (The diag cases with K = 64 and the transposed A are new with the backward: written, compiled,
// not yet run on a GPU. The forward's forms ran on the H100.)
// with Pᵀ = exp2(Sᵀ·scale·log2e − lse2) (lse2 = lse·log2e, per query = per column) and
// dSᵀ = Pᵀ ∘ (dPᵀ − delta), delta = rowsum(dO ∘ O) (per column). dK is scaled by `scale` once in
// the epilogue, dQ in the convert kernel. dQ of a query tile gets one term per key block, so the
// blocks add their [BM, D] partial dQ into an fp32 dq_accum with red.global.add.v4.f32.
//
// Shared-memory layout (all SW128, see kernels/fa3_common.cuh: [rows][64-column blocks], chunk c of
// row r at c ^ (r & 7), every block 1024-byte aligned): sK, sV [BN][D]; two buffers of sQ, sdO [BM][D];
// sdS [BN][BM] (dSᵀ: rows are keys, columns queries); two buffers of {lse2[BM], delta[BM]} (fp32).
//
// Fragment layouts relied on (the wgmma m64nNk16 f32 accumulator, fa3_common.cuh's header; verified
// on the H100 by the forward and by scripts/gpu/wgmma_diag.py):
//   * accumulator register i = 4·nt + 2·h + e of lane (g = lane/4, t = lane%4) in warp w of the
//     warpgroup holds row 16·w + g + 8·h, column 8·nt + 2·t + e;
//   * so registers 8·kk .. 8·kk+7 of Sᵀ (n8 tiles 2kk, 2kk+1), packed in pairs, are the m16n8k16 A
//     fragment of k16 step kk: the RS operand of dV and dK (the forward feeds P to P·V this way);
//   * dSᵀ goes to sdS as 4-byte stores of (row, columns 2t, 2t+1) pairs: one 16-byte chunk per n8
//     tile, the 8 rows g of a warp on 8 different chunk positions, so a store is conflict-free.
//
// Descriptor conventions (fa3_common.cuh's header): K-major: SBO = 1024 (next 8 rows), k16 step s of
// a 64-column block at +32·s bytes, the next block at +rows·128. MN-major (for B as V in the
// forward's P·V, and now for A): the K dimension runs down the rows, 64 M/N elements per 128-byte
// row; SBO = 1024 (next 8 K rows), LBO = byte stride between 64-wide M/N blocks (rows·128), k16 step
// s at +16·128·s bytes. An operand exactly 64 wide in M/N (dQ's A and B) lies in one block, so its
// LBO is never used.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "fa3_common.cuh"
#include "fa3_fwd.cuh"
#include "faprof_kernels.h"

namespace faprof_fa3_bwd {

using faprof_fa3::kLog2e;
using faprof_ptx::fast_exp2;
using faprof_ptx::pack2;
using faprof_ptx::smem_u32;

// lse2 and delta are written by the preprocess kernel into [B·H, Sq_pad] buffers, Sq rounded up to
// this, so that every query tile's 2·BM floats are one aligned, in-bounds 16-byte-multiple copy
// (cp.async in step a, a 1-D bulk copy in step b). The launchers' callers size the workspaces by it.
constexpr int kSeqPad = kFaprofFa3BwdSeqPad;

template <int D_, int BM_>
struct BwdConfig {
  static constexpr int D = D_;     // head dim
  static constexpr int BN = 128;   // keys per block: two warpgroups x 64 (the wgmma M of Sᵀ, dV, dK)
  static constexpr int BM = BM_;   // query rows per step (N of Sᵀ/dPᵀ, K of dV/dK, M of dQ)
  static constexpr int NWG = 2;
  static constexpr int THREADS = 128 * NWG;
  static constexpr int NQ = BM / 8;   // n8 query tiles of a Sᵀ fragment
  static constexpr int DT = D / 8;    // n8 tiles of dK / dV
  static constexpr int KD = D / 16;   // k16 steps of Sᵀ and dPᵀ
  static constexpr int KQ = BM / 16;  // k16 steps of dV and dK
  static constexpr int KN = BN / 16;  // k16 steps of dQ
  static constexpr int DQ_NB = D / 64;  // dQ is split into 64 x 64 blocks, one per warpgroup
  static constexpr int K_BYTES = BN * D * 2;
  static constexpr int Q_BYTES = BM * D * 2;
  static constexpr int DS_BYTES = BN * BM * 2;
  static constexpr int L_BYTES = 2 * BM * 4;  // lse2[BM], then delta[BM]
  static constexpr int OFF_V = K_BYTES;
  static constexpr int OFF_Q = 2 * K_BYTES;            // Q buffers 0, 1
  static constexpr int OFF_DO = OFF_Q + 2 * Q_BYTES;   // dO buffers 0, 1
  static constexpr int OFF_DS = OFF_DO + 2 * Q_BYTES;  // dSᵀ
  static constexpr int OFF_L = OFF_DS + DS_BYTES;      // {lse2, delta} buffers 0, 1
  static constexpr int TILE_BYTES = OFF_L + 2 * L_BYTES;
  static constexpr int SMEM_BYTES = TILE_BYTES + 1024;  // + slack to align the tiles to 1024 bytes
  static constexpr int BAR_BYTES = 64;                  // step (b): mbarriers after the tiles

  static_assert(D == 64 || D == 128, "wgmma wrappers exist for N = 64 and 128 (dV/dK's N is D)");
  static_assert(BM == 64 || BM == 128, "wgmma wrappers exist for N = 64 and 128 (Sᵀ's N is BM)");
  static_assert(BM * D == NWG * 64 * 64, "dQ [BM, D] must split into one 64x64 block per warpgroup");
  static_assert(kSeqPad % BM == 0, "a query tile must lie inside the padded lse2/delta rows");
  static_assert(OFF_Q % 1024 == 0 && OFF_DO % 1024 == 0 && OFF_DS % 1024 == 0 && Q_BYTES % 1024 == 0,
                "every SW128 tile must start 1024-byte aligned");
  static_assert(SMEM_BYTES + BAR_BYTES <= 227 * 1024, "exceeds the largest opt-in shared memory per block");
  static_assert(SMEM_BYTES == 4 * BN * D + 8 * BM * D + 2 * BN * BM + 16 * BM + 1024,
                "keep the faprof:launch lines in step");
};

// Register budget (per thread, fp32 unless said): dK, dV D/2 each; Sᵀ, dPᵀ BM/2 each (never live
// together, see bwd_tile); packed Pᵀ, dSᵀ fragments BM/4 each; dQ 32. D=128 takes BM = 64 (peak
// dK + dV + dPᵀ + Pᵀ = 64 + 64 + 32 + 16), D=64 takes BM = 128 (32 + 32 + 64 + 32): room under 255
// with one block of 256 threads per SM (ptxas, nvcc 13.0: 219-255 registers, no spills), and both
// split dQ into two 64x64 blocks (N = 64 wgmmas).
template <int D>
using BwdCfg = BwdConfig<D, D == 128 ? 64 : 128>;

#if FAPROF_SM90A
using faprof_fa3::fence_regs;
using faprof_fa3::fence_regs_u;

// ------------------------------------------------------------------------------------------------
// wgmma.mma_async SS with both transpose immediates (the fa3_common.cuh wrappers fix trans-a = 0).
// imm-trans-a = 1: A is MN-major (M contiguous), as dS read from the dSᵀ tile. Generated like the
// fa3_common.cuh wrappers.
// ------------------------------------------------------------------------------------------------
// D[64x64] (+)= A(smem desc, TRANS_A: 1 = MN-major) * B(smem desc, TRANS_B), f16; scale_d = 0 overwrites D.
template <int TRANS_A, int TRANS_B>
__device__ __forceinline__ void wgmma_sst_m64n64_f16(float (&d)[32], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, %35, %36;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TRANS_A), "n"(TRANS_B));
}

// D[64x64] (+)= A(smem desc, TRANS_A: 1 = MN-major) * B(smem desc, TRANS_B), bf16; scale_d = 0 overwrites D.
template <int TRANS_A, int TRANS_B>
__device__ __forceinline__ void wgmma_sst_m64n64_bf16(float (&d)[32], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, %35, %36;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TRANS_A), "n"(TRANS_B));
}

// D[64x128] (+)= A(smem desc, TRANS_A: 1 = MN-major) * B(smem desc, TRANS_B), f16; scale_d = 0 overwrites D.
template <int TRANS_A, int TRANS_B>
__device__ __forceinline__ void wgmma_sst_m64n128_f16(float (&d)[64], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, %67, %68;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TRANS_A), "n"(TRANS_B));
}

// D[64x128] (+)= A(smem desc, TRANS_A: 1 = MN-major) * B(smem desc, TRANS_B), bf16; scale_d = 0 overwrites D.
template <int TRANS_A, int TRANS_B>
__device__ __forceinline__ void wgmma_sst_m64n128_bf16(float (&d)[64], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, %67, %68;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TRANS_A), "n"(TRANS_B));
}

// Dispatch on N (64 or 128) and the input type; d has N/2 registers.
template <int N, bool BF16, int TRANS_A, int TRANS_B>
__device__ __forceinline__ void wgmma_sst(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  static_assert(N == 64 || N == 128, "wrappers exist for N = 64 and 128");
  if constexpr (N == 64 && !BF16) wgmma_sst_m64n64_f16<TRANS_A, TRANS_B>(d, desc_a, desc_b, scale_d);
  if constexpr (N == 64 && BF16) wgmma_sst_m64n64_bf16<TRANS_A, TRANS_B>(d, desc_a, desc_b, scale_d);
  if constexpr (N == 128 && !BF16) wgmma_sst_m64n128_f16<TRANS_A, TRANS_B>(d, desc_a, desc_b, scale_d);
  if constexpr (N == 128 && BF16) wgmma_sst_m64n128_bf16<TRANS_A, TRANS_B>(d, desc_a, desc_b, scale_d);
}

// One f16x2 / bf16x2 register back to two floats (lo: the lower column), the inverse of pack2.
template <bool BF16>
__device__ __forceinline__ float2 unpack2(uint32_t bits) {
  if constexpr (BF16) {
    __nv_bfloat162 h;
    memcpy(&h, &bits, 4);
    return __bfloat1622float2(h);
  } else {
    __half2 h;
    memcpy(&h, &bits, 4);
    return __half22float2(h);
  }
}

// Four consecutive floats added in one reduction (sm_90, PTX 8.1); p 16-byte aligned.
__device__ __forceinline__ void red_add_v4(float* p, float x, float y, float z, float w) {
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(p), "f"(x), "f"(y), "f"(z), "f"(w) : "memory");
}

// 1-D bulk copy global -> shared (the TMA unit without a tensor map), completing on `bar`;
// dst, src 16-byte aligned, bytes a multiple of 16.
__device__ __forceinline__ void bulk_load(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}

// ------------------------------------------------------------------------------------------------
// One query tile: everything after its Q, dO, lse2 and delta are in shared memory.
//   sK, sV: the block's key tile; sQ, sdO: this query tile's buffers; sdS: the dSᵀ tile;
//   sL: this tile's lse2[BM] then delta[BM]; dq_bh: dq_accum of this (b, h), [Sq, D];
//   n0, q0: first key of the block, first query of the tile; wg, warp, g, t: the thread's place.
// Ends with every wgmma of the tile complete (wait_group 0), its dQ added to dq_accum, and the
// block met once (after the dSᵀ stores). The caller owns the barrier that lets the next tile
// overwrite sdS and this tile's buffers.
// ------------------------------------------------------------------------------------------------
template <bool BF16, class C, bool CAUSAL>
__device__ __forceinline__ void bwd_tile(float (&acc_dk)[C::D / 2], float (&acc_dv)[C::D / 2], uint32_t sK, uint32_t sV,
                                         uint32_t sQ, uint32_t sdO, uint32_t sdS, const float* sL,
                                         float* __restrict__ dq_bh, int n0, int q0, int Sq, int Sk, float scale_log2,
                                         int wg, int warp, int g, int t) {
  constexpr int D = C::D, BN = C::BN, BM = C::BM;
  using faprof_fa3::make_desc;
  using faprof_fa3::wgmma_commit;
  using faprof_fa3::wgmma_fence;
  using faprof_fa3::wgmma_wait;

  // The GEMMs run in the order Sᵀ | Pᵀ | dPᵀ and dV | dSᵀ | dK | dQ, each group waited for before
  // the fp32 work that needs it. Issuing Sᵀ and dPᵀ together would keep both BM/2-register
  // accumulators live at once next to dK and dV: ptxas spilled at D=64 (BM = 128) that way.
  const int key_w = n0 + 64 * wg + 16 * warp;  // first key of this warp
  // Mask only tiles with a tail or crossing this warp's causal diagonal. Queries past Sq (zero-filled
  // Q and dO; lse2 = +inf, delta = 0 in the padding) and keys past Sk (zero-filled K, V) are masked
  // explicitly too, so that no term depends on what the padding holds.
  const bool need_mask = key_w + 15 >= Sk || q0 + BM > Sq || (CAUSAL && key_w + 15 > q0);
  // s[4nt + 2h + e] (and dp[...]) is key key_w + g + 8h, query q0 + 8nt + 2t + e.
  auto masked = [&](int nt, int h, int e) {
    const int key = key_w + g + 8 * h;
    const int qry = q0 + 8 * nt + 2 * t + e;
    return key >= Sk || qry >= Sq || (CAUSAL && key > qry);
  };

  // ---- Sᵀ = K Qᵀ: SS, both K-major ----
  // A: this warpgroup's 64 rows of the key tile (+64·128 bytes per warpgroup inside each 64-column
  // block, whose stride is BN·128); B: the query tile, BM rows (block stride BM·128).
  float s[BM / 2];
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < C::KD; ++ks) {
    const uint32_t a_off = (ks >> 2) * BN * 128 + wg * 64 * 128 + (ks & 3) * 32;
    const uint32_t b_off = (ks >> 2) * BM * 128 + (ks & 3) * 32;
    faprof_fa3::wgmma_ss<BM, BF16, 0>(s, make_desc(sK + a_off, 16, 1024), make_desc(sQ + b_off, 16, 1024), ks > 0);
  }
  wgmma_commit();
  wgmma_wait<0>();
  fence_regs(s);

  // ---- Pᵀ = exp2(Sᵀ·scale·log2e − lse2), packed as RS A fragments ----
#pragma unroll
  for (int nt = 0; nt < C::NQ; ++nt) {
    const float2 l2 = *reinterpret_cast<const float2*>(sL + 8 * nt + 2 * t);
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int i = 4 * nt + 2 * h + e;
        const float p = fast_exp2(fmaf(s[i], scale_log2, -(e ? l2.y : l2.x)));
        s[i] = need_mask && masked(nt, h, e) ? 0.f : p;
      }
  }
  // n8 tiles 2kk and 2kk+1 of the accumulator are k16 step kk of the A operand (see the header).
  uint32_t pf[C::KQ][4];
#pragma unroll
  for (int kk = 0; kk < C::KQ; ++kk)
#pragma unroll
    for (int r = 0; r < 4; ++r) pf[kk][r] = pack2<BF16>(s[8 * kk + 2 * r], s[8 * kk + 2 * r + 1]);

  // ---- dPᵀ = V dOᵀ (SS, both K-major) and dV += Pᵀ dO (RS, B = the dO tile MN-major) ----
  float dp[BM / 2];
  wgmma_fence();
  fence_regs(acc_dv);
#pragma unroll
  for (int ks = 0; ks < C::KD; ++ks) {
    const uint32_t a_off = (ks >> 2) * BN * 128 + wg * 64 * 128 + (ks & 3) * 32;
    const uint32_t b_off = (ks >> 2) * BM * 128 + (ks & 3) * 32;
    faprof_fa3::wgmma_ss<BM, BF16, 0>(dp, make_desc(sV + a_off, 16, 1024), make_desc(sdO + b_off, 16, 1024), ks > 0);
  }
#pragma unroll
  for (int kk = 0; kk < C::KQ; ++kk)
    faprof_fa3::wgmma_rs<D, BF16, 1>(acc_dv, pf[kk], make_desc(sdO + kk * 16 * 128, BM * 128, 1024), 1);
  wgmma_commit();
  wgmma_wait<0>();
  fence_regs(dp);
  fence_regs(acc_dv);
  fence_regs_u(pf);

  // ---- dSᵀ = Pᵀ ∘ (dPᵀ − delta) ----
  // Pᵀ comes back from the packed fragments (the values dV used): one more fp16/bf16 rounding of a
  // factor of dSᵀ, of the size of dSᵀ's own rounding for the GEMMs, instead of BM/2 more fp32
  // registers live through dPᵀ (ptxas spilled at D=64, BM = 128, with Sᵀ kept in fp32).
  uint32_t dsf[C::KQ][4];
#pragma unroll
  for (int nt = 0; nt < C::NQ; ++nt) {
    const float2 dl = *reinterpret_cast<const float2*>(sL + BM + 8 * nt + 2 * t);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int i = 4 * nt + 2 * h;
      const float2 p = faprof_fa3_bwd::unpack2<BF16>(pf[nt >> 1][2 * (nt & 1) + h]);
      dp[i] = p.x * (dp[i] - dl.x);
      dp[i + 1] = p.y * (dp[i + 1] - dl.y);
    }
  }
#pragma unroll
  for (int kk = 0; kk < C::KQ; ++kk)
#pragma unroll
    for (int r = 0; r < 4; ++r) dsf[kk][r] = pack2<BF16>(dp[8 * kk + 2 * r], dp[8 * kk + 2 * r + 1]);

  // ---- dSᵀ to shared memory for dQ: register r of dsf[kk] is n8 tile 2kk + r/2, row g + 8(r%2) ----
  // The previous tile's dQ wgmmas, the last readers of sdS, completed before the caller's barrier.
#pragma unroll
  for (int kk = 0; kk < C::KQ; ++kk)
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int row = 64 * wg + 16 * warp + g + 8 * (r & 1);
      const int col = 8 * (2 * kk + (r >> 1)) + 2 * t;
      asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(sdS + faprof_fa3::sw128_offset(BN, row, col)), "r"(dsf[kk][r])
                   : "memory");
    }
  // Generic-proxy stores that wgmma (async proxy) reads next: each writer fences before the barrier.
  faprof_fa3::fence_proxy_async();

  // ---- dK += dSᵀ Q: RS, B = the Q tile MN-major ----
  wgmma_fence();
  fence_regs(acc_dk);
#pragma unroll
  for (int kk = 0; kk < C::KQ; ++kk)
    faprof_fa3::wgmma_rs<D, BF16, 1>(acc_dk, dsf[kk], make_desc(sQ + kk * 16 * 128, BM * 128, 1024), 1);
  wgmma_commit();

  // ---- every warpgroup's dSᵀ rows are in shared memory (dQ reads all BN keys) ----
  __syncthreads();

  // ---- dQ block (mb, nb) = dS[64 queries, BN keys] · K[BN keys, 64 columns]: SS, A and B MN-major ----
  // A: columns 64·mb.. of the dSᵀ tile (block stride BN·128), K = keys down its rows;
  // B: columns 64·nb.. of the key tile, K = keys down its rows.
  const int mb = wg / C::DQ_NB, nb = wg % C::DQ_NB;
  float dq[32];
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < C::KN; ++kk) {
    const uint64_t da = make_desc(sdS + mb * BN * 128 + kk * 16 * 128, BN * 128, 1024);
    const uint64_t db = make_desc(sK + nb * BN * 128 + kk * 16 * 128, BN * 128, 1024);
    wgmma_sst<64, BF16, 1, 1>(dq, da, db, kk > 0);
  }
  wgmma_commit();
  wgmma_wait<0>();  // dK and dQ of this tile
  fence_regs(dq);
  fence_regs(acc_dk);
  fence_regs_u(dsf);

  // ---- dq_accum += dQ block: one 16-byte reduction per n8 tile ----
  // Lanes t and t^1 swap halves so that the even lane holds row g, columns 2t..2t+3 and the odd
  // lane row g + 8, the same four columns (as fa2_mma_bwd.cu does on sm_90).
  const bool even = (t & 1) == 0;
  const int row = q0 + 64 * mb + 16 * warp + g + (even ? 0 : 8);
  float* dst = dq_bh + static_cast<size_t>(row) * D + 64 * nb + 2 * (t & ~1);
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

// dK·scale and dV of the block's keys, 4-byte stores of column pairs (once per block).
template <typename T, class C>
__device__ __forceinline__ void store_dkdv(const float (&acc_dk)[C::D / 2], const float (&acc_dv)[C::D / 2],
                                           T* __restrict__ dk_bh, T* __restrict__ dv_bh, int n0, int Sk, float scale,
                                           int wg, int warp, int g, int t) {
  constexpr bool BF16 = std::is_same<T, __nv_bfloat16>::value;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int key = n0 + 64 * wg + 16 * warp + g + 8 * h;
    if (key < Sk) {
#pragma unroll
      for (int dt = 0; dt < C::DT; ++dt) {
        const size_t off = static_cast<size_t>(key) * C::D + 8 * dt + 2 * t;
        *reinterpret_cast<uint32_t*>(dk_bh + off) =
            pack2<BF16>(acc_dk[4 * dt + 2 * h] * scale, acc_dk[4 * dt + 2 * h + 1] * scale);
        *reinterpret_cast<uint32_t*>(dv_bh + off) = pack2<BF16>(acc_dv[4 * dt + 2 * h], acc_dv[4 * dt + 2 * h + 1]);
      }
    }
  }
}
#endif  // FAPROF_SM90A

// Which query tiles a block visits: m_begin + (i + m_off) mod n_iter for i < n_iter. Causal: from
// the first tile that reaches the block's first key (earlier ones lie wholly above the diagonal).
// Non-causal: the blocks of one (b, h) start at staggered tiles, so that they do not all add into
// the same dQ rows at once (measured for fa2_mma on the H100, kernels/fa2_mma_bwd.cu).
struct QueryTiles {
  int m_begin, n_m, n_iter, m_off;
  __host__ __device__ __forceinline__ QueryTiles(int n0, int Sq, int BM, bool causal, int block, int blocks)
      : m_begin(causal ? n0 / BM : 0), n_m((Sq + BM - 1) / BM), n_iter(n_m - m_begin), m_off(0) {
    if (!causal && n_iter > 0) m_off = static_cast<int>(static_cast<long long>(block) * n_iter / blocks);
  }
  __host__ __device__ __forceinline__ int tile(int i) const { return m_begin + (i + m_off) % n_iter; }
};

// ------------------------------------------------------------------------------------------------
// Host side
// ------------------------------------------------------------------------------------------------
struct BwdArgs {
  const void *q, *k, *v, *o, *dout;  // [B, H, S, D] fp16/bf16
  const float* lse;                  // [B, H, Sq] natural log, as the fa3 forward writes it
  void *dq, *dk, *dv;                // [B, H, S, D]
  float* lse2;                       // [B, H, Sq_pad] workspace: lse·log2e (+inf in the padding)
  float* delta;                      // [B, H, Sq_pad] workspace: rowsum(dO ∘ O) (0 in the padding)
  float* dq_accum;                   // [B, H, Sq, D] workspace
  int B, H, Sq, Sk, D;
  float scale;
  bool causal, bf16;
  cudaStream_t stream;
};

inline int padded_seq(int Sq) { return (Sq + kSeqPad - 1) / kSeqPad * kSeqPad; }

// Shape/pointer checks shared by both steps; cudaErrorNotSupported off compute capability 9.0.
inline cudaError_t validate(const BwdArgs& a) {
  if (a.D != 64 && a.D != 128) return cudaErrorInvalidValue;
  if (a.B < 1 || a.H < 1 || a.Sq < 1 || a.Sk < 1 || a.B > 65535 || a.H > 65535) return cudaErrorInvalidValue;
  if (!(a.scale > 0.f) || a.scale == INFINITY) return cudaErrorInvalidValue;
  // Row indices and TMA coordinates are 32-bit: B·H·Sq_pad and the element offsets must fit.
  const long long bh = static_cast<long long>(a.B) * a.H;
  if (bh * padded_seq(a.Sq) >= (1LL << 31) || static_cast<long long>(a.Sq) * a.D >= (1LL << 31) ||
      static_cast<long long>(a.Sk) * a.D >= (1LL << 31))
    return cudaErrorInvalidValue;
  const uintptr_t bits = reinterpret_cast<uintptr_t>(a.q) | reinterpret_cast<uintptr_t>(a.k) |
                         reinterpret_cast<uintptr_t>(a.v) | reinterpret_cast<uintptr_t>(a.o) |
                         reinterpret_cast<uintptr_t>(a.dout) | reinterpret_cast<uintptr_t>(a.dq) |
                         reinterpret_cast<uintptr_t>(a.dk) | reinterpret_cast<uintptr_t>(a.dv) |
                         reinterpret_cast<uintptr_t>(a.lse2) | reinterpret_cast<uintptr_t>(a.delta) |
                         reinterpret_cast<uintptr_t>(a.dq_accum);
  if ((bits & 15u) != 0) return cudaErrorInvalidValue;  // 16-byte copies, TMA, v4 reductions
  if (a.lse == nullptr || a.lse2 == nullptr || a.delta == nullptr || a.dq_accum == nullptr) return cudaErrorInvalidValue;
  return faprof_fa3::require_sm90a();
}

// kernels/fa3_bwd_pre.cu: delta and lse2 into the padded workspaces, dq_accum zeroed (before the
// main kernel); dq = dq_accum · scale in the input type (after it).
cudaError_t preprocess(const BwdArgs& a);
cudaError_t convert_dq(const BwdArgs& a);

}  // namespace faprof_fa3_bwd
