"""The depthwise kind (groups = C) on the GPU against the float64 reference, in all three
passes: the exact-integer tier bit for bit, normal data within the fp16 tolerance, hand
plans that split wgrad's pixels (or not), bf16, and a Hypothesis fuzz over shapes."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, strategies as st

from convgen.ir import ConvProblem, Pass
from convgen.spec import Plan
from convgen.mainloop import Depthwise
from convgen.planner import plan as make_plan

from gpu_helpers import check, run_pass, seeded

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("poison_outputs")]

PASSES = [Pass.FPROP, Pass.DGRAD, Pass.WGRAD]


def dw(h, w, c, r, s, stride=1, pad=0, dil=1, mult=1, n=2):
    return ConvProblem(h, w, c, c * mult, r, s, stride, pad, dil, groups=c, n=n)


# Tails everywhere: images not a whole number of tiles, C not a whole chunk, strides 1-3
# (dgrad's fixed taps per residue), dilation, uneven padding, multipliers, 1x1 to 7x7.
SHAPES = [
    dw(9, 11, 16, 3, 3, 1, 1),
    dw(13, 10, 24, 3, 3, 2, 1),
    dw(15, 17, 40, 3, 3, 2, (1, 0)),
    dw(12, 12, 144, 3, 3, 1, 1, n=3),
    dw(11, 9, 32, 5, 5, 2, 2),
    dw(14, 14, 96, 7, 7, 1, 3),
    dw(10, 13, 16, 3, 3, 1, 2, 2),
    dw(8, 8, 8, 3, 3, 1, 1, mult=2),
    dw(9, 7, 4, 3, 5, (1, 2), (1, 2), mult=3),
    dw(7, 7, 64, 1, 1, 1, 0),
    dw(16, 16, 32, 3, 3, 3, 1),
    dw(6, 6, 3, 3, 3, 1, 1),
]


def _ids(p):
    return p.describe().replace(" ", "_")


@pytest.mark.parametrize("pass_", PASSES, ids=lambda p: p.value)
@pytest.mark.parametrize("problem", SHAPES, ids=_ids)
def test_depthwise_exact_tier(problem, pass_):
    """Integer data: every product and sum is exact in fp32, so fp32 outputs must match the
    reference bit for bit (fprop with bias and ReLU, wgrad with db)."""
    rng = seeded("dw-exact", problem, pass_)
    epi = dict(bias=True, relu=True) if pass_ is Pass.FPROP else dict(bias=True) if pass_ is Pass.WGRAD else {}
    res = run_pass(problem, pass_, rng, out_dtype="float32", exact=True, **epi)
    check(res, "float32", exact=True, what=f"{pass_.value} {problem.describe()}")


@pytest.mark.parametrize("pass_", PASSES, ids=lambda p: p.value)
@pytest.mark.parametrize("problem", SHAPES[:8], ids=_ids)
def test_depthwise_normal_fp16(problem, pass_):
    rng = seeded("dw-normal", problem, pass_)
    res = run_pass(problem, pass_, rng, out_dtype="float16", bias=pass_ is not Pass.DGRAD)
    check(res, "float16", what=f"{pass_.value} {problem.describe()}")


@pytest.mark.parametrize("split", [1, 3, 17])
@pytest.mark.parametrize("problem", [SHAPES[1], SHAPES[7], SHAPES[11]], ids=_ids)
def test_depthwise_wgrad_split(problem, split):
    """wgrad's pixel slices, with and without the split-K reduction, in exact arithmetic."""
    base = make_plan(problem, Pass.WGRAD)
    plan = dataclasses.replace(base, split_k=split, split_reduce=base.split_reduce if split > 1 else "kernel")
    res = run_pass(problem, Pass.WGRAD, seeded("dw-split", problem, split), out_dtype="float32", exact=True,
                   bias=True, plan=plan)
    check(res, "float32", exact=True, what=f"wgrad {problem.describe()} split {split}")


@pytest.mark.parametrize("pass_", PASSES, ids=lambda p: p.value)
def test_depthwise_hand_plan_other_tile(pass_):
    """A hand plan of another tile and run length than the planner's."""
    p = dw(13, 19, 32, 3, 3, 1, 1, n=2)
    plan = (Plan(32, 16, 16, 1, 1, 2, 8, 8, split_k=2, loop=Depthwise(32, 2)) if pass_ is Pass.WGRAD
            else Plan(64, 32, 16, 4, 1, 2, 8, 1, loop=Depthwise(8, 2)))
    res = run_pass(p, pass_, seeded("dw-hand", pass_), out_dtype="float32", exact=True, plan=plan)
    check(res, "float32", exact=True, what=f"{pass_.value} hand plan")


