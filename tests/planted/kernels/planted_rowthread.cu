// planted_rowthread.cu — TEST ONLY: an fp32 CUDA-core FlashAttention forward of a design unlike
// faprof's kernels, with one planted performance defect per FAULT (kClean is the family's control).
//
// Design ("row threads"): a query row belongs to TPR = D/32 consecutive threads, each holding 32 of
// its head-dim elements of q and of the O accumulator in registers (fa2.cu instead gives a warp 8 rows
// and a lane 2 keys). K and V tiles of BC keys sit in shared memory (cp.async, two stages); every
// thread walks the tile's keys, reads the key's 32 elements of its slice as broadcast float4 loads,
// and the TPR partial dot products of a row are combined by a reduce-scatter of xor shuffles, so
// that each whole score lands in one of the row's threads (KC/TPR scores each). Softmax is online,
// in chunks of KC keys, in the log2 domain with the scale folded in: each score's exp2 (ex2.approx)
// once, by the thread that holds the score, the weights then shared with the row's other threads by
// indexed shuffles for PV. Blocks are 256 threads (256/TPR rows); one block per SM whatever the
// registers (the launcher sizes the dynamic shared memory for that), so the control and every defect
// run 8 warps per SM and differ in their instruction streams only. fp32 in, fp32 out; causal or not;
// D = 64 or 128; any Sq, Sk.
//
// The defects (each `PLANTED FAULT`, results within fp32 rounding of the control's):
//   kDependency    QKᵀ with one accumulator: a rolled loop over the chunk's keys computes one score
//                  at a time as a chain of 32 dependent FFMAs (the control keeps KC = 16 chains in
//                  flight); the score goes through a shared-memory slot (a rolled loop cannot index
//                  registers).
//   kIndexMath     in PV, every V float4 is found from its flat 64-bit index in the [B, H, Sk, D]
//                  tensor by a signed 64-bit `/` and `%` (row, column), then its tile row: ~13 integer
//                  instructions per 4 FFMAs.
//   kDivergence    QKᵀ written once per slice owner (`if (part == 0) ... else if (part == 1) ...`,
//                  compile-time offsets): the TPR owners of a row take turns, each copy running with
//                  32/TPR lanes of the warp active.
//   kPredicatedOff PV walks all D/4 float4 chunks of each V row and acts only on the chunks the thread
//                  owns (`if (c % TPR == part)`): TPR times the instructions, (TPR-1)/TPR of their
//                  threads predicated off.
//   kScalarLoads   K and V rows addressed with the tile's row stride as a kernel argument: the compiler
//                  proves 16-byte alignment only for rows 0, 4, 8, 12 of a chunk and splits the other
//                  float4 reads into LDS.64 pairs (even rows) or four LDS.32 (odd rows): 704 shared-
//                  memory load instructions per 16-key chunk instead of 256.
// The SASS census of each (instructions per key tile against kClean's) is in
// tests/planted/planted_variants.py's docstring; tests/test_planted_sass.py keeps it true.
// Built only by tests/planted/planted_variants.py; never part of faprof's extension.
//
#include <cuda_runtime.h>

#include <cstdint>

#include "planted_kernels.h"

namespace faprof_planted_rt {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// The planted faults. Values match planted_kernels.h's kRowThread* constants.
enum Fault : int { kClean = 0, kDependency = 1, kIndexMath = 2, kDivergence = 3, kPredicatedOff = 4, kScalarLoads = 5 };

// faprof:launch kernel=planted_rt_fwd_kernel D=A0 threads=256 dyn_smem=2*2*4096*4+16*256*4
template <int D_>
struct RtConfig {
  static constexpr int D = D_;
  static constexpr int THREADS = 256;
  static constexpr int DS = 32;                     // head-dim elements of q and O per thread
  static constexpr int TPR = D / DS;                // threads per query row (2 or 4)
  static constexpr int BR = THREADS / TPR;          // query rows per block (128 or 64)
  static constexpr int BC = 4096 / D;               // keys per K/V tile (64 or 32): 16 KB per tile
  static constexpr int KC = 16;                     // keys per softmax chunk (score registers per thread)
  static constexpr int CHUNKS = DS / 4;             // float4 chunks per thread and row
  static constexpr int STAGES = 2;                  // cp.async stages
  static constexpr int TILE_FLOATS = BC * D;
  static constexpr int SCRATCH_FLOATS = KC * THREADS;  // kDependency's score slots
  static constexpr int SMEM_BYTES = (STAGES * 2 * TILE_FLOATS + SCRATCH_FLOATS) * 4;

