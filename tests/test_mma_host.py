"""The host's warp collectives (tests/host_kernel.py: ldmatrix and mma.sync m16n8k16 as PTX lays
out their fragments) checked against kernels the GPU suite runs: the 8-pixel-wide halo tiles
(HaloLdsm: ldmatrix + mma.sync), fprop and dgrad, one and two tiles a block and stacked images,
bit for bit the float64 reference on integer data.  Kernels written for those instructions
without a GPU at hand can then be run on the host with some trust."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

import host_kernel
from convgen import reference
from convgen.emit import emit
from convgen.ir import ConvProblem, Epilogue, Pass
from convgen.mainloop import HaloLdsm
from convgen.planner import make_spec
from convgen.spec import Plan

pytestmark = pytest.mark.skipif(host_kernel.GXX is None, reason="no host C++ compiler (g++) to run kernels on the host")

CASES = [  # (problem, pass, plan): tests/test_emit.py's ldsm cases
    (ConvProblem(8, 8, 64, 128, 3, 3, 1, 1, n=2), Pass.FPROP, Plan(64, 32, 16, 4, 1, 3, 8, 8, loop=HaloLdsm(8))),
    (ConvProblem(7, 20, 32, 24, 3, 3, 1, 1, n=2), Pass.DGRAD, Plan(64, 32, 16, 4, 1, 3, 8, 8, loop=HaloLdsm(8))),
    (ConvProblem(8, 8, 32, 16, 3, 3, 1, 1, n=3), Pass.DGRAD, Plan(64, 16, 16, 4, 1, 2, 8, 8, loop=HaloLdsm(8, 2))),
    (ConvProblem(8, 8, 64, 128, 3, 3, 1, 1, n=3), Pass.FPROP, Plan(256, 64, 16, 8, 1, 3, 8, 8, loop=HaloLdsm(8))),
]


@pytest.mark.parametrize("problem, pass_, plan", CASES,
                         ids=[f"{p.value}-{pl.brief().replace(' ', '_')}" for _, p, pl in CASES])
def test_ldmatrix_and_mma_kernels_run_exactly_on_the_host(problem, pass_, plan, tmp_path):
    rng = np.random.default_rng(zlib.crc32(repr((problem, pass_, plan)).encode()))
    w = rng.integers(-3, 4, problem.w_shape).astype(np.float16)
    geo = dict(stride=problem.stride, padding=problem.padding, dilation=problem.dilation)
    if pass_ is Pass.FPROP:
        src = rng.integers(-3, 4, (problem.n, problem.h, problem.w, problem.c)).astype(np.float16)
        bias = rng.integers(-4, 5, problem.k).astype(np.float32)
        want = reference.fprop(src.astype(np.float64), w.astype(np.float64), **geo) + bias
        arrays = dict(x=src, w=w, bias=bias)
    else:
        src = rng.integers(-3, 4, (problem.n, problem.p, problem.q, problem.k)).astype(np.float16)
        want = reference.dgrad(src.astype(np.float64), w.astype(np.float64), (problem.n, problem.h, problem.w, problem.c),
                               **geo)
        arrays = dict(dy=src, w=w)
    ks = emit(make_spec(problem, pass_, epilogue=Epilogue(bias=pass_ is Pass.FPROP, out_dtype="float32"), plan_=plan))
    assert "mma_16816" in ks.source and "ldsm_x4" in ks.source
    got = host_kernel.run(ks, problem.n, arrays, want.shape, np.float32, tmp_path)
    np.testing.assert_array_equal(got, want)
