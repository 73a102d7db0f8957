// fa2_wmma.cu — FlashAttention-2 forward on tensor cores through nvcuda::wmma (16x16x16, fp32 accumulate).
//
// Work partition (FA2): grid = (query tiles, H, B); a block of 4 warps owns BR = 64 query rows, each
// warp 16 of them, and loops over BC-row K/V tiles; O never leaves the chip.
//
// The wmma accumulator layout is opaque, so the per-row softmax goes through a per-warp shared
// scratch: S = Q Kᵀ is stored as fp32 [16][BC], two lanes per row do the online softmax (fp32,
// exp2 with scale*log2e folded in) and write P in the input type, PV is accumulated 64 columns at
// a time into fresh fragments that are stored to the same scratch and added into O, which lives
// in registers with a known layout (lane owns row lane/2, columns [32*(lane&1), +32) of each
// 64-column chunk). Rescaling O by exp2(m_old - m_new) is then a plain per-lane multiply.
//
// Tiles are padded by 8 elements per row (16 bytes) so the 8 rows read by each wmma load phase fall
// in different banks. K[j] and V[j] are two cp.async groups: QKᵀ starts once K[j] has landed while V[j]
// is still in flight. Causal (top-left, as PyTorch SDPA is_causal): key tiles above the diagonal
// are skipped, the mask is applied only on tiles that cross it or the Sk tail, and query tiles run
// heaviest first. lse = m*scale + ln(l), fp32 [B, H, Sq]. Requires scale > 0 and 16-byte aligned
// pointers. D in {64, 128, 256}.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <cstdint>
#include <type_traits>

#include "faprof_kernels.h"

namespace faprof_fa2_wmma {

constexpr float kLog2e = 1.4426950408889634f;

/// Tile configuration; element counts unless *_BYTES.
// faprof:launch kernel=fa2_wmma_fwd_kernel D=A0 threads=128 dyn_smem=128*(A0+8)+4*A1*(A0+8)+4*(4352+32*(A1+8))
template <int D_, int BC_>
struct WmmaConfig {
  static constexpr int D = D_;          // head dim
  static constexpr int BR = 64;         // query rows per block (4 warps x 16)
  static constexpr int BC = BC_;        // key/value rows per tile
  static constexpr int WARPS = 4;
  static constexpr int THREADS = 32 * WARPS;
  static constexpr int LDH = D + 8;     // Q/K/V smem row pitch (elements): +16 B staggers banks
  static constexpr int LDS = BC + 4;    // fp32 S scratch pitch
  static constexpr int LDO = 64 + 4;    // fp32 PV chunk scratch pitch
  static constexpr int LDP = BC + 8;    // P scratch pitch (elements)
  static constexpr int OCH = D / 64;    // 64-column chunks of O
  static constexpr int SCR_F = 16 * (LDS > LDO ? LDS : LDO);  // floats: S and a PV chunk share it
  static constexpr int WARP_SCR_BYTES = SCR_F * 4 + 16 * LDP * 2;
  static constexpr int Q_BYTES = BR * LDH * 2;
  static constexpr int KV_BYTES = BC * LDH * 2;
  static constexpr int SMEM_BYTES = Q_BYTES + 2 * KV_BYTES + WARPS * WARP_SCR_BYTES;

