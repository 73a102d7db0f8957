// Host launchers of faprof's kernels: plain C++ declarations shared by the kernel files (.cu,
// compiled by nvcc) and kernels/binding.cpp (compiled by the host compiler, the only file that
// includes torch).
//
// Conventions, the same for every launcher:
//   * tensors are [B, H, S, D], contiguous, fp32 unless the launcher says otherwise;
//   * causal = PyTorch SDPA's is_causal: top-left aligned, query row i sees keys j <= i;
//   * `scale` multiplies Q·Kᵀ before the softmax (Python passes 1/sqrt(D) by default);
//   * a launcher returns the launch's cudaError_t (cudaGetLastError() after the launch) and
//     cudaErrorInvalidValue for shapes it does not support, before launching anything;
//   * kernels run on `stream` and are asynchronous: faults surface at the next synchronization.
//
// To add a variant: one .cu file with its kernels and launcher, one block here, one block in
// binding.cpp (schema + impl), one Variant in faprof/variants/kernels.py.
#pragma once

#include <cuda_runtime.h>

// ------------------------------------------------------------------------------------ naive
// Three kernels: S = scale·Q·Kᵀ (masked) into `scores`, row softmax of S in place, O = P·V.
// Any D >= 1 (the tiled matmuls mask their tails); no alignment requirement.
cudaError_t faprof_naive_fwd(const float* q,   // [B, H, Sq, D]
                             const float* k,   // [B, H, Sk, D]
                             const float* v,   // [B, H, Sk, D]
                             float* o,         // [B, H, Sq, D]
                             float* scores,    // [B, H, Sq, Sk] workspace (S, then P in place)
                             int B, int H, int Sq, int Sk, int D, bool causal, float scale,
                             cudaStream_t stream);

// -------------------------------------------------------------------------------------- fa1
// FlashAttention-1 loop order (Dao et al. 2022, Algorithm 1): one block per (b, h), outer loop
// over K/V tiles, inner loop over Q tiles; O, l and m live in global memory.
// D in kFaprofFa1HeadDims; pointers 16-byte aligned.
inline constexpr int kFaprofFa1HeadDims[] = {32, 64, 128};
cudaError_t faprof_fa1_fwd(const float* q,   // [B, H, Sq, D]
                           const float* k,   // [B, H, Sk, D]
                           const float* v,   // [B, H, Sk, D]
                           float* o,         // [B, H, Sq, D]
                           float* l,         // [B, H, Sq] softmax denominators (relative to m)
                           float* m,         // [B, H, Sq] row maxima of scale·Q·Kᵀ
                           int B, int H, int Sq, int Sk, int D, bool causal, float scale,
                           cudaStream_t stream);

// -------------------------------------------------------------------------------------- fa2
// FlashAttention-2 partition (Dao 2023): grid over (query tiles, B·H), O accumulated on chip,
// online softmax, lse = m + log(l) written per row. D in kFaprofFa2HeadDims; pointers 16-byte
// aligned.
inline constexpr int kFaprofFa2HeadDims[] = {32, 64, 128};
cudaError_t faprof_fa2_fwd(const float* q,   // [B, H, Sq, D]
                           const float* k,   // [B, H, Sk, D]
                           const float* v,   // [B, H, Sk, D]
                           float* o,         // [B, H, Sq, D]
                           float* lse,       // [B, H, Sq] natural-log log-sum-exp of each row
                           int B, int H, int Sq, int Sk, int D, bool causal, float scale,
                           cudaStream_t stream);

