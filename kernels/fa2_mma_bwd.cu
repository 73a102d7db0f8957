// fa2_mma_bwd.cu — FlashAttention-2 backward on tensor cores through raw `mma.sync` PTX.
//
// Kernels per call (FlashAttention-2, Dao 2023, Algorithm 2; FA2's flash_bwd_kernel.h read for the
// structure, the code is faprof's own):
//   1. preprocess: delta_i = rowsum(dO_i ∘ O_i) in fp32, one warp per query row;
//   2. fa2_mma_bwd_kernel: grid = (key tiles of BN keys, H, B). A block keeps dK and dV of its BN
//      keys in registers and loops over the query tiles (BM rows) that can see them. Everything is
//      computed "transposed", with keys as the MMA's M dimension, so that a warp owns 16 whole keys
//      and dK/dV need no reduction across warps:
//        Sᵀ  = K·Qᵀ        A = K (ldmatrix),           B = Q  (ldmatrix, [row][d] is col-major B)
//        dPᵀ = V·dOᵀ       A = V (ldmatrix),           B = dO (ldmatrix)
//        Pᵀ  = exp2(Sᵀ·scale·log2e − lse·log2e), dSᵀ = Pᵀ ∘ (dPᵀ − delta)       (fp32, registers)
//        dV += Pᵀ·dO       A = Pᵀ (registers: the C fragments of two n8 tiles are one A fragment),
//                          B = dO (ldmatrix.trans)
//        dK += dSᵀ·Q       A = dSᵀ (registers), B = Q (ldmatrix.trans)
//        dQ += dS·K        dSᵀ goes to shared memory (fp16/bf16); A = dS (ldmatrix.trans of dSᵀ),
//                          B = K (ldmatrix.trans); fp32 reductions into dq_accum: on sm_90 one
//                          red.global.add.v4.f32 per 4 columns (lane pairs swap halves first),
//                          before sm_90 red.global.add.f32 per element
//      mma.sync.aligned.m16n8k16 (fp16/bf16 in, fp32 accumulate) for all five products. dK is scaled
//      by `scale` once at the end, dQ in the convert kernel.
//   3. convert: dq = (dq_accum · scale) in fp16/bf16.
//   Deterministic option: fa2_mma_bwd_dq_kernel replaces the atomics (and the convert): a grid over
//   query tiles looping over key tiles, recomputing S and dP, dQ in registers.
//
// Shared memory tiles are [rows][cols] of 16-byte chunks with the chunk index XOR-ed with (row & 7),
// as in the forward: the 8 row addresses of one ldmatrix phase hit 8 different bank groups, and so
// do the cp.async stores and the dSᵀ stores. The next Q/dO tile is fetched with cp.async right after
// the barrier that ends their last use (Sᵀ, dPᵀ, dV, dK), so the copy overlaps the dQ product and its
// atomics. Tails are zero-filled loads plus an explicit mask (P = 0) on tail tiles; causal (top-left,
// SDPA's is_causal): a key tile starts at the first query tile that reaches its first key and masks
// only the tiles that cross the diagonal.
//
// Configs: D=64: 64 keys x 64 rows, 4 warps; D=128: 128 keys x 64 rows, 8 warps (FA2's sm80 tile
// sizes at D=128), or 64 x 64 with 4 warps where a block may not have 112 KB of shared memory
// (sm_86/89). D=256 is not instantiated: dK and dV of 16 keys alone take 256 registers per thread.
//
// Requires scale > 0, 16-byte aligned base pointers, sm_80 or newer.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "faprof_kernels.h"
#include "mma_ptx.cuh"

namespace faprof_mma_bwd {

using namespace faprof_ptx;

constexpr float kLog2e = 1.4426950408889634f;

// faprof:launch kernel=fa2_mma_bwd_kernel D=A0 threads=32*A3 dyn_smem=2*A0*(2*A1+2*A5*A2)+2*A1*A2+16*(A5-1)*A2
// QBUF_ = 2 (the atomic path's default; QBUF_ = 1 is kept as the hidden variant _fa2_mma_bwd_1buf): Q/dO (and the tile's lse and delta,
// read from shared memory after Sᵀ/dPᵀ instead of held in registers through them) double-buffered,
// the next tile's cp.async issued before the current tile's Sᵀ/dPᵀ; non-causal blocks start at
// staggered query tiles.
template <int D_, int BN_, int BM_, int WARPS_, int MIN_BLOCKS_, int QBUF_ = 1>
struct BwdConfig {
  static constexpr int D = D_;
  static constexpr int BN = BN_;  // keys per block
  static constexpr int BM = BM_;  // query rows per inner step
  static constexpr int WARPS = WARPS_;
  static constexpr int MIN_BLOCKS = MIN_BLOCKS_;
  static constexpr int QBUF = QBUF_;  // Q/dO buffers: 1 (single-buffered) or 2 (double-buffered)
  static constexpr int THREADS = 32 * WARPS;
  static constexpr int MT = BN / (16 * WARPS);  // m16 key tiles per warp
  static constexpr int NQ = BM / 8;             // n8 query tiles of Sᵀ
  static constexpr int DT = D / 8;              // n8 tiles of dK / dV
  static constexpr int KD = D / 16;             // k16 steps over d
  static constexpr int KQ = BM / 16;            // k16 steps over query rows (dV, dK)
  static constexpr int ROW_BYTES = 2 * D;
  static constexpr int DS_ROW_BYTES = 2 * BM;
  static constexpr int WM = BM / 16;            // dQ: m16 tiles, one per warp group
  static constexpr int WN = WARPS / WM;         // dQ: warps sharing one m16 tile along d
  static constexpr int DQ_COLS = D / WN;
  static constexpr int DQ_DT = DQ_COLS / 8;
  static constexpr int K_BYTES = BN * ROW_BYTES;
  static constexpr int Q_BYTES = BM * ROW_BYTES;
  static constexpr int DS_BYTES = BN * DS_ROW_BYTES;
  static constexpr int L_OFF = 2 * K_BYTES + 2 * QBUF * Q_BYTES + DS_BYTES;  // lse, delta (QBUF = 2)
  static constexpr int L_BYTES = QBUF == 2 ? 2 * 2 * BM * 4 : 0;            // [buffer][lse, delta][BM]
  static constexpr int SMEM_BYTES = L_OFF + L_BYTES;