  static_assert(D % 64 == 0 && D <= 128, "D must be 64 or 128");
  static_assert(TPR == 2 || TPR == 4, "a row's partial dot products are summed by 1 or 2 xor shuffles");
  static_assert(32 % TPR == 0, "a row's threads must sit in one warp");
  static_assert(BC % KC == 0, "a tile splits into whole softmax chunks");
  static_assert((TILE_FLOATS / 4) % THREADS == 0, "tile copies split evenly over the block");
  static_assert(SMEM_BYTES == (2 * 2 * 4096 + 16 * 256) * 4, "keep the faprof:launch annotation above in step");
  static_assert(SMEM_BYTES <= 99 * 1024, "must fit sm_89's 99 KB per block");
};

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte global->shared copy (L2 only); pred = false zero-fills. "memory": the copies must stay
// between the barriers that guard their stage.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool pred) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(pred ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// MUFU.EX2 without the denormal fix-up; exp2(-inf) = +0.
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Rows [k0, k0 + BC) of a [Sk, D] fp32 matrix into a [BC][D] tile; rows >= Sk read as 0.
template <class C>
__device__ __forceinline__ void load_tile(float* tile, const float* __restrict__ g, int k0, int Sk, int tid) {
  constexpr int PER_ROW = C::D / 4;
#pragma unroll
  for (int i = 0; i < C::TILE_FLOATS / 4 / C::THREADS; ++i) {
    const int c = tid + i * C::THREADS;
    const int r = c / PER_ROW;
    const bool ok = k0 + r < Sk;
    cp_async_16(smem_u32(tile + 4 * c), g + static_cast<size_t>(ok ? k0 + r : 0) * C::D + 4 * (c % PER_ROW), ok);
  }
}

// The float4 of key row `kr` (tile row) at chunk `c` of a [BC][D] tile (row stride `ld` = D).
// PLANTED FAULT (kIndexMath): found from the element's flat 64-bit index e in the [B, H, Sk, D]
// tensor (base = the tile's first key's flat row index) by a signed 64-bit `/` and `%`.
// PLANTED FAULT (kScalarLoads): addressed with the runtime row stride `ld`, four scalar loads.
template <class C, int FAULT>
__device__ __forceinline__ float4 tile_f4(const float* tile, int kr, int c, long long base, int ld) {
  if constexpr (FAULT == kScalarLoads) {
    const float* p = tile + kr * ld + 4 * c;
    return make_float4(p[0], p[1], p[2], p[3]);
  } else if constexpr (FAULT == kIndexMath) {
    const long long e = (base + kr) * C::D + 4 * c;
    const long long row = e / C::D;
    const long long col = e % C::D;
    return *reinterpret_cast<const float4*>(tile + (row - base) * C::D + col);
  } else {
    (void)ld;
    return *reinterpret_cast<const float4*>(tile + kr * C::D + 4 * c);
  }
}

// Partial scores of KC keys (tile rows kr0 ...) against this thread's slice of q (chunks
// part + TPR * i): the control's QKᵀ, KC independent FFMA chains fed by float4 reads of K.
template <class C, int FAULT>
__device__ __forceinline__ void qk_slice(float (&s)[C::KC], const float (&qr)[C::DS], const float* Kt, int kr0,
                                         int part, long long base, int ld) {
#pragma unroll
  for (int i = 0; i < C::CHUNKS; ++i)
#pragma unroll
    for (int kc = 0; kc < C::KC; ++kc) {
      const float4 kf = tile_f4<C, FAULT == kScalarLoads ? kScalarLoads : kClean>(Kt, kr0 + kc, part + C::TPR * i,
                                                                                 base, ld);
      s[kc] = fmaf(qr[4 * i + 0], kf.x, s[kc]);
      s[kc] = fmaf(qr[4 * i + 1], kf.y, s[kc]);
      s[kc] = fmaf(qr[4 * i + 2], kf.z, s[kc]);
      s[kc] = fmaf(qr[4 * i + 3], kf.w, s[kc]);
    }
}

// PLANTED FAULT (kDivergence): `if (part == 0) {slice 0} else if (part == 1) {slice 1} ...`, each
// copy with its owner's chunk offsets as immediates.
template <class C, int FAULT, int OWNER>
__device__ __forceinline__ void qk_by_owner(float (&s)[C::KC], const float (&qr)[C::DS], const float* Kt, int kr0,
                                            int part, long long base, int ld) {
  if (part == OWNER) {
    qk_slice<C, FAULT>(s, qr, Kt, kr0, OWNER, base, ld);
  } else if constexpr (OWNER + 1 < C::TPR) {
    qk_by_owner<C, FAULT, OWNER + 1>(s, qr, Kt, kr0, part, base, ld);
  }
}

template <class C, bool CAUSAL, int FAULT>
__global__ void __launch_bounds__(C::THREADS, 1)
planted_rt_fwd_kernel(const float* __restrict__ q,  // [B, H, Sq, D]
                      const float* __restrict__ k,  // [B, H, Sk, D]
                      const float* __restrict__ v,  // [B, H, Sk, D]
                      float* __restrict__ o,        // [B, H, Sq, D]
                      float* __restrict__ lse,      // [B, H, Sq]
                      int Sq, int Sk, float scale, float scale_log2,
                      int ld) {  // = D: the tiles' row stride (kScalarLoads reads it; the others use D)
  constexpr int D = C::D, TPR = C::TPR, BR = C::BR, BC = C::BC, KC = C::KC, DS = C::DS, CH = C::CHUNKS;
  extern __shared__ __align__(16) float smem[];
  float* sK = smem;                             // [STAGES][BC][D]
  float* sV = sK + C::STAGES * C::TILE_FLOATS;  // [STAGES][BC][D]
  float* sS = sV + C::STAGES * C::TILE_FLOATS;  // [KC][THREADS] (kDependency)

  const int tid = threadIdx.x;
  const int part = tid % TPR;  // this thread's slice: chunks part + TPR * i
  const int lane0 = (tid & 31) - part;  // the lane of its row's part 0
  const int n_qt = (Sq + BR - 1) / BR;
  const int qt = CAUSAL ? n_qt - 1 - static_cast<int>(blockIdx.x) : static_cast<int>(blockIdx.x);  // heavy first
  const int q0 = qt * BR;
  const int row = q0 + tid / TPR;
  const int bh = blockIdx.z * gridDim.y + blockIdx.y;
  const float* qg = q + static_cast<size_t>(bh) * Sq * D;
  const float* kg = k + static_cast<size_t>(bh) * Sk * D;
  const float* vg = v + static_cast<size_t>(bh) * Sk * D;

  int n_kv = (Sk + BC - 1) / BC;
  if (CAUSAL) n_kv = min(n_kv, (min(q0 + BR, Sq) - 1) / BC + 1);  // the block's last row sees keys <= it

  load_tile<C>(sK, kg, 0, Sk, tid);
  load_tile<C>(sV, vg, 0, Sk, tid);
  cp_async_commit();

  float qr[DS], acc[DS];
#pragma unroll
  for (int i = 0; i < CH; ++i) {
    float4 t = make_float4(0.f, 0.f, 0.f, 0.f);
    if (row < Sq) t = *reinterpret_cast<const float4*>(qg + static_cast<size_t>(row) * D + 4 * (part + TPR * i));
    qr[4 * i] = t.x;
    qr[4 * i + 1] = t.y;
    qr[4 * i + 2] = t.z;
    qr[4 * i + 3] = t.w;
  }
#pragma unroll
  for (int d = 0; d < DS; ++d) acc[d] = 0.f;
  float m_run = -INFINITY;  // running max of raw scores
  float l_run = 0.f;        // running sum of exp2(s * scale_log2 - m_run * scale_log2)

  for (int j = 0; j < n_kv; ++j) {
    const int kv0 = j * BC;
    if (j + 1 < n_kv) {
      load_tile<C>(sK + ((j + 1) & 1) * C::TILE_FLOATS, kg, kv0 + BC, Sk, tid);
      load_tile<C>(sV + ((j + 1) & 1) * C::TILE_FLOATS, vg, kv0 + BC, Sk, tid);
    }
    cp_async_commit();
    cp_async_wait<1>();  // tile j has landed (tile j+1 may be in flight)
    __syncthreads();
    const float* Kt = sK + (j & 1) * C::TILE_FLOATS;
    const float* Vt = sV + (j & 1) * C::TILE_FLOATS;
    const long long base = static_cast<long long>(bh) * Sk + kv0;  // kIndexMath: the tile's first flat row
    const bool need_mask = kv0 + BC > Sk || (CAUSAL && kv0 + BC - 1 > q0);

#pragma unroll 1
    for (int kr0 = 0; kr0 < BC; kr0 += KC) {
      // ---- partial scores over this thread's slice ----
      float s[KC];
#pragma unroll
      for (int kc = 0; kc < KC; ++kc) s[kc] = 0.f;
      if constexpr (FAULT == kDependency) {
        // PLANTED FAULT (kDependency): one accumulator, one key at a time; 32 dependent FFMAs per score.
#pragma unroll 1
        for (int kc = 0; kc < KC; ++kc) {
          float a = 0.f;
#pragma unroll
          for (int i = 0; i < CH; ++i) {
            const float4 kf = tile_f4<C, FAULT>(Kt, kr0 + kc, part + TPR * i, base, ld);
            a = fmaf(qr[4 * i + 0], kf.x, a);
            a = fmaf(qr[4 * i + 1], kf.y, a);
            a = fmaf(qr[4 * i + 2], kf.z, a);
            a = fmaf(qr[4 * i + 3], kf.w, a);
          }
          sS[kc * C::THREADS + tid] = a;  // a thread's own slots: no barrier needed
        }
#pragma unroll
        for (int kc = 0; kc < KC; ++kc) s[kc] = sS[kc * C::THREADS + tid];
      } else if constexpr (FAULT == kDivergence) {
        // PLANTED FAULT (kDivergence): the slice code once per owner, with compile-time offsets; the
        // owners of a row run their copies one after another, 32/TPR lanes active in each.
        qk_by_owner<C, FAULT, 0>(s, qr, Kt, kr0, part, base, ld);
      } else {
        qk_slice<C, FAULT>(s, qr, Kt, kr0, part, base, ld);
      }

      // ---- whole scores, each in one of the row's threads: a reduce-scatter of the TPR slices ----
      // Before round m (1, then 2 when TPR = 4) slot kc (a multiple of m) holds key kc + (part & (m-1)).
      // Round m pairs slots kc and kc + m (kc a multiple of 2m): the thread with bit m of `part` clear
      // keeps slot kc's key and sends its partner (part ^ m) its partial of slot kc + m's key; the
      // partner keeps slot kc + m's key, in its slot kc, and sends slot kc's. Afterwards slot kc (a
      // multiple of TPR) holds the whole score of key kc + part, summed as (p0 + p1) + (p2 + p3) over
      // the slices of parts 0..3 (fp32 addition commutes, so that pairing fixes every bit).
#pragma unroll
      for (int m = 1; m < TPR; m *= 2) {
        const bool up = (part & m) != 0;
#pragma unroll
        for (int kc = 0; kc < KC; kc += 2 * m) {
          const float keep = up ? s[kc + m] : s[kc];
          const float give = up ? s[kc] : s[kc + m];
          s[kc] = keep + __shfl_xor_sync(0xffffffffu, give, m);
        }
      }
      if (need_mask) {
        // slot kc holds key kc + part: visible iff kc <= lim
        const int lim = (CAUSAL ? min(Sk - 1, row) : Sk - 1) - kv0 - kr0 - part;
#pragma unroll
        for (int kc = 0; kc < KC; kc += TPR)
          if (kc > lim) s[kc] = -INFINITY;
      }

      // ---- online softmax (log2 domain, scale folded in): each score's exp2 once ----
      // The row max over the thread's KC/TPR scores, then over the row's threads (exact: every thread
      // of the row gets the same m, alpha and base2).
      float mx = m_run;
#pragma unroll
      for (int kc = 0; kc < KC; kc += TPR) mx = fmaxf(mx, s[kc]);
#pragma unroll
      for (int m = 1; m < TPR; m *= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, m));
      const float base2 = mx == -INFINITY ? 0.f : mx * scale_log2;  // a row with nothing visible yet: p = 0
      const float alpha = ex2(m_run * scale_log2 - base2);
      m_run = mx;
      l_run *= alpha;  // this thread's share of the row sum (its own keys'); summed over the row at the end
#pragma unroll
      for (int d = 0; d < DS; ++d) acc[d] *= alpha;
#pragma unroll
      for (int kc = 0; kc < KC; kc += TPR) {
        s[kc] = ex2(fmaf(s[kc], scale_log2, -base2));
        l_run += s[kc];
      }
      // Every thread of the row needs all KC weights for its slice of PV: weight kc from the row's
      // thread kc % TPR (slot kc - kc % TPR), one indexed shuffle each.
      float p[KC];
#pragma unroll
      for (int kc = 0; kc < KC; ++kc) p[kc] = __shfl_sync(0xffffffffu, s[kc - kc % TPR], lane0 + kc % TPR);

      // ---- O += P V over this thread's slice ----
#pragma unroll
      for (int kc = 0; kc < KC; ++kc) {
        if constexpr (FAULT == kPredicatedOff) {
          // PLANTED FAULT (kPredicatedOff): every thread walks every chunk of the V row and acts only
          // on the chunks it owns.
#pragma unroll
          for (int c = 0; c < D / 4; ++c) {
            if (c % TPR == part) {
              const float4 vf = tile_f4<C, FAULT>(Vt, kr0 + kc, c, base, ld);
              const int i = c / TPR;
              acc[4 * i + 0] = fmaf(p[kc], vf.x, acc[4 * i + 0]);
              acc[4 * i + 1] = fmaf(p[kc], vf.y, acc[4 * i + 1]);
              acc[4 * i + 2] = fmaf(p[kc], vf.z, acc[4 * i + 2]);
              acc[4 * i + 3] = fmaf(p[kc], vf.w, acc[4 * i + 3]);
            }
          }
        } else {
#pragma unroll
          for (int i = 0; i < CH; ++i) {
            const float4 vf = tile_f4<C, FAULT>(Vt, kr0 + kc, part + TPR * i, base, ld);
            acc[4 * i + 0] = fmaf(p[kc], vf.x, acc[4 * i + 0]);
            acc[4 * i + 1] = fmaf(p[kc], vf.y, acc[4 * i + 1]);
            acc[4 * i + 2] = fmaf(p[kc], vf.z, acc[4 * i + 2]);
            acc[4 * i + 3] = fmaf(p[kc], vf.w, acc[4 * i + 3]);
          }
        }
      }
    }
    __syncthreads();  // every thread is done with stage j & 1 before iteration j+1 refills it
  }
  cp_async_wait<0>();
  // the row's sum of weights: each of its threads summed those of its own keys
#pragma unroll
  for (int m = 1; m < TPR; m *= 2) l_run += __shfl_xor_sync(0xffffffffu, l_run, m);

