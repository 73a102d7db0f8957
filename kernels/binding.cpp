// The faprof extension's ops: schemas (TORCH_LIBRARY), input checks and launches. The only file
// in kernels/ that includes torch; the kernels are plain CUDA behind kernels/faprof_kernels.h.
//
// Every op takes its outputs as arguments (`Tensor(a!)`), so the harness can hand in outputs
// poisoned with NaN and see each element the kernel failed to write. Inputs are checked here
// with TORCH_CHECK (a Python RuntimeError with a message that says what to change), never in the
// kernels. The same functions are registered for the CPU dispatch key so that a CPU tensor gets
// the same clear message instead of "could not run ... with arguments from the 'CPU' backend".
//
// Called from Python as torch.ops.faprof.<name> once faprof.build.load() has loaded the library.
// To add an op: a launcher in faprof_kernels.h, a function below, one m.def and one m.impl line
// per dispatch key.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "faprof_kernels.h"

namespace {

constexpr int64_t kIntMax = std::numeric_limits<int>::max();

// A tensor every kernel reads or writes: CUDA, on q's device, fp32, contiguous.
void check_tensor(const char* op, const char* name, const at::Tensor& t, const at::Tensor& q) {
    TORCH_CHECK(t.defined(), op, ": ", name, " is undefined");
    TORCH_CHECK(t.is_cuda(), op, ": ", name, " must be a CUDA tensor, got a tensor on ", t.device(),
                " (move it with .cuda())");
    TORCH_CHECK(t.device() == q.device(), op, ": ", name, " is on ", t.device(), " but q is on ", q.device(),
                "; all tensors must be on the same GPU");
    TORCH_CHECK(t.scalar_type() == at::kFloat, op, ": ", name, " must be float32, got ", t.scalar_type(),
                " (this kernel is fp32 only; convert with .float())");
    TORCH_CHECK(t.is_contiguous(), op, ": ", name, " must be contiguous, got shape ", t.sizes(), " with strides ",
                t.strides(), "; call .contiguous()");
}

// A tensor of the tensor-core kernels (fa2_wmma, fa2_mma): like check_tensor, but fp16 or bf16,
// in q's dtype.
void check_tc_tensor(const char* op, const char* name, const at::Tensor& t, const at::Tensor& q) {
    TORCH_CHECK(t.defined(), op, ": ", name, " is undefined");
    TORCH_CHECK(t.is_cuda(), op, ": ", name, " must be a CUDA tensor, got a tensor on ", t.device(),
                " (move it with .cuda())");
    TORCH_CHECK(t.device() == q.device(), op, ": ", name, " is on ", t.device(), " but q is on ", q.device(),
                "; all tensors must be on the same GPU");
    TORCH_CHECK(t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16, op, ": ", name,
                " must be float16 or bfloat16, got ", t.scalar_type(), " (tensor-core kernel; convert with .half())");
    TORCH_CHECK(t.scalar_type() == q.scalar_type(), op, ": ", name, " is ", t.scalar_type(), " but q is ",
                q.scalar_type(), "; q, k, v and out must share one dtype");
    TORCH_CHECK(t.is_contiguous(), op, ": ", name, " must be contiguous, got shape ", t.sizes(), " with strides ",
                t.strides(), "; call .contiguous()");
}

// 16-byte alignment: fa1/fa2 move rows with 16-byte cp.async / float4 accesses.
void check_aligned(const char* op, const char* name, const at::Tensor& t) {
    TORCH_CHECK(reinterpret_cast<std::uintptr_t>(t.data_ptr()) % 16 == 0, op, ": ", name,
                " must be 16-byte aligned (its storage offset is not a multiple of 4 floats); pass a "
                "fresh contiguous tensor, e.g. .clone()");
}

struct Dims {
    int B, H, Sq, Sk, D;
};

// A per-tensor check: check_tensor (fp32) or check_tc_tensor (fp16/bf16).
using TensorCheck = void (*)(const char* op, const char* name, const at::Tensor& t, const at::Tensor& q);

// q [B, H, Sq, D], k and v [B, H, Sk, D]; returns the sizes as int (what the launchers take).
Dims check_qkv(const char* op, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
               TensorCheck check = check_tensor) {
    check(op, "q", q, q);
    check(op, "k", k, q);
    check(op, "v", v, q);
    TORCH_CHECK(q.dim() == 4, op, ": q must be 4-D [B, H, Sq, D], got shape ", q.sizes());
    TORCH_CHECK(k.dim() == 4, op, ": k must be 4-D [B, H, Sk, D], got shape ", k.sizes());
    TORCH_CHECK(k.sizes() == v.sizes(), op, ": k and v must have the same shape [B, H, Sk, D], got ", k.sizes(),
                " and ", v.sizes());
    TORCH_CHECK(q.size(0) == k.size(0) && q.size(1) == k.size(1) && q.size(3) == k.size(3), op, ": q ",
                q.sizes(), " and k ", k.sizes(), " must have the same B, H and D");
    TORCH_CHECK(q.numel() > 0 && k.numel() > 0, op, ": empty tensors are not supported, got q ", q.sizes(),
                " and k ", k.sizes());
    for (int i = 0; i < 4; ++i) {
        TORCH_CHECK(q.size(i) <= kIntMax && k.size(i) <= kIntMax, op, ": sizes must fit in int32, got q ",
                    q.sizes(), " and k ", k.sizes());
    }
    TORCH_CHECK(q.size(0) * q.size(1) <= kIntMax, op, ": B*H must fit in int32, got ", q.size(0) * q.size(1));
    return Dims{static_cast<int>(q.size(0)), static_cast<int>(q.size(1)), static_cast<int>(q.size(2)),
                static_cast<int>(k.size(2)), static_cast<int>(q.size(3))};
}

template <size_t N>
void check_head_dim(const char* variant, int D, const int (&supported)[N]) {
    for (int s : supported)
        if (s == D) return;
    std::ostringstream msg;
    msg << "D=" << D << " not supported by " << variant << " (supported: ";
    for (size_t i = 0; i < N; ++i) msg << (i ? ", " : "") << supported[i];
    msg << ")";
    TORCH_CHECK(false, msg.str());
}

void check_output(const char* op, const char* name, const at::Tensor& t, const at::Tensor& q,
                  std::vector<int64_t> expected, TensorCheck check = check_tensor) {
    check(op, name, t, q);
    TORCH_CHECK(t.sizes() == at::IntArrayRef(expected), op, ": ", name, " must have shape ",
                at::IntArrayRef(expected), ", got ", t.sizes());
}

void check_scale(const char* op, double scale) {
    TORCH_CHECK(std::isfinite(scale), op, ": scale must be finite, got ", scale);
}

void check_launch(const char* op, cudaError_t err) {
    TORCH_CHECK(err == cudaSuccess, op, ": CUDA error ", cudaGetErrorName(err), ": ", cudaGetErrorString(err));
}

cudaStream_t stream_of(const at::Tensor& q) {
    return c10::cuda::getCurrentCUDAStream(q.get_device()).stream();
}

// ------------------------------------------------------------------------------------ naive
void naive_fwd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, at::Tensor& out,
               at::Tensor& scores, bool causal, double scale) {
    constexpr const char* op = "faprof::naive_fwd";
    const Dims d = check_qkv(op, q, k, v);
    check_scale(op, scale);
    check_output(op, "out", out, q, {d.B, d.H, d.Sq, d.D});
    check_output(op, "scores", scores, q, {d.B, d.H, d.Sq, d.Sk});
    c10::cuda::CUDAGuard guard(q.device());
    check_launch(op, faprof_naive_fwd(q.data_ptr<float>(), k.data_ptr<float>(), v.data_ptr<float>(),
                                      out.data_ptr<float>(), scores.data_ptr<float>(), d.B, d.H, d.Sq, d.Sk, d.D,
                                      causal, static_cast<float>(scale), stream_of(q)));
}

