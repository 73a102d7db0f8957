// decode_splitkv.cu — split-KV decoding ("flash-decoding") on tensor cores, for contiguous and paged
// KV caches, with grouped-query heads.
//
// Decode reads a long K/V cache for a handful of query rows, so its limit is HBM bandwidth: the
// kernel's job is to read every K/V byte once and to keep enough bytes in flight on every SM.
//
//   * Packed query tile: the Sq queries of the `group = H / Hkv` query heads that share one KV head
//     form one tile of rows = Sq * group rows (packed row R = i * group + g: query i, head
//     hkv * group + g). A CTA owns 16 * WR of those rows (WR in {1, 2, 4}: 16, 32 or 64 rows) for one
//     (sequence, KV head, key split), so each K/V byte of a split is read from DRAM by one CTA only
//     (more than 64 rows, e.g. Sq 16 x group 8, take several row tiles that each read the split).
//   * Split over keys: grid = (num_splits, Hkv * row_tiles, B). Split s covers keys
//     [s * keys_per_split, (s + 1) * keys_per_split) of its sequence (keys_per_split a multiple of the
//     64-key tile); the host picks num_splits (faprof_decode_splitkv_plan, the heuristic is in its
//     comment) so that the grid fills the SMs without splits too short to pay for their partial output.
//   * Inside a CTA: 4 warps = WR row groups x WK = 4 / WR key groups. A 64-key tile is cut into WK
//     slices of 64 / WK keys; each warp runs QKᵀ, an online softmax of its own (m, l) and PV on its
//     16 rows x its slice with mma.sync m16n8k16 (fp32 accumulate), Q held in registers as A
//     fragments, K by ldmatrix, V by ldmatrix.trans, P kept in registers (the QKᵀ accumulator is
//     PV's A fragment). The WK partial results of a row are merged once at the end through shared
//     memory (log-sum-exp weights), so warps never wait for each other inside the loop.
//   * K/V stream through a STAGES-deep cp.async ring (3 stages of 64 keys x D for K and V at D=128,
//     96 KB; 4 at D=64, 64 KB), 16-byte cp.async.cg per thread and row chunk, one __syncthreads per
//     tile. With two CTAs per SM on an H100 that is ~128 KB in flight per SM (~17 MB over 132 SMs),
//     well above the ~3 MB Little's law asks for at 3 TB/s x ~1 µs. Keys past the split's end are
//     zero-filled (cp.async src-size 0) and masked.
//   * Paged cache: K/V live in a pool [num_blocks, page_size, Hkv, D]; key t of sequence b is row
//     t % page_size of pool block block_table[b, t / page_size]. Each thread needs the pool block of
//     its own rows of a tile; it loads those table entries one tile ahead (plain loads whose results
//     are first used at the next tile's issue, so their latency hides behind a tile's compute). The
//     32 lanes of a warp cover 2 (D=128) or 4 (D=64) consecutive keys, so a warp's table loads are
//     one broadcast transaction. Blocks may sit anywhere in the pool, in any order; the last block
//     of a sequence is partly filled (seqlens_k[b] keys); any page_size >= 1 works.
//   * Masks: none, or causal aligned top-left (query i sees keys <= i) or bottom-right (query i of
//     Sq sees keys <= i + sk_b - Sq: the last query sees the whole cache). Keys past a CTA's last
//     visible key are never loaded. A query that sees no key gets O = 0 and lse = -inf.
//   * Output: with one split the CTA writes O (fp16/bf16) and lse directly; with several, each CTA
//     writes its normalised fp32 partial O and its lse, and decode_combine_kernel merges the splits
//     of a row with weights exp(lse_s - max lse). A second kernel rather than "the last CTA of a head
//     reduces": no counters to zero or reset (a memset launch, or a persistent buffer that two
//     streams could race on), no atomics, a deterministic result, and the partials are read back
//     from L2 right after they were written. On sm_90 the combine kernel is launched with
//     programmatic dependent launch (griddepcontrol), so its launch overlaps the split kernel's
//     last wave instead of adding a launch gap.
//
// Requires scale > 0 (running max on raw scores, exp2 with the scale folded in), 16-byte aligned
// q, k, v, o, sm_80 or newer (cp.async, ldmatrix, bf16 mma).

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "faprof_kernels.h"
#include "mma_ptx.cuh"