// ----------------------------------------------------------------------- fa2_wmma, fa2_mma
// FlashAttention-2 partition on tensor cores, fp32 accumulate and fp32 online softmax; q, k, v
// and o are fp16 (bf16 = false) or bf16 (bf16 = true), one dtype for all four; lse is fp32.
//   fa2_wmma: nvcuda::wmma 16x16x16 fragments, softmax through a per-warp shared-memory scratch.
//   fa2_mma:  mma.sync m16n8k16 PTX, ldmatrix(.trans), XOR-swizzled shared memory, cp.async
//             double buffer for K/V, P kept in registers, exp2, causal tile skipping.
// D in kFaprofTcHeadDims; scale > 0; q, k, v, o 16-byte aligned; B and H at most 65535.
inline constexpr int kFaprofTcHeadDims[] = {64, 128, 256};
cudaError_t faprof_fa2_wmma_fwd(const void* q,  // [B, H, Sq, D] fp16 or bf16
                                const void* k,  // [B, H, Sk, D]
                                const void* v,  // [B, H, Sk, D]
                                void* o,        // [B, H, Sq, D]
                                float* lse,     // [B, H, Sq] natural-log log-sum-exp of each row
                                int B, int H, int Sq, int Sk, int D, float scale, bool causal, bool bf16,
                                cudaStream_t stream);
cudaError_t faprof_fa2_mma_fwd(const void* q,  // [B, H, Sq, D] fp16 or bf16
                               const void* k,  // [B, H, Sk, D]
                               const void* v,  // [B, H, Sk, D]
                               void* o,        // [B, H, Sq, D]
                               float* lse,     // [B, H, Sq] natural-log log-sum-exp of each row
                               int B, int H, int Sq, int Sk, int D, float scale, bool causal, bool bf16,
                               cudaStream_t stream);

// The problems beyond 2022's (issue 36), for the launchers named *_fwd_ex: grouped-query heads,
// the mask rule of faprof/model/mask.py (per sequence of sq queries and sk keys, off = sk - sq when
// bottom_right else 0; query i sees key j iff (!causal || j <= i + off) && (left < 0 || j >= i + off
// - left) && (right < 0 || j <= i + off + right); a query that sees no key writes zeros and lse
// -inf), a logit soft-cap, and packed variable-length batches.
struct FaprofAttnEx {
  int Hkv;                  // KV heads; H % Hkv == 0, query head h reads KV head h / (H / Hkv)
  bool bottom_right;        // align the causal diagonal and the window to the bottom-right corner
  int window_left;          // keys before the diagonal a query sees (-1: unbounded)
  int window_right;         // keys after the diagonal a query sees (-1: unbounded)
  float softcap;            // > 0: scores become c·tanh(scale·s / c); 0: none
  const int* cu_seqlens_q;  // varlen: int32 [B + 1] on the device, q/o rows of each sequence; null: dense
  const int* cu_seqlens_k;  // varlen: int32 [B + 1], k/v rows of each sequence (both or neither)
  int total_q;              // varlen: rows of q (lse is [H, total_q]); unused when dense
  int total_k;              // varlen: rows of k and v; unused when dense
};

// fa2_mma for FaprofAttnEx problems (kernels/fa2_mma.cu): the same kernel instantiated with the
// general mask, KV-head and layout arithmetic (2022's problems keep faprof_fa2_mma_fwd's code).
// Dense: q/o [B, H, Sq, D], k/v [B, Hkv, Sk, D], lse [B, H, Sq]. Varlen: q/o [total_q, H, D], k/v
// [total_k, Hkv, D], lse [H, total_q]; Sq and Sk are the longest sequence's lengths (the grid covers
// ceil(Sq / 128) query tiles per sequence; a smaller Sq than a sequence's leaves its rows unwritten).
cudaError_t faprof_fa2_mma_fwd_ex(const void* q, const void* k, const void* v, void* o, float* lse, int B, int H,
                                  int Sq, int Sk, int D, float scale, bool causal, bool bf16, const FaprofAttnEx& ex,
                                  cudaStream_t stream);

