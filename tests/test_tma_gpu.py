"""The TMA main loop (TmaWgmma) on the GPU, against the float64 reference.

The copy engine does this kind's im2col: its bounding box, traversal stride and tap offsets
come from the tensor map (convgen/tma.py) and the producer's coordinates, so the shapes
below vary each of them on its own axis (non-square padding, filters, strides and
dilations tell H from W), and the batch's last tile runs past the last pixel.  Outputs are
poisoned (NaN) before every launch.
"""

from __future__ import annotations

import dataclasses
import zlib

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from convgen.ir import ConvProblem, Pass
from convgen.spec import Plan
from convgen.mainloop import TmaWgmma

from gpu_helpers import check, run_pass

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("poison_outputs", "sm90_only")]


def _seed(*parts) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(repr(parts).encode()))


TMA_SHAPES = [
    ConvProblem(9, 11, 64, 16, 3, 3, 1, 1, 1, n=3),                  # M tail: 297 pixels; K < BN
    ConvProblem(14, 14, 128, 72, 1, 1, 1, 0, 1, n=2),                # pointwise; K tail of 72
    ConvProblem(16, 15, 64, 40, 1, 1, 2, 0, 1, n=3),                 # strided 1x1 (ResNet's shortcut)
    ConvProblem(15, 13, 64, 48, 3, 5, (2, 1), (1, 2), (2, 1), n=2),  # every H/W pair differs
    ConvProblem(12, 10, 64, 24, 3, 2, (1, 3), (0, 1), (1, 2), n=2),
    ConvProblem(9, 9, 64, 32, 7, 7, 2, 3, 1, n=2),                   # 7x7 stride 2 (a stem's reach)
    ConvProblem(8, 8, 192, 136, 3, 3, 1, 1, 1, n=5),                 # three channel steps per tap
    ConvProblem(7, 7, 64, 64, 3, 3, 1, 2, 2, n=3),                   # dilation 2, padding 2
]
TMA_PLANS = [
    Plan(128, 256, 64, 8, 1, 4, 8, 8, loop=TmaWgmma()),
    Plan(128, 128, 64, 8, 1, 5, 8, 8, loop=TmaWgmma()),
    Plan(64, 128, 64, 4, 1, 6, 8, 8, loop=TmaWgmma()),
    Plan(64, 48, 64, 4, 1, 2, 8, 8, loop=TmaWgmma()),
    Plan(64, 192, 64, 4, 1, 6, 8, 8, loop=TmaWgmma()),  # three 64-column boxes: a tile as wide as N = 576
]


@pytest.mark.parametrize("problem", TMA_SHAPES, ids=lambda p: p.describe().replace(" ", "_"))
@pytest.mark.parametrize("plan", TMA_PLANS, ids=lambda p: p.brief().replace(" ", "_"))
def test_tma_exact_tier(problem, plan):
    """Integer data, bit for bit, with a bias: every pixel the copy engine gathers (the
    padding's zeros, the stride, each tap's offset), the swizzle the descriptors undo, and
    the accumulator layout the drain reads."""
    res = run_pass(problem, Pass.FPROP, _seed("tma", problem, plan), out_dtype="float32", bias=True, plan=plan,
                   exact=True)
    check(res, "float32", exact=True, what=f"fprop {problem.describe()} {plan.brief()}")


