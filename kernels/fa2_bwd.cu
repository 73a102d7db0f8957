// fa2_bwd: FlashAttention-2 backward on CUDA cores, fp32 (Dao 2023, "FlashAttention-2", Algorithm 2).
//
// Three kernels per call:
//   1. fa2_bwd_preprocess_kernel: delta_i = rowsum(dO_i ∘ O_i), one thread per query row.
//   2. fa2_bwd_kernel: the grid is (key tiles of Bc keys) x (B·H); a block owns one K/V tile,
//      keeps dK and dV for it in registers and loops over the query tiles that can see it,
//      recomputing from Q, K and the forward's lse (natural log):
//        P  = exp(scale·Q·Kᵀ − lse)            (masked: tails, causal)
//        dP = dO·Vᵀ,  dS = P ∘ (dP − delta)
//        dV += Pᵀ·dO,  dK += scale·dSᵀ·Q
//      and, on the atomic path, dQ += scale·dS·K with fp32 atomicAdd straight into dq (which is
//      fp32 here, zeroed by the launcher first).
//   3. deterministic option: fa2_bwd_dq_kernel, a grid over query tiles that loops over key tiles
//      recomputing P and dP and accumulates dQ in registers (the dK/dV kernel then skips dQ).
//      Twice the S and dP work, but every sum runs in one fixed order: bit-identical results.
// Causal (top-left, SDPA's is_causal): a key tile skips the query tiles entirely above the
// diagonal (all their rows < its first key); the dQ kernel stops at its last row's diagonal tile.
//
// Inside a block (128 threads, 4 warps, Br = Bc = 32):
//   * P and dS: lane j owns key j of the tile, each warp 8 query rows; Q and dO rows are read as
//     float4 broadcasts, K and V rows as float4 from rows padded by 4 floats (conflict-free, as in
//     the forward). P and dS go to shared memory ([32][33] floats).
//   * dV, dK: thread (j = tid/4, c = tid%4) owns key j and the float4 columns c, c + 4, ... of D.
//   * dQ: thread (i = tid/4, c = tid%4) owns query row i and the same columns.
// Numerics: fp32, expf (no fast math). P is recomputed from s rounded exactly as the forward
// rounds it (same FMA order, same scale_log2), so that P = 1 exactly where the forward's l = 1.
// dV, dK (over all query rows) and dQ (over all keys) are Kahan-compensated sums: a plain fp32
// chain over 1000 rows erred up to ~9x PyTorch's own fp32 error (H100, 2026-11-23); the atomic
// dQ path compensates within a key tile and adds the tiles' partial sums with atomics.
#include <cuda_runtime.h>

#include <cstdint>

#include "faprof_kernels.h"