  static_assert(D % 64 == 0 && BM % 64 == 0, "the XOR swizzle permutes 8 chunks of 16 B: D, BM multiples of 64");
  static_assert(MT >= 1 && BN == 16 * WARPS * MT, "BN must be 16 * WARPS * MT");
  static_assert(WM >= 1 && WARPS % WM == 0 && DQ_DT % 2 == 0, "dQ tiles must split evenly over the warps");
  static_assert(QBUF == 1 || QBUF == 2, "one or two Q/dO buffers");
  static_assert(QBUF == 1 || THREADS >= 2 * BM, "one thread per lse and delta element");
  static_assert(SMEM_BYTES == 2 * D * (2 * BN + 2 * QBUF * BM) + 2 * BN * BM + 16 * (QBUF - 1) * BM,
                "keep the faprof:launch annotation in step");
  static_assert(SMEM_BYTES <= 227 * 1024, "exceeds the largest opt-in shared memory per block (sm_90)");
};

// faprof:launch kernel=fa2_mma_bwd_dq_kernel D=A0 threads=32*A3 dyn_smem=2*A0*(2*A1+2*A2)
template <int D_, int BN_, int BM_, int WARPS_>
struct DqConfig {
  static constexpr int D = D_;
  static constexpr int BN = BN_;  // keys per inner step
  static constexpr int BM = BM_;  // query rows per block
  static constexpr int WARPS = WARPS_;
  static constexpr int THREADS = 32 * WARPS;
  static constexpr int NK = BN / 8;   // n8 key tiles of S
  static constexpr int DT = D / 8;    // n8 tiles of dQ
  static constexpr int KD = D / 16;   // k16 steps over d
  static constexpr int KK = BN / 16;  // k16 steps over keys
  static constexpr int ROW_BYTES = 2 * D;
  static constexpr int SMEM_BYTES = 2 * BN * ROW_BYTES + 2 * BM * ROW_BYTES;
  static_assert(D % 64 == 0 && BM == 16 * WARPS && BN % 16 == 0, "one m16 tile per warp");
  static_assert(SMEM_BYTES == 2 * D * (2 * BN + 2 * BM), "keep the faprof:launch annotation in step");
};

// ------------------------------------------------------------------------------------------------
// cp.async wrappers (the others: mma_ptx.cuh)
// ------------------------------------------------------------------------------------------------
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool pred) {
  const int src_bytes = pred ? 16 : 0;
  asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_4(uint32_t dst, const void* src, bool pred) {
  const int src_bytes = pred ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

__device__ __forceinline__ void red_add(float* p, float x) {
  asm volatile("red.global.add.f32 [%0], %1;\n" ::"l"(p), "f"(x) : "memory");
}
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// Four consecutive floats in one reduction (sm_90+, PTX 8.1); p 16-byte aligned.
__device__ __forceinline__ void red_add_v4(float* p, float x, float y, float z, float w) {
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(p), "f"(x), "f"(y), "f"(z), "f"(w)
               : "memory");
}
#endif

template <typename T>
__device__ __forceinline__ float2 to_float2(uint32_t bits) {
  if constexpr (std::is_same<T, __nv_bfloat16>::value) {
    __nv_bfloat162 h;
    memcpy(&h, &bits, 4);
    return __bfloat1622float2(h);
  } else {
    __half2 h;
    memcpy(&h, &bits, 4);
    return __half22float2(h);
  }
}

// Byte address of 16-byte chunk `chunk` of row `row` in a swizzled tile (chunk ^ (row & 7)).
__device__ __forceinline__ uint32_t swz(uint32_t tile, int row_bytes, int row, int chunk) {
  return tile + row * row_bytes + ((chunk ^ (row & 7)) << 4);
}

// ldmatrix.x4 lane addressing over a [row][col] tile, for a 16x16 block at (r0, chunk c0):
//   P1: row r0 + (l & 7) + 8·((l >> 3) & 1), chunk c0 + (l >> 4)
//       non-trans: a0..a3 of an A operand A[m][k] = X[m][k];
//       .trans:    {b0, b1} of n8 tile c0, then of n8 tile c0 + 1, of a B operand B[k][n] = X[k][n].
//   P2: row r0 + (l & 7) + 8·(l >> 4), chunk c0 + ((l >> 3) & 1)
//       non-trans: {b0, b1} of n8 tile r0, then of r0 + 8, of a B operand B[k][n] = X[n][k];
//       .trans:    a0..a3 of an A operand A[m][k] = X[k][m].
struct Lanes {
  int r1, c1, r2, c2;
  __device__ __forceinline__ explicit Lanes(int lane)
      : r1((lane & 7) + 8 * ((lane >> 3) & 1)), c1(lane >> 4), r2((lane & 7) + 8 * (lane >> 4)), c2((lane >> 3) & 1) {}
  __device__ __forceinline__ uint32_t p1(uint32_t tile, int row_bytes, int r0, int c0) const {
    return swz(tile, row_bytes, r0 + r1, c0 + c1);
  }
  __device__ __forceinline__ uint32_t p2(uint32_t tile, int row_bytes, int r0, int c0) const {
    return swz(tile, row_bytes, r0 + r2, c0 + c2);
  }
};

// cp.async rows [r0, r0 + ROWS) of a [S, D] matrix into a swizzled tile; rows >= S become zeros.
template <int THREADS, int D, int ROWS, typename T>
__device__ __forceinline__ void load_rows(uint32_t tile, const T* __restrict__ g, int r0, int S, int tid) {
  constexpr int CHUNKS = D / 8;
  constexpr int RSTEP = THREADS / CHUNKS;
  static_assert(THREADS % CHUNKS == 0 && ROWS % RSTEP == 0, "rows must split evenly into passes");
  const int rb = tid / CHUNKS;
  const int ch = tid % CHUNKS;
#pragma unroll
  for (int i = 0; i < ROWS / RSTEP; ++i) {
    const int r = rb + i * RSTEP;
    const bool valid = r0 + r < S;
    const T* src = g + static_cast<size_t>(valid ? r0 + r : 0) * D + ch * 8;
    cp_async_16(swz(tile, 2 * D, r, ch), src, valid);
  }
}

}  // namespace faprof_mma_bwd