# fprop's persistent kernels: a grid of the blocks the GPU holds, each walking tiles b,
# b + gridDim.x, ... with the ring's stages and parities carried from tile to tile.  The
# exact tier runs them as if the GPU had one SM, so one or two blocks walk every tile of
# the layer (M and N tails among them) and the producer runs ahead across tile boundaries.
PERSISTENT_PLANS = [
    Plan(128, 128, 64, 8, 1, 5, 8, 8, loop=TmaWgmma(persistent=True)),
    Plan(128, 64, 64, 8, 1, 6, 8, 8, loop=TmaWgmma(persistent=True)),
    Plan(128, 256, 64, 8, 1, 3, 8, 8, loop=TmaWgmma(persistent=True)),
    Plan(64, 64, 64, 4, 1, 3, 8, 8, loop=TmaWgmma(persistent=True)),   # two blocks an SM
    Plan(64, 48, 64, 4, 1, 2, 8, 8, loop=TmaWgmma(persistent=True)),   # a ring of 2 on 9+ steps a tile
    Plan(128, 192, 64, 8, 1, 4, 8, 8, loop=TmaWgmma(persistent=True)),  # three 64-column boxes (tuning's exact tile)
    # ping-pong: the two consumer warpgroups take whole tiles in turn, each skipping the
    # other's stages; a ring of 2 or 3 on 9+ steps a tile wraps it an odd number of times a tile
    Plan(128, 128, 64, 8, 1, 5, 8, 8, loop=TmaWgmma(persistent=True, pingpong=True)),
    Plan(128, 64, 64, 8, 1, 6, 8, 8, loop=TmaWgmma(persistent=True, pingpong=True)),
    Plan(128, 128, 64, 8, 1, 3, 8, 8, loop=TmaWgmma(persistent=True, pingpong=True)),
    Plan(128, 64, 64, 8, 1, 2, 8, 8, loop=TmaWgmma(persistent=True, pingpong=True)),
]


@pytest.mark.parametrize("problem", TMA_SHAPES, ids=lambda p: p.describe().replace(" ", "_"))
@pytest.mark.parametrize("plan", PERSISTENT_PLANS, ids=lambda p: p.brief().replace(" ", "_"))
def test_tma_persistent_exact_tier(problem, plan, one_sm):
    res = run_pass(problem, Pass.FPROP, _seed("tma-persistent", problem, plan), out_dtype="float32", bias=True,
                   plan=plan, exact=True)
    check(res, "float32", exact=True, what=f"fprop {problem.describe()} {plan.brief()} on one SM")


# fprop whose C is not a whole number of 64-channel boxes: each tap's last step's boxes run
# past C in x's channels and w's rows (a 1x1's [K][C], a larger filter's (C, R*S, K)), and
# both must read zeros there, never the next tap (C < one box, one box and a tail, three and
# a tail of 8; stride 2; M tails; 3x3 and 3x5 filters with padding, stride and dilation).
CHANNEL_TAIL_SHAPES = [
    ConvProblem(14, 14, 40, 72, 1, 1, 1, 0, 1, n=2),
    ConvProblem(9, 11, 112, 48, 1, 1, 1, 0, 1, n=3),
    ConvProblem(16, 15, 80, 64, 1, 1, 2, 0, 1, n=3),
    ConvProblem(7, 7, 200, 136, 1, 1, 1, 0, 1, n=5),
    ConvProblem(9, 11, 96, 48, 3, 3, 1, 1, 1, n=2),
    ConvProblem(12, 10, 40, 72, 3, 5, (2, 1), (1, 2), (2, 1), n=2),
    ConvProblem(8, 8, 136, 64, 3, 3, 1, 1, 1, n=3),
]


@pytest.mark.parametrize("problem", CHANNEL_TAIL_SHAPES, ids=lambda p: p.describe().replace(" ", "_"))
@pytest.mark.parametrize("plan", TMA_PLANS, ids=lambda p: p.brief().replace(" ", "_"))
def test_tma_channel_tail_exact_tier(problem, plan):
    res = run_pass(problem, Pass.FPROP, _seed("tma-tail", problem, plan), out_dtype="float32", bias=True, plan=plan,
                   exact=True)
    check(res, "float32", exact=True, what=f"fprop {problem.describe()} {plan.brief()}")


@pytest.mark.parametrize("problem", CHANNEL_TAIL_SHAPES, ids=lambda p: p.describe().replace(" ", "_"))
@pytest.mark.parametrize("plan", PERSISTENT_PLANS, ids=lambda p: p.brief().replace(" ", "_"))
def test_tma_persistent_channel_tail_exact_tier(problem, plan, one_sm):
    res = run_pass(problem, Pass.FPROP, _seed("tma-tail-persistent", problem, plan), out_dtype="float32",
                   bias=True, plan=plan, exact=True)
    check(res, "float32", exact=True, what=f"fprop {problem.describe()} {plan.brief()} on one SM")


