// planted_mma.cu — TEST ONLY: kernels/fa2_mma.cu with one planted performance defect per FAULT.
//
// A copy of the GPU-verified kernels/fa2_mma.cu (read its header for the algorithm). The only
// differences are marked `PLANTED FAULT` and selected by the template argument FAULT; with
// FAULT = kClean the kernel is fa2_mma's. Every fault keeps the results exact (same math, same
// masking, same output); each costs time in one way a profiler can see:
//
//   kBankConflicts   shared-memory rows are not XOR-swizzled: the 8 row addresses of an ldmatrix
//                    phase share one 16-byte bank group (8-way conflicts, excessive wavefronts).
//   kSpills          __launch_bounds__ asks for kSpillMinBlocks blocks per SM of 128 threads, which
//                    caps registers at 65536 / (128 * kSpillMinBlocks) per thread: ptxas spills the
//                    O and S accumulators to local memory.
//   kUncoalesced     K/V/Q tiles are loaded with plain 4-byte loads in which consecutive lanes walk
//                    down rows instead of along them (32 sectors per warp request instead of 4),
//                    synchronously instead of through cp.async.
//   kNoCausalSkip    causal blocks visit every key tile, also those entirely above the diagonal
//                    (masked to -inf, so they add nothing but time).
//   kFewCtas         one block per (b, h) loops over all query tiles: grid (1, H, B) instead of
//                    (query tiles, H, B), fewer blocks than SMs at B*H < SMs.
//   kL2Thrash        the grid is (H, B, query tiles) instead of (query tiles, H, B): the blocks in
//                    flight together read every (b, h)'s K/V instead of a few heads', a working set
//                    of B*H*Sk*D*4 bytes (32 MiB at D=64, 64 MiB at D=128 on the planted shapes)
//                    against the H100's 50 MB L2, so K/V tiles come from DRAM again and again.
//   kGlobalRmw       after every key tile's PV, each thread stores its O accumulators (fp32) to a
//                    global scratch buffer and loads them back (st/ld.global.cg, L2): an extra global
//                    read-modify-write of the whole O tile per key tile; same values, same results.
//   kSmallTile       the tile of fa2_mma's D=256 config (64 query rows, 32 keys per block) at D=64
//                    and D=128: the same work with each K/V byte brought on chip feeding half (D=128)
//                    or a quarter (D=64) of the FLOPs, so twice the L2 and shared traffic per FLOP.
//   kBarrier         the block's warps take turns at block barriers: in turn t only warp t computes
//                    its QKᵀ + softmax (then, in a second round of turns, its PV) while the other
//                    warps wait at the __syncthreads() that ends the turn; 2 + 2 x WARPS = 10 block
//                    barriers per key tile instead of 2, the same instructions otherwise.
//   kFence           a __threadfence() (MEMBAR.SC.GPU) after every k16 step of QKᵀ and of PV: 12 GPU-
//                    scope fences per key tile.
//   kTranscendental  the softmax weights as expf((s - m) / temperature): an IEEE division (MUFU.RCP,
//                    FCHK and its FFMA refinement) and an accurate expf per score instead of one
//                    FFMA with the folded scale and one ex2.approx.
//   kFp64            the softmax weights in double: per score 2^x (exp2_f64: 3 DADD, 11 DFMA, the
//                    exponent added in integer) and the row sum (DADD) in double precision, with an
//                    F2F conversion each way, instead of one ex2.approx and one FADD.
//   kTf32Mma         the same products on a slower tensor-core path: every m16n8k16 fp16 MMA (QKᵀ and
//                    PV) done as two m16n8k8 TF32 MMAs on the same operands widened to fp32 (exact:
//                    fp16's 10-bit mantissa fits TF32's), the TF32 path running at half the fp16 rate
//                    on sm_80..sm_90 (the same FLOPs, counted as sm__ops_path_tensor_src_tf32).
// Their SASS census (instructions per key-tile iteration against kClean's) is in
// tests/planted/planted_variants.py's docstring; tests/test_planted_sass.py keeps it true.
//
// "One launch per head" is the clean kernel launched once per (b, h) by the host
// (faprof_planted_mma_fwd's per_head flag). Built only by tests/planted/planted_variants.py and
// compiled by tests/test_build.py; never part of faprof's extension.
//
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

// fa2_mma's PTX wrappers, by a path relative to this file: the planted extension and the ptxas
// resource report compile this file with only its own folder on the include path.
#include "../../../kernels/mma_ptx.cuh"
#include "planted_kernels.h"
#include "planted_ptx.cuh"

