// fa1: FlashAttention-1 forward on CUDA cores, fp32, in the loop order of Dao et al. 2022,
// "FlashAttention: Fast and Memory-Efficient Exact Attention with IO-Awareness", Algorithm 1.
//
// One block per (b, h). The outer loop runs over K/V tiles of Bc keys, loaded once into shared
// memory; the inner loop runs over the query rows, Br at a time. O, l and m live in global
// memory: every (K/V tile, Q tile) pair reads O_i, l_i, m_i, updates them with the tile's
// scores, and writes them back, with O kept normalized after every step as in the paper:
//
//   m~ = rowmax(S),  P~ = exp(S - m~),  l~ = rowsum(P~)
//   m' = max(m, m~),  l' = e^(m - m') l + e^(m~ - m') l~
//   O  = (l e^(m - m') O + e^(m~ - m') P~ V) / l'
//
// This is the read-modify-write traffic on O that FlashAttention-2 removes, and one block per
// (b, h) is the parallelism it lacks; both are what this variant is for. O = 0, l = 0 and
// m = -inf are written by the kernel itself, so poisoned outputs are fine.
//
// Inside a block: kWarps warps; the Q tile of Br rows is split into groups of kRowsPerWarp rows,
// one per warp. A warp loads its own rows of Q into a warp-private shared buffer, so the inner
// loop needs no block-wide barrier. Q·Kᵀ and P·V use the same lane mapping as fa2.cu (lane j owns
// keys j, j+32 of the tile, then D/32 adjacent columns of O). Causal: (K tile, row group) pairs
// with every key after every row are skipped. Scores stay in natural units (m and l are the
// paper's); exponentials are exp2f((x - m)·log2 e), no fast math.
#include <cuda_runtime.h>

#include <cstdint>

#include "faprof_kernels.h"

namespace {

constexpr float kLog2e = 1.4426950408889634f;

template <int D>
struct Fa1Tile {
    static constexpr int kWarps = 4;
    static constexpr int kRowsPerWarp = 8;
    static constexpr int kThreads = kWarps * 32;  // Br = kWarps · kRowsPerWarp rows per Q tile
    static constexpr int Bc = 64;                     // keys per K/V tile
    static constexpr int kKeysPerLane = Bc / 32;
    static constexpr int kVec = D / 32;
    static constexpr int kKStride = D + 4;  // padded K row: conflict-free float4 reads
    static constexpr int kSmemFloats = Bc * kKStride                   // K tile
                                       + Bc * D                        // V tile
                                       + kWarps * kRowsPerWarp * D     // Q rows, warp-private
                                       + kWarps * kRowsPerWarp * Bc;   // P~, warp-private
    static constexpr int kSmemBytes = kSmemFloats * static_cast<int>(sizeof(float));

    static_assert(D % 32 == 0 && D >= 32 && D <= 128, "fa1: D must be 32, 64 or 128");
    static_assert(kVec == 1 || kVec == 2 || kVec == 4, "fa1: a lane owns 1, 2 or 4 columns of O");
    static_assert(Bc % 32 == 0, "fa1: Bc must be a multiple of the warp size");
    static_assert(kKStride % 4 == 0, "fa1: K rows must stay 16-byte aligned");
    static_assert(kSmemBytes <= 227 * 1024, "fa1: tile does not fit in shared memory");
};

__device__ __forceinline__ void cp_async16(float* smem_dst, const float* gmem_src, bool valid) {
    const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
    const int src_size = valid ? 16 : 0;  // 0: write zeros, read nothing
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem_src),
                 "r"(src_size)
                 : "memory");
}

__device__ __forceinline__ void cp_async_commit_and_wait_all() {
    asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;\n" ::: "memory");
}