@pytest.mark.parametrize("plan", [PERSISTENT_PLANS[0], PERSISTENT_PLANS[5]], ids=lambda p: p.brief().replace(" ", "_"))
def test_tma_persistent_grid_walks_a_real_layer(plan):
    """A layer of 7 to 8 tiles per SM on the whole GPU, normal data through fp16 with ReLU."""
    problem = ConvProblem(56, 56, 64, 128, 3, 3, 1, 1, 1, n=40)
    res = run_pass(problem, Pass.FPROP, _seed("tma-persistent-big"), bias=True, relu=True, plan=plan)
    check(res, "float16", what=f"fprop {problem.describe()} {plan.brief()}")


# dgrad's TMA loop: per stride residue class, dy's im2col under the class's flipped
# sub-filter, so each map's corners come from (its taps' reach - its offset); w as an
# N-major 3-D tensor.  The shapes vary the flipped padding on each axis (negative where
# padding exceeds the reach), K tails (zeros past K in dy and w), C that is not a whole box,
# dilation, and strides: classes of unequal taps and sizes, and classes no tap reaches.
DGRAD_SHAPES = [
    ConvProblem(9, 11, 16, 64, 3, 3, 1, 1, 1, n=3),                  # M tail; C < one 64-channel box
    ConvProblem(14, 14, 72, 128, 1, 1, 1, 0, 1, n=2),                # pointwise; C tail of 72
    ConvProblem(15, 13, 48, 72, 3, 5, 1, (1, 2), (2, 1), n=2),       # H/W differ; K tail of 72
    ConvProblem(12, 10, 24, 64, 3, 2, 1, (0, 1), (1, 2), n=2),       # no padding on H
    ConvProblem(9, 9, 32, 64, 7, 7, 1, 3, 1, n=2),                   # 7x7
    ConvProblem(8, 8, 136, 192, 3, 3, 1, 1, 1, n=5),                 # three filter steps per tap
    ConvProblem(7, 7, 64, 64, 3, 3, 1, 2, 2, n=3),                   # dilation 2, padding 2
    ConvProblem(10, 9, 64, 64, 3, 1, 1, (3, 0), 1, n=2),             # padding past the reach: corner < 0
    ConvProblem(14, 14, 64, 128, 3, 3, 2, 1, 1, n=3),                # stride 2: classes of 4, 2, 2, 1 taps
    ConvProblem(13, 11, 40, 72, 3, 3, 2, 1, 1, n=2),                 # odd H, W: classes of unequal sizes
    ConvProblem(16, 15, 64, 136, 1, 1, 2, 0, 1, n=3),                # 1x1 stride 2: three classes all zeros
    ConvProblem(24, 24, 64, 64, 1, 1, 3, 0, 1, n=4),                 # 1x1 stride 3: 16 tiles in a row no tap reaches
    ConvProblem(15, 13, 48, 72, 3, 5, (2, 3), (1, 2), (2, 1), n=2),  # stride (2, 3), dilation (2, 1)
    ConvProblem(9, 9, 32, 64, 7, 7, 2, 3, 1, n=2),                   # a stem's 7x7 stride 2
    ConvProblem(10, 10, 16, 64, 2, 2, 3, 0, 1, n=2),                 # stride 3 past a 2x2 filter
    ConvProblem(3, 16, 40, 32, 4, 1, 1, (2, 0), 1, n=3),             # K = 32, the narrowest dy it takes
]
DGRAD_PLANS = [p for p in TMA_PLANS if p.block_n % 64 == 0] + [Plan(64, 64, 64, 4, 1, 3, 8, 8, loop=TmaWgmma())]


@pytest.mark.parametrize("problem", DGRAD_SHAPES, ids=lambda p: p.describe().replace(" ", "_"))
@pytest.mark.parametrize("plan", DGRAD_PLANS, ids=lambda p: p.brief().replace(" ", "_"))
def test_tma_dgrad_exact_tier(problem, plan):
    """Integer data, bit for bit: the flipped taps, the flipped padding's zeros, the N-major
    B boxes the transposed descriptors read, and the tails past K and C."""
    res = run_pass(problem, Pass.DGRAD, _seed("tma-dgrad", problem, plan), out_dtype="float32", plan=plan,
                   exact=True)
    check(res, "float32", exact=True, what=f"dgrad {problem.describe()} {plan.brief()}")


