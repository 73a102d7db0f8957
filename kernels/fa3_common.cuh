// fa3_common.cuh — Hopper (sm_90a) building blocks shared by kernels/fa3_wgmma.cu and the
// test-only tests/kernels/wgmma_test.cu: wgmma.mma_async wrappers, shared-memory matrix descriptors,
// the 128-byte swizzled tile layout they read, and the fences around them.
//
// Shared-memory tile layout ("SW128", K-major for Q and K, the same bytes read MN-major for V):
// a [ROWS, COLS] tile of 16-bit elements (COLS a multiple of 64) is stored as COLS/64 column blocks
// of [ROWS][64]; each row of a block is 128 bytes = 8 chunks of 16 bytes, and chunk c of row r sits
// at chunk position c ^ (r & 7). That is CUTLASS's Swizzle<3,4,3> (address bits 4-6 XOR bits 7-9),
// the pattern the hardware assumes for layout type "128B swizzle" when a block starts 1024-byte
// aligned, so every block base (and the tile base) must be 1024-byte aligned.
//
// Matrix descriptor (PTX ISA, "Matrix Descriptor Format" of wgmma; CUTLASS cute/arch/mma_sm90_desc.hpp):
//   bits  0-13  start address >> 4       bits 16-29  leading-dimension byte offset (LBO) >> 4
//   bits 32-45  stride-dimension byte offset (SBO) >> 4   bits 49-51  base offset (0: blocks 1024-aligned)
//   bits 62-63  layout type: 1 = 128B swizzle.
//   K-major operand (A = Q [m][k], B = K [n][k]): 8 rows x 128 B per swizzle atom; SBO = 1024 (next
//     8 rows), LBO unused for 128B swizzle (set to 1); k16 step s of a block starts 32*s bytes in.
//   MN-major B (V [k][n] with n contiguous, transpose-B bit set): rows are k, 128 B = 64 n each;
//     SBO = 1024 (next 8 k rows), LBO = byte stride between 64-wide n blocks; k16 step s starts
//     16*128*s bytes in.
//
// Accumulator fragment of m64nNk16 (f32): warp w of the warpgroup owns rows 16w..16w+15; register
// i of lane l holds row 16w + l/4 + 8*((i/2)%2), column 8*(i/4) + 2*(l%4) + i%2 — the mma.sync
// m16n8 C layout repeated over N/8 column tiles. The A operand from registers (RS form) is the
// m16n8k16 A fragment of each warp's 16 rows, so two adjacent n8 tiles of an fp16/bf16-packed
// accumulator are one k16 A fragment (FlashAttention-3 relies on the same identity).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "mma_ptx.cuh"

namespace faprof_fa3 {

using faprof_ptx::fast_exp2;
using faprof_ptx::pack2;
using faprof_ptx::smem_u32;

// True where the wgmma/setmaxnreg instructions exist: sm_90a device code only. Elsewhere (host
// code, sm_80/89, plain sm_90) the kernels compile to empty bodies and the launchers refuse.
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FAPROF_SM90A 1
#else
#define FAPROF_SM90A 0
#endif

#if FAPROF_SM90A
// 16-byte global->shared copy that bypasses L1; pred = false zero-fills the destination.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool pred) {
  const int src_bytes = pred ? 16 : 0;
  asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Shared memory written through the generic proxy (st.shared, cp.async) must be fenced before
// the async proxy (wgmma's descriptor reads, TMA) may see it: each writer fences, then a barrier.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// wgmma.fence: orders this warpgroup's earlier register writes (accumulators, A fragments)
// before the following wgmma.mma_async reads them.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// Pins an accumulator register in place for the compiler: without it, reads or writes of a
// register that an in-flight wgmma owns could be moved across the issue or the wait.
template <int N>
__device__ __forceinline__ void fence_regs(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}

// 128B-swizzle descriptor of a shared-memory operand at byte address `addr` (see the header).
__device__ __forceinline__ uint64_t make_desc(uint32_t addr, uint32_t lbo_bytes, uint32_t sbo_bytes) {
  uint64_t d = 0;
  d |= static_cast<uint64_t>((addr & 0x3FFFF) >> 4);
  d |= static_cast<uint64_t>((lbo_bytes >> 4) & 0x3FFF) << 16;
  d |= static_cast<uint64_t>((sbo_bytes >> 4) & 0x3FFF) << 32;
  d |= static_cast<uint64_t>(1) << 62;  // 128B swizzle
  return d;
}

// Byte offset of element (r, c) in an SW128 tile of `rows` rows (c in elements; 16-bit elements).
__device__ __forceinline__ uint32_t sw128_offset(int rows, int r, int c) {
  return static_cast<uint32_t>((c >> 6) * rows * 128 + r * 128 + ((((c >> 3) & 7) ^ (r & 7)) << 4) + (c & 7) * 2);
}

// cp.async rows [r0, r0 + ROWS) of a row-major [S, COLS] matrix into an SW128 tile at `s_base`;
// rows >= S are zero-filled. THREADS threads take consecutive 16-byte chunks (coalesced reads).
template <int ROWS, int COLS, int THREADS, typename T>
__device__ __forceinline__ void load_tile_sw128(uint32_t s_base, const T* __restrict__ g, int r0, int S, int tid) {
  constexpr int CPR = COLS / 8;  // 16-byte chunks per row
  static_assert(COLS % 64 == 0 && (ROWS * CPR) % THREADS == 0, "tile must split evenly into 16-byte chunks");
#pragma unroll
  for (int i = 0; i < ROWS * CPR / THREADS; ++i) {
    const int idx = tid + i * THREADS;
    const int r = idx / CPR;
    const int c = (idx % CPR) * 8;
    const bool in = r0 + r < S;
    cp_async_16(s_base + sw128_offset(ROWS, r, c), g + static_cast<size_t>(in ? r0 + r : 0) * COLS + c, in);
  }
}


// ------------------------------------------------------------------------------------------------
// wgmma.mma_async wrappers: m64nNk16, f32 accumulate, f16 or bf16 inputs. Generated (one per
// shape, input type and operand form) because inline asm needs every accumulator register spelt
// out. Arguments after the registers: scale-d (0: D = A*B, 1: D += A*B), imm-scale-a/b = 1 (no
// negation), imm-trans-a = 0 (A K-major; SS only), imm-trans-b = TRANS_B (1: B is MN-major).
// ------------------------------------------------------------------------------------------------
// D[64x64] (+)= A(smem desc) * B(smem desc), f16; scale_d = 0 overwrites D.
template <int TRANS_B>
__device__ __forceinline__ void wgmma_ss_m64n64_f16(float (&d)[32], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, %35;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TRANS_B));
}

