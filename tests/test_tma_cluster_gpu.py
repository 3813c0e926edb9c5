"""The TMA loop's thread-block clusters (TmaWgmma.cluster = 2, fprop) on the GPU, against the
float64 reference.  Two blocks side by side along M each copy half of every stage's weight
tile and multicast it into both, so the shapes make the last cluster hold a block past the
last M tile (an odd number of tiles), K tails (half a tile past K), channel tails (the 3-D
weight map) and groups; outputs are poisoned (NaN) before every launch.
"""

from __future__ import annotations

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


def _ids(v):
    return v.brief().replace(" ", "_") if hasattr(v, "brief") else v.describe().replace(" ", "_")


@pytest.mark.parametrize("problem", SHAPES, ids=_ids)
@pytest.mark.parametrize("plan", PLANS, ids=_ids)
def test_cluster_exact_tier(problem, plan):
    res = run_pass(problem, Pass.FPROP, _seed("cluster", problem, plan), out_dtype="float32", bias=True, plan=plan,
                   exact=True)
    check(res, "float32", exact=True, what=f"fprop {problem.describe()} {plan.brief()}")


@pytest.mark.parametrize("problem", SHAPES, ids=_ids)
@pytest.mark.parametrize("plan", PERSISTENT, ids=_ids)
def test_cluster_persistent_exact_tier(problem, plan, one_sm):
    res = run_pass(problem, Pass.FPROP, _seed("cluster-persistent", problem, plan), out_dtype="float32", bias=True,
                   plan=plan, exact=True)
    check(res, "float32", exact=True, what=f"fprop {problem.describe()} {plan.brief()} on one SM")


@pytest.mark.parametrize("plan", [PLANS[0], PERSISTENT[0], PERSISTENT[2]], ids=_ids)
def test_cluster_grid_walks_a_real_layer(plan):
    """Several tiles an SM on the whole GPU, normal data through fp16 with ReLU; 8 groups of 64."""
    for problem in (ConvProblem(56, 56, 64, 128, 3, 3, 1, 1, 1, n=40), ConvProblem(14, 14, 512, 512, 3, 3, 1, 1, 1, 8, n=16)):
        if problem.groups > 1 and plan.block_n > 64:
            plan = Plan(128, 64, 64, 8, 1, 4, 8, 8, loop=plan.loop)
        res = run_pass(problem, Pass.FPROP, _seed("cluster-big", problem), bias=True, relu=True, plan=plan)
        check(res, "float16", what=f"fprop {problem.describe()} {plan.brief()}")


@given(h=st.integers(3, 20), w=st.integers(3, 20), c=st.integers(1, 3).map(lambda i: 64 * i), k=st.integers(1, 160),
       r=st.integers(1, 3), s=st.integers(1, 3), stride=st.integers(1, 2), n=st.integers(1, 4),
       plan=st.sampled_from(PLANS + PERSISTENT[:1] + PERSISTENT[2:3]), seed=st.integers(0, 2**32 - 1))
def test_fuzz_cluster(h, w, c, k, r, s, stride, n, plan, seed):
    k = -(-k // 8) * 8
    problem = ConvProblem(h, w, c, k, r, s, stride, r // 2, 1, n=n)
    res = run_pass(problem, Pass.FPROP, np.random.default_rng(seed), bias=True, plan=plan)
    check(res, "float16", what=f"fprop {problem.describe()} {plan.brief()}")