# dgrad's persistent kernel walks one sequence of tiles through every residue class, the
# classes with the most taps first (classes no tap reaches among them: zeros, no stages).
PERSISTENT_DGRAD_PLANS = [p for p in PERSISTENT_PLANS if p.block_n % 64 == 0]


@pytest.mark.parametrize("problem", DGRAD_SHAPES, ids=lambda p: p.describe().replace(" ", "_"))
@pytest.mark.parametrize("plan", PERSISTENT_DGRAD_PLANS, ids=lambda p: p.brief().replace(" ", "_"))
def test_tma_persistent_dgrad_exact_tier(problem, plan, one_sm):
    res = run_pass(problem, Pass.DGRAD, _seed("tma-persistent-dgrad", problem, plan), out_dtype="float32",
                   plan=plan, exact=True)
    check(res, "float32", exact=True, what=f"dgrad {problem.describe()} {plan.brief()} on one SM")


# wgrad's TMA loop: dy's tiles (A, M-major) and x's im2col (B, N-major), both read
# transposed, the pixels split among slices.  The shapes vary what fprop's do (x's map is
# fprop's, 64 pixels a box), and K (M) tails and whole boxes past K (K = 24 with 128-row
# tiles), N tails (R*S*C not a whole tile: the last box repeats, never stored), and pixel
# counts that leave a slice's last step part-empty, or a slice with no steps at all.
WGRAD_SHAPES = [
    ConvProblem(9, 11, 64, 16, 3, 3, 1, 1, 1, n=3),                  # 297 pixels; K < 64
    ConvProblem(14, 14, 128, 72, 1, 1, 1, 0, 1, n=2),                # pointwise; K tail of 72
    ConvProblem(16, 15, 64, 40, 1, 1, 2, 0, 1, n=3),                 # strided 1x1
    ConvProblem(15, 13, 64, 48, 3, 5, (2, 1), (1, 2), (2, 1), n=2),  # every H/W pair differs
    ConvProblem(12, 10, 64, 24, 3, 2, (1, 3), (0, 1), (1, 2), n=2),
    ConvProblem(9, 9, 64, 32, 7, 7, 2, 3, 1, n=2),                   # 7x7 stride 2
    ConvProblem(8, 8, 192, 136, 3, 3, 1, 1, 1, n=5),                 # 1,728 columns; three boxes per tap
    ConvProblem(7, 7, 64, 64, 3, 3, 1, 2, 2, n=3),                   # dilation 2, padding 2
]
WGRAD_PLANS = [
    Plan(128, 256, 64, 8, 1, 4, 8, 8, split_k=3, loop=TmaWgmma()),
    Plan(128, 128, 64, 8, 1, 5, 8, 8, loop=TmaWgmma()),
    Plan(64, 128, 64, 4, 1, 6, 8, 8, split_k=7, loop=TmaWgmma()),   # 7 slices of few steps: some empty
    Plan(64, 64, 64, 4, 1, 3, 8, 8, split_k=2, loop=TmaWgmma()),
    Plan(128, 192, 64, 8, 1, 5, 8, 8, split_k=3, loop=TmaWgmma()),  # three boxes of x a stage
]


@pytest.mark.parametrize("problem", WGRAD_SHAPES, ids=lambda p: p.describe().replace(" ", "_"))
@pytest.mark.parametrize("plan", WGRAD_PLANS, ids=lambda p: p.brief().replace(" ", "_"))
def test_tma_wgrad_exact_tier(problem, plan):
    """Integer data, bit for bit, dW and db: every pixel x's map gathers, the transposed
    descriptors of both operands, the db warps' reads through the swizzle, and the slices."""
    res = run_pass(problem, Pass.WGRAD, _seed("tma-wgrad", problem, plan), out_dtype="float32", bias=True,
                   plan=plan, exact=True)
    check(res, "float32", exact=True, what=f"wgrad {problem.describe()} {plan.brief()}")


