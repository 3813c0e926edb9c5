"""Grouped convolutions with several channels a group (ResNeXt-style) on the GPU: G GEMMs side
by side on the im2col loop, against the float64 reference in all three passes.  The exact
integer tier bit for bit, normal data within the fp16 tolerance, forced split-K (the
reduction kernel's flat layout spans every group), the fused epilogue, bf16, and a Hypothesis
fuzz over groupings."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, strategies as st

from convgen.ir import ConvProblem, Pass
from convgen.mainloop import Im2col
from convgen.planner import plan as make_plan

from gpu_helpers import check, run_pass, seeded

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("poison_outputs")]

PASSES = [Pass.FPROP, Pass.DGRAD, Pass.WGRAD]


def grouped(h, w, c, k, g, r, s, stride=1, pad=0, dil=1, n=2):
    return ConvProblem(h, w, c, k, r, s, stride, pad, dil, groups=g, n=n)


# Channels a group from 2 to 32 (vector widths 2, 4, 8 and scalar), groups 2 to 32, K/G unlike
# C/G, strides 1-3 (dgrad's residue classes), dilation, uneven padding, 1x1 (the pointwise
# path) and tiles of the pixels that do not divide M.
SHAPES = [
    grouped(9, 11, 16, 32, 2, 3, 3, 1, 1),
    grouped(14, 14, 64, 64, 8, 3, 3, 1, 1),
    grouped(13, 10, 128, 128, 32, 3, 3, 2, 1),  # ResNeXt 32x4d's first stage: 4 channels a group
    grouped(8, 8, 64, 128, 4, 1, 1),  # grouped pointwise
    grouped(11, 9, 48, 24, 3, 3, 3, 2, (1, 0), (1, 2)),
    grouped(10, 12, 12, 18, 3, 5, 3, (1, 3), (2, 1)),  # 4 in, 6 out a group
    grouped(7, 9, 6, 8, 2, 3, 3, 1, 1),  # 3 channels a group: the scalar gathers
    grouped(6, 6, 256, 256, 8, 3, 3, 1, 1, n=3),  # 32 channels a group, several N tiles' worth of K
]


def _ids(p):
    return p.describe().replace(" ", "_")


@pytest.mark.parametrize("pass_", PASSES, ids=lambda p: p.value)
@pytest.mark.parametrize("problem", SHAPES, ids=_ids)
def test_grouped_exact_tier(problem, pass_):
    """Integer data: every product and sum is exact in fp32, so fp32 outputs must match the
    reference bit for bit (fprop with bias and ReLU, wgrad with db)."""
    pl = make_plan(problem, pass_)
    assert isinstance(pl.loop, Im2col), pl.loop
    epi = dict(bias=True, relu=True) if pass_ is Pass.FPROP else dict(bias=True) if pass_ is Pass.WGRAD else {}
    res = run_pass(problem, pass_, seeded("grouped-exact", problem, pass_), out_dtype="float32", exact=True, **epi)
    check(res, "float32", exact=True, what=f"{pass_.value} {problem.describe()}")


@pytest.mark.parametrize("pass_", PASSES, ids=lambda p: p.value)
@pytest.mark.parametrize("problem", SHAPES[:4], ids=_ids)
def test_grouped_normal_fp16(problem, pass_):
    res = run_pass(problem, pass_, seeded("grouped-normal", problem, pass_), out_dtype="float16",
                   bias=pass_ is not Pass.DGRAD)
    check(res, "float16", what=f"{pass_.value} {problem.describe()}")


@pytest.mark.parametrize("split", [2, 5])
@pytest.mark.parametrize("pass_", PASSES, ids=lambda p: p.value)
@pytest.mark.parametrize("problem", [SHAPES[1], SHAPES[4], SHAPES[5]], ids=_ids)
def test_grouped_split_k(problem, pass_, split):
    """Split-K slices written in the output's layout (every group's columns), summed by the
    reduction kernel, which then runs the epilogue: bias and ReLU in fprop, db in wgrad."""
    plan = dataclasses.replace(make_plan(problem, pass_), split_k=split)
    epi = dict(bias=True, relu=True) if pass_ is Pass.FPROP else dict(bias=True) if pass_ is Pass.WGRAD else {}
    res = run_pass(problem, pass_, seeded("grouped-split", problem, pass_, split), out_dtype="float32", exact=True,
                   plan=plan, **epi)
    check(res, "float32", exact=True, what=f"{pass_.value} {problem.describe()} split {split}")


@pytest.mark.parametrize("split", [1, 3])
def test_grouped_residual_gelu(split):
    p = SHAPES[1]
    plan = dataclasses.replace(make_plan(p, Pass.FPROP), split_k=split)
    res = run_pass(p, Pass.FPROP, seeded("grouped-res", split), out_dtype="float32", bias=True, gelu=True,
                   residual=True, alpha=0.5, beta=2.0, plan=plan)
    check(res, "float32", what=f"fprop residual gelu split {split}")


@pytest.mark.parametrize("pass_", PASSES, ids=lambda p: p.value)
def test_grouped_bf16(pass_):
    p = grouped(12, 12, 64, 64, 4, 3, 3, 2, 1)
    res = run_pass(p, pass_, seeded("grouped-bf16", pass_), in_dtype="bfloat16", out_dtype="bfloat16",
                   bias=pass_ is Pass.WGRAD)
    check(res, "bfloat16", what=f"{pass_.value} bf16")


@pytest.mark.parametrize("pass_", PASSES, ids=lambda p: p.value)
def test_grouped_float32_inputs(pass_):
    """fp32 inputs, cast once to fp16 (or gathered as fp32 where a run is scalar)."""
    p = grouped(9, 9, 24, 36, 3, 3, 3, 1, 1)
    res = run_pass(p, pass_, seeded("grouped-f32", pass_), in_dtype="float32", out_dtype="float32", exact=True)
    check(res, "float32", exact=True, what=f"{pass_.value} fp32 in")


@st.composite
def grouped_problems(draw):
    g = draw(st.sampled_from([2, 3, 4, 8, 16]))
    cg, kg = draw(st.sampled_from([2, 3, 4, 8, 16])), draw(st.sampled_from([1, 2, 4, 6, 8, 24]))
    r, s = draw(st.integers(1, 5)), draw(st.integers(1, 5))
    stride = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    pad = (draw(st.integers(0, 2)), draw(st.integers(0, 2)))
    dil = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    h = draw(st.integers(max(1, dil[0] * (r - 1) + 1 - 2 * pad[0]), 16))
    w = draw(st.integers(max(1, dil[1] * (s - 1) + 1 - 2 * pad[1]), 16))
    return ConvProblem(h, w, g * cg, g * kg, r, s, stride, pad, dil, groups=g, n=draw(st.integers(1, 3)))


@given(problem=grouped_problems(), pass_=st.sampled_from(PASSES), seed=st.integers(0, 2**32 - 1))
def test_grouped_fuzz(problem, pass_, seed):
    res = run_pass(problem, pass_, np.random.default_rng(seed), out_dtype="float32", exact=True,
                   bias=pass_ is not Pass.DGRAD)
    check(res, "float32", exact=True, what=f"{pass_.value} {problem.describe()}")
