"""Run an emitted kernel on the host: its CUDA source, compiled by g++, block by block.

Why: a kernel's index walk, staging, barriers and epilogue are what its GPU test checks, and a
GPU is not always there when a kernel changes.  The emitted source compiles as C++ as it is,
against the real convgen/device.h with CONVGEN_HOST defined, and a few host definitions:
_Float16 for __half, thread_local thread and block indices, a std::barrier for
__syncthreads, cp.async as a copy that lands at once, and the warp's collectives (ldmatrix and
mma.sync m16n8k16, convgen/mma_sync.h) by each warp's lanes meeting at a barrier and taking their
parts as PTX lays out the fragments.  A block runs as one std::thread per CUDA thread.  The
depthwise stencils and the ldmatrix halo kernels run here (tests/test_depthwise_host.py,
tests/test_mma_host.py), wgrad's unsplit (its warp shuffles as the lanes meeting too); kernels with
warpgroup MMAs, TMA or a grid-wide barrier do not.  What this
cannot check: timing, shared-memory banks, races a real schedule would expose, and the GPU's own
compiler; the GPU tests still do.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np

from convgen.emit import KernelSource
from convgen.resources import templates_dir

GXX = shutil.which("g++")

PRELUDE = r"""
#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>
struct uint2 { unsigned x, y; };
struct uint4 { unsigned x, y, z, w; };
struct float4 { float x, y, z, w; };
struct float2 { float x, y; };
inline float2 make_float2(float x, float y) { return float2{x, y}; }
#define __builtin_assume(...) ((void)0)
// device.h's split-K helper, which no unsplit kernel calls
template <class T> T __ldcg(const T* p) { return *p; }
inline float __shfl_xor_sync(unsigned, float v, int lane_mask);  // the warp's exchange, below
struct dim3 { unsigned x = 0, y = 0, z = 0; };
thread_local dim3 threadIdx, blockIdx;
dim3 gridDim, blockDim;
thread_local std::barrier<>* block_barrier;
thread_local unsigned char* block_smem;
inline void __syncthreads() { block_barrier->arrive_and_wait(); }
#define __device__
#define __host__
#define __global__
#define __forceinline__ inline
#define __launch_bounds__(...)
using std::max;
using std::min;
typedef _Float16 __half;
inline float __half2float(__half h) { return static_cast<float>(h); }
inline __half __float2half_rn(float f) { return static_cast<__half>(f); }
typedef __half half_t;
#define CONVGEN_HOST 1
#define CONVGEN_CP_ASYNC 1
#define CONVGEN_PTX_STORE16 0
// cp.async as the host does it: each copy lands at once (a valid schedule of an asynchronous
// copy: the waits then have nothing left to wait for), zero-filled where the predicate is off.
template <int BYTES, bool L2_PREFETCH = false> inline void cp_async(void* smem, const void* gmem, bool pred) {
  if (pred) std::memcpy(smem, gmem, BYTES); else std::memset(smem, 0, BYTES);
}
inline void cp_async_commit() {}
template <int N> inline void cp_async_wait() {}
#include "convgen/device.h"
#include "convgen/mma_sync.h"

// The warp's collectives (ldmatrix, mma.sync): each lane posts its operands, the warp meets,
// each lane takes its part of the result as PTX's fragment layouts give it, the warp meets again.
struct WarpCtx {
  std::barrier<> bar{32};
  const half_t* row[32];
  unsigned a[32][4], b[32][2];
  float v[32];
};
thread_local WarpCtx* my_warp;
inline void __syncwarp() { my_warp->bar.arrive_and_wait(); }

// Each lane posts its value, the warp meets, each takes its partner's (lane ^ lane_mask), the warp meets again.
inline float __shfl_xor_sync(unsigned, float v, int lane_mask) {
  WarpCtx& w = *my_warp;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  w.v[lane] = v;
  w.bar.arrive_and_wait();
  const float r = w.v[lane ^ lane_mask];
  w.bar.arrive_and_wait();
  return r;
}

inline float bits_to_float(unsigned short bits) {
  half_t h;
  std::memcpy(&h, &bits, 2);
  return static_cast<float>(h);
}

