// wgmma_test: TEST ONLY. One warpgroup computes C[64, N] = A[64, K] · B with wgmma.mma_async
// m64nNk16 (K/16 steps in one commit group), through the same descriptors, swizzled layout and
// register fragments as kernels/fa3_wgmma.cu, so that a layout or descriptor bug shows up in a
// plain GEMM against torch.matmul before it shows up as a wrong attention output.
//
//   A [64, K] row-major, from SW128 shared memory (SS form) or from registers (RS form, the
//     m16n8k16 A fragment, as P is fed to PV); or (a_mn_major, SS only) given as Aᵀ = a[K, 64]
//     row-major and read MN-major through the transpose-A bit, as the Hopper backward reads dS
//     from its dSᵀ tile (kernels/fa3_bwd.cuh);
//   B either [N, K] row-major ("K-major", as K in S = Q·Kᵀ) or [K, N] row-major ("MN-major",
//     transpose-B bit set, as V in O = P·V);
//   C [64, N] fp32, written from the accumulator fragment (kernels/fa3_common.cuh).
// K in {16, 64, 128} (one step; one 64-wide swizzle block of 4 steps, as the backward's dV/dK at
// D=128 (K = 64 query rows); two blocks of 4 steps each), N in {64, 128}; fp16 or bf16. lbo/sbo
// (bytes, < 0: the kernel's own choice) override B's descriptor offsets, a_lbo/a_sbo those of an
// MN-major A, so that a failing layout can be diagnosed by trying the alternatives in one GPU run
// (scripts/gpu/wgmma_diag.py).
//
// Built only by tests/kernels/testonly_variants.py as its own small extension (torch.ops.faprof_test.*),
// never part of faprof's; the CPU build tests (tests/test_build.py, test_fa3_build.py) compile it for sm_80, sm_89 and sm_90a.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "fa3_bwd.cuh"  // the SS wrappers with a transposed A
#include "fa3_common.cuh"
#include "testonly_kernels.h"

namespace faprof_fa3 {

constexpr int kTestSmemBytes = 64 * 128 * 2 + 128 * 128 * 2 + 1024;  // A, B (largest), alignment slack

// faprof:launch kernel=wgmma_gemm_test_kernel threads=128 dyn_smem=50176
template <typename T, int N, int K, bool MN_MAJOR, bool A_REGS, bool A_MN = false>
__global__ void __launch_bounds__(128) wgmma_gemm_test_kernel(const T* __restrict__ a, const T* __restrict__ b,
                                                              float* __restrict__ c, int lbo, int sbo, int a_lbo,
                                                              int a_sbo) {
  static_assert(!(A_MN && A_REGS), "an A operand from registers has no major-ness");
#if FAPROF_SM90A
  constexpr bool BF16 = std::is_same<T, __nv_bfloat16>::value;
  constexpr int KP = K < 64 ? 64 : K;  // K-major tiles hold whole 128-byte rows
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  const uint32_t sA = smem_u32(smem);
  const uint32_t sB = sA + 64 * 128 * 2;
  const int tid = threadIdx.x;

  // Element-wise fills (a test, not a fast path): zero beyond K.
  if constexpr (A_MN) {  // a = Aᵀ [K, 64]: row k, column m; K rows of one 64-column block
    for (int i = tid; i < K * 64; i += 128) {
      const int r = i / 64, col = i % 64;
      *reinterpret_cast<T*>(smem + sw128_offset(K, r, col)) = a[r * 64 + col];
    }
  } else {
    for (int i = tid; i < 64 * KP; i += 128) {
      const int r = i / KP, col = i % KP;
      *reinterpret_cast<T*>(smem + sw128_offset(64, r, col)) = col < K ? a[r * K + col] : T{};
    }
  }
  unsigned char* smem_b = smem + 64 * 128 * 2;
  if constexpr (MN_MAJOR) {
    for (int i = tid; i < K * N; i += 128) {
      const int r = i / N, col = i % N;  // row k, column n
      *reinterpret_cast<T*>(smem_b + sw128_offset(K, r, col)) = b[r * N + col];
    }
  } else {
    for (int i = tid; i < N * KP; i += 128) {
      const int r = i / KP, col = i % KP;  // row n, column k
      *reinterpret_cast<T*>(smem_b + sw128_offset(N, r, col)) = col < K ? b[r * K + col] : T{};
    }
  }
  fence_proxy_async();
  __syncthreads();

  const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const uint32_t b_lbo = lbo >= 0 ? static_cast<uint32_t>(lbo) : (MN_MAJOR ? K * 128u : 16u);
  const uint32_t b_sbo = sbo >= 0 ? static_cast<uint32_t>(sbo) : 1024u;

  float acc[N / 2];
#pragma unroll
  for (int i = 0; i < N / 2; ++i) acc[i] = 12345.f;  // scale-d = 0 on the first step must discard this
  uint32_t afrag[K / 16][4];
  if constexpr (A_REGS) {
#pragma unroll
    for (int ks = 0; ks < K / 16; ++ks) {
      const T* r0 = a + (16 * warp + g) * K + 16 * ks + 2 * t;
      const T* r8 = r0 + 8 * K;
      afrag[ks][0] = *reinterpret_cast<const uint32_t*>(r0);
      afrag[ks][1] = *reinterpret_cast<const uint32_t*>(r8);
      afrag[ks][2] = *reinterpret_cast<const uint32_t*>(r0 + 8);
      afrag[ks][3] = *reinterpret_cast<const uint32_t*>(r8 + 8);
    }
  }
  wgmma_fence();
  fence_regs(acc);
#pragma unroll
  for (int ks = 0; ks < K / 16; ++ks) {
    const uint32_t b_addr = MN_MAJOR ? sB + ks * 16 * 128 : sB + (ks >> 2) * N * 128 + (ks & 3) * 32;
    const uint64_t db = make_desc(b_addr, b_lbo, b_sbo);
    if constexpr (A_REGS) {
      wgmma_rs<N, BF16, MN_MAJOR ? 1 : 0>(acc, afrag[ks], db, ks > 0);
    } else if constexpr (A_MN) {  // as the backward's dQ: k16 step ks = rows 16ks.., LBO = the M-block stride
      const uint32_t a_l = a_lbo >= 0 ? static_cast<uint32_t>(a_lbo) : K * 128u;
      const uint32_t a_s = a_sbo >= 0 ? static_cast<uint32_t>(a_sbo) : 1024u;
      faprof_fa3_bwd::wgmma_sst<N, BF16, 1, MN_MAJOR ? 1 : 0>(acc, make_desc(sA + ks * 16 * 128, a_l, a_s), db, ks > 0);
    } else {
      const uint64_t da = make_desc(sA + (ks >> 2) * 64 * 128 + (ks & 3) * 32, 16, 1024);
      wgmma_ss<N, BF16, MN_MAJOR ? 1 : 0>(acc, da, db, ks > 0);
    }
  }
  wgmma_commit();
  wgmma_wait<0>();
  fence_regs(acc);
#pragma unroll
  for (int i = 0; i < N / 2; ++i) {
    const int row = 16 * warp + g + 8 * ((i >> 1) & 1);
    const int col = 8 * (i >> 2) + 2 * t + (i & 1);
    c[row * N + col] = acc[i];
  }
#else
  __trap();  // sm_90a only; the launcher refuses other devices first
#endif
}

// Descriptor overrides of one call (bytes; < 0: the kernel's own choice).
struct Offsets {
  int lbo, sbo, a_lbo, a_sbo;
};

template <typename T, int N, int K, bool MN, bool RS, bool A_MN>
cudaError_t test_launch(const void* a, const void* b, float* c, Offsets o, cudaStream_t stream) {
  auto kernel = wgmma_gemm_test_kernel<T, N, K, MN, RS, A_MN>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kTestSmemBytes);
  if (err != cudaSuccess) return err;
  kernel<<<1, 128, kTestSmemBytes, stream>>>(static_cast<const T*>(a), static_cast<const T*>(b), c, o.lbo, o.sbo,
                                             o.a_lbo, o.a_sbo);
  return cudaGetLastError();
}

