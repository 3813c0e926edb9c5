#!/usr/bin/env python3
"""Probe: does our reading of Hopper's wgmma match the hardware?  Run on an sm_90 GPU.

Before wgmma goes into the templates (benchmarks/NOTES.md, lever 1), three things have to
be right, and a wrong one gives garbage rather than an error: the shared-memory matrix
descriptor (which of LBO/SBO strides along K and which along M/N, in the no-swizzle
layout), the core-matrix layout the gathers would write, and where each accumulator
register lands in D.  The first kernel runs one m64n64k16 wgmma (one warpgroup, fp16 in,
fp32 out) under each candidate reading and compares D with NumPy.  (On the H200: LBO strides
along K, SBO along M/N; benchmarks/NOTES.md.)  The second does the same with B stored
MN-major (N contiguous, `imm-trans-b` = 1), which is how dgrad stages its weights; the
readings of LBO/SBO for that layout are the open question.  Without a GPU both still
compile (NVRTC, sm_90a), and the SASS is checked for HGMMA:

    python3 benchmarks/probes/wgmma_probe.py            # on the H200: prints each reading's error
    python3 benchmarks/probes/wgmma_probe.py --compile  # anywhere: compile + SASS check only
"""

from __future__ import annotations

import argparse
import sys

import os

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from wgmma_common import STORE_D, compile_only  # noqa: E402

M, N, K = 64, 64, 16
REGS = M * N // 128  # fp32 accumulators per thread of the warpgroup