# A 1x1 wgrad whose C is not a whole number of boxes: the N tile's last box runs past C in x's
# channels and must read zeros there; a box wholly past C repeats the last (never stored).
# C under one box, a box and a tail, three and a tail of 8; stride 2; K tails.
WGRAD_TAIL_SHAPES = [
    ConvProblem(14, 14, 40, 72, 1, 1, 1, 0, 1, n=2),
    ConvProblem(9, 11, 112, 48, 1, 1, 1, 0, 1, n=3),
    ConvProblem(16, 15, 80, 64, 1, 1, 2, 0, 1, n=3),
    ConvProblem(7, 7, 200, 136, 1, 1, 1, 0, 1, n=5),
    ConvProblem(7, 7, 160, 960, 1, 1, 1, 0, 1, n=4),   # MobileNetV2's pw7-160to960, smaller batch
]


@pytest.mark.parametrize("problem", WGRAD_TAIL_SHAPES, ids=lambda p: p.describe().replace(" ", "_"))
@pytest.mark.parametrize("plan", WGRAD_PLANS, ids=lambda p: p.brief().replace(" ", "_"))
def test_tma_wgrad_channel_tail_exact_tier(problem, plan):
    res = run_pass(problem, Pass.WGRAD, _seed("tma-wgrad-tail", problem, plan), out_dtype="float32", bias=True,
                   plan=plan, exact=True)
    check(res, "float32", exact=True, what=f"wgrad {problem.describe()} {plan.brief()}")


# Grouped fprop: N tiles over every group's filters, each within one group, its boxes of x at
# the group's channels; one box a group and two (C/G = 128), K/G of 64 and 128 and 256 (one
# to four N tiles a group), 1x1 and strided, dilated filters, and the persistent and ping-pong
# kernels' tile walks (the tuner may pick them) as well as one block a tile.
GROUPED_FPROP_SHAPES = [
    ConvProblem(9, 11, 128, 128, 3, 3, 1, 1, 1, 2, n=3),
    ConvProblem(12, 10, 256, 256, 3, 3, 2, 1, 1, 2, n=2),
    ConvProblem(8, 8, 256, 512, 1, 1, 1, 0, 1, 2, n=5),
    ConvProblem(7, 9, 192, 384, 3, 2, (1, 2), (1, 0), (2, 1), 3, n=2),
]


def _grouped_cases(shapes, plans, pass_):
    from convgen.ir import Target
    from convgen.planner import check_plan

    for problem in shapes:
        for plan in plans:
            try:
                check_plan(plan, problem, pass_, Target("sm_90"), "float16")
            except ValueError:
                continue  # a tile whose filters would span two groups
            yield problem, plan


@pytest.mark.parametrize("problem,plan", list(_grouped_cases(GROUPED_FPROP_SHAPES, TMA_PLANS + PERSISTENT_PLANS,
                                                             Pass.FPROP)),
                         ids=lambda v: v.brief().replace(" ", "_") if hasattr(v, "brief") else v.describe().replace(" ", "_"))
def test_tma_grouped_fprop_exact_tier(problem, plan):
    res = run_pass(problem, Pass.FPROP, _seed("tma-fprop-grouped", problem, plan), out_dtype="float32", bias=True,
                   relu=True, plan=plan, exact=True)
    check(res, "float32", exact=True, what=f"fprop {problem.describe()} {plan.brief()}")


def test_tma_grouped_fprop_residual():
    problem = GROUPED_FPROP_SHAPES[1]
    res = run_pass(problem, Pass.FPROP, _seed("tma-fprop-grouped-res"), out_dtype="float32", bias=True, gelu=True,
                   residual=True, alpha=0.5, beta=2.0, plan=TMA_PLANS[1])
    check(res, "float32", what=f"fprop residual {problem.describe()}")