// A form: from registers (rs), MN-major from shared memory (a_mn), or K-major from shared memory.
template <typename T, int N, int K, bool MN>
cudaError_t test_dispatch_a(const void* a, const void* b, float* c, bool rs, bool a_mn, Offsets o, cudaStream_t s) {
  if (rs) return test_launch<T, N, K, MN, true, false>(a, b, c, o, s);
  return a_mn ? test_launch<T, N, K, MN, false, true>(a, b, c, o, s) : test_launch<T, N, K, MN, false, false>(a, b, c, o, s);
}

template <typename T, int N, int K>
cudaError_t test_dispatch_form(const void* a, const void* b, float* c, bool mn, bool rs, bool a_mn, Offsets o,
                               cudaStream_t s) {
  return mn ? test_dispatch_a<T, N, K, true>(a, b, c, rs, a_mn, o, s)
            : test_dispatch_a<T, N, K, false>(a, b, c, rs, a_mn, o, s);
}

template <typename T>
cudaError_t test_dispatch(const void* a, const void* b, float* c, int N, int K, bool mn, bool rs, bool a_mn,
                          Offsets o, cudaStream_t s) {
  if (N == 64 && K == 16) return test_dispatch_form<T, 64, 16>(a, b, c, mn, rs, a_mn, o, s);
  if (N == 64 && K == 64) return test_dispatch_form<T, 64, 64>(a, b, c, mn, rs, a_mn, o, s);
  if (N == 64 && K == 128) return test_dispatch_form<T, 64, 128>(a, b, c, mn, rs, a_mn, o, s);
  if (N == 128 && K == 16) return test_dispatch_form<T, 128, 16>(a, b, c, mn, rs, a_mn, o, s);
  if (N == 128 && K == 64) return test_dispatch_form<T, 128, 64>(a, b, c, mn, rs, a_mn, o, s);
  if (N == 128 && K == 128) return test_dispatch_form<T, 128, 128>(a, b, c, mn, rs, a_mn, o, s);
  return cudaErrorInvalidValue;
}

}  // namespace faprof_fa3

cudaError_t faprof_wgmma_gemm_test(const void* a, const void* b, float* c, int N, int K, bool b_mn_major,
                                   bool a_in_regs, bool bf16, int lbo, int sbo, bool a_mn_major, int a_lbo, int a_sbo,
                                   cudaStream_t stream) {
  using namespace faprof_fa3;
  if (!((N == 64 || N == 128) && (K == 16 || K == 64 || K == 128)) || (a_in_regs && a_mn_major))
    return cudaErrorInvalidValue;
  const cudaError_t err = require_sm90a();
  if (err != cudaSuccess) return err;
  const Offsets o{lbo, sbo, a_lbo, a_sbo};
  return bf16 ? test_dispatch<__nv_bfloat16>(a, b, c, N, K, b_mn_major, a_in_regs, a_mn_major, o, stream)
              : test_dispatch<__half>(a, b, c, N, K, b_mn_major, a_in_regs, a_mn_major, o, stream);
}
