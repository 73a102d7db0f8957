// fa3_fwd.cuh — what the fa3 forward steps share beyond the wgmma building blocks of
// fa3_common.cuh: the tile configuration, the per-warpgroup row state and epilogue, the
// mbarrier / TMA helpers, and the host side (arguments, tensor maps, validation). Included by
// kernels/fa3_wgmma.cu (steps a, b) and kernels/fa3_wgmma_ws.cu (steps c, d, e); moved here
// unchanged from fa3_wgmma.cu when the warp-specialized steps got their own file.
#pragma once

#include <cuda.h>  // CUtensorMap and its enums (types only: the encoder comes from the runtime)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled_v12000

#include <cstdint>
#include <type_traits>

#include "fa3_common.cuh"

namespace faprof_fa3 {

constexpr float kLog2e = 1.4426950408889634f;

template <int D_, int BC_, int NWG_, int STAGES_>
struct Config {
  static constexpr int D = D_;         // head dim: N of PV, K of QKᵀ
  static constexpr int BC = BC_;       // keys per K/V tile: N of QKᵀ, K of PV
  static constexpr int NWG = NWG_;     // warpgroups per block, 64 query rows each
  static constexpr int STAGES = STAGES_;  // K/V tiles in shared memory (cp.async or TMA ring)
  static constexpr int BR = 64 * NWG;  // query rows per block
  static constexpr int THREADS = 128 * NWG;
  static constexpr int NT = BC / 8;    // n8 column tiles of S in a thread's fragment
  static constexpr int DT = D / 8;     // n8 column tiles of O
  static constexpr int KQ = D / 16;    // k16 steps of QKᵀ
  static constexpr int KP = BC / 16;   // k16 steps of PV
  static constexpr int Q_BYTES = BR * D * 2;
  static constexpr int KV_BYTES = BC * D * 2;
  static constexpr int TILE_BYTES = Q_BYTES + 2 * STAGES * KV_BYTES;
  static constexpr int SMEM_BYTES = TILE_BYTES + 1024;  // + slack to align the tiles to 1024 bytes
  static constexpr int BAR_BYTES = 64;                  // step (b): mbarriers after the tiles

  static_assert(D == 64 || D == 128, "wgmma wrappers exist for N = 64 and 128 (PV's N is D)");
  static_assert(BC == 64 || BC == 128, "wgmma wrappers exist for N = 64 and 128 (QKᵀ's N is BC)");
  static_assert(STAGES >= 2 && 8 * (1 + 2 * STAGES) <= BAR_BYTES, "2+ stages, barriers must fit BAR_BYTES");
  static_assert(SMEM_BYTES + BAR_BYTES <= 227 * 1024, "exceeds the largest opt-in shared memory per block");
  static_assert(SMEM_BYTES == 2 * D * (64 * NWG + 2 * STAGES * BC) + 1024, "keep the faprof:launch lines in step");
};

#if FAPROF_SM90A
// Per-thread state of one warpgroup's 64 rows: the O accumulator and rows g, g + 8 of the warp.
template <class C>
struct RowState {
  float acc_o[C::D / 2];
  float row_m[2];  // running max of raw scores (-inf: no key seen yet)
  float row_l[2];  // running sum of exp2 terms, per thread (quad-reduced at the end)

  __device__ __forceinline__ void init() {
#pragma unroll
    for (int i = 0; i < C::D / 2; ++i) acc_o[i] = 0.f;
    row_m[0] = row_m[1] = -INFINITY;
    row_l[0] = row_l[1] = 0.f;
  }
};

// Normalise, write lse, stage O through the warp's own Q rows (`smem`: the block's Q tile, whose
// rows this warp's warpgroup last read through wgmmas that have completed) and store 16 bytes a lane.
template <typename T, class C>
__device__ __forceinline__ void epilogue(RowState<C>& st, unsigned char* smem, T* og, float* lse_bh, int q0,
                                         int r_tile, int Sq, int g, int t, int lane, float scale,
                                         int o_stride = C::D) {  // elements between rows of O (varlen: H·D)
  constexpr bool BF16 = std::is_same<T, __nv_bfloat16>::value;
  constexpr int D = C::D, BR = C::BR, DT = C::DT;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float l = st.row_l[h];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const float inv = l > 0.f ? 1.f / l : 0.f;
#pragma unroll
    for (int dt = 0; dt < DT; ++dt) {
      st.acc_o[4 * dt + 2 * h] *= inv;
      st.acc_o[4 * dt + 2 * h + 1] *= inv;
    }
    const int row = q0 + r_tile + g + 8 * h;
    if (t == 0 && row < Sq) lse_bh[row] = l > 0.f ? st.row_m[h] * scale + __logf(l) : -INFINITY;
  }
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int dt = 0; dt < DT; ++dt)
      *reinterpret_cast<uint32_t*>(smem + sw128_offset(BR, r_tile + g + 8 * h, 8 * dt + 2 * t)) =
          pack2<BF16>(st.acc_o[4 * dt + 2 * h], st.acc_o[4 * dt + 2 * h + 1]);
  __syncwarp();
#pragma unroll
  for (int i = 0; i < 16 * (D / 8) / 32; ++i) {
    const int idx = lane + 32 * i;
    const int r = r_tile + idx / (D / 8);
    const int c = (idx % (D / 8)) * 8;
    const uint4 val = *reinterpret_cast<const uint4*>(smem + sw128_offset(BR, r, c));
    if (q0 + r < Sq) *reinterpret_cast<uint4*>(og + static_cast<size_t>(q0 + r) * o_stride + c) = val;
  }
}
#endif  // FAPROF_SM90A

