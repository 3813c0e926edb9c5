#!/usr/bin/env python3
"""Probe: the halo-reusing TMA loop as a whole kernel, checked and timed before it becomes a
main-loop kind (issues 17 and 16).  Run on an sm_90 GPU.

The 64-channel 3x3 layers are where convgen's Hopper loop stays at 334-356 TFLOP/s in fprop
(README): its im2col copy reads each input pixel once per filter tap, nine times a tile.  This
kernel reads it about twice (benchmarks/NOTES.md, thirtieth and thirty-first sessions: the
design, and the H100 run of tma_halo_probe.py that proved its data path):

- a tile is TH output rows x TW columns of one image, laid on a grid of pitch P = TW + 2
  (TH * P = 128 positions: two consumer warpgroups of 64), and its input halo is one tiled TMA
  box of x, (64 channels, P columns, TH + 2 rows, one image) from (0, q0 - 1, p0 - 1, n): the
  copy engine writes zeros outside the image, which is the padding;
- position m reads tap (r, s) from halo row m + r * P + s, so a tap's A operand is the halo
  started that many 128-byte rows in (the wgmma descriptor's base offset stays 0);
- the weights of all nine taps (64 filters, 72 KB) are copied once per block, which is
  persistent over tiles, and the halos stream through a ring of 2-4 buffers from one
  producer thread, handed over by mbarriers;
- the epilogue stores position m to (p0 + m / P, q0 + m % P) where m % P < TW and both are
  inside the output (the other positions multiplied padding or the next row's pixels).

It covers fprop, stride 1, padding 1, C = K = 64, fp16 in and out with fp32 accumulation, NHWC
x and y, KRSC w: the suites' five such layers.  Per layer it checks the kernel against float64
(norm-relative error, poisoned output, fresh random data) and times it beside cuDNN (PyTorch,
channels_last fp16) and convgen's planner's kernel, all in this process with the L2 flushed
before each launch: median of 30 CUDA-event timings.  cuDNN's and convgen's dgrad are timed
beside it: a stride-1 dgrad is the same kernel on dy with the filter flipped and transposed.

    python3 benchmarks/probes/tma_halo_loop_probe.py            # on the GPU
    python3 benchmarks/probes/tma_halo_loop_probe.py --compile  # anywhere: compile + SASS check
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.dirname(__file__))
from wgmma_common import compile_only, halo_taps  # noqa: E402

# (suite/layer, N, H, W): every 64 -> 64 3x3 stride-1 layer of the built-in suites
LAYERS = (("resnet50/l1-3x3", 64, 56, 56), ("resnet18/l1-3x3", 128, 56, 56), ("vgg16/conv1_2", 32, 224, 224),
          ("unet/enc2b", 16, 128, 128), ("cifar-resnet/res3", 256, 8, 8))
PITCHES = (32, 64, 128)  # P: TH = 128 / P output rows a tile
STAGES = (2, 3, 4)  # halos in the ring, each timed where it fits beside the weights
SMEM_LIMIT = 227 * 1024  # a block's dynamic shared memory on sm_90
C = K = 64
R = S = 3
W_BYTES = R * S * K * 128  # the nine taps' weights, 64 filters x 64 channels each


def halo_bytes(p: int) -> int:
    return (128 // p + R - 1) * p * 128


def stage_bytes(p: int) -> int:
    """A halo and 1 KB past it: a tile's last positions (never stored) read two rows beyond the
    box, and the next stage stays on the swizzle's 1024-byte boundary."""
    return halo_bytes(p) + 1024


def smem_bytes(p: int, stages: int) -> int:
    return 1024 + 1024 + W_BYTES + stages * stage_bytes(p)  # alignment slack, barriers, weights, ring


