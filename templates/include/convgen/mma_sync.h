// convgen's fixed warp-level MMA helpers (sm_80+): ldmatrix and mma.sync m16n8k16 with fp32
// accumulators, on the kernel's 16-bit element (CONVGEN_BF16: bfloat16, else float16).  Each is
// one PTX instruction ("ldmatrix", "mma.sync"; PTX ISA 7.x) with the fragment layout PTX gives it,
// so a kernel reads as its algorithm.  Nothing here depends on a kernel's shape.
//
// Include after convgen/device.h.  With CONVGEN_HOST defined, only the accumulator type is
// declared: tests/host_kernel.py supplies warp-level host versions of the three instructions
// to run kernels on the host.
#pragma once

namespace {

// One 16x16 block of a warp's accumulators: x[e] is row lane/4 + 8*(e%4/2), column
// 8*(e/4) + 2*(lane%4) + e%2 of the block (PTX's D fragment of m16n8k16, and of each warp's
// 16 rows of m64nNk16: two n8 chunks).
struct Acc { float x[8]; };

#ifndef CONVGEN_HOST
// Four 8x8 16-bit matrices from shared memory, each lane giving one row's address.
__device__ __forceinline__ void ldsm_x4(unsigned (&r)[4], const half_t* row) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}
// Two 8x8 matrices, lanes 0-15 giving the rows' addresses (the others' are not read).
__device__ __forceinline__ void ldsm_x2(unsigned (&r)[2], const half_t* row) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(a));
}
__device__ __forceinline__ void ldsm_x4_trans(unsigned (&r)[4], const half_t* row) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}
// n8 chunk C (0 or 1) of d += a (16x16) * b (16x8): d.x[4C .. 4C+3].
template <int C>
__device__ __forceinline__ void mma_16816(Acc& d, const unsigned (&a)[4], unsigned b0, unsigned b1) {
#if CONVGEN_BF16
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
#else
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
#endif
               : "+f"(d.x[4 * C]), "+f"(d.x[4 * C + 1]), "+f"(d.x[4 * C + 2]), "+f"(d.x[4 * C + 3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
#endif  // CONVGEN_HOST

}  // namespace