// D[64x64] (+)= A(4 registers/thread, the m16n8k16 A fragment of each warp's 16 rows) * B(smem desc), f16.
template <int TRANS_B>
__device__ __forceinline__ void wgmma_rs_m64n64_f16(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d), "n"(TRANS_B));
}

// D[64x64] (+)= A(smem desc) * B(smem desc), bf16; scale_d = 0 overwrites D.
template <int TRANS_B>
__device__ __forceinline__ void wgmma_ss_m64n64_bf16(float (&d)[32], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, %35;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TRANS_B));
}

// D[64x64] (+)= A(4 registers/thread, the m16n8k16 A fragment of each warp's 16 rows) * B(smem desc), bf16.
template <int TRANS_B>
__device__ __forceinline__ void wgmma_rs_m64n64_bf16(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d), "n"(TRANS_B));
}

// D[64x128] (+)= A(smem desc) * B(smem desc), f16; scale_d = 0 overwrites D.
template <int TRANS_B>
__device__ __forceinline__ void wgmma_ss_m64n128_f16(float (&d)[64], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, %67;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TRANS_B));
}

// D[64x128] (+)= A(4 registers/thread, the m16n8k16 A fragment of each warp's 16 rows) * B(smem desc), f16.
template <int TRANS_B>
__device__ __forceinline__ void wgmma_rs_m64n128_f16(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d), "n"(TRANS_B));
}

// D[64x128] (+)= A(smem desc) * B(smem desc), bf16; scale_d = 0 overwrites D.
template <int TRANS_B>
__device__ __forceinline__ void wgmma_ss_m64n128_bf16(float (&d)[64], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, %67;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TRANS_B));
}

// D[64x128] (+)= A(4 registers/thread, the m16n8k16 A fragment of each warp's 16 rows) * B(smem desc), bf16.
template <int TRANS_B>
__device__ __forceinline__ void wgmma_rs_m64n128_bf16(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d), "n"(TRANS_B));
}

// Dispatch on N (64 or 128) and the input type; d has N/2 registers.
template <int N, bool BF16, int TRANS_B>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  static_assert(N == 64 || N == 128, "wrappers exist for N = 64 and 128");
  if constexpr (N == 64 && !BF16) wgmma_ss_m64n64_f16<TRANS_B>(d, desc_a, desc_b, scale_d);
  if constexpr (N == 64 && BF16) wgmma_ss_m64n64_bf16<TRANS_B>(d, desc_a, desc_b, scale_d);
  if constexpr (N == 128 && !BF16) wgmma_ss_m64n128_f16<TRANS_B>(d, desc_a, desc_b, scale_d);
  if constexpr (N == 128 && BF16) wgmma_ss_m64n128_bf16<TRANS_B>(d, desc_a, desc_b, scale_d);
}
template <int N, bool BF16, int TRANS_B>
__device__ __forceinline__ void wgmma_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b, int scale_d) {
  static_assert(N == 64 || N == 128, "wrappers exist for N = 64 and 128");
  if constexpr (N == 64 && !BF16) wgmma_rs_m64n64_f16<TRANS_B>(d, a, desc_b, scale_d);
  if constexpr (N == 64 && BF16) wgmma_rs_m64n64_bf16<TRANS_B>(d, a, desc_b, scale_d);
  if constexpr (N == 128 && !BF16) wgmma_rs_m64n128_f16<TRANS_B>(d, a, desc_b, scale_d);
  if constexpr (N == 128 && BF16) wgmma_rs_m64n128_bf16<TRANS_B>(d, a, desc_b, scale_d);
}
#endif  // FAPROF_SM90A

// Host side: whether the current device runs sm_90a code (compute capability 9.0 exactly).
inline cudaError_t require_sm90a() {
  int dev = 0, major = 0, minor = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
  if (err != cudaSuccess) return err;
  return (major == 9 && minor == 0) ? cudaSuccess : cudaErrorNotSupported;
}

}  // namespace faprof_fa3
