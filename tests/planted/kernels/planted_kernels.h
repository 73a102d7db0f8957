// planted_kernels.h — TEST ONLY: launchers of the planted-fault kernels (tests/planted/).
//
// Plain CUDA, no torch headers, like kernels/faprof_kernels.h; planted_binding.cpp wraps them as
// torch.ops.faprof_planted.* ops. Every launcher returns a cudaError_t (cudaErrorInvalidValue for
// shapes it does not take) and never synchronizes.
#pragma once

#include <cuda_runtime.h>

// Fault codes of faprof_planted_mma_fwd (planted_mma.cu's Fault enum).
inline constexpr int kPlantedClean = 0;
inline constexpr int kPlantedBankConflicts = 1;
inline constexpr int kPlantedSpills = 2;
inline constexpr int kPlantedUncoalesced = 3;
inline constexpr int kPlantedNoCausalSkip = 4;
inline constexpr int kPlantedFewCtas = 5;
inline constexpr int kPlantedBarrier = 6;
inline constexpr int kPlantedFence = 7;
inline constexpr int kPlantedTranscendental = 8;
inline constexpr int kPlantedFp64 = 9;
inline constexpr int kPlantedL2Thrash = 10;
inline constexpr int kPlantedGlobalRmw = 11;
inline constexpr int kPlantedSmallTile = 12;
inline constexpr int kPlantedTf32Mma = 13;

// Fault codes of faprof_planted_rowthread_fwd (planted_rowthread.cu's Fault enum).
inline constexpr int kRowThreadClean = 0;
inline constexpr int kRowThreadDependency = 1;
inline constexpr int kRowThreadIndexMath = 2;
inline constexpr int kRowThreadDivergence = 3;
inline constexpr int kRowThreadPredicatedOff = 4;
inline constexpr int kRowThreadScalarLoads = 5;

// fa2_mma with one planted fault; per_head launches the kernel once per (b, h) slice.
// fp16 only (bf16 returns cudaErrorInvalidValue). scratch: [B, H, Sq, D] fp32 for kPlantedGlobalRmw
// (which refuses nullptr), else unused (nullptr).
cudaError_t faprof_planted_mma_fwd(const void* q,  // [B, H, Sq, D] fp16, 16-byte aligned
                                   const void* k,  // [B, H, Sk, D]
                                   const void* v,  // [B, H, Sk, D]
                                   void* o,        // [B, H, Sq, D]
                                   float* lse,     // [B, H, Sq]
                                   int B, int H, int Sq, int Sk, int D, float scale, bool causal, bool bf16,
                                   int fault, bool per_head, cudaStream_t stream, float* scratch = nullptr);

// fa2 (the fp32 CUDA-core kernel) reading and writing fp16: FlashAttention-2 without tensor cores.
cudaError_t faprof_planted_cuda_core_fwd(const void* q,  // [B, H, Sq, D] fp16, 8-byte aligned
                                         const void* k,  // [B, H, Sk, D]
                                         const void* v,  // [B, H, Sk, D]
                                         void* o,        // [B, H, Sq, D]
                                         float* lse,     // [B, H, Sq]
                                         int B, int H, int Sq, int Sk, int D, float scale, bool causal,
                                         cudaStream_t stream);

// The "row threads" fp32 CUDA-core FlashAttention forward (planted_rowthread.cu) with one planted fault
// (kRowThreadClean: none). fp32 in and out, D = 64 or 128.
cudaError_t faprof_planted_rowthread_fwd(const void* q,  // [B, H, Sq, D] fp32, 16-byte aligned
                                         const void* k,  // [B, H, Sk, D]
                                         const void* v,  // [B, H, Sk, D]
                                         void* o,        // [B, H, Sq, D]
                                         float* lse,     // [B, H, Sq]
                                         int B, int H, int Sq, int Sk, int D, float scale, bool causal, int fault,
                                         cudaStream_t stream);
