#!/usr/bin/env python3
"""Probe: does our reading of Hopper's wgmma match the hardware?  Run on an sm_90 GPU.

Before wgmma goes into the templates (benchmarks/NOTES.md, lever 1), three things have to
be right, and a wrong one gives garbage rather than an error: the shared-memory matrix
descriptor (which of LBO/SBO strides along K and which along M/N, in the no-swizzle
layout), the core-matrix layout the gathers would write, and where each accumulator
register lands in D.  This kernel runs one m64n64k16 wgmma (one warpgroup, fp16 in, fp32
out) under each candidate reading and compares D with NumPy; exactly one reading should
match.  Without a GPU it still compiles the kernel (NVRTC, sm_90a) and checks the SASS
for HGMMA:

    python3 benchmarks/probes/wgmma_probe.py            # on the H200: prints each reading's error
    python3 benchmarks/probes/wgmma_probe.py --compile  # anywhere: compile + SASS check only
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

M, N, K = 64, 64, 16
REGS = M * N // 128  # fp32 accumulators per thread of the warpgroup

# The no-swizzle layout stores 8 x 8 core matrices (8 rows of 16 bytes) contiguously.
# `order` says how core matrices follow each other: "mk" = [M/8][K/8] (neighbours along K
# are 128 bytes apart), "km" = [K/8][M/8] (neighbours along M are 128 bytes apart).
LAYOUTS = {"mk": lambda rows: (128, (K // 8) * 128), "km": lambda rows: ((rows // 8) * 128, 128)}


def source() -> str:
    d_regs = ", ".join(f"%{i}" for i in range(REGS))
    d_ops = ", ".join(f'"+f"(d[{i}])' for i in range(REGS))
    return r"""
#include <cuda_fp16.h>
constexpr int SPAN = 64 * 16 + 4096;  // halves
// Core matrix (r / 8, k / 8) of a rows x 16 K-major tile, element (r % 8, k % 8) inside it.
__device__ __forceinline__ int core_offset(int r, int k, int rows, int order_mk) {
  const int core = order_mk ? (r / 8) * 2 + k / 8 : (k / 8) * (rows / 8) + r / 8;
  return core * 64 + (r % 8) * 8 + k % 8;
}
__device__ __forceinline__ unsigned long long desc(const void* smem, int lbo, int sbo) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  return (static_cast<unsigned long long>((addr >> 4) & 0x3FFF)) |
         (static_cast<unsigned long long>((lbo >> 4) & 0x3FFF) << 16) |
         (static_cast<unsigned long long>((sbo >> 4) & 0x3FFF) << 32);  // base offset 0, no swizzle (bits 62-63 = 0)
}
extern "C" __global__ void __launch_bounds__(128) probe(const __half* A, const __half* Bt, float* D,
                                                          int order_mk, int lbo_a, int sbo_a, int lbo_b, int sbo_b) {
  // 8 KB more than the data, zeroed: the readings with the wrong stride reach past the tile
  // (SBO = 1024 bytes along M) and must read zeros, not fault and take the context with them.
  __shared__ alignas(128) __half sA[SPAN];
  __shared__ alignas(128) __half sB[SPAN];
  const int t = threadIdx.x;
  for (int i = t; i < SPAN; i += 128) sA[i] = sB[i] = __float2half(0.0f);
  __syncthreads();
  for (int i = t; i < 64 * 16; i += 128) {
    sA[core_offset(i / 16, i % 16, 64, order_mk)] = A[i];   // A is M x K, row-major (K-major)
    sB[core_offset(i / 16, i % 16, 64, order_mk)] = Bt[i];  // B^T is N x K, row-major (B K-major)
  }
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // generic-proxy writes, async-proxy reads
  __syncthreads();
  float d[""" + str(REGS) + r"""];
  for (int i = 0; i < """ + str(REGS) + r"""; ++i) d[i] = 0.0f;
  const unsigned long long da = desc(sA, lbo_a, sbo_a), db = desc(sB, lbo_b, sbo_b);
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %""" + str(REGS + 2) + r""", 0;\n"
               "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {""" + d_regs + r"""}, %""" + str(REGS) + r""", %""" + str(REGS + 1) + r""", p, 1, 1, 0, 0;\n}\n"
               : """ + d_ops + r"""
               : "l"(da), "l"(db), "r"(1));
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
  // Accumulator j*4 + {0,1,2,3} of lane l in warp w: rows 16w + l/4 (+8), columns 8j + 2(l%4) (+1).
  const int w = t / 32, l = t % 32;
  for (int j = 0; j < 64 / 8; ++j) {
    const int row = 16 * w + l / 4, col = 8 * j + 2 * (l % 4);
    D[row * 64 + col] = d[j * 4 + 0];
    D[row * 64 + col + 1] = d[j * 4 + 1];
    D[(row + 8) * 64 + col] = d[j * 4 + 2];
    D[(row + 8) * 64 + col + 1] = d[j * 4 + 3];
  }
}
"""


def compile_only() -> int:
    from convgen.compile import cached_binary
    from convgen.sass import find_cuobjdump, read_cubin

    cubin = cached_binary(source(), arch="sm_90a")
    tool = find_cuobjdump()
    if tool is None:
        print("compiled for sm_90a; no cuobjdump to read the SASS (install the dev extra)")
        return 0
    k = read_cubin(cubin, tool)["probe"]
    print(f"sm_90a cubin: {k.registers} registers, {k.stack} B stack, HGMMA x{k.count('HGMMA')}")
    return 0 if k.count("HGMMA") > 0 else 1


def run() -> int:
    import cupy as cp

    from convgen.compile import load_kernels

    fn = load_kernels(source(), ["probe"], arch="sm_90a")["probe"]
    rng = np.random.default_rng(0)
    a = rng.integers(-2, 3, (M, K)).astype(np.float16)  # small integers: exact in fp32
    bt = rng.integers(-2, 3, (N, K)).astype(np.float16)
    want = a.astype(np.float64) @ bt.astype(np.float64).T
    ok = []
    for order in ("mk", "km"):
        lbo, sbo = LAYOUTS[order](64)
        for swap in (False, True):
            la, sa = (sbo, lbo) if swap else (lbo, sbo)
            d = cp.full((M, N), cp.nan, dtype=cp.float32)
            fn((1, 1, 1), (128, 1, 1), (cp.asarray(a), cp.asarray(bt), d, np.int32(order == "mk"),
                                        np.int32(la), np.int32(sa), np.int32(la), np.int32(sa)))
            got = cp.asnumpy(d).astype(np.float64)
            err = np.nanmax(np.abs(got - want)) if np.isfinite(got).all() else float("inf")
            print(f"core matrices {order}, LBO {la:5d} B, SBO {sa:5d} B: max |D - A B| = {err}")
            ok.append(err == 0.0)
    print("readings that match:", sum(ok))
    return 0 if sum(ok) >= 1 else 1


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--compile", action="store_true", help="compile and check the SASS only (no GPU needed)")
    sys.exit(compile_only() if ap.parse_args().compile else run())
