"""Stream-K wgrad (TmaWgmma(persistent=True) in wgrad) on the GPU, against the float64 reference.

One wave of blocks shares every tile's K-steps: a block stores the tiles it runs whole to dW
(and db), and the parts of tiles cut between blocks to workspace slots that the reduction
kernel sums, or (split_reduce "grid") that the block which began the tile adds to its own
part after a grid-wide barrier.  The cases vary what decides that walk: tiles many and few against the blocks
(a whole GPU's 132 or so, one SM's one or two), steps per tile many (tiles cut in two or
three) and few (blocks with empty runs, several blocks per tile), K and N tails, and db.
Outputs and workspaces are poisoned (NaN) before every launch: a part summed twice, left out
or read from a slot no block wrote shows.
"""

from __future__ import annotations

import dataclasses
import zlib

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from convgen.ir import ConvProblem, Pass
from convgen.mainloop import TmaWgmma
from convgen.spec import Plan

from gpu_helpers import check, run_pass

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("poison_outputs", "sm90_only")]


def _seed(*parts) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(repr(parts).encode()))


KERNEL_SUMMED = [
    Plan(128, 256, 64, 8, 1, 3, 8, 8, loop=TmaWgmma(persistent=True)),
    Plan(64, 256, 64, 4, 1, 5, 8, 8, loop=TmaWgmma(persistent=True)),
    Plan(128, 128, 64, 8, 1, 5, 8, 8, loop=TmaWgmma(persistent=True)),
    Plan(64, 64, 64, 4, 1, 4, 8, 8, loop=TmaWgmma(persistent=True)),
]
# The same walks with each cut tile summed by the block that began it, after a grid-wide barrier
GRID_SUMMED = [dataclasses.replace(p, split_reduce="grid") for p in KERNEL_SUMMED]
STREAM_K_PLANS = KERNEL_SUMMED + GRID_SUMMED
STREAM_K_SHAPES = [
    ConvProblem(9, 11, 64, 16, 3, 3, 1, 1, 1, n=3),                  # 5 steps a tile: most blocks' runs empty
    ConvProblem(14, 14, 128, 72, 1, 1, 1, 0, 1, n=2),                # pointwise; K tail of 72
    ConvProblem(15, 13, 64, 48, 3, 5, (2, 1), (1, 2), (2, 1), n=2),  # every H/W pair differs
    ConvProblem(8, 8, 192, 136, 3, 3, 1, 1, 1, n=5),                 # 1,728 columns: many tiles, each cut
    ConvProblem(14, 14, 128, 256, 3, 3, 1, 1, 1, n=8),               # 64x64: 72 tiles of 25 steps, cut in 2 or 3
    ConvProblem(7, 7, 256, 512, 3, 3, 1, 1, 1, n=2),                 # 64x64: 288 tiles, blocks run some whole
    ConvProblem(7, 7, 200, 136, 1, 1, 1, 0, 1, n=5),                 # a channel tail in the last box
]


@pytest.mark.parametrize("problem", STREAM_K_SHAPES, ids=lambda p: p.describe().replace(" ", "_"))
@pytest.mark.parametrize("plan", STREAM_K_PLANS, ids=lambda p: p.brief().replace(" ", "_"))
@pytest.mark.parametrize("bias", [False, True], ids=["dw", "dw+db"])
def test_stream_k_exact_tier(problem, plan, bias):
    """Integer data, bit for bit: whole tiles, cut tiles' parts summed by the reduction, db's."""
    res = run_pass(problem, Pass.WGRAD, _seed("stream-k", problem, plan, bias), out_dtype="float32", bias=bias,
                   plan=plan, exact=True)
    check(res, "float32", exact=True, what=f"stream-K wgrad {problem.describe()} {plan.brief()} bias={bias}")


@pytest.mark.parametrize("problem", STREAM_K_SHAPES[3:6], ids=lambda p: p.describe().replace(" ", "_"))
@pytest.mark.parametrize("plan", STREAM_K_PLANS[1:3], ids=lambda p: p.brief().replace(" ", "_"))
def test_stream_k_on_one_sm(problem, plan, one_sm):
    """One or two blocks walk every tile: most tiles whole, stored straight to dW and db."""
    res = run_pass(problem, Pass.WGRAD, _seed("stream-k-one-sm", problem, plan), out_dtype="float32", bias=True,
                   plan=plan, exact=True)
    check(res, "float32", exact=True, what=f"stream-K wgrad, one SM, {problem.describe()} {plan.brief()}")