using namespace faprof_mma_bwd;

// ------------------------------------------------------------------------------------------------
// delta = rowsum(dO ∘ O), fp32; one warp per row
// ------------------------------------------------------------------------------------------------
// faprof:launch kernel=fa2_mma_bwd_preprocess_kernel threads=256 dyn_smem=0
template <typename T, int D>
__global__ void __launch_bounds__(256)
fa2_mma_bwd_preprocess_kernel(const T* __restrict__ o, const T* __restrict__ dout, float* __restrict__ delta,
                              long long rows) {
  const long long row = static_cast<long long>(blockIdx.x) * 8 + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const uint32_t* o2 = reinterpret_cast<const uint32_t*>(o + row * D);
  const uint32_t* g2 = reinterpret_cast<const uint32_t*>(dout + row * D);
  float acc = 0.f;
#pragma unroll
  for (int i = lane; i < D / 2; i += 32) {
    const float2 a = to_float2<T>(o2[i]);
    const float2 b = to_float2<T>(g2[i]);
    acc = fmaf(a.x, b.x, fmaf(a.y, b.y, acc));
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (lane == 0) delta[row] = acc;
}

// dq = dq_accum · scale, rounded to T; n even (D is).
// faprof:launch kernel=fa2_mma_bwd_convert_kernel threads=256 dyn_smem=0
template <typename T>
__global__ void __launch_bounds__(256)
fa2_mma_bwd_convert_kernel(const float* __restrict__ acc, T* __restrict__ dq, long long n, float scale) {
  constexpr bool BF16 = std::is_same<T, __nv_bfloat16>::value;
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; 2 * i < n; i += stride) {
    const float2 a = reinterpret_cast<const float2*>(acc)[i];
    reinterpret_cast<uint32_t*>(dq)[i] = pack2<BF16>(a.x * scale, a.y * scale);
  }
}

// ------------------------------------------------------------------------------------------------
// dK, dV (and dQ by atomics): grid over key tiles
// ------------------------------------------------------------------------------------------------
template <typename T, class C, bool CAUSAL, bool WITH_DQ>
__global__ void __launch_bounds__(C::THREADS, C::MIN_BLOCKS)
fa2_mma_bwd_kernel(const T* __restrict__ q,         // [B, H, Sq, D]
                   const T* __restrict__ k,         // [B, H, Sk, D]
                   const T* __restrict__ v,         // [B, H, Sk, D]
                   const T* __restrict__ dout,      // [B, H, Sq, D]
                   const float* __restrict__ lse,   // [B, H, Sq]
                   const float* __restrict__ delta, // [B, H, Sq]
                   float* __restrict__ dq_accum,    // [B, H, Sq, D] zeroed (WITH_DQ)
                   T* __restrict__ dk,              // [B, H, Sk, D]
                   T* __restrict__ dv,              // [B, H, Sk, D]
                   int Sq, int Sk, float scale, float scale_log2) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();
