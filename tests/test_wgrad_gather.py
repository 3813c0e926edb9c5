"""wgrad's im2col gather of x without a GPU: the template's own C++ on the host.

The gather (templates/parts/gathers/wgrad_im2col.j2) steps each thread's rows on from the
k-step's first row instead of dividing every row's pixel index, wrapping past Q and P by
compares or divisions depending on the shape.  Here the rendered gather, with the kernel's
own shape and plan constants and access maps, runs on the host for every thread, access and
k-step of a few layers; each access's address and predicate must be im2col's, computed in
Python from the access's row and column: x[n, p*SH - PH + r*DH, q*SW - PW + s*DW, c] for
GEMM row n*P*Q + p*Q + q and column (r*S + s)*C + c, out of bounds (and past N*P*Q or R*S*C)
not read.  The GPU test at the end runs the same layers' wgrad kernels, bit for bit.
"""

from __future__ import annotations

import math
import re
import shutil
import subprocess
import zlib

import numpy as np
import pytest

from convgen.emit import _context, _environment, emit
from convgen.ir import ConvProblem, Epilogue, Pass, Target
from convgen.planner import make_spec
from convgen.resources import include_dir
from convgen.spec import Plan

CXX = shutil.which("g++") or shutil.which("clang++")

HOST = r"""
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#define __device__
#define __host__
#define __forceinline__ inline
struct uint2 { unsigned x, y; };
struct uint4 { unsigned x, y, z, w; };
struct { unsigned x; } threadIdx;  // the host sets it thread by thread
typedef unsigned short half_t;
%(device_helpers)s
template <typename TIn, int VEC> struct ReadAs { static constexpr int V = VEC; typedef TIn T; };
namespace {
%(constants)s
%(gathers)s
%(begin_step)s
}  // namespace
int main(int argc, char** argv) {
  const long long npq_total = std::atoll(argv[1]);
  const int tile_n = std::atoi(argv[2]), kt_first = std::atoi(argv[3]), kt_last = std::atoi(argv[4]);
  static const half_t x[1] = {0};
  std::printf("stepped %%d\n", static_cast<int>(GatherX::STEPPED));
  for (unsigned t = 0; t < THREADS; ++t) {
    threadIdx.x = t;
    GatherX g(x, tile_n, npq_total);
    for (int kt = kt_first; kt <= kt_last; ++kt) {
      begin_step(g, kt, 0);  // as the Stager does before a step's accesses
      for (int i = 0; i < GatherX::ITERS; ++i) {
        if (!g.slot_valid(i)) continue;
        bool ok;
        const half_t* at = g.address(i, kt, ok);
        std::printf("%%d %%d %%d %%d %%d %%lld\n", kt, GatherX::Map::row(i), GatherX::Map::col(i), GatherX::V,
                    static_cast<int>(ok), ok ? static_cast<long long>(
                        (reinterpret_cast<std::uintptr_t>(at) - reinterpret_cast<std::uintptr_t>(x)) / sizeof(half_t)) : -1LL);
      }
    }
  }
}
"""


def _device_helpers() -> str:
    """device.h's vector types and index math, as the kernels include them."""
    text = (include_dir() / "convgen" / "device.h").read_text()
    start = text.index("// ---- vector types")
    end = text.index("// float to the kernel's 16-bit element")
    return text[start:end]


def _begin_step() -> str:
    """device.h's hook through which the Stager calls a gather's begin(kt), if it has one."""
    text = (include_dir() / "convgen" / "device.h").read_text()
    start = text.index("// A gather may define begin(kt)")
    return text[start:text.index("// ---- Stager:", start)]


def _harness(tmp_path, spec, name: str) -> str:
    src = emit(spec).source
    ctx = _context(spec, spec.target.info)
    constants = src[src.index("// ---- problem"):src.index("// Per-thread access layout")]
    constants = "\n".join(ln for ln in constants.splitlines() if not ln.startswith("static_assert"))
    maps = _environment().get_template("parts/gathers/maps.j2").render(ctx=ctx)
    start = src.index("constexpr int RSC = ")  # the gathers' namespace, as the kernel has it
    gathers = src[start:src.index("}  // namespace", start)]
    assert "struct GatherX" in gathers
    path = tmp_path / f"{name}.cpp"
    path.write_text(HOST % dict(device_helpers=_device_helpers(), constants=constants, gathers=maps + gathers,
                                begin_step=_begin_step()))
    exe = path.with_suffix("")
    subprocess.run([CXX, "-std=c++17", "-O1", "-o", str(exe), str(path)], check=True)
    return str(exe)


def _im2col(problem: ConvProblem, npq: int, rsc: int) -> int | None:
    """x's element offset that GEMM row npq and column rsc read, None where it reads nothing."""
    g = problem
    (sh, sw), (ph, pw), (dh, dw) = g.stride, g.padding, g.dilation
    if npq >= g.n * g.p * g.q or rsc >= g.r * g.s * g.c:
        return None
    n, pq = divmod(npq, g.p * g.q)
    p, q = divmod(pq, g.q)
    rs, c = divmod(rsc, g.c)
    r, s = divmod(rs, g.s)
    ih, iw = p * sh - ph + r * dh, q * sw - pw + s * dw
    if not (0 <= ih < g.h and 0 <= iw < g.w):
        return None
    return ((n * g.h + ih) * g.w + iw) * g.c + c