def source(n: int, h: int, w: int, p: int, stages: int) -> str:
    th = 128 // p
    return r"""
#include <cuda_fp16.h>
#include "convgen/hopper.h"

constexpr int N = """ + str(n) + ", H = " + str(h) + ", W = " + str(w) + r""", C = 64, K = 64, R = 3, S = 3;
constexpr int P = """ + str(p) + ", TH = " + str(th) + r""", TW = P - (S - 1);  // a tile: TH rows x TW columns on pitch P
constexpr int STAGES = """ + str(stages) + r""";
constexpr int HALO_BYTES = (TH + R - 1) * P * 128, STAGE_BYTES = HALO_BYTES + 1024, TAP_BYTES = K * 128;
constexpr int TILES_P = (H + TH - 1) / TH, TILES_Q = (W + TW - 1) / TW, TILES = N * TILES_P * TILES_Q;
static_assert(TH * P == 128, "two consumer warpgroups of 64 positions");



struct Tile {
  int n, p0, q0;
};

__device__ __forceinline__ Tile tile_at(int t) {
  const int per_image = TILES_P * TILES_Q, rest = t % per_image;
  return {t / per_image, rest / TILES_Q * TH, rest % TILES_Q * TW};
}

extern "C" __global__ void __launch_bounds__(384, 1) halo_fprop(const __grid_constant__ TmaMap x_map,
                                                               const __grid_constant__ TmaMap w_map,
                                                               __half* __restrict__ y) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* smem = smem_raw + (1024 - smem_u32(smem_raw) % 1024) % 1024;  // the swizzle's 1024-byte pattern
  unsigned long long* full = reinterpret_cast<unsigned long long*>(smem);  // a halo landed
  unsigned long long* empty = full + STAGES;                                // its consumers are done with it
  unsigned long long* weights_in = empty + STAGES;
  unsigned char* weights = smem + 1024;              // 9 taps x 64 filters x 128 bytes
  unsigned char* ring = weights + R * S * TAP_BYTES;  // STAGES halos, each 1024-aligned
  const int group = static_cast<int>(threadIdx.x) / 128;
  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], 8);  // lane 0 of each consumer warp
    }
    mbar_init(weights_in, 1);
    mbar_init_fence();
  }
  __syncthreads();

  if (group == 2) {
    // ---- the producer: the weights once, then one halo box a tile ----
    if (threadIdx.x == 256) {
      tma_prefetch_map(&x_map);
      tma_prefetch_map(&w_map);
      mbar_expect_bytes(weights_in, R * S * TAP_BYTES);
      for (int tap = 0; tap < R * S; ++tap) tma_load_2d(weights + tap * TAP_BYTES, &w_map, weights_in, tap * C, 0);
      int it = 0;
      for (int t = blockIdx.x; t < TILES; t += gridDim.x, ++it) {
        const int s = it % STAGES;
        mbar_wait(&empty[s], ((it / STAGES) & 1) ^ 1);  // the stage's last tile consumed (at once on the first pass)
        const Tile tile = tile_at(t);
        mbar_expect_bytes(&full[s], HALO_BYTES);
        tma_load_4d(ring + s * STAGE_BYTES, &x_map, &full[s], 0, tile.q0 - 1, tile.p0 - 1, tile.n);
      }
    }
    return;
  }

  // ---- the consumers: warpgroup `group` multiplies positions 64 * group .. of each tile ----
  mbar_wait(weights_in, 0);
  const int warp = static_cast<int>(threadIdx.x) % 128 / 32, lane = static_cast<int>(threadIdx.x) % 32;
  int it = 0;
  for (int t = blockIdx.x; t < TILES; t += gridDim.x, ++it) {
    const int s = it % STAGES;
    mbar_wait(&full[s], (it / STAGES) & 1);
    const unsigned char* halo = ring + s * STAGE_BYTES + group * 64 * 128;
""" + halo_taps("sw128_desc(a, kk * 32)", "TAP_BYTES") + r"""    wgmma_commit();
    wgmma_wait<0>();
    if (lane == 0) mbar_arrive(&empty[s]);  // the halo is free for the producer's next box
    // Accumulator j*4 + {0,1,2,3}: rows 16*warp + lane/4 (+8), columns 8j + 2*(lane%4) (+1).
    const Tile tile = tile_at(t);
#pragma unroll
    for (int half_row = 0; half_row < 2; ++half_row) {
      const int m = group * 64 + 16 * warp + lane / 4 + 8 * half_row, th = m / P, tw = m % P;
      const int p = tile.p0 + th, q = tile.q0 + tw;
      if (tw < TW && p < H && q < W) {
        __half* row = y + ((static_cast<long long>(tile.n) * H + p) * W + q) * K + 2 * (lane % 4);
#pragma unroll
        for (int j = 0; j < K / 8; ++j)
          *reinterpret_cast<__half2*>(row + 8 * j) = __floats2half2_rn(d[j * 4 + 2 * half_row], d[j * 4 + 2 * half_row + 1]);
      }
    }
  }
}
"""


def _flush(cp, buf) -> None:
    buf.fill(1)  # 256 MB written: the L2 (50-60 MB) holds nothing of the layer


def _time(cp, fn, flush_buf, reps: int = 30) -> float:
    """Median microseconds of one launch, L2 flushed before each, host cost hidden behind the flush."""
    start, end = cp.cuda.Event(), cp.cuda.Event()
    times = []
    for _ in range(reps + 3):
        _flush(cp, flush_buf)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, end) * 1e3)
    return statistics.median(times[3:])