# Grouped wgrad: G GEMMs side by side along the grid's y, each reading its group's boxes of x
# (channels grp*C/G..) and dy (filters grp*K/G..) and writing its rows of dW, db and the
# split-K slices.  Groups of one box and of two (C/G = 128: two boxes a tap), K/G of 64 and
# 128 (one or two M tiles a group), 1x1 and 3x2 filters with stride and dilation, and split-K
# slices with few steps.
GROUPED_WGRAD_SHAPES = [
    ConvProblem(9, 11, 128, 128, 3, 3, 1, 1, 1, 2, n=3),
    ConvProblem(12, 10, 256, 128, 3, 3, 2, 1, 1, 2, n=2),
    ConvProblem(8, 8, 256, 256, 1, 1, 1, 0, 1, 4, n=5),
    ConvProblem(7, 9, 192, 384, 3, 2, (1, 2), (1, 0), (2, 1), 3, n=2),
]


@pytest.mark.parametrize("problem,plan", list(_grouped_cases(GROUPED_WGRAD_SHAPES, WGRAD_PLANS, Pass.WGRAD)),
                         ids=lambda v: v.brief().replace(" ", "_") if hasattr(v, "brief") else v.describe().replace(" ", "_"))
def test_tma_grouped_wgrad_exact_tier(problem, plan):
    res = run_pass(problem, Pass.WGRAD, _seed("tma-wgrad-grouped", problem, plan), out_dtype="float32", bias=True,
                   plan=plan, exact=True)
    check(res, "float32", exact=True, what=f"wgrad {problem.describe()} {plan.brief()}")


@pytest.mark.parametrize("out_dtype", ["float16", "float32"])
@pytest.mark.parametrize("relu", [False, True])
def test_tma_epilogues(out_dtype, relu):
    """Normal data through the fp16 and fp32 stores, with and without ReLU."""
    problem = ConvProblem(28, 28, 128, 128, 3, 3, 1, 1, 1, n=4)
    plan = TMA_PLANS[0]
    res = run_pass(problem, Pass.FPROP, _seed("tma-epi", out_dtype, relu), out_dtype=out_dtype, bias=True,
                   relu=relu, plan=plan)
    check(res, out_dtype, what=f"fprop {problem.describe()} {plan.brief()} relu={relu}")


def test_tma_maps_follow_the_buffers():
    """A prepared op gets new buffers each call (as a framework's allocator hands them out):
    each call's tensor maps must be the ones of its own arrays, including a buffer seen
    before, and a view that starts 16 bytes into an allocation.  (dgrad's maps go through
    the same cache.)"""
    import cupy as cp

    import convgen
    from convgen import reference

    problem = ConvProblem(10, 10, 64, 64, 3, 3, 1, 1, 1, n=2)
    op = convgen.prepare("fprop", problem.x_shape, problem.w_shape, padding=1, plan=TMA_PLANS[1])
    rng = _seed("tma-maps")
    xs = [rng.integers(-2, 3, size=problem.x_shape).astype(np.float16) for _ in range(3)]
    ws = [rng.integers(-2, 3, size=problem.w_shape).astype(np.float16) for _ in range(3)]
    dx = [cp.asarray(x) for x in xs]
    dw = [cp.asarray(w) for w in ws]
    padded = cp.zeros(xs[2].size + 8, dtype=cp.float16)  # xs[2] 16 bytes into its buffer
    padded[8:] = cp.asarray(xs[2]).ravel()
    dx[2] = padded[8:].reshape(problem.x_shape)
    for i in (0, 1, 0, 2, 1):
        y = cp.full(problem.y_shape, cp.nan, dtype=cp.float16)
        op(dx[i], dw[(i + 1) % 3], out=y)
        ref = reference.fprop(xs[i].astype(np.float64), ws[(i + 1) % 3].astype(np.float64), None, padding=1)
        np.testing.assert_array_equal(cp.asnumpy(y).astype(np.float64), ref.astype(np.float16).astype(np.float64),
                                      err_msg=f"call with x[{i}], w[{(i + 1) % 3}]")


