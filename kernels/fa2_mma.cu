// fa2_mma.cu — FlashAttention-2 forward on tensor cores through raw `mma.sync` PTX.
//
// Work partition (FA2): grid = (query tiles, H, B); a block of WARPS warps owns BR query rows
// (each warp 16*MT of them), keeps its O accumulator in registers and loops over BC-row K/V tiles.
//
//   * QKᵀ and PV: mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32, fp32 accumulate.
//   * Operands reach registers through ldmatrix.x4 (K, and Q unless it is held in registers) and
//     ldmatrix.x4.trans (V: row-major [key][d] in shared memory is the col-major B of PV).
//   * Shared memory tiles are [rows][D] with the 16-byte chunk index XOR-ed with (row & 7): the
//     8 row addresses of one ldmatrix phase (same logical chunk, rows 8 apart in bank space) land
//     in 8 different 16-byte bank groups, so ldmatrix and the cp.async stores are conflict-free.
//   * K and V stream through a two-stage cp.async pipeline: K[j+1] is issued at the top of
//     iteration j and V[j+1] right after its first barrier, so each load has a whole iteration
//     (QKᵀ, softmax, PV) to land; loads beyond Sk are zero-filled (cp.async src-size 0).
//   * P never touches shared memory: the QKᵀ accumulator of two adjacent n8 tiles, packed to
//     f16x2/bf16x2, is exactly the m16n8k16 A fragment of PV.
//   * Online softmax in fp32 with exp2: p = 2^(s*scale*log2e - m*scale*log2e), one FFMA + MUFU.
//     Row max via two quad shuffles per tile; the row sum stays per-thread until the end.
//   * Causal (top-left, as PyTorch SDPA is_causal): key tiles entirely above the diagonal are never
//     loaded; the mask is applied only where a tile crosses the diagonal of a warp's rows or the
//     Sk tail; a warp whose rows all lie above a tile skips it (BR > BC). Query tiles run heaviest
//     first (reverse blockIdx.x) to shorten the tail.
//   * lse = m*scale + ln(l) (natural log), fp32 [B, H, Sq].
//   * GEN instantiations (faprof_fa2_mma_fwd_ex, issue 36): GQA (KV head h / group), the mask rule of
//     faprof/model/mask.py (causal and windows, top-left or bottom-right) through KeyRange: the KV loop
//     runs from the block's first row's first key to its last row's last key, a warp skips tiles its
//     rows do not see, only tiles crossing a bound are masked elementwise; soft-cap; packed varlen
//     (cu_seqlens, row strides H·D / Hkv·D, blocks past a sequence's end exit). 2022's problems keep
//     the GEN = false code (the same ptxas registers and spills as before GEN existed).
//
// Configs (see the launcher; chosen from H100 timings against alternatives, scripts/gpu/tc_bench.py):
//   D=64:  128x128, 4 warps x 32 rows, Q re-read from smem (beat 128x64 with Q in registers by ~5%);
//   D=128: 128x64, 4 warps x 32 rows, Q re-read from swizzled smem each tile (O 128 + S 64 fp32
//          registers/thread leave no room for Q, as in FA2);
//   both rescale O every tile: the LAZY_RESCALE option (skip it when no row max of the warp moved)
//   measured equal non-causal and 2-3% slower causal, where blocks are short and maxima move often;
//   D=256: 64x32, 4 warps x 16 rows (O alone takes 128 registers/thread).
// All three use 96 KB or less of shared memory (2 blocks/SM on sm_90, and they fit sm_86/89's 99 KB).
//
// Requires scale > 0 (the running max is taken on raw scores, and exp2 folds the scale into one
// FFMA), 16-byte aligned base pointers, sm_80 or newer.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "faprof_kernels.h"
#include "mma_ptx.cuh"

namespace faprof_fa2_mma {

using namespace faprof_ptx;

constexpr float kLog2e = 1.4426950408889634f;

/// One tile configuration. MT m16 tiles of query rows per warp; all sizes in elements unless *_BYTES.
// faprof:launch kernel=fa2_mma_fwd_kernel D=A0 threads=32*A3 dyn_smem=2*A0*(A1+4*A2)
template <int D_, int BR_, int BC_, int WARPS_, bool Q_IN_REGS_, int MIN_BLOCKS_, bool LAZY_RESCALE_ = false>
struct MmaConfig {
  static constexpr int D = D_;                    // head dim
  static constexpr int BR = BR_;                  // query rows per block
  static constexpr int BC = BC_;                  // key/value rows per pipeline tile
  static constexpr int WARPS = WARPS_;
  static constexpr bool Q_IN_REGS = Q_IN_REGS_;   // hold Q's A fragments in registers for the whole loop
  static constexpr int MIN_BLOCKS = MIN_BLOCKS_;  // __launch_bounds__ blocks per SM (register cap)
  static constexpr bool LAZY_RESCALE = LAZY_RESCALE_;  // skip O *= alpha when no row max of a warp moved
  static constexpr int THREADS = 32 * WARPS;
  static constexpr int MT = BR / (16 * WARPS);    // m16 tiles per warp
  static constexpr int NT = BC / 8;               // n8 tiles of S per warp
  static constexpr int DT = D / 8;                // n8 tiles of O per warp
  static constexpr int KQ = D / 16;               // k16 steps of QKᵀ
  static constexpr int KP = BC / 16;              // k16 steps of PV
  static constexpr int CHUNKS = D / 8;            // 16-byte chunks per smem row
  static constexpr int ROW_BYTES = D * 2;
  static constexpr int STAGES = 2;                // cp.async stages for K and for V
  static constexpr int Q_BYTES = BR * ROW_BYTES;
  static constexpr int KV_BYTES = BC * ROW_BYTES;
  static constexpr int SMEM_BYTES = Q_BYTES + 2 * STAGES * KV_BYTES;