// Matrix i's row j is lane 8i + j's address; lane l receives (row l/4, columns 2(l%4), +1) of each.
inline void ldsm_host(unsigned (&r)[4], const half_t* row, bool trans, int matrices = 4) {
  WarpCtx& w = *my_warp;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  w.row[lane] = row;
  w.bar.arrive_and_wait();
  for (int i = 0; i < 4; ++i) {
    r[i] = 0xFFFFFFFFu;  // (NaN pairs: a matrix not loaded)
    if (i >= matrices) continue;
    unsigned short e[2];
    for (int k = 0; k < 2; ++k) {
      const int rr = lane / 4, cc = 2 * (lane % 4) + k;  // the element of matrix i this lane holds
      const half_t* src = trans ? w.row[8 * i + cc] + rr : w.row[8 * i + rr] + cc;
      std::memcpy(&e[k], src, 2);
    }
    r[i] = e[0] | static_cast<unsigned>(e[1]) << 16;
  }
  w.bar.arrive_and_wait();
}
inline void ldsm_x4(unsigned (&r)[4], const half_t* row) { ldsm_host(r, row, false); }
inline void ldsm_x4_trans(unsigned (&r)[4], const half_t* row) { ldsm_host(r, row, true); }
inline void ldsm_x2(unsigned (&r)[2], const half_t* row) {  // matrices 0 and 1 of an x4 whose other rows are never read
  unsigned r4[4];
  ldsm_host(r4, row, false, 2);
  r[0] = r4[0], r[1] = r4[1];
}

// d += a (16x16, row-major) * b (16x8, column-major), fp32 sums: A's register i of lane l holds
// (row l/4 + 8*(i%2), columns 2(l%4) + 8*(i/2), +1); B's register j (rows 2(l%4) + 8j, +1; column l/4).
template <int C> void mma_16816(Acc& d, const unsigned (&a)[4], unsigned b0, unsigned b1) {
  WarpCtx& w = *my_warp;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  for (int i = 0; i < 4; ++i) w.a[lane][i] = a[i];
  w.b[lane][0] = b0;
  w.b[lane][1] = b1;
  w.bar.arrive_and_wait();
  float A[16][16], B[16][8];
  for (int l = 0; l < 32; ++l) {
    for (int i = 0; i < 4; ++i)
      for (int k = 0; k < 2; ++k)
        A[l / 4 + 8 * (i % 2)][2 * (l % 4) + 8 * (i / 2) + k] = bits_to_float(w.a[l][i] >> (16 * k) & 0xFFFF);
    for (int j = 0; j < 2; ++j)
      for (int k = 0; k < 2; ++k) B[2 * (l % 4) + 8 * j + k][l / 4] = bits_to_float(w.b[l][j] >> (16 * k) & 0xFFFF);
  }
  for (int e = 0; e < 4; ++e) {
    const int row = lane / 4 + 8 * (e / 2), col = 2 * (lane % 4) + e % 2;
    float sum = 0;
    for (int k = 0; k < 16; ++k) sum += A[row][k] * B[k][col];
    d.x[4 * C + e] += sum;
  }
  w.bar.arrive_and_wait();
}
"""

MAIN = r"""
template <class T> T* read_file(const char* path, size_t count) {
  T* p = static_cast<T*>(std::aligned_alloc(64, (count * sizeof(T) + 63) / 64 * 64));
  FILE* f = std::fopen(path, "rb");
  if (!f || std::fread(p, sizeof(T), count, f) != count) std::abort();
  std::fclose(f);
  return p;
}