  // ---- normalise and store O and lse ----
  if (row < Sq) {
    const float inv = l_run > 0.f ? 1.f / l_run : 0.f;
    float* og = o + (static_cast<size_t>(bh) * Sq + row) * D;
#pragma unroll
    for (int i = 0; i < CH; ++i)
      *reinterpret_cast<float4*>(og + 4 * (part + TPR * i)) =
          make_float4(acc[4 * i] * inv, acc[4 * i + 1] * inv, acc[4 * i + 2] * inv, acc[4 * i + 3] * inv);
    if (part == 0) lse[static_cast<size_t>(bh) * Sq + row] = l_run > 0.f ? m_run * scale + log2f(l_run) * kLn2 : -INFINITY;
  }
}

}  // namespace faprof_planted_rt

// ------------------------------------------------------------------------------------------------
// Host side
// ------------------------------------------------------------------------------------------------
namespace faprof_planted_rt {

template <class C, bool CAUSAL, int FAULT>
cudaError_t launch(const float* q, const float* k, const float* v, float* o, float* lse, int B, int H, int Sq,
                   int Sk, float scale, cudaStream_t stream) {
  auto kernel = planted_rt_fwd_kernel<C, CAUSAL, FAULT>;
  // One block (8 warps) per SM for the control and every defect, whatever registers ptxas gave each:
  // more than half an SM's shared memory per block (the tiles alone take that on sm_80 and sm_89).
  int dev = 0, per_sm = 0, per_block = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&per_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  if (err != cudaSuccess) return err;
  const int smem = C::SMEM_BYTES > per_sm / 2 ? C::SMEM_BYTES : (per_sm / 2 + 1024 < per_block ? per_sm / 2 + 1024 : per_block);
  if (smem > per_block) return cudaErrorInvalidValue;
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return err;
  const dim3 grid((Sq + C::BR - 1) / C::BR, H, B);
  kernel<<<grid, C::THREADS, smem, stream>>>(q, k, v, o, lse, Sq, Sk, scale, scale * kLog2e, C::D);
  return cudaGetLastError();
}

template <class C, int FAULT>
cudaError_t dispatch(const float* q, const float* k, const float* v, float* o, float* lse, int B, int H, int Sq,
                     int Sk, float scale, bool causal, cudaStream_t stream) {
  return causal ? launch<C, true, FAULT>(q, k, v, o, lse, B, H, Sq, Sk, scale, stream)
                : launch<C, false, FAULT>(q, k, v, o, lse, B, H, Sq, Sk, scale, stream);
}

template <class C>
cudaError_t dispatch_fault(const float* q, const float* k, const float* v, float* o, float* lse, int B, int H,
                           int Sq, int Sk, float scale, bool causal, int fault, cudaStream_t stream) {
  switch (fault) {
    case kClean: return dispatch<C, kClean>(q, k, v, o, lse, B, H, Sq, Sk, scale, causal, stream);
    case kDependency: return dispatch<C, kDependency>(q, k, v, o, lse, B, H, Sq, Sk, scale, causal, stream);
    case kIndexMath: return dispatch<C, kIndexMath>(q, k, v, o, lse, B, H, Sq, Sk, scale, causal, stream);
    case kDivergence: return dispatch<C, kDivergence>(q, k, v, o, lse, B, H, Sq, Sk, scale, causal, stream);
    case kPredicatedOff: return dispatch<C, kPredicatedOff>(q, k, v, o, lse, B, H, Sq, Sk, scale, causal, stream);
    case kScalarLoads: return dispatch<C, kScalarLoads>(q, k, v, o, lse, B, H, Sq, Sk, scale, causal, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace faprof_planted_rt

cudaError_t faprof_planted_rowthread_fwd(const void* q, const void* k, const void* v, void* o, float* lse, int B,
                                         int H, int Sq, int Sk, int D, float scale, bool causal, int fault,
                                         cudaStream_t stream) {
  using namespace faprof_planted_rt;
  if (B <= 0 || H <= 0 || Sq <= 0 || Sk <= 0 || B > 65535 || H > 65535) return cudaErrorInvalidValue;
  if (!(scale > 0.f) || scale == INFINITY || lse == nullptr) return cudaErrorInvalidValue;
  const uintptr_t bits = reinterpret_cast<uintptr_t>(q) | reinterpret_cast<uintptr_t>(k) |
                         reinterpret_cast<uintptr_t>(v) | reinterpret_cast<uintptr_t>(o);
  if ((bits & 15u) != 0) return cudaErrorInvalidValue;
  const auto* qf = static_cast<const float*>(q);
  const auto* kf = static_cast<const float*>(k);
  const auto* vf = static_cast<const float*>(v);
  auto* of = static_cast<float*>(o);
  switch (D) {
    case 64: return dispatch_fault<RtConfig<64>>(qf, kf, vf, of, lse, B, H, Sq, Sk, scale, causal, fault, stream);
    case 128: return dispatch_fault<RtConfig<128>>(qf, kf, vf, of, lse, B, H, Sq, Sk, scale, causal, fault, stream);
    default: return cudaErrorInvalidValue;
  }
}