namespace {

constexpr int kBwdBlock = 32;    // Br = Bc
constexpr int kBwdThreads = 128;  // 4 warps
constexpr int kBwdRowsPerWarp = kBwdBlock / (kBwdThreads / 32);
constexpr int kPStride = kBwdBlock + 1;  // padded P / dS rows
constexpr float kLog2e = 1.4426950408889634f;  // as in kernels/fa2.cu
constexpr float kLn2 = 0.6931471805599453f;

// s += a·b with Kahan's compensation c (c holds the negated low part lost so far). A long plain
// fp32 chain (dV and dK over every query row, dQ over every key) loses about sqrt(n) ulps of the
// sum; compensated, the result is within about one ulp whatever n, with one extra register and
// three extra adds per term. Needs IEEE semantics: no --use_fast_math / reassociation.
__device__ __forceinline__ void kahan_fma(float& s, float& c, float a, float b) {
    const float y = fmaf(a, b, -c);
    const float t = s + y;
    c = (t - s) - y;
    s = t;
}

template <int D>
struct Fa2BwdTile {
    static constexpr int kKStride = D + 4;  // padded K / V rows, in floats
    static constexpr int kVec4 = D / 16;    // float4 column groups per thread (dK, dV, dQ)
    static constexpr int kSmemFloats = 2 * kBwdBlock * D            // Q, dO
                                       + 2 * kBwdBlock * kKStride   // K, V
                                       + 2 * kBwdBlock * kPStride   // P, dS
                                       + 2 * kBwdBlock;             // lse, delta
    static constexpr int kSmemBytes = kSmemFloats * static_cast<int>(sizeof(float));
    static_assert(D % 32 == 0 && D >= 32 && D <= 128, "fa2_bwd: D must be 32, 64 or 128");
    static_assert(kSmemBytes <= 99 * 1024, "fa2_bwd: tile must fit sm_86/89's 99 KB");
};

__device__ __forceinline__ void cp_async16(float* smem_dst, const float* gmem_src, bool valid) {
    const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
    const int src_size = valid ? 16 : 0;  // 0: write 16 zero bytes, read nothing
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem_src), "r"(src_size)
                 : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

// Rows [row0, row0 + 32) of a [n_rows, D] matrix into shared memory with row stride STRIDE; rows
// past n_rows become zeros.
template <int D, int STRIDE>
__device__ __forceinline__ void load_tile(float* dst, const float* src, int row0, int n_rows) {
    constexpr int kChunksPerRow = D / 4;
    constexpr int kChunks = kBwdBlock * kChunksPerRow;
    static_assert(kChunks % kBwdThreads == 0, "tile loads split evenly over the threads");
#pragma unroll
    for (int i = 0; i < kChunks / kBwdThreads; ++i) {
        const int c = threadIdx.x + i * kBwdThreads;
        const int r = c / kChunksPerRow;
        const int cc = c % kChunksPerRow;
        const int row = row0 + r;
        const bool valid = row < n_rows;
        cp_async16(dst + r * STRIDE + cc * 4, src + static_cast<size_t>(valid ? row : 0) * D + cc * 4, valid);
    }
}

struct BwdSmem {
    float* Q;   // [32][D]
    float* dO;  // [32][D]
    float* K;   // [32][D + 4]
    float* V;   // [32][D + 4]
    float* P;   // [32][33]  P[i][j]: query row i, key j of the tiles
    float* dS;  // [32][33]
    float* lse;    // [32]
    float* delta;  // [32]
};

template <int D>
__device__ __forceinline__ BwdSmem carve(float* smem) {
    using T = Fa2BwdTile<D>;
    BwdSmem s;
    s.Q = smem;
    s.dO = s.Q + kBwdBlock * D;
    s.K = s.dO + kBwdBlock * D;
    s.V = s.K + kBwdBlock * T::kKStride;
    s.P = s.V + kBwdBlock * T::kKStride;
    s.dS = s.P + kBwdBlock * kPStride;
    s.lse = s.dS + kBwdBlock * kPStride;
    s.delta = s.lse + kBwdBlock;
    return s;
}

// lse and delta of the query tile at q0 into shared memory (0 past Sq; those rows are masked).
__device__ __forceinline__ void load_row_stats(const BwdSmem& s, const float* lse, const float* delta, int q0,
                                               int Sq) {
    const int t = threadIdx.x;
    if (t < kBwdBlock) {
        s.lse[t] = q0 + t < Sq ? lse[q0 + t] : 0.f;
    } else if (t < 2 * kBwdBlock) {
        s.delta[t - kBwdBlock] = q0 + t - kBwdBlock < Sq ? delta[q0 + t - kBwdBlock] : 0.f;
    }
}

// P and dS of one (query tile q0, key tile k0) pair into s.P / s.dS. Needs Q, dO, K, V, lse and
// delta in shared memory (and a barrier after it before anyone reads P or dS).
template <int D>
__device__ __forceinline__ void p_ds_tile(const BwdSmem& s, int q0, int k0, int Sq, int Sk, float scale_log2,
                                          bool causal) {
    using T = Fa2BwdTile<D>;
    constexpr int RW = kBwdRowsPerWarp;
    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    const float* Kl = s.K + lane * T::kKStride;
    const float* Vl = s.V + lane * T::kKStride;
    float sc[RW], dp[RW];
#pragma unroll
    for (int r = 0; r < RW; ++r) sc[r] = dp[r] = 0.f;
#pragma unroll 4
    for (int d = 0; d < D; d += 4) {
        const float4 kf = *reinterpret_cast<const float4*>(Kl + d);
        const float4 vf = *reinterpret_cast<const float4*>(Vl + d);
#pragma unroll
        for (int r = 0; r < RW; ++r) {
            const int i = warp * RW + r;
            const float4 qf = *reinterpret_cast<const float4*>(s.Q + i * D + d);
            const float4 of = *reinterpret_cast<const float4*>(s.dO + i * D + d);
            // x, y, z, w in turn: the forward's (kernels/fa2.cu) order, so that s is bit-identical.
            sc[r] = fmaf(qf.x, kf.x, sc[r]);
            sc[r] = fmaf(qf.y, kf.y, sc[r]);
            sc[r] = fmaf(qf.z, kf.z, sc[r]);
            sc[r] = fmaf(qf.w, kf.w, sc[r]);
            dp[r] = fmaf(of.x, vf.x, dp[r]);
            dp[r] = fmaf(of.y, vf.y, dp[r]);
            dp[r] = fmaf(of.z, vf.z, dp[r]);
            dp[r] = fmaf(of.w, vf.w, dp[r]);
        }
    }
    const int kj = k0 + lane;
#pragma unroll
    for (int r = 0; r < RW; ++r) {
        const int i = warp * RW + r;
        const int qi = q0 + i;
        const bool visible = qi < Sq && kj < Sk && !(causal && kj > qi);
        // The forward scales s by scale_log2 = fl(scale·log2 e), takes the max m and the sum l in
        // the log2 domain and writes lse = fl(fl(m + log2 l)·ln 2). Rounding s the same way
        // (z = fl(fl(s·scale_log2)·ln 2)) makes z == lse exactly where the row's max is its only
        // visible key (l = 1: Sq = 1, causal row 0), so P = 1 there, as in PyTorch's softmax;
        // elsewhere z - lse carries an error of about one ulp of |lse|, as before.
        const float z = (sc[r] * scale_log2) * kLn2;
        const float p = visible ? expf(z - s.lse[i]) : 0.f;
        s.P[i * kPStride + lane] = p;
        s.dS[i * kPStride + lane] = p * (dp[r] - s.delta[i]);
    }
}

// dQ[i, cols] += Σ_j dS[i][j] · K[j, cols] for this thread's row i = tid/4 and float4 columns,
// compensated (cmp) across every key of every tile.
template <int D>
__device__ __forceinline__ void dq_tile(const BwdSmem& s, float (&acc)[D / 16][4], float (&cmp)[D / 16][4]) {
    using T = Fa2BwdTile<D>;
    const int i = threadIdx.x / 4;
    const int c = threadIdx.x % 4;
#pragma unroll 4
    for (int j = 0; j < kBwdBlock; ++j) {
        const float ds = s.dS[i * kPStride + j];
#pragma unroll
        for (int t = 0; t < T::kVec4; ++t) {
            const float4 kf = *reinterpret_cast<const float4*>(s.K + j * T::kKStride + 4 * c + 16 * t);
            kahan_fma(acc[t][0], cmp[t][0], ds, kf.x);
            kahan_fma(acc[t][1], cmp[t][1], ds, kf.y);
            kahan_fma(acc[t][2], cmp[t][2], ds, kf.z);
            kahan_fma(acc[t][3], cmp[t][3], ds, kf.w);
        }
    }
}

}  // namespace

