// fa3_bwd_pre.cu — the small kernels around the Hopper backward steps (kernels/fa3_bwd_a.cu,
// fa3_bwd_b.cu; issue 28), plain CUDA that runs on any architecture:
//   * fa3_bwd_preprocess_kernel: delta = rowsum(dO ∘ O) and lse2 = lse·log2e into [B·H, Sq_pad]
//     workspaces (Sq rounded up to kSeqPad, so that the main kernels copy whole query tiles of them
//     with aligned 16-byte transfers and no bounds checks). Padding rows get delta = 0 and
//     lse2 = +inf (exp2(s − inf) = 0); a row whose lse is −inf (no visible key; the fa3 forward writes
//     that for an empty row) also gets +inf, so that its P is 0 rather than inf·0;
//   * fa3_bwd_convert_kernel: dq = dq_accum · scale in fp16/bf16, four elements a thread.
// The launchers also zero dq_accum (cudaMemsetAsync) before the main kernel adds into it.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "fa3_bwd.cuh"

namespace faprof_fa3_bwd {

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

// One warp per padded row (b·h, i), i < Sq_pad; 8 rows per 256-thread block.
// faprof:launch kernel=fa3_bwd_preprocess_kernel threads=256 dyn_smem=0
template <typename T, int D>
__global__ void __launch_bounds__(256)
fa3_bwd_preprocess_kernel(const T* __restrict__ o,       // [B·H, Sq, D]
                          const T* __restrict__ dout,    // [B·H, Sq, D]
                          const float* __restrict__ lse, // [B·H, Sq]
                          float* __restrict__ lse2,      // [B·H, Sq_pad]
                          float* __restrict__ delta,     // [B·H, Sq_pad]
                          int Sq, int Sq_pad, long long rows) {
  const long long row = static_cast<long long>(blockIdx.x) * 8 + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const long long bh = row / Sq_pad;
  const int i = static_cast<int>(row - bh * Sq_pad);
  if (i >= Sq) {
    if (lane == 0) {
      lse2[row] = INFINITY;
      delta[row] = 0.f;
    }
    return;
  }
  const long long src = bh * Sq + i;
  const uint32_t* o2 = reinterpret_cast<const uint32_t*>(o + src * D);
  const uint32_t* g2 = reinterpret_cast<const uint32_t*>(dout + src * D);
  float acc = 0.f;
#pragma unroll
  for (int c = lane; c < D / 2; c += 32) {
    const float2 a = to_float2<T>(o2[c]);
    const float2 b = to_float2<T>(g2[c]);
    acc = fmaf(a.x, b.x, fmaf(a.y, b.y, acc));
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (lane == 0) {
    const float l = lse[src];
    lse2[row] = l == -INFINITY ? INFINITY : l * kLog2e;
    delta[row] = acc;
  }
}

// dq = dq_accum · scale, rounded to T; four elements per thread and step (n is a multiple of 64).
// faprof:launch kernel=fa3_bwd_convert_kernel threads=256 dyn_smem=0
template <typename T>
__global__ void __launch_bounds__(256)
fa3_bwd_convert_kernel(const float* __restrict__ acc, T* __restrict__ dq, long long n, float scale) {
  constexpr bool BF16 = std::is_same<T, __nv_bfloat16>::value;
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; 4 * i < n; i += stride) {
    const float4 a = reinterpret_cast<const float4*>(acc)[i];
    uint2 r;
    r.x = pack2<BF16>(a.x * scale, a.y * scale);
    r.y = pack2<BF16>(a.z * scale, a.w * scale);
    reinterpret_cast<uint2*>(dq)[i] = r;
  }
}

template <typename T, int D>
cudaError_t preprocess_t(const BwdArgs& a) {
  const int Sq_pad = padded_seq(a.Sq);
  const long long rows = static_cast<long long>(a.B) * a.H * Sq_pad;
  fa3_bwd_preprocess_kernel<T, D><<<static_cast<unsigned>((rows + 7) / 8), 256, 0, a.stream>>>(
      static_cast<const T*>(a.o), static_cast<const T*>(a.dout), a.lse, a.lse2, a.delta, a.Sq, Sq_pad, rows);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  const size_t n = static_cast<size_t>(a.B) * a.H * a.Sq * a.D;
  return cudaMemsetAsync(a.dq_accum, 0, n * sizeof(float), a.stream);
}

cudaError_t preprocess(const BwdArgs& a) {
  if (a.bf16) return a.D == 64 ? preprocess_t<__nv_bfloat16, 64>(a) : preprocess_t<__nv_bfloat16, 128>(a);
  return a.D == 64 ? preprocess_t<__half, 64>(a) : preprocess_t<__half, 128>(a);
}

template <typename T>
cudaError_t convert_t(const BwdArgs& a) {
  const long long n = static_cast<long long>(a.B) * a.H * a.Sq * a.D;
  const long long quads = n / 4;
  const unsigned blocks = static_cast<unsigned>(quads / 256 + 1 < 65536 ? quads / 256 + 1 : 65536);
  fa3_bwd_convert_kernel<T><<<blocks, 256, 0, a.stream>>>(a.dq_accum, static_cast<T*>(a.dq), n, a.scale);
  return cudaGetLastError();
}

cudaError_t convert_dq(const BwdArgs& a) { return a.bf16 ? convert_t<__nv_bfloat16>(a) : convert_t<__half>(a); }

}  // namespace faprof_fa3_bwd
