// Tiny kernels with known work, launched in faprof's NVTX layout, for the ncu parser fixtures.
//
// Why: reports of torch's own kernels are 60-75 MB because ncu stores the whole CUDA module
// (cubin) each profiled kernel comes from, and libtorch/cuBLAS modules are huge. These kernels
// live in a module of a few KB, and each does an exactly known amount of work, so the tests can
// compare ncu's hardware counts with the expected numbers:
//
//   tiny_ffma : every thread runs kFmaChains x iters dependent `fma.rn.f32` (inline PTX, one
//               FFMA each) and nothing else in floating point: fp32 FLOPs = 2 * FFMA count.
//   tiny_hmma : every warp runs iters wmma 16x16x16 fp16 -> fp32 mma_sync: 2*16*16*16 FLOPs each.
//   tiny_smem : every thread reads shared memory with a stride of 32 words: 32-way bank conflicts.
//
// NVTX layout (as faprof.nsight.target): warm-up calls inside `faprof_warmup`, then each measured
// launch inside nested push/pop ranges `<variant>` > `<shape_id>` > `iter0`. One extra kernel
// (`tiny_setup`) runs outside every range, so a filter that only excludes the warm-up profiles it
// and the parser must leave it unattributed.
//
// Usage: tiny_kernels PLAN_JSON [ffma,hmma,smem]   (writes the plan: every measured launch with its
//        expected work; the optional list picks the kernels measured, all by default)
// Build: nvcc -O3 -lineinfo -arch=sm_90 -o tiny_kernels tiny_kernels.cu   (see
//        scripts/record/record_ncu_fixtures.sh)

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>
#include <nvtx3/nvToolsExt.h>

#define CHECK(call)                                                                  \
  do {                                                                               \
    cudaError_t err_ = (call);                                                       \
    if (err_ != cudaSuccess) {                                                       \
      std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(err_)); \
      std::exit(1);                                                                  \
    }                                                                                \
  } while (0)

constexpr int kFmaChains = 4;     // independent accumulators per thread (keeps the FMA pipe busy)
constexpr int kFmaIters = 256;    // FFMA per chain
constexpr int kFmaThreads = 128;  // threads per block
constexpr int kMmaIters = 64;     // mma_sync per warp
constexpr int kMmaWarpsPerBlock = 4;
constexpr int kSmemIters = 64;    // shared loads per thread
constexpr int kSmemStride = 32;   // words: every lane of a warp hits the same bank

// x[i] <- fma(x[i], a, b) kFmaIters times per chain; in [n*4] -> out [n*4].
__global__ void tiny_ffma(const float* __restrict__ in,  // [threads * kFmaChains]
                          float* __restrict__ out,       // [threads * kFmaChains]
                          float a, float b) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  float x[kFmaChains];
#pragma unroll
  for (int c = 0; c < kFmaChains; ++c) x[c] = in[t * kFmaChains + c];
  for (int i = 0; i < kFmaIters; ++i) {
#pragma unroll
    for (int c = 0; c < kFmaChains; ++c) asm volatile("fma.rn.f32 %0, %0, %1, %2;" : "+f"(x[c]) : "f"(a), "f"(b));
  }
#pragma unroll
  for (int c = 0; c < kFmaChains; ++c) out[t * kFmaChains + c] = x[c];
}

// Every warp: C = sum over kMmaIters of A*B (16x16x16, fp16 in, fp32 accumulate).
__global__ void tiny_hmma(const half* __restrict__ A,  // [16, 16] row-major
                          const half* __restrict__ B,  // [16, 16] col-major
                          float* __restrict__ C) {     // [warps, 16, 16]
  using namespace nvcuda;
  wmma::fragment<wmma::matrix_a, 16, 16, 16, half, wmma::row_major> a;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, half, wmma::col_major> b;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> c;
  wmma::fill_fragment(c, 0.0f);
  wmma::load_matrix_sync(a, A, 16);
  wmma::load_matrix_sync(b, B, 16);
  for (int i = 0; i < kMmaIters; ++i) wmma::mma_sync(c, a, b, c);
  const int warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
  wmma::store_matrix_sync(C + warp * 256, c, 16, wmma::mem_row_major);
}

// Strided shared-memory reads: lane l of a warp reads word (l * 32 + i) % 1024, all in one bank.
__global__ void tiny_smem(int* __restrict__ out) {  // [threads]
  __shared__ int s[1024];
  for (int i = threadIdx.x; i < 1024; i += blockDim.x) s[i] = i;
  __syncthreads();
  int acc = 0;
  for (int i = 0; i < kSmemIters; ++i) acc ^= s[(threadIdx.x * kSmemStride + i) & 1023];
  out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
}

// Runs outside every NVTX range: a filter must not attribute it to a variant.
__global__ void tiny_setup(float* __restrict__ p, int n) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t < n) p[t] = 0.5f + 1e-3f * (t & 1023);
}

struct Launch {
  const char* variant;
  char shape_id[64];
  int blocks;
  int threads;
};

static void push3(const char* variant, const char* shape) {
  nvtxRangePushA(variant);
  nvtxRangePushA(shape);
  nvtxRangePushA("iter0");
}

static void pop3() {
  nvtxRangePop();
  nvtxRangePop();
  nvtxRangePop();
}