// faprof:launch kernel=fa2_bwd_preprocess_kernel threads=256 dyn_smem=0
// One thread per row, summing over d in the order p_ds_tile sums dP = dO·Vᵀ (d = 0, 1, ... one FMA
// each): where a row sees a single key, O = V exactly and delta == dP bit for bit, so dS = P·(dP −
// delta) is exactly 0, as PyTorch's softmax backward gives; a different order left a rounding
// residual there (dQ, dK errors of ~1e-5 against PyTorch's exact 0 at Sq=1000, Sk=1).
template <int D>
__global__ void __launch_bounds__(256)
fa2_bwd_preprocess_kernel(const float* __restrict__ o,     // [rows, D]
                          const float* __restrict__ dout,  // [rows, D]
                          float* __restrict__ delta,       // [rows]
                          long long rows) {
    const long long row = static_cast<long long>(blockIdx.x) * 256 + threadIdx.x;
    if (row >= rows) return;
    const float4* o4 = reinterpret_cast<const float4*>(o + row * D);
    const float4* g4 = reinterpret_cast<const float4*>(dout + row * D);
    float acc = 0.f;
#pragma unroll 4
    for (int d = 0; d < D / 4; ++d) {
        const float4 a = o4[d], g = g4[d];
        acc = fmaf(g.x, a.x, acc);
        acc = fmaf(g.y, a.y, acc);
        acc = fmaf(g.z, a.z, acc);
        acc = fmaf(g.w, a.w, acc);
    }
    delta[row] = acc;
}