#else
  constexpr bool BF16 = std::is_same<T, __nv_bfloat16>::value;
  constexpr int D = C::D, BN = C::BN, BM = C::BM, MT = C::MT, NQ = C::NQ, DT = C::DT;
  constexpr int RB = C::ROW_BYTES, DSRB = C::DS_ROW_BYTES;
  constexpr bool DBUF = C::QBUF == 2;
  extern __shared__ __align__(128) unsigned char smem[];

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int g = lane >> 2;
  const int tig = lane & 3;
  const Lanes L(lane);
  const int bh = blockIdx.z * gridDim.y + blockIdx.y;
  const int n0 = blockIdx.x * BN;
  const int wk0 = warp * MT * 16;  // this warp's first key inside the tile

  const T* qg = q + static_cast<size_t>(bh) * Sq * D;
  const T* dog = dout + static_cast<size_t>(bh) * Sq * D;
  const float* lseg = lse + static_cast<size_t>(bh) * Sq;
  const float* dlg = delta + static_cast<size_t>(bh) * Sq;

  const uint32_t sK = smem_u32(smem);
  const uint32_t sV = sK + C::K_BYTES;
  const uint32_t sQ0 = sV + C::K_BYTES;                 // Q buffers 0 .. QBUF - 1
  const uint32_t sdO0 = sQ0 + C::QBUF * C::Q_BYTES;     // dO buffers 0 .. QBUF - 1
  const uint32_t sdS = sdO0 + C::QBUF * C::Q_BYTES;

  const int n_m = (Sq + BM - 1) / BM;
  const int m_begin = CAUSAL ? n0 / BM : 0;  // earlier query tiles lie wholly above key n0
  const int n_iter = n_m - m_begin;           // query tiles this block visits (<= 0: none)
  // Step i visits query tile m_begin + (i + m_off) mod n_iter. The double-buffered non-causal path
  // staggers the first tile over the blocks of one (b, h), so that they do not all reduce into the
  // same dQ rows at once; the order of dQ's fp32 additions is unspecified anyway.
  const int m_off =
      (DBUF && !CAUSAL && n_iter > 0)
          ? static_cast<int>(static_cast<long long>(blockIdx.x) * n_iter / static_cast<long long>(gridDim.x))
          : 0;
  const uint32_t sL0 = sK + C::L_OFF;
  // DBUF: query tile m's Q, dO, lse and delta into buffer b (one cp.async group with the caller's commit).
  auto stage = [&](int b, int m) {
    const int r0 = m * BM;
    load_rows<C::THREADS, D, BM>(sQ0 + b * C::Q_BYTES, qg, r0, Sq, tid);
    load_rows<C::THREADS, D, BM>(sdO0 + b * C::Q_BYTES, dog, r0, Sq, tid);
    if (tid < 2 * BM) {
      const int c = tid % BM;
      const bool valid = r0 + c < Sq;  // rows past Sq: lse = delta = 0, as in the default path
      cp_async_4(sL0 + b * (2 * BM * 4) + tid * 4, (tid < BM ? lseg : dlg) + (valid ? r0 + c : 0), valid);
    }
  };

  load_rows<C::THREADS, D, BN>(sK, k + static_cast<size_t>(bh) * Sk * D, n0, Sk, tid);
  load_rows<C::THREADS, D, BN>(sV, v + static_cast<size_t>(bh) * Sk * D, n0, Sk, tid);
  int m = m_begin + m_off;  // this step's query tile
  if (n_iter > 0) {
    if constexpr (DBUF) {
      stage(0, m);
    } else {
      load_rows<C::THREADS, D, BM>(sQ0, qg, m * BM, Sq, tid);
      load_rows<C::THREADS, D, BM>(sdO0, dog, m * BM, Sq, tid);
    }
  }
  cp_async_commit();

  float acc_dk[MT][DT][4], acc_dv[MT][DT][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int dt = 0; dt < DT; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_dk[mt][dt][e] = acc_dv[mt][dt][e] = 0.f;

  for (int i = 0; i < n_iter; ++i) {
    const int q0 = m * BM;
    const int m_next = m + 1 == n_m ? m_begin : m + 1;  // wraps only on the staggered path
    const int buf = DBUF ? (i & 1) : 0;
    const uint32_t sQ = sQ0 + buf * C::Q_BYTES;
    const uint32_t sdO = sdO0 + buf * C::Q_BYTES;
    // lse (log2 domain) and delta of this thread's query columns: q0 + nt*8 + 2*tig + e
    // (DBUF: read from shared memory after Sᵀ and dPᵀ).
    float lse2[NQ][2], dl[NQ][2];
    if constexpr (!DBUF) {
#pragma unroll
      for (int nt = 0; nt < NQ; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int r = q0 + nt * 8 + 2 * tig + e;
          lse2[nt][e] = r < Sq ? lseg[r] * kLog2e : 0.f;
          dl[nt][e] = r < Sq ? dlg[r] : 0.f;
        }
    }
    cp_async_wait_all();  // Q, dO of step i (and K, V) have landed
    __syncthreads();      // ... for every thread; every warp is done with step i - 1 (dSᵀ, its Q/dO buffer)
    if constexpr (DBUF) {
      // The next step's Q/dO into the other buffer (last read in step i - 1): the copy overlaps all
      // of step i.
      if (i + 1 < n_iter) stage(buf ^ 1, m_next);
      cp_async_commit();
    }

    // ---- Sᵀ = K Qᵀ and dPᵀ = V dOᵀ (fp32) ----
    float acc_s[MT][NQ][4], acc_dp[MT][NQ][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < NQ; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc_s[mt][nt][e] = acc_dp[mt][nt][e] = 0.f;
#pragma unroll
    for (int ks = 0; ks < C::KD; ++ks) {
      uint32_t a[MT][4], av[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        ldmatrix_x4(L.p1(sK, RB, wk0 + mt * 16, 2 * ks), a[mt]);
        ldmatrix_x4(L.p1(sV, RB, wk0 + mt * 16, 2 * ks), av[mt]);
      }
#pragma unroll
      for (int np = 0; np < NQ / 2; ++np) {
        uint32_t b[4], bo[4];
        ldmatrix_x4(L.p2(sQ, RB, np * 16, 2 * ks), b);
        ldmatrix_x4(L.p2(sdO, RB, np * 16, 2 * ks), bo);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_16816<BF16>(acc_s[mt][2 * np], a[mt], b[0], b[1]);
          mma_16816<BF16>(acc_s[mt][2 * np + 1], a[mt], b[2], b[3]);
          mma_16816<BF16>(acc_dp[mt][2 * np], av[mt], bo[0], bo[1]);
          mma_16816<BF16>(acc_dp[mt][2 * np + 1], av[mt], bo[2], bo[3]);
        }
      }
    }

    if constexpr (DBUF) {
      const float* sl = reinterpret_cast<const float*>(smem + C::L_OFF + buf * (2 * BM * 4));
#pragma unroll
      for (int nt = 0; nt < NQ; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int c = nt * 8 + 2 * tig + e;
          lse2[nt][e] = sl[c] * kLog2e;
          dl[nt][e] = sl[BM + c];
        }
    }

    // ---- Pᵀ and dSᵀ; mask only tail tiles and tiles crossing this warp's diagonal ----
    const bool need_mask =
        (n0 + wk0 + MT * 16 > Sk) || (q0 + BM > Sq) || (CAUSAL && n0 + wk0 + MT * 16 - 1 > q0);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < NQ; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float p = fast_exp2(fmaf(acc_s[mt][nt][e], scale_log2, -lse2[nt][e & 1]));
          if (need_mask) {
            const int key = n0 + wk0 + mt * 16 + g + 8 * (e >> 1);
            const int row = q0 + nt * 8 + 2 * tig + (e & 1);
            if (key >= Sk || row >= Sq || (CAUSAL && key > row)) p = 0.f;
          }
          acc_s[mt][nt][e] = p;
          acc_dp[mt][nt][e] = p * (acc_dp[mt][nt][e] - dl[nt][e & 1]);
        }

    // Pᵀ and dSᵀ as A fragments: the C layout of n8 tiles 2kk, 2kk+1 is the A layout of k16 step kk.
    uint32_t p_frag[MT][C::KQ][4], ds_frag[MT][C::KQ][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int kk = 0; kk < C::KQ; ++kk) {
        p_frag[mt][kk][0] = pack2<BF16>(acc_s[mt][2 * kk][0], acc_s[mt][2 * kk][1]);
        p_frag[mt][kk][1] = pack2<BF16>(acc_s[mt][2 * kk][2], acc_s[mt][2 * kk][3]);
        p_frag[mt][kk][2] = pack2<BF16>(acc_s[mt][2 * kk + 1][0], acc_s[mt][2 * kk + 1][1]);
        p_frag[mt][kk][3] = pack2<BF16>(acc_s[mt][2 * kk + 1][2], acc_s[mt][2 * kk + 1][3]);
        ds_frag[mt][kk][0] = pack2<BF16>(acc_dp[mt][2 * kk][0], acc_dp[mt][2 * kk][1]);
        ds_frag[mt][kk][1] = pack2<BF16>(acc_dp[mt][2 * kk][2], acc_dp[mt][2 * kk][3]);
        ds_frag[mt][kk][2] = pack2<BF16>(acc_dp[mt][2 * kk + 1][0], acc_dp[mt][2 * kk + 1][1]);
        ds_frag[mt][kk][3] = pack2<BF16>(acc_dp[mt][2 * kk + 1][2], acc_dp[mt][2 * kk + 1][3]);
      }

    if constexpr (WITH_DQ) {
      // dSᵀ to shared memory: row = key in tile, chunk = query tile nt, 4 bytes per lane.
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int kk = 0; kk < C::KQ; ++kk)
#pragma unroll
          for (int half = 0; half < 2; ++half)  // n8 tile 2kk + half
#pragma unroll
            for (int h = 0; h < 2; ++h) {      // key rows g, g + 8
              const int row = wk0 + mt * 16 + g + 8 * h;
              const uint32_t addr = swz(sdS, DSRB, row, 2 * kk + half) + 4 * tig;
              asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(ds_frag[mt][kk][2 * half + h]) : "memory");
            }
    }

    // ---- dV += Pᵀ dO, dK += dSᵀ Q ----