// ================================================================= backward (issue 13)
// FlashAttention-2 backward (Dao 2023, Algorithm 2): delta = rowsum(dO ∘ O), then a grid over
// key tiles that keeps dK and dV on chip and loops over query tiles, recomputing P from Q, K and
// the forward's lse (natural log, as fa2_fwd / fa2_mma_fwd write it). dQ is accumulated with fp32
// atomics (deterministic = false) or by a separate kernel over query tiles (deterministic = true:
// bit-identical results from call to call). q, k, v, o, dout and the gradients are contiguous
// [B, H, S, D] tensors in one dtype, 16-byte aligned; lse and delta are fp32 [B, H, Sq].

// fa2_bwd: fp32 on CUDA cores, D in kFaprofFa2HeadDims. dq is written with atomics on the
// atomic path (the launcher zeroes it first).
cudaError_t faprof_fa2_bwd(const float* q, const float* k, const float* v,
                           const float* o,     // [B, H, Sq, D] the forward's output
                           const float* dout,  // [B, H, Sq, D] upstream gradient
                           const float* lse,   // [B, H, Sq] the forward's lse
                           float* dq, float* dk, float* dv,
                           float* delta,       // [B, H, Sq] workspace: rowsum(dO ∘ O)
                           int B, int H, int Sq, int Sk, int D, bool causal, float scale, bool deterministic,
                           cudaStream_t stream);

// fa2_mma_bwd: fp16/bf16 on tensor cores (mma.sync m16n8k16, fp32 accumulate), D in
// kFaprofMmaBwdHeadDims, scale > 0, sm_80+. dq_accum: fp32 [B, H, Sq, D] workspace of the atomic
// path (unused, may be null, when deterministic). The atomic path double-buffers Q/dO and staggers the
// first query tile (non-causal); single_buffer (the hidden test variant _fa2_mma_bwd_1buf) keeps the
// single-buffered kernel it replaced, for comparison.
inline constexpr int kFaprofMmaBwdHeadDims[] = {64, 128};
cudaError_t faprof_fa2_mma_bwd(const void* q, const void* k, const void* v, const void* o, const void* dout,
                               const float* lse, void* dq, void* dk, void* dv, float* delta, float* dq_accum,
                               int B, int H, int Sq, int Sk, int D, float scale, bool causal, bool bf16,
                               bool deterministic, bool single_buffer, cudaStream_t stream);
// =========================================================== end of backward (issue 13)

// --------------------------------------------------------------------------------- fa3_wgmma
// FlashAttention forward on Hopper warpgroup MMA (kernels/fa3_wgmma.cu), one launcher per step of
// issue 14's progression. Same arguments and conventions as fa2_mma (fp16 or bf16 q, k, v, o;
// fp32 lse; scale > 0; 16-byte aligned). sm_90a only: on any GPU that is not compute capability
// 9.0 the launchers return cudaErrorNotSupported before launching.
//   fa3_wgmma_a: wgmma (S = QKᵀ SS, O += PV RS with P in registers), cp.async double-buffered K/V
//                in 128-byte swizzled shared memory, 2 warpgroups x 64 query rows.
//   fa3_wgmma_b: (a) with TMA loads (tensor maps encoded on the host through the runtime's driver
//                entry point) and a 2-stage mbarrier ring for K/V.
//   fa3_wgmma_c: (b) warp-specialized (kernels/fa3_wgmma_ws.cu): a TMA producer warpgroup
//                (setmaxnreg 24) and 2 consumer warpgroups (setmaxnreg 240), full/empty mbarriers.
//   fa3_wgmma_d: (c) + pingpong: the consumer warpgroups' GEMMs alternate (named barriers).
//   fa3_wgmma_e: (d) + intra-warpgroup overlap of softmax(S_j) with O += P_{j-1} V_{j-1}.
inline constexpr int kFaprofFa3HeadDims[] = {64, 128};
cudaError_t faprof_fa3_wgmma_a_fwd(const void* q,  // [B, H, Sq, D] fp16 or bf16
                                   const void* k,  // [B, H, Sk, D]
                                   const void* v,  // [B, H, Sk, D]
                                   void* o,        // [B, H, Sq, D]
                                   float* lse,     // [B, H, Sq] natural-log log-sum-exp of each row
                                   int B, int H, int Sq, int Sk, int D, float scale, bool causal, bool bf16,
                                   cudaStream_t stream);