int main(int argc, char** argv) {
  if (argc != 2 && argc != 3) {
    std::fprintf(stderr, "usage: %s PLAN_JSON [ffma,hmma,smem]\n", argv[0]);
    return 2;
  }
  const char* pick = argc == 3 ? argv[2] : "ffma,hmma,smem";
  const bool do_ffma = std::strstr(pick, "ffma") != nullptr;
  const bool do_hmma = std::strstr(pick, "hmma") != nullptr;
  const bool do_smem = std::strstr(pick, "smem") != nullptr;
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));

  const int ffma_blocks[2] = {2 * sms, 1};  // a full GPU (2 blocks per SM) and a single block
  const int max_threads = 2 * sms * kFmaThreads;
  float *in, *out, *C;
  half *A, *B;
  int* iout;
  CHECK(cudaMalloc(&in, sizeof(float) * max_threads * kFmaChains));
  CHECK(cudaMalloc(&out, sizeof(float) * max_threads * kFmaChains));
  CHECK(cudaMalloc(&A, sizeof(half) * 256));
  CHECK(cudaMalloc(&B, sizeof(half) * 256));
  const int mma_blocks = sms;
  const int mma_warps = mma_blocks * kMmaWarpsPerBlock;
  CHECK(cudaMalloc(&C, sizeof(float) * 256 * mma_warps));
  CHECK(cudaMalloc(&iout, sizeof(int) * sms * 256));
  CHECK(cudaMemset(A, 0, sizeof(half) * 256));
  CHECK(cudaMemset(B, 0, sizeof(half) * 256));

  tiny_setup<<<(max_threads * kFmaChains + 255) / 256, 256>>>(in, max_threads * kFmaChains);
  CHECK(cudaGetLastError());

  nvtxRangePushA("faprof_warmup");
  tiny_ffma<<<ffma_blocks[0], kFmaThreads>>>(in, out, 1.0001f, 1e-4f);
  tiny_hmma<<<mma_blocks, kMmaWarpsPerBlock * 32>>>(A, B, C);
  tiny_smem<<<sms, 256>>>(iout);
  nvtxRangePop();
  CHECK(cudaDeviceSynchronize());

  FILE* plan = std::fopen(argv[1], "w");
  if (!plan) {
    std::perror(argv[1]);
    return 1;
  }
  std::fprintf(plan, "{\n \"scenario\": \"tiny_kernels\",\n \"tool\": \"ncu\",\n \"pairs\": [\n");
  const char* sep = "";

  for (int k = 0; k < 2 && do_ffma; ++k) {
    const int threads = ffma_blocks[k] * kFmaThreads;
    char shape[64];
    std::snprintf(shape, sizeof shape, "blocks%d_t%d_it%d", ffma_blocks[k], kFmaThreads, kFmaIters);
    push3("tiny_ffma", shape);
    tiny_ffma<<<ffma_blocks[k], kFmaThreads>>>(in, out, 1.0001f, 1e-4f);
    pop3();
    CHECK(cudaDeviceSynchronize());
    const long long ffma = 1LL * threads * kFmaChains * kFmaIters;
    std::fprintf(plan,
                 "%s  {\"variant\": \"tiny_ffma\", \"shape_id\": \"%s\", \"problem\": null, \"iters\": 1, "
                 "\"ran\": true, \"reason\": \"\", \"expected\": {\"kernel\": \"tiny_ffma\", \"blocks\": %d, "
                 "\"threads_per_block\": %d, \"ffma\": %lld, \"fp32_flops\": %lld, \"tensor_flops\": 0}}",
                 sep, shape, ffma_blocks[k], kFmaThreads, ffma, 2 * ffma);
    sep = ",\n";
  }
  if (do_hmma) {
    char shape[64];
    std::snprintf(shape, sizeof shape, "warps%d_it%d", mma_warps, kMmaIters);
    push3("tiny_hmma", shape);
    tiny_hmma<<<mma_blocks, kMmaWarpsPerBlock * 32>>>(A, B, C);
    pop3();
    CHECK(cudaDeviceSynchronize());
    const long long mma = 1LL * mma_warps * kMmaIters;
    std::fprintf(plan,
                 "%s  {\"variant\": \"tiny_hmma\", \"shape_id\": \"%s\", \"problem\": null, \"iters\": 1, "
                 "\"ran\": true, \"reason\": \"\", \"expected\": {\"kernel\": \"tiny_hmma\", \"blocks\": %d, "
                 "\"threads_per_block\": %d, \"wmma_m16n16k16\": %lld, \"fp32_flops\": 0, "
                 "\"tensor_flops\": %lld}}",
                 sep, shape, mma_blocks, kMmaWarpsPerBlock * 32, mma, mma * 2 * 16 * 16 * 16);
    sep = ",\n";
  }
  if (do_smem) {
    char shape[64];
    std::snprintf(shape, sizeof shape, "blocks%d_stride%d_it%d", sms, kSmemStride, kSmemIters);
    push3("tiny_smem", shape);
    tiny_smem<<<sms, 256>>>(iout);
    pop3();
    CHECK(cudaDeviceSynchronize());
    std::fprintf(plan,
                 "%s  {\"variant\": \"tiny_smem\", \"shape_id\": \"%s\", \"problem\": null, \"iters\": 1, "
                 "\"ran\": true, \"reason\": \"\", \"expected\": {\"kernel\": \"tiny_smem\", \"blocks\": %d, "
                 "\"threads_per_block\": 256, \"static_smem_bytes\": 4096, \"shared_loads_per_thread\": %d}}",
                 sep, shape, sms, kSmemIters);
  }
  std::fprintf(plan, "\n ]\n}\n");
  std::fclose(plan);
  CHECK(cudaFree(in));
  CHECK(cudaFree(out));
  CHECK(cudaFree(A));
  CHECK(cudaFree(B));
  CHECK(cudaFree(C));
  CHECK(cudaFree(iout));
  return 0;
}