#pragma unroll
    for (int kk = 0; kk < C::KQ; ++kk)
#pragma unroll
      for (int dp = 0; dp < DT / 2; ++dp) {
        uint32_t bo[4], bq[4];
        ldmatrix_x4_trans(L.p1(sdO, RB, kk * 16, 2 * dp), bo);
        ldmatrix_x4_trans(L.p1(sQ, RB, kk * 16, 2 * dp), bq);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_16816<BF16>(acc_dv[mt][2 * dp], p_frag[mt][kk], bo[0], bo[1]);
          mma_16816<BF16>(acc_dv[mt][2 * dp + 1], p_frag[mt][kk], bo[2], bo[3]);
          mma_16816<BF16>(acc_dk[mt][2 * dp], ds_frag[mt][kk], bq[0], bq[1]);
          mma_16816<BF16>(acc_dk[mt][2 * dp + 1], ds_frag[mt][kk], bq[2], bq[3]);
        }
      }

    __syncthreads();  // every warp is done with this step's Q and dO; dSᵀ is complete
    if constexpr (!DBUF) {
      if (i + 1 < n_iter) {  // m_next == m + 1 here (no stagger, no wrap)
        load_rows<C::THREADS, D, BM>(sQ, qg, q0 + BM, Sq, tid);
        load_rows<C::THREADS, D, BM>(sdO, dog, q0 + BM, Sq, tid);
      }
      cp_async_commit();
    }

    if constexpr (WITH_DQ) {
      // ---- dQ[q0.., :] += dS K over this block's keys; warp (wm, wn): rows wm*16, columns wn*DQ_COLS ----
      const int wm = warp % C::WM;
      const int wn = warp / C::WM;
      float acc_dq[C::DQ_DT][4];
#pragma unroll
      for (int dt = 0; dt < C::DQ_DT; ++dt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc_dq[dt][e] = 0.f;
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) {
        uint32_t a[4];
        ldmatrix_x4_trans(L.p2(sdS, DSRB, kk * 16, 2 * wm), a);
#pragma unroll
        for (int dp = 0; dp < C::DQ_DT / 2; ++dp) {
          uint32_t b[4];
          ldmatrix_x4_trans(L.p1(sK, RB, kk * 16, wn * (C::DQ_COLS / 8) + 2 * dp), b);
          mma_16816<BF16>(acc_dq[2 * dp], a, b[0], b[1]);
          mma_16816<BF16>(acc_dq[2 * dp + 1], a, b[2], b[3]);
        }
      }
      float* dqg = dq_accum + static_cast<size_t>(bh) * Sq * D;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      // One 16-byte reduction per n8 tile instead of four 4-byte ones (a quarter of the L2 atomic
      // operations, which bound this path on H100): lanes tig and tig ^ 1 swap halves so that the
      // even lane holds row g, columns 2·tig .. 2·tig + 3, and the odd lane row g + 8, the same
      // columns as its even partner.
      {
        const bool even = (tig & 1) == 0;
        const int row = q0 + wm * 16 + g + (even ? 0 : 8);
        float* dst = dqg + static_cast<size_t>(row) * D + wn * C::DQ_COLS + 2 * (tig & ~1);
#pragma unroll
        for (int dt = 0; dt < C::DQ_DT; ++dt) {
          const float sx = even ? acc_dq[dt][2] : acc_dq[dt][0];
          const float sy = even ? acc_dq[dt][3] : acc_dq[dt][1];
          const float rx = __shfl_xor_sync(0xffffffffu, sx, 1);
          const float ry = __shfl_xor_sync(0xffffffffu, sy, 1);
          if (row < Sq) {
            if (even)
              red_add_v4(dst + dt * 8, acc_dq[dt][0], acc_dq[dt][1], rx, ry);
            else
              red_add_v4(dst + dt * 8, rx, ry, acc_dq[dt][2], acc_dq[dt][3]);
          }
        }
      }
#else
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = q0 + wm * 16 + g + 8 * h;
        if (row < Sq) {
          float* dst = dqg + static_cast<size_t>(row) * D + wn * C::DQ_COLS + 2 * tig;
#pragma unroll
          for (int dt = 0; dt < C::DQ_DT; ++dt) {
            red_add(dst + dt * 8, acc_dq[dt][2 * h]);
            red_add(dst + dt * 8 + 1, acc_dq[dt][2 * h + 1]);
          }
        }
      }