cudaError_t faprof_fa3_wgmma_b_fwd(const void* q, const void* k, const void* v, void* o, float* lse, int B, int H,
                                   int Sq, int Sk, int D, float scale, bool causal, bool bf16, cudaStream_t stream);
cudaError_t faprof_fa3_wgmma_c_fwd(const void* q, const void* k, const void* v, void* o, float* lse, int B, int H,
                                   int Sq, int Sk, int D, float scale, bool causal, bool bf16, cudaStream_t stream);
cudaError_t faprof_fa3_wgmma_d_fwd(const void* q, const void* k, const void* v, void* o, float* lse, int B, int H,
                                   int Sq, int Sk, int D, float scale, bool causal, bool bf16, cudaStream_t stream);
cudaError_t faprof_fa3_wgmma_e_fwd(const void* q, const void* k, const void* v, void* o, float* lse, int B, int H,
                                   int Sq, int Sk, int D, float scale, bool causal, bool bf16, cudaStream_t stream);

// Step (e) for FaprofAttnEx problems (declared after the struct, above): GQA/MQA (TMA coordinates of
// the KV head), causal and windows aligned to either corner with tile skipping, dense or packed
// varlen (tensor maps over [total, heads, D], the sequence's start as the row coordinate); a soft-cap
// returns cudaErrorInvalidValue. Layouts as faprof_fa2_mma_fwd_ex's.
cudaError_t faprof_fa3_wgmma_e_fwd_ex(const void* q, const void* k, const void* v, void* o, float* lse, int B, int H,
                                      int Sq, int Sk, int D, float scale, bool causal, bool bf16,
                                      const FaprofAttnEx& ex, cudaStream_t stream);

// ------------------------------------------------------------------- fa3 backward (issue 28)
// Hopper backward steps (kernels/fa3_bwd_a.cu, fa3_bwd_b.cu, fa3_bwd_pre.cu): gradients of the fa3
// forward that wrote `o` and `lse` (natural log). FlashAttention-2's KV-block-parallel backward
// with all five GEMMs on wgmma.mma_async; dQ summed with fp32 red.global.add.v4 into dq_accum, then
// converted. Same conventions as fa2_mma_bwd (fp16 or bf16 tensors in one dtype, contiguous,
// 16-byte aligned; scale > 0; B and H at most 65535); D in kFaprofFa3HeadDims. sm_90a only: on a GPU
// that is not compute capability 9.0 the launchers return cudaErrorNotSupported before launching.
//   fa3_bwd_a: cp.async loads, Q/dO/lse2/delta double-buffered.
//   fa3_bwd_b: (a) with TMA loads: K/V by tensor map once, Q/dO by tensor map and lse2/delta by 1-D
//              bulk copies through a 2-stage mbarrier ring.
// lse2 and delta are fp32 [B, H, Sq_pad] workspaces, Sq_pad = Sq rounded up to kFaprofFa3BwdSeqPad
// (written by the launcher's preprocess kernel); dq_accum is an fp32 [B, H, Sq, D] workspace.
inline constexpr int kFaprofFa3BwdSeqPad = 128;
cudaError_t faprof_fa3_bwd_a(const void* q, const void* k, const void* v,
                             const void* o,      // [B, H, Sq, D] the forward's output
                             const void* dout,   // [B, H, Sq, D] upstream gradient
                             const float* lse,   // [B, H, Sq] the forward's lse
                             void* dq, void* dk, void* dv,
                             float* lse2,        // [B, H, Sq_pad] workspace
                             float* delta,       // [B, H, Sq_pad] workspace
                             float* dq_accum,    // [B, H, Sq, D] workspace
                             int B, int H, int Sq, int Sk, int D, float scale, bool causal, bool bf16,
                             cudaStream_t stream);