namespace faprof_planted_mma {

constexpr float kLog2e = 1.4426950408889634f;

// The planted faults (see the file header). Values match planted_kernels.h's kPlanted* constants.
enum Fault : int {
  kClean = 0, kBankConflicts = 1, kSpills = 2, kUncoalesced = 3, kNoCausalSkip = 4, kFewCtas = 5,
  kBarrier = 6, kFence = 7, kTranscendental = 8, kFp64 = 9, kL2Thrash = 10, kGlobalRmw = 11, kSmallTile = 12,
  kTf32Mma = 13,
};

// PLANTED FAULT (kSpills): blocks per SM __launch_bounds__ asks for; 65536 / (128 * 4) = 128 registers
// per thread, half of what the D=64 and D=128 configs use (255).
constexpr int kSpillMinBlocks = 4;

/// One tile configuration. MT m16 tiles of query rows per warp; all sizes in elements unless *_BYTES.
// faprof:launch kernel=planted_mma_fwd_kernel D=A0 threads=32*A3 dyn_smem=2*A0*(A1+4*A2)
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
// PTX wrappers: ldmatrix, mma.sync, pack2 and ex2 are fa2_mma's own (kernels/mma_ptx.cuh, shared, not
// copied); cp.async and st.shared are this file's (their clobbers are this pipeline's).
// ------------------------------------------------------------------------------------------------
using faprof_ptx::fast_exp2;
using faprof_ptx::ldmatrix_x4;
using faprof_ptx::ldmatrix_x4_trans;
using faprof_ptx::mma_16816;
using faprof_ptx::pack2;
using faprof_ptx::smem_u32;
using faprof_planted_ptx::mma_1688_tf32;
using faprof_planted_ptx::widen2;

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

// PLANTED FAULT (kTf32Mma): one m16n8k16 MMA of 16-bit operands as two m16n8k8 TF32 MMAs on the same
// values widened to fp32 (faprof_planted_ptx::widen2; `aw`: the A fragment's a0 lo, hi, a1 lo, hi, ...;
// b0, b1 and b2, b3: the B fragment's first and second register, lo and hi). The k index is a sum's:
// permuted alike in A and B, the products are the same. In the m16n8k16 fragments lane (g, t) =
// (lane / 4, lane % 4) holds A rows g and g + 8 and B column g at k = 2t, 2t+1 (a0, a1; B's first
// register) and 2t+8, 2t+9 (a2, a3; B's second); in the m16n8k8 TF32 ones it holds k' = t (a0: row g,
// a1: row g + 8; b0) and t + 4 (a2, a3; b1). Mapping k' = t -> 2t and t + 4 -> 2t + 1 (+8 for the second
// MMA) is one bijection of k for A and B alike; the accumulators' layouts are the same.
__device__ __forceinline__ void mma_tf32_k16(float (&d)[4], const uint32_t (&aw)[8], uint32_t b0, uint32_t b1,
                                             uint32_t b2, uint32_t b3) {
  mma_1688_tf32(d, aw[0], aw[2], aw[1], aw[3], b0, b1);  // k = 0..7
  mma_1688_tf32(d, aw[4], aw[6], aw[5], aw[7], b2, b3);  // k = 8..15
}

// PLANTED FAULT (kFp64): 2^x in double precision, branch-free, as a double-precision softmax port
// computes it: x = n + f with n = round(x) (the 1.5 * 2^52 trick) and |f| <= 1/2, 2^f by its Taylor
// polynomial of degree 11 (relative error < 1e-14), n added to the exponent; 0 for x < -1022 or -inf.
__device__ __forceinline__ double exp2_f64(double x) {
  constexpr double kRound = 6755399441055744.0;  // 1.5 * 2^52: x + kRound has round(x) in its low word
  const double t = x + kRound;
  const double f = x - (t - kRound);
  double p = 4.44553827187081e-10;
  p = fma(p, f, 7.054911620801121e-09);
  p = fma(p, f, 1.0178086009239696e-07);
  p = fma(p, f, 1.3215486790144305e-06);
  p = fma(p, f, 1.5252733804059838e-05);
  p = fma(p, f, 0.00015403530393381606);
  p = fma(p, f, 0.0013333558146428441);
  p = fma(p, f, 0.009618129107628477);
  p = fma(p, f, 0.055504108664821576);
  p = fma(p, f, 0.2402265069591007);
  p = fma(p, f, 0.6931471805599453);
  p = fma(p, f, 1.0);
  const int n = __double2loint(t);
  const double y = __hiloint2double(__double2hiint(p) + static_cast<int>(static_cast<unsigned>(n) << 20), __double2loint(p));
  return x < -1022.0 ? 0.0 : y;  // also -inf and NaN-free: x = -inf gives 0
}

// Byte offset of 16-byte chunk `chunk` in a swizzled row whose (row & 7) << 4 is `x`.
// PLANTED FAULT (kBankConflicts): no XOR, rows are stored as they are.
template <int FAULT>
__device__ __forceinline__ uint32_t swz(int chunk, uint32_t x) {
  return FAULT == kBankConflicts ? (static_cast<uint32_t>(chunk) << 4) : ((static_cast<uint32_t>(chunk) << 4) ^ x);
}

__device__ __forceinline__ void st_shared_u32(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}

// cp.async ROWS rows [r0, r0 + ROWS) of a [S, D] matrix into a swizzled smem tile; rows >= S read as 0.
// Thread t always copies chunk t % CHUNKS of rows t / CHUNKS + i * RSTEP, so one global pointer, one
// smem address and immediates cover every pass (few registers: this runs inside the main loop).
template <class C, int ROWS, int FAULT, typename T>
__device__ __forceinline__ void load_rows(uint32_t s_base, const T* __restrict__ g, int r0, int S, int tid) {
  if constexpr (FAULT == kUncoalesced) {
    // PLANTED FAULT (kUncoalesced): lane i of a warp takes row (i % ROWS) and 4-byte word i / ROWS,
    // so one warp-wide load touches 32 rows (32 sectors for 128 useful bytes; a coalesced warp load
    // of 4-byte words needs 4). Plain loads, so the copy is also synchronous. Rows >= S read as 0.
    constexpr int WORDS = C::D / 2;  // 4-byte words (two 16-bit elements) per row
    static_assert(ROWS % 32 == 0, "a warp's 32 lanes take 32 different rows");
    for (int i = tid; i < ROWS * WORDS; i += C::THREADS) {
      const int r = i % ROWS;
      const int w = i / ROWS;
      uint32_t val = 0u;
      if (r0 + r < S) val = *reinterpret_cast<const uint32_t*>(g + static_cast<size_t>(r0 + r) * C::D + 2 * w);
      st_shared_u32(s_base + r * C::ROW_BYTES + swz<FAULT>(w >> 2, static_cast<uint32_t>((r & 7) << 4)) + 4 * (w & 3),
                    val);
    }
    return;
  }
  constexpr int RSTEP = C::THREADS / C::CHUNKS;  // rows per pass
  static_assert(C::THREADS % C::CHUNKS == 0 && ROWS % RSTEP == 0, "rows must split evenly into passes");
  const int rb = tid / C::CHUNKS;
  const int ch = tid % C::CHUNKS;
  const T* src = g + static_cast<size_t>(r0 + rb) * C::D + ch * 8;  // zero-fill passes never read it
  const uint32_t dst = s_base + rb * C::ROW_BYTES;
  const int rows_left = S - r0 - rb;
#pragma unroll
  for (int i = 0; i < ROWS / RSTEP; ++i) {
    // (row & 7) is rb & 7 on every pass when RSTEP is a multiple of 8 (D <= 128 with 128 threads).
    const int r7 = (RSTEP % 8 == 0) ? (rb & 7) : ((rb + i * RSTEP) & 7);
    cp_async_16(dst + i * RSTEP * C::ROW_BYTES + swz<FAULT>(ch, r7 << 4), src + i * RSTEP * C::D, i * RSTEP < rows_left);
  }
}

// ------------------------------------------------------------------------------------------------
// The kernel
// ------------------------------------------------------------------------------------------------
// PLANTED FAULT (kGlobalRmw): the warp's O accumulators stored to global memory and loaded back
// (cache-global: through L2), as a kernel keeping its running output in global memory would.
__device__ __forceinline__ void st_global_cg(float* p, float a, float b) {
  asm volatile("st.global.cg.v2.f32 [%0], {%1, %2};\n" ::"l"(p), "f"(a), "f"(b) : "memory");
}
__device__ __forceinline__ void ld_global_cg(const float* p, float& a, float& b) {
  asm volatile("ld.global.cg.v2.f32 {%0, %1}, [%2];\n" : "=f"(a), "=f"(b) : "l"(p) : "memory");
}
template <class C>
__device__ __forceinline__ void global_round_trip(float (&acc_o)[C::MT][C::DT][4], float* scratch, int bh, int row0,
                                                  int Sq, int lane) {
#pragma unroll
  for (int mt = 0; mt < C::MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = row0 + mt * 16 + (lane >> 2) + h * 8;
      if (row >= Sq) continue;
      float* base = scratch + (static_cast<size_t>(bh) * Sq + row) * C::D + 2 * (lane & 3);
#pragma unroll
      for (int dt = 0; dt < C::DT; ++dt) st_global_cg(base + dt * 8, acc_o[mt][dt][2 * h], acc_o[mt][dt][2 * h + 1]);
#pragma unroll
      for (int dt = 0; dt < C::DT; ++dt) ld_global_cg(base + dt * 8, acc_o[mt][dt][2 * h], acc_o[mt][dt][2 * h + 1]);
    }
}

template <typename T, class C, bool CAUSAL, int FAULT>
__global__ void __launch_bounds__(C::THREADS, FAULT == kSpills ? kSpillMinBlocks : C::MIN_BLOCKS)
planted_mma_fwd_kernel(const T* __restrict__ q,  // [B, H, Sq, D]
                   const T* __restrict__ k,  // [B, H, Sk, D]
                   const T* __restrict__ v,  // [B, H, Sk, D]
                   T* __restrict__ o,        // [B, H, Sq, D]
                   float* __restrict__ lse,  // [B, H, Sq]
                   int Sq, int Sk, float scale, float scale_log2,
                   float* __restrict__ scratch) {  // [B, H, Sq, D] fp32 for kGlobalRmw, else unused
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();  // cp.async, ldmatrix and bf16 mma need sm_80+; the launcher refuses older GPUs first
#else
  constexpr bool BF16 = std::is_same<T, __nv_bfloat16>::value;
  constexpr int D = C::D, BR = C::BR, BC = C::BC, MT = C::MT, NT = C::NT, DT = C::DT;
  constexpr int ROW_BYTES = C::ROW_BYTES;
  // PLANTED FAULT (kBarrier): the compute phases run in WARPS turns, one warp each.
  constexpr int TURNS = FAULT == kBarrier ? C::WARPS : 1;
  // PLANTED FAULT (kTf32Mma): S computed one m16 tile at a time (TF32 operands take twice the registers of
  // fp16 ones, and fa2_mma holds 255; see the turn loop below).
  constexpr int PARTS = FAULT == kTf32Mma ? C::MT : 1;
  extern __shared__ __align__(128) unsigned char smem[];

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  // PLANTED FAULT (kFewCtas) support: a block loops over query tiles blockIdx.x, blockIdx.x + gridDim.x, ...
  // With the normal grid (gridDim.x = query tiles) every block runs one iteration, as fa2_mma does.
  const int n_qt = (Sq + BR - 1) / BR;
  // PLANTED FAULT (kTranscendental) support: the softmax temperature, 1 / scale (dead code otherwise).
  const float temp = 1.f / scale;
  // PLANTED FAULT (kL2Thrash): the query tile is blockIdx.z and (h, b) are blockIdx.x, y.
  const int first = FAULT == kL2Thrash ? static_cast<int>(blockIdx.z) : static_cast<int>(blockIdx.x);
  const int stride = FAULT == kL2Thrash ? static_cast<int>(gridDim.z) : static_cast<int>(gridDim.x);
  for (int tile_i = first; tile_i < n_qt; tile_i += stride) {
    const int qt = CAUSAL ? n_qt - 1 - tile_i : tile_i;
    const int bh = FAULT == kL2Thrash ? static_cast<int>(blockIdx.y * gridDim.x + blockIdx.x)
                                      : static_cast<int>(blockIdx.z * gridDim.y + blockIdx.y);
    const int q0 = qt * BR;
    const int wrow0 = warp * MT * 16;  // first row of this warp inside the tile

    const T* qg = q + static_cast<size_t>(bh) * Sq * D;
    const T* kg = k + static_cast<size_t>(bh) * Sk * D;
    const T* vg = v + static_cast<size_t>(bh) * Sk * D;

    const uint32_t sQ = smem_u32(smem);
    const uint32_t sK = sQ + C::Q_BYTES;
    const uint32_t sV = sK + C::STAGES * C::KV_BYTES;

    int n_kv = (Sk + BC - 1) / BC;
    if (CAUSAL && FAULT != kNoCausalSkip) {  // PLANTED FAULT (kNoCausalSkip): no clipping
      const int last_row = min(q0 + BR, Sq) - 1;  // the block's last real query row sees keys <= last_row
      n_kv = min(n_kv, last_row / BC + 1);
    }

    // Prologue: Q, K[0], V[0] in three commit groups.
    load_rows<C, BR, FAULT>(sQ, qg, q0, Sq, tid);
    cp_async_commit();
    load_rows<C, BC, FAULT>(sK, kg, 0, Sk, tid);
    cp_async_commit();
    load_rows<C, BC, FAULT>(sV, vg, 0, Sk, tid);
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
    // PLANTED FAULT (kBankConflicts): no (row & 7) term, matching swz<kBankConflicts>.
    const int sw = FAULT == kBankConflicts ? 0 : lr;
    const uint32_t xa = static_cast<uint32_t>(((lane >> 4) ^ sw) << 4);         // Q and V
    const uint32_t xk = static_cast<uint32_t>(((((lane >> 3) & 1) ^ sw)) << 4);  // K
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
    // PLANTED FAULT (kFp64): the row sums are doubles.
    using StatT = std::conditional_t<FAULT == kFp64, double, float>;
    float row_m[MT][2];  // rows g and g+8 of each m16 tile; m on raw scores
    StatT row_l[MT][2];
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
      const int kv0 = j * BC;

      // K[j+1] goes into the stage K[j-1] used; every warp passed this iteration's PV barrier
      // of j-1 after its QKᵀ of j-1, so that stage is free.
      if (j + 1 < n_kv) load_rows<C, BC, FAULT>(sK + (stage ^ 1) * C::KV_BYTES, kg, kv0 + BC, Sk, tid);
      cp_async_commit();
      cp_async_wait<2>();  // all but {V[j], K[j+1]}: K[j] has landed
      __syncthreads();
      // V[j+1] goes into the stage V[j-1] used; the barrier above follows every warp's PV of j-1.
      if (j + 1 < n_kv) load_rows<C, BC, FAULT>(sV + (stage ^ 1) * C::KV_BYTES, vg, kv0 + BC, Sk, tid);
      cp_async_commit();

      // Causal: a warp whose rows all lie above this tile's first key (the block's last tile when
      // BR > BC) has nothing to add; it only takes part in the copies and barriers. Non-causal:
      // kv0 < Sk always holds here, but as a branch the compiler cannot remove it keeps QKᵀ/softmax
      // and PV in separate scheduling regions, which stops ptxas from interleaving them at the cost
      // of ~100 register moves and a spill per tile (seen in the SASS of the 128x64 D=128 config).
      // PLANTED FAULT (kNoCausalSkip): every warp computes every tile (the mask below zeroes them).
      const bool active = (CAUSAL && FAULT != kNoCausalSkip) ? kv0 <= q0 + wrow0 + MT * 16 - 1 : kv0 < Sk;
      uint32_t p_frag[MT][C::KP][4];
      // PLANTED FAULT (kBarrier): the block's warps take turns. In turn t only warp t computes its
      // QKᵀ and softmax (and, below, its PV) while the other warps wait at the block barrier that
      // ends the turn: WARPS turns and WARPS barriers per phase. Every warp runs every turn's barrier,
      // active or not (a warp above the causal diagonal just waits). Otherwise: one turn, every warp
      // in it, no barrier. Rolled, so that the phase's code is in the SASS once, as in the control.
#pragma unroll 1
      for (int turn = 0; turn < TURNS; ++turn) {
        if (active && (FAULT != kBarrier || warp == turn)) {
          // PLANTED FAULT (kTf32Mma) support: QKᵀ, mask, softmax and P in PARTS passes of MT / PARTS m16
          // tiles each (rows are independent: the order changes no value), so that one pass holds
          // MT / PARTS tiles of S; one pass, fa2_mma's order, for every other fault.
#pragma unroll
          for (int part = 0; part < PARTS; ++part) {
            const int m_lo = part * (MT / PARTS), m_hi = m_lo + MT / PARTS;
            // ---- S = Q Kᵀ (fp32) ----
            float acc_s[MT][NT][4];
#pragma unroll
            for (int mt = m_lo; mt < m_hi; ++mt)
#pragma unroll
              for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc_s[mt][nt][e] = 0.f;

#pragma unroll
            for (int ks = 0; ks < C::KQ && FAULT == kTf32Mma; ++ks) {
              // PLANTED FAULT (kTf32Mma): the same products on TF32, one m16 tile at a time (its A fragment
              // widened once, K's B fragments reloaded per m16 tile: fa2_mma holds 255 registers, and TF32
              // operands take twice the registers of fp16 ones)
#pragma unroll
              for (int mt = m_lo; mt < m_hi; ++mt) {
                uint32_t a[4];
                ldmatrix_x4(sQw + a_off[ks & 3] + (ks >> 2) * 128 + mt * 16 * ROW_BYTES, a);
                uint32_t aw[8];
#pragma unroll
                for (int i = 0; i < 4; ++i) widen2<BF16>(a[i], aw[2 * i], aw[2 * i + 1]);
#pragma unroll
                for (int np = 0; np < NT / 2; ++np) {
                  uint32_t b[4], bw[8];
                  ldmatrix_x4(sKs + k_off[ks & 3] + (ks >> 2) * 128 + np * 16 * ROW_BYTES, b);
#pragma unroll
                  for (int i = 0; i < 4; ++i) widen2<BF16>(b[i], bw[2 * i], bw[2 * i + 1]);
                  mma_tf32_k16(acc_s[mt][2 * np], aw, bw[0], bw[1], bw[2], bw[3]);
                  mma_tf32_k16(acc_s[mt][2 * np + 1], aw, bw[4], bw[5], bw[6], bw[7]);
                }
              }
            }
#pragma unroll
            for (int ks = 0; ks < C::KQ && FAULT != kTf32Mma; ++ks) {
              uint32_t a[MT][4];
#pragma unroll
              for (int mt = m_lo; mt < m_hi; ++mt) {
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
                for (int mt = m_lo; mt < m_hi; ++mt) {
                  mma_16816<BF16>(acc_s[mt][2 * np], a[mt], b[0], b[1]);
                  mma_16816<BF16>(acc_s[mt][2 * np + 1], a[mt], b[2], b[3]);
                }
              }
              if constexpr (FAULT == kFence) __threadfence();  // PLANTED FAULT (kFence)
            }

            // ---- mask: only the Sk tail tile and tiles crossing this warp's diagonal ----
            // Element (nt, e) of a row sits at key kv0 + 2*(lane&3) + nt*8 + e; it is visible iff
            // nt*8 + e <= lim, lim = min(Sk - 1, row) - kv0 - 2*(lane&3): one compare per element.
            if (kv0 + BC > Sk || (CAUSAL && kv0 + BC - 1 > q0 + wrow0)) {
#pragma unroll
              for (int mt = m_lo; mt < m_hi; ++mt)
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
            for (int mt = m_lo; mt < m_hi; ++mt)
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
              for (int mt = m_lo; mt < m_hi; ++mt) moved |= (mx[mt][0] != row_m[mt][0]) | (mx[mt][1] != row_m[mt][1]);
              rescale = __any_sync(0xffffffffu, moved);
            }
            // A row with every key so far masked keeps m = -inf; offset by 0 so that p = 0, not NaN.
            float base[MT][2];
#pragma unroll
            for (int mt = m_lo; mt < m_hi; ++mt)
#pragma unroll
              for (int h = 0; h < 2; ++h) base[mt][h] = (mx[mt][h] == -INFINITY) ? 0.f : mx[mt][h] * scale_log2;
            if (rescale) {
#pragma unroll
              for (int mt = m_lo; mt < m_hi; ++mt)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                  float alpha;
                  if constexpr (FAULT == kTranscendental) {
                    // PLANTED FAULT (kTranscendental): exp(scale * (m_old - m_new)) as an IEEE division by
                    // the temperature and an accurate expf, in natural units.
                    alpha = expf((row_m[mt][h] - (mx[mt][h] == -INFINITY ? 0.f : mx[mt][h])) / temp);
                  } else if constexpr (FAULT == kFp64) {
                    // PLANTED FAULT (kFp64): the rescale factor in double precision.
                    alpha = static_cast<float>(exp2_f64(static_cast<double>(row_m[mt][h]) * scale_log2 - base[mt][h]));
                  } else {
                    alpha = fast_exp2(row_m[mt][h] * scale_log2 - base[mt][h]);
                  }
                  row_l[mt][h] *= alpha;
#pragma unroll
                  for (int dt = 0; dt < DT; ++dt) {
                    acc_o[mt][dt][2 * h] *= alpha;
                    acc_o[mt][dt][2 * h + 1] *= alpha;
                  }
                }
            }
#pragma unroll
            for (int mt = m_lo; mt < m_hi; ++mt)
#pragma unroll
              for (int h = 0; h < 2; ++h) {
                row_m[mt][h] = mx[mt][h];
                StatT sum = 0.f;
#pragma unroll
                for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                  for (int e = 0; e < 2; ++e) {
                    const float s = acc_s[mt][nt][2 * h + e];
                    float p;
                    if constexpr (FAULT == kTranscendental) {
                      // PLANTED FAULT (kTranscendental): per score, an IEEE division by the temperature and
                      // an accurate expf instead of one FFMA with the folded scale and one ex2.approx.
                      p = expf((s - (mx[mt][h] == -INFINITY ? 0.f : mx[mt][h])) / temp);
                    } else if constexpr (FAULT == kFp64) {
                      // PLANTED FAULT (kFp64): per score, 2^x and the row sum in double.
                      const double pd = exp2_f64(static_cast<double>(fmaf(s, scale_log2, -base[mt][h])));
                      sum += pd;
                      p = static_cast<float>(pd);
                    } else {
                      p = fast_exp2(fmaf(s, scale_log2, -base[mt][h]));
                    }
                    acc_s[mt][nt][2 * h + e] = p;
                    if constexpr (FAULT != kFp64) sum += p;
                  }
                row_l[mt][h] += sum;
              }

            // P as the A fragments of PV: the C layout of n8 tiles 2kk, 2kk+1 is the A layout of k16 step kk.
#pragma unroll
            for (int mt = m_lo; mt < m_hi; ++mt)
#pragma unroll
              for (int kk = 0; kk < C::KP; ++kk) {
                p_frag[mt][kk][0] = pack2<BF16>(acc_s[mt][2 * kk][0], acc_s[mt][2 * kk][1]);
                p_frag[mt][kk][1] = pack2<BF16>(acc_s[mt][2 * kk][2], acc_s[mt][2 * kk][3]);
                p_frag[mt][kk][2] = pack2<BF16>(acc_s[mt][2 * kk + 1][0], acc_s[mt][2 * kk + 1][1]);
                p_frag[mt][kk][3] = pack2<BF16>(acc_s[mt][2 * kk + 1][2], acc_s[mt][2 * kk + 1][3]);
              }
          }
        }
        if constexpr (FAULT == kBarrier) __syncthreads();  // PLANTED FAULT (kBarrier): the turn's end
      }

      cp_async_wait<2>();  // all but {K[j+1], V[j+1]}: V[j] has landed
      __syncthreads();

      // PLANTED FAULT (kBarrier): PV in turns too.
#pragma unroll 1
      for (int turn = 0; turn < TURNS; ++turn) {
        if (active && (FAULT != kBarrier || warp == turn)) {
          // ---- O += P V ----
#pragma unroll
          for (int kk = 0; kk < C::KP; ++kk) {
#pragma unroll
            for (int dp = 0; dp < DT / 2; ++dp) {
              uint32_t b[4];
              ldmatrix_x4_trans(sVs + a_off[dp & 3] + (dp >> 2) * 128 + kk * 16 * ROW_BYTES, b);
#pragma unroll
              for (int mt = 0; mt < MT; ++mt) {
                if constexpr (FAULT == kTf32Mma) {  // PLANTED FAULT (kTf32Mma): the same products on TF32
                  uint32_t pw[8], bw[8];
#pragma unroll
                  for (int i = 0; i < 4; ++i) {
                    widen2<BF16>(p_frag[mt][kk][i], pw[2 * i], pw[2 * i + 1]);
                    widen2<BF16>(b[i], bw[2 * i], bw[2 * i + 1]);
                  }
                  mma_tf32_k16(acc_o[mt][2 * dp], pw, bw[0], bw[1], bw[2], bw[3]);
                  mma_tf32_k16(acc_o[mt][2 * dp + 1], pw, bw[4], bw[5], bw[6], bw[7]);
                } else {
                  mma_16816<BF16>(acc_o[mt][2 * dp], p_frag[mt][kk], b[0], b[1]);
                  mma_16816<BF16>(acc_o[mt][2 * dp + 1], p_frag[mt][kk], b[2], b[3]);
                }
              }
            }
            if constexpr (FAULT == kFence) __threadfence();  // PLANTED FAULT (kFence)
          }
          if constexpr (FAULT == kGlobalRmw) global_round_trip<C>(acc_o, scratch, bh, q0 + wrow0, Sq, lane);
        }
        if constexpr (FAULT == kBarrier) __syncthreads();  // PLANTED FAULT (kBarrier): the turn's end
      }
    }
    cp_async_wait<0>();

