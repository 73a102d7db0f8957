// naive: standard attention in three kernels, fp32, with the Sq x Sk score matrix in global
// memory (the "naive GPU" baseline of the seeds: memory-bound, O(Sq·Sk) footprint).
//
//   1. naive_scores_kernel   S = scale·Q·Kᵀ, causal entries set to -inf   -> scores [B,H,Sq,Sk]
//   2. naive_softmax_kernel  P = softmax(S) row by row, in place           -> scores
//   3. naive_pv_kernel       O = P·V                                       -> o [B,H,Sq,D]
//
// Simple but not silly: both matmuls are 32x32-tiled through shared memory (loads coalesced
// along the contiguous dimension, tiles padded to 33 columns so column reads are bank-conflict
// free), each thread computes 4 outputs; the softmax uses one warp per row and an online
// max/sum so it reads the row twice, not three times. Fully masked causal tiles of S are written
// as -inf without computing them, and P·V stops at the diagonal. Works for any D >= 1 (tails
// zero-padded); no alignment requirement. Fully -inf rows (impossible with top-left causal
// alignment, guarded anyway) give P = 0 and O = 0.
#include <cuda_runtime.h>

#include <cstdint>

#include "faprof_kernels.h"

namespace {

constexpr float kLog2e = 1.4426950408889634f;

// 32x32 output tile per block, 32x8 threads, 4 outputs per thread (rows ty, ty+8, ...).
struct NaiveTile {
    static constexpr int kTile = 32;
    static constexpr int kThreadsX = 32;
    static constexpr int kThreadsY = 8;
    static constexpr int kThreads = kThreadsX * kThreadsY;
    static constexpr int kRowsPerThread = kTile / kThreadsY;
    static_assert(kThreadsX == kTile, "one thread per tile column");
    static_assert(kTile % kThreadsY == 0, "rows split evenly over threadIdx.y");
};

// Softmax: one warp per row.
struct NaiveSoftmax {
    static constexpr int kWarps = 8;
    static constexpr int kThreads = kWarps * 32;
};

constexpr int kMaxGridYZ = 65535;

}  // namespace

// faprof:launch kernel=naive_scores_kernel threads=256 dyn_smem=0
__global__ void __launch_bounds__(NaiveTile::kThreads)
naive_scores_kernel(const float* __restrict__ q,  // [B, H, Sq, D]
                    const float* __restrict__ k,  // [B, H, Sk, D]
                    float* __restrict__ s,        // [B, H, Sq, Sk]
                    int BH, int Sq, int Sk, int D, float scale, bool causal) {
    constexpr int TILE = NaiveTile::kTile;
    constexpr int RPT = NaiveTile::kRowsPerThread;
    __shared__ float Qs[TILE][TILE + 1];  // [query row][d]
    __shared__ float Ks[TILE][TILE + 1];  // [key][d]
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int col0 = blockIdx.x * TILE;  // first key
    const int row0 = blockIdx.y * TILE;  // first query row

    for (int bh = blockIdx.z; bh < BH; bh += gridDim.z) {
        float* sb = s + static_cast<size_t>(bh) * Sq * Sk;
        const int col = col0 + tx;
        if (causal && col0 > row0 + TILE - 1) {  // whole tile above the diagonal (block-uniform)
#pragma unroll
            for (int i = 0; i < RPT; ++i) {
                const int row = row0 + ty + i * NaiveTile::kThreadsY;
                if (row < Sq && col < Sk) sb[static_cast<size_t>(row) * Sk + col] = -INFINITY;
            }
            continue;
        }
        const float* qb = q + static_cast<size_t>(bh) * Sq * D;
        const float* kb = k + static_cast<size_t>(bh) * Sk * D;
        float acc[RPT] = {};
        for (int d0 = 0; d0 < D; d0 += TILE) {
            const int d = d0 + tx;
#pragma unroll
            for (int i = 0; i < RPT; ++i) {
                const int r = ty + i * NaiveTile::kThreadsY;
                Qs[r][tx] = (row0 + r < Sq && d < D) ? qb[static_cast<size_t>(row0 + r) * D + d] : 0.f;
                Ks[r][tx] = (col0 + r < Sk && d < D) ? kb[static_cast<size_t>(col0 + r) * D + d] : 0.f;
            }
            __syncthreads();
#pragma unroll 4
            for (int dd = 0; dd < TILE; ++dd) {
                const float kv = Ks[tx][dd];
#pragma unroll
                for (int i = 0; i < RPT; ++i) acc[i] = fmaf(Qs[ty + i * NaiveTile::kThreadsY][dd], kv, acc[i]);
            }
            __syncthreads();
        }
#pragma unroll
        for (int i = 0; i < RPT; ++i) {
            const int row = row0 + ty + i * NaiveTile::kThreadsY;
            if (row < Sq && col < Sk)
                sb[static_cast<size_t>(row) * Sk + col] = (causal && col > row) ? -INFINITY : acc[i] * scale;
        }
    }
}