cudaError_t faprof_fa3_bwd_b(const void* q, const void* k, const void* v, const void* o, const void* dout,
                             const float* lse, void* dq, void* dk, void* dv, float* lse2, float* delta,
                             float* dq_accum, int B, int H, int Sq, int Sk, int D, float scale, bool causal, bool bf16,
                             cudaStream_t stream);
// Steps c and d (kernels/fa3_bwd_c.cu, fa3_bwd_d.cu, fa3_bwd_ws.cuh), same arguments:
//   fa3_bwd_c: (b) warp-specialized: a TMA producer warpgroup, a 3-stage ring with empty barriers, two
//              consumer warpgroups (setmaxnreg) meeting at named barriers, double-buffered dSᵀ.
//   fa3_bwd_d: (c) with dQ added by the TMA unit (a shared-memory tile, one bulk reduce-add per query
//              tile); dq_accum then holds dQ with its 16-byte chunks permuted per row.
cudaError_t faprof_fa3_bwd_c(const void* q, const void* k, const void* v, const void* o, const void* dout,
                             const float* lse, void* dq, void* dk, void* dv, float* lse2, float* delta,
                             float* dq_accum, int B, int H, int Sq, int Sk, int D, float scale, bool causal, bool bf16,
                             cudaStream_t stream);
cudaError_t faprof_fa3_bwd_d(const void* q, const void* k, const void* v, const void* o, const void* dout,
                             const float* lse, void* dq, void* dk, void* dv, float* lse2, float* delta,
                             float* dq_accum, int B, int H, int Sq, int Sk, int D, float scale, bool causal, bool bf16,
                             cudaStream_t stream);

// ------------------------------------------------------------------- decode_splitkv (issue 36)
// Split-KV decoding (kernels/decode_splitkv.cu): the Sq x (H / Hkv) query rows of one KV head packed
// into one tile, the keys split over CTAs, the splits merged by log-sum-exp in a second kernel.
// q and o are [B, H, Sq, D]; K/V are dense [B, Hkv, Sk, D] (page_size = 0, block_table and
// seqlens_k null) or a paged pool [num_blocks, page_size, Hkv, D] with an int32 block table
// [B, max_blocks] and int32 cache lengths [B] (Sk must then be max_blocks * page_size, the capacity).
// fp16 or bf16 (one dtype for q, k, v, o), lse fp32 [B, H, Sq] (natural log); D in
// kFaprofDecodeHeadDims; scale > 0; q, k, v, o, partial_o 16-byte aligned; sm_80 or newer.
// causal with bottom_right: query i sees keys <= i + seqlen - Sq; causal alone: keys <= i.
inline constexpr int kFaprofDecodeHeadDims[] = {64, 128};
// The split count for a problem (requested_splits > 0: that count, clamped to one 64-key tile per
// split); keys_per_split is a multiple of 64 and num_splits * keys_per_split >= Sk. The heuristic
// is described beside its definition. Needs the current device (SM count, occupancy).
cudaError_t faprof_decode_splitkv_plan(int B, int H, int Hkv, int Sq, int Sk, int D, bool paged, bool bf16,
                                       int requested_splits, int* num_splits, int* keys_per_split);
// partial_o: fp32 [num_splits, B * H * Sq, D] and partial_lse: fp32 [num_splits, B * H * Sq]
// workspaces, unused (may be null) when num_splits == 1.
cudaError_t faprof_decode_splitkv_fwd(const void* q, const void* k, const void* v, void* o, float* lse,
                                      const int* block_table, const int* seqlens_k, int page_size, int max_blocks,
                                      float* partial_o, float* partial_lse, int num_splits, int keys_per_split,
                                      int B, int H, int Hkv, int Sq, int Sk, int D, float scale, bool causal,
                                      bool bottom_right, bool bf16, cudaStream_t stream);
