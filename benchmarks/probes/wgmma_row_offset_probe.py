#!/usr/bin/env python3
"""Probe: can a wgmma read its A tile from any 128-byte row of a 128-byte-swizzled buffer?
Run on an sm_90 GPU.

A halo-reusing TMA loop (benchmarks/NOTES.md, thirtieth session) would stage an input halo
once, as rows of 64 channels (128 bytes, the TMA's 128-byte swizzle), and multiply each
filter tap's rows in place: tap (r, s) of a tile on the padded pixel grid starts r * pitch + s
rows into the halo, which is 8-row (1024-byte) aligned only when that offset is a multiple
of 8.  The descriptor has a 3-bit "matrix base offset" for start addresses off the swizzle's
1024-byte pattern; whether it must be (start >> 7) & 7, or 0 because the swizzle is taken
from the address bits the hardware forms, decides whether the loop can work this way.

The kernel fills a 1024-byte-aligned buffer of ROWS rows x 64 fp16 in the TMA's 128-byte
swizzle (16-byte chunk c of row r at chunk c ^ (r % 8)), B (64 x 16, K-major) alike, and runs
one m64n64k16 wgmma with A starting `row0` rows in, under each base-offset reading, for
row0 = 0..15 and each k16 step of the row.  Compare with NumPy:

    python3 benchmarks/probes/wgmma_row_offset_probe.py            # on the H200: which reading holds
    python3 benchmarks/probes/wgmma_row_offset_probe.py --compile  # anywhere: compile + SASS check
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from wgmma_common import REGS, STORE_D, compile_only, wgmma_m64n64k16  # noqa: E402

M, N, K = 64, 64, 16
ROWS = 96  # the halo buffer's rows: room for 64 rows at any start 0..31


def source() -> str:
    return r"""
#include <cuda_fp16.h>
constexpr int ROWS = """ + str(ROWS) + r""";
// Element (r, k) of a 128-byte-swizzled buffer of 64-fp16 rows: 16-byte chunk k / 8 of row r
// sits at chunk (k / 8) ^ (r % 8), as the TMA writes it with CU_TENSOR_MAP_SWIZZLE_128B.
__device__ __forceinline__ int sw128(int r, int k) { return r * 64 + (((k / 8) ^ (r % 8)) * 8) + k % 8; }

__device__ __forceinline__ unsigned long long desc(const void* p, int base_offset) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(p));
  return static_cast<unsigned long long>((addr >> 4) & 0x3FFF) | (1ull << 16) |
         (static_cast<unsigned long long>(1024 >> 4) << 32) |
         (static_cast<unsigned long long>(base_offset & 7) << 49) | (1ull << 62);
}

// A: the halo, ROWS x 64 (K-major, all 64 columns: k_bytes picks the k16 step); B^T: 64 x 64.
// mode 0: base offset 0; mode 1: (start >> 7) & 7.
extern "C" __global__ void __launch_bounds__(128) probe(const __half* halo, const __half* bt, float* D, int row0,
                                                        int k_bytes, int mode) {
  __shared__ alignas(1024) __half sA[ROWS * 64];
  __shared__ alignas(1024) __half sB[64 * 64];
  const int t = threadIdx.x;
  for (int i = t; i < ROWS * 64; i += 128) sA[sw128(i / 64, i % 64)] = halo[i];
  for (int i = t; i < 64 * 64; i += 128) sB[sw128(i / 64, i % 64)] = bt[i];
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();
  const unsigned char* a = reinterpret_cast<const unsigned char*>(sA) + row0 * 128 + k_bytes;
  const unsigned start = static_cast<unsigned>(__cvta_generic_to_shared(a));
  const unsigned long long da = desc(a, mode ? static_cast<int>(start >> 7) : 0);
  const unsigned long long db = desc(reinterpret_cast<const unsigned char*>(sB) + k_bytes, 0);
  float d[""" + str(REGS) + r"""];
  for (int i = 0; i < """ + str(REGS) + r"""; ++i) d[i] = 0.0f;
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
  """ + wgmma_m64n64k16("da", "db") + r"""
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
""" + STORE_D + r"""}
"""


def run() -> int:
    import cupy as cp

    from convgen.compile import load_kernels

    fn = load_kernels(source(), ["probe"], arch="sm_90a")["probe"]
    rng = np.random.default_rng(0)
    halo = rng.integers(-2, 3, (ROWS, 64)).astype(np.float16)  # small integers: exact in fp32
    bt = rng.integers(-2, 3, (64, 64)).astype(np.float16)  # B^T: N x K
    hd, bd = cp.asarray(halo), cp.asarray(bt)
    holds = {0: [], 1: []}
    for mode in (0, 1):
        for row0 in range(16):
            ok = True
            for step in range(4):  # the row's four k16 steps: 32 bytes each
                want = halo[row0:row0 + M, 16 * step:16 * step + K].astype(np.float64) @ \
                    bt[:, 16 * step:16 * step + K].astype(np.float64).T
                d = cp.full((M, N), cp.nan, dtype=cp.float32)
                fn((1, 1, 1), (128, 1, 1), (hd, bd, d, np.int32(row0), np.int32(32 * step), np.int32(mode)))
                got = cp.asnumpy(d).astype(np.float64)
                ok &= bool(np.isfinite(got).all() and np.array_equal(got, want))
            holds[mode].append(ok)
        print(f"base offset {'(start >> 7) & 7' if mode else '0'}: rows 0..15 "
              + "".join("y" if ok else "." for ok in holds[mode]))
    print("a start off the 8-row pattern works with base offset "
          + ("0" if all(holds[0]) else "(start >> 7) & 7" if all(holds[1]) else "neither reading"))
    return 0 if all(holds[0]) or all(holds[1]) else 1


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--compile", action="store_true", help="compile and check the SASS only (no GPU needed)")
    sys.exit(compile_only(source(), ("probe",)) if ap.parse_args().compile else run())