namespace faprof_decode {

using namespace faprof_ptx;

constexpr float kLog2e = 1.4426950408889634f;
constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kBN = 64;                       // keys per pipeline tile
constexpr int kMaxRowsPerCta = 16 * kWarps;   // WR = 4: one m16 tile per warp, no key slicing
constexpr int kCombineThreads = 128;          // one CTA per output row
constexpr int kCombineUnroll = 4;            // split loads in flight per thread in the combine
constexpr int kMaxSplits = 256;               // bounds the partial buffers and the combine's weights

// faprof:launch kernel=decode_splitkv_kernel D=A0 threads=128 dyn_smem=(3+(128-D)//64)*256*D
template <int D_>
struct Cfg {
  static constexpr int D = D_;
  static constexpr int STAGES = D == 64 ? 4 : 3;  // same bytes in flight per CTA at both head dims
  static constexpr int CHUNKS = D / 8;            // 16-byte chunks per row
  static constexpr int ROW_BYTES = 2 * D;
  static constexpr int TILE_BYTES = kBN * ROW_BYTES;  // K (or V) of one tile
  static constexpr int STAGE_BYTES = 2 * TILE_BYTES;  // K then V
  static constexpr int SMEM_BYTES = STAGES * STAGE_BYTES;
  static constexpr int RSTEP = kThreads / CHUNKS;     // rows one load pass covers: 8 (D=128), 16 (D=64)
  static constexpr int PASSES = kBN / RSTEP;          // load passes per tile and tensor
  static constexpr int DT = D / 8;                    // n8 tiles of O
  static constexpr int KQ = D / 16;                   // k16 steps of QKᵀ
  static constexpr int O_STRIDE = D + 8;              // fp32 row stride of the epilogue's staging
  static_assert(D == 64 || D == 128, "head dims 64 and 128");
  static_assert(kThreads % CHUNKS == 0 && kBN % RSTEP == 0, "tile loads split evenly over the threads");
  static_assert(SMEM_BYTES == (3 + (128 - D) / 64) * 256 * D, "keep the faprof:launch annotation in step");
  static_assert(kMaxRowsPerCta * ROW_BYTES <= STAGE_BYTES, "Q is staged in one ring slot");
  static_assert(kWarps * 16 * (O_STRIDE + 2) * 4 <= SMEM_BYTES, "the epilogue's staging fits the ring");
};

struct Params {
  const void* q;            // [B, H, Sq, D]
  const void* k;            // dense [B, Hkv, Sk, D]; paged pool [num_blocks, page_size, Hkv, D]
  const void* v;
  void* o;                  // [B, H, Sq, D]
  float* lse;               // [B, H, Sq]
  const int* block_table;   // paged: [B, max_blocks]
  const int* seqlens_k;     // paged: [B]
  float* part_o;            // num_splits > 1: [num_splits, B * H * Sq, D] fp32
  float* part_lse;          // num_splits > 1: [num_splits, B * H * Sq]
  int B, H, Hkv, group, Sq;
  int Sk;                   // dense: the cache length; paged: its capacity max_blocks * page_size
  int rows;                 // Sq * group packed rows per (sequence, KV head)
  int row_tiles;            // CTAs over those rows
  int page_size, max_blocks;
  int num_splits, keys_per_split;
  float scale, scale_log2;
  int causal, bottom_right;
};

// 16-byte global->shared copy that bypasses L1; pred false zero-fills the destination.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool pred) {
  const int src_bytes = pred ? 16 : 0;
  asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Byte offset of 16-byte chunk `chunk` of a row whose (row & 7) is r7: chunks XOR-swizzled by row.
__device__ __forceinline__ uint32_t swz(int chunk, int r7) {
  return (static_cast<uint32_t>(chunk) << 4) ^ (static_cast<uint32_t>(r7) << 4);
}

// Row of q / o / lse (in units of D elements, resp. of one float) of packed row R of KV head hkv.
__device__ __forceinline__ size_t out_row(const Params& p, int b, int hkv, int R) {
  const int i = R / p.group, g = R - (R / p.group) * p.group;
  return (static_cast<size_t>(b) * p.H + hkv * p.group + g) * p.Sq + i;
}

template <typename T>
__device__ __forceinline__ void store4(T* dst, float a, float b, float c, float d) {
  constexpr bool BF16 = std::is_same<T, __nv_bfloat16>::value;
  uint2 v;
  v.x = pack2<BF16>(a, b);
  v.y = pack2<BF16>(c, d);
  *reinterpret_cast<uint2*>(dst) = v;
}

// A CTA whose key range is empty (a split past a short sequence's end, or keys no row may see):
// O = 0 and lse = -inf for its rows, as partials or as the final output.
template <typename T, int D>
__device__ void write_empty(const Params& p, int b, int hkv, int R0, int n_rows, int split) {
  const size_t total_rows = static_cast<size_t>(p.B) * p.H * p.Sq;
  for (int idx = threadIdx.x; idx < n_rows * (D / 4); idx += kThreads) {
    const int r = idx / (D / 4), c4 = idx % (D / 4);
    const size_t row = out_row(p, b, hkv, R0 + r);
    if (p.num_splits == 1) {
      store4(static_cast<T*>(p.o) + row * D + c4 * 4, 0.f, 0.f, 0.f, 0.f);
      if (c4 == 0) p.lse[row] = -INFINITY;
    } else if (c4 == 0) {
      p.part_lse[split * total_rows + row] = -INFINITY;  // the combine never reads this split's O
    }
  }
}

// ------------------------------------------------------------------------------------------------
// The split kernel
// ------------------------------------------------------------------------------------------------
template <typename T, int D, int WR, bool PAGED>
__global__ void __launch_bounds__(kThreads, 2) decode_splitkv_kernel(const Params p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();  // cp.async, ldmatrix and bf16 mma need sm_80+; the launcher refuses older GPUs first
#else
  using C = Cfg<D>;
  constexpr bool BF16 = std::is_same<T, __nv_bfloat16>::value;
  constexpr int WK = kWarps / WR;  // warps sharing a row group, each on its own slice of a tile's keys
  constexpr int KW = kBN / WK;     // keys per warp and tile: 16, 32, 64
  constexpr int NT = KW / 8;       // n8 tiles of S per warp
  constexpr int KP = KW / 16;      // k16 steps of PV
  constexpr int M = 16 * WR;       // packed rows per CTA
  constexpr int DT = C::DT, KQ = C::KQ, ROW_BYTES = C::ROW_BYTES, STAGES = C::STAGES;
  static_assert(kWarps % WR == 0 && KW % 16 == 0, "a warp's key slice is whole k16 steps");
  extern __shared__ __align__(128) unsigned char smem[];

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // Programmatic dependent launch: the combine kernel may be scheduled once every CTA of this grid
  // has started; it waits (griddepcontrol.wait) for this grid to finish and flush before reading.
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wr = warp / WK, wk = warp % WK;
  const int split = blockIdx.x;
  const int hkv = blockIdx.y / p.row_tiles;
  const int R0 = (blockIdx.y - hkv * p.row_tiles) * M;  // first packed row of this CTA
  const int b = blockIdx.z;
  const int n_rows = min(M, p.rows - R0);

  // ---- this CTA's keys: [k_lo, k_hi) of sequence b ----
  const int sk = PAGED ? min(max(p.seqlens_k[b], 0), p.Sk) : p.Sk;
  const int off = p.bottom_right ? sk - p.Sq : 0;  // query i sees keys <= i + off (causal)
  const int k_lo = split * p.keys_per_split;
  int k_hi = min(k_lo + p.keys_per_split, sk);
  if (p.causal) k_hi = min(k_hi, (R0 + n_rows - 1) / p.group + off + 1);  // the CTA's last query
  const int n_tiles = k_hi > k_lo ? (k_hi - k_lo + kBN - 1) / kBN : 0;
  if (n_tiles == 0) {
    write_empty<T, D>(p, b, hkv, R0, n_rows, split);
    return;
  }

  const T* qg = static_cast<const T*>(p.q);
  const T* kg = static_cast<const T*>(p.k);
  const T* vg = static_cast<const T*>(p.v);
  const uint32_t s_base = smem_u32(smem);
  const uint32_t sQ = s_base + (STAGES - 1) * C::STAGE_BYTES;  // Q waits in the slot tile STAGES-1 fills

  // ---- Q: the CTA's packed rows into the last ring slot (rows past n_rows zero) ----
  for (int c = tid; c < M * C::CHUNKS; c += kThreads) {
    const int r = c / C::CHUNKS, ch = c % C::CHUNKS;
    const bool ok = r < n_rows;
    const T* src = ok ? qg + out_row(p, b, hkv, R0 + r) * D + ch * 8 : qg;
    cp_async_16(sQ + r * ROW_BYTES + swz(ch, r & 7), src, ok);
  }
  cp_async_commit();

  // ---- K/V tile loads: thread t copies chunk t % CHUNKS of rows t / CHUNKS + i * RSTEP ----
  const int rb = tid / C::CHUNKS, ch = tid % C::CHUNKS;
  const size_t dense_head = (static_cast<size_t>(b) * p.Hkv + hkv) * static_cast<size_t>(p.Sk);
  const int* table = PAGED ? p.block_table + static_cast<size_t>(b) * p.max_blocks : nullptr;
  int blk[PAGED ? C::PASSES : 1], inpg[PAGED ? C::PASSES : 1];  // pool block / row of the next tile's rows

  // The table entries of tile t's rows (paged only): loaded here, first used when tile t is issued.
  auto fetch_pages = [&](int t) {
    if constexpr (PAGED) {
#pragma unroll
      for (int i = 0; i < C::PASSES; ++i) {
        const int key = k_lo + t * kBN + rb + i * C::RSTEP;
        const int pg = key / p.page_size;
        inpg[i] = key - pg * p.page_size;
        blk[i] = (t < n_tiles && key < k_hi) ? __ldg(table + pg) : 0;
      }
    }
  };
  // Tile t into ring slot t % STAGES (K, then V), then the next tile's table entries.
  auto issue = [&](int t) {
    const uint32_t sK = s_base + (t % STAGES) * C::STAGE_BYTES;
#pragma unroll
    for (int i = 0; i < C::PASSES; ++i) {
      const int r = rb + i * C::RSTEP;
      const int key = k_lo + t * kBN + r;
      const bool ok = key < k_hi;
      size_t elem;
      if constexpr (PAGED) {
        elem = ((static_cast<size_t>(blk[i]) * p.page_size + inpg[i]) * p.Hkv + hkv) * D;
      } else {
        elem = (dense_head + key) * D;
      }
      const uint32_t dst = sK + r * ROW_BYTES + swz(ch, r & 7);
      cp_async_16(dst, ok ? kg + elem + ch * 8 : kg, ok);
      cp_async_16(dst + C::TILE_BYTES, ok ? vg + elem + ch * 8 : vg, ok);
    }
    fetch_pages(t + 1);
  };

  fetch_pages(0);
#pragma unroll
  for (int t = 0; t < STAGES - 1; ++t) {
    if (t < n_tiles) issue(t);
    cp_async_commit();
  }

  // ---- per-lane ldmatrix offsets (as in fa2_mma.cu) ----
  // Q (A) and V (B via .trans): rows += 8 * ((l >> 3) & 1), chunk += l >> 4;
  // K (B, non-trans): keys += 8 * (l >> 4), chunk += (l >> 3) & 1. Chunk pair c sits at
  // ((c >> 2) << 7) + (((c & 3) << 5) ^ x): the first term is an immediate.
  const int lr = lane & 7;
  const uint32_t xa = static_cast<uint32_t>(((lane >> 4) ^ lr) << 4);
  const uint32_t xk = static_cast<uint32_t>((((lane >> 3) & 1) ^ lr) << 4);
  uint32_t a_off[4], k_off[4];
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    a_off[c] = (lr + ((lane >> 3) & 1) * 8) * ROW_BYTES + ((c << 5) ^ xa);
    k_off[c] = (lr + (lane >> 4) * 8) * ROW_BYTES + ((c << 5) ^ xk);
  }

