// TEST ONLY: torch ops for the kernels the tests use to break things on purpose (torch.ops.faprof_test.*),
// built as their own small extension by tests/kernels/testonly_variants.py, never as part of
// faprof's. The checks mirror kernels/binding.cpp's for the same ops (they lived there before these
// kernels moved out of faprof's extension); the kernels are plain CUDA behind testonly_kernels.h.
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "testonly_kernels.h"

namespace {

// CUDA, on q's device, `dtype` (fp32) or 16-bit (fp16/bf16, q's dtype) when sixteen_bit, contiguous.
void check_tensor(const char* op, const char* name, const at::Tensor& t, const at::Tensor& q,
                  bool sixteen_bit = false) {
    TORCH_CHECK(t.defined() && t.is_cuda(), op, ": ", name, " must be a CUDA tensor");
    TORCH_CHECK(t.device() == q.device(), op, ": ", name, " is on ", t.device(), " but q is on ", q.device());
    if (sixteen_bit) {
        TORCH_CHECK(t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16, op, ": ", name,
                    " must be float16 or bfloat16, got ", t.scalar_type());
        TORCH_CHECK(t.scalar_type() == q.scalar_type(), op, ": ", name, " must be in q's dtype");
    } else {
        TORCH_CHECK(t.scalar_type() == at::kFloat, op, ": ", name, " must be float32, got ", t.scalar_type());
    }
    TORCH_CHECK(t.is_contiguous(), op, ": ", name, " must be contiguous");
}

void check_launch(const char* op, cudaError_t err) {
    TORCH_CHECK(err == cudaSuccess, op, ": CUDA error ", cudaGetErrorName(err), ": ", cudaGetErrorString(err));
}

cudaStream_t stream_of(const at::Tensor& q) {
    return c10::cuda::getCurrentCUDAStream(q.get_device()).stream();
}

// wgmma exists only in sm_90a code, which runs on compute capability 9.0 exactly.
void check_sm90a(const char* op, const at::Tensor& q) {
    int major = 0, minor = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, q.get_device());
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, q.get_device());
    TORCH_CHECK(major == 9 && minor == 0, op, ": needs sm_90a (wgmma/TMA), i.e. a compute capability 9.0 GPU "
                "(H100/H200); this one is ", major, ".", minor);
}

// Faults on purpose (fault.cu); the error surfaces at the next sync.
void fault_oob(const at::Tensor& q, at::Tensor& out) {
    constexpr const char* op = "faprof_test::fault_oob";
    check_tensor(op, "q", q, q);
    check_tensor(op, "out", out, q);
    TORCH_CHECK(q.numel() > 0 && out.numel() > 0, op, ": q and out must not be empty");
    c10::cuda::CUDAGuard guard(q.device());
    check_launch(op, faprof_fault_oob(q.data_ptr<float>(), out.data_ptr<float>(), stream_of(q)));
}

// Split-K attention with (atomic) or without (racy) atomic accumulation (race.cu).
void race_fwd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, at::Tensor& out, at::Tensor& lse,
              bool causal, double scale, bool atomic) {
    constexpr const char* op = "faprof_test::race_fwd";
    for (const auto& [name, t] : {std::pair<const char*, const at::Tensor*>{"q", &q}, {"k", &k}, {"v", &v},
                                  {"out", &out}, {"lse", &lse}})
        check_tensor(op, name, *t, q);
    TORCH_CHECK(q.dim() == 4 && k.sizes() == v.sizes() && out.sizes() == q.sizes(), op,
                ": q/out must be [B, H, Sq, D] and k, v [B, H, Sk, D] of one shape");
    TORCH_CHECK(lse.numel() == q.size(0) * q.size(1) * q.size(2), op, ": lse must hold B*H*Sq floats");
    c10::cuda::CUDAGuard guard(q.device());
    check_launch(op, faprof_race_fwd(q.data_ptr<float>(), k.data_ptr<float>(), v.data_ptr<float>(),
                                     out.data_ptr<float>(), lse.data_ptr<float>(), static_cast<int>(q.size(0)),
                                     static_cast<int>(q.size(1)), static_cast<int>(q.size(2)),
                                     static_cast<int>(k.size(2)), static_cast<int>(q.size(3)), causal,
                                     static_cast<float>(scale), atomic, stream_of(q)));
}

// One warpgroup GEMM through wgmma (wgmma_test.cu).
void wgmma_gemm_test(const at::Tensor& a, const at::Tensor& b, at::Tensor& c, bool b_mn_major, bool a_in_regs,
                     int64_t lbo, int64_t sbo, bool a_mn_major, int64_t a_lbo, int64_t a_sbo) {
    constexpr const char* op = "faprof_test::wgmma_gemm_test";
    check_tensor(op, "a", a, a, true);
    check_tensor(op, "b", b, a, true);
    check_tensor(op, "c", c, a);
    TORCH_CHECK(!(a_in_regs && a_mn_major), op, ": a_in_regs and a_mn_major exclude each other");
    TORCH_CHECK(a.dim() == 2 && a.size(a_mn_major ? 1 : 0) == 64, op, ": a must be ",
                a_mn_major ? "[K, 64] (a_mn_major: A = aᵀ)" : "[64, K]", ", got ", a.sizes());
    const int64_t K = a.size(a_mn_major ? 0 : 1);
    TORCH_CHECK(c.dim() == 2 && c.size(0) == 64, op, ": c must be [64, N], got ", c.sizes());
    const int64_t N = c.size(1);
    const std::vector<int64_t> b_shape = b_mn_major ? std::vector<int64_t>{K, N} : std::vector<int64_t>{N, K};
    TORCH_CHECK(b.sizes() == at::IntArrayRef(b_shape), op, ": b must be ", at::IntArrayRef(b_shape), ", got ",
                b.sizes());
    TORCH_CHECK((N == 64 || N == 128) && (K == 16 || K == 64 || K == 128), op,
                ": N must be 64 or 128 and K 16, 64 or 128, got N=", N, " K=", K);
    TORCH_CHECK(lbo < (1 << 18) && sbo < (1 << 18) && a_lbo < (1 << 18) && a_sbo < (1 << 18), op,
                ": lbo, sbo, a_lbo and a_sbo must be below 2^18 bytes");
    check_sm90a(op, a);
    c10::cuda::CUDAGuard guard(a.device());
    check_launch(op, faprof_wgmma_gemm_test(a.data_ptr(), b.data_ptr(), c.data_ptr<float>(), static_cast<int>(N),
                                            static_cast<int>(K), b_mn_major, a_in_regs,
                                            a.scalar_type() == at::kBFloat16, static_cast<int>(lbo),
                                            static_cast<int>(sbo), a_mn_major, static_cast<int>(a_lbo),
                                            static_cast<int>(a_sbo), stream_of(a)));
}

}  // namespace

TORCH_LIBRARY(faprof_test, m) {
    m.def("fault_oob(Tensor q, Tensor(a!) out) -> ()");
    m.def("race_fwd(Tensor q, Tensor k, Tensor v, Tensor(a!) out, Tensor(b!) lse, bool causal, float scale, bool atomic) -> ()");
    m.def("wgmma_gemm_test(Tensor a, Tensor b, Tensor(a!) c, bool b_mn_major, bool a_in_regs, int lbo, int sbo, bool a_mn_major=False, int a_lbo=-1, int a_sbo=-1) -> ()");
}

TORCH_LIBRARY_IMPL(faprof_test, CUDA, m) {
    m.impl("fault_oob", &fault_oob);
    m.impl("race_fwd", &race_fwd);
    m.impl("wgmma_gemm_test", &wgmma_gemm_test);
}