  static_assert(D % 64 == 0, "O is handled in 64-column chunks");
  static_assert(BC % 32 == 0, "two lanes per row each take BC/2 columns, a multiple of 16");
  static_assert(LDH % 8 == 0 && LDP % 8 == 0 && LDS % 4 == 0 && LDO % 4 == 0,
                "wmma leading dimensions: multiples of 16 bytes");
  static_assert(Q_BYTES % 32 == 0 && KV_BYTES % 32 == 0 && WARP_SCR_BYTES % 32 == 0 && (SCR_F * 4) % 32 == 0,
                "wmma pointers must be 32-byte aligned");
  static_assert(SMEM_BYTES <= 99 * 1024, "must fit the opt-in shared memory of sm_86/sm_89 (99 KB)");
  static_assert(BC <= 64 && SMEM_BYTES == 128 * (D + 8) + 4 * BC * (D + 8) + 4 * (4352 + 32 * (BC + 8)),
                "keep the faprof:launch annotation above in step (it assumes BC <= 64)");
};

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool pred) {
  const int src_bytes = pred ? 16 : 0;  // 0: zero-fill, nothing read
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ __half from_float<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// cp.async rows [r0, r0 + ROWS) of a [S, D] matrix into a padded smem tile (pitch LDH); rows >= S read as 0.
template <class C, int ROWS, typename T>
__device__ __forceinline__ void load_rows(T* s, const T* __restrict__ g, int r0, int S, int tid) {
  constexpr int CHUNKS = C::D / 8;
  constexpr int RSTEP = C::THREADS / CHUNKS;
  static_assert(C::THREADS % CHUNKS == 0 && ROWS % RSTEP == 0, "rows must split evenly into passes");
  const int rb = tid / CHUNKS;
  const int ch = tid % CHUNKS;
  const T* src = g + static_cast<size_t>(r0 + rb) * C::D + ch * 8;
  const uint32_t dst = smem_u32(s + rb * C::LDH + ch * 8);
  const int rows_left = S - r0 - rb;
#pragma unroll
  for (int i = 0; i < ROWS / RSTEP; ++i)
    cp_async_16(dst + i * RSTEP * C::LDH * 2, src + i * RSTEP * C::D, i * RSTEP < rows_left);
}

template <typename T, class C, bool CAUSAL>
__global__ void __launch_bounds__(C::THREADS)
fa2_wmma_fwd_kernel(const T* __restrict__ q,  // [B, H, Sq, D]
                    const T* __restrict__ k,  // [B, H, Sk, D]
                    const T* __restrict__ v,  // [B, H, Sk, D]
                    T* __restrict__ o,        // [B, H, Sq, D]
                    float* __restrict__ lse,  // [B, H, Sq]
                    int Sq, int Sk, float scale, float scale_log2) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();  // cp.async, ldmatrix and bf16 mma need sm_80+; the launcher refuses older GPUs first
#else
  using namespace nvcuda;
  constexpr int D = C::D, BR = C::BR, BC = C::BC, LDH = C::LDH;
  extern __shared__ __align__(128) unsigned char smem[];
  T* sQ = reinterpret_cast<T*>(smem);
  T* sK = reinterpret_cast<T*>(smem + C::Q_BYTES);
  T* sV = reinterpret_cast<T*>(smem + C::Q_BYTES + C::KV_BYTES);

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  unsigned char* scr = smem + C::Q_BYTES + 2 * C::KV_BYTES + warp * C::WARP_SCR_BYTES;
  float* sS = reinterpret_cast<float*>(scr);                  // [16][LDS], then a PV chunk [16][LDO]
  T* sP = reinterpret_cast<T*>(scr + C::SCR_F * 4);           // [16][LDP]

  const int qt = CAUSAL ? static_cast<int>(gridDim.x - 1 - blockIdx.x) : static_cast<int>(blockIdx.x);
  const int bh = blockIdx.z * gridDim.y + blockIdx.y;
  const int q0 = qt * BR;
  const T* qg = q + static_cast<size_t>(bh) * Sq * D;
  const T* kg = k + static_cast<size_t>(bh) * Sk * D;
  const T* vg = v + static_cast<size_t>(bh) * Sk * D;

  int n_kv = (Sk + BC - 1) / BC;
  if (CAUSAL) n_kv = min(n_kv, (min(q0 + BR, Sq) - 1) / BC + 1);

  load_rows<C, BR>(sQ, qg, q0, Sq, tid);
  cp_async_commit();

  // Softmax / O ownership: lane -> row r of the warp's 16, half hf of the columns.
  const int r = lane >> 1;
  const int hf = lane & 1;
  const int row = q0 + warp * 16 + r;  // global query row
  float o_acc[C::OCH][32];
#pragma unroll
  for (int c = 0; c < C::OCH; ++c)
#pragma unroll
    for (int i = 0; i < 32; ++i) o_acc[c][i] = 0.f;
  float m_run = -INFINITY, l_run = 0.f;  // m on raw scores; l is this lane's partial sum

  for (int j = 0; j < n_kv; ++j) {
    const int kv0 = j * BC;
    __syncthreads();  // every warp is done with K[j-1] and V[j-1]
    load_rows<C, BC>(sK, kg, kv0, Sk, tid);
    cp_async_commit();
    load_rows<C, BC>(sV, vg, kv0, Sk, tid);
    cp_async_commit();
    cp_async_wait<1>();  // Q and K[j]
    __syncthreads();

    // ---- S = Q Kᵀ ----
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> s_frag[BC / 16];
#pragma unroll
    for (int n = 0; n < BC / 16; ++n) wmma::fill_fragment(s_frag[n], 0.f);
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a;
      wmma::load_matrix_sync(a, sQ + (warp * 16) * LDH + ks * 16, LDH);
#pragma unroll
      for (int n = 0; n < BC / 16; ++n) {
        // Kᵀ as a col-major 16x16 B: element (d, key) at sK[key * LDH + d].
        wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> b;
        wmma::load_matrix_sync(b, sK + (n * 16) * LDH + ks * 16, LDH);
        wmma::mma_sync(s_frag[n], a, b, s_frag[n]);
      }
    }
#pragma unroll
    for (int n = 0; n < BC / 16; ++n) wmma::store_matrix_sync(sS + n * 16, s_frag[n], C::LDS, wmma::mem_row_major);
    __syncwarp();

    // ---- online softmax on this lane's half row ----
    constexpr int HALF = BC / 2;
    float sv[HALF];
    const float* srow = sS + r * C::LDS + hf * HALF;
    const bool need_mask = (kv0 + BC > Sk) || (CAUSAL && kv0 + BC - 1 > q0 + warp * 16);
#pragma unroll
    for (int c = 0; c < HALF; c += 4) {
      const float4 t = *reinterpret_cast<const float4*>(srow + c);
      sv[c] = t.x;
      sv[c + 1] = t.y;
      sv[c + 2] = t.z;
      sv[c + 3] = t.w;
    }
    if (need_mask) {
#pragma unroll
      for (int c = 0; c < HALF; ++c) {
        const int key = kv0 + hf * HALF + c;
        if (key >= Sk || (CAUSAL && key > row)) sv[c] = -INFINITY;
      }
    }
    float mx = m_run;
#pragma unroll
    for (int c = 0; c < HALF; ++c) mx = fmaxf(mx, sv[c]);
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    const float base = (mx == -INFINITY) ? 0.f : mx * scale_log2;  // fully masked so far: p = 0, not NaN
    const float alpha = fast_exp2(m_run * scale_log2 - base);
    m_run = mx;
    float sum = 0.f;
    T* prow = sP + r * C::LDP + hf * HALF;
#pragma unroll
    for (int c = 0; c < HALF; ++c) {
      const float p = fast_exp2(fmaf(sv[c], scale_log2, -base));
      sum += p;
      prow[c] = from_float<T>(p);
    }
    l_run = l_run * alpha + sum;
#pragma unroll
    for (int c = 0; c < C::OCH; ++c)
#pragma unroll
      for (int i = 0; i < 32; ++i) o_acc[c][i] *= alpha;

    cp_async_wait<0>();  // V[j]
    __syncthreads();     // ... from every thread; also orders this warp's P writes before its reads

    // ---- O += P V, 64 columns at a time ----
#pragma unroll
    for (int c = 0; c < C::OCH; ++c) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> pv[4];
#pragma unroll
      for (int n = 0; n < 4; ++n) wmma::fill_fragment(pv[n], 0.f);
#pragma unroll
      for (int kk = 0; kk < BC / 16; ++kk) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> pa;
        wmma::load_matrix_sync(pa, sP + kk * 16, C::LDP);
#pragma unroll
        for (int n = 0; n < 4; ++n) {
          wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> vb;
          wmma::load_matrix_sync(vb, sV + (kk * 16) * LDH + c * 64 + n * 16, LDH);
          wmma::mma_sync(pv[n], pa, vb, pv[n]);
        }
      }