def test_tma_dgrad_maps_follow_the_buffers():
    """dgrad's two maps (dy's im2col, w's 3-D tiles) per call's arrays, as fprop's."""
    import cupy as cp

    import convgen
    from convgen import reference

    problem = ConvProblem(10, 10, 64, 64, 3, 3, 1, 1, 1, n=2)
    op = convgen.prepare("dgrad", problem.x_shape, problem.w_shape, padding=1, plan=DGRAD_PLANS[-1])
    rng = _seed("tma-dgrad-maps")
    dys = [rng.integers(-2, 3, size=problem.y_shape).astype(np.float16) for _ in range(2)]
    ws = [rng.integers(-2, 3, size=problem.w_shape).astype(np.float16) for _ in range(2)]
    ddy, dw = [cp.asarray(a) for a in dys], [cp.asarray(a) for a in ws]
    for i, j in ((0, 0), (1, 0), (0, 1), (1, 1)):
        dx = cp.full(problem.x_shape, cp.nan, dtype=cp.float16)
        op(ddy[i], dw[j], out=dx)
        ref = reference.dgrad(dys[i].astype(np.float64), ws[j].astype(np.float64), problem.x_shape, padding=1)
        np.testing.assert_array_equal(cp.asnumpy(dx).astype(np.float64), ref.astype(np.float16).astype(np.float64),
                                      err_msg=f"call with dy[{i}], w[{j}]")


@st.composite
def tma_problems(draw, c=st.integers(1, 3).map(lambda i: 64 * i), k=st.integers(1, 160), max_stride: int = 3):
    """Layers the TMA loop runs: fprop's and wgrad's C in whole 64-channel boxes (the
    default), dgrad's C and K in 16-byte runs (tma_dgrad_problems)."""
    n = draw(st.integers(1, 6))
    r, s = draw(st.integers(1, 5)), draw(st.integers(1, 5))
    stride = (draw(st.integers(1, max_stride)), draw(st.integers(1, max_stride)))
    pad = (draw(st.integers(0, 3)), draw(st.integers(0, 3)))
    dil = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    reach_h, reach_w = (r - 1) * dil[0] + 1, (s - 1) * dil[1] + 1
    h = draw(st.integers(max(1, reach_h - 2 * pad[0]), 20))
    w = draw(st.integers(max(1, reach_w - 2 * pad[1]), 20))
    return ConvProblem(h, w, draw(c), draw(k), r, s, stride, pad, dil, n=n)


EIGHTS = st.integers(1, 24).map(lambda i: 8 * i)  # 8..192 in 16-byte runs


def tma_dgrad_problems():  # K from the narrowest dy the loop takes (tma_rules.MIN_DGRAD_K)
    return tma_problems(c=EIGHTS, k=st.integers(4, 24).map(lambda i: 8 * i), max_stride=2)  # (stride 3 in the exact tier: 9 classes compile slowly)


@given(problem=tma_problems(), plan=st.sampled_from(TMA_PLANS + PERSISTENT_PLANS), seed=st.integers(0, 2**32 - 1))
def test_fuzz_tma(problem, plan, seed):
    res = run_pass(problem, Pass.FPROP, np.random.default_rng(seed), plan=plan, bias=True, relu=True)
    check(res, "float16", what=f"fprop {problem.describe()} {plan.brief()}")


@st.composite
def pointwise_problems(draw):
    """1x1 fprop with C of 32 to 240 in 16-byte runs (whole 64-channel boxes and tails alike),
    strides up to 3 (the map's traversal stride), images and batches with tiles' tails."""
    stride = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    return ConvProblem(draw(st.integers(1, 20)), draw(st.integers(1, 20)), draw(st.integers(4, 30)) * 8,
                       draw(st.integers(1, 160)), 1, 1, stride, 0, 1, n=draw(st.integers(1, 6)))


@given(problem=pointwise_problems(), plan=st.sampled_from(TMA_PLANS + PERSISTENT_PLANS), seed=st.integers(0, 2**32 - 1))
def test_fuzz_tma_pointwise_channel_tails(problem, plan, seed):
    res = run_pass(problem, Pass.FPROP, np.random.default_rng(seed), plan=plan, bias=True, relu=True)
    check(res, "float16", what=f"fprop {problem.describe()} {plan.brief()}")


@given(problem=tma_problems(c=st.integers(4, 30).map(lambda i: 8 * i)), plan=st.sampled_from(TMA_PLANS + PERSISTENT_PLANS),
       seed=st.integers(0, 2**32 - 1))
