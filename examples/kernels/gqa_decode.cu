// A GQA decode kernel as a user would first write it, for `faprof profile --kernel`:
//
//   faprof profile --kernel examples/kernels/gqa_decode.cu --scenario examples/kernels/decode_small.toml --ncu
//
// One block per (sequence, KV head, 8 of the group's query rows): the query heads that share a KV
// head are packed into one tile (rows r = i * group + g: query i of head kvh * group + g), so each
// K/V row is read once per KV head. Four warps stride over the keys; each lane holds D/32 elements
// of a key, a warp-shuffle sum gives each row's score, an online softmax per (warp, row) keeps the
// running max, sum and output, and the four warps' partials are merged through shared memory.
// Dense K/V [B, Hkv, Sk, D] or a paged pool [num_blocks, page_size, Hkv, D] with a block table;
// causal aligned to either corner, windows, soft-cap; fp16 and bf16; D 64 or 128.
//
// What it does not do (on purpose: faprof's diagnosis should find it): split the KV sequence over
// blocks. With B * Hkv blocks for one decode token (8 at B=1 for Llama 3 70B's 8 KV heads) most SMs
// never load a byte.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

FAPROF_KERNEL_INFO("dtypes=fp16,bf16;head_dims=64,128;features=gqa,bottom_right,window,softcap,paged");

namespace {

constexpr int kWarps = 4;
constexpr int kRows = 8;  // packed query rows per block

template <typename T> __device__ float to_f(T x);
template <> __device__ float to_f<__half>(__half x) { return __half2float(x); }
template <> __device__ float to_f<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T> __device__ T from_f(float x);
template <> __device__ __half from_f<__half>(float x) { return __float2half(x); }
template <> __device__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) { return __float2bfloat16(x); }

template <typename T, int D>
__global__ void gqa_decode_kernel(const T *__restrict__ q,    // [B, H, Sq, D]
                                  const T *__restrict__ k,    // [B, Hkv, Sk, D] or pool [nb, page, Hkv, D]
                                  const T *__restrict__ v,    // like k
                                  T *__restrict__ out,        // [B, H, Sq, D]
                                  faprof_attention_problem p) {
    constexpr int E = D / 32;  // elements of a row per lane
    const int b = blockIdx.x, kvh = blockIdx.y, r0 = blockIdx.z * kRows;
    const int group = p.H / p.Hkv, rows = p.Sq * group;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int sk = p.page_size ? p.seqlens_k[b] : p.Sk;
    const int off = p.bottom_right ? sk - p.Sq : 0;

    __shared__ float qs[kRows][D];
    for (int t = threadIdx.x; t < kRows * D; t += blockDim.x) {
        int r = r0 + t / D, d = t % D;
        float x = 0.f;
        if (r < rows) {
            int i = r / group, h = kvh * group + r % group;
            x = to_f(q[(((size_t)b * p.H + h) * p.Sq + i) * D + d]);
        }
        qs[t / D][d] = x;
    }
    __syncthreads();

    float m[kRows], l[kRows], acc[kRows][E];
    for (int r = 0; r < kRows; ++r) {
        m[r] = -INFINITY;
        l[r] = 0.f;
        for (int e = 0; e < E; ++e) acc[r][e] = 0.f;
    }
    for (int j = warp; j < sk; j += kWarps) {
        size_t row;
        if (p.page_size) {
            int blk = p.block_table[(size_t)b * p.max_blocks + j / p.page_size];
            row = ((size_t)blk * p.page_size + j % p.page_size) * p.Hkv + kvh;
        } else {
            row = ((size_t)b * p.Hkv + kvh) * p.Sk + j;
        }
        float kr[E], vr[E];
        for (int e = 0; e < E; ++e) {
            kr[e] = to_f(k[row * D + lane * E + e]);
            vr[e] = to_f(v[row * D + lane * E + e]);
        }
        for (int r = 0; r < kRows; ++r) {
            int i = (r0 + r) / group;
            bool visible = r0 + r < rows && (!p.causal || j <= i + off) &&
                           (p.window_left < 0 || j >= i + off - p.window_left) &&
                           (p.window_right < 0 || j <= i + off + p.window_right);
            float s = 0.f;
            for (int e = 0; e < E; ++e) s += qs[r][lane * E + e] * kr[e];
            for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
            if (!visible) continue;  // the same for the whole warp: no divergence inside the shuffle
            s *= p.scale;
            if (p.softcap > 0.f) s = p.softcap * tanhf(s / p.softcap);
            float mn = fmaxf(m[r], s), a = __expf(m[r] - mn), w = __expf(s - mn);
            l[r] = l[r] * a + w;
            for (int e = 0; e < E; ++e) acc[r][e] = acc[r][e] * a + w * vr[e];
            m[r] = mn;
        }
    }

    // merge the warps' partials: max, rescaled sums and outputs
    __shared__ float ms[kWarps][kRows], ls[kWarps][kRows], os[kWarps][kRows][D];
    for (int r = 0; r < kRows; ++r) {
        if (lane == 0) {
            ms[warp][r] = m[r];
            ls[warp][r] = l[r];
        }
        for (int e = 0; e < E; ++e) os[warp][r][lane * E + e] = acc[r][e];
    }
    __syncthreads();
    for (int t = threadIdx.x; t < kRows * D; t += blockDim.x) {
        int r = t / D, d = t % D, rr = r0 + r;
        if (rr >= rows) continue;
        float mx = -INFINITY;
        for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, ms[w][r]);
        float sum = 0.f, o = 0.f;
        if (mx > -INFINITY) {
            for (int w = 0; w < kWarps; ++w) {
                float a = ms[w][r] > -INFINITY ? __expf(ms[w][r] - mx) : 0.f;
                sum += ls[w][r] * a;
                o += os[w][r][d] * a;
            }
        }
        int i = rr / group, h = kvh * group + rr % group;
        out[(((size_t)b * p.H + h) * p.Sq + i) * D + d] = from_f<T>(sum > 0.f ? o / sum : 0.f);
    }
}

template <typename T>
int launch(const void *q, const void *k, const void *v, void *out, const faprof_attention_problem *p,
           cudaStream_t stream) {
    int rows = p->Sq * (p->H / p->Hkv);
    dim3 grid(p->B, p->Hkv, (rows + kRows - 1) / kRows);
    if (p->D == 128)
        gqa_decode_kernel<T, 128><<<grid, 32 * kWarps, 0, stream>>>((const T *)q, (const T *)k, (const T *)v,
                                                                     (T *)out, *p);
    else
        gqa_decode_kernel<T, 64><<<grid, 32 * kWarps, 0, stream>>>((const T *)q, (const T *)k, (const T *)v,
                                                                    (T *)out, *p);
    return (int)cudaGetLastError();
}

}  // namespace

extern "C" FAPROF_PROBLEM_LAUNCHER(gqa_decode) {
    if ((problem->D != 64 && problem->D != 128) || problem->cu_seqlens_q != nullptr || problem->H % problem->Hkv)
        return (int)cudaErrorInvalidValue;  // packed (varlen) batches and other head dims: not handled
    if (problem->dtype == FAPROF_FP16) return launch<__half>(q, k, v, out, problem, stream);
    if (problem->dtype == FAPROF_BF16) return launch<__nv_bfloat16>(q, k, v, out, problem, stream);
    return (int)cudaErrorInvalidValue;
}