#pragma unroll
      for (int n = 0; n < 4; ++n) wmma::store_matrix_sync(sS + n * 16, pv[n], C::LDO, wmma::mem_row_major);
      __syncwarp();
      const float* orow = sS + r * C::LDO + hf * 32;
#pragma unroll
      for (int i = 0; i < 32; i += 4) {
        const float4 t = *reinterpret_cast<const float4*>(orow + i);
        o_acc[c][i] += t.x;
        o_acc[c][i + 1] += t.y;
        o_acc[c][i + 2] += t.z;
        o_acc[c][i + 3] += t.w;
      }
      __syncwarp();  // the next chunk (or tile) overwrites the scratch
    }
  }

  // ---- epilogue ----
  const float l = l_run + __shfl_xor_sync(0xffffffffu, l_run, 1);
  const float inv = l > 0.f ? 1.f / l : 0.f;
  if (row < Sq) {
    T* orow = o + (static_cast<size_t>(bh) * Sq + row) * D + hf * 32;
#pragma unroll
    for (int c = 0; c < C::OCH; ++c)
#pragma unroll
      for (int i = 0; i < 32; i += 8) {
        alignas(16) T pk[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) pk[e] = from_float<T>(o_acc[c][i + e] * inv);
        *reinterpret_cast<uint4*>(orow + c * 64 + i) = *reinterpret_cast<const uint4*>(pk);
      }
    if (hf == 0) lse[static_cast<size_t>(bh) * Sq + row] = l > 0.f ? m_run * scale + __logf(l) : -INFINITY;
  }
