"""Run an emitted depthwise fprop or dgrad kernel on the host: its CUDA source, compiled by g++.

Why: a kernel's index walk, staging, barriers and epilogue are what its GPU test checks, and a
GPU is not always there when a kernel changes.  These kernels use no MMA, no warp shuffle and no
PTX outside convgen/device.h's cp.async and 16-byte stores, so the emitted source compiles as
C++ as it is, against the real device.h built without both (its register staging path, the
one HIP runs) and a few host definitions: _Float16 for __half, thread_local thread and block
indices, a std::barrier for __syncthreads.  A block runs as one std::thread per CUDA thread,
blocks one after another.  What this cannot check: the cp.async path, timing, shared-memory
banks, and the GPU's own compiler; the GPU tests still do.
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
// device.h's split-K and warp helpers, which no depthwise fprop or dgrad kernel calls
template <class T> T __ldcg(const T* p) { return *p; }
inline float __shfl_xor_sync(unsigned, float, int) { std::abort(); }
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
#define CONVGEN_CP_ASYNC 0
#define CONVGEN_PTX_STORE16 0
#include "convgen/device.h"
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
      std::memset(smem.data(), 0xFF, smem.size());  // shared memory starts as garbage, never zeros
      for (unsigned t = 0; t < %(threads)d; ++t)
        threads.emplace_back([&, t] {
          threadIdx = dim3{t, 0, 0};
          blockIdx = dim3{bx, by, 0};
          block_barrier = &bar;
          block_smem = smem.data();
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
            count = out_count if name in ("y", "dx") else arrays[name].size
            buffers.append(f"  {ctype}* {name} = read_file<{ctype}>(argv[{2 + len(files)}], {count});")
            files.append((name, ctype))
            call.append(name)
    out = "y" if "y" in launch.args else "dx"
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
    out_name = "y" if "y" in ks.main.args else "dx"
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