  static_assert(D % 64 == 0, "the XOR swizzle permutes 8 chunks of 16 B: D must be a multiple of 64");
  static_assert(MT >= 1 && BR == 16 * WARPS * MT, "BR must be 16 * WARPS * MT");
  static_assert(BC % 16 == 0 && NT % 2 == 0, "BC must be a multiple of 16 (ldmatrix.x4 covers 16 keys)");
  static_assert((BR * CHUNKS) % THREADS == 0 && (BC * CHUNKS) % THREADS == 0,
                "tile loads must split evenly over the block's threads");
  static_assert((MT * 16 * CHUNKS) % 32 == 0, "the O store splits a warp's rows evenly over its lanes");
  static_assert(SMEM_BYTES <= 227 * 1024, "exceeds the largest opt-in shared memory per block (sm_90)");
  static_assert(SMEM_BYTES == 2 * D * (BR + 4 * BC), "keep the faprof:launch annotation above in step");
  static_assert(!Q_IN_REGS || MT * KQ * 4 <= 64, "Q fragments would take more than 64 registers/thread");
};

// ------------------------------------------------------------------------------------------------
// PTX wrappers
// ------------------------------------------------------------------------------------------------
// 16-byte global->shared copy that bypasses L1; src_bytes = 0 zero-fills the destination.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool pred) {
  const int src_bytes = pred ? 16 : 0;
  asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Byte offset of 16-byte chunk `chunk` in a swizzled row whose (row & 7) << 4 is `x`.
__device__ __forceinline__ uint32_t swz(int chunk, uint32_t x) { return (static_cast<uint32_t>(chunk) << 4) ^ x; }

// cp.async ROWS rows [r0, r0 + ROWS) of a [S, D] matrix into a swizzled smem tile; rows >= S read as 0.
// Thread t always copies chunk t % CHUNKS of rows t / CHUNKS + i * RSTEP, so one global pointer, one
// smem address and immediates cover every pass (few registers: this runs inside the main loop).
// `stride`: elements between consecutive rows (D for [.., S, D] tensors; H·D or Hkv·D for packed
// varlen [total, H, D] ones); the dense path passes the constant C::D, so its code is unchanged.
template <class C, int ROWS, typename T>
__device__ __forceinline__ void load_rows(uint32_t s_base, const T* __restrict__ g, int r0, int S, int tid,
                                          int stride = C::D) {
  constexpr int RSTEP = C::THREADS / C::CHUNKS;  // rows per pass
  static_assert(C::THREADS % C::CHUNKS == 0 && ROWS % RSTEP == 0, "rows must split evenly into passes");
  const int rb = tid / C::CHUNKS;
  const int ch = tid % C::CHUNKS;
  const T* src = g + static_cast<size_t>(r0 + rb) * stride + ch * 8;  // zero-fill passes never read it
  const uint32_t dst = s_base + rb * C::ROW_BYTES;
  const int rows_left = S - r0 - rb;
#pragma unroll
  for (int i = 0; i < ROWS / RSTEP; ++i) {
    // (row & 7) is rb & 7 on every pass when RSTEP is a multiple of 8 (D <= 128 with 128 threads).
    const int r7 = (RSTEP % 8 == 0) ? (rb & 7) : ((rb + i * RSTEP) & 7);
    cp_async_16(dst + i * RSTEP * C::ROW_BYTES + swz(ch, r7 << 4), src + static_cast<size_t>(i * RSTEP) * stride,
                i * RSTEP < rows_left);
  }
}

// tanh(x) = 1 - 2 / (e^2x + 1) from two SFU ops (ex2, rcp): absolute error ~1e-7. (tanh.approx.f32
// is one op but has ~2^-11 relative error, i.e. up to c·5e-4 on a capped logit: visible in fp16.)
// x -> +inf: e^2x = inf, rcp = 0, 1; x -> -inf: e^2x = 0, -1.
__device__ __forceinline__ float tanh_fast(float x) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(fast_exp2(x * (2.f * kLog2e)) + 1.f));
  return fmaf(-2.f, r, 1.f);
}

