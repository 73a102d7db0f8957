// TEST ONLY: a planted wrong kernel (tests/test_wrong_gpu.py). A copy of examples/kernels/simple_attn.cu
// (a small, correct attention forward kernel) with one bug, marked PLANTED BUG: the inputs' (b, h)
// offset drops the batch index (the row offset of the Triton kernel caught in issue 25), so every
// batch reads batch 0's Q, K and V and writes batch 0's answer into its own output.
//
//   faprof profile --kernel tests/wrong/kernels/wrong_batch_offset.cu:wrong_batch_offset --scenario smoke
#include "faprof_attention.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

FAPROF_KERNEL_INFO("dtypes=fp16,bf16,fp32;head_dims=16,32,64,96,128;compute=cuda_core");

namespace {

constexpr int kWarps = 4;          // query rows per block
constexpr int kTileK = 32;         // keys staged per step
constexpr int kMaxD = 128;         // largest head dim
constexpr int kPerLane = kMaxD / 32;

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_f32<__half>(float x) { return __float2half(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) { return __float2bfloat16(x); }

template <typename T>
__global__ void __launch_bounds__(kWarps * 32)
wrong_batch_offset_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                          T* __restrict__ out, float* __restrict__ lse, int H, int Sq, int Sk, int D, float scale,
                          int causal) {
    __shared__ float ks[kTileK][kMaxD];
    __shared__ float vs[kTileK][kMaxD];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const long long bh = blockIdx.y;
    const long long src = blockIdx.y % H;  // PLANTED BUG: should be bh (b * H + h); the batch index is dropped
    const int row = blockIdx.x * kWarps + warp;  // query row of this warp (may be past Sq)
    const bool active = row < Sq;
    const T* qrow = q + (src * Sq + (active ? row : 0)) * D;  // PLANTED BUG: src, not bh
    const T* kbh = k + src * Sk * D;                          // PLANTED BUG: src, not bh
    const T* vbh = v + src * Sk * D;                          // PLANTED BUG: src, not bh

    float qr[kPerLane], acc[kPerLane];
    for (int i = 0; i < kPerLane; ++i) {
        const int d = lane + 32 * i;
        qr[i] = (active && d < D) ? to_f32(qrow[d]) * scale : 0.f;
        acc[i] = 0.f;
    }
    float m = -INFINITY, l = 0.f;
    // Keys this block needs: all of them, or up to its last row when causal.
    const int last_row = min(Sq - 1, (int)blockIdx.x * kWarps + kWarps - 1);
    const int k_end = causal ? min(Sk, last_row + 1) : Sk;
    const int row_end = causal ? min(Sk, row + 1) : Sk;  // keys this row sees

    for (int k0 = 0; k0 < k_end; k0 += kTileK) {
        const int n = min(kTileK, k_end - k0);
        __syncthreads();  // the previous tile is no longer read
        for (int i = threadIdx.x; i < n * D; i += blockDim.x) {
            const int j = i / D, d = i % D;
            ks[j][d] = to_f32(kbh[(long long)(k0 + j) * D + d]);
            vs[j][d] = to_f32(vbh[(long long)(k0 + j) * D + d]);
        }
        __syncthreads();
        if (!active) continue;
        const int jn = min(n, row_end - k0);
        for (int j = 0; j < jn; ++j) {
            float s = 0.f;
            for (int i = 0; i < kPerLane; ++i) {
                const int d = lane + 32 * i;
                if (d < D) s += qr[i] * ks[j][d];
            }
            for (int off = 16; off > 0; off /= 2) s += __shfl_xor_sync(0xffffffffu, s, off);
            const float m_new = fmaxf(m, s);
            const float corr = expf(m - m_new);  // 0 on the first key (m = -inf)
            const float p = expf(s - m_new);
            l = l * corr + p;
            for (int i = 0; i < kPerLane; ++i) {
                const int d = lane + 32 * i;
                if (d < D) acc[i] = acc[i] * corr + p * vs[j][d];
            }
            m = m_new;
        }
    }
    if (!active) return;
    T* orow = out + (bh * Sq + row) * D;
    const float inv = l > 0.f ? 1.f / l : 0.f;  // a row that sees no key gets zeros, as SDPA
    for (int i = 0; i < kPerLane; ++i) {
        const int d = lane + 32 * i;
        if (d < D) orow[d] = from_f32<T>(acc[i] * inv);
    }
    if (lse != nullptr && lane == 0) lse[bh * Sq + row] = l > 0.f ? m + logf(l) : -INFINITY;
}

template <typename T>
cudaError_t launch(const void* q, const void* k, const void* v, void* out, float* lse, int B, int H,
                   int Sq, int Sk, int D, float scale, int causal, cudaStream_t stream) {
    dim3 grid((Sq + kWarps - 1) / kWarps, B * H);
    wrong_batch_offset_kernel<T><<<grid, kWarps * 32, 0, stream>>>(
        static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v), static_cast<T*>(out),
        lse, H, Sq, Sk, D, scale, causal);
    return cudaGetLastError();
}

}  // namespace

extern "C" FAPROF_LAUNCHER(wrong_batch_offset) {
    if (D < 1 || D > kMaxD || B < 1 || H < 1 || Sq < 1 || Sk < 1 || B * H > 65535) return cudaErrorInvalidValue;
    switch (dtype) {
        case FAPROF_FP16: return launch<__half>(q, k, v, out, lse, B, H, Sq, Sk, D, scale, causal, stream);
        case FAPROF_BF16: return launch<__nv_bfloat16>(q, k, v, out, lse, B, H, Sq, Sk, D, scale, causal, stream);
        case FAPROF_FP32: return launch<float>(q, k, v, out, lse, B, H, Sq, Sk, D, scale, causal, stream);
        default: return cudaErrorInvalidValue;
    }
}
