// faprof_attention.h: the plain-C launcher that `faprof profile --kernel FILE.cu[:LAUNCHER]` calls.
//
// faprof compiles FILE.cu with nvcc into a shared library (cached) and calls LAUNCHER through
// ctypes with raw device pointers. faprof includes this header before FILE.cu, so the file may
// use everything below without including it (including it again is harmless).
//
//   #include "faprof_attention.h"
//   FAPROF_KERNEL_INFO("dtypes=fp16,fp32;head_dims=32,64,128");
//   extern "C" FAPROF_LAUNCHER(my_attn) { ... launch on `stream`, return cudaGetLastError(); }
//
// Conventions (the same as faprof's own kernels):
//   * q, out: [B, H, Sq, D]; k, v: [B, H, Sk, D]; contiguous, row-major, all of element type
//     `dtype` (a FAPROF_* code below); lse, when not null: fp32 [B, H, Sq] (natural-log
//     log-sum-exp of each row of scale*Q*K^T). faprof passes lse = NULL today.
//   * causal = PyTorch SDPA's is_causal: top-left aligned, query row i sees keys j <= i.
//   * scale multiplies Q*K^T before the softmax.
//   * Return 0 (cudaSuccess) or a cudaError_t; return cudaErrorInvalidValue for a problem the
//     kernel does not handle, before launching anything. Kernels run asynchronously on `stream`.
//
// FAPROF_KERNEL_INFO declares what the file supports; faprof marks other problems `unsupported`:
//   dtypes=...     required: any of fp16, bf16, fp32
//   head_dims=...  optional: the head dims D it handles (default: any D)
//   compute=...    optional: tensor (default; % of peak uses the tensor-core rate) or cuda_core
#pragma once
#ifndef FAPROF_ATTENTION_H
#define FAPROF_ATTENTION_H

#include <cuda_runtime.h>

#define FAPROF_FP16 0
#define FAPROF_BF16 1
#define FAPROF_FP32 2

#define FAPROF_LAUNCHER_ARGS                                                                  \
    const void *q, const void *k, const void *v, void *out, float *lse, int B, int H, int Sq, \
        int Sk, int D, float scale, int causal, int dtype, cudaStream_t stream

// `extern "C" FAPROF_LAUNCHER(name) { ... }` defines a launcher with faprof's signature.
#define FAPROF_LAUNCHER(name) int name(FAPROF_LAUNCHER_ARGS)

// The launcher's type; faprof checks at compile time that LAUNCHER has exactly this type.
typedef int (*faprof_attention_launcher_t)(FAPROF_LAUNCHER_ARGS);

// One per file: what it supports, e.g. FAPROF_KERNEL_INFO("dtypes=fp16,bf16;head_dims=64,128").
#define FAPROF_KERNEL_INFO(text) \
    extern "C" const char *faprof_kernel_info(void) { return text; }

#endif  // FAPROF_ATTENTION_H