// The problems beyond 2022's (the GEN instantiations): GQA, the mask rule of faprof/model/mask.py
// (causal and a window, aligned top-left or bottom-right), a logit soft-cap, packed varlen batches.
struct GenParams {
  int group;            // query heads per KV head: query head h reads KV head h / group
  int Hkv;              // KV heads
  int left, right;      // window: keys before / after the diagonal a query sees (-1: unbounded)
  int bottom_right;     // 1: the diagonal is offset by sk - sq (FlashAttention's alignment)
  float softcap;        // > 0: scores become c·tanh(scale·s / c); 0: none
  float cap_in;         // scale / softcap (the launcher passes scale 1 and log2(e) to the softmax then)
  const int* cu_q;      // varlen: int32 [B + 1] starts of each sequence's rows in q/o; null: dense
  const int* cu_k;      // varlen: int32 [B + 1] starts in k/v
  int total_q;          // varlen: rows of q (lse is [H, total_q], FlashAttention's layout)
};

// The keys query row i of a sequence (sq queries, sk keys) sees: [lo(i), hi(i)] (hi < lo: none).
// Both bounds are nondecreasing in i, so a run of rows [r0, r1] sees keys in [lo(r0), hi(r1)] and
// every one of its rows sees all of [lo(r1), hi(r0)].
template <bool CAUSAL>
struct KeyRange {
  int off, sk, left, right;
  __device__ __forceinline__ int hi(int i) const {
    int h = sk - 1;
    if (CAUSAL) h = min(h, i + off);
    if (right >= 0) h = min(h, i + off + right);
    return h;
  }
  __device__ __forceinline__ int lo(int i) const { return left >= 0 ? max(0, i + off - left) : 0; }
};

// ------------------------------------------------------------------------------------------------
// The kernel
// ------------------------------------------------------------------------------------------------
// GEN = false: 2022's problem exactly as before (equal heads, top-left causal or none, dense).
// GEN = true: GenParams' problems; the same loop with the KV tile range, the per-warp skip and the
// elementwise mask computed from KeyRange, and row strides / offsets of the sequence's layout.
template <typename T, class C, bool CAUSAL, bool GEN = false>
__global__ void __launch_bounds__(C::THREADS, C::MIN_BLOCKS)
fa2_mma_fwd_kernel(const T* __restrict__ q,  // [B, H, Sq, D] (varlen: [total_q, H, D])
                   const T* __restrict__ k,  // [B, Hkv, Sk, D] (varlen: [total_k, Hkv, D])
                   const T* __restrict__ v,  // as k
                   T* __restrict__ o,        // as q
                   float* __restrict__ lse,  // [B, H, Sq] (varlen: [H, total_q])
                   int Sq, int Sk, float scale, float scale_log2, GenParams gp) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();  // cp.async, ldmatrix and bf16 mma need sm_80+; the launcher refuses older GPUs first