// -------------------------------------------------------------------------------------- fa1
void fa1_fwd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, at::Tensor& out, at::Tensor& l,
             at::Tensor& m, bool causal, double scale) {
    constexpr const char* op = "faprof::fa1_fwd";
    const Dims d = check_qkv(op, q, k, v);
    check_head_dim("fa1", d.D, kFaprofFa1HeadDims);
    check_scale(op, scale);
    check_output(op, "out", out, q, {d.B, d.H, d.Sq, d.D});
    check_output(op, "l", l, q, {d.B, d.H, d.Sq});
    check_output(op, "m", m, q, {d.B, d.H, d.Sq});
    TORCH_CHECK(static_cast<int64_t>(d.Sq) * d.D <= kIntMax, op, ": Sq*D must fit in int32");
    for (const auto& [name, t] : {std::pair<const char*, const at::Tensor*>{"q", &q}, {"k", &k}, {"v", &v},
                                  {"out", &out}})
        check_aligned(op, name, *t);
    c10::cuda::CUDAGuard guard(q.device());
    check_launch(op, faprof_fa1_fwd(q.data_ptr<float>(), k.data_ptr<float>(), v.data_ptr<float>(),
                                    out.data_ptr<float>(), l.data_ptr<float>(), m.data_ptr<float>(), d.B, d.H,
                                    d.Sq, d.Sk, d.D, causal, static_cast<float>(scale), stream_of(q)));
}

// -------------------------------------------------------------------------------------- fa2
void fa2_fwd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, at::Tensor& out, at::Tensor& lse,
             bool causal, double scale) {
    constexpr const char* op = "faprof::fa2_fwd";
    const Dims d = check_qkv(op, q, k, v);
    check_head_dim("fa2", d.D, kFaprofFa2HeadDims);
    check_scale(op, scale);
    check_output(op, "out", out, q, {d.B, d.H, d.Sq, d.D});
    check_output(op, "lse", lse, q, {d.B, d.H, d.Sq});
    for (const auto& [name, t] : {std::pair<const char*, const at::Tensor*>{"q", &q}, {"k", &k}, {"v", &v},
                                  {"out", &out}})
        check_aligned(op, name, *t);
    c10::cuda::CUDAGuard guard(q.device());
    check_launch(op, faprof_fa2_fwd(q.data_ptr<float>(), k.data_ptr<float>(), v.data_ptr<float>(),
                                    out.data_ptr<float>(), lse.data_ptr<float>(), d.B, d.H, d.Sq, d.Sk, d.D,
                                    causal, static_cast<float>(scale), stream_of(q)));
}

// ----------------------------------------------------------------------- fa2_wmma, fa2_mma
using TcLauncher = cudaError_t (*)(const void*, const void*, const void*, void*, float*, int, int, int, int, int,
                                   float, bool, bool, cudaStream_t);

void tc_fwd(const char* op, const char* variant, TcLauncher launcher, const at::Tensor& q, const at::Tensor& k,
            const at::Tensor& v, at::Tensor& out, at::Tensor& lse, bool causal, double scale) {
    const Dims d = check_qkv(op, q, k, v, check_tc_tensor);
    check_head_dim(variant, d.D, kFaprofTcHeadDims);
    check_scale(op, scale);
    TORCH_CHECK(scale > 0, op, ": scale must be > 0 (the kernel keeps its running max on raw scores), got ",
                scale);
    TORCH_CHECK(d.B <= 65535 && d.H <= 65535, op, ": B and H must be at most 65535 (grid z and y), got B=", d.B,
                " H=", d.H);
    int cc_major = 0;
    cudaDeviceGetAttribute(&cc_major, cudaDevAttrComputeCapabilityMajor, q.get_device());
    TORCH_CHECK(cc_major >= 8, op, ": needs an sm_80 or newer GPU (cp.async, ldmatrix, bf16 tensor cores); ",
                "this one is compute capability ", cc_major, ".x");
    check_output(op, "out", out, q, {d.B, d.H, d.Sq, d.D}, check_tc_tensor);
    check_output(op, "lse", lse, q, {d.B, d.H, d.Sq});
    for (const auto& [name, t] : {std::pair<const char*, const at::Tensor*>{"q", &q}, {"k", &k}, {"v", &v},
                                  {"out", &out}})
        check_aligned(op, name, *t);
    c10::cuda::CUDAGuard guard(q.device());
    check_launch(op, launcher(q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), lse.data_ptr<float>(), d.B,
                              d.H, d.Sq, d.Sk, d.D, static_cast<float>(scale), causal,
                              q.scalar_type() == at::kBFloat16, stream_of(q)));
}

void fa2_wmma_fwd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, at::Tensor& out, at::Tensor& lse,
                  bool causal, double scale) {
    tc_fwd("faprof::fa2_wmma_fwd", "fa2_wmma", faprof_fa2_wmma_fwd, q, k, v, out, lse, causal, scale);
}

void fa2_mma_fwd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, at::Tensor& out, at::Tensor& lse,
                 bool causal, double scale) {
    tc_fwd("faprof::fa2_mma_fwd", "fa2_mma", faprof_fa2_mma_fwd, q, k, v, out, lse, causal, scale);
}

