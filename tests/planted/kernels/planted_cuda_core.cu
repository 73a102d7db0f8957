// planted_cuda_core.cu — TEST ONLY: FlashAttention-2 on fp16 inputs without tensor cores.
//
// A copy of the GPU-verified kernels/fa2.cu (fp32, CUDA cores; read its header for the algorithm)
// that reads fp16 Q, K, V and writes fp16 O: the planted fault is that fp16 math runs as fp32 FFMA
// on the CUDA cores while the tensor cores idle. The only differences from fa2.cu are marked
// `PLANTED FAULT`: tiles are converted to fp32 on their way into shared memory (so they are loaded
// synchronously, not with cp.async, which cannot convert), and O is rounded to fp16 when stored.
// Everything in shared memory and registers is fp32 exactly as in fa2.cu, so the results are fa2's
// rounded to fp16. Built only by tests/planted/planted_variants.py; compiled by tests/test_build.py.
//
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "planted_kernels.h"

namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Tile configuration. Bc = 64 keys per tile (two per lane) halves the shared-memory reads of Q
// per multiply-add compared with 32; 8 rows per warp give each lane 8·2 independent
// accumulators in Q·Kᵀ and 8·D/32 in P·V.
template <int D>
struct Fa2Tile {
    static constexpr int kWarps = 4;
    static constexpr int kRowsPerWarp = 8;
    static constexpr int kThreads = kWarps * 32;
    static constexpr int Br = kWarps * kRowsPerWarp;  // query rows per block
    static constexpr int Bc = 64;                     // keys per K/V tile
    static constexpr int kKeysPerLane = Bc / 32;
    static constexpr int kVec = D / 32;               // O columns owned by one lane
    static constexpr int kKStride = D + 4;            // padded K row, in floats
    static constexpr int kSmemFloats = Br * D                          // Q tile
                                       + Bc * kKStride                 // K tile (padded)
                                       + Bc * D                        // V tile
                                       + kWarps * kRowsPerWarp * Bc;   // P, warp-private
    static constexpr int kSmemBytes = kSmemFloats * static_cast<int>(sizeof(float));

    static_assert(D % 32 == 0 && D >= 32 && D <= 128, "fa2: D must be 32, 64 or 128");
    static_assert(kVec == 1 || kVec == 2 || kVec == 4, "fa2: a lane owns 1, 2 or 4 columns of O");
    static_assert(Bc % 32 == 0 && Bc % 4 == 0, "fa2: Bc must be a multiple of the warp size");
    static_assert(kThreads <= 1024, "fa2: too many threads per block");
    static_assert(kKStride % 4 == 0, "fa2: K rows must stay 16-byte aligned for float4 reads");
    static_assert(kSmemBytes <= 227 * 1024, "fa2: tile does not fit in shared memory");
};

__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// PLANTED FAULT (fp16 inputs): copies rows [row0, row0 + ROWS) of an fp16 [n_rows, D] matrix into
// fp32 shared memory with row stride STRIDE floats, 4 elements (8 bytes) per thread and step,
// consecutive threads on consecutive elements of a row; rows >= n_rows become zeros.
template <int ROWS, int D, int STRIDE, int THREADS>
__device__ __forceinline__ void load_tile_half(float* dst, const __half* src, int row0, int n_rows) {
    constexpr int kChunksPerRow = D / 4;
    constexpr int kChunks = ROWS * kChunksPerRow;
    for (int c = threadIdx.x; c < kChunks; c += THREADS) {
        const int r = c / kChunksPerRow;
        const int cc = c % kChunksPerRow;
        const int row = row0 + r;
        float4 f = make_float4(0.f, 0.f, 0.f, 0.f);
        if (row < n_rows) {
            const uint2 raw = *reinterpret_cast<const uint2*>(src + static_cast<size_t>(row) * D + cc * 4);
            const float2 lo = __half22float2(*reinterpret_cast<const __half2*>(&raw.x));
            const float2 hi = __half22float2(*reinterpret_cast<const __half2*>(&raw.y));
            f = make_float4(lo.x, lo.y, hi.x, hi.y);
        }
        *reinterpret_cast<float4*>(dst + r * STRIDE + cc * 4) = f;
    }
}

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, off));
    return x;
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) x += __shfl_xor_sync(0xffffffffu, x, off);
    return x;
}