def run(pitches: tuple[int, ...], stage_counts: tuple[int, ...]) -> int:
    import cupy as cp
    import torch
    import torch.nn.functional as F

    import convgen
    from convgen.compile import load_kernels, set_max_dynamic_shared_memory
    from convgen.tma import _tiled

    torch.backends.cudnn.benchmark = True
    flush_buf = cp.empty(256 << 20, dtype=cp.uint8)
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    print(f"{cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}, {sms} SMs; fprop 3x3 pad 1 stride 1, C = K = 64, "
          "fp16; us = median GPU time of one launch, L2 flushed before each")
    print(f"{'layer':<20} {'variant':<22} {'us':>8} {'TFLOP/s':>8} {'x cuDNN':>8}  check")
    failed = 0
    rng = np.random.default_rng()
    for name, n, h, w in LAYERS:
        flops = 2.0 * n * h * w * K * C * R * S
        x = cp.asarray(rng.standard_normal((n, h, w, C)).astype(np.float16))
        wt = cp.asarray(rng.standard_normal((K, R, S, C)).astype(np.float16))
        xt = torch.as_tensor(x, device="cuda").permute(0, 3, 1, 2)  # NCHW view of NHWC memory: channels_last
        wtt = torch.as_tensor(wt, device="cuda").permute(0, 3, 1, 2)
        want = F.conv2d(xt.double(), wtt.double(), None, 1, 1).permute(0, 2, 3, 1)  # float64 reference, NHWC

        def rel(got) -> float:
            g = torch.as_tensor(got, device="cuda").double()
            return float((g - want).norm() / want.norm()) if bool(torch.isfinite(g).all()) else float("inf")

        t_cudnn = _time(cp, lambda: F.conv2d(xt, wtt, None, 1, 1), flush_buf)
        rows = [("cuDNN (PyTorch)", t_cudnn, rel(F.conv2d(xt, wtt, None, 1, 1).permute(0, 2, 3, 1)))]
        convgen.conv2d(x, wt, padding=1)  # compile and load outside the timing
        y_cg = convgen.conv2d(x, wt, padding=1)
        rows.append(("convgen planner", _time(cp, lambda: convgen.conv2d(x, wt, padding=1), flush_buf), rel(y_cg)))
        # dgrad of a stride-1 layer is this convolution of dy by the filter flipped and transposed
        # (w'[c, r, s, k] = w[k, R-1-r, S-1-s, c]; C = K here): the same kernel and time, on a
        # 73 KB copy of the weights.  cuDNN's and convgen's dgrad, for the comparison.
        dy = x  # (N, H, W, K): the same shape as x when C = K and the padding keeps the size
        t_cudnn_dx = _time(cp, lambda: torch.ops.aten.convolution_backward(
            xt, xt, wtt, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1, [True, False, False]), flush_buf)
        convgen.conv2d_dgrad(dy, wt, (n, h, w, C), padding=1)
        t_cg_dx = _time(cp, lambda: convgen.conv2d_dgrad(dy, wt, (n, h, w, C), padding=1), flush_buf)
        print(f"{name:<20} {'dgrad: cuDNN':<22} {t_cudnn_dx:8.1f} {flops / t_cudnn_dx / 1e6:8.1f}")
        print(f"{name:<20} {'dgrad: convgen planner':<22} {t_cg_dx:8.1f} {flops / t_cg_dx / 1e6:8.1f} "
              f"{t_cudnn_dx / t_cg_dx:7.2f}x  (the halo kernel's fprop time below serves dgrad too)")
        for p, stages in ((p, st) for p in pitches for st in stage_counts if smem_bytes(p, st) <= SMEM_LIMIT):
            smem = smem_bytes(p, stages)
            fn = load_kernels(source(n, h, w, p, stages), ["halo_fprop"], arch="sm_90a")["halo_fprop"]
            set_max_dynamic_shared_memory(fn, smem)
            th = 128 // p
            x_map = _tiled(x.data.ptr, (C, w, h, n), (64, p, th + R - 1, 1), "x")
            w_map = _tiled(wt.data.ptr, (R * S * C, K), (64, 64), "w")  # w as [K][R*S*C]: one tap's 64 x 64 a box
            tiles = n * -(-h // th) * -(-w // (p - 2))
            grid = (min(tiles, sms), 1, 1)
            y = cp.full((n, h, w, K), np.float16(np.nan), dtype=cp.float16)  # poisoned: a position never stored shows
            launch = lambda: fn(grid, (384, 1, 1), (x_map, w_map, y), shared_mem=smem)  # noqa: E731
            launch()
            err = rel(y)
            rows.append((f"halo P={p} TH={th} ring {stages}", _time(cp, launch, flush_buf), err))
        for label, us, err in rows:
            ok = err <= 2e-3
            failed += not ok
            print(f"{name:<20} {label:<22} {us:8.1f} {flops / us / 1e6:8.1f} {t_cudnn / us:7.2f}x  "
                  f"{err:.1e} {'ok' if ok else 'WRONG'}")
    return 1 if failed else 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--compile", action="store_true", help="compile and check the SASS only (no GPU needed)")
    ap.add_argument("--pitch", type=int, nargs="+", default=list(PITCHES), choices=PITCHES)
    ap.add_argument("--stages", type=int, nargs="+", default=list(STAGES), choices=STAGES)
    args = ap.parse_args()
    if args.compile:
        rc = 0
        for p in args.pitch:
            for st in (st for st in args.stages if smem_bytes(p, st) <= SMEM_LIMIT):
                rc |= compile_only(source(64, 56, 56, p, st), ("halo_fprop",), ("HGMMA", "UTMALDG"),
                                   f"; P={p}, ring {st}: {smem_bytes(p, st)} bytes of shared memory a block")
        sys.exit(rc)
    sys.exit(run(tuple(args.pitch), tuple(args.stages)))
