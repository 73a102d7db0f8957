// race: TEST ONLY. Split-K attention whose partial outputs are summed into `out` either with
// atomicAdd (correct up to fp32 rounding order) or with a plain load-add-store (a data race: CTAs
// that add to the same element at the same time lose each other's updates).
//
// faprof's harness must catch a race that corrupts outputs, including one that shows only in the
// timed calls. This kernel is how the GPU tests produce a real one: the same code passes with
// atomics and fails without. fp32, any D <= 256, causal (top-left) or not.
//
// Pass 1 (race_lse_kernel): one thread per query row computes the row's log-sum-exp of
// scale·q·kᵀ over the keys it may see. Pass 2 (race_accum_kernel): grid (row blocks, key chunks,
// B·H); each thread owns one query row and one key chunk and adds exp(s - lse)·v over the chunk
// to out[row, :]. With kRaceChunk = 16 keys, S = 512 gives 32 CTAs adding into every row.
//
// Built only by tests/kernels/testonly_variants.py as its own small extension (torch.ops.faprof_test.*),
// never part of faprof's; the CPU build tests (tests/test_build.py, test_fa3_build.py) compile it for sm_80, sm_89 and sm_90a.
#include <cuda_runtime.h>

#include "testonly_kernels.h"

namespace {

constexpr int kRaceRows = 64;   // query rows per CTA (one per thread)
constexpr int kRaceChunk = 16;  // keys per CTA in pass 2
constexpr int kRaceMaxD = 256;

__device__ __forceinline__ float row_dot(const float* a, const float* b, int D) {
    float s = 0.f;
    for (int d = 0; d < D; ++d) s += a[d] * b[d];
    return s;
}

}  // namespace

// faprof:launch kernel=race_lse_kernel threads=64 dyn_smem=0
__global__ void race_lse_kernel(const float* __restrict__ q,  // [B, H, Sq, D]
                                const float* __restrict__ k,  // [B, H, Sk, D]
                                float* __restrict__ lse,      // [B, H, Sq]
                                int Sq, int Sk, int D, bool causal, float scale) {
    const int bh = blockIdx.y;
    const int row = blockIdx.x * kRaceRows + threadIdx.x;
    if (row >= Sq) return;
    const float* qr = q + (static_cast<long long>(bh) * Sq + row) * D;
    const float* kb = k + static_cast<long long>(bh) * Sk * D;
    const int last = causal ? min(row, Sk - 1) : Sk - 1;
    float m = -INFINITY, l = 0.f;
    for (int j = 0; j <= last; ++j) {
        const float s = scale * row_dot(qr, kb + static_cast<long long>(j) * D, D);
        const float mn = fmaxf(m, s);
        l = l * __expf(m - mn) + __expf(s - mn);
        m = mn;
    }
    lse[static_cast<long long>(bh) * Sq + row] = m + __logf(l);
}

// faprof:launch kernel=race_accum_kernel threads=64 dyn_smem=0
__global__ void race_accum_kernel(const float* __restrict__ q,    // [B, H, Sq, D]
                                  const float* __restrict__ k,    // [B, H, Sk, D]
                                  const float* __restrict__ v,    // [B, H, Sk, D]
                                  const float* __restrict__ lse,  // [B, H, Sq]
                                  float* out,                     // [B, H, Sq, D], zeroed before
                                  int Sq, int Sk, int D, bool causal, float scale, bool atomic) {
    const int bh = blockIdx.z;
    const int row = blockIdx.x * kRaceRows + threadIdx.x;
    const int j0 = blockIdx.y * kRaceChunk;
    if (row >= Sq) return;
    const float* qr = q + (static_cast<long long>(bh) * Sq + row) * D;
    const float* kb = k + static_cast<long long>(bh) * Sk * D;
    const float* vb = v + static_cast<long long>(bh) * Sk * D;
    const float row_lse = lse[static_cast<long long>(bh) * Sq + row];
    const int last = min(j0 + kRaceChunk, causal ? min(row + 1, Sk) : Sk);
    float acc[kRaceMaxD];
    for (int d = 0; d < D; ++d) acc[d] = 0.f;
    bool any = false;
    for (int j = j0; j < last; ++j) {
        const float p = __expf(scale * row_dot(qr, kb + static_cast<long long>(j) * D, D) - row_lse);
        for (int d = 0; d < D; ++d) acc[d] += p * vb[static_cast<long long>(j) * D + d];
        any = true;
    }
    if (!any) return;
    float* orow = out + (static_cast<long long>(bh) * Sq + row) * D;
    for (int d = 0; d < D; ++d) {
        if (atomic) {
            atomicAdd(orow + d, acc[d]);
        } else {
            volatile float* o = orow + d;  // plain read-modify-write: the race
            *o = *o + acc[d];
        }
    }
}

cudaError_t faprof_race_fwd(const float* q, const float* k, const float* v, float* out, float* lse, int B, int H,
                            int Sq, int Sk, int D, bool causal, float scale, bool atomic, cudaStream_t stream) {
    if (q == nullptr || k == nullptr || v == nullptr || out == nullptr || lse == nullptr) return cudaErrorInvalidValue;
    if (B < 1 || H < 1 || Sq < 1 || Sk < 1 || D < 1 || D > kRaceMaxD || B * H > 65535) return cudaErrorInvalidValue;
    cudaError_t e = cudaMemsetAsync(out, 0, sizeof(float) * static_cast<size_t>(B) * H * Sq * D, stream);
    if (e != cudaSuccess) return e;
    const dim3 g1((Sq + kRaceRows - 1) / kRaceRows, B * H);
    race_lse_kernel<<<g1, kRaceRows, 0, stream>>>(q, k, lse, Sq, Sk, D, causal, scale);
    const dim3 g2((Sq + kRaceRows - 1) / kRaceRows, (Sk + kRaceChunk - 1) / kRaceChunk, B * H);
    race_accum_kernel<<<g2, kRaceRows, 0, stream>>>(q, k, v, lse, out, Sq, Sk, D, causal, scale, atomic);
    return cudaGetLastError();
}
