// planted_ptx.cuh — TEST ONLY: PTX wrappers the planted faults need and faprof's kernels do not
// (kernels/mma_ptx.cuh has fa2_mma's; this file adds none of those, tests/test_planted_build.py checks).
#pragma once

#include <cstdint>

namespace faprof_planted_ptx {

// mma.sync m16n8k8 with TF32 operands (fp32 bit patterns; the low 13 mantissa bits are ignored) and fp32
// accumulators, sm_80+: the TF32 tensor path, half the fp16 path's rate on sm_80..sm_90 (planted_mma.cu's
// kTf32Mma).
__device__ __forceinline__ void mma_1688_tf32(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                              uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// A packed pair of 16-bit floats (fp16, or bf16 with BF16) as two fp32 bit patterns (lo, hi): exact TF32
// values (fp16's 10 and bf16's 7 mantissa bits fit TF32's 10). Volatile: converted where written, never
// hoisted out of a loop or kept for later uses (the register budget of planted_mma.cu's kTf32Mma).
template <bool BF16>
__device__ __forceinline__ void widen2(uint32_t x, uint32_t& lo, uint32_t& hi) {
  if constexpr (BF16) {
    asm volatile("{\n shl.b32 %0, %2, 16;\n and.b32 %1, %2, 0xffff0000;\n}\n" : "=r"(lo), "=r"(hi) : "r"(x));
  } else {
    float l, h;
    asm volatile("{\n .reg .f16 l16, h16;\n mov.b32 {l16, h16}, %2;\n cvt.f32.f16 %0, l16;\n cvt.f32.f16 %1, h16;\n}\n"
                 : "=f"(l), "=f"(h) : "r"(x));
    lo = __float_as_uint(l);
    hi = __float_as_uint(h);
  }
}

}  // namespace faprof_planted_ptx