// faprof:launch kernel=naive_softmax_kernel threads=256 dyn_smem=0
__global__ void __launch_bounds__(NaiveSoftmax::kThreads)
naive_softmax_kernel(float* __restrict__ s,  // [B·H·Sq, Sk], in place
                     long long rows, int Sk) {
    const long long row = static_cast<long long>(blockIdx.x) * NaiveSoftmax::kWarps + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (row >= rows) return;  // warp-uniform
    float* p = s + static_cast<size_t>(row) * Sk;

    // Pass 1: online max and sum over this lane's columns, then across the warp.
    float m = -INFINITY, l = 0.f;
    for (int j = lane; j < Sk; j += 32) {
        const float x = p[j];
        if (x == -INFINITY) continue;  // masked: contributes nothing (and avoids -inf - -inf)
        if (x > m) {
            l *= exp2f((m - x) * kLog2e);
            m = x;
        }
        l += exp2f((x - m) * kLog2e);
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        const float m2 = __shfl_xor_sync(0xffffffffu, m, off);
        const float l2 = __shfl_xor_sync(0xffffffffu, l, off);
        const float mn = fmaxf(m, m2);
        l = (mn == -INFINITY) ? 0.f : l * exp2f((m - mn) * kLog2e) + l2 * exp2f((m2 - mn) * kLog2e);
        m = mn;
    }
    // Pass 2: write probabilities. A row with no visible key becomes all zeros.
    const float inv = l > 0.f ? 1.f / l : 0.f;
    const float m_use = (m == -INFINITY) ? 0.f : m;
    for (int j = lane; j < Sk; j += 32) p[j] = exp2f((p[j] - m_use) * kLog2e) * inv;
}

// faprof:launch kernel=naive_pv_kernel threads=256 dyn_smem=0
__global__ void __launch_bounds__(NaiveTile::kThreads)
naive_pv_kernel(const float* __restrict__ p,  // [B, H, Sq, Sk] probabilities
                const float* __restrict__ v,  // [B, H, Sk, D]
                float* __restrict__ o,        // [B, H, Sq, D]
                int BH, int Sq, int Sk, int D, bool causal) {
    constexpr int TILE = NaiveTile::kTile;
    constexpr int RPT = NaiveTile::kRowsPerThread;
    __shared__ float Ps[TILE][TILE + 1];  // [query row][key]
    __shared__ float Vs[TILE][TILE + 1];  // [key][d]
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int d0 = blockIdx.x * TILE;
    const int row0 = blockIdx.y * TILE;
    // Causal: rows row0..row0+31 see no key after row0+31 (P is 0 there): stop at the diagonal.
    const int k_end = causal ? min(Sk, row0 + TILE) : Sk;

    for (int bh = blockIdx.z; bh < BH; bh += gridDim.z) {
        const float* pb = p + static_cast<size_t>(bh) * Sq * Sk;
        const float* vb = v + static_cast<size_t>(bh) * Sk * D;
        float acc[RPT] = {};
        for (int k0 = 0; k0 < k_end; k0 += TILE) {
#pragma unroll
            for (int i = 0; i < RPT; ++i) {
                const int r = ty + i * NaiveTile::kThreadsY;
                Ps[r][tx] = (row0 + r < Sq && k0 + tx < Sk) ? pb[static_cast<size_t>(row0 + r) * Sk + k0 + tx] : 0.f;
                Vs[r][tx] = (k0 + r < Sk && d0 + tx < D) ? vb[static_cast<size_t>(k0 + r) * D + d0 + tx] : 0.f;
            }
            __syncthreads();
#pragma unroll 4
            for (int kk = 0; kk < TILE; ++kk) {
                const float vv = Vs[kk][tx];
#pragma unroll
                for (int i = 0; i < RPT; ++i) acc[i] = fmaf(Ps[ty + i * NaiveTile::kThreadsY][kk], vv, acc[i]);
            }
            __syncthreads();
        }
        float* ob = o + static_cast<size_t>(bh) * Sq * D;
#pragma unroll
        for (int i = 0; i < RPT; ++i) {
            const int row = row0 + ty + i * NaiveTile::kThreadsY;
            if (row < Sq && d0 + tx < D) ob[static_cast<size_t>(row) * D + d0 + tx] = acc[i];
        }
    }
}

cudaError_t faprof_naive_fwd(const float* q, const float* k, const float* v, float* o, float* scores,
                             int B, int H, int Sq, int Sk, int D, bool causal, float scale,
                             cudaStream_t stream) {
    constexpr int TILE = NaiveTile::kTile;
    if (B < 1 || H < 1 || Sq < 1 || Sk < 1 || D < 1) return cudaErrorInvalidValue;
    const long long bh = static_cast<long long>(B) * H;
    if (bh > 0x7fffffffLL) return cudaErrorInvalidValue;
    const long long q_tiles = (Sq + TILE - 1) / TILE;
    if (q_tiles > kMaxGridYZ) return cudaErrorInvalidValue;  // Sq > 2^21 rows
    const unsigned grid_z = static_cast<unsigned>(bh < kMaxGridYZ ? bh : kMaxGridYZ);
    const dim3 tile_threads(NaiveTile::kThreadsX, NaiveTile::kThreadsY);

    const dim3 grid_s((Sk + TILE - 1) / TILE, static_cast<unsigned>(q_tiles), grid_z);
    naive_scores_kernel<<<grid_s, tile_threads, 0, stream>>>(q, k, scores, static_cast<int>(bh), Sq, Sk, D,
                                                            scale, causal);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;

    const long long rows = bh * Sq;
    const long long sm_blocks = (rows + NaiveSoftmax::kWarps - 1) / NaiveSoftmax::kWarps;
    if (sm_blocks > 0x7fffffffLL) return cudaErrorInvalidValue;
    naive_softmax_kernel<<<static_cast<unsigned>(sm_blocks), NaiveSoftmax::kThreads, 0, stream>>>(scores, rows,
                                                                                                  Sk);
    err = cudaGetLastError();
    if (err != cudaSuccess) return err;

    const dim3 grid_o((D + TILE - 1) / TILE, static_cast<unsigned>(q_tiles), grid_z);
    naive_pv_kernel<<<grid_o, tile_threads, 0, stream>>>(scores, v, o, static_cast<int>(bh), Sq, Sk, D,
                                                        causal);
    return cudaGetLastError();
}