// Rows [row0, row0 + ROWS) of a [n_rows, D] matrix into shared memory (row stride STRIDE),
// zero-filling rows >= n_rows; `first` and `step` spread the 16-byte chunks over the threads.
template <int ROWS, int D, int STRIDE>
__device__ __forceinline__ void load_rows_async(float* dst, const float* src, int row0, int n_rows,
                                                int first, int step) {
    constexpr int kChunksPerRow = D / 4;
    constexpr int kChunks = ROWS * kChunksPerRow;
    for (int c = first; c < kChunks; c += step) {
        const int r = c / kChunksPerRow;
        const int cc = c % kChunksPerRow;
        const int row = row0 + r;
        const bool valid = row < n_rows;
        cp_async16(dst + r * STRIDE + cc * 4, src + static_cast<size_t>(valid ? row : 0) * D + cc * 4,
                   valid);
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
struct VecF {  // N adjacent floats as one 4-, 8- or 16-byte access
    static __device__ __forceinline__ void load(const float* p, float* r) {
        if constexpr (N == 4) {
            const float4 t = *reinterpret_cast<const float4*>(p);
            r[0] = t.x, r[1] = t.y, r[2] = t.z, r[3] = t.w;
        } else if constexpr (N == 2) {
            const float2 t = *reinterpret_cast<const float2*>(p);
            r[0] = t.x, r[1] = t.y;
        } else {
            r[0] = p[0];
        }
    }
};

__device__ __forceinline__ float get4(const float4& v, int i) {
    return i == 0 ? v.x : (i == 1 ? v.y : (i == 2 ? v.z : v.w));
}

}  // namespace

// faprof:launch kernel=fa1_fwd_kernel threads=128 dyn_smem=4*(64*(D+4)+64*D+4*8*D+4*8*64)
template <int D>
__global__ void __launch_bounds__(Fa1Tile<D>::kThreads)
fa1_fwd_kernel(const float* __restrict__ q,  // [B, H, Sq, D]
               const float* __restrict__ k,  // [B, H, Sk, D]
               const float* __restrict__ v,  // [B, H, Sk, D]
               float* o,                     // [B, H, Sq, D] read-modify-written per tile
               float* l,                     // [B, H, Sq]
               float* m,                     // [B, H, Sq]
               int Sq, int Sk, float scale, bool causal) {
    using T = Fa1Tile<D>;
    constexpr int RW = T::kRowsPerWarp;
    constexpr int Bc = T::Bc;
    constexpr int KPL = T::kKeysPerLane;
    constexpr int VEC = T::kVec;

    extern __shared__ __align__(16) float smem[];
    float* Ks = smem;                      // [Bc][kKStride]
    float* Vs = Ks + Bc * T::kKStride;     // [Bc][D]
    float* Qs = Vs + Bc * D;               // [kWarps][RW][D]
    float* Ps = Qs + T::kWarps * RW * D;   // [kWarps][RW][Bc]

    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    float* Qw = Qs + warp * RW * D;
    float* Pw = Ps + warp * RW * Bc;

    const size_t bh = blockIdx.x;
    const float* qb = q + bh * Sq * D;
    const float* kb = k + bh * Sk * D;
    const float* vb = v + bh * Sk * D;
    float* ob = o + bh * Sq * D;
    float* lb = l + bh * Sq;
    float* mb = m + bh * Sq;

    // Algorithm 1, line 2: O = 0, l = 0, m = -inf (in global memory).
    for (int i = threadIdx.x; i < Sq * D; i += T::kThreads) ob[i] = 0.f;
    for (int i = threadIdx.x; i < Sq; i += T::kThreads) {
        lb[i] = 0.f;
        mb[i] = -INFINITY;
    }
    // __syncthreads orders the block's global writes before its later reads (block scope).
    __syncthreads();

    int n_kv = (Sk + Bc - 1) / Bc;
    if (causal) n_kv = min(n_kv, (Sq + Bc - 1) / Bc);  // keys >= Sq are seen by no row
    const int n_groups = (Sq + RW - 1) / RW;  // row groups of RW rows; Br = kWarps groups
    for (int t = 0; t < n_kv; ++t) {
        const int kv0 = t * Bc;
        // Algorithm 1, line 6: load K_j, V_j to on-chip SRAM.
        load_rows_async<Bc, D, T::kKStride>(Ks, kb, kv0, Sk, threadIdx.x, T::kThreads);
        load_rows_async<Bc, D, D>(Vs, vb, kv0, Sk, threadIdx.x, T::kThreads);
        cp_async_commit_and_wait_all();
        __syncthreads();

        // Causal: a group whose last row precedes the tile's first key sees none of it.
        const int g_first = causal ? kv0 / RW : 0;
        // Algorithm 1, line 7: for each Q tile (here: each warp's row group).
        for (int g = g_first + warp; g < n_groups; g += T::kWarps) {
            const int row0 = g * RW;
            load_rows_async<RW, D, D>(Qw, qb, row0, Sq, lane, 32);
            cp_async_commit_and_wait_all();
            __syncwarp();

            // S = scale · Q_i K_jᵀ
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

            // m~, P~ = exp(S - m~), l~ per row; P~ to the warp's shared buffer.
            float m_tile[RW], l_tile[RW];
#pragma unroll
            for (int r = 0; r < RW; ++r) {
                const int qi = row0 + r;
                float mx = -INFINITY;
#pragma unroll
                for (int j = 0; j < KPL; ++j) {
                    const int kj = kv0 + lane + 32 * j;
                    float x = s[r][j] * scale;
                    if (kj >= Sk || (causal && kj > qi)) x = -INFINITY;
                    s[r][j] = x;
                    mx = fmaxf(mx, x);
                }
                mx = warp_max(mx);
                // A row that sees no key of this tile (mx = -inf) is left untouched below.
                const float m_use = (mx == -INFINITY) ? 0.f : mx;
                float psum = 0.f;
#pragma unroll
                for (int j = 0; j < KPL; ++j) {
                    const float p = exp2f((s[r][j] - m_use) * kLog2e);
                    Pw[r * Bc + lane + 32 * j] = p;
                    psum += p;
                }
                m_tile[r] = mx;
                l_tile[r] = warp_sum(psum);
            }
            __syncwarp();

            // P~ V for this lane's columns
            float pv[RW][VEC];
#pragma unroll
            for (int r = 0; r < RW; ++r)
#pragma unroll
                for (int c = 0; c < VEC; ++c) pv[r][c] = 0.f;
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
                        for (int c = 0; c < VEC; ++c) pv[r][c] = fmaf(p, vr[c], pv[r][c]);
                    }
                }
            }

            // Algorithm 1, lines 11-13: update O_i, l_i, m_i in global memory.
#pragma unroll
            for (int r = 0; r < RW; ++r) {
                const int qi = row0 + r;
                if (qi >= Sq || m_tile[r] == -INFINITY) continue;  // warp-uniform
                const float m_old = mb[qi];
                const float l_old = lb[qi];
                const float m_new = fmaxf(m_old, m_tile[r]);
                const float a_old = exp2f((m_old - m_new) * kLog2e);  // 0 when m_old = -inf
                const float a_new = exp2f((m_tile[r] - m_new) * kLog2e);
                const float l_new = fmaf(a_old, l_old, a_new * l_tile[r]);
                const float inv = 1.f / l_new;  // l_new >= a_new·l~ >= 1 term of e^0
                const float c_old = l_old * a_old * inv;
                const float c_new = a_new * inv;
                float* orow = ob + static_cast<size_t>(qi) * D + lane * VEC;
#pragma unroll
                for (int c = 0; c < VEC; ++c) orow[c] = fmaf(c_old, orow[c], c_new * pv[r][c]);
                if (lane == 0) {
                    lb[qi] = l_new;
                    mb[qi] = m_new;
                }
            }
            __syncwarp();  // Q and P~ buffers are reused by this warp's next group
        }
        __syncthreads();  // K/V buffers are refilled next; O, l, m writes ordered for all warps
    }
}