  cp_async_wait<STAGES - 1>();  // Q's group has landed (the K/V tiles may still be in flight)
  __syncthreads();
  uint32_t q_frag[KQ][4];
#pragma unroll
  for (int ks = 0; ks < KQ; ++ks) ldmatrix_x4(sQ + wr * 16 * ROW_BYTES + a_off[ks & 3] + (ks >> 2) * 128, q_frag[ks]);

  // The last key each of this thread's two rows (g and g + 8 of the warp's m16 tile) may see.
  int lim[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int R = R0 + wr * 16 + (lane >> 2) + 8 * h;
    const int i = min(R, p.rows - 1) / p.group;
    lim[h] = p.causal ? min(k_hi - 1, i + off) : k_hi - 1;
  }
  const int lim_min = min(lim[0], lim[1]);

  float acc_o[DT][4];
#pragma unroll
  for (int dt = 0; dt < DT; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc_o[dt][e] = 0.f;
  float row_m[2] = {-INFINITY, -INFINITY}, row_l[2] = {0.f, 0.f};

  for (int j = 0; j < n_tiles; ++j) {
    // Groups committed so far: Q, STAGES - 1 prologue tiles, one per earlier iteration; leaving
    // STAGES - 2 pending means tile j has landed.
    cp_async_wait<STAGES - 2>();
    // Tile j is visible to every warp, and every warp is done with tile j - 1's slot (and with Q).
    __syncthreads();
    if (j + STAGES - 1 < n_tiles) issue(j + STAGES - 1);
    cp_async_commit();

    const uint32_t sK = s_base + (j % STAGES) * C::STAGE_BYTES + wk * KW * ROW_BYTES;
    const uint32_t sV = sK + C::TILE_BYTES;
    const int kv0 = k_lo + j * kBN + wk * KW;  // this warp's first key

    // ---- S = Q Kᵀ over the warp's key slice ----
    float acc_s[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_s[nt][e] = 0.f;
#pragma unroll
    for (int ks = 0; ks < KQ; ++ks) {
#pragma unroll
      for (int np = 0; np < NT / 2; ++np) {
        uint32_t bk[4];
        ldmatrix_x4(sK + k_off[ks & 3] + (ks >> 2) * 128 + np * 16 * ROW_BYTES, bk);
        mma_16816<BF16>(acc_s[2 * np], q_frag[ks], bk[0], bk[1]);
        mma_16816<BF16>(acc_s[2 * np + 1], q_frag[ks], bk[2], bk[3]);
      }
    }

    // ---- mask: the split's tail and the causal diagonal (element (nt, e) is key kv0 + c + nt*8 + e) ----
    if (kv0 + KW - 1 > lim_min) {
      const int c0 = kv0 + 2 * (lane & 3);
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e)
            if (c0 + nt * 8 + e > lim[h]) acc_s[nt][2 * h + e] = -INFINITY;
    }

    // ---- online softmax of the warp's own (m, l) ----
    float base[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float m = row_m[h];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) m = fmaxf(m, fmaxf(acc_s[nt][2 * h], acc_s[nt][2 * h + 1]));
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
      base[h] = (m == -INFINITY) ? 0.f : m * p.scale_log2;  // nothing seen yet: p = 0, not NaN
      const float alpha = fast_exp2(row_m[h] * p.scale_log2 - base[h]);
      row_m[h] = m;
      row_l[h] *= alpha;
#pragma unroll
      for (int dt = 0; dt < DT; ++dt) {
        acc_o[dt][2 * h] *= alpha;
        acc_o[dt][2 * h + 1] *= alpha;
      }
      float sum = 0.f;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float pe = fast_exp2(fmaf(acc_s[nt][2 * h + e], p.scale_log2, -base[h]));
          acc_s[nt][2 * h + e] = pe;
          sum += pe;
        }
      row_l[h] += sum;
    }