CASES = [  # (problem, plan or None for the planner's), on sm_80, where every wgrad runs the im2col loop
    (ConvProblem(224, 224, 4, 64, 7, 7, 2, 3, 1, n=1), None),                 # ResNet's stem: Q >= BK, one wrap a step
    (ConvProblem(7, 7, 64, 64, 3, 3, 1, 1, 1, n=3), None),                    # Q < BK: rows wrap several times a step
    (ConvProblem(4, 5, 32, 16, 3, 3, (1, 2), (1, 0), 1, n=5), None),         # P*Q < BK: several images a step
    (ConvProblem(15, 13, 16, 32, 3, 5, (2, 1), (1, 2), (2, 1), n=2), None),  # every H/W pair differs
    (ConvProblem(31, 9, 24, 40, 3, 3, 1, 1, 1, n=3), Plan(64, 64, 32, 2, 2, 3, 8, 8)),  # BK 32, rows 4 apart
]


@pytest.mark.skipif(CXX is None, reason="no host C++ compiler (g++ or clang++) to run the gather's C++ on the CPU")
@pytest.mark.parametrize("problem, plan", CASES,
                         ids=[p.describe().replace(" ", "_") + ("" if plan is None else "-" + plan.brief().replace(" ", "_"))
                              for p, plan in CASES])
def test_every_access_reads_what_im2col_says(tmp_path, problem, plan):
    spec = make_spec(problem, Pass.WGRAD, target=Target("sm_80"), epilogue=Epilogue(bias=False), plan_=plan)
    exe = _harness(tmp_path, spec, "gather")
    g, bk, bn = problem, spec.plan.block_k, spec.plan.block_n
    npq_total = g.n * g.p * g.q
    steps = math.ceil(npq_total / bk)
    checked = stepped = 0
    for tile_n in range(0, g.r * g.s * g.c, bn):
        out = subprocess.run([exe, str(npq_total), str(tile_n), "0", str(steps)], check=True, capture_output=True,
                             text=True).stdout.splitlines()
        stepped = int(out[0].split()[1])
        reads = set()
        for line in out[1:]:
            kt, row, col, v, ok, at = map(int, line.split())
            for e in range(v):  # a vector access: its V columns read the V channels that follow
                want = _im2col(g, kt * bk + row, tile_n + col + e)
                if e == 0:
                    assert bool(ok) == (want is not None), (kt, row, col, want)
                    if ok:
                        assert at == want, f"k-step {kt} row {row} column {col}: read {at}, im2col says {want}"
                elif ok:
                    assert want == at + e
                if ok:
                    reads.add((kt * bk + row, tile_n + col + e))
            checked += 1
        # every in-bounds element of this column tile is read once over the steps
        expected = {(npq, rsc) for npq in range(npq_total) for rsc in range(tile_n, min(tile_n + bn, g.r * g.s * g.c))
                    if _im2col(g, npq, rsc) is not None}
        assert reads == expected
    assert checked > 0
    assert stepped == (re.search(r"TileMap<BK, BN, V>", emit(spec).source) is not None)


GPU_CASES = [  # the same walks on the GPU: a stem of 4 channels on the planner's plan, the rest on im2col plans
    (ConvProblem(128, 128, 4, 64, 7, 7, 2, 3, 1, n=2), None),
    (ConvProblem(7, 7, 64, 64, 3, 3, 1, 1, 1, n=3), Plan(64, 64, 32, 2, 2, 3, 8, 8)),
    (ConvProblem(4, 5, 32, 16, 3, 3, (1, 2), (1, 0), 1, n=5), Plan(64, 64, 32, 2, 2, 3, 8, 8)),
    (ConvProblem(15, 13, 16, 32, 3, 5, (2, 1), (1, 2), (2, 1), n=2), Plan(64, 64, 32, 2, 2, 3, 8, 8)),
    (ConvProblem(31, 9, 24, 40, 3, 3, 1, 1, 1, n=3), Plan(64, 64, 32, 2, 2, 3, 8, 8)),
]


@pytest.mark.gpu
@pytest.mark.usefixtures("poison_outputs")
@pytest.mark.parametrize("bias", [False, True], ids=["dw", "dw+db"])
@pytest.mark.parametrize("problem, plan", GPU_CASES,
                         ids=[p.describe().replace(" ", "_") for p, _ in GPU_CASES])
def test_stepped_gather_wgrad_exact_on_gpu(problem, plan, bias):
    """Integer data, bit for bit against the float64 reference: the stepped rows on the GPU."""
    from gpu_helpers import check, run_pass

    rng = np.random.default_rng(zlib.crc32(f"{problem.describe()} {bias}".encode()))
    res = run_pass(problem, Pass.WGRAD, rng, out_dtype="float32", bias=bias, plan=plan, exact=True)
    check(res, "float32", exact=True, what=f"wgrad {problem.describe()} bias={bias}")