// faprof:launch kernel=fa2_bwd_kernel D=A0 threads=128 dyn_smem=4*(2*32*A0+2*32*(A0+4)+2*32*33+64)
template <int D, bool WITH_DQ>
__global__ void __launch_bounds__(kBwdThreads)
fa2_bwd_kernel(const float* __restrict__ q,      // [B, H, Sq, D]
               const float* __restrict__ k,      // [B, H, Sk, D]
               const float* __restrict__ v,      // [B, H, Sk, D]
               const float* __restrict__ dout,   // [B, H, Sq, D]
               const float* __restrict__ lse,    // [B, H, Sq]
               const float* __restrict__ delta,  // [B, H, Sq]
               float* __restrict__ dq,           // [B, H, Sq, D], zeroed; atomics (WITH_DQ)
               float* __restrict__ dk,           // [B, H, Sk, D]
               float* __restrict__ dv,           // [B, H, Sk, D]
               int BH, int Sq, int Sk, float scale, bool causal) {
    using T = Fa2BwdTile<D>;
    extern __shared__ __align__(16) float smem[];
    const BwdSmem s = carve<D>(smem);
    const int k0 = blockIdx.x * kBwdBlock;
    const int j = threadIdx.x / 4;  // this thread's key (dK, dV) and query row (dQ) in the tiles
    const int c = threadIdx.x % 4;
    const int n_q = (Sq + kBwdBlock - 1) / kBwdBlock;
    // Causal: query tiles whose rows all lie above key k0 (rows < k0) see none of these keys.
    const int m_begin = causal ? k0 / kBwdBlock : 0;

    for (int bh = blockIdx.y; bh < BH; bh += gridDim.y) {
        const size_t qoff = static_cast<size_t>(bh) * Sq;
        const size_t koff = static_cast<size_t>(bh) * Sk;
        load_tile<D, T::kKStride>(s.K, k + koff * D, k0, Sk);
        load_tile<D, T::kKStride>(s.V, v + koff * D, k0, Sk);
        cp_async_commit();

        float acc_dk[T::kVec4][4], acc_dv[T::kVec4][4], cmp_dk[T::kVec4][4], cmp_dv[T::kVec4][4];
#pragma unroll
        for (int t = 0; t < T::kVec4; ++t)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc_dk[t][e] = acc_dv[t][e] = cmp_dk[t][e] = cmp_dv[t][e] = 0.f;

        for (int m = m_begin; m < n_q; ++m) {
            const int q0 = m * kBwdBlock;
            __syncthreads();  // every warp is done with the previous Q, dO, P and dS
            load_tile<D, D>(s.Q, q + qoff * D, q0, Sq);
            load_tile<D, D>(s.dO, dout + qoff * D, q0, Sq);
            cp_async_commit();
            load_row_stats(s, lse + qoff, delta + qoff, q0, Sq);
            cp_async_wait_all();
            __syncthreads();

            p_ds_tile<D>(s, q0, k0, Sq, Sk, scale * kLog2e, causal);
            __syncthreads();

            // dV += Pᵀ·dO, dK += dSᵀ·Q for key j
#pragma unroll 4
            for (int i = 0; i < kBwdBlock; ++i) {
                const float p = s.P[i * kPStride + j];
                const float ds = s.dS[i * kPStride + j];
#pragma unroll
                for (int t = 0; t < T::kVec4; ++t) {
                    const float4 of = *reinterpret_cast<const float4*>(s.dO + i * D + 4 * c + 16 * t);
                    const float4 qf = *reinterpret_cast<const float4*>(s.Q + i * D + 4 * c + 16 * t);
                    kahan_fma(acc_dv[t][0], cmp_dv[t][0], p, of.x);
                    kahan_fma(acc_dv[t][1], cmp_dv[t][1], p, of.y);
                    kahan_fma(acc_dv[t][2], cmp_dv[t][2], p, of.z);
                    kahan_fma(acc_dv[t][3], cmp_dv[t][3], p, of.w);
                    kahan_fma(acc_dk[t][0], cmp_dk[t][0], ds, qf.x);
                    kahan_fma(acc_dk[t][1], cmp_dk[t][1], ds, qf.y);
                    kahan_fma(acc_dk[t][2], cmp_dk[t][2], ds, qf.z);
                    kahan_fma(acc_dk[t][3], cmp_dk[t][3], ds, qf.w);
                }
            }

            if constexpr (WITH_DQ) {
                float acc_dq[T::kVec4][4], cmp_dq[T::kVec4][4];
#pragma unroll
                for (int t = 0; t < T::kVec4; ++t)
#pragma unroll
                    for (int e = 0; e < 4; ++e) acc_dq[t][e] = cmp_dq[t][e] = 0.f;
                dq_tile<D>(s, acc_dq, cmp_dq);
                const int qi = q0 + j;
                if (qi < Sq) {
                    float* dst = dq + (qoff + qi) * D + 4 * c;
#pragma unroll
                    for (int t = 0; t < T::kVec4; ++t)
#pragma unroll
                        for (int e = 0; e < 4; ++e) atomicAdd(dst + 16 * t + e, (acc_dq[t][e] - cmp_dq[t][e]) * scale);
                }
            }
        }
        cp_async_wait_all();  // a block with no query tile still has K and V in flight

        const int kj = k0 + j;
        if (kj < Sk) {
            float* dk_row = dk + (koff + kj) * D + 4 * c;
            float* dv_row = dv + (koff + kj) * D + 4 * c;
#pragma unroll
            for (int t = 0; t < T::kVec4; ++t) {
                // s - c: the compensated sum (c holds its negated lost low part)
                *reinterpret_cast<float4*>(dk_row + 16 * t) =
                    make_float4((acc_dk[t][0] - cmp_dk[t][0]) * scale, (acc_dk[t][1] - cmp_dk[t][1]) * scale,
                                (acc_dk[t][2] - cmp_dk[t][2]) * scale, (acc_dk[t][3] - cmp_dk[t][3]) * scale);
                *reinterpret_cast<float4*>(dv_row + 16 * t) =
                    make_float4(acc_dv[t][0] - cmp_dv[t][0], acc_dv[t][1] - cmp_dv[t][1],
                                acc_dv[t][2] - cmp_dv[t][2], acc_dv[t][3] - cmp_dv[t][3]);
            }
        }
        __syncthreads();  // K and V are refilled by the next (b, h)
    }
}