template <int N>
struct VecF;
template <>
struct VecF<1> {
    static __device__ __forceinline__ void load(const float* p, float* r) { r[0] = *p; }
    static __device__ __forceinline__ void store(float* p, const float* r) { *p = r[0]; }
};
template <>
struct VecF<2> {
    static __device__ __forceinline__ void load(const float* p, float* r) {
        const float2 t = *reinterpret_cast<const float2*>(p);
        r[0] = t.x;
        r[1] = t.y;
    }
    static __device__ __forceinline__ void store(float* p, const float* r) {
        *reinterpret_cast<float2*>(p) = make_float2(r[0], r[1]);
    }
};
template <>
struct VecF<4> {
    static __device__ __forceinline__ void load(const float* p, float* r) {
        const float4 t = *reinterpret_cast<const float4*>(p);
        r[0] = t.x;
        r[1] = t.y;
        r[2] = t.z;
        r[3] = t.w;
    }
    static __device__ __forceinline__ void store(float* p, const float* r) {
        *reinterpret_cast<float4*>(p) = make_float4(r[0], r[1], r[2], r[3]);
    }
};

__device__ __forceinline__ float get4(const float4& v, int i) {
    return i == 0 ? v.x : (i == 1 ? v.y : (i == 2 ? v.z : v.w));
}

}  // namespace