# The no-swizzle layout stores 8 x 8 core matrices (8 rows of 16 bytes) contiguously.
# `order` says how core matrices follow each other: "mk" = [M/8][K/8] (neighbours along K
# are 128 bytes apart), "km" = [K/8][M/8] (neighbours along M are 128 bytes apart).
LAYOUTS = {"mk": lambda rows: (128, (K // 8) * 128), "km": lambda rows: ((rows // 8) * 128, 128)}


def _kernel(name: str, b_mn: bool) -> str:
    """One m64n64k16 wgmma.  B K-major: B^T (N x K) stored like A.  B MN-major (imm-trans-b
    = 1): B (K x N) stored in core matrices of 8 k-rows x 8 contiguous n."""
    d_regs = ", ".join(f"%{i}" for i in range(REGS))
    d_ops = ", ".join(f'"+f"(d[{i}])' for i in range(REGS))
    store_b = ("sB[mn_offset(i / 64, i % 64, order_mk)] = Bsrc[i];  // B is K x N, row-major (MN-major)"
               if b_mn else "sB[core_offset(i / 16, i % 16, 64, order_mk)] = Bsrc[i];  // B^T is N x K, row-major (K-major)")
    a_order = "1" if b_mn else "order_mk"  # with an MN-major B, A keeps the K-major layout the first probe found
    return r"""
extern "C" __global__ void __launch_bounds__(128) """ + name + r"""(const __half* A, const __half* Bsrc, float* D,
                                                          int order_mk, int lbo_a, int sbo_a, int lbo_b, int sbo_b) {
  // 8 KB more than the data, zeroed: the readings with the wrong stride reach past the tile
  // (SBO = 1024 bytes along M) and must read zeros, not fault and take the context with them.
  __shared__ alignas(128) __half sA[SPAN];
  __shared__ alignas(128) __half sB[SPAN];
  const int t = threadIdx.x;
  for (int i = t; i < SPAN; i += 128) sA[i] = sB[i] = __float2half(0.0f);
  __syncthreads();
  for (int i = t; i < 64 * 16; i += 128) {
    sA[core_offset(i / 16, i % 16, 64, """ + a_order + r""")] = A[i];   // A is M x K, row-major (K-major)
    """ + store_b + r"""
  }
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // generic-proxy writes, async-proxy reads
  __syncthreads();
  float d[""" + str(REGS) + r"""];
  for (int i = 0; i < """ + str(REGS) + r"""; ++i) d[i] = 0.0f;
  const unsigned long long da = desc(sA, lbo_a, sbo_a), db = desc(sB, lbo_b, sbo_b);
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %""" + str(REGS + 2) + r""", 0;\n"
               "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {""" + d_regs + r"""}, %""" + str(REGS) + r""", %""" + str(REGS + 1) + r""", p, 1, 1, 0, """ + ("1" if b_mn else "0") + r""";\n}\n"
               : """ + d_ops + r"""
               : "l"(da), "l"(db), "r"(1));
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
""" + STORE_D + r"""}
"""


def source() -> str:
    return r"""
#include <cuda_fp16.h>
constexpr int SPAN = 64 * 16 + 4096;  // halves
// Core matrix (r / 8, k / 8) of a rows x 16 K-major tile, element (r % 8, k % 8) inside it.
__device__ __forceinline__ int core_offset(int r, int k, int rows, int order_mk) {
  const int core = order_mk ? (r / 8) * 2 + k / 8 : (k / 8) * (rows / 8) + r / 8;
  return core * 64 + (r % 8) * 8 + k % 8;
}
// Core matrix (k / 8, n / 8) of a 16 x 64 MN-major B, element (k % 8, n % 8) inside it: 8 rows of
// k, each 8 contiguous n.  order_mk = 1: [N/8][K/8] (neighbours along K 128 bytes apart);
// 0: [K/8][N/8] (neighbours along N 128 bytes apart).
__device__ __forceinline__ int mn_offset(int k, int n, int order_mk) {
  const int core = order_mk ? (n / 8) * 2 + k / 8 : (k / 8) * 8 + n / 8;
  return core * 64 + (k % 8) * 8 + n % 8;
}
__device__ __forceinline__ unsigned long long desc(const void* smem, int lbo, int sbo) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  return (static_cast<unsigned long long>((addr >> 4) & 0x3FFF)) |
         (static_cast<unsigned long long>((lbo >> 4) & 0x3FFF) << 16) |
         (static_cast<unsigned long long>((sbo >> 4) & 0x3FFF) << 32);  // base offset 0, no swizzle (bits 62-63 = 0)
}
""" + _kernel("probe", False) + _kernel("probe_mn", True)


def run() -> int:
    import cupy as cp

    from convgen.compile import load_kernels

    fns = load_kernels(source(), ["probe", "probe_mn"], arch="sm_90a")
    rng = np.random.default_rng(0)
    a = rng.integers(-2, 3, (M, K)).astype(np.float16)  # small integers: exact in fp32
    b = rng.integers(-2, 3, (K, N)).astype(np.float16)
    want = a.astype(np.float64) @ b.astype(np.float64)

    def reading(fn, b_src, order, la, sa, lb, sb, what):
        d = cp.full((M, N), cp.nan, dtype=cp.float32)
        fn((1, 1, 1), (128, 1, 1), (cp.asarray(a), cp.asarray(b_src), d, np.int32(order == "mk"),
                                    np.int32(la), np.int32(sa), np.int32(lb), np.int32(sb)))
        got = cp.asnumpy(d).astype(np.float64)
        err = np.nanmax(np.abs(got - want)) if np.isfinite(got).all() else float("inf")
        print(f"{what}: max |D - A B| = {err}")
        return err == 0.0

    ok_k, ok_mn = [], []
    bt = np.ascontiguousarray(b.T)  # N x K: B K-major
    for order in ("mk", "km"):
        lbo, sbo = LAYOUTS[order](64)
        for swap in (False, True):
            la, sa = (sbo, lbo) if swap else (lbo, sbo)
            ok_k.append(reading(fns["probe"], bt, order, la, sa, la, sa,
                                f"B K-major, core matrices {order}, LBO {la:5d} B, SBO {sa:5d} B"))
    # B MN-major (imm-trans-b = 1); A stays K-major as found above ("mk", LBO 128, SBO 256).
    # "mk" here = [N/8][K/8]: neighbours along K 128 bytes apart, along N 256; "km" = [K/8][N/8]:
    # along N 128, along K 1024.
    strides = {"mk": (128, 256), "km": (1024, 128)}  # (along K, along N)
    for order in ("mk", "km"):
        along_k, along_n = strides[order]
        for lb, sb in ((along_k, along_n), (along_n, along_k)):
            ok_mn.append(reading(fns["probe_mn"], b, order, 128, 256, lb, sb,
                                 f"B MN-major, core matrices {order}, LBO {lb:5d} B, SBO {sb:5d} B"))
    print("readings that match: B K-major", sum(ok_k), ", B MN-major", sum(ok_mn))
    return 0 if sum(ok_k) >= 1 and sum(ok_mn) >= 1 else 1


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--compile", action="store_true", help="compile and check the SASS only (no GPU needed)")
    sys.exit(compile_only(source(), ("probe", "probe_mn")) if ap.parse_args().compile else run())