int main(int argc, char** argv) {
  const int batch = std::atoi(argv[1]);
  gridDim = dim3{%(grid_x)d, %(grid_y)d, 1};
  blockDim = dim3{%(threads)d, 1, 1};
%(buffers)s
  std::vector<unsigned char> smem(%(smem)d + 16);
  for (unsigned by = 0; by < gridDim.y; ++by)
    for (unsigned bx = 0; bx < gridDim.x; ++bx) {
      std::barrier<> bar(%(threads)d);
      std::vector<std::thread> threads;
      std::vector<WarpCtx> warps((%(threads)d + 31) / 32);
      std::memset(smem.data(), 0xFF, smem.size());  // shared memory starts as garbage, never zeros
      for (unsigned t = 0; t < %(threads)d; ++t)
        threads.emplace_back([&, t] {
          threadIdx = dim3{t, 0, 0};
          blockIdx = dim3{bx, by, 0};
          block_barrier = &bar;
          block_smem = smem.data();
          my_warp = &warps[t / 32];
          %(kernel)s(%(call)s);
        });
      for (auto& th : threads) th.join();
    }
  FILE* f = std::fopen(argv[argc - 1], "wb");
  std::fwrite(out, sizeof(*out), %(out_count)d, f);
  std::fclose(f);
}
"""

_NP = {"half_t": np.float16, "float": np.float32}
OUTPUTS = ("y", "dx", "dw")  # what fprop, dgrad and wgrad write (wgrad unsplit: no workspace, no grid-wide sum)


def _output(args: tuple[str, ...]) -> str:
    return next(name for name in OUTPUTS if name in args)


def host_source(ks: KernelSource, n: int, arrays: dict[str, np.ndarray],
                out_count: int) -> tuple[str, list[tuple[str, str]]]:
    """The kernel's source with a host prelude and a main that reads ``arrays`` (by argument
    name) from files, launches the grid for batch ``n`` and writes the output; and the
    arrays main reads, in order, as (argument name, C type)."""
    launch = ks.main
    src = ks.source
    body = src[src.index("namespace {"):]
    body = body.replace("extern __shared__ __align__(128) unsigned char smem_raw[];",
                        "unsigned char* const smem_raw = block_smem;")
    params = re.search(re.escape(launch.kernel) + r"\((.*?)\)\s*\{", body, re.S).group(1)
    types = {}
    for p in params.split(","):
        words = p.replace("const", " ").replace("*", " * ").replace("__restrict__", " ").split()
        types[words[-1]] = (words[0], "*" in words)
    buffers, call, files = [], [], []
    for name in launch.args:
        ctype, pointer = types[name]
        if name == "batch":
            call.append("batch")
        elif not pointer:
            call.append(repr(float(arrays[name])) + "f")
        elif name == "workspace":
            call.append("nullptr")
        else:
            count = out_count if name in OUTPUTS else arrays[name].size
            buffers.append(f"  {ctype}* {name} = read_file<{ctype}>(argv[{2 + len(files)}], {count});")
            files.append((name, ctype))
            call.append(name)
    out = _output(launch.args)
    buffers.append(f"  {types[out][0]}* out = {out};")
    grid = launch.grid(n)
    main = MAIN % dict(grid_x=grid[0], grid_y=grid[1], threads=launch.block[0], smem=launch.shared_mem,
                       buffers="\n".join(buffers), kernel=launch.kernel, call=", ".join(call), out_count=out_count)
    return PRELUDE + body + main, files


def run(ks: KernelSource, n: int, arrays: dict[str, np.ndarray], out_shape: tuple[int, ...], out_dtype: type,
        tmp: Path) -> np.ndarray:
    """Compile ``ks`` for the host and run it on ``arrays`` (x or dy, w, and the epilogue's bias,
    residual, alpha and beta by name); the output starts as NaN, so what the kernel does not
    write stays NaN."""
    out_count = int(np.prod(out_shape))
    arrays = dict(arrays)
    out_name = _output(ks.main.args)
    arrays[out_name] = np.full(out_count, np.nan, dtype=out_dtype)
    source, files = host_source(ks, n, arrays, out_count)
    path = tmp / "kernel.cpp"
    path.write_text(source)
    exe = tmp / "kernel"
    subprocess.run([GXX, "-std=c++20", "-O1", "-w", "-pthread", "-I", str(templates_dir() / "include"), "-o", str(exe),
                    str(path)], check=True, capture_output=True, text=True)
    names = []
    for name, ctype in files:
        f = tmp / f"{name}.bin"
        np.ascontiguousarray(arrays[name], dtype=_NP[ctype]).tofile(f)
        names.append(str(f))
    result = tmp / "out.bin"
    subprocess.run([str(exe), str(n), *names, str(result)], check=True, capture_output=True, text=True, timeout=600)
    return np.fromfile(result, dtype=out_dtype).reshape(out_shape)