    // ---- O += P V: the C layout of n8 tiles 2kk, 2kk+1 is the A layout of k16 step kk ----
#pragma unroll
    for (int kk = 0; kk < KP; ++kk) {
      uint32_t pa[4];
      pa[0] = pack2<BF16>(acc_s[2 * kk][0], acc_s[2 * kk][1]);
      pa[1] = pack2<BF16>(acc_s[2 * kk][2], acc_s[2 * kk][3]);
      pa[2] = pack2<BF16>(acc_s[2 * kk + 1][0], acc_s[2 * kk + 1][1]);
      pa[3] = pack2<BF16>(acc_s[2 * kk + 1][2], acc_s[2 * kk + 1][3]);
#pragma unroll
      for (int dp = 0; dp < DT / 2; ++dp) {
        uint32_t bv[4];
        ldmatrix_x4_trans(sV + a_off[dp & 3] + (dp >> 2) * 128 + kk * 16 * ROW_BYTES, bv);
        mma_16816<BF16>(acc_o[2 * dp], pa, bv[0], bv[1]);
        mma_16816<BF16>(acc_o[2 * dp + 1], pa, bv[2], bv[3]);
      }
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // every warp is done with the ring: it becomes the epilogue's staging

  // ---- merge the WK warps of each row group: (m, l, O) through shared memory ----
  float* sO = reinterpret_cast<float*>(smem);     // [kWarps][16][O_STRIDE]
  float* sM = sO + kWarps * 16 * C::O_STRIDE;     // [kWarps][16]
  float* sL = sM + kWarps * 16;                   // [kWarps][16]
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float l = row_l[h];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const int r = (lane >> 2) + 8 * h;
    if ((lane & 3) == 0) {
      sM[warp * 16 + r] = row_m[h];
      sL[warp * 16 + r] = l;
    }
#pragma unroll
    for (int dt = 0; dt < DT; ++dt)
      *reinterpret_cast<float2*>(sO + (warp * 16 + r) * C::O_STRIDE + dt * 8 + 2 * (lane & 3)) =
          make_float2(acc_o[dt][2 * h], acc_o[dt][2 * h + 1]);
  }
  __syncthreads();

