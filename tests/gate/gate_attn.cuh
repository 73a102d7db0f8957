// TEST ONLY: the kernel behind `faprof gate`'s GPU check (scripts/gpu/gpu_gate_check.sh, tests/test_gate_kernels.py).
//
// gate_attn.cu and gate_attn_slow.cu both launch the kernel below; they differ in one runtime
// argument, `extra_every`. With 0 (gate_attn.cu) the kernel is a plain attention forward; with
// k > 0 (gate_attn_slow.cu) every k-th K/V tile is processed a second time, into an accumulator
// that is thrown away. The second pass repeats the tile's whole per-key work (q.k with a warp
// reduction, the exponential, the P.V update), so the slow copy does about 1/k more of that work
// and nothing else changes: the same machine code (registers, shared memory, grid and block are
// identical; the extra pass is a branch taken at run time), the same output bit for bit. It is an
// honest few-percent regression whose cause ncu can see: more instructions, FLOPs and
// shared-memory reads per call, a longer kernel.
//
// The algorithm is the one of examples/kernels/simple_attn.cu (checked on the H100): one block per
// (4 query rows, b*h), one warp per query row, K and V staged in shared memory 32 keys at a time
// as fp32, online softmax, fp32 accumulation; fp16, bf16 or fp32 in; D <= 128; causal is
// SDPA's top-left is_causal. Written for clarity, not speed.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace gate {

constexpr int kWarps = 4;           // query rows per block, one per warp
constexpr int kTileK = 32;          // keys staged in shared memory per step
constexpr int kMaxD = 128;          // largest head dim
constexpr int kPerLane = kMaxD / 32;  // head-dim elements each lane holds
static_assert(kMaxD % 32 == 0, "a warp's lanes split the head dim evenly");
static_assert(kTileK * kMaxD * 2 * sizeof(float) <= 48 * 1024, "K and V tiles fit static shared memory");

// Written only when the discarded accumulator takes a value it never takes in practice; its
// existence keeps the compiler from deleting the extra pass as dead code.
__device__ float g_sink;

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_f32<__half>(float x) { return __float2half(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) { return __float2bfloat16(x); }

// q.k_j for this warp's row: each lane multiplies its share of the head dim, then a butterfly sum.
__device__ __forceinline__ float dot_row(const float (&qr)[kPerLane], const float* krow, int lane, int D) {
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
        const int d = lane + 32 * i;
        if (d < D) s += qr[i] * krow[d];
    }
#pragma unroll
    for (int off = 16; off > 0; off /= 2) s += __shfl_xor_sync(0xffffffffu, s, off);
    return s;
}

