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
//   features=...   optional: problems beyond equal heads / top-left causal / one length / contiguous
//                  K/V that the kernel runs: any of gqa, bottom_right, window, softcap, varlen, paged.
//                  A kernel that declares features is launched through FAPROF_PROBLEM_LAUNCHER below.
//
// Today's problems (GQA, windows, packed varlen batches, paged KV caches): define the launcher as
//   extern "C" FAPROF_PROBLEM_LAUNCHER(name) { ... }
// It gets the same pointers and a faprof_attention_problem describing everything else. Layouts:
//   * dense:  q, out [B, H, Sq, D]; k, v [B, Hkv, Sk, D]
//   * varlen: q, out [total_q, H, D]; k, v [total_k, Hkv, D]; sequence b's queries are rows
//             cu_seqlens_q[b] .. cu_seqlens_q[b+1]-1 (likewise keys); lse, if written: [H, total_q]
//   * paged:  q, out [B, H, Sq, D]; k, v are the pool [num_blocks, page_size, Hkv, D]; sequence b's
//             j-th block of page_size keys is pool block block_table[b * max_blocks + j]; it holds
//             seqlens_k[b] keys (its last block partly filled); blocks sit in the pool in any order.
//   Query head h reads KV head h / (H / Hkv). The mask, per sequence of sq queries and sk keys, with
//   off = sk - sq when bottom_right, else 0: query i sees key j when (!causal || j <= i + off) and
//   (window_left < 0 || j >= i + off - window_left) and (window_right < 0 || j <= i + off + window_right).
//   A query that sees no key gets zeros. softcap > 0: scores s = scale*q.k become softcap*tanh(s/softcap).
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

// Everything about a problem beyond the pointers (see "Today's problems" above). Index pointers are
// device pointers to int32 arrays, NULL when the layout has none.
typedef struct {
    int B, H, Hkv, Sq, Sk, D;  // Sq, Sk: the longest sequence's lengths
    int dtype;                 // a FAPROF_* code
    float scale;               // multiplies Q*K^T
    float softcap;             // 0: none
    int causal;                // 1: causal mask
    int bottom_right;          // 1: causal mask and window aligned to the bottom-right corner
    int window_left;           // -1: unbounded
    int window_right;          // -1: unbounded
    int total_q, total_k;      // tokens over all sequences (varlen); B*Sq and B*Sk otherwise
    const int *cu_seqlens_q;   // varlen: [B + 1]
    const int *cu_seqlens_k;   // varlen: [B + 1]
    const int *seqlens_k;      // paged: [B] keys in each sequence's cache
    const int *block_table;    // paged: [B, max_blocks], row-major; unused entries -1
    int max_blocks;            // paged: columns of block_table
    int page_size;             // paged: keys per block; 0 when K/V are contiguous
    int num_blocks;            // paged: blocks in the pool
} faprof_attention_problem;

#define FAPROF_PROBLEM_LAUNCHER_ARGS                                                           \
    const void *q, const void *k, const void *v, void *out, float *lse,                        \
        const faprof_attention_problem *problem, cudaStream_t stream

// `extern "C" FAPROF_PROBLEM_LAUNCHER(name) { ... }`: a launcher for today's problems.
#define FAPROF_PROBLEM_LAUNCHER(name) int name(FAPROF_PROBLEM_LAUNCHER_ARGS)

typedef int (*faprof_problem_launcher_t)(FAPROF_PROBLEM_LAUNCHER_ARGS);

// One per file: what it supports, e.g. FAPROF_KERNEL_INFO("dtypes=fp16,bf16;head_dims=64,128").
#define FAPROF_KERNEL_INFO(text) \
    extern "C" const char *faprof_kernel_info(void) { return text; }

#endif  // FAPROF_ATTENTION_H