  const size_t total_rows = static_cast<size_t>(p.B) * p.H * p.Sq;
  for (int idx = tid; idx < n_rows * (D / 4); idx += kThreads) {
    const int r = idx / (D / 4), c4 = idx % (D / 4);
    const int w0 = (r >> 4) * WK, rr = r & 15;  // the row's warps are w0 .. w0 + WK - 1
    float m_tot = -INFINITY;
#pragma unroll
    for (int w = 0; w < WK; ++w) m_tot = fmaxf(m_tot, sM[(w0 + w) * 16 + rr]);
    float l_tot = 0.f;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    if (m_tot != -INFINITY) {
#pragma unroll
      for (int w = 0; w < WK; ++w) {
        const float wt = fast_exp2((sM[(w0 + w) * 16 + rr] - m_tot) * p.scale_log2);  // 0 for m = -inf
        l_tot += wt * sL[(w0 + w) * 16 + rr];
        const float4 x = *reinterpret_cast<const float4*>(sO + ((w0 + w) * 16 + rr) * C::O_STRIDE + c4 * 4);
        acc.x += wt * x.x;
        acc.y += wt * x.y;
        acc.z += wt * x.z;
        acc.w += wt * x.w;
      }
    }
    const float inv = l_tot > 0.f ? 1.f / l_tot : 0.f;
    const float row_lse = l_tot > 0.f ? m_tot * p.scale + __logf(l_tot) : -INFINITY;
    const size_t row = out_row(p, b, hkv, R0 + r);
    if (p.num_splits == 1) {
      store4(static_cast<T*>(p.o) + row * D + c4 * 4, acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);
      if (c4 == 0) p.lse[row] = row_lse;
    } else {
      *reinterpret_cast<float4*>(p.part_o + (split * total_rows + row) * D + c4 * 4) =
          make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);
      if (c4 == 0) p.part_lse[split * total_rows + row] = row_lse;
    }
  }
#endif
}

// ------------------------------------------------------------------------------------------------
// The combine kernel: one CTA per output row, O = sum_s exp(lse_s - lse) O_s
// ------------------------------------------------------------------------------------------------
// The splits of a row are read in parallel, not one after another: the CTA's 128 threads are
// GROUPS = 128 / (D / 4) groups of D / 4 threads; thread (group g, column c) adds the float4 at
// column c of splits g, g + GROUPS, ..., COMBINE_UNROLL loads in flight at a time, and the groups'
// sums are added in a fixed order through shared memory (deterministic bits). With 32 splits at
// D = 128 that is 2 rounds of L2 latency per row instead of 32 (the first version's warp per row
// walked the splits serially: ~20 µs of a 36 µs B=1 decode on the H100).
// faprof:launch kernel=decode_combine_kernel D=A0 threads=128 dyn_smem=0
template <typename T, int D>
__global__ void __launch_bounds__(kCombineThreads) decode_combine_kernel(
    const float* __restrict__ part_o,    // [num_splits, total_rows, D]
    const float* __restrict__ part_lse,  // [num_splits, total_rows]
    T* __restrict__ o,                   // [total_rows, D]
    float* __restrict__ lse,             // [total_rows]
    int total_rows, int num_splits) {
  constexpr int COLS = D / 4;                      // float4 columns of a row
  constexpr int GROUPS = kCombineThreads / COLS;   // splits summed side by side: 4 (D=128), 8 (D=64)
  constexpr int WARPS = kCombineThreads / 32;
  __shared__ float s_w[kMaxSplits];                // exp(lse_s - m), 0 for an empty split
  __shared__ float s_red[WARPS];
  __shared__ float4 s_acc[GROUPS][COLS];
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");  // the split kernel has finished and flushed
#endif
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int row = blockIdx.x;
  const size_t rows = static_cast<size_t>(total_rows);

  // m = max_s lse_s over the CTA (num_splits <= kMaxSplits = 2 x 128 threads)
  float m = -INFINITY;
  for (int s = tid; s < num_splits; s += kCombineThreads) m = fmaxf(m, part_lse[s * rows + row]);
#pragma unroll
  for (int x = 16; x >= 1; x >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, x));
  if (lane == 0) s_red[warp] = m;
  __syncthreads();
  m = s_red[0];