// ================================================================= backward (issue 13)
// fa2_bwd (fp32) and fa2_mma_bwd (fp16/bf16): gradients of the forward that wrote `out` and `lse`.
// `delta` is an fp32 [B, H, Sq] workspace; fa2_mma_bwd's `dq_accum` is an fp32 [B, H, Sq, D]
// workspace on the atomic path and may be empty when `deterministic` is set.
void check_bwd_common(const char* op, const Dims& d, const at::Tensor& q, const at::Tensor& out,
                      const at::Tensor& dout, const at::Tensor& lse, at::Tensor& dq, at::Tensor& dk, at::Tensor& dv,
                      at::Tensor& delta, TensorCheck check) {
    check_output(op, "out", out, q, {d.B, d.H, d.Sq, d.D}, check);
    check_output(op, "dout", dout, q, {d.B, d.H, d.Sq, d.D}, check);
    check_output(op, "lse", lse, q, {d.B, d.H, d.Sq});
    check_output(op, "dq", dq, q, {d.B, d.H, d.Sq, d.D}, check);
    check_output(op, "dk", dk, q, {d.B, d.H, d.Sk, d.D}, check);
    check_output(op, "dv", dv, q, {d.B, d.H, d.Sk, d.D}, check);
    check_output(op, "delta", delta, q, {d.B, d.H, d.Sq});
    for (const auto& [name, t] : {std::pair<const char*, const at::Tensor*>{"out", &out}, {"dout", &dout},
                                  {"dq", &dq}, {"dk", &dk}, {"dv", &dv}})
        check_aligned(op, name, *t);
}

void fa2_bwd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
             const at::Tensor& dout, const at::Tensor& lse, at::Tensor& dq, at::Tensor& dk, at::Tensor& dv,
             at::Tensor& delta, bool causal, double scale, bool deterministic) {
    constexpr const char* op = "faprof::fa2_bwd";
    const Dims d = check_qkv(op, q, k, v);
    check_head_dim("fa2", d.D, kFaprofFa2HeadDims);
    check_scale(op, scale);
    check_bwd_common(op, d, q, out, dout, lse, dq, dk, dv, delta, check_tensor);
    for (const auto& [name, t] : {std::pair<const char*, const at::Tensor*>{"q", &q}, {"k", &k}, {"v", &v}})
        check_aligned(op, name, *t);
    c10::cuda::CUDAGuard guard(q.device());
    check_launch(op, faprof_fa2_bwd(q.data_ptr<float>(), k.data_ptr<float>(), v.data_ptr<float>(),
                                    out.data_ptr<float>(), dout.data_ptr<float>(), lse.data_ptr<float>(),
                                    dq.data_ptr<float>(), dk.data_ptr<float>(), dv.data_ptr<float>(),
                                    delta.data_ptr<float>(), d.B, d.H, d.Sq, d.Sk, d.D, causal,
                                    static_cast<float>(scale), deterministic, stream_of(q)));
}

void fa2_mma_bwd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
                 const at::Tensor& dout, const at::Tensor& lse, at::Tensor& dq, at::Tensor& dk, at::Tensor& dv,
                 at::Tensor& delta, at::Tensor& dq_accum, bool causal, double scale, bool deterministic,
                 bool single_buffer) {
    constexpr const char* op = "faprof::fa2_mma_bwd";
    const Dims d = check_qkv(op, q, k, v, check_tc_tensor);
    check_head_dim("fa2_mma backward", d.D, kFaprofMmaBwdHeadDims);
    check_scale(op, scale);
    TORCH_CHECK(scale > 0, op, ": scale must be > 0, got ", scale);
    TORCH_CHECK(d.B <= 65535 && d.H <= 65535, op, ": B and H must be at most 65535 (grid z and y), got B=", d.B,
                " H=", d.H);
    int cc_major = 0;
    cudaDeviceGetAttribute(&cc_major, cudaDevAttrComputeCapabilityMajor, q.get_device());
    TORCH_CHECK(cc_major >= 8, op, ": needs an sm_80 or newer GPU (cp.async, ldmatrix, bf16 tensor cores); ",
                "this one is compute capability ", cc_major, ".x");
    check_bwd_common(op, d, q, out, dout, lse, dq, dk, dv, delta, check_tc_tensor);
    for (const auto& [name, t] : {std::pair<const char*, const at::Tensor*>{"q", &q}, {"k", &k}, {"v", &v}})
        check_aligned(op, name, *t);
    float* acc = nullptr;
    if (!deterministic) {
        check_output(op, "dq_accum", dq_accum, q, {d.B, d.H, d.Sq, d.D});
        check_aligned(op, "dq_accum", dq_accum);
        acc = dq_accum.data_ptr<float>();
    }
    c10::cuda::CUDAGuard guard(q.device());
    check_launch(op, faprof_fa2_mma_bwd(q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), dout.data_ptr(),
                                        lse.data_ptr<float>(), dq.data_ptr(), dk.data_ptr(), dv.data_ptr(),
                                        delta.data_ptr<float>(), acc, d.B, d.H, d.Sq, d.Sk, d.D,
                                        static_cast<float>(scale), causal, q.scalar_type() == at::kBFloat16,
                                        deterministic, single_buffer, stream_of(q)));
}
// =========================================================== end of backward (issue 13)

}  // namespace

TORCH_LIBRARY(faprof, m) {
    m.def("naive_fwd(Tensor q, Tensor k, Tensor v, Tensor(a!) out, Tensor(b!) scores, bool causal, float scale) -> ()");
    m.def("fa1_fwd(Tensor q, Tensor k, Tensor v, Tensor(a!) out, Tensor(b!) l, Tensor(c!) m, bool causal, float scale) -> ()");
    m.def("fa2_fwd(Tensor q, Tensor k, Tensor v, Tensor(a!) out, Tensor(b!) lse, bool causal, float scale) -> ()");
    m.def("fa2_wmma_fwd(Tensor q, Tensor k, Tensor v, Tensor(a!) out, Tensor(b!) lse, bool causal, float scale) -> ()");
    m.def("fa2_mma_fwd(Tensor q, Tensor k, Tensor v, Tensor(a!) out, Tensor(b!) lse, bool causal, float scale) -> ()");
    // backward (issue 13)
    m.def("fa2_bwd(Tensor q, Tensor k, Tensor v, Tensor out, Tensor dout, Tensor lse, Tensor(a!) dq, Tensor(b!) dk, Tensor(c!) dv, Tensor(d!) delta, bool causal, float scale, bool deterministic) -> ()");
    m.def("fa2_mma_bwd(Tensor q, Tensor k, Tensor v, Tensor out, Tensor dout, Tensor lse, Tensor(a!) dq, Tensor(b!) dk, Tensor(c!) dv, Tensor(d!) delta, Tensor(e!) dq_accum, bool causal, float scale, bool deterministic, bool single_buffer=False) -> ()");
}