// faprof:launch kernel=fa2_bwd_dq_kernel threads=128 dyn_smem=4*(2*32*D+2*32*(D+4)+2*32*33+64)
template <int D>
__global__ void __launch_bounds__(kBwdThreads)
fa2_bwd_dq_kernel(const float* __restrict__ q,      // [B, H, Sq, D]
                  const float* __restrict__ k,      // [B, H, Sk, D]
                  const float* __restrict__ v,      // [B, H, Sk, D]
                  const float* __restrict__ dout,   // [B, H, Sq, D]
                  const float* __restrict__ lse,    // [B, H, Sq]
                  const float* __restrict__ delta,  // [B, H, Sq]
                  float* __restrict__ dq,           // [B, H, Sq, D]
                  int BH, int Sq, int Sk, float scale, bool causal) {
    using T = Fa2BwdTile<D>;
    extern __shared__ __align__(16) float smem[];
    const BwdSmem s = carve<D>(smem);
    const int q0 = blockIdx.x * kBwdBlock;
    const int i = threadIdx.x / 4;
    const int c = threadIdx.x % 4;
    int n_k = (Sk + kBwdBlock - 1) / kBwdBlock;
    if (causal) n_k = min(n_k, (min(q0 + kBwdBlock, Sq) - 1) / kBwdBlock + 1);

    for (int bh = blockIdx.y; bh < BH; bh += gridDim.y) {
        const size_t qoff = static_cast<size_t>(bh) * Sq;
        const size_t koff = static_cast<size_t>(bh) * Sk;
        load_tile<D, D>(s.Q, q + qoff * D, q0, Sq);
        load_tile<D, D>(s.dO, dout + qoff * D, q0, Sq);
        cp_async_commit();
        load_row_stats(s, lse + qoff, delta + qoff, q0, Sq);

        float acc[T::kVec4][4], cmp[T::kVec4][4];
#pragma unroll
        for (int t = 0; t < T::kVec4; ++t)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[t][e] = cmp[t][e] = 0.f;

        for (int n = 0; n < n_k; ++n) {
            const int k0 = n * kBwdBlock;
            __syncthreads();  // every warp is done with the previous K, V and dS
            load_tile<D, T::kKStride>(s.K, k + koff * D, k0, Sk);
            load_tile<D, T::kKStride>(s.V, v + koff * D, k0, Sk);
            cp_async_commit();
            cp_async_wait_all();
            __syncthreads();
            p_ds_tile<D>(s, q0, k0, Sq, Sk, scale * kLog2e, causal);
            __syncthreads();
            dq_tile<D>(s, acc, cmp);
        }
        cp_async_wait_all();

        const int qi = q0 + i;
        if (qi < Sq) {
            float* row = dq + (qoff + qi) * D + 4 * c;
#pragma unroll
            for (int t = 0; t < T::kVec4; ++t)
                *reinterpret_cast<float4*>(row + 16 * t) =
                    make_float4((acc[t][0] - cmp[t][0]) * scale, (acc[t][1] - cmp[t][1]) * scale,
                                (acc[t][2] - cmp[t][2]) * scale, (acc[t][3] - cmp[t][3]) * scale);
        }
        __syncthreads();  // Q, dO, lse and delta are refilled by the next (b, h)
    }
}

