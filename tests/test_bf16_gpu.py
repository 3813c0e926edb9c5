"""bfloat16 kernels on the GPU against the float64 reference: every main-loop kind and pass.

Exact tier: integers in [-1, 1] with reductions of at most 256 terms, so every product, every
fp32 partial sum and the bf16 output itself are exact (bf16 holds every integer up to 256),
compared bit for bit; and integers in [-2, 2] with float32 outputs for the longer reductions.
Hypothesis tier: normal values, checked by norm-relative error against bf16's tolerance
(tests/gpu_helpers.tolerance).  Outputs are poisoned (NaN) before every launch.  Run on the
GPU with ``python3 -m pytest -q tests/test_bf16_gpu.py``.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from convgen.ir import ConvProblem, Pass
from convgen.spec import Plan
from convgen.mainloop import FlatHalo, HaloLdsm, HaloTile, Im2col, StagedHalo, TmaWgmma, Wgmma

from gpu_helpers import check, run_pass

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("poison_outputs")]
pytest.importorskip("ml_dtypes", reason="bfloat16 CuPy arrays are ml_dtypes.bfloat16 (pip install ml_dtypes)")

BF = ("bfloat16", "bfloat16")


@pytest.fixture(scope="module")
def arch() -> str:
    from convgen.compile import detect_target

    target = detect_target()
    if not target.info.bf16_mma:
        pytest.skip(f"{target.arch} has no bfloat16 MMA")
    return target.arch


def _seed(*parts) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(repr(parts).encode()))


def _bf(*args, loop=Im2col(), split_k=1) -> Plan:
    return Plan(*args, *BF, split_k=split_k, loop=loop)


SMALL = ConvProblem(6, 7, 8, 24, 3, 3, 1, 1, 1, n=2)  # fprop K 72, dgrad 216, wgrad 84 terms: <= 256
# (name, problem, passes, plan or None (the planner's), needs sm_90)
CASES = [
    ("planner", SMALL, tuple(Pass), None, False),
    ("planner-strided", ConvProblem(9, 8, 8, 16, 3, 3, 2, 1, 1, n=2), tuple(Pass), None, False),
    # the halo rule's 128-row bf16 tiles (small_layer_rules.BF16_HALO_FRAGMENTS): N = 32 in fprop and dgrad
    ("planner-halo", ConvProblem(18, 20, 32, 32, 3, 3, 1, 1, 1, n=2), (Pass.FPROP, Pass.DGRAD), None, False),
    ("im2col", SMALL, tuple(Pass), _bf(64, 32, 32, 2, 2, 3, 8, 8), False),
    ("im2col-split", SMALL, tuple(Pass), _bf(64, 32, 16, 2, 2, 2, 8, 8, split_k=3), False),
    ("im2col-sliced", SMALL, (Pass.FPROP, Pass.DGRAD), _bf(64, 32, 32, 2, 1, 2, 8, 8, loop=Im2col(2)), False),
    ("halo16", ConvProblem(16, 16, 16, 16, 3, 3, 1, 1, 1, n=1), (Pass.FPROP, Pass.DGRAD),
     _bf(64, 16, 16, 4, 1, 2, 8, 8, loop=HaloTile(16)), False),
    ("halo16x2", ConvProblem(16, 16, 16, 16, 3, 3, 1, 1, 1, n=1), (Pass.FPROP,),
     _bf(64, 16, 16, 4, 1, 2, 8, 8, loop=HaloTile(16, 2)), False),
    ("ldsm", ConvProblem(8, 8, 16, 16, 3, 3, 1, 1, 1, n=2), (Pass.FPROP, Pass.DGRAD),
     _bf(64, 16, 16, 4, 1, 2, 8, 8, loop=HaloLdsm(8)), False),
    ("flat", ConvProblem(6, 6, 16, 16, 3, 3, 1, 1, 1, n=2), (Pass.FPROP, Pass.DGRAD),
     _bf(64, 16, 16, 4, 1, 2, 8, 8, loop=FlatHalo()), False),
    ("staged-halo", ConvProblem(16, 16, 3, 16, 3, 3, 1, 1, 1, n=2), (Pass.FPROP,),
     _bf(64, 16, 32, 4, 1, 2, 1, 1, loop=StagedHalo(16)), False),
    ("wgmma", ConvProblem(6, 7, 16, 64, 3, 3, 1, 1, 1, n=2), (Pass.FPROP,),
     _bf(64, 64, 32, 4, 1, 3, 8, 8, loop=Wgmma()), True),
    ("tma", ConvProblem(5, 5, 64, 64, 1, 1, 1, 0, 1, n=2), (Pass.FPROP, Pass.DGRAD),
     _bf(64, 64, 64, 4, 1, 3, 8, 8, loop=TmaWgmma()), True),
    ("tma-persistent", ConvProblem(5, 5, 64, 64, 1, 1, 1, 0, 1, n=2), (Pass.FPROP, Pass.DGRAD),
     _bf(128, 64, 64, 8, 1, 3, 8, 8, loop=TmaWgmma(persistent=True)), True),
    ("tma-pingpong", ConvProblem(5, 5, 64, 64, 1, 1, 1, 0, 1, n=2), (Pass.FPROP, Pass.DGRAD),
     _bf(128, 64, 64, 8, 1, 4, 8, 8, loop=TmaWgmma(persistent=True, pingpong=True)), True),
    ("tma-wgrad", ConvProblem(4, 4, 64, 64, 3, 3, 1, 1, 1, n=1), (Pass.WGRAD,),
     _bf(64, 64, 64, 4, 1, 3, 8, 8, split_k=2, loop=TmaWgmma()), True),
]
IDS = [c[0] for c in CASES]


def _cases(arch: str):
    for name, problem, passes, plan, sm90 in CASES:
        if sm90 and arch != "sm_90":
            continue
        for pass_ in passes:
            yield name, problem, pass_, plan


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_bf16_exact_tier(case, arch):
    """Every product and sum exact: the bf16 output equals the reference bit for bit.  The
    TMA shapes reduce over 64 or 576 channels: those compare float32 outputs of [-2, 2]."""
    name, problem, passes, plan, sm90 = case
    if sm90 and arch != "sm_90":
        pytest.skip(f"{name} runs on sm_90 only; this GPU is {arch}")
    for pass_ in passes:
        short = problem.gemm(pass_).k <= 256
        out, span = ("bfloat16", 1) if short else ("float32", 2)
        res = run_pass(problem, pass_, _seed(name, pass_.value), in_dtype="bfloat16", out_dtype=out, plan=plan,
                       bias=pass_ is not Pass.DGRAD, exact=True, span=span)
        check(res, out, exact=True, what=f"{name} {pass_.value} bf16")


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_bf16_normal_values_within_tolerance(case, arch):
    name, problem, passes, plan, sm90 = case
    if sm90 and arch != "sm_90":
        pytest.skip(f"{name} runs on sm_90 only; this GPU is {arch}")
    for pass_ in passes:
        for out in ("bfloat16", "float32"):
            res = run_pass(problem, pass_, _seed(name, pass_.value, out), in_dtype="bfloat16", out_dtype=out, plan=plan,
                           bias=pass_ is not Pass.DGRAD)
            check(res, out, what=f"{name} {pass_.value} bf16 -> {out}")


@pytest.mark.parametrize("scalar", [False, True])
@pytest.mark.parametrize("pass_", list(Pass))
def test_float32_inputs_rounded_to_bf16(pass_, scalar, arch):
    """float32 inputs with mma_dtype='bfloat16', in the cast pass or the scalar gather: exact on
    small integers, and on normal values within float32 output's tolerance of the reference
    computed on the inputs rounded to bf16 (nearest even).  A kernel that rounded to fp16
    instead would be ~8x closer to the float32 inputs and fail this comparison."""
    problem = ConvProblem(6, 5, 3 if scalar else 8, 16, 3, 3, 1, 1, 1, n=2)
    res = run_pass(problem, pass_, _seed("f32", pass_.value, scalar), in_dtype="float32", out_dtype="float32",
                   mma_dtype="bfloat16", scalar=scalar, exact=True)
    check(res, "float32", exact=True, what=f"fp32->bf16 {pass_.value} scalar={scalar}")
    res = run_pass(problem, pass_, _seed("f32n", pass_.value, scalar), in_dtype="float32", out_dtype="float32",
                   mma_dtype="bfloat16", scalar=scalar)
    check(res, "float32", what=f"fp32->bf16 {pass_.value} scalar={scalar}")


@st.composite
def problems(draw):
    r, s = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    stride = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    h, w = draw(st.integers(r, 12)), draw(st.integers(s, 12))
    c = draw(st.sampled_from([1, 3, 8, 16, 24, 64]))
    k = draw(st.sampled_from([8, 16, 40, 64]))
    pad = (draw(st.integers(0, r - 1)), draw(st.integers(0, s - 1)))
    return ConvProblem(h, w, c, k, r, s, stride, pad, 1, n=draw(st.integers(1, 3)))


@settings(max_examples=40, deadline=None)
@given(problem=problems(), pass_=st.sampled_from(list(Pass)), out=st.sampled_from(["bfloat16", "float32"]),
       seed=st.integers(0, 2**32 - 1))
def test_bf16_planner_kernels_hypothesis(problem, pass_, out, seed):
    """The planner's bf16 kernels (whatever kind it picks on this GPU) on random shapes."""
    from convgen.compile import detect_target

    if not detect_target().info.bf16_mma:
        pytest.skip("no bfloat16 MMA on this GPU")
    res = run_pass(problem, pass_, np.random.default_rng(seed), in_dtype="bfloat16", out_dtype=out,
                   bias=pass_ is not Pass.DGRAD)
    check(res, out, what=f"{problem.describe()} {pass_.value} bf16 -> {out}")