TORCH_LIBRARY_IMPL(faprof, CUDA, m) {
    m.impl("naive_fwd", &naive_fwd);
    m.impl("fa1_fwd", &fa1_fwd);
    m.impl("fa2_fwd", &fa2_fwd);
    m.impl("fa2_wmma_fwd", &fa2_wmma_fwd);
    m.impl("fa2_mma_fwd", &fa2_mma_fwd);
    m.impl("fa2_bwd", &fa2_bwd);  // backward (issue 13)
    m.impl("fa2_mma_bwd", &fa2_mma_bwd);
}

// CPU tensors reach the same checks, which reject them with "must be a CUDA tensor".
TORCH_LIBRARY_IMPL(faprof, CPU, m) {
    m.impl("naive_fwd", &naive_fwd);
    m.impl("fa1_fwd", &fa1_fwd);
    m.impl("fa2_fwd", &fa2_fwd);
    m.impl("fa2_wmma_fwd", &fa2_wmma_fwd);
    m.impl("fa2_mma_fwd", &fa2_mma_fwd);
    m.impl("fa2_bwd", &fa2_bwd);  // backward (issue 13)
    m.impl("fa2_mma_bwd", &fa2_mma_bwd);
}

// --------------------------------------------------------------------------------- fa3_wgmma
// Hopper-only ops (kernels/fa3_wgmma.cu, fa3_wgmma_ws.cu), in their own fragment so that
// they stay one block at the end of this file.
namespace {

// wgmma exists only in sm_90a code, which runs on compute capability 9.0 exactly.
void check_sm90a(const char* op, const at::Tensor& q) {
    int major = 0, minor = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, q.get_device());
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, q.get_device());
    TORCH_CHECK(major == 9 && minor == 0, op, ": needs sm_90a (wgmma/TMA), i.e. a compute capability 9.0 GPU "
                "(H100/H200); this one is ", major, ".", minor);
}

// One fa3 step: the checks of tc_fwd with fa3's head dims and architecture.
void fa3_fwd(const char* op, const char* variant, TcLauncher launcher, const at::Tensor& q, const at::Tensor& k,
             const at::Tensor& v, at::Tensor& out, at::Tensor& lse, bool causal, double scale) {
    const Dims d = check_qkv(op, q, k, v, check_tc_tensor);
    check_head_dim(variant, d.D, kFaprofFa3HeadDims);
    check_scale(op, scale);
    TORCH_CHECK(scale > 0, op, ": scale must be > 0 (the kernel keeps its running max on raw scores), got ",
                scale);
    TORCH_CHECK(d.B <= 65535 && d.H <= 65535, op, ": B and H must be at most 65535 (grid z and y), got B=", d.B,
                " H=", d.H);
    check_output(op, "out", out, q, {d.B, d.H, d.Sq, d.D}, check_tc_tensor);
    check_output(op, "lse", lse, q, {d.B, d.H, d.Sq});
    for (const auto& [name, t] : {std::pair<const char*, const at::Tensor*>{"q", &q}, {"k", &k}, {"v", &v},
                                  {"out", &out}})
        check_aligned(op, name, *t);
    check_sm90a(op, q);
    c10::cuda::CUDAGuard guard(q.device());
    check_launch(op, launcher(q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), lse.data_ptr<float>(), d.B,
                              d.H, d.Sq, d.Sk, d.D, static_cast<float>(scale), causal,
                              q.scalar_type() == at::kBFloat16, stream_of(q)));
}

void fa3_wgmma_a_fwd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, at::Tensor& out,
                     at::Tensor& lse, bool causal, double scale) {
    fa3_fwd("faprof::fa3_wgmma_a_fwd", "fa3_wgmma_a", faprof_fa3_wgmma_a_fwd, q, k, v, out, lse, causal, scale);
}

void fa3_wgmma_b_fwd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, at::Tensor& out,
                     at::Tensor& lse, bool causal, double scale) {
    fa3_fwd("faprof::fa3_wgmma_b_fwd", "fa3_wgmma_b", faprof_fa3_wgmma_b_fwd, q, k, v, out, lse, causal, scale);
}

void fa3_wgmma_c_fwd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, at::Tensor& out,
                     at::Tensor& lse, bool causal, double scale) {
    fa3_fwd("faprof::fa3_wgmma_c_fwd", "fa3_wgmma_c", faprof_fa3_wgmma_c_fwd, q, k, v, out, lse, causal, scale);
}

void fa3_wgmma_d_fwd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, at::Tensor& out,
                     at::Tensor& lse, bool causal, double scale) {
    fa3_fwd("faprof::fa3_wgmma_d_fwd", "fa3_wgmma_d", faprof_fa3_wgmma_d_fwd, q, k, v, out, lse, causal, scale);
}