    // ---- epilogue: normalise, lse, stage O through this warp's own Q rows, 16-byte stores ----
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float l = static_cast<float>(row_l[mt][h]);
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        const float inv = l > 0.f ? 1.f / l : 0.f;
#pragma unroll
        for (int dt = 0; dt < DT; ++dt) {
          acc_o[mt][dt][2 * h] *= inv;
          acc_o[mt][dt][2 * h + 1] *= inv;
        }
        const int row = q0 + wrow0 + mt * 16 + (lane >> 2) + h * 8;
        if ((lane & 3) == 0 && row < Sq)
          lse[static_cast<size_t>(bh) * Sq + row] = l > 0.f ? row_m[mt][h] * scale + __logf(l) : -INFINITY;
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
          *reinterpret_cast<uint32_t*>(row_ptr + swz<FAULT>(dt, (lane >> 2) << 4)) =
              pack2<BF16>(acc_o[mt][dt][2 * h], acc_o[mt][dt][2 * h + 1]);
      }
    __syncwarp();
    T* og = o + static_cast<size_t>(bh) * Sq * D;
#pragma unroll
    for (int i = 0; i < MT * 16 * C::CHUNKS / 32; ++i) {
      const int idx = lane + 32 * i;
      const int r = wrow0 + idx / C::CHUNKS;
      const int ch = idx % C::CHUNKS;
      const uint4 val = *reinterpret_cast<const uint4*>(smem + r * ROW_BYTES + swz<FAULT>(ch, (r & 7) << 4));
      if (q0 + r < Sq) *reinterpret_cast<uint4*>(og + static_cast<size_t>(q0 + r) * D + ch * 8) = val;
    }
    __syncthreads();  // the next tile's prologue overwrites shared memory this tile's epilogue read
  }