#else
  constexpr bool BF16 = std::is_same<T, __nv_bfloat16>::value;
  constexpr int D = C::D, BR = C::BR, BC = C::BC, MT = C::MT, NT = C::NT, DT = C::DT;
  constexpr int ROW_BYTES = C::ROW_BYTES;
  extern __shared__ __align__(128) unsigned char smem[];

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int qt = CAUSAL ? static_cast<int>(gridDim.x - 1 - blockIdx.x) : static_cast<int>(blockIdx.x);
  const int bh = blockIdx.z * gridDim.y + blockIdx.y;
  const int q0 = qt * BR;
  const int wrow0 = warp * MT * 16;  // first row of this warp inside the tile

  // This block's sequence: its query/key counts, base pointers and row strides (elements).
  int sq = Sq, sk = Sk, q_stride = D, kv_stride = D;
  const T* qg = q + static_cast<size_t>(bh) * Sq * D;
  const T* kg = k + static_cast<size_t>(bh) * Sk * D;
  const T* vg = v + static_cast<size_t>(bh) * Sk * D;
  T* og = nullptr;         // GEN only: the dense path computes its output pointers in the epilogue
  float* lse_g = nullptr;
  KeyRange<CAUSAL> kr{0, Sk, -1, -1};
  if constexpr (GEN) {
    const int b = blockIdx.z, h = blockIdx.y, H = gridDim.y;
    const int hk = h / gp.group;
    size_t q_base, k_base;
    if (gp.cu_q != nullptr) {  // packed: row r of sequence b is row cu[b] + r of [total, heads, D]
      const int qs = gp.cu_q[b], ks = gp.cu_k[b];
      sq = gp.cu_q[b + 1] - qs;
      sk = gp.cu_k[b + 1] - ks;
      q_stride = H * D;
      kv_stride = gp.Hkv * D;
      q_base = (static_cast<size_t>(qs) * H + h) * D;
      k_base = (static_cast<size_t>(ks) * gp.Hkv + hk) * D;
      lse_g = lse + static_cast<size_t>(h) * gp.total_q + qs;
    } else {
      q_base = static_cast<size_t>(bh) * Sq * D;
      k_base = (static_cast<size_t>(b) * gp.Hkv + hk) * Sk * D;
      lse_g = lse + static_cast<size_t>(bh) * Sq;
    }
    if (q0 >= sq) return;  // past this sequence's end (the grid covers the longest one)
    qg = q + q_base;
    og = o + q_base;
    kg = k + k_base;
    vg = v + k_base;
    kr = KeyRange<CAUSAL>{gp.bottom_right ? sk - sq : 0, sk, gp.left, gp.right};
  }

  const uint32_t sQ = smem_u32(smem);
  const uint32_t sK = sQ + C::Q_BYTES;
  const uint32_t sV = sK + C::STAGES * C::KV_BYTES;

  // KV tiles [j0, j0 + n_kv): for GEN, from the first key of the block's first row to the last key
  // of its last row; tiles outside that range are never loaded nor computed.
  int j0 = 0;
  int n_kv = (sk + BC - 1) / BC;
  if constexpr (GEN) {
    const int kv_lo = kr.lo(q0), kv_hi = kr.hi(min(q0 + BR, sq) - 1);
    j0 = kv_lo / BC;
    n_kv = kv_hi < kv_lo ? 0 : kv_hi / BC + 1 - j0;  // 0: no row of the block sees a key
  } else if (CAUSAL) {
    const int last_row = min(q0 + BR, Sq) - 1;  // the block's last real query row sees keys <= last_row
    n_kv = min(n_kv, last_row / BC + 1);
  }
  // Soft-cap: the scores are scaled (and capped) in place, and the launcher passes scale = 1 and
  // scale_log2 = log2(e) for the softmax and the LSE (so they stay kernel parameters, not registers).

  // Prologue: Q, K[j0], V[j0] in three commit groups.
  load_rows<C, BR>(sQ, qg, q0, sq, tid, q_stride);
  cp_async_commit();
  load_rows<C, BC>(sK, kg, j0 * BC, sk, tid, kv_stride);
  cp_async_commit();
  load_rows<C, BC>(sV, vg, j0 * BC, sk, tid, kv_stride);
  cp_async_commit();

  // Per-lane ldmatrix addressing. Lane l gives the row address of matrix l/8, row l%8.
  //   Q (A, 16 rows x 16 d) and V (B via .trans, 16 keys x 16 d): rows += 8*((l>>3)&1), chunk += l>>4,
  //     giving a0..a3 of one m16 tile, or b0, b1 of d tile 0 then b0, b1 of d tile 1;
  //   K (B, non-trans, 16 keys x 16 d): keys += 8*(l>>4), chunk += (l>>3)&1, giving b0, b1 of key
  //     tile 0 then of key tile 1 (each pair in consecutive registers, as HMMA wants them).
  // Each such row is 8-aligned plus (l & 7), so its swizzle term is (l & 7); with an even base chunk
  // 2c, (2c + bit) ^ (l & 7) == 2c ^ (bit ^ (l & 7)). Chunk pair c then sits at
  // ((c >> 2) << 7) + (((c & 3) << 5) ^ x): the first term is an ldmatrix immediate, so 4 lane
  // offsets per pattern cover any D.
  const int lr = lane & 7;
  const uint32_t xa = static_cast<uint32_t>(((lane >> 4) ^ lr) << 4);         // Q and V
  const uint32_t xk = static_cast<uint32_t>(((((lane >> 3) & 1) ^ lr)) << 4);  // K
  uint32_t a_off[4], k_off[4];  // relative to a tile's (or a warp's Q slice's) first row
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    a_off[c] = (lr + ((lane >> 3) & 1) * 8) * ROW_BYTES + ((c << 5) ^ xa);
    k_off[c] = (lr + (lane >> 4) * 8) * ROW_BYTES + ((c << 5) ^ xk);
  }
  const uint32_t sQw = sQ + wrow0 * ROW_BYTES;  // this warp's Q rows

  float acc_o[MT][DT][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int dt = 0; dt < DT; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_o[mt][dt][e] = 0.f;
  float row_m[MT][2], row_l[MT][2];  // rows g and g+8 of each m16 tile; m on raw scores
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    row_m[mt][0] = row_m[mt][1] = -INFINITY;
    row_l[mt][0] = row_l[mt][1] = 0.f;
  }

  uint32_t q_frag[C::Q_IN_REGS ? MT : 1][C::Q_IN_REGS ? C::KQ : 1][4];
  if constexpr (C::Q_IN_REGS) {
    cp_async_wait<2>();  // Q landed (K[0], V[0] may still be in flight)
    __syncthreads();
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int ks = 0; ks < C::KQ; ++ks) ldmatrix_x4(sQw + a_off[ks & 3] + (ks >> 2) * 128 + mt * 16 * ROW_BYTES, q_frag[mt][ks]);
  }

  for (int j = 0; j < n_kv; ++j) {
    const int stage = j & 1;
    const uint32_t sKs = sK + stage * C::KV_BYTES;
    const uint32_t sVs = sV + stage * C::KV_BYTES;
    const int kv0 = (GEN ? j0 + j : j) * BC;

    // K[j+1] goes into the stage K[j-1] used; every warp passed this iteration's PV barrier
    // of j-1 after its QKᵀ of j-1, so that stage is free.
    if (j + 1 < n_kv) load_rows<C, BC>(sK + (stage ^ 1) * C::KV_BYTES, kg, kv0 + BC, sk, tid, kv_stride);
    cp_async_commit();
    cp_async_wait<2>();  // all but {V[j], K[j+1]}: K[j] has landed
    __syncthreads();
    // V[j+1] goes into the stage V[j-1] used; the barrier above follows every warp's PV of j-1.
    if (j + 1 < n_kv) load_rows<C, BC>(sV + (stage ^ 1) * C::KV_BYTES, vg, kv0 + BC, sk, tid, kv_stride);
    cp_async_commit();

    // Causal: a warp whose rows all lie above this tile's first key (the block's last tile when
    // BR > BC) has nothing to add; it only takes part in the copies and barriers. Non-causal:
    // kv0 < Sk always holds here, but as a branch the compiler cannot remove it keeps QKᵀ/softmax
    // and PV in separate scheduling regions, which stops ptxas from interleaving them at the cost
    // of ~100 register moves and a spill per tile (seen in the SASS of the 128x64 D=128 config).
    // GEN: the warp's rows [r0, r1] see keys in [lo(r0), hi(r1)]; a tile outside that has nothing.
    const int wr0 = q0 + wrow0, wr1 = wr0 + MT * 16 - 1;
    const bool active = GEN ? (wr0 < sq && kv0 <= kr.hi(wr1) && kv0 + BC - 1 >= kr.lo(wr0))
                            : (CAUSAL ? kv0 <= q0 + wrow0 + MT * 16 - 1 : kv0 < Sk);
    uint32_t p_frag[MT][C::KP][4];
    if (active) {
      // ---- S = Q Kᵀ (fp32) ----
      float acc_s[MT][NT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc_s[mt][nt][e] = 0.f;

#pragma unroll
      for (int ks = 0; ks < C::KQ; ++ks) {
        uint32_t a[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          if constexpr (C::Q_IN_REGS) {
#pragma unroll
            for (int e = 0; e < 4; ++e) a[mt][e] = q_frag[mt][ks][e];
          } else {
            ldmatrix_x4(sQw + a_off[ks & 3] + (ks >> 2) * 128 + mt * 16 * ROW_BYTES, a[mt]);
          }
        }
#pragma unroll
        for (int np = 0; np < NT / 2; ++np) {
          uint32_t b[4];
          ldmatrix_x4(sKs + k_off[ks & 3] + (ks >> 2) * 128 + np * 16 * ROW_BYTES, b);
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            mma_16816<BF16>(acc_s[mt][2 * np], a[mt], b[0], b[1]);
            mma_16816<BF16>(acc_s[mt][2 * np + 1], a[mt], b[2], b[3]);
          }
        }
      }

      // ---- soft-cap (GEN): s = c·tanh(scale·s / c), before the mask ----
      if (GEN && gp.softcap > 0.f) {
        const float in_mul = gp.cap_in;
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc_s[mt][nt][e] = gp.softcap * tanh_fast(acc_s[mt][nt][e] * in_mul);
      }

      // ---- mask: only the Sk tail tile and tiles crossing this warp's diagonal ----
      // Element (nt, e) of a row sits at key kv0 + 2*(lane&3) + nt*8 + e; it is visible iff
      // nt*8 + e <= lim, lim = min(Sk - 1, row) - kv0 - 2*(lane&3): one compare per element.
      // GEN: the tile needs the mask unless every row of the warp sees all of it, i.e. unless
      // [kv0, kv0 + BC) lies inside [lo(r1), hi(r0)]; visible iff lim_lo <= nt*8 + e <= lim.
      if constexpr (GEN) {
        if (kv0 + BC - 1 > kr.hi(wr0) || kv0 < kr.lo(wr1)) {
#pragma unroll
          for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              const int row = wr0 + mt * 16 + (lane >> 2) + h * 8;
              const int lim = kr.hi(row) - kv0 - 2 * (lane & 3);
              const int lim_lo = kr.lo(row) - kv0 - 2 * (lane & 3);
#pragma unroll
              for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int e = 0; e < 2; ++e)
                  if (nt * 8 + e > lim || nt * 8 + e < lim_lo) acc_s[mt][nt][2 * h + e] = -INFINITY;
            }
        }
      } else if (kv0 + BC > Sk || (CAUSAL && kv0 + BC - 1 > q0 + wrow0)) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int row = q0 + wrow0 + mt * 16 + (lane >> 2) + h * 8;
            const int lim = (CAUSAL ? min(Sk - 1, row) : Sk - 1) - kv0 - 2 * (lane & 3);
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
              for (int e = 0; e < 2; ++e)
                if (nt * 8 + e > lim) acc_s[mt][nt][2 * h + e] = -INFINITY;
          }
      }

      // ---- online softmax (fp32, exp2 with the scale folded in) ----
      float mx[MT][2];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float m = row_m[mt][h];
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) m = fmaxf(m, fmaxf(acc_s[mt][nt][2 * h], acc_s[mt][nt][2 * h + 1]));
          m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
          mx[mt][h] = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
        }
      // LAZY_RESCALE: when no row max of the warp moved (ever more likely as tiles go by), O and l
      // need no rescaling (alpha == 1 exactly): one vote instead of 2*MT*(DT*2+1) multiplies.
      bool rescale = true;
      if constexpr (C::LAZY_RESCALE) {
        bool moved = false;
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) moved |= (mx[mt][0] != row_m[mt][0]) | (mx[mt][1] != row_m[mt][1]);
        rescale = __any_sync(0xffffffffu, moved);
      }
      // A row with every key so far masked keeps m = -inf; offset by 0 so that p = 0, not NaN.
      float base[MT][2];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) base[mt][h] = (mx[mt][h] == -INFINITY) ? 0.f : mx[mt][h] * scale_log2;
      if (rescale) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const float alpha = fast_exp2(row_m[mt][h] * scale_log2 - base[mt][h]);
            row_l[mt][h] *= alpha;