namespace {

template <int D>
cudaError_t launch_fa2_bwd(const float* q, const float* k, const float* v, const float* o, const float* dout,
                           const float* lse, float* dq, float* dk, float* dv, float* delta, int B, int H, int Sq,
                           int Sk, bool causal, float scale, bool deterministic, cudaStream_t stream) {
    using T = Fa2BwdTile<D>;
    const long long bh = static_cast<long long>(B) * H;
    const unsigned grid_y = static_cast<unsigned>(bh < 65535 ? bh : 65535);
    const long long rows = bh * Sq;
    fa2_bwd_preprocess_kernel<D><<<static_cast<unsigned>((rows + 255) / 256), 256, 0, stream>>>(o, dout, delta, rows);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;

    const dim3 grid_kv((Sk + kBwdBlock - 1) / kBwdBlock, grid_y);
    if (deterministic) {
        auto kv = fa2_bwd_kernel<D, false>;
        auto dqk = fa2_bwd_dq_kernel<D>;
        if ((err = cudaFuncSetAttribute(kv, cudaFuncAttributeMaxDynamicSharedMemorySize, T::kSmemBytes)) ||
            (err = cudaFuncSetAttribute(dqk, cudaFuncAttributeMaxDynamicSharedMemorySize, T::kSmemBytes)))
            return err;
        kv<<<grid_kv, kBwdThreads, T::kSmemBytes, stream>>>(q, k, v, dout, lse, delta, dq, dk, dv,
                                                             static_cast<int>(bh), Sq, Sk, scale, causal);
        if ((err = cudaGetLastError()) != cudaSuccess) return err;
        const dim3 grid_q((Sq + kBwdBlock - 1) / kBwdBlock, grid_y);
        dqk<<<grid_q, kBwdThreads, T::kSmemBytes, stream>>>(q, k, v, dout, lse, delta, dq, static_cast<int>(bh),
                                                             Sq, Sk, scale, causal);
        return cudaGetLastError();
    }
    auto kv = fa2_bwd_kernel<D, true>;
    if ((err = cudaFuncSetAttribute(kv, cudaFuncAttributeMaxDynamicSharedMemorySize, T::kSmemBytes))) return err;
    if ((err = cudaMemsetAsync(dq, 0, static_cast<size_t>(rows) * D * sizeof(float), stream))) return err;
    kv<<<grid_kv, kBwdThreads, T::kSmemBytes, stream>>>(q, k, v, dout, lse, delta, dq, dk, dv, static_cast<int>(bh),
                                                         Sq, Sk, scale, causal);
    return cudaGetLastError();
}

}  // namespace

cudaError_t faprof_fa2_bwd(const float* q, const float* k, const float* v, const float* o, const float* dout,
                           const float* lse, float* dq, float* dk, float* dv, float* delta, int B, int H, int Sq,
                           int Sk, int D, bool causal, float scale, bool deterministic, cudaStream_t stream) {
    if (B < 1 || H < 1 || Sq < 1 || Sk < 1 || static_cast<long long>(B) * H > 0x7fffffffLL)
        return cudaErrorInvalidValue;
    switch (D) {
        case 32:
            return launch_fa2_bwd<32>(q, k, v, o, dout, lse, dq, dk, dv, delta, B, H, Sq, Sk, causal, scale,
                                      deterministic, stream);
        case 64:
            return launch_fa2_bwd<64>(q, k, v, o, dout, lse, dq, dk, dv, delta, B, H, Sq, Sk, causal, scale,
                                      deterministic, stream);
        case 128:
            return launch_fa2_bwd<128>(q, k, v, o, dout, lse, dq, dk, dv, delta, B, H, Sq, Sk, causal, scale,
                                       deterministic, stream);
        default:
            return cudaErrorInvalidValue;
    }
}