#endif
}

// ------------------------------------------------------------------------------------------------
// Host side
// ------------------------------------------------------------------------------------------------
// Default configs per head dim (fa2_mma's).
using CfgD64 = MmaConfig<64, 128, 128, 4, false, 2>;
using CfgD128 = MmaConfig<128, 128, 64, 4, false, 2>;
// PLANTED FAULT (kSmallTile): fa2_mma's D=256 tile (64 query rows, 32 keys) at D=64 and D=128.
template <int D>
using CfgSmall = MmaConfig<D, 64, 32, 4, false, 2>;

struct Args {
  const void* q;
  const void* k;
  const void* v;
  void* o;
  float* lse;
  int B, H, Sq, Sk;
  float scale;
  cudaStream_t stream;
  float* scratch;  // [B, H, Sq, D] fp32: kGlobalRmw only
};

template <typename T, class C, bool CAUSAL, int FAULT>
cudaError_t launch(const Args& a, bool per_head) {
  auto kernel = planted_mma_fwd_kernel<T, C, CAUSAL, FAULT>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::SMEM_BYTES);
  if (err != cudaSuccess) return err;
  const int n_qt = (a.Sq + C::BR - 1) / C::BR;
  // PLANTED FAULT (kFewCtas): one block per (b, h), looping over the query tiles.
  // PLANTED FAULT (kL2Thrash): (H, B, query tiles), the query tile slowest.
  const dim3 grid = FAULT == kL2Thrash ? dim3(a.H, a.B, n_qt) : dim3(FAULT == kFewCtas ? 1 : n_qt, a.H, a.B);
  if (!per_head) {
    kernel<<<grid, C::THREADS, C::SMEM_BYTES, a.stream>>>(
        static_cast<const T*>(a.q), static_cast<const T*>(a.k), static_cast<const T*>(a.v), static_cast<T*>(a.o),
        a.lse, a.Sq, a.Sk, a.scale, a.scale * kLog2e, a.scratch);
    return cudaGetLastError();
  }
  // PLANTED FAULT (one launch per head): B*H launches of grid (query tiles, 1, 1), each on one
  // (b, h) slice of the tensors (the kernel sees bh = 0 and offset base pointers).
  for (int bh = 0; bh < a.B * a.H; ++bh) {
    const size_t q_off = static_cast<size_t>(bh) * a.Sq * C::D, kv_off = static_cast<size_t>(bh) * a.Sk * C::D;
    kernel<<<dim3(grid.x, 1, 1), C::THREADS, C::SMEM_BYTES, a.stream>>>(
        static_cast<const T*>(a.q) + q_off, static_cast<const T*>(a.k) + kv_off,
        static_cast<const T*>(a.v) + kv_off, static_cast<T*>(a.o) + q_off, a.lse + static_cast<size_t>(bh) * a.Sq,
        a.Sq, a.Sk, a.scale, a.scale * kLog2e, a.scratch ? a.scratch + static_cast<size_t>(bh) * a.Sq * C::D : nullptr);
    err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

// fp16 only (the planted scenario's dtype): half the instantiations of fa2_mma, half the compile time.
template <class C, int FAULT>
cudaError_t dispatch(const Args& a, bool causal, bool bf16, bool per_head) {
  if (bf16) return cudaErrorInvalidValue;
  return causal ? launch<__half, C, true, FAULT>(a, per_head) : launch<__half, C, false, FAULT>(a, per_head);
}

template <class C>
cudaError_t dispatch_fault(const Args& a, bool causal, bool bf16, int fault, bool per_head) {
  switch (fault) {
    case kClean: return dispatch<C, kClean>(a, causal, bf16, per_head);
    case kBankConflicts: return dispatch<C, kBankConflicts>(a, causal, bf16, per_head);
    case kSpills: return dispatch<C, kSpills>(a, causal, bf16, per_head);
    case kUncoalesced: return dispatch<C, kUncoalesced>(a, causal, bf16, per_head);
    case kNoCausalSkip: return dispatch<C, kNoCausalSkip>(a, causal, bf16, per_head);
    case kFewCtas: return dispatch<C, kFewCtas>(a, causal, bf16, per_head);
    case kBarrier: return dispatch<C, kBarrier>(a, causal, bf16, per_head);
    case kFence: return dispatch<C, kFence>(a, causal, bf16, per_head);
    case kTranscendental: return dispatch<C, kTranscendental>(a, causal, bf16, per_head);
    case kFp64: return dispatch<C, kFp64>(a, causal, bf16, per_head);
    case kL2Thrash: return per_head ? cudaErrorInvalidValue : dispatch<C, kL2Thrash>(a, causal, bf16, per_head);
    case kGlobalRmw: return a.scratch ? dispatch<C, kGlobalRmw>(a, causal, bf16, per_head) : cudaErrorInvalidValue;
    case kSmallTile: return dispatch<CfgSmall<C::D>, kSmallTile>(a, causal, bf16, per_head);
    case kTf32Mma: return dispatch<C, kTf32Mma>(a, causal, bf16, per_head);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace faprof_planted_mma

cudaError_t faprof_planted_mma_fwd(const void* q, const void* k, const void* v, void* o, float* lse, int B, int H,
                                   int Sq, int Sk, int D, float scale, bool causal, bool bf16, int fault,
                                   bool per_head, cudaStream_t stream, float* scratch) {
  using namespace faprof_planted_mma;
  const Args a{q, k, v, o, lse, B, H, Sq, Sk, scale, stream, scratch};
  if (D != 64 && D != 128) return cudaErrorInvalidValue;
  if (B <= 0 || H <= 0 || Sq <= 0 || Sk <= 0 || B > 65535 || H > 65535) return cudaErrorInvalidValue;
  if (!(scale > 0.f) || scale == INFINITY) return cudaErrorInvalidValue;
  const uintptr_t bits = reinterpret_cast<uintptr_t>(q) | reinterpret_cast<uintptr_t>(k) |
                         reinterpret_cast<uintptr_t>(v) | reinterpret_cast<uintptr_t>(o);
  if ((bits & 15u) != 0 || lse == nullptr) return cudaErrorInvalidValue;
  return D == 64 ? dispatch_fault<CfgD64>(a, causal, bf16, fault, per_head)
                 : dispatch_fault<CfgD128>(a, causal, bf16, fault, per_head);
}