#pragma unroll
            for (int dt = 0; dt < DT; ++dt) {
              acc_o[mt][dt][2 * h] *= alpha;
              acc_o[mt][dt][2 * h + 1] *= alpha;
            }
          }
      }
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          row_m[mt][h] = mx[mt][h];
          float sum = 0.f;
#pragma unroll
          for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const float p = fast_exp2(fmaf(acc_s[mt][nt][2 * h + e], scale_log2, -base[mt][h]));
              acc_s[mt][nt][2 * h + e] = p;
              sum += p;
            }
          row_l[mt][h] += sum;
        }

      // P as the A fragments of PV: the C layout of n8 tiles 2kk, 2kk+1 is the A layout of k16 step kk.
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int kk = 0; kk < C::KP; ++kk) {
          p_frag[mt][kk][0] = pack2<BF16>(acc_s[mt][2 * kk][0], acc_s[mt][2 * kk][1]);
          p_frag[mt][kk][1] = pack2<BF16>(acc_s[mt][2 * kk][2], acc_s[mt][2 * kk][3]);
          p_frag[mt][kk][2] = pack2<BF16>(acc_s[mt][2 * kk + 1][0], acc_s[mt][2 * kk + 1][1]);
          p_frag[mt][kk][3] = pack2<BF16>(acc_s[mt][2 * kk + 1][2], acc_s[mt][2 * kk + 1][3]);
        }
    }

    cp_async_wait<2>();  // all but {K[j+1], V[j+1]}: V[j] has landed
    __syncthreads();

    if (active) {
      // ---- O += P V ----
#pragma unroll
      for (int kk = 0; kk < C::KP; ++kk) {
#pragma unroll
        for (int dp = 0; dp < DT / 2; ++dp) {
          uint32_t b[4];
          ldmatrix_x4_trans(sVs + a_off[dp & 3] + (dp >> 2) * 128 + kk * 16 * ROW_BYTES, b);
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            mma_16816<BF16>(acc_o[mt][2 * dp], p_frag[mt][kk], b[0], b[1]);
            mma_16816<BF16>(acc_o[mt][2 * dp + 1], p_frag[mt][kk], b[2], b[3]);
          }
        }
      }
    }
  }
  cp_async_wait<0>();

  // ---- epilogue: normalise, lse, stage O through this warp's own Q rows, 16-byte stores ----
  if constexpr (!GEN) {
    og = o + static_cast<size_t>(bh) * Sq * D;
    lse_g = lse + static_cast<size_t>(bh) * Sq;
  }
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float l = row_l[mt][h];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const float inv = l > 0.f ? 1.f / l : 0.f;
#pragma unroll
      for (int dt = 0; dt < DT; ++dt) {
        acc_o[mt][dt][2 * h] *= inv;
        acc_o[mt][dt][2 * h + 1] *= inv;
      }
      const int row = q0 + wrow0 + mt * 16 + (lane >> 2) + h * 8;
      if ((lane & 3) == 0 && row < sq) lse_g[row] = l > 0.f ? row_m[mt][h] * scale + __logf(l) : -INFINITY;
    }

  __syncwarp();  // the warp's last reads of its Q rows are done before they are overwritten
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = wrow0 + mt * 16 + (lane >> 2) + h * 8;  // (r & 7) == lane >> 2
      unsigned char* row_ptr = smem + r * ROW_BYTES + 4 * (lane & 3);