#endif
    }
    m = m_next;
  }
  cp_async_wait_all();  // a block with no query tile still has K and V in flight

  // ---- epilogue: dK·scale and dV, 4-byte stores of column pairs ----
  T* dkg = dk + static_cast<size_t>(bh) * Sk * D;
  T* dvg = dv + static_cast<size_t>(bh) * Sk * D;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int key = n0 + wk0 + mt * 16 + g + 8 * h;
      if (key < Sk) {
#pragma unroll
        for (int dt = 0; dt < DT; ++dt) {
          const size_t off = static_cast<size_t>(key) * D + dt * 8 + 2 * tig;
          *reinterpret_cast<uint32_t*>(dkg + off) =
              pack2<BF16>(acc_dk[mt][dt][2 * h] * scale, acc_dk[mt][dt][2 * h + 1] * scale);
          *reinterpret_cast<uint32_t*>(dvg + off) = pack2<BF16>(acc_dv[mt][dt][2 * h], acc_dv[mt][dt][2 * h + 1]);
        }
      }
    }
#endif
}

// ------------------------------------------------------------------------------------------------
// Deterministic dQ: grid over query tiles, loop over key tiles, dQ in registers
// ------------------------------------------------------------------------------------------------
template <typename T, class C, bool CAUSAL>
__global__ void __launch_bounds__(C::THREADS)
fa2_mma_bwd_dq_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                      const T* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ delta,
                      T* __restrict__ dq, int Sq, int Sk, float scale, float scale_log2) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();
#else
  constexpr bool BF16 = std::is_same<T, __nv_bfloat16>::value;
  constexpr int D = C::D, BN = C::BN, BM = C::BM, NK = C::NK, DT = C::DT;
  constexpr int RB = C::ROW_BYTES;
  extern __shared__ __align__(128) unsigned char smem[];

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int g = lane >> 2;
  const int tig = lane & 3;
  const Lanes L(lane);
  const int bh = blockIdx.z * gridDim.y + blockIdx.y;
  const int q0 = blockIdx.x * BM;
  const int wq0 = warp * 16;

  const uint32_t sQ = smem_u32(smem);
  const uint32_t sdO = sQ + BM * RB;
  const uint32_t sK = sdO + BM * RB;
  const uint32_t sV = sK + BN * RB;
  const T* kg = k + static_cast<size_t>(bh) * Sk * D;
  const T* vg = v + static_cast<size_t>(bh) * Sk * D;

  load_rows<C::THREADS, D, BM>(sQ, q + static_cast<size_t>(bh) * Sq * D, q0, Sq, tid);
  load_rows<C::THREADS, D, BM>(sdO, dout + static_cast<size_t>(bh) * Sq * D, q0, Sq, tid);
  cp_async_commit();

  float lse2[2], dl[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = q0 + wq0 + g + 8 * h;
    lse2[h] = r < Sq ? lse[static_cast<size_t>(bh) * Sq + r] * kLog2e : 0.f;
    dl[h] = r < Sq ? delta[static_cast<size_t>(bh) * Sq + r] : 0.f;
  }

  int n_k = (Sk + BN - 1) / BN;
  if (CAUSAL) n_k = min(n_k, (min(q0 + BM, Sq) - 1) / BN + 1);

  float acc_dq[DT][4];