namespace {

template <int D>
cudaError_t launch_fa1(const float* q, const float* k, const float* v, float* o, float* l, float* m,
                       int B, int H, int Sq, int Sk, bool causal, float scale, cudaStream_t stream) {
    using T = Fa1Tile<D>;
    if (T::kSmemBytes > 48 * 1024) {
        const cudaError_t err = cudaFuncSetAttribute(
            fa1_fwd_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, T::kSmemBytes);
        if (err != cudaSuccess) return err;
    }
    const unsigned blocks = static_cast<unsigned>(B) * static_cast<unsigned>(H);
    fa1_fwd_kernel<D><<<blocks, T::kThreads, T::kSmemBytes, stream>>>(q, k, v, o, l, m, Sq, Sk, scale,
                                                                       causal);
    return cudaGetLastError();
}

}  // namespace

cudaError_t faprof_fa1_fwd(const float* q, const float* k, const float* v, float* o, float* l, float* m,
                           int B, int H, int Sq, int Sk, int D, bool causal, float scale,
                           cudaStream_t stream) {
    if (B < 1 || H < 1 || Sq < 1 || Sk < 1 || static_cast<long long>(B) * H > 0x7fffffffLL ||
        static_cast<long long>(Sq) * D > 0x7fffffffLL)
        return cudaErrorInvalidValue;
    switch (D) {
        case 32: return launch_fa1<32>(q, k, v, o, l, m, B, H, Sq, Sk, causal, scale, stream);
        case 64: return launch_fa1<64>(q, k, v, o, l, m, B, H, Sq, Sk, causal, scale, stream);
        case 128: return launch_fa1<128>(q, k, v, o, l, m, B, H, Sq, Sk, causal, scale, stream);
        default: return cudaErrorInvalidValue;
    }
}
