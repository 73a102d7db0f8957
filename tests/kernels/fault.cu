// fault: TEST ONLY. A kernel that faults on purpose with a write far outside any allocation.
//
// faprof runs every variant in a way that survives a kernel that corrupts the CUDA context
// ("an illegal memory access was encountered": the context is lost and every later CUDA call in
// the process fails). This kernel is how the tests produce such a fault deterministically.
//
// The target is a fixed address in the first page of the virtual address space, which CUDA never
// maps (the device's null page), passed in from the host so the compiler cannot prove anything
// about it; the value written depends on q so the launch does real work. The fault surfaces at
// the next synchronization, not at launch: cudaGetLastError() after the launch is cudaSuccess.
//
// Built only by tests/kernels/testonly_variants.py as its own small extension (torch.ops.faprof_test.*),
// never part of faprof's; the CPU build tests (tests/test_build.py, test_fa3_build.py) compile it for sm_80, sm_89 and sm_90a.
#include <cuda_runtime.h>

#include <cstdint>

#include "testonly_kernels.h"

namespace {

// Inside the unmapped first page, 16-byte aligned (a misaligned address would raise a
// different error).
constexpr std::uintptr_t kUnmappedAddress = 0x100;

}  // namespace

// faprof:launch kernel=fault_oob_kernel threads=32 dyn_smem=0
__global__ void fault_oob_kernel(const float* __restrict__ q,  // any fp32 CUDA tensor, >= 1 element
                                 float* __restrict__ out,      // never written in bounds
                                 float* bad) {                 // unmapped address
    volatile float* target = bad;
    target[threadIdx.x] = q[0] + 1.f;
    if (threadIdx.x == 0 && q[0] != q[0]) out[0] = q[0];  // keeps `out` live; never true for finite q
}

cudaError_t faprof_fault_oob(const float* q, float* out, cudaStream_t stream) {
    if (q == nullptr || out == nullptr) return cudaErrorInvalidValue;
    fault_oob_kernel<<<1, 32, 0, stream>>>(q, out, reinterpret_cast<float*>(kUnmappedAddress));
    return cudaGetLastError();
}