template <typename T>
__global__ void __launch_bounds__(kWarps * 32)
gate_attn_kernel(const T* __restrict__ q,  // [B*H, Sq, D]
                 const T* __restrict__ k,  // [B*H, Sk, D]
                 const T* __restrict__ v,  // [B*H, Sk, D]
                 T* __restrict__ out,      // [B*H, Sq, D]
                 int Sq, int Sk, int D, float scale, int causal,
                 int extra_every,          // 0: no extra work; k: every k-th tile processed twice
                 float extra_scale) {      // 1.0f: the repeated pass's q (a runtime value, so not the first pass's)
    __shared__ float ks[kTileK][kMaxD];
    __shared__ float vs[kTileK][kMaxD];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const long long bh = blockIdx.y;
    const int row = blockIdx.x * kWarps + warp;  // this warp's query row (past Sq in a last partial block)
    const bool active = row < Sq;
    const T* qrow = q + (bh * Sq + (active ? row : 0)) * D;
    const T* kbh = k + bh * Sk * D;
    const T* vbh = v + bh * Sk * D;

    float qr[kPerLane], acc[kPerLane], qx[kPerLane], dummy[kPerLane];
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
        const int d = lane + 32 * i;
        qr[i] = (active && d < D) ? to_f32(qrow[d]) * scale : 0.f;
        qx[i] = qr[i] * extra_scale;
        acc[i] = 0.f;
        dummy[i] = 0.f;
    }
    float m = -INFINITY, l = 0.f, l_dummy = 0.f;
    const int last_row = min(Sq - 1, (int)blockIdx.x * kWarps + kWarps - 1);
    const int k_end = causal ? min(Sk, last_row + 1) : Sk;  // keys any row of this block sees
    const int row_end = causal ? min(Sk, row + 1) : Sk;     // keys this row sees

    for (int k0 = 0; k0 < k_end; k0 += kTileK) {
        const int n = min(kTileK, k_end - k0);
        __syncthreads();  // every warp is done with the previous tile
        for (int i = threadIdx.x; i < n * D; i += blockDim.x) {
            const int j = i / D, d = i % D;
            ks[j][d] = to_f32(kbh[(long long)(k0 + j) * D + d]);
            vs[j][d] = to_f32(vbh[(long long)(k0 + j) * D + d]);
        }
        __syncthreads();
        if (!active) continue;
        const int jn = min(n, row_end - k0);
        for (int j = 0; j < jn; ++j) {
            const float s = dot_row(qr, ks[j], lane, D);
            const float m_new = fmaxf(m, s);
            const float corr = expf(m - m_new);  // 0 for the first key (m = -inf)
            const float p = expf(s - m_new);
            l = l * corr + p;
#pragma unroll
            for (int i = 0; i < kPerLane; ++i) {
                const int d = lane + 32 * i;
                if (d < D) acc[i] = acc[i] * corr + p * vs[j][d];
            }
            m = m_new;
        }
        // The deliberate extra cost: the same per-key work again on every extra_every-th tile.
        if (extra_every > 0 && (k0 / kTileK) % extra_every == extra_every - 1) {
            for (int j = 0; j < jn; ++j) {
                const float s = dot_row(qx, ks[j], lane, D);
                const float p = expf(s - m);  // m covers these keys already: p <= 1
                l_dummy += p;
#pragma unroll
                for (int i = 0; i < kPerLane; ++i) {
                    const int d = lane + 32 * i;
                    if (d < D) dummy[i] += p * vs[j][d];
                }
            }
        }
    }
    if (!active) return;
    float sink = l_dummy;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) sink += dummy[i];
    if (sink == -1.0f) g_sink = sink;  // a sum of non-negative terms is never -1
    T* orow = out + (bh * Sq + row) * D;
    const float inv = l > 0.f ? 1.f / l : 0.f;  // a row that sees no key gets zeros, as SDPA
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
        const int d = lane + 32 * i;
        if (d < D) orow[d] = from_f32<T>(acc[i] * inv);
    }
}

template <typename T>
cudaError_t launch(const void* q, const void* k, const void* v, void* out, int B, int H, int Sq, int Sk, int D,
                   float scale, int causal, int extra_every, cudaStream_t stream) {
    dim3 grid((Sq + kWarps - 1) / kWarps, B * H);
    gate_attn_kernel<T><<<grid, kWarps * 32, 0, stream>>>(
        static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v), static_cast<T*>(out), Sq, Sk,
        D, scale, causal, extra_every, 1.0f);
    return cudaGetLastError();
}

// The launcher body both files share: checks, then the kernel for the dtype.
inline int launch_gate_attn(const void* q, const void* k, const void* v, void* out, int B, int H, int Sq, int Sk,
                            int D, float scale, int causal, int dtype, cudaStream_t stream, int extra_every) {
    if (D < 1 || D > kMaxD || B < 1 || H < 1 || Sq < 1 || Sk < 1 || B * H > 65535) return cudaErrorInvalidValue;
    switch (dtype) {
        case FAPROF_FP16: return launch<__half>(q, k, v, out, B, H, Sq, Sk, D, scale, causal, extra_every, stream);
        case FAPROF_BF16:
            return launch<__nv_bfloat16>(q, k, v, out, B, H, Sq, Sk, D, scale, causal, extra_every, stream);
        case FAPROF_FP32: return launch<float>(q, k, v, out, B, H, Sq, Sk, D, scale, causal, extra_every, stream);
        default: return cudaErrorInvalidValue;
    }
}

}  // namespace gate