#pragma unroll
      for (int dt = 0; dt < DT; ++dt)
        *reinterpret_cast<uint32_t*>(row_ptr + swz(dt, (lane >> 2) << 4)) =
            pack2<BF16>(acc_o[mt][dt][2 * h], acc_o[mt][dt][2 * h + 1]);
    }
  __syncwarp();
#pragma unroll
  for (int i = 0; i < MT * 16 * C::CHUNKS / 32; ++i) {
    const int idx = lane + 32 * i;
    const int r = wrow0 + idx / C::CHUNKS;
    const int ch = idx % C::CHUNKS;
    const uint4 val = *reinterpret_cast<const uint4*>(smem + r * ROW_BYTES + swz(ch, (r & 7) << 4));
    if (q0 + r < sq) *reinterpret_cast<uint4*>(og + static_cast<size_t>(q0 + r) * q_stride + ch * 8) = val;
  }
#endif
}

// ------------------------------------------------------------------------------------------------
// Host side
// ------------------------------------------------------------------------------------------------
// Default configs per head dim (see the file header for why).
using CfgD64 = MmaConfig<64, 128, 128, 4, false, 2>;
using CfgD128 = MmaConfig<128, 128, 64, 4, false, 2>;
using CfgD256 = MmaConfig<256, 64, 32, 4, false, 2>;

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

