#!/usr/bin/env python3
"""Probe: the data path of a halo-reusing TMA loop, end to end, on one warpgroup.  Run on an
sm_90 GPU.

benchmarks/NOTES.md (thirtieth session) describes the loop: a tile of TH output rows x TW
columns on a grid of pitch P = TW + 2 (3x3, padding 1, stride 1, C = 64), its input halo
copied once as one tiled TMA box of x (64 channels, P columns, TH + 2 rows, one image, from
(0, q0 - 1, p0 - 1, n): zeros outside the image), and every tap multiplied in place: position
m = th * P + tw reads tap (r, s) from halo row m + r * P + s.  This probe runs exactly that for
a 64-position tile (P = 32, TH = 2) and 64 filters: the weights as nine 64 x 64 boxes of w as
[K][R*S*C], the halo box, one mbarrier, then 9 taps x 4 k16 steps of wgmma m64n64k16 with the
A descriptor started r * P + s rows into the halo, under each reading of the descriptor's
matrix base offset (0, or (start >> 7) & 7).  It compares every valid position with NumPy's
convolution, for the tiles at the image's top and bottom (both paddings).  If one reading
gives exact results, the loop can be built as NOTES says; if neither does, the halo copy is
not what the descriptors read and the kernel must be designed otherwise.

    python3 benchmarks/probes/tma_halo_probe.py            # on the H200
    python3 benchmarks/probes/tma_halo_probe.py --compile  # anywhere: compile + SASS check
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.dirname(__file__))
from wgmma_common import STORE_D, compile_only, halo_taps  # noqa: E402

P, TH, C, K, R, S = 32, 2, 64, 64, 3, 3  # pitch, tile rows, channels, filters, filter
H, W = 4, P - 2  # two tiles of rows, one of columns (TW = W = 30)
HALO_ROWS = (TH + R - 1) * P  # the box's pixels: 128 rows of 128 bytes
SLACK = 8  # rows past the box a tile's last positions (never stored) may read


def source() -> str:
    return r"""
#include <cuda_fp16.h>
#include "convgen/hopper.h"

constexpr int P = """ + str(P) + r""", TH = """ + str(TH) + r""", R = 3, S = 3, HALO_ROWS = """ + str(HALO_ROWS) + r""";
constexpr int W_BYTES = 64 * 128, HALO_BYTES = HALO_ROWS * 128;



__device__ __forceinline__ unsigned long long desc_at(const unsigned char* p, int mode) {
  const unsigned addr = smem_u32(p);
  const unsigned base_offset = mode ? (addr >> 7) & 7 : 0;
  return static_cast<unsigned long long>((addr >> 4) & 0x3FFF) | (1ull << 16) |
         (static_cast<unsigned long long>(1024 >> 4) << 32) | (static_cast<unsigned long long>(base_offset) << 49) |
         (1ull << 62);
}

// One 64-position tile (blockIdx.x: its first output row p0 = TH * blockIdx.x) of 64 filters.
extern "C" __global__ void __launch_bounds__(128) probe(const __grid_constant__ TmaMap x_map,
                                                        const __grid_constant__ TmaMap w_map, float* out, int mode) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* smem = smem_raw + (1024 - smem_u32(smem_raw) % 1024) % 1024;  // the swizzle's 1024-byte pattern
  unsigned long long* bar = reinterpret_cast<unsigned long long*>(smem);
  unsigned char* weights = smem + 1024;                 // 9 taps x 64 filters x 128 bytes
  unsigned char* halo = weights + R * S * W_BYTES;      // 1024-aligned: the swizzle's pattern
  const int p0 = TH * static_cast<int>(blockIdx.x);
  if (threadIdx.x == 0) {
    mbar_init(bar, 1);
    mbar_init_fence();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    mbar_expect_bytes(bar, R * S * W_BYTES + HALO_BYTES);
    for (int tap = 0; tap < R * S; ++tap) tma_load_2d(weights + tap * W_BYTES, &w_map, bar, tap * 64, 0);
    tma_load_4d(halo, &x_map, bar, 0, -1, p0 - 1, 0);  // zeros above, below and beside the image
  }
  mbar_wait(bar, 0);
""" + halo_taps("desc_at(a + kk * 32, mode)", "W_BYTES") + r"""  wgmma_commit();
  wgmma_wait<0>();
  float* D = out + blockIdx.x * 64 * 64;
""" + STORE_D + r"""}
"""


SMEM = 1024 + 1024 + R * S * 64 * 128 + (HALO_ROWS + SLACK) * 128  # the alignment's slack, the barrier's kilobyte


def reference(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """y[p, q, k] of a 3x3, padding 1, stride 1 convolution of x (H, W, C) by w (K, R, S, C)."""
    xp = np.zeros((H + 2, W + 2, C))
    xp[1:-1, 1:-1] = x
    y = np.zeros((H, W, K))
    for r in range(R):
        for s in range(S):
            y += xp[r:r + H, s:s + W] @ w[:, r, s, :].T
    return y


def run() -> int:
    import cupy as cp

    from convgen.compile import load_kernels, set_max_dynamic_shared_memory
    from convgen.tma import _tiled

    fn = load_kernels(source(), ["probe"], arch="sm_90a")["probe"]
    set_max_dynamic_shared_memory(fn, SMEM)
    rng = np.random.default_rng(0)
    x = rng.integers(-2, 3, (H, W, C)).astype(np.float16)  # small integers: exact in fp32
    w = rng.integers(-2, 3, (K, R, S, C)).astype(np.float16)
    want = reference(x.astype(np.float64), w.astype(np.float64))
    xd, wd = cp.asarray(x), cp.asarray(w)
    x_map = _tiled(xd.data.ptr, (C, W, H, 1), (64, P, TH + R - 1, 1), "x")  # a box: the halo of one tile
    w_map = _tiled(wd.data.ptr, (R * S * C, K), (64, 64), "w")  # w as [K][R*S*C]: one tap's 64 x 64 a box
    tiles = H // TH
    ok = {}
    for mode in (0, 1):
        d = cp.full((tiles, 64, 64), cp.nan, dtype=cp.float32)
        fn((tiles, 1, 1), (128, 1, 1), (x_map, w_map, d, np.int32(mode)), shared_mem=SMEM)
        got = cp.asnumpy(d).astype(np.float64)
        bad = 0
        for tile in range(tiles):
            for m in range(64):
                th, tw = divmod(m, P)
                if tw < W:
                    bad += int(not np.array_equal(got[tile, m], want[TH * tile + th, tw]))
        ok[mode] = bad == 0
        print(f"base offset {'(start >> 7) & 7' if mode else '0'}: {bad} of {tiles * TH * W} positions differ")
    print("the halo-reusing loop's data path " + ("holds with base offset " + ("0" if ok[0] else "(start >> 7) & 7")
                                                  if any(ok.values()) else "does not hold under either reading"))
    return 0 if any(ok.values()) else 1


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--compile", action="store_true", help="compile and check the SASS only (no GPU needed)")
    sys.exit(compile_only(source(), ("probe",), ("HGMMA", "UTMALDG"), f"; {SMEM} bytes of shared memory a block")
             if ap.parse_args().compile else run())