#if FAPROF_SM90A
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// One arrival that also announces `bytes` of TMA transactions this phase must see complete.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}
// TMA: the box at (c0, c1, c2) of a 3-D tensor map into shared memory, completing on `bar`.
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const CUtensorMap* map, int c0, int c1, int c2,
                                            uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
}
// A ROWS x D tile = D/64 boxes of [ROWS rows][64 columns], one per SW128 column block.
template <int ROWS, int D>
__device__ __forceinline__ void tma_tile(uint32_t dst, const CUtensorMap* map, int row0, int bh, uint32_t bar) {
#pragma unroll
  for (int b = 0; b < D / 64; ++b) tma_load_3d(dst + b * ROWS * 128, map, 64 * b, row0, bh, bar);
}
#endif

// The problems beyond 2022's that step (e) runs (fa3_wgmma_ws.cu's GEN instantiation): GQA and the
// mask rule of faprof/model/mask.py, dense layout.
struct Fa3Gen {
  int group;         // query heads per KV head: query head h reads KV head h / group
  int Hkv;           // KV heads (the K/V tensor maps cover B·Hkv planes)
  int left, right;   // window: keys before / after the diagonal a query sees (-1: unbounded)
  int bottom_right;  // 1: the diagonal is offset by Sk - Sq
  const int* cu_q;   // varlen: int32 [B + 1] starts of each sequence's rows in q/o; null: dense
  const int* cu_k;   // varlen: int32 [B + 1] starts in k/v
  int total_q;       // varlen: rows of q (lse is [H, total_q])
  int total_k;       // varlen: rows of k and v
};

// The keys query row i sees: [lo(i), hi(i)] (hi < lo: none). Both bounds are nondecreasing in i, so
// rows [r0, r1] see keys in [lo(r0), hi(r1)], and each of them sees all of [lo(r1), hi(r0)].
template <bool CAUSAL>
struct KeyRange {
  int off, sk, left, right;
  __host__ __device__ __forceinline__ int hi(int i) const {
    int h = sk - 1;
    if (CAUSAL) h = h < i + off ? h : i + off;
    if (right >= 0) h = h < i + off + right ? h : i + off + right;
    return h;
  }
  __host__ __device__ __forceinline__ int lo(int i) const {
    return left >= 0 ? (i + off - left > 0 ? i + off - left : 0) : 0;
  }
};

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

// cuTensorMapEncodeTiled through the runtime's driver entry point (no -lcuda link); null if absent.
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess)
      p = nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

// A 3-D map over a contiguous [BH, S, D] fp16/bf16 tensor: dims innermost first (D, S, BH), boxes
// of [rows][64] elements (128 bytes, the most a 128-byte swizzle allows), zero fill past S.
inline cudaError_t make_map(CUtensorMap* map, const void* base, bool bf16, int BH, int S, int D, int rows) {
  auto encode = tensor_map_encoder();
  if (encode == nullptr) return cudaErrorNotSupported;
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(D), static_cast<cuuint64_t>(S), static_cast<cuuint64_t>(BH)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(D) * 2, static_cast<cuuint64_t>(S) * D * 2};  // bytes
  const cuuint32_t box[3] = {64, static_cast<cuuint32_t>(rows), 1};
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  const CUresult r = encode(map, bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 3,
                            const_cast<void*>(base), dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                            CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

// A 3-D map over a packed [total, heads, D] tensor (varlen): dims innermost first (D, total, heads),
// so that coordinate (64·c, row, head) is the row-th token's head `head`; boxes of [rows][64].
// Rows past `total` are zero-filled; rows of the next sequence are read and masked by the kernel.
inline cudaError_t make_map_packed(CUtensorMap* map, const void* base, bool bf16, int total, int heads, int D,
                                   int rows) {
  auto encode = tensor_map_encoder();
  if (encode == nullptr) return cudaErrorNotSupported;
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(D), static_cast<cuuint64_t>(total),
                              static_cast<cuuint64_t>(heads)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(heads) * D * 2, static_cast<cuuint64_t>(D) * 2};  // bytes
  const cuuint32_t box[3] = {64, static_cast<cuuint32_t>(rows), 1};
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  const CUresult r = encode(map, bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 3,
                            const_cast<void*>(base), dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                            CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
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
  if (a.Sk == 0) return cudaErrorInvalidValue;                                // softmax over no keys
  if (!(a.scale > 0.f) || a.scale == INFINITY) return cudaErrorInvalidValue;  // raw-score running max
  if (a.B > 65535 || a.H > 65535) return cudaErrorInvalidValue;              // grid.z / grid.y limits
  const uintptr_t bits = reinterpret_cast<uintptr_t>(a.q) | reinterpret_cast<uintptr_t>(a.k) |
                         reinterpret_cast<uintptr_t>(a.v) | reinterpret_cast<uintptr_t>(a.o);
  if ((bits & 15u) != 0 || a.lse == nullptr) return cudaErrorInvalidValue;  // 16-byte copies / TMA / stores
  return require_sm90a();
}

#if FAPROF_SM90A
// One plain arrival (no transaction bytes): a consumer warpgroup hands a stage back.
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Named barriers 1.. (0 is __syncthreads): `sync` waits until `threads` threads arrived or synced,
// `arrive` counts this warp's threads without waiting.
__device__ __forceinline__ void named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// Pins A-fragment registers that an in-flight RS wgmma still reads (see fence_regs).
template <int M, int N>
__device__ __forceinline__ void fence_regs_u(uint32_t (&r)[M][N]) {
#pragma unroll
  for (int i = 0; i < M; ++i)
#pragma unroll
    for (int k = 0; k < N; ++k) asm volatile("" : "+r"(r[i][k])::"memory");
}
#endif  // FAPROF_SM90A

}  // namespace faprof_fa3
