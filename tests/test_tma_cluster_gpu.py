"""The TMA loop's thread-block clusters (TmaWgmma.cluster = 2: fprop, stride-1 dgrad) on the GPU, against the
float64 reference.  Two blocks side by side along M each copy half of every stage's weight
tile and multicast it into both, so the shapes make the last cluster hold a block past the
last M tile (an odd number of tiles), K tails (half a tile past K), channel tails (the 3-D
weight map) and groups; outputs are poisoned (NaN) before every launch.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from convgen.ir import ConvProblem, Pass
from convgen.mainloop import TmaWgmma
from convgen.spec import Plan

from gpu_helpers import check_exact_fp32, check_tma_fprop_fuzz_case, check_tma_fprop_on_real_layers, plan_id

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("poison_outputs", "sm90_only")]


SHAPES = [
    ConvProblem(9, 11, 64, 16, 3, 3, 1, 1, 1, n=3),                  # 297 pixels: 3 or 5 M tiles, one past them
    ConvProblem(14, 14, 128, 72, 1, 1, 1, 0, 1, n=2),                # pointwise; K tail of 72
    ConvProblem(15, 13, 64, 48, 3, 5, (2, 1), (1, 2), (2, 1), n=2),  # every H/W pair differs
    ConvProblem(8, 8, 192, 136, 3, 3, 1, 1, 1, n=5),                 # three channel steps a tap; K tail
    ConvProblem(9, 11, 96, 48, 3, 3, 1, 1, 1, n=2),                  # a channel tail: w as (C, R*S, K)
    ConvProblem(12, 10, 40, 72, 3, 5, (2, 1), (1, 2), (2, 1), n=2),  # C below one box, strided, dilated
]
PLANS = [
    Plan(128, 256, 64, 8, 1, 4, 8, 8, loop=TmaWgmma(cluster=2)),
    Plan(64, 48, 64, 4, 1, 2, 8, 8, loop=TmaWgmma(cluster=2)),      # a ring of 2; parts of 24 filters
]
# persistent on a one-SM target: one cluster of two blocks walks every run of two M tiles
PERSISTENT = [
    Plan(128, 128, 64, 8, 1, 5, 8, 8, loop=TmaWgmma(persistent=True, cluster=2)),
    Plan(64, 64, 64, 4, 1, 3, 8, 8, loop=TmaWgmma(persistent=True, cluster=2)),
    Plan(128, 128, 64, 8, 1, 3, 8, 8, loop=TmaWgmma(persistent=True, pingpong=True, cluster=2)),
    Plan(128, 64, 64, 8, 1, 2, 8, 8, loop=TmaWgmma(persistent=True, pingpong=True, cluster=2)),
]


@pytest.mark.parametrize("problem", SHAPES, ids=plan_id)
@pytest.mark.parametrize("plan", PLANS, ids=plan_id)
def test_cluster_exact_tier(problem, plan):
    check_exact_fp32(problem, Pass.FPROP, plan, "cluster")


@pytest.mark.parametrize("problem", SHAPES, ids=plan_id)
@pytest.mark.parametrize("plan", PERSISTENT, ids=plan_id)
def test_cluster_persistent_exact_tier(problem, plan, one_sm):
    check_exact_fp32(problem, Pass.FPROP, plan, "cluster-persistent", " on one SM")


@pytest.mark.parametrize("plan", [PLANS[0], PERSISTENT[0], PERSISTENT[2]], ids=plan_id)
def test_cluster_grid_walks_a_real_layer(plan):
    """Several tiles an SM on the whole GPU, normal data through fp16 with ReLU; 8 groups of 64."""
    check_tma_fprop_on_real_layers(plan, "cluster-big")


# dgrad at stride 1: dx's tiles an odd count (a block past them still copies its parts of B),
# filter tails (half a box past K), persistent and ping-pong on one SM
DGRAD_SHAPES = [
    ConvProblem(9, 11, 64, 40, 3, 3, 1, 1, 1, n=3),
    ConvProblem(10, 9, 128, 72, 3, 5, 1, (1, 2), (1, 2), n=2),
    ConvProblem(14, 14, 192, 136, 1, 1, 1, 0, 1, n=3),
]
DGRAD_PLANS = [
    Plan(128, 64, 64, 8, 1, 3, 8, 8, loop=TmaWgmma(cluster=2)),
    Plan(64, 128, 64, 4, 1, 3, 8, 8, loop=TmaWgmma(persistent=True, cluster=2)),
    Plan(128, 64, 64, 8, 1, 3, 8, 8, loop=TmaWgmma(persistent=True, pingpong=True, cluster=2)),
]


@pytest.mark.parametrize("problem", DGRAD_SHAPES, ids=plan_id)
@pytest.mark.parametrize("plan", DGRAD_PLANS, ids=plan_id)
def test_cluster_dgrad_exact_tier(problem, plan, one_sm):
    check_exact_fp32(problem, Pass.DGRAD, plan, "cluster-dgrad", " on one SM")


@given(h=st.integers(3, 20), w=st.integers(3, 20), c=st.integers(1, 3).map(lambda i: 64 * i), k=st.integers(1, 160),
       r=st.integers(1, 3), s=st.integers(1, 3), stride=st.integers(1, 2), n=st.integers(1, 4),
       plan=st.sampled_from(PLANS + PERSISTENT[:1] + PERSISTENT[2:3]), seed=st.integers(0, 2**32 - 1))
def test_fuzz_cluster(h, w, c, k, r, s, stride, n, plan, seed):
    check_tma_fprop_fuzz_case(h, w, c, k, r, s, stride, n, plan, seed)