#pragma unroll
  for (int dt = 0; dt < DT; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc_dq[dt][e] = 0.f;

  for (int n = 0; n < n_k; ++n) {
    const int k0 = n * BN;
    __syncthreads();  // every warp is done with K, V of n - 1
    load_rows<C::THREADS, D, BN>(sK, kg, k0, Sk, tid);
    load_rows<C::THREADS, D, BN>(sV, vg, k0, Sk, tid);
    cp_async_commit();
    cp_async_wait_all();
    __syncthreads();

    float acc_s[NK][4], acc_dp[NK][4];
#pragma unroll
    for (int nt = 0; nt < NK; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_s[nt][e] = acc_dp[nt][e] = 0.f;
#pragma unroll
    for (int ks = 0; ks < C::KD; ++ks) {
      uint32_t a[4], ao[4];
      ldmatrix_x4(L.p1(sQ, RB, wq0, 2 * ks), a);
      ldmatrix_x4(L.p1(sdO, RB, wq0, 2 * ks), ao);
#pragma unroll
      for (int np = 0; np < NK / 2; ++np) {
        uint32_t b[4], bv[4];
        ldmatrix_x4(L.p2(sK, RB, np * 16, 2 * ks), b);
        ldmatrix_x4(L.p2(sV, RB, np * 16, 2 * ks), bv);
        mma_16816<BF16>(acc_s[2 * np], a, b[0], b[1]);
        mma_16816<BF16>(acc_s[2 * np + 1], a, b[2], b[3]);
        mma_16816<BF16>(acc_dp[2 * np], ao, bv[0], bv[1]);
        mma_16816<BF16>(acc_dp[2 * np + 1], ao, bv[2], bv[3]);
      }
    }

    const bool need_mask = (k0 + BN > Sk) || (q0 + BM > Sq) || (CAUSAL && k0 + BN - 1 > q0 + wq0);
    uint32_t ds_frag[C::KK][4];
#pragma unroll
    for (int nt = 0; nt < NK; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float p = fast_exp2(fmaf(acc_s[nt][e], scale_log2, -lse2[e >> 1]));
        if (need_mask) {
          const int row = q0 + wq0 + g + 8 * (e >> 1);
          const int key = k0 + nt * 8 + 2 * tig + (e & 1);
          if (key >= Sk || row >= Sq || (CAUSAL && key > row)) p = 0.f;
        }
        acc_dp[nt][e] = p * (acc_dp[nt][e] - dl[e >> 1]);
      }
#pragma unroll
    for (int kk = 0; kk < C::KK; ++kk) {
      ds_frag[kk][0] = pack2<BF16>(acc_dp[2 * kk][0], acc_dp[2 * kk][1]);
      ds_frag[kk][1] = pack2<BF16>(acc_dp[2 * kk][2], acc_dp[2 * kk][3]);
      ds_frag[kk][2] = pack2<BF16>(acc_dp[2 * kk + 1][0], acc_dp[2 * kk + 1][1]);
      ds_frag[kk][3] = pack2<BF16>(acc_dp[2 * kk + 1][2], acc_dp[2 * kk + 1][3]);
    }
#pragma unroll
    for (int kk = 0; kk < C::KK; ++kk)
#pragma unroll
      for (int dp = 0; dp < DT / 2; ++dp) {
        uint32_t b[4];
        ldmatrix_x4_trans(L.p1(sK, RB, kk * 16, 2 * dp), b);
        mma_16816<BF16>(acc_dq[2 * dp], ds_frag[kk], b[0], b[1]);
        mma_16816<BF16>(acc_dq[2 * dp + 1], ds_frag[kk], b[2], b[3]);
      }
  }
  cp_async_wait_all();

  T* dqg = dq + static_cast<size_t>(bh) * Sq * D;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = q0 + wq0 + g + 8 * h;
    if (row < Sq) {
#pragma unroll
      for (int dt = 0; dt < DT; ++dt)
        *reinterpret_cast<uint32_t*>(dqg + static_cast<size_t>(row) * D + dt * 8 + 2 * tig) =
            pack2<BF16>(acc_dq[dt][2 * h] * scale, acc_dq[dt][2 * h + 1] * scale);
    }
  }
#endif
}