// faprof:launch kernel=planted_cuda_core_fwd_kernel threads=128 dyn_smem=4*(32*D+64*(D+4)+64*D+4*8*64)
template <int D>
__global__ void __launch_bounds__(Fa2Tile<D>::kThreads)
planted_cuda_core_fwd_kernel(const __half* __restrict__ q,  // [B, H, Sq, D]  PLANTED FAULT: fp16 in and out
                             const __half* __restrict__ k,  // [B, H, Sk, D]
                             const __half* __restrict__ v,  // [B, H, Sk, D]
                             __half* __restrict__ o,        // [B, H, Sq, D]
               float* __restrict__ lse,      // [B, H, Sq]
               int BH, int Sq, int Sk, float scale_log2, bool causal) {
    using T = Fa2Tile<D>;
    constexpr int RW = T::kRowsPerWarp;
    constexpr int Bc = T::Bc;
    constexpr int KPL = T::kKeysPerLane;
    constexpr int VEC = T::kVec;

    extern __shared__ __align__(16) float smem[];
    float* Qs = smem;                      // [Br][D]
    float* Ks = Qs + T::Br * D;            // [Bc][kKStride]
    float* Vs = Ks + Bc * T::kKStride;     // [Bc][D]
    float* Ps = Vs + Bc * D;               // [kWarps][RW][Bc]

    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    // Causal blocks near the end of the sequence do the most work: hand them out first.
    const int q_tile = gridDim.x - 1 - blockIdx.x;
    const int q0 = q_tile * T::Br;
    const int row_w = q0 + warp * RW;  // first query row of this warp

    int n_kv = (Sk + Bc - 1) / Bc;
    if (causal) {
        // The block's last row sees keys [0, min(q0 + Br, Sq)): later tiles are all masked.
        const int visible = min(min(q0 + T::Br, Sq), Sk);
        n_kv = min(n_kv, (visible + Bc - 1) / Bc);
    }

    const float* Qw = Qs + warp * RW * D;
    float* Pw = Ps + warp * RW * Bc;

    for (int bh = blockIdx.y; bh < BH; bh += gridDim.y) {
        const __half* qb = q + static_cast<size_t>(bh) * Sq * D;
        const __half* kb = k + static_cast<size_t>(bh) * Sk * D;
        const __half* vb = v + static_cast<size_t>(bh) * Sk * D;

        // Groups in flight: {Q, K0}, {V0}; then per tile {K_t+1}, {V_t+1} (possibly empty).
        load_tile_half<T::Br, D, D, T::kThreads>(Qs, qb, q0, Sq);
        load_tile_half<Bc, D, T::kKStride, T::kThreads>(Ks, kb, 0, Sk);
        cp_async_commit();
        load_tile_half<Bc, D, D, T::kThreads>(Vs, vb, 0, Sk);
        cp_async_commit();

        float acc[RW][VEC];
        float m_run[RW];  // running max, log2 domain (warp-uniform)
        float l_run[RW];  // running sum of this lane's keys, relative to m_run
#pragma unroll
        for (int r = 0; r < RW; ++r) {
            m_run[r] = -INFINITY;
            l_run[r] = 0.f;
#pragma unroll
            for (int c = 0; c < VEC; ++c) acc[r][c] = 0.f;
        }

        for (int t = 0; t < n_kv; ++t) {
            const int kv0 = t * Bc;
            cp_async_wait<1>();  // Q and K_t have landed (V_t may still be in flight)
            __syncthreads();

            // ---- S = Q·Kᵀ for this warp's rows and this lane's keys
            float s[RW][KPL];
#pragma unroll
            for (int r = 0; r < RW; ++r)
#pragma unroll
                for (int j = 0; j < KPL; ++j) s[r][j] = 0.f;
#pragma unroll 4
            for (int d = 0; d < D; d += 4) {
                float4 kf[KPL];
#pragma unroll
                for (int j = 0; j < KPL; ++j)
                    kf[j] = *reinterpret_cast<const float4*>(Ks + (lane + 32 * j) * T::kKStride + d);
#pragma unroll
                for (int r = 0; r < RW; ++r) {
                    const float4 qf = *reinterpret_cast<const float4*>(Qw + r * D + d);
#pragma unroll
                    for (int j = 0; j < KPL; ++j) {
                        s[r][j] = fmaf(qf.x, kf[j].x, s[r][j]);
                        s[r][j] = fmaf(qf.y, kf[j].y, s[r][j]);
                        s[r][j] = fmaf(qf.z, kf[j].z, s[r][j]);
                        s[r][j] = fmaf(qf.w, kf[j].w, s[r][j]);
                    }
                }
            }
            __syncthreads();  // every warp is done with K_t: its buffer may be refilled
            if (t + 1 < n_kv) load_tile_half<Bc, D, T::kKStride, T::kThreads>(Ks, kb, kv0 + Bc, Sk);
            cp_async_commit();

            // ---- online softmax (log2 domain)
            // Masking is needed only on the last tile (key tail) and on tiles that cross the
            // diagonal of this warp's rows; the test is warp-uniform.
            const bool need_mask = (kv0 + Bc > Sk) || (causal && kv0 + Bc - 1 > row_w);
#pragma unroll
            for (int r = 0; r < RW; ++r) {
                const int qi = row_w + r;
                float mx = -INFINITY;
#pragma unroll
                for (int j = 0; j < KPL; ++j) {
                    float x = s[r][j] * scale_log2;
                    if (need_mask) {
                        const int kj = kv0 + lane + 32 * j;
                        if (kj >= Sk || (causal && kj > qi)) x = -INFINITY;
                    }
                    s[r][j] = x;
                    mx = fmaxf(mx, x);
                }
                mx = warp_max(mx);
                const float m_new = fmaxf(m_run[r], mx);
                // A row with no visible key so far keeps m = -inf; use 0 so that exp2f gives 0
                // instead of NaN (-inf - -inf).
                const float m_use = (m_new == -INFINITY) ? 0.f : m_new;
                const float alpha = exp2f(m_run[r] - m_use);
                m_run[r] = m_new;
                float psum = 0.f;
#pragma unroll
                for (int j = 0; j < KPL; ++j) {
                    const float p = exp2f(s[r][j] - m_use);
                    Pw[r * Bc + lane + 32 * j] = p;
                    psum += p;
                }
                l_run[r] = fmaf(l_run[r], alpha, psum);
#pragma unroll
                for (int c = 0; c < VEC; ++c) acc[r][c] *= alpha;
            }

            cp_async_wait<1>();  // V_t has landed (K_t+1 may still be in flight)
            __syncthreads();     // also orders this warp's P writes before its reads

            // ---- O += P·V
#pragma unroll 2
            for (int j = 0; j < Bc; j += 4) {
                float4 pf[RW];
#pragma unroll
                for (int r = 0; r < RW; ++r) pf[r] = *reinterpret_cast<const float4*>(Pw + r * Bc + j);
#pragma unroll
                for (int jj = 0; jj < 4; ++jj) {
                    float vr[VEC];
                    VecF<VEC>::load(Vs + (j + jj) * D + lane * VEC, vr);
#pragma unroll
                    for (int r = 0; r < RW; ++r) {
                        const float p = get4(pf[r], jj);
#pragma unroll
                        for (int c = 0; c < VEC; ++c) acc[r][c] = fmaf(p, vr[c], acc[r][c]);
                    }
                }
            }
            __syncthreads();  // every warp is done with V_t
            if (t + 1 < n_kv) load_tile_half<Bc, D, D, T::kThreads>(Vs, vb, kv0 + Bc, Sk);
            cp_async_commit();
        }
        cp_async_wait<0>();  // only empty groups remain; drain them before the buffers are reused

        // ---- normalize and write O and lse
        __half* ob = o + static_cast<size_t>(bh) * Sq * D;
#pragma unroll
        for (int r = 0; r < RW; ++r) {
            const float l_row = warp_sum(l_run[r]);
            const int qi = row_w + r;
            if (qi < Sq) {
                const float inv = l_row > 0.f ? 1.f / l_row : 0.f;
                float out[VEC];
#pragma unroll
                for (int c = 0; c < VEC; ++c) out[c] = acc[r][c] * inv;
                // PLANTED FAULT (fp16 output): O rounded to fp16.
#pragma unroll
                for (int c = 0; c < VEC; ++c) ob[static_cast<size_t>(qi) * D + lane * VEC + c] = __float2half_rn(out[c]);
                if (lane == 0)
                    lse[static_cast<size_t>(bh) * Sq + qi] =
                        l_row > 0.f ? (m_run[r] + log2f(l_row)) * kLn2 : -INFINITY;
            }
        }
        __syncthreads();  // Q, K and V buffers are refilled by the next (b, h)
    }
}