// GEN launches pass the problem's GenParams; 2022's problems pass an unused default (equal heads).
template <typename T, class C, bool CAUSAL, bool GEN = false>
cudaError_t launch(const Args& a, const GenParams& gp = GenParams{1, 0, -1, -1, 0, 0.f, 0.f, nullptr, nullptr, 0}) {
  auto kernel = fa2_mma_fwd_kernel<T, C, CAUSAL, GEN>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::SMEM_BYTES);
  if (err != cudaSuccess) return err;
  // Varlen: Sq is the longest sequence's length; blocks past a shorter sequence's end exit at once.
  const dim3 grid((a.Sq + C::BR - 1) / C::BR, a.H, a.B);
  const bool cap = GEN && gp.softcap > 0.f;  // the softmax then sees capped, already scaled scores
  kernel<<<grid, C::THREADS, C::SMEM_BYTES, a.stream>>>(
      static_cast<const T*>(a.q), static_cast<const T*>(a.k), static_cast<const T*>(a.v), static_cast<T*>(a.o),
      a.lse, a.Sq, a.Sk, cap ? 1.f : a.scale, cap ? kLog2e : a.scale * kLog2e, gp);
  return cudaGetLastError();
}

template <class C>
cudaError_t dispatch(const Args& a, bool causal, bool bf16) {
  if (bf16) return causal ? launch<__nv_bfloat16, C, true>(a) : launch<__nv_bfloat16, C, false>(a);
  return causal ? launch<__half, C, true>(a) : launch<__half, C, false>(a);
}

template <class C>
cudaError_t dispatch_gen(const Args& a, const GenParams& gp, bool causal, bool bf16) {
  if (bf16) return causal ? launch<__nv_bfloat16, C, true, true>(a, gp) : launch<__nv_bfloat16, C, false, true>(a, gp);
  return causal ? launch<__half, C, true, true>(a, gp) : launch<__half, C, false, true>(a, gp);
}

// cp.async, ldmatrix and bf16 mma.sync exist from sm_80 on (older GPUs get a trapping stub).
inline cudaError_t require_sm80() {
  int dev = 0, major = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  if (err != cudaSuccess) return err;
  return major >= 8 ? cudaSuccess : cudaErrorNotSupported;
}

// Shape/pointer checks shared by every entry point; returns cudaSuccess when the call may proceed
// and sets *nothing_to_do for empty problems.
inline cudaError_t validate(const Args& a, int D, bool* nothing_to_do) {
  *nothing_to_do = false;
  if (D != 64 && D != 128 && D != 256) return cudaErrorInvalidValue;
  if (a.B < 0 || a.H < 0 || a.Sq < 0 || a.Sk < 0) return cudaErrorInvalidValue;
  if (a.B == 0 || a.H == 0 || a.Sq == 0) {
    *nothing_to_do = true;
    return cudaSuccess;
  }
  if (a.Sk == 0) return cudaErrorInvalidValue;            // softmax over no keys is undefined
  if (!(a.scale > 0.f) || a.scale == INFINITY) return cudaErrorInvalidValue;  // see the file header
  if (a.B > 65535 || a.H > 65535) return cudaErrorInvalidValue;              // grid.z / grid.y limits
  const uintptr_t bits = reinterpret_cast<uintptr_t>(a.q) | reinterpret_cast<uintptr_t>(a.k) |
                         reinterpret_cast<uintptr_t>(a.v) | reinterpret_cast<uintptr_t>(a.o);
  if ((bits & 15u) != 0 || a.lse == nullptr) return cudaErrorInvalidValue;  // 16-byte cp.async / stores
  return require_sm80();
}

}  // namespace faprof_fa2_mma