def test_fuzz_tma_channel_tails(problem, plan, seed):
    """Any filter, stride, padding and dilation, C of 32 to 240 in 16-byte runs."""
    res = run_pass(problem, Pass.FPROP, np.random.default_rng(seed), plan=plan, bias=True, relu=True)
    check(res, "float16", what=f"fprop {problem.describe()} {plan.brief()}")


@given(problem=tma_problems(k=st.integers(1, 20).map(lambda i: 8 * i)), plan=st.sampled_from(WGRAD_PLANS), bias=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_fuzz_tma_wgrad(problem, plan, bias, seed):
    res = run_pass(problem, Pass.WGRAD, np.random.default_rng(seed), plan=plan, bias=bias)
    check(res, "float16", what=f"wgrad {problem.describe()} {plan.brief()} bias={bias}")


@st.composite
def pointwise_wgrad_problems(draw):
    """1x1 wgrad with C of 32 to 240 and K of 8 to 160, both in 16-byte runs."""
    stride = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    return ConvProblem(draw(st.integers(1, 20)), draw(st.integers(1, 20)), draw(st.integers(4, 30)) * 8,
                       draw(st.integers(1, 20)) * 8, 1, 1, stride, 0, 1, n=draw(st.integers(1, 6)))


@given(problem=pointwise_wgrad_problems(), plan=st.sampled_from(WGRAD_PLANS), bias=st.booleans(),
       seed=st.integers(0, 2**32 - 1))
def test_fuzz_tma_wgrad_channel_tails(problem, plan, bias, seed):
    res = run_pass(problem, Pass.WGRAD, np.random.default_rng(seed), plan=plan, bias=bias)
    check(res, "float16", what=f"wgrad {problem.describe()} {plan.brief()} bias={bias}")


@st.composite
def grouped_tma_problems(draw):
    """Grouped layers fprop's and wgrad's TMA kernels run: 2 to 4 groups of 64 or 128 channels
    and 64 or 128 filters, any filter, stride, padding and dilation."""
    g = draw(st.integers(2, 4))
    base = draw(tma_problems(c=st.just(64), k=st.just(64)))
    return dataclasses.replace(base, c=g * draw(st.sampled_from([64, 128])), k=g * draw(st.sampled_from([64, 128])),
                               groups=g)


GROUPED_FPROP_FUZZ_PLANS = [Plan(64, 64, 64, 4, 1, 6, 8, 8, loop=TmaWgmma()),
                            Plan(128, 64, 64, 8, 1, 6, 8, 8, loop=TmaWgmma(persistent=True))]


@given(problem=grouped_tma_problems(), plan=st.sampled_from(GROUPED_FPROP_FUZZ_PLANS), seed=st.integers(0, 2**32 - 1))
def test_fuzz_tma_grouped_fprop(problem, plan, seed):
    res = run_pass(problem, Pass.FPROP, np.random.default_rng(seed), plan=plan, bias=True, relu=True)
    check(res, "float16", what=f"fprop {problem.describe()} {plan.brief()}")


@given(problem=grouped_tma_problems(), bias=st.booleans(), split=st.sampled_from([1, 2, 5]),
       seed=st.integers(0, 2**32 - 1))
def test_fuzz_tma_grouped_wgrad(problem, bias, split, seed):
    plan = Plan(64, 128, 64, 4, 1, 4, 8, 8, split_k=split, loop=TmaWgmma())
    res = run_pass(problem, Pass.WGRAD, np.random.default_rng(seed), plan=plan, bias=bias)
    check(res, "float16", what=f"wgrad {problem.describe()} {plan.brief()} bias={bias}")


@given(problem=tma_dgrad_problems(), plan=st.sampled_from(DGRAD_PLANS + PERSISTENT_DGRAD_PLANS), seed=st.integers(0, 2**32 - 1))
def test_fuzz_tma_dgrad(problem, plan, seed):
    res = run_pass(problem, Pass.DGRAD, np.random.default_rng(seed), plan=plan)
    check(res, "float16", what=f"dgrad {problem.describe()} {plan.brief()}")