#pragma unroll
  for (int w = 1; w < WARPS; ++w) m = fmaxf(m, s_red[w]);
  __syncthreads();  // s_red is reused for the sum

  // weights and their sum (fixed order: per warp by shuffles, then warps in order)
  float sum = 0.f;
  for (int s = tid; s < num_splits; s += kCombineThreads) {
    const float w = m == -INFINITY ? 0.f : __expf(part_lse[s * rows + row] - m);  // 0 for lse = -inf
    s_w[s] = w;
    sum += w;
  }
#pragma unroll
  for (int x = 16; x >= 1; x >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, x);
  if (lane == 0) s_red[warp] = sum;
  __syncthreads();
  sum = 0.f;
#pragma unroll
  for (int w = 0; w < WARPS; ++w) sum += s_red[w];

  // O: each thread sums its column over its share of the splits, loads batched
  const int col = tid % COLS, grp = tid / COLS;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  const float* base = part_o + row * static_cast<size_t>(D) + col * 4;
  for (int s0 = grp; s0 < num_splits; s0 += GROUPS * kCombineUnroll) {
    float4 x[kCombineUnroll];
    float w[kCombineUnroll];
#pragma unroll
    for (int u = 0; u < kCombineUnroll; ++u) {
      const int s = s0 + u * GROUPS;
      w[u] = s < num_splits ? s_w[s] : 0.f;
      // an empty split (weight 0) wrote no O: not read, so uninitialised memory never meets the sum
      x[u] = w[u] > 0.f ? __ldg(reinterpret_cast<const float4*>(base + s * rows * D)) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int u = 0; u < kCombineUnroll; ++u) {
      acc.x += w[u] * x[u].x;
      acc.y += w[u] * x[u].y;
      acc.z += w[u] * x[u].z;
      acc.w += w[u] * x[u].w;
    }
  }
  s_acc[grp][col] = acc;
  __syncthreads();
  if (grp == 0) {
#pragma unroll
    for (int g = 1; g < GROUPS; ++g) {
      const float4 y = s_acc[g][col];
      acc.x += y.x;
      acc.y += y.y;
      acc.z += y.z;
      acc.w += y.w;
    }
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
    store4(o + row * static_cast<size_t>(D) + col * 4, acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);
    if (tid == 0) lse[row] = sum > 0.f ? m + __logf(sum) : -INFINITY;
  }
}

// ------------------------------------------------------------------------------------------------
// Host side
// ------------------------------------------------------------------------------------------------
// The split heuristic's constants (faprof_decode_splitkv_plan).
constexpr int kSplitCtasPerSm = 1;    // one streaming CTA per SM saturates HBM (H100 sweep: 1 split at 128 CTAs beat 2-128)
constexpr int kMinSplitKeys = 128;    // 2 tiles: shorter splits are all prologue and epilogue (B=1 Sk=1024: 8 splits best)
constexpr int kMinSplitKeysPerRow = 16;  // partial O write + read (8 B x rows x D) <= 1/8 of K/V (4 B x keys x D)
constexpr int kMaxDevices = 64;

inline int rows_per_cta(int rows) { return rows <= 16 ? 16 : rows <= 32 ? 32 : 64; }

template <typename T, int D, int WR, bool PAGED>
auto kernel_of() {
  return decode_splitkv_kernel<T, D, WR, PAGED>;
}

// Per device and kernel: the dynamic shared memory attribute set once, and the resident CTAs per SM.
template <typename T, int D, int WR, bool PAGED>
cudaError_t prepare(int dev, int* blocks_per_sm) {
  static int cached[kMaxDevices] = {};  // 0: not yet known (a benign race: every writer writes the same)
  if (dev >= 0 && dev < kMaxDevices && cached[dev] > 0) {
    *blocks_per_sm = cached[dev];
    return cudaSuccess;
  }
  auto kernel = kernel_of<T, D, WR, PAGED>();
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg<D>::SMEM_BYTES);
  if (err != cudaSuccess) return err;
  int n = 0;
  err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, kThreads, Cfg<D>::SMEM_BYTES);
  if (err != cudaSuccess) return err;
  if (n < 1) return cudaErrorInvalidConfiguration;
  if (dev >= 0 && dev < kMaxDevices) cached[dev] = n;
  *blocks_per_sm = n;
  return cudaSuccess;
}

