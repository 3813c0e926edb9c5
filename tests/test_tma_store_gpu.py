"""The TMA plans that store their output through the copy engine (TmaWgmma.tma_store: fprop, and
dgrad at stride 1) on the GPU,
against the float64 reference.  Each warp hands its drained strips (16 pixels x 64 filters)
to the copy engine, which writes only what lies inside y: the shapes put strips past the
batch's last pixel and past K, mix fp16 and fp32 outputs (two strips a warp, or one), fuse
a residual and ReLU, and walk a persistent block's tiles across strips and tiles; outputs are
poisoned (NaN) before every launch.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from convgen.ir import ConvProblem, Pass
from convgen.mainloop import TmaWgmma
from convgen.spec import Plan

from gpu_helpers import (check, check_exact_fp32, check_tma_fprop_fuzz_case, check_tma_fprop_on_real_layers, plan_id,
                         run_pass, seeded)

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("poison_outputs", "sm90_only")]


SHAPES = [
    ConvProblem(9, 11, 64, 16, 3, 3, 1, 1, 1, n=3),                  # 297 pixels: a strip part past the batch
    ConvProblem(14, 14, 128, 72, 1, 1, 1, 0, 1, n=2),                # pointwise; strips part past K = 72
    ConvProblem(15, 13, 64, 48, 3, 5, (2, 1), (1, 2), (2, 1), n=2),  # every H/W pair differs
    ConvProblem(8, 8, 192, 136, 3, 3, 1, 1, 1, n=5),                 # three channel steps a tap; K tail
    ConvProblem(9, 11, 96, 48, 3, 3, 1, 1, 1, n=2),                  # a channel tail: w as (C, R*S, K)
]
PLANS = [
    Plan(128, 256, 64, 8, 1, 4, 8, 8, loop=TmaWgmma(tma_store=True)),
    Plan(64, 48, 64, 4, 1, 2, 8, 8, loop=TmaWgmma(tma_store=True)),  # three 16-wide strips a tile's row
]
# persistent on a one-SM target: a block's warps carry their strips from tile to tile
PERSISTENT = [
    Plan(128, 128, 64, 8, 1, 4, 8, 8, loop=TmaWgmma(persistent=True, tma_store=True)),
    Plan(64, 16, 64, 4, 1, 3, 8, 8, loop=TmaWgmma(persistent=True, tma_store=True)),  # one strip a tile: odd counts
    Plan(128, 128, 64, 8, 1, 3, 8, 8, loop=TmaWgmma(persistent=True, pingpong=True, tma_store=True)),
    Plan(128, 128, 64, 8, 1, 3, 8, 8, loop=TmaWgmma(persistent=True, pingpong=True, cluster=2, tma_store=True)),
]


@pytest.mark.parametrize("out_dtype", ["float32", "float16"])
@pytest.mark.parametrize("problem", SHAPES, ids=plan_id)
@pytest.mark.parametrize("plan", PLANS, ids=plan_id)
def test_tma_store_exact_tier(problem, plan, out_dtype):
    res = run_pass(problem, Pass.FPROP, seeded("store", problem, plan, out_dtype), out_dtype=out_dtype, bias=True,
                   plan=plan, exact=True, span=1 if out_dtype == "float16" else 2)
    check(res, out_dtype, exact=True, what=f"fprop {problem.describe()} {plan.brief()} -> {out_dtype}")


@pytest.mark.parametrize("problem", SHAPES, ids=plan_id)
@pytest.mark.parametrize("plan", PERSISTENT, ids=plan_id)
def test_tma_store_persistent_exact_tier(problem, plan, one_sm):
    check_exact_fp32(problem, Pass.FPROP, plan, "store-persistent", " on one SM")


@pytest.mark.parametrize("plan", [PLANS[0], PERSISTENT[0], PERSISTENT[2]], ids=plan_id)
def test_tma_store_residual_and_relu(plan):
    """alpha * conv + bias + beta * residual, then ReLU, through the strips."""
    problem = ConvProblem(10, 9, 128, 200, 3, 3, 1, 1, 1, n=3)
    res = run_pass(problem, Pass.FPROP, seeded("store-residual", plan), bias=True, relu=True, residual=True,
                   alpha=0.5, beta=-1.5, plan=plan)
    check(res, "float16", what=f"fprop {problem.describe()} {plan.brief()} with a residual")


@pytest.mark.parametrize("plan", [PLANS[0], PERSISTENT[0], PERSISTENT[2]], ids=plan_id)
def test_tma_store_grid_walks_a_real_layer(plan):
    """Several tiles an SM on the whole GPU, normal data through fp16 with ReLU; 8 groups of 64."""
    check_tma_fprop_on_real_layers(plan, "store-big")


# dgrad at stride 1: dx's strips past the batch and past C, one tile a block and persistent
DGRAD_SHAPES = [
    ConvProblem(9, 11, 40, 64, 3, 3, 1, 1, 1, n=3),
    ConvProblem(10, 9, 136, 72, 3, 5, 1, (1, 2), (1, 2), n=2),
    ConvProblem(14, 14, 200, 256, 1, 1, 1, 0, 1, n=2),
]
DGRAD_PLANS = [
    Plan(128, 128, 64, 8, 1, 3, 8, 8, loop=TmaWgmma(tma_store=True)),
    Plan(64, 64, 64, 4, 1, 3, 8, 8, loop=TmaWgmma(persistent=True, tma_store=True)),
    Plan(128, 64, 64, 8, 1, 3, 8, 8, loop=TmaWgmma(persistent=True, pingpong=True, tma_store=True)),
]


@pytest.mark.parametrize("problem", DGRAD_SHAPES, ids=plan_id)
@pytest.mark.parametrize("plan", DGRAD_PLANS, ids=plan_id)
def test_tma_store_dgrad_exact_tier(problem, plan, one_sm):
    check_exact_fp32(problem, Pass.DGRAD, plan, "store-dgrad", " on one SM")


@given(h=st.integers(3, 20), w=st.integers(3, 20), c=st.integers(1, 3).map(lambda i: 64 * i), k=st.integers(1, 160),
       r=st.integers(1, 3), s=st.integers(1, 3), stride=st.integers(1, 2), n=st.integers(1, 4),
       plan=st.sampled_from(PLANS + PERSISTENT[:1] + PERSISTENT[2:3]), seed=st.integers(0, 2**32 - 1))
def test_fuzz_tma_store(h, w, c, k, r, s, stride, n, plan, seed):
    check_tma_fprop_fuzz_case(h, w, c, k, r, s, stride, n, plan, seed)