def test_stream_k_is_repeatable():
    """A fixed order of summing: two runs on the same data give the same bits (fp16 out)."""
    problem, plan = STREAM_K_SHAPES[4], STREAM_K_PLANS[3]
    first = run_pass(problem, Pass.WGRAD, _seed("stream-k-repeat"), bias=True, plan=plan)
    again = run_pass(problem, Pass.WGRAD, _seed("stream-k-repeat"), bias=True, plan=plan)
    for a, b in zip(first.out, again.out):
        assert np.array_equal(a, b)


@pytest.mark.parametrize("problem", STREAM_K_SHAPES[3:6], ids=lambda p: p.describe().replace(" ", "_"))
def test_summed_in_the_kernel_matches_the_reduction_bit_for_bit(problem):
    """The grid-summed form adds a cut tile's parts in the reduction kernel's order, so on the
    same fp16 data both forms give the same bits, dW and db."""
    kernel_plan, grid_plan = KERNEL_SUMMED[0], GRID_SUMMED[0]
    a = run_pass(problem, Pass.WGRAD, _seed("stream-k-forms", problem), bias=True, plan=kernel_plan)
    b = run_pass(problem, Pass.WGRAD, _seed("stream-k-forms", problem), bias=True, plan=grid_plan)
    check(b, "float16", what=f"stream-K wgrad summed in the kernel {problem.describe()}")
    for x, y in zip(a.out, b.out):
        assert np.array_equal(x, y)


@st.composite
def stream_k_problems(draw):
    """Dense layers the TMA wgrad loop runs: C in whole 64-channel boxes (or a 1x1 in 16-byte
    runs), any K in 16-byte runs, filter, stride, padding, dilation and batch."""
    n = draw(st.integers(1, 8))
    r, s = draw(st.integers(1, 5)), draw(st.integers(1, 5))
    stride = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    pad = (draw(st.integers(0, 3)), draw(st.integers(0, 3)))
    dil = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    reach_h, reach_w = (r - 1) * dil[0] + 1, (s - 1) * dil[1] + 1
    h = draw(st.integers(max(1, reach_h - 2 * pad[0]), 24))
    w = draw(st.integers(max(1, reach_w - 2 * pad[1]), 24))
    c = draw(st.integers(1, 3)) * 64 if r * s > 1 else draw(st.integers(4, 30)) * 8
    return ConvProblem(h, w, c, draw(st.integers(1, 24)) * 8, r, s, stride, pad, dil, n=n)


@given(problem=stream_k_problems(), plan=st.sampled_from(STREAM_K_PLANS), bias=st.booleans(),
       seed=st.integers(0, 2**32 - 1))
def test_fuzz_stream_k(problem, plan, bias, seed):
    res = run_pass(problem, Pass.WGRAD, np.random.default_rng(seed), plan=plan, bias=bias)
    check(res, "float16", what=f"stream-K wgrad {problem.describe()} {plan.brief()} bias={bias}")


def test_the_planners_default_runs_summed_in_the_kernel():
    """The planner's own stream-K plan (no plan given, no tuning database): ResNet-18's l4-3x3
    wgrad at batch 128, 72 tiles of 98 K-steps, takes the grid form (stream_k.default_plan), is
    launched cooperatively through a prepared op, and matches the reference with db; a GPU that
    holds fewer blocks than its grid would get the kernel form with a warning instead
    (tests/test_stream_k.py fakes that)."""
    import warnings

    import cupy as cp

    import convgen
    from convgen import config

    problem = ConvProblem(7, 7, 512, 512, 3, 3, 1, 1, 1, n=128)
    with config.overridden(config.TUNED, "0"), warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback on a whole GPU
        res = run_pass(problem, Pass.WGRAD, _seed("stream-k-default"), bias=True)
        op = convgen.prepare(Pass.WGRAD, problem.x_shape, problem.w_shape, padding=1, bias=True)
        x = cp.asarray(_seed("stream-k-default-op").standard_normal(problem.x_shape), dtype=cp.float16)
        dy = cp.asarray(_seed("stream-k-default-op-dy").standard_normal(problem.y_shape), dtype=cp.float16)
        op(x, dy)
    check(res, "float16", what="stream-K wgrad, the planner's plan")
    assert op.plan.loop.persistent and op.plan.split_reduce == "grid", op.plan.brief()
    assert op._kernel.source.main.cooperative and op._kernel.source.reduce is None