template <typename T, int D, bool PAGED>
cudaError_t prepare_rows(int dev, int m, int* blocks_per_sm) {
  if (m == 16) return prepare<T, D, 1, PAGED>(dev, blocks_per_sm);
  if (m == 32) return prepare<T, D, 2, PAGED>(dev, blocks_per_sm);
  return prepare<T, D, 4, PAGED>(dev, blocks_per_sm);
}

inline cudaError_t resident_ctas_per_sm(int dev, int D, int m, bool paged, bool bf16, int* n) {
  if (D == 64) {
    if (bf16) return paged ? prepare_rows<__nv_bfloat16, 64, true>(dev, m, n) : prepare_rows<__nv_bfloat16, 64, false>(dev, m, n);
    return paged ? prepare_rows<__half, 64, true>(dev, m, n) : prepare_rows<__half, 64, false>(dev, m, n);
  }
  if (bf16) return paged ? prepare_rows<__nv_bfloat16, 128, true>(dev, m, n) : prepare_rows<__nv_bfloat16, 128, false>(dev, m, n);
  return paged ? prepare_rows<__half, 128, true>(dev, m, n) : prepare_rows<__half, 128, false>(dev, m, n);
}

inline cudaError_t require_sm80(int* dev, int* sms, bool* hopper) {
  int major = 0;
  cudaError_t err = cudaGetDevice(dev);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, *dev);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(sms, cudaDevAttrMultiProcessorCount, *dev);
  if (err != cudaSuccess) return err;
  *hopper = major >= 9;
  return major >= 8 ? cudaSuccess : cudaErrorNotSupported;
}

template <typename T, int D, int WR, bool PAGED>
cudaError_t launch_split(const Params& p, cudaStream_t stream) {
  const dim3 grid(p.num_splits, p.Hkv * p.row_tiles, p.B);
  kernel_of<T, D, WR, PAGED>()<<<grid, kThreads, Cfg<D>::SMEM_BYTES, stream>>>(p);
  return cudaGetLastError();
}

template <typename T, int D>
cudaError_t launch_combine(const Params& p, bool pdl, cudaStream_t stream) {
  const int total_rows = p.B * p.H * p.Sq;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(total_rows);
  cfg.blockDim = dim3(kCombineThreads);
  cfg.dynamicSmemBytes = 0;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, decode_combine_kernel<T, D>, static_cast<const float*>(p.part_o),
                            static_cast<const float*>(p.part_lse), static_cast<T*>(p.o), p.lse, total_rows,
                            p.num_splits);
}

template <typename T, int D, bool PAGED>
cudaError_t run(const Params& p, int m, bool pdl, cudaStream_t stream) {
  cudaError_t err;
  if (m == 16) {
    err = launch_split<T, D, 1, PAGED>(p, stream);
  } else if (m == 32) {
    err = launch_split<T, D, 2, PAGED>(p, stream);
  } else {
    err = launch_split<T, D, 4, PAGED>(p, stream);
  }
  if (err != cudaSuccess || p.num_splits == 1) return err;
  return launch_combine<T, D>(p, pdl, stream);
}

}  // namespace faprof_decode

// The split heuristic. base = B * Hkv * row_tiles CTAs exist without splitting. Splitting only pays
// where base leaves SMs idle: one CTA per SM already keeps two 32 KB tiles in flight per SM, which
// saturates HBM, while every extra split costs its prologue, its partial output and the combine. So
// num_splits = floor(kSplitCtasPerSm x SMs / base), 1 when base covers the SMs. Measured on the H100
// (132 SMs, bf16, D=128, scripts/gpu/gpu_decode_bench.py's sweep): at B=16 Hkv=8 (128 CTAs) one split
// was fastest at every Sk and Sq (176 µs at Sk=8192 against 181-227 µs for 2-128 splits); at B=1
// (8 CTAs) 16 splits (128 CTAs) were fastest at Sk=8192 and 32768. Each split keeps at least
// kMinSplitKeys keys and kMinSplitKeysPerRow keys per packed row (the partial O is written in fp32
// and read back once, 8 B x rows x D, against 4 B x keys x D of K/V: at 16 keys per row that is at
// most 1/8 more traffic, most of it an L2 round trip). Capped by kMaxSplits and by one 64-key tile
// per split; keys_per_split is rounded up to whole tiles and num_splits recomputed from it, so no
// split is empty on a full-length sequence.
cudaError_t faprof_decode_splitkv_plan(int B, int H, int Hkv, int Sq, int Sk, int D, bool paged, bool bf16,
                                       int requested_splits, int* num_splits, int* keys_per_split) {
  using namespace faprof_decode;
  (void)paged;  // the plan is the same for both layouts and dtypes (one CTA per SM); kept for the ABI
  (void)bf16;
  if (B < 1 || H < 1 || Hkv < 1 || Sq < 1 || Sk < 1 || H % Hkv != 0 || (D != 64 && D != 128))
    return cudaErrorInvalidValue;
  int dev = 0, sms = 0;
  bool hopper = false;
  cudaError_t err = require_sm80(&dev, &sms, &hopper);
  if (err != cudaSuccess) return err;
  const int rows = Sq * (H / Hkv);
  const int m = rows_per_cta(rows);
  const long long base = static_cast<long long>(B) * Hkv * ((rows + m - 1) / m);
  const int tiles = (Sk + kBN - 1) / kBN;
  long long splits = requested_splits;
  if (splits <= 0) {
    const long long target = static_cast<long long>(kSplitCtasPerSm) * sms;
    splits = base >= target ? 1 : target / base;  // the most splits that keep to one CTA per SM
    const int min_keys = rows * kMinSplitKeysPerRow > kMinSplitKeys ? rows * kMinSplitKeysPerRow : kMinSplitKeys;
    const long long by_length = Sk / min_keys > 1 ? Sk / min_keys : 1;
    if (splits > by_length) splits = by_length;
  }
  if (splits > kMaxSplits) splits = kMaxSplits;  // a forced count too: the combine holds at most kMaxSplits weights
  if (splits > tiles) splits = tiles;
  if (splits < 1) splits = 1;
  const int per_split_tiles = static_cast<int>((tiles + splits - 1) / splits);
  *keys_per_split = per_split_tiles * kBN;
  *num_splits = (tiles + per_split_tiles - 1) / per_split_tiles;
  return cudaSuccess;
}