@pytest.mark.parametrize("rows", [1, 3])
def test_depthwise_wgrad_row_groups(rows):
    """wgrad with the filter's rows shared out between thread groups (Depthwise.rows), db too."""
    p = dw(11, 12, 32, 3, 3, (2, 1), (1, 2), n=2)
    groups = 3 // rows
    plan = Plan(32, 16, 16, 3 * groups // 3 if groups == 3 else 1, 1, 2, 8, 8, split_k=3, loop=Depthwise(32, 2, rows))
    res = run_pass(p, Pass.WGRAD, seeded("dw-rows", rows), out_dtype="float32", exact=True, bias=True, plan=plan)
    check(res, "float32", exact=True, what=f"wgrad rows {rows}")


@pytest.mark.parametrize("pass_", PASSES, ids=lambda p: p.value)
def test_depthwise_bf16(pass_):
    p = dw(12, 12, 64, 3, 3, 2, 1, n=2)
    res = run_pass(p, pass_, seeded("dw-bf16", pass_), in_dtype="bfloat16", out_dtype="bfloat16")
    check(res, "bfloat16", what=f"{pass_.value} bf16")


def test_depthwise_residual_gelu():
    p = dw(10, 10, 32, 3, 3, 1, 1, n=2)
    res = run_pass(p, Pass.FPROP, seeded("dw-res"), out_dtype="float32", bias=True, gelu=True, residual=True,
                   alpha=0.5, beta=2.0)
    check(res, "float32", what="fprop residual gelu")


@st.composite
def depthwise_problems(draw):
    c = draw(st.sampled_from([1, 2, 4, 8, 16, 24, 48, 72, 96]))
    mult = draw(st.sampled_from([1, 1, 1, 2]))
    r, s = draw(st.integers(1, 7)), draw(st.integers(1, 7))
    stride = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    pad = (draw(st.integers(0, 3)), draw(st.integers(0, 3)))
    dil = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    h = draw(st.integers(max(1, dil[0] * (r - 1) + 1 - 2 * pad[0]), 20))
    w = draw(st.integers(max(1, dil[1] * (s - 1) + 1 - 2 * pad[1]), 20))
    return ConvProblem(h, w, c, c * mult, r, s, stride, pad, dil, groups=c, n=draw(st.integers(1, 4)))


@given(problem=depthwise_problems(), pass_=st.sampled_from(PASSES), seed=st.integers(0, 2**32 - 1))
def test_depthwise_fuzz(problem, pass_, seed):
    res = run_pass(problem, pass_, np.random.default_rng(seed), out_dtype="float32", exact=True,
                   bias=pass_ is not Pass.DGRAD)
    check(res, "float32", exact=True, what=f"{pass_.value} {problem.describe()}")


@pytest.mark.parametrize("tiles, ring", [(2, 2), (3, 2), (3, 3), (4, 3), (5, 3)],
                         ids=["t2r2", "t3r2", "t3r3", "t4r3", "t5r3"])
@pytest.mark.parametrize("pass_", [Pass.FPROP, Pass.DGRAD], ids=lambda p: p.value)
@pytest.mark.parametrize("problem", [dw(13, 19, 32, 3, 3, 1, 1, n=3), dw(14, 11, 16, 5, 3, 2, (2, 1), mult=2, n=2)],
                         ids=_ids)
def test_depthwise_tiles_per_block(problem, pass_, tiles, ring):
    """Several tiles a block, the next ring - 1 tiles' halos copied while one computes; the
    batch's tiles are not a whole number of blocks, so the last block stops early, with fewer
    tiles than its ring has buffers where tiles is 4 or 5."""
    vec = 8 if problem.kg == 1 else 4
    lanes = 32 // vec
    plan = Plan(64, 32, 16, 64 // 2 * lanes // 32, 1, ring, vec, 1, loop=Depthwise(8, 2, 0, tiles))
    res = run_pass(problem, pass_, seeded("dw-tiles", problem, pass_, tiles * 10 + ring), out_dtype="float32",
                   exact=True, bias=pass_ is Pass.FPROP, plan=plan)
    check(res, "float32", exact=True, what=f"{pass_.value} {problem.describe()} tiles {tiles} ring {ring}")


@pytest.mark.parametrize("pass_", PASSES, ids=lambda p: p.value)
@pytest.mark.parametrize("problem", [SHAPES[3], SHAPES[2], SHAPES[5], SHAPES[7], dw(20, 23, 96, 3, 3, 2, 1),
                                     dw(15, 13, 240, 5, 5, 2, 2)], ids=_ids)
def test_depthwise_tuning_variations_exact(problem, pass_):
    """Every tuning variation `convgen tune` offers (depthwise_variations.variations: 48-channel chunks,
    runs of 1-4, runs of 8 over 4 or 8 channels, 4-16-row tiles, several tiles a block; wgrad's
    other tiles, chunks and slices), in exact arithmetic: bit for bit, as the default plan is
    above.  The 5x5 layer's whole 240-channel pixel keeps runs of 4 over 8 channels by default:
    its variations run 8 over 4 over the whole pixel (60 lanes, more than a warp) and over
    48-channel chunks."""
    from convgen.candidates import candidates
    from convgen.ir import Target

    if problem.c == 240:
        chunks = sorted(p.block_n for p in candidates(problem, pass_, Target("sm_90")) if (p.vec_a, p.loop.cols) == (4, 8))
        assert chunks == ([48, 240] if pass_ is not Pass.WGRAD else []), chunks
    for i, plan in enumerate(candidates(problem, pass_, Target("sm_90"))[1:]):
        epi = dict(bias=True) if pass_ is not Pass.DGRAD else {}
        res = run_pass(problem, pass_, seeded("dw-variation", problem, pass_, i), out_dtype="float32", exact=True,
                       plan=plan, **epi)
        check(res, "float32", exact=True, what=f"{pass_.value} {problem.describe()} {plan.brief()}")


@pytest.mark.parametrize("pass_", [Pass.FPROP, Pass.DGRAD], ids=lambda p: p.value)
@pytest.mark.parametrize("problem", [dw(7, 7, 64, 7, 7, 1, 3, n=3), dw(14, 14, 100, 5, 5, 2, 2, n=2),
                                     dw(28, 28, 240, 5, 5, 1, 2, n=2)], ids=_ids)
def test_depthwise_fitted_tiles_exact(problem, pass_):
    """The tiles fitted to outputs that 8-pixel tiles overhang (depthwise_variations.fitted_tile:
    runs of 3 and 7, tiles that are not whole 16-pixel fragments, a last warp whose lanes past the
    runs repeat the last run and store nothing), bit for bit, each checked to be one of those."""
    from convgen.candidates import candidates
    from convgen.ir import Target

    fitted = [p for p in candidates(problem, pass_, Target("sm_90")) if "fitted to the" in p.reasons[0]]
    assert fitted, problem.describe()
    spare = [p for p in fitted if p.warps_m * 32 > p.block_m // p.loop.cols * (p.block_n // p.vec_a)]
    if problem.h == 7:
        assert spare, [p.brief() for p in fitted]
    for i, plan in enumerate(fitted):
        epi = dict(bias=True, relu=True) if pass_ is Pass.FPROP else {}
        res = run_pass(problem, pass_, seeded("dw-fitted", problem, pass_, i), out_dtype="float32", exact=True,
                       plan=plan, **epi)
        check(res, "float32", exact=True, what=f"{pass_.value} {problem.describe()} {plan.brief()}")


@pytest.mark.parametrize("pass_", [Pass.FPROP, Pass.DGRAD], ids=lambda p: p.value)
@pytest.mark.parametrize("problem", [dw(28, 28, 144, 3, 3, 1, 1, n=4), dw(28, 28, 144, 3, 3, 2, 1, n=4)], ids=_ids)
def test_depthwise_whole_pixel_chunk_and_interleave_exact(problem, pass_):
    """Where pixels are not whole DRAM granules: the default's 144 channels a block
    (depthwise.whole_pixel_chunk, 18 lanes) and, where C = 272's 34 lanes allow no whole-pixel
    block, 64-channel chunks taken chunk first (Depthwise.interleave: block_work's order), bit
    for bit."""
    from convgen.candidates import candidates
    from convgen.ir import Target

    wide = dataclasses.replace(problem, c=272, k=272, groups=272)
    default = candidates(problem, pass_, Target("sm_90"))[0]
    inter = next(p for p in candidates(wide, pass_, Target("sm_90")) if p.loop.interleave)
    assert default.block_n == 144
    for prob, plan in ((problem, default), (wide, inter)):
        res = run_pass(prob, pass_, seeded("dw-whole", prob, pass_, plan.brief()), out_dtype="float32",
                       exact=True, plan=plan, **(dict(bias=True) if pass_ is Pass.FPROP else {}))
        check(res, "float32", exact=True, what=f"{pass_.value} {prob.describe()} {plan.brief()}")


# Several filters a channel, at the plans the register limits give (narrower chunks, fewer rows
# a block, shorter runs): depthwise.stencil_registers and WGRAD_REG_OVERHEAD, tests/test_sass.py.
MULTIPLIED = [(Pass.FPROP, 8, 32, 3), (Pass.FPROP, 64, 32, 7), (Pass.DGRAD, 8, 32, 3), (Pass.WGRAD, 40, 2, 7),
              (Pass.WGRAD, 12, 2, 7), (Pass.WGRAD, 8, 4, 7), (Pass.WGRAD, 64, 16, 5), (Pass.WGRAD, 8, 24, 3),
              (Pass.WGRAD, 64, 4, 7)]


@pytest.mark.parametrize("pass_, c, m, f", MULTIPLIED, ids=[f"{p.value}-c{c}-m{m}-{f}x{f}" for p, c, m, f in MULTIPLIED])
def test_depthwise_multiplier_plans_exact(pass_, c, m, f):
    problem = dw(32, 32, c, f, f, 1, f // 2, mult=m, n=2)
    res = run_pass(problem, pass_, seeded("dw-mult", problem, pass_), out_dtype="float32", exact=True,
                   bias=pass_ is not Pass.DGRAD)
    check(res, "float32", exact=True, what=f"{pass_.value} {problem.describe()}")


# The held-filter fprop loop (Depthwise.out_rows: kernels/fprop_depthwise_held.j2): every such
# candidate the tuner offers on layers with tails (edge tiles, a part chunk, spare lanes), strides,
# dilation, a multiplier, a rectangular filter; tests/test_depthwise_host.py runs the same source
# on the host.
HELD = [dw(13, 11, 96, 7, 7, 1, 3), dw(7, 7, 48, 7, 7, 1, 3, n=3), dw(12, 9, 40, 5, 5, 2, 2),
        dw(10, 10, 24, 3, 3, 1, 2, 2), dw(9, 10, 16, 3, 3, 2, 1, mult=2), dw(11, 13, 8, 3, 5, (1, 2), (1, 2), mult=3),
        dw(56, 56, 96, 7, 7, 1, 3, n=4)]


def _row_plans(problem, pass_):
    """The candidates of several rows a thread: fprop's held filters, wgrad's runs of two dy rows
    (Depthwise.out_rows in wgrad: depthwise_wgrad.row_run, the default among them on 7x7)."""
    from convgen.candidates import candidates
    from convgen.ir import Target

    return [p for p in candidates(problem, pass_, Target("sm_90")) if isinstance(p.loop, Depthwise) and p.loop.out_rows > 1]


ROW_FORMS = [pytest.param(Pass.FPROP, id="held"), pytest.param(Pass.WGRAD, id="wgrad-rows")]
# wgrad's on the same layers but the dilated one, which takes it at stride 2 (at stride 1 a
# dilation of 2 leaves two dy rows no x row to share)
ROW_PLANS = [pytest.param(Pass.FPROP, p, id=f"held-{_ids(p)}") for p in HELD] + [
    pytest.param(Pass.WGRAD, p, id=f"wgrad-rows-{_ids(p)}") for p in HELD[:3] + [dw(12, 12, 24, 3, 3, 2, 2, 2)] + HELD[4:]]


@pytest.mark.parametrize("pass_, problem", ROW_PLANS)
def test_depthwise_row_plans_exact(problem, pass_):
    """Integer data, bias added (wgrad: db), float32 out: each plan of several rows a thread bit
    for bit the reference."""
    plans = _row_plans(problem, pass_)
    assert plans
    for plan in plans:
        res = run_pass(problem, pass_, seeded("dw-rows", problem, plan.brief()), out_dtype="float32", exact=True,
                       plan=plan, bias=True)
        check(res, "float32", exact=True, what=f"{pass_.value} {problem.describe()} {plan.brief()}")


@pytest.mark.parametrize("pass_", ROW_FORMS)
@given(problem=depthwise_problems(), seed=st.integers(0, 2**32 - 1))
def test_depthwise_row_plans_fuzz(pass_, problem, seed):
    from hypothesis import assume

    plans = _row_plans(problem, pass_)
    assume(plans)
    plan = plans[seed % len(plans)]
    res = run_pass(problem, pass_, np.random.default_rng(seed), out_dtype="float32", exact=True, bias=True, plan=plan)
    check(res, "float32", exact=True, what=f"{pass_.value} {problem.describe()} {plan.brief()}")


# The stencil on mma.sync (Depthwise.mma: kernels/fprop_depthwise_mma.j2): every such candidate,
# on stride-1 layers with tails, a rectangular and a 9-wide filter, float16 and bfloat16;
# tests/test_depthwise_host.py runs the same source on the host.
MMA = [dw(13, 11, 96, 7, 7, 1, 3), dw(7, 7, 48, 7, 7, 1, 3, n=3), dw(11, 19, 40, 5, 5, 1, 2), dw(9, 9, 24, 3, 3, 1, 1, n=3),
       dw(10, 13, 16, 3, 5, 1, (1, 2)), dw(6, 8, 8, 9, 9, 1, 4), dw(56, 56, 96, 7, 7, 1, 3, n=4)]


def _mma_plans(problem, dtype="float16"):
    from convgen.candidates import candidates
    from convgen.ir import Target

    return [dataclasses.replace(p, read_a=dtype, read_b=dtype)
            for p in candidates(problem, Pass.FPROP, Target("sm_90")) if isinstance(p.loop, Depthwise) and p.loop.mma]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("problem", MMA, ids=_ids)
def test_depthwise_mma_stencil_exact(problem, dtype):
    """Integer data (exact in bfloat16 too), bias added, float32 out: bit for bit the reference."""
    plans = _mma_plans(problem, dtype)
    assert plans
    for plan in plans:
        res = run_pass(problem, Pass.FPROP, seeded("dw-mma", problem, plan.brief(), dtype), in_dtype=dtype,
                       out_dtype="float32", exact=True, plan=plan, bias=True)
        check(res, "float32", exact=True, what=f"fprop {problem.describe()} {plan.brief()} {dtype}")


@pytest.mark.parametrize("form", ["held", "mma"])
def test_depthwise_fprop_forms_fused_epilogues(form):
    """The held-filter and mma.sync stencils' fused epilogues: bias and ReLU to float16,
    residual and GELU to float32."""
    problem = (HELD if form == "held" else MMA)[0]
    plan = (_row_plans(problem, Pass.FPROP) if form == "held" else _mma_plans(problem))[0]
    res = run_pass(problem, Pass.FPROP, seeded(f"dw-{form}-relu", problem), out_dtype="float16", bias=True, relu=True,
                   plan=plan)
    check(res, "float16", what=f"{form} fprop bias relu")
    res = run_pass(problem, Pass.FPROP, seeded(f"dw-{form}-gelu", problem), out_dtype="float32", residual=True,
                   gelu=True, alpha=0.5, beta=-1.25, plan=plan)
    check(res, "float32", what=f"{form} fprop residual gelu")


@st.composite
def mma_problems(draw):  # the layers the stencil on mma.sync takes: stride 1, no dilation, C in 8s, one filter
    c = draw(st.sampled_from([8, 16, 24, 40, 96]))
    r, s = draw(st.integers(1, 9)), draw(st.integers(1, 9))
    pad = (draw(st.integers(0, r // 2 + 1)), draw(st.integers(0, s // 2 + 1)))
    h = draw(st.integers(max(1, r - 2 * pad[0]), 24))
    w = draw(st.integers(max(1, s - 2 * pad[1]), 24))
    return ConvProblem(h, w, c, c, r, s, 1, pad, 1, groups=c, n=draw(st.integers(1, 4)))


@given(problem=mma_problems(), seed=st.integers(0, 2**32 - 1))
def test_depthwise_mma_stencil_fuzz(problem, seed):
    plans = _mma_plans(problem)
    assert plans, problem.describe()
    plan = plans[seed % len(plans)]
    res = run_pass(problem, Pass.FPROP, np.random.default_rng(seed), out_dtype="float32", exact=True, bias=True,
                   plan=plan)
    check(res, "float32", exact=True, what=f"fprop {problem.describe()} {plan.brief()}")