#endif
}

using CfgD64 = WmmaConfig<64, 64>;
using CfgD128 = WmmaConfig<128, 64>;
using CfgD256 = WmmaConfig<256, 32>;

template <typename T, class C, bool CAUSAL>
cudaError_t launch(const void* q, const void* k, const void* v, void* o, float* lse, int B, int H, int Sq, int Sk,
                   float scale, cudaStream_t stream) {
  auto kernel = fa2_wmma_fwd_kernel<T, C, CAUSAL>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::SMEM_BYTES);
  if (err != cudaSuccess) return err;
  const dim3 grid((Sq + C::BR - 1) / C::BR, H, B);
  kernel<<<grid, C::THREADS, C::SMEM_BYTES, stream>>>(static_cast<const T*>(q), static_cast<const T*>(k),
                                                     static_cast<const T*>(v), static_cast<T*>(o), lse, Sq, Sk,
                                                     scale, scale * kLog2e);
  return cudaGetLastError();
}

template <class C>
cudaError_t dispatch(const void* q, const void* k, const void* v, void* o, float* lse, int B, int H, int Sq, int Sk,
                     float scale, bool causal, bool bf16, cudaStream_t stream) {
  if (bf16)
    return causal ? launch<__nv_bfloat16, C, true>(q, k, v, o, lse, B, H, Sq, Sk, scale, stream)
                  : launch<__nv_bfloat16, C, false>(q, k, v, o, lse, B, H, Sq, Sk, scale, stream);
  return causal ? launch<__half, C, true>(q, k, v, o, lse, B, H, Sq, Sk, scale, stream)
                : launch<__half, C, false>(q, k, v, o, lse, B, H, Sq, Sk, scale, stream);
}

}  // namespace faprof_fa2_wmma

/// FlashAttention-2 forward with nvcuda::wmma. q [B,H,Sq,D], k/v [B,H,Sk,D], o [B,H,Sq,D] (fp16 or
/// bf16, contiguous), lse [B,H,Sq] fp32. D in {64, 128, 256}; anything else returns cudaErrorInvalidValue.
cudaError_t faprof_fa2_wmma_fwd(const void* q, const void* k, const void* v, void* o, float* lse, int B, int H,
                                int Sq, int Sk, int D, float scale, bool causal, bool bf16, cudaStream_t stream) {
  using namespace faprof_fa2_wmma;
  if (D != 64 && D != 128 && D != 256) return cudaErrorInvalidValue;
  if (B < 0 || H < 0 || Sq < 0 || Sk < 0) return cudaErrorInvalidValue;
  if (B == 0 || H == 0 || Sq == 0) return cudaSuccess;
  if (Sk == 0 || !(scale > 0.f) || scale == INFINITY || B > 65535 || H > 65535 || lse == nullptr)
    return cudaErrorInvalidValue;
  const uintptr_t bits = reinterpret_cast<uintptr_t>(q) | reinterpret_cast<uintptr_t>(k) |
                         reinterpret_cast<uintptr_t>(v) | reinterpret_cast<uintptr_t>(o);
  if ((bits & 15u) != 0) return cudaErrorInvalidValue;
  int dev = 0, major = 0;  // cp.async and bf16 wmma exist from sm_80 on (older GPUs get a trapping stub)
  cudaError_t err = cudaGetDevice(&dev);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  if (err != cudaSuccess) return err;
  if (major < 8) return cudaErrorNotSupported;
  switch (D) {
    case 64:
      return dispatch<CfgD64>(q, k, v, o, lse, B, H, Sq, Sk, scale, causal, bf16, stream);
    case 128:
      return dispatch<CfgD128>(q, k, v, o, lse, B, H, Sq, Sk, scale, causal, bf16, stream);
    default:
      return dispatch<CfgD256>(q, k, v, o, lse, B, H, Sq, Sk, scale, causal, bf16, stream);
  }
}

#ifdef FAPROF_TC_CTYPES
extern "C" int faprof_tc_wmma_fwd(const void* q, const void* k, const void* v, void* o, float* lse, int B, int H,
                                  int Sq, int Sk, int D, float scale, int causal, int bf16, void* stream) {
  return faprof_fa2_wmma_fwd(q, k, v, o, lse, B, H, Sq, Sk, D, scale, causal != 0, bf16 != 0,
                             static_cast<cudaStream_t>(stream));
}
#endif