cudaError_t faprof_decode_splitkv_fwd(const void* q, const void* k, const void* v, void* o, float* lse,
                                      const int* block_table, const int* seqlens_k, int page_size, int max_blocks,
                                      float* partial_o, float* partial_lse, int num_splits, int keys_per_split,
                                      int B, int H, int Hkv, int Sq, int Sk, int D, float scale, bool causal,
                                      bool bottom_right, bool bf16, cudaStream_t stream) {
  using namespace faprof_decode;
  if (B < 1 || H < 1 || Hkv < 1 || Sq < 1 || Sk < 1 || H % Hkv != 0 || (D != 64 && D != 128))
    return cudaErrorInvalidValue;
  if (!(scale > 0.f) || scale == INFINITY || lse == nullptr) return cudaErrorInvalidValue;
  const bool paged = page_size > 0;
  if (paged && (block_table == nullptr || seqlens_k == nullptr || max_blocks < 1 ||
                static_cast<long long>(max_blocks) * page_size != Sk))
    return cudaErrorInvalidValue;
  if (num_splits < 1 || num_splits > kMaxSplits || keys_per_split < kBN || keys_per_split % kBN != 0 ||
      static_cast<long long>(num_splits) * keys_per_split < Sk)
    return cudaErrorInvalidValue;
  if (num_splits > 1 && (partial_o == nullptr || partial_lse == nullptr)) return cudaErrorInvalidValue;
  const uintptr_t bits = reinterpret_cast<uintptr_t>(q) | reinterpret_cast<uintptr_t>(k) |
                         reinterpret_cast<uintptr_t>(v) | reinterpret_cast<uintptr_t>(o) |
                         reinterpret_cast<uintptr_t>(partial_o);
  if ((bits & 15u) != 0) return cudaErrorInvalidValue;
  const int rows = Sq * (H / Hkv);
  const int m = rows_per_cta(rows);
  const int row_tiles = (rows + m - 1) / m;
  if (B > 65535 || static_cast<long long>(Hkv) * row_tiles > 65535) return cudaErrorInvalidValue;

  int dev = 0, sms = 0;
  bool hopper = false;
  cudaError_t err = require_sm80(&dev, &sms, &hopper);
  if (err != cudaSuccess) return err;
  int per_sm = 0;  // sets the kernel's shared memory attribute (once per device)
  err = resident_ctas_per_sm(dev, D, m, paged, bf16, &per_sm);
  if (err != cudaSuccess) return err;

  Params p{};
  p.q = q;
  p.k = k;
  p.v = v;
  p.o = o;
  p.lse = lse;
  p.block_table = block_table;
  p.seqlens_k = seqlens_k;
  p.part_o = partial_o;
  p.part_lse = partial_lse;
  p.B = B;
  p.H = H;
  p.Hkv = Hkv;
  p.group = H / Hkv;
  p.Sq = Sq;
  p.Sk = Sk;
  p.rows = rows;
  p.row_tiles = row_tiles;
  p.page_size = page_size;
  p.max_blocks = max_blocks;
  p.num_splits = num_splits;
  p.keys_per_split = keys_per_split;
  p.scale = scale;
  p.scale_log2 = scale * kLog2e;
  p.causal = causal ? 1 : 0;
  p.bottom_right = bottom_right ? 1 : 0;

  if (D == 64) {
    if (bf16) return paged ? run<__nv_bfloat16, 64, true>(p, m, hopper, stream) : run<__nv_bfloat16, 64, false>(p, m, hopper, stream);
    return paged ? run<__half, 64, true>(p, m, hopper, stream) : run<__half, 64, false>(p, m, hopper, stream);
  }
  if (bf16) return paged ? run<__nv_bfloat16, 128, true>(p, m, hopper, stream) : run<__nv_bfloat16, 128, false>(p, m, hopper, stream);
  return paged ? run<__half, 128, true>(p, m, hopper, stream) : run<__half, 128, false>(p, m, hopper, stream);
}
