// testonly_kernels.h — TEST ONLY: launchers of the kernels the tests use to break things on purpose
// (tests/kernels/), never part of faprof's extension.
//
// Plain CUDA, no torch headers, with kernels/faprof_kernels.h's conventions: tensors [B, H, S, D],
// contiguous; a launcher returns the launch's cudaError_t (cudaErrorInvalidValue for what it does
// not take) and never synchronizes, so faults surface at the next synchronization.
// testonly_binding.cpp wraps them as torch.ops.faprof_test.* ops; tests/kernels/testonly_variants.py
// builds that extension and registers the hidden variants _fault_oob, _race_atomic and _race_plain.
#pragma once

#include <cuda_runtime.h>

// ------------------------------------------------------------------------------------ fault
// A kernel that writes far outside any allocation, so that the next synchronization raises "an
// illegal memory access was encountered" and the CUDA context is lost for the process. The tests
// use it to check that a faulting variant is isolated (and that memcheck names its line).
cudaError_t faprof_fault_oob(const float* q,   // any fp32 CUDA tensor (read, to make the launch real)
                             float* out,       // any fp32 CUDA tensor (never written in bounds)
                             cudaStream_t stream);

// ------------------------------------------------------------------------------------- race
// Split-K attention (race.cu) summing partial outputs into `out` with atomicAdd (atomic = true:
// correct) or a plain load-add-store (atomic = false: a data race that loses updates). Zeroes
// `out` first. fp32, D <= 256, gridDim.z = B*H <= 65535.
cudaError_t faprof_race_fwd(const float* q,   // [B, H, Sq, D]
                            const float* k,   // [B, H, Sk, D]
                            const float* v,   // [B, H, Sk, D]
                            float* out,       // [B, H, Sq, D]
                            float* lse,       // [B, H, Sq] workspace
                            int B, int H, int Sq, int Sk, int D, bool causal, float scale, bool atomic,
                            cudaStream_t stream);

// -------------------------------------------------------------------------------- wgmma_test
// c[64, N] = A · B with one warpgroup's wgmma m64nNk16 (wgmma_test.cu), through the same
// descriptors and fragments as kernels/fa3_wgmma.cu and fa3_bwd.cuh: B = b[N, K] (b_mn_major =
// false) or b[K, N] (true, transpose-B descriptor); A = a[64, K] from swizzled shared memory or
// (a_in_regs) from registers, or (a_mn_major) A = aᵀ with a[K, 64] read MN-major through the
// transpose-A bit. fp16 or bf16 (a and b), c fp32; N in {64, 128}, K in {16, 64, 128}; lbo/sbo
// (a_lbo/a_sbo) in bytes override B's (an MN-major A's) descriptor offsets (< 0: the kernels'
// choice). cudaErrorNotSupported on a GPU that is not compute capability 9.0.
cudaError_t faprof_wgmma_gemm_test(const void* a, const void* b, float* c, int N, int K, bool b_mn_major,
                                   bool a_in_regs, bool bf16, int lbo, int sbo, bool a_mn_major, int a_lbo, int a_sbo,
                                   cudaStream_t stream);