namespace {

template <int D>
cudaError_t launch_planted(const __half* q, const __half* k, const __half* v, __half* o, float* lse, int B,
                           int H, int Sq, int Sk, bool causal, float scale, cudaStream_t stream) {
    using T = Fa2Tile<D>;
    if (T::kSmemBytes > 48 * 1024) {
        const cudaError_t err = cudaFuncSetAttribute(
            planted_cuda_core_fwd_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, T::kSmemBytes);
        if (err != cudaSuccess) return err;
    }
    const long long bh = static_cast<long long>(B) * H;
    const dim3 grid((Sq + T::Br - 1) / T::Br, static_cast<unsigned>(bh < 65535 ? bh : 65535));
    planted_cuda_core_fwd_kernel<D><<<grid, T::kThreads, T::kSmemBytes, stream>>>(
        q, k, v, o, lse, static_cast<int>(bh), Sq, Sk, scale * kLog2e, causal);
    return cudaGetLastError();
}

}  // namespace

cudaError_t faprof_planted_cuda_core_fwd(const void* q, const void* k, const void* v, void* o, float* lse, int B,
                                         int H, int Sq, int Sk, int D, float scale, bool causal,
                                         cudaStream_t stream) {
    if (B < 1 || H < 1 || Sq < 1 || Sk < 1 || static_cast<long long>(B) * H > 0x7fffffffLL)
        return cudaErrorInvalidValue;
    const auto* qh = static_cast<const __half*>(q);
    const auto* kh = static_cast<const __half*>(k);
    const auto* vh = static_cast<const __half*>(v);
    auto* oh = static_cast<__half*>(o);
    switch (D) {
        case 64: return launch_planted<64>(qh, kh, vh, oh, lse, B, H, Sq, Sk, causal, scale, stream);
        case 128: return launch_planted<128>(qh, kh, vh, oh, lse, B, H, Sq, Sk, causal, scale, stream);
        default: return cudaErrorInvalidValue;
    }
}