/// FlashAttention-2 forward with mma.sync. q [B,H,Sq,D], k/v [B,H,Sk,D], o [B,H,Sq,D] (fp16 or bf16,
/// contiguous), lse [B,H,Sq] fp32. D in {64, 128, 256}; anything else returns cudaErrorInvalidValue.
cudaError_t faprof_fa2_mma_fwd(const void* q, const void* k, const void* v, void* o, float* lse, int B, int H,
                               int Sq, int Sk, int D, float scale, bool causal, bool bf16, cudaStream_t stream) {
  using namespace faprof_fa2_mma;
  const Args a{q, k, v, o, lse, B, H, Sq, Sk, scale, stream};
  bool nothing_to_do = false;
  const cudaError_t err = validate(a, D, &nothing_to_do);
  if (err != cudaSuccess || nothing_to_do) return err;
  switch (D) {
    case 64:
      return dispatch<CfgD64>(a, causal, bf16);
    case 128:
      return dispatch<CfgD128>(a, causal, bf16);
    case 256:
      return dispatch<CfgD256>(a, causal, bf16);
    default:
      return cudaErrorInvalidValue;
  }
}

/// fa2_mma forward for the problems beyond 2022's (faprof_kernels.h, FaprofAttnEx): GQA/MQA, causal
/// and windows aligned to either corner, soft-cap, packed varlen batches. Dense: q [B,H,Sq,D], k/v
/// [B,Hkv,Sk,D], lse [B,H,Sq]; varlen (ex.cu_seqlens_q set): q [total_q,H,D], k/v [total_k,Hkv,D],
/// lse [H,total_q], Sq/Sk the longest sequence's lengths.
cudaError_t faprof_fa2_mma_fwd_ex(const void* q, const void* k, const void* v, void* o, float* lse, int B, int H,
                                  int Sq, int Sk, int D, float scale, bool causal, bool bf16, const FaprofAttnEx& ex,
                                  cudaStream_t stream) {
  using namespace faprof_fa2_mma;
  const Args a{q, k, v, o, lse, B, H, Sq, Sk, scale, stream};
  bool nothing_to_do = false;
  cudaError_t err = validate(a, D, &nothing_to_do);
  if (err != cudaSuccess || nothing_to_do) return err;
  if (ex.Hkv <= 0 || H % ex.Hkv != 0) return cudaErrorInvalidValue;
  if ((ex.cu_seqlens_q == nullptr) != (ex.cu_seqlens_k == nullptr)) return cudaErrorInvalidValue;
  if (!(ex.softcap >= 0.f) || ex.softcap == INFINITY) return cudaErrorInvalidValue;
  // A window side past Sq + Sk keys is the same mask, and keeps i + off ± side far from int overflow.
  const auto side = [&](int w) { return w < 0 ? -1 : static_cast<int>(std::min<long long>(w, 0LL + Sq + Sk)); };
  const GenParams gp{H / ex.Hkv, ex.Hkv, side(ex.window_left), side(ex.window_right), ex.bottom_right ? 1 : 0,
                     ex.softcap, ex.softcap > 0.f ? scale / ex.softcap : 0.f, ex.cu_seqlens_q, ex.cu_seqlens_k,
                     ex.total_q};
  switch (D) {
    case 64:
      return dispatch_gen<CfgD64>(a, gp, causal, bf16);
    case 128:
      return dispatch_gen<CfgD128>(a, gp, causal, bf16);
    case 256:
      return dispatch_gen<CfgD256>(a, gp, causal, bf16);
    default:
      return cudaErrorInvalidValue;
  }
}

#ifdef FAPROF_TC_CTYPES
// Entry points for scripts/gpu/tc_bench.py (ctypes; built only with -DFAPROF_TC_CTYPES, never in the
// extension). `config` < 0 is the default launcher; 0.. pick alternative fp16 tile configs to tune
// (the list is mirrored in scripts/gpu/tc_bench.py TUNE_CONFIGS).
namespace faprof_fa2_mma {
using TuneD128Lazy = MmaConfig<128, 128, 64, 4, false, 2, true>;
using TuneD64Lazy = MmaConfig<64, 128, 128, 4, false, 2, true>;

template <class C>
cudaError_t tune_launch(const Args& a, int D, bool causal) {
  if (D != C::D) return cudaErrorInvalidValue;
  return causal ? launch<__half, C, true>(a) : launch<__half, C, false>(a);
}
}  // namespace faprof_fa2_mma

extern "C" int faprof_tc_mma_fwd(const void* q, const void* k, const void* v, void* o, float* lse, int B, int H,
                                 int Sq, int Sk, int D, float scale, int causal, int bf16, int config,
                                 void* stream) {
  using namespace faprof_fa2_mma;
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  if (config < 0) return faprof_fa2_mma_fwd(q, k, v, o, lse, B, H, Sq, Sk, D, scale, causal, bf16, st);
  const Args a{q, k, v, o, lse, B, H, Sq, Sk, scale, st};
  bool nothing_to_do = false;
  const cudaError_t err = validate(a, D, &nothing_to_do);
  if (err != cudaSuccess || nothing_to_do) return err;
  if (bf16) return cudaErrorInvalidValue;
  const bool c = causal != 0;
  switch (config) {
    case 0: return tune_launch<TuneD128Lazy>(a, D, c);
    case 1: return tune_launch<TuneD64Lazy>(a, D, c);
    default: return cudaErrorInvalidValue;
  }
}
#endif