// ------------------------------------------------------------------------------------------------
// Host side
// ------------------------------------------------------------------------------------------------
namespace faprof_mma_bwd {

using BwdD64 = BwdConfig<64, 64, 64, 4, 2>;
using BwdD128 = BwdConfig<128, 128, 64, 8, 1>;
using BwdD128Small = BwdConfig<128, 64, 64, 4, 1>;  // <= 99 KB of shared memory (sm_86/89)
// The atomic path's default configs: Q/dO double buffer, staggered start (non-causal).
using BwdD64Exp = BwdConfig<64, 64, 64, 4, 2, 2>;
using BwdD128Exp = BwdConfig<128, 128, 64, 8, 1, 2>;  // 144 KB of shared memory
template <int D>
using DqCfg = DqConfig<D, 64, 64, 4>;

struct BwdArgs {
  const void *q, *k, *v, *o, *dout;
  const float* lse;
  void *dq, *dk, *dv;
  float* delta;
  float* dq_accum;
  int B, H, Sq, Sk;
  float scale;
  cudaStream_t stream;
};

template <class K>
cudaError_t set_smem(K kernel, int bytes) {
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
}

template <typename T, class C, bool CAUSAL>
cudaError_t launch_all(const BwdArgs& a, bool deterministic) {
  const long long rows = static_cast<long long>(a.B) * a.H * a.Sq;
  const float scale_log2 = a.scale * kLog2e;
  fa2_mma_bwd_preprocess_kernel<T, C::D><<<static_cast<unsigned>((rows + 7) / 8), 256, 0, a.stream>>>(
      static_cast<const T*>(a.o), static_cast<const T*>(a.dout), a.delta, rows);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  const dim3 grid_kv((a.Sk + C::BN - 1) / C::BN, a.H, a.B);
  const T *q = static_cast<const T*>(a.q), *k = static_cast<const T*>(a.k), *v = static_cast<const T*>(a.v),
          *dout = static_cast<const T*>(a.dout);
  T *dk = static_cast<T*>(a.dk), *dv = static_cast<T*>(a.dv), *dq = static_cast<T*>(a.dq);
  if (deterministic) {
    using Q = DqCfg<C::D>;
    auto kv = fa2_mma_bwd_kernel<T, C, CAUSAL, false>;
    auto dqk = fa2_mma_bwd_dq_kernel<T, Q, CAUSAL>;
    if ((err = set_smem(kv, C::SMEM_BYTES)) != cudaSuccess || (err = set_smem(dqk, Q::SMEM_BYTES)) != cudaSuccess)
      return err;
    kv<<<grid_kv, C::THREADS, C::SMEM_BYTES, a.stream>>>(q, k, v, dout, a.lse, a.delta, nullptr, dk, dv, a.Sq, a.Sk,
                                                         a.scale, scale_log2);
    if ((err = cudaGetLastError()) != cudaSuccess) return err;
    const dim3 grid_q((a.Sq + Q::BM - 1) / Q::BM, a.H, a.B);
    dqk<<<grid_q, Q::THREADS, Q::SMEM_BYTES, a.stream>>>(q, k, v, dout, a.lse, a.delta, dq, a.Sq, a.Sk, a.scale,
                                                         scale_log2);
    return cudaGetLastError();
  }
  auto kv = fa2_mma_bwd_kernel<T, C, CAUSAL, true>;
  if ((err = set_smem(kv, C::SMEM_BYTES)) != cudaSuccess) return err;
  const size_t n = static_cast<size_t>(rows) * C::D;
  if ((err = cudaMemsetAsync(a.dq_accum, 0, n * sizeof(float), a.stream)) != cudaSuccess) return err;
  kv<<<grid_kv, C::THREADS, C::SMEM_BYTES, a.stream>>>(q, k, v, dout, a.lse, a.delta, a.dq_accum, dk, dv, a.Sq, a.Sk,
                                                       a.scale, scale_log2);
  if ((err = cudaGetLastError()) != cudaSuccess) return err;
  const long long pairs = static_cast<long long>(n / 2);
  const unsigned blocks = static_cast<unsigned>(pairs / 256 + 1 < 65536 ? pairs / 256 + 1 : 65536);
  fa2_mma_bwd_convert_kernel<T><<<blocks, 256, 0, a.stream>>>(a.dq_accum, dq, static_cast<long long>(n), a.scale);
  return cudaGetLastError();
}

template <class C>
cudaError_t dispatch(const BwdArgs& a, bool causal, bool bf16, bool deterministic) {
  if (bf16)
    return causal ? launch_all<__nv_bfloat16, C, true>(a, deterministic)
                  : launch_all<__nv_bfloat16, C, false>(a, deterministic);
  return causal ? launch_all<__half, C, true>(a, deterministic) : launch_all<__half, C, false>(a, deterministic);
}

}  // namespace faprof_mma_bwd

cudaError_t faprof_fa2_mma_bwd(const void* q, const void* k, const void* v, const void* o, const void* dout,
                               const float* lse, void* dq, void* dk, void* dv, float* delta, float* dq_accum,
                               int B, int H, int Sq, int Sk, int D, float scale, bool causal, bool bf16,
                               bool deterministic, bool single_buffer, cudaStream_t stream) {
  using namespace faprof_mma_bwd;
  if (D != 64 && D != 128) return cudaErrorInvalidValue;
  if (B < 1 || H < 1 || Sq < 1 || Sk < 1 || B > 65535 || H > 65535) return cudaErrorInvalidValue;
  if (!(scale > 0.f) || scale == INFINITY) return cudaErrorInvalidValue;
  const uintptr_t bits = reinterpret_cast<uintptr_t>(q) | reinterpret_cast<uintptr_t>(k) |
                         reinterpret_cast<uintptr_t>(v) | reinterpret_cast<uintptr_t>(o) |
                         reinterpret_cast<uintptr_t>(dout) | reinterpret_cast<uintptr_t>(dq) |
                         reinterpret_cast<uintptr_t>(dk) | reinterpret_cast<uintptr_t>(dv);
  if ((bits & 15u) != 0 || lse == nullptr || delta == nullptr || (!deterministic && dq_accum == nullptr))
    return cudaErrorInvalidValue;
  int dev = 0, major = 0, smem_optin = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  if (err != cudaSuccess) return err;
  if (major < 8) return cudaErrorNotSupported;
  const BwdArgs a{q, k, v, o, dout, lse, dq, dk, dv, delta, dq_accum, B, H, Sq, Sk, scale, stream};
  // The atomic (dK, dV, dQ) kernel uses the double-buffered configs (Q/dO prefetch, staggered
  // non-causal start): measured on the H100 at B=4 H=16 S=4096 D=128 fp16 as 0.89x / 0.87x of
  // sdpa_flash's backward against 0.76x / 0.80x for the single-buffered ones, which `single_buffer`
  // (the hidden variant _fa2_mma_bwd_1buf) keeps for comparison. The deterministic path keeps its own
  // kernels, and D = 128 falls back to the single-buffered config where 144 KB do not fit.
  if (!single_buffer && !deterministic) {
    if (D == 64) return dispatch<BwdD64Exp>(a, causal, bf16, false);
    if (smem_optin >= BwdD128Exp::SMEM_BYTES) return dispatch<BwdD128Exp>(a, causal, bf16, false);
  }
  if (D == 64) return dispatch<BwdD64>(a, causal, bf16, deterministic);
  if (smem_optin >= BwdD128::SMEM_BYTES) return dispatch<BwdD128>(a, causal, bf16, deterministic);
  return dispatch<BwdD128Small>(a, causal, bf16, deterministic);
}