void fa3_wgmma_e_fwd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, at::Tensor& out,
                     at::Tensor& lse, bool causal, double scale) {
    fa3_fwd("faprof::fa3_wgmma_e_fwd", "fa3_wgmma_e", faprof_fa3_wgmma_e_fwd, q, k, v, out, lse, causal, scale);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(faprof, m) {
    m.def("fa3_wgmma_a_fwd(Tensor q, Tensor k, Tensor v, Tensor(a!) out, Tensor(b!) lse, bool causal, float scale) -> ()");
    m.def("fa3_wgmma_b_fwd(Tensor q, Tensor k, Tensor v, Tensor(a!) out, Tensor(b!) lse, bool causal, float scale) -> ()");
    m.def("fa3_wgmma_c_fwd(Tensor q, Tensor k, Tensor v, Tensor(a!) out, Tensor(b!) lse, bool causal, float scale) -> ()");
    m.def("fa3_wgmma_d_fwd(Tensor q, Tensor k, Tensor v, Tensor(a!) out, Tensor(b!) lse, bool causal, float scale) -> ()");
    m.def("fa3_wgmma_e_fwd(Tensor q, Tensor k, Tensor v, Tensor(a!) out, Tensor(b!) lse, bool causal, float scale) -> ()");
}

TORCH_LIBRARY_IMPL(faprof, CUDA, m) {
    m.impl("fa3_wgmma_a_fwd", &fa3_wgmma_a_fwd);
    m.impl("fa3_wgmma_b_fwd", &fa3_wgmma_b_fwd);
    m.impl("fa3_wgmma_c_fwd", &fa3_wgmma_c_fwd);
    m.impl("fa3_wgmma_d_fwd", &fa3_wgmma_d_fwd);
    m.impl("fa3_wgmma_e_fwd", &fa3_wgmma_e_fwd);
}

TORCH_LIBRARY_IMPL(faprof, CPU, m) {
    m.impl("fa3_wgmma_a_fwd", &fa3_wgmma_a_fwd);
    m.impl("fa3_wgmma_b_fwd", &fa3_wgmma_b_fwd);
    m.impl("fa3_wgmma_c_fwd", &fa3_wgmma_c_fwd);
    m.impl("fa3_wgmma_d_fwd", &fa3_wgmma_d_fwd);
    m.impl("fa3_wgmma_e_fwd", &fa3_wgmma_e_fwd);
}

// ------------------------------------------------------------------- fa3 backward (issue 28)
// Hopper backward steps (kernels/fa3_bwd_a.cu, fa3_bwd_b.cu, fa3_bwd_c.cu, fa3_bwd_d.cu): gradients of
// an fa3 forward from its out and lse. lse2 and delta are fp32 [B, H, Sq_pad] workspaces (Sq rounded up to
// kFaprofFa3BwdSeqPad), dq_accum an fp32 [B, H, Sq, D] workspace; Python allocates all three.
namespace {

using Fa3BwdLauncher = cudaError_t (*)(const void*, const void*, const void*, const void*, const void*, const float*,
                                       void*, void*, void*, float*, float*, float*, int, int, int, int, int, float,
                                       bool, bool, cudaStream_t);

void fa3_bwd(const char* op, const char* variant, Fa3BwdLauncher launcher, const at::Tensor& q, const at::Tensor& k,
             const at::Tensor& v, const at::Tensor& out, const at::Tensor& dout, const at::Tensor& lse, at::Tensor& dq,
             at::Tensor& dk, at::Tensor& dv, at::Tensor& lse2, at::Tensor& delta, at::Tensor& dq_accum, bool causal,
             double scale) {
    const Dims d = check_qkv(op, q, k, v, check_tc_tensor);
    check_head_dim(variant, d.D, kFaprofFa3HeadDims);
    check_scale(op, scale);
    TORCH_CHECK(scale > 0, op, ": scale must be > 0, got ", scale);
    TORCH_CHECK(d.B <= 65535 && d.H <= 65535, op, ": B and H must be at most 65535 (grid z and y), got B=", d.B,
                " H=", d.H);
    const int64_t pad = kFaprofFa3BwdSeqPad;
    const int64_t sq_pad = (d.Sq + pad - 1) / pad * pad;
    TORCH_CHECK(int64_t{d.B} * d.H * sq_pad <= kIntMax, op, ": B*H*Sq (Sq rounded up to ", pad,
                ") must fit in int32, got B=", d.B, " H=", d.H, " Sq=", d.Sq);
    check_output(op, "out", out, q, {d.B, d.H, d.Sq, d.D}, check_tc_tensor);
    check_output(op, "dout", dout, q, {d.B, d.H, d.Sq, d.D}, check_tc_tensor);
    check_output(op, "lse", lse, q, {d.B, d.H, d.Sq});
    check_output(op, "dq", dq, q, {d.B, d.H, d.Sq, d.D}, check_tc_tensor);
    check_output(op, "dk", dk, q, {d.B, d.H, d.Sk, d.D}, check_tc_tensor);
    check_output(op, "dv", dv, q, {d.B, d.H, d.Sk, d.D}, check_tc_tensor);
    check_output(op, "lse2", lse2, q, {d.B, d.H, sq_pad});
    check_output(op, "delta", delta, q, {d.B, d.H, sq_pad});
    check_output(op, "dq_accum", dq_accum, q, {d.B, d.H, d.Sq, d.D});
    for (const auto& [name, t] : {std::pair<const char*, const at::Tensor*>{"q", &q}, {"k", &k}, {"v", &v},
                                  {"out", &out}, {"dout", &dout}, {"dq", &dq}, {"dk", &dk}, {"dv", &dv},
                                  {"lse2", &lse2}, {"delta", &delta}, {"dq_accum", &dq_accum}})
        check_aligned(op, name, *t);
    check_sm90a(op, q);
    c10::cuda::CUDAGuard guard(q.device());
    check_launch(op, launcher(q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), dout.data_ptr(),
                              lse.data_ptr<float>(), dq.data_ptr(), dk.data_ptr(), dv.data_ptr(),
                              lse2.data_ptr<float>(), delta.data_ptr<float>(), dq_accum.data_ptr<float>(), d.B, d.H,
                              d.Sq, d.Sk, d.D, static_cast<float>(scale), causal, q.scalar_type() == at::kBFloat16,
                              stream_of(q)));
}

void fa3_bwd_a(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
               const at::Tensor& dout, const at::Tensor& lse, at::Tensor& dq, at::Tensor& dk, at::Tensor& dv,
               at::Tensor& lse2, at::Tensor& delta, at::Tensor& dq_accum, bool causal, double scale) {
    fa3_bwd("faprof::fa3_bwd_a", "fa3_bwd_a backward", faprof_fa3_bwd_a, q, k, v, out, dout, lse, dq, dk, dv, lse2,
            delta, dq_accum, causal, scale);
}

void fa3_bwd_b(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
               const at::Tensor& dout, const at::Tensor& lse, at::Tensor& dq, at::Tensor& dk, at::Tensor& dv,
               at::Tensor& lse2, at::Tensor& delta, at::Tensor& dq_accum, bool causal, double scale) {
    fa3_bwd("faprof::fa3_bwd_b", "fa3_bwd_b backward", faprof_fa3_bwd_b, q, k, v, out, dout, lse, dq, dk, dv, lse2,
            delta, dq_accum, causal, scale);
}

// Steps c and d (kernels/fa3_bwd_c.cu, fa3_bwd_d.cu): the same arguments and checks.
void fa3_bwd_c(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
               const at::Tensor& dout, const at::Tensor& lse, at::Tensor& dq, at::Tensor& dk, at::Tensor& dv,
               at::Tensor& lse2, at::Tensor& delta, at::Tensor& dq_accum, bool causal, double scale) {
    fa3_bwd("faprof::fa3_bwd_c", "fa3_bwd_c backward", faprof_fa3_bwd_c, q, k, v, out, dout, lse, dq, dk, dv, lse2,
            delta, dq_accum, causal, scale);
}

void fa3_bwd_d(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
               const at::Tensor& dout, const at::Tensor& lse, at::Tensor& dq, at::Tensor& dk, at::Tensor& dv,
               at::Tensor& lse2, at::Tensor& delta, at::Tensor& dq_accum, bool causal, double scale) {
    fa3_bwd("faprof::fa3_bwd_d", "fa3_bwd_d backward", faprof_fa3_bwd_d, q, k, v, out, dout, lse, dq, dk, dv, lse2,
            delta, dq_accum, causal, scale);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(faprof, m) {
    m.def("fa3_bwd_a(Tensor q, Tensor k, Tensor v, Tensor out, Tensor dout, Tensor lse, Tensor(a!) dq, Tensor(b!) dk, Tensor(c!) dv, Tensor(d!) lse2, Tensor(e!) delta, Tensor(f!) dq_accum, bool causal, float scale) -> ()");
    m.def("fa3_bwd_b(Tensor q, Tensor k, Tensor v, Tensor out, Tensor dout, Tensor lse, Tensor(a!) dq, Tensor(b!) dk, Tensor(c!) dv, Tensor(d!) lse2, Tensor(e!) delta, Tensor(f!) dq_accum, bool causal, float scale) -> ()");
    m.def("fa3_bwd_c(Tensor q, Tensor k, Tensor v, Tensor out, Tensor dout, Tensor lse, Tensor(a!) dq, Tensor(b!) dk, Tensor(c!) dv, Tensor(d!) lse2, Tensor(e!) delta, Tensor(f!) dq_accum, bool causal, float scale) -> ()");
    m.def("fa3_bwd_d(Tensor q, Tensor k, Tensor v, Tensor out, Tensor dout, Tensor lse, Tensor(a!) dq, Tensor(b!) dk, Tensor(c!) dv, Tensor(d!) lse2, Tensor(e!) delta, Tensor(f!) dq_accum, bool causal, float scale) -> ()");
}

TORCH_LIBRARY_IMPL(faprof, CUDA, m) {
    m.impl("fa3_bwd_a", &fa3_bwd_a);
    m.impl("fa3_bwd_b", &fa3_bwd_b);
    m.impl("fa3_bwd_c", &fa3_bwd_c);
    m.impl("fa3_bwd_d", &fa3_bwd_d);
}

TORCH_LIBRARY_IMPL(faprof, CPU, m) {
    m.impl("fa3_bwd_a", &fa3_bwd_a);
    m.impl("fa3_bwd_b", &fa3_bwd_b);
    m.impl("fa3_bwd_c", &fa3_bwd_c);
    m.impl("fa3_bwd_d", &fa3_bwd_d);
}

// ------------------------------------------------------------------- decode_splitkv (issue 36)
// Split-KV decoding (kernels/decode_splitkv.cu). Dense: k and v [B, Hkv, Sk, D], block_table and
// seqlens_k None. Paged: k and v pools [num_blocks, page_size, Hkv, D], block_table int32
// [B, max_blocks] (entries past a sequence's last block unused), seqlens_k int32 [B] (at most
// max_blocks * page_size). num_splits <= 0 lets the kernel's heuristic choose; the op returns the
// split count it ran with. The fp32 partial buffers are allocated here (torch's caching allocator).
namespace {

void check_index(const char* op, const char* name, const at::Tensor& t, const at::Tensor& q, int64_t dims) {
    TORCH_CHECK(t.is_cuda() && t.device() == q.device(), op, ": ", name, " must be a CUDA tensor on q's device, got ",
                t.device());
    TORCH_CHECK(t.scalar_type() == at::kInt, op, ": ", name, " must be int32, got ", t.scalar_type(),
                " (convert with .int())");
    TORCH_CHECK(t.dim() == dims && t.is_contiguous(), op, ": ", name, " must be a contiguous ", dims,
                "-D tensor, got shape ", t.sizes(), " with strides ", t.strides());
}

int64_t decode_splitkv_fwd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, at::Tensor& out,
                           at::Tensor& lse, const std::optional<at::Tensor>& block_table,
                           const std::optional<at::Tensor>& seqlens_k, bool causal, bool bottom_right, double scale,
                           int64_t num_splits) {
    constexpr const char* op = "faprof::decode_splitkv_fwd";
    for (const auto& [name, t] : {std::pair<const char*, const at::Tensor*>{"q", &q}, {"k", &k}, {"v", &v}})
        check_tc_tensor(op, name, *t, q);
    TORCH_CHECK(q.dim() == 4 && k.dim() == 4, op, ": q must be [B, H, Sq, D] and k [B, Hkv, Sk, D] (dense) or ",
                "[num_blocks, page_size, Hkv, D] (paged), got q ", q.sizes(), " and k ", k.sizes());
    TORCH_CHECK(k.sizes() == v.sizes(), op, ": k and v must have the same shape, got ", k.sizes(), " and ", v.sizes());
    TORCH_CHECK(q.numel() > 0 && k.numel() > 0, op, ": empty tensors are not supported, got q ", q.sizes(),
                " and k ", k.sizes());
    TORCH_CHECK(block_table.has_value() == seqlens_k.has_value(), op,
                ": a paged cache needs both block_table and seqlens_k (dense: neither)");
    const bool paged = block_table.has_value();
    const int64_t B = q.size(0), H = q.size(1), Sq = q.size(2), D = q.size(3);
    const int64_t Hkv = paged ? k.size(2) : k.size(1);
    TORCH_CHECK(k.size(3) == D, op, ": q and k must have the same head dim, got ", D, " and ", k.size(3));
    check_head_dim("decode_splitkv", static_cast<int>(D), kFaprofDecodeHeadDims);
    TORCH_CHECK(Hkv >= 1 && H % Hkv == 0, op, ": the query heads H=", H, " must be a multiple of the KV heads Hkv=",
                Hkv);
    int64_t Sk = 0, page_size = 0, max_blocks = 0;
    if (paged) {
        check_index(op, "block_table", *block_table, q, 2);
        check_index(op, "seqlens_k", *seqlens_k, q, 1);
        TORCH_CHECK(block_table->size(0) == B && seqlens_k->size(0) == B, op, ": block_table [B, max_blocks] and ",
                    "seqlens_k [B] must have q's B=", B, ", got ", block_table->sizes(), " and ", seqlens_k->sizes());
        page_size = k.size(1);
        max_blocks = block_table->size(1);
        Sk = page_size * max_blocks;  // the cache capacity; each sequence's length comes from seqlens_k
        TORCH_CHECK(max_blocks >= 1 && k.size(0) * page_size <= kIntMax, op,
                    ": the pool's rows (num_blocks * page_size) must fit in int32 and block_table needs a column");
    } else {
        TORCH_CHECK(k.size(0) == B, op, ": k must be [B, Hkv, Sk, D] with q's B=", B, ", got ", k.sizes());
        Sk = k.size(2);
    }
    for (int64_t x : {B, H, Sq, Sk})
        TORCH_CHECK(x <= kIntMax, op, ": sizes must fit in int32, got q ", q.sizes(), " and k ", k.sizes());
    TORCH_CHECK(B * H * Sq <= kIntMax, op, ": B*H*Sq must fit in int32, got ", B * H * Sq);
    check_scale(op, scale);
    TORCH_CHECK(scale > 0, op, ": scale must be > 0 (the kernel keeps its running max on raw scores), got ", scale);
    int cc_major = 0;
    cudaDeviceGetAttribute(&cc_major, cudaDevAttrComputeCapabilityMajor, q.get_device());
    TORCH_CHECK(cc_major >= 8, op, ": needs an sm_80 or newer GPU (cp.async, ldmatrix, bf16 tensor cores); ",
                "this one is compute capability ", cc_major, ".x");
    check_output(op, "out", out, q, {B, H, Sq, D}, check_tc_tensor);
    check_output(op, "lse", lse, q, {B, H, Sq});
    for (const auto& [name, t] : {std::pair<const char*, const at::Tensor*>{"q", &q}, {"k", &k}, {"v", &v},
                                  {"out", &out}})
        check_aligned(op, name, *t);
    const bool bf16 = q.scalar_type() == at::kBFloat16;
    c10::cuda::CUDAGuard guard(q.device());
    int splits = 0, keys_per_split = 0;
    check_launch(op, faprof_decode_splitkv_plan(static_cast<int>(B), static_cast<int>(H), static_cast<int>(Hkv),
                                                static_cast<int>(Sq), static_cast<int>(Sk), static_cast<int>(D), paged,
                                                bf16, static_cast<int>(std::min<int64_t>(num_splits, kIntMax)), &splits,
                                                &keys_per_split));
    at::Tensor part_o, part_lse;
    if (splits > 1) {
        const auto f32 = q.options().dtype(at::kFloat);
        part_o = at::empty({splits, B * H * Sq, D}, f32);
        part_lse = at::empty({splits, B * H * Sq}, f32);
    }
    check_launch(op, faprof_decode_splitkv_fwd(
                         q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), lse.data_ptr<float>(),
                         paged ? block_table->data_ptr<int>() : nullptr, paged ? seqlens_k->data_ptr<int>() : nullptr,
                         static_cast<int>(page_size), static_cast<int>(max_blocks),
                         splits > 1 ? part_o.data_ptr<float>() : nullptr,
                         splits > 1 ? part_lse.data_ptr<float>() : nullptr, splits, keys_per_split,
                         static_cast<int>(B), static_cast<int>(H), static_cast<int>(Hkv), static_cast<int>(Sq),
                         static_cast<int>(Sk), static_cast<int>(D), static_cast<float>(scale), causal, bottom_right,
                         bf16, stream_of(q)));
    return splits;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(faprof, m) {
    m.def("decode_splitkv_fwd(Tensor q, Tensor k, Tensor v, Tensor(a!) out, Tensor(b!) lse, Tensor? block_table, Tensor? seqlens_k, bool causal, bool bottom_right, float scale, int num_splits=0) -> int");
}

TORCH_LIBRARY_IMPL(faprof, CUDA, m) {
    m.impl("decode_splitkv_fwd", &decode_splitkv_fwd);
}

TORCH_LIBRARY_IMPL(faprof, CPU, m) {
    m.impl("decode_splitkv_fwd", &decode_splitkv_fwd);
}

// ------------------------------------------------------- problems beyond 2022's (issue 36)
// fa2_mma_fwd_ex and fa3_wgmma_e_fwd_ex: GQA/MQA (k and v carry kv_heads heads), causal and windows
// aligned to either corner (window sides -1: unbounded), a soft-cap (0: none), and the packed varlen
// layout when cu_seqlens_q/k are given (q/out [total_q, H, D], k/v [total_k, Hkv, D], lse [H, total_q],
// max_seqlen_q/k the longest sequence's lengths); dense otherwise (q [B, H, Sq, D], k [B, Hkv, Sk, D]).
namespace {

using ExLauncher = cudaError_t (*)(const void*, const void*, const void*, void*, float*, int, int, int, int, int,
                                   float, bool, bool, const FaprofAttnEx&, cudaStream_t);

void check_cu_seqlens(const char* op, const char* name, const at::Tensor& t, const at::Tensor& q) {
    TORCH_CHECK(t.is_cuda() && t.device() == q.device(), op, ": ", name, " must be on q's GPU, got ", t.device());
    TORCH_CHECK(t.scalar_type() == at::kInt && t.dim() == 1 && t.is_contiguous() && t.size(0) >= 2, op, ": ", name,
                " must be a contiguous int32 [B + 1] tensor of sequence starts, got ", t.scalar_type(), " ",
                t.sizes());
}

void fwd_ex(const char* op, const char* variant, ExLauncher launcher, bool hopper, const at::Tensor& q,
            const at::Tensor& k, const at::Tensor& v, at::Tensor& out, at::Tensor& lse, bool causal, double scale,
            int64_t kv_heads, bool bottom_right, int64_t window_left, int64_t window_right, double softcap,
            const std::optional<at::Tensor>& cu_q, const std::optional<at::Tensor>& cu_k, int64_t max_seqlen_q,
            int64_t max_seqlen_k) {
    for (const auto& [name, t] : {std::pair<const char*, const at::Tensor*>{"q", &q}, {"k", &k}, {"v", &v},
                                  {"out", &out}}) {
        check_tc_tensor(op, name, *t, q);
        check_aligned(op, name, *t);
    }
    TORCH_CHECK(cu_q.has_value() == cu_k.has_value(), op, ": give both cu_seqlens_q and cu_seqlens_k (varlen) or "
                "neither (dense)");
    const bool varlen = cu_q.has_value();
    constexpr int64_t hd = 1;  // the head axis of q and k in either layout
    TORCH_CHECK(q.dim() == (varlen ? 3 : 4) && k.dim() == q.dim(), op, ": q and k must be ",
                varlen ? "[total, heads, D] (varlen)" : "[B, heads, S, D] (dense)", ", got ", q.sizes(), " and ",
                k.sizes());
    TORCH_CHECK(k.sizes() == v.sizes(), op, ": k and v must have one shape, got ", k.sizes(), " and ", v.sizes());
    TORCH_CHECK(q.size(-1) == k.size(-1), op, ": q and k must share D, got ", q.sizes(), " and ", k.sizes());
    const int64_t H = q.size(hd), Hkv = k.size(hd), D = q.size(-1);
    TORCH_CHECK(Hkv == kv_heads && Hkv > 0 && H % Hkv == 0, op, ": k has ", Hkv, " heads, kv_heads is ", kv_heads,
                " and q has ", H, "; H must be a multiple of Hkv");
    int64_t B, Sq, Sk;
    if (varlen) {
        check_cu_seqlens(op, "cu_seqlens_q", *cu_q, q);
        check_cu_seqlens(op, "cu_seqlens_k", *cu_k, q);
        TORCH_CHECK(cu_q->size(0) == cu_k->size(0), op, ": cu_seqlens_q and cu_seqlens_k must both be [B + 1]");
        B = cu_q->size(0) - 1;
        Sq = max_seqlen_q;
        Sk = max_seqlen_k;
        TORCH_CHECK(Sq > 0 && Sk > 0 && Sq <= q.size(0) && Sk <= k.size(0), op, ": max_seqlen_q/k must be in [1, "
                    "total rows], got ", Sq, " and ", Sk);
        check_output(op, "lse", lse, q, {H, q.size(0)});
    } else {
        TORCH_CHECK(q.size(0) == k.size(0), op, ": q and k must have the same B, got ", q.sizes(), " and ", k.sizes());
        B = q.size(0);
        Sq = q.size(2);
        Sk = k.size(2);
        check_output(op, "lse", lse, q, {B, H, Sq});
    }
    TORCH_CHECK(out.sizes() == q.sizes(), op, ": out must have q's shape ", q.sizes(), ", got ", out.sizes());
    TORCH_CHECK(q.numel() > 0 && k.numel() > 0, op, ": empty tensors are not supported");
    TORCH_CHECK(B * H <= kIntMax && Sq <= kIntMax && Sk <= kIntMax && q.size(0) <= kIntMax, op,
                ": B*H, the sequence lengths and total_q must fit in int32");
    if (hopper) {
        check_head_dim(variant, static_cast<int>(D), kFaprofFa3HeadDims);
    } else {
        check_head_dim(variant, static_cast<int>(D), kFaprofTcHeadDims);
    }
    check_scale(op, scale);
    TORCH_CHECK(scale > 0, op, ": scale must be > 0 (the kernel keeps its running max on raw scores), got ", scale);
    TORCH_CHECK(B <= 65535 && H <= 65535, op, ": B and H must be at most 65535 (grid z and y), got B=", B, " H=", H);
    TORCH_CHECK(window_left >= -1 && window_right >= -1, op, ": window sides must be >= -1 (-1: unbounded), got (",
                window_left, ", ", window_right, ")");
    TORCH_CHECK(std::isfinite(softcap) && softcap >= 0, op, ": softcap must be finite and >= 0, got ", softcap);
    if (hopper) {
        check_sm90a(op, q);
    } else {
        int cc_major = 0;
        cudaDeviceGetAttribute(&cc_major, cudaDevAttrComputeCapabilityMajor, q.get_device());
        TORCH_CHECK(cc_major >= 8, op, ": needs an sm_80 or newer GPU; this one is compute capability ", cc_major,
                    ".x");
    }
    // A side of Sq + Sk keys or more reaches past every key of every sequence: the same mask, and the
    // kernels' i + off ± side then stays far from int overflow.
    auto side = [&](int64_t w) { return static_cast<int>(w < 0 ? -1 : std::min<int64_t>(w, Sq + Sk)); };
    const FaprofAttnEx ex{static_cast<int>(Hkv), bottom_right, side(window_left), side(window_right),
                          static_cast<float>(softcap),
                          varlen ? cu_q->data_ptr<int>() : nullptr, varlen ? cu_k->data_ptr<int>() : nullptr,
                          varlen ? static_cast<int>(q.size(0)) : 0, varlen ? static_cast<int>(k.size(0)) : 0};
    c10::cuda::CUDAGuard guard(q.device());
    check_launch(op, launcher(q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), lse.data_ptr<float>(),
                              static_cast<int>(B), static_cast<int>(H), static_cast<int>(Sq), static_cast<int>(Sk),
                              static_cast<int>(D), static_cast<float>(scale), causal,
                              q.scalar_type() == at::kBFloat16, ex, stream_of(q)));
}

void fa2_mma_fwd_ex(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, at::Tensor& out, at::Tensor& lse,
                    bool causal, double scale, int64_t kv_heads, bool bottom_right, int64_t window_left,
                    int64_t window_right, double softcap, const std::optional<at::Tensor>& cu_seqlens_q,
                    const std::optional<at::Tensor>& cu_seqlens_k, int64_t max_seqlen_q, int64_t max_seqlen_k) {
    fwd_ex("faprof::fa2_mma_fwd_ex", "fa2_mma", faprof_fa2_mma_fwd_ex, false, q, k, v, out, lse, causal, scale,
           kv_heads, bottom_right, window_left, window_right, softcap, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
           max_seqlen_k);
}

void fa3_wgmma_e_fwd_ex(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, at::Tensor& out,
                        at::Tensor& lse, bool causal, double scale, int64_t kv_heads, bool bottom_right,
                        int64_t window_left, int64_t window_right, double softcap,
                        const std::optional<at::Tensor>& cu_seqlens_q, const std::optional<at::Tensor>& cu_seqlens_k,
                        int64_t max_seqlen_q, int64_t max_seqlen_k) {
    constexpr const char* op = "faprof::fa3_wgmma_e_fwd_ex";
    TORCH_CHECK(softcap == 0, op, ": fa3_wgmma_e does not run a logit soft-cap");
    fwd_ex(op, "fa3_wgmma_e", faprof_fa3_wgmma_e_fwd_ex, true, q, k, v, out, lse, causal, scale, kv_heads,
           bottom_right, window_left, window_right, softcap, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(faprof, m) {
    m.def("fa2_mma_fwd_ex(Tensor q, Tensor k, Tensor v, Tensor(a!) out, Tensor(b!) lse, bool causal, float scale, int kv_heads, bool bottom_right, int window_left, int window_right, float softcap, Tensor? cu_seqlens_q, Tensor? cu_seqlens_k, int max_seqlen_q, int max_seqlen_k) -> ()");
    m.def("fa3_wgmma_e_fwd_ex(Tensor q, Tensor k, Tensor v, Tensor(a!) out, Tensor(b!) lse, bool causal, float scale, int kv_heads, bool bottom_right, int window_left, int window_right, float softcap, Tensor? cu_seqlens_q, Tensor? cu_seqlens_k, int max_seqlen_q, int max_seqlen_k) -> ()");
}

TORCH_LIBRARY_IMPL(faprof, CUDA, m) {
    m.impl("fa2_mma_fwd_ex", &fa2_mma_fwd_ex);
    m.impl("fa3_wgmma_e_fwd_ex", &fa3_wgmma_e_fwd_ex);
}

TORCH_LIBRARY_IMPL(faprof, CPU, m) {
    m.impl("fa2_mma_fwd_ex", &fa2_mma_fwd_ex);
    m.impl("fa3_wgmma_e_fwd_ex", &fa3_wgmma_e_fwd_ex);
}
