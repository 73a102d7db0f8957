// TEST ONLY: torch ops for the planted-fault kernels (torch.ops.faprof_planted.*), built as their
// own small extension by tests/planted/planted_variants.py, never as part of faprof's extension.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cstdint>
#include <limits>

#include "planted_kernels.h"

namespace {

// The dtypes an op takes for q, k, v and out.
enum class Dtypes { kFp16, kFp16Bf16, kFp32 };

// q [B, H, Sq, D], k and v [B, H, Sk, D], out like q, lse [B, H, Sq] fp32; all CUDA, contiguous,
// 16-byte aligned; q, k, v, out in one dtype of `dtypes`.
void check(const char* op, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
           const at::Tensor& lse, Dtypes dtypes) {
    for (const at::Tensor* t : {&q, &k, &v, &out, &lse}) {
        TORCH_CHECK(t->is_cuda() && t->device() == q.device(), op, ": every tensor must be on q's CUDA device");
        TORCH_CHECK(t->is_contiguous(), op, ": tensors must be contiguous");
        TORCH_CHECK(reinterpret_cast<std::uintptr_t>(t->data_ptr()) % 16 == 0, op, ": tensors must be 16-byte aligned");
    }
    const bool dtype_ok = dtypes == Dtypes::kFp32 ? q.scalar_type() == at::kFloat
                          : q.scalar_type() == at::kHalf || (dtypes == Dtypes::kFp16Bf16 && q.scalar_type() == at::kBFloat16);
    TORCH_CHECK(dtype_ok, op, ": q must be ",
                dtypes == Dtypes::kFp32 ? "float32" : (dtypes == Dtypes::kFp16 ? "float16" : "float16 or bfloat16"),
                ", got ", q.scalar_type());
    for (const at::Tensor* t : {&k, &v, &out})
        TORCH_CHECK(t->scalar_type() == q.scalar_type(), op, ": q, k, v and out must share one dtype");
    TORCH_CHECK(lse.scalar_type() == at::kFloat, op, ": lse must be float32");
    TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && k.sizes() == v.sizes() && out.sizes() == q.sizes(), op,
                ": q/out [B, H, Sq, D] and k/v [B, H, Sk, D] expected");
    TORCH_CHECK(q.size(0) == k.size(0) && q.size(1) == k.size(1) && q.size(3) == k.size(3), op,
                ": q and k must share B, H and D");
    TORCH_CHECK(lse.dim() == 3 && lse.size(0) == q.size(0) && lse.size(1) == q.size(1) && lse.size(2) == q.size(2),
                op, ": lse must be [B, H, Sq]");
    for (int i = 0; i < 4; ++i)
        TORCH_CHECK(q.size(i) <= std::numeric_limits<int>::max() && k.size(i) <= std::numeric_limits<int>::max(), op,
                    ": sizes must fit in int32");
}

void check_launch(const char* op, cudaError_t err) {
    TORCH_CHECK(err == cudaSuccess, op, ": CUDA error ", cudaGetErrorName(err), ": ", cudaGetErrorString(err));
}

void mma_fwd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, at::Tensor& out, at::Tensor& lse,
             bool causal, double scale, int64_t fault, bool per_head) {
    constexpr const char* op = "faprof_planted::mma_fwd";
    check(op, q, k, v, out, lse, Dtypes::kFp16);
    c10::cuda::CUDAGuard guard(q.device());
    // kPlantedGlobalRmw keeps O in a global fp32 scratch buffer between key tiles
    at::Tensor scratch;
    if (fault == kPlantedGlobalRmw) scratch = at::empty(q.sizes(), q.options().dtype(at::kFloat));
    check_launch(op, faprof_planted_mma_fwd(q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(),
                                            lse.data_ptr<float>(), static_cast<int>(q.size(0)),
                                            static_cast<int>(q.size(1)), static_cast<int>(q.size(2)),
                                            static_cast<int>(k.size(2)), static_cast<int>(q.size(3)),
                                            static_cast<float>(scale), causal, q.scalar_type() == at::kBFloat16,
                                            static_cast<int>(fault), per_head,
                                            c10::cuda::getCurrentCUDAStream(q.get_device()).stream(),
                                            scratch.defined() ? scratch.data_ptr<float>() : nullptr));
}

void cuda_core_fwd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, at::Tensor& out, at::Tensor& lse,
                   bool causal, double scale) {
    constexpr const char* op = "faprof_planted::cuda_core_fwd";
    check(op, q, k, v, out, lse, Dtypes::kFp16);
    c10::cuda::CUDAGuard guard(q.device());
    check_launch(op, faprof_planted_cuda_core_fwd(q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(),
                                                  lse.data_ptr<float>(), static_cast<int>(q.size(0)),
                                                  static_cast<int>(q.size(1)), static_cast<int>(q.size(2)),
                                                  static_cast<int>(k.size(2)), static_cast<int>(q.size(3)),
                                                  static_cast<float>(scale), causal,
                                                  c10::cuda::getCurrentCUDAStream(q.get_device()).stream()));
}

void rowthread_fwd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, at::Tensor& out, at::Tensor& lse,
                   bool causal, double scale, int64_t fault) {
    constexpr const char* op = "faprof_planted::rowthread_fwd";
    check(op, q, k, v, out, lse, Dtypes::kFp32);
    c10::cuda::CUDAGuard guard(q.device());
    check_launch(op, faprof_planted_rowthread_fwd(q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(),
                                                  lse.data_ptr<float>(), static_cast<int>(q.size(0)),
                                                  static_cast<int>(q.size(1)), static_cast<int>(q.size(2)),
                                                  static_cast<int>(k.size(2)), static_cast<int>(q.size(3)),
                                                  static_cast<float>(scale), causal, static_cast<int>(fault),
                                                  c10::cuda::getCurrentCUDAStream(q.get_device()).stream()));
}

}  // namespace

TORCH_LIBRARY(faprof_planted, m) {
    m.def("mma_fwd(Tensor q, Tensor k, Tensor v, Tensor(a!) out, Tensor(b!) lse, bool causal, float scale, int fault, bool per_head) -> ()");
    m.def("cuda_core_fwd(Tensor q, Tensor k, Tensor v, Tensor(a!) out, Tensor(b!) lse, bool causal, float scale) -> ()");
    m.def("rowthread_fwd(Tensor q, Tensor k, Tensor v, Tensor(a!) out, Tensor(b!) lse, bool causal, float scale, int fault) -> ()");
}

TORCH_LIBRARY_IMPL(faprof_planted, CUDA, m) {
    m.impl("mma_fwd", &mma_fwd);
    m.impl("cuda_core_fwd", &cuda_core_fwd);
    m.impl("rowthread_fwd", &rowthread_fwd);
}
