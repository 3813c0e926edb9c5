"""The TMA halo loop (TmaHalo) on the GPU, against the float64 reference.

What the kernel gets from the host and its own index arithmetic, each varied on its own:
the halo box's corner (one pixel up and left of the tile, negative at the image's top and
left edges: the copy engine's zeros are the padding), tiles that run past the image's last
row and column (their positions must not be stored), positions between rows (a tile's
last two columns on the pitch, never stored), the persistent walk (the ring's slots and
parities carried over many tiles, on a one-SM grid), dgrad's flipped and transposed
weights, and fprop's epilogue (bias, ReLU, residual, fp32 output, bf16).  Outputs are
poisoned (NaN) before every launch, so a position the kernel forgets fails.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from convgen import tma_halo
from convgen.footprint import smem_bytes
from convgen.ir import ConvProblem, Pass, Target
from convgen.mainloop import TMA_HALO_PITCHES

from gpu_helpers import check, run_pass, seeded

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("poison_outputs", "sm90_only")]


def _layer(h: int, w: int, n: int, c: int = 64, k: int = 64) -> ConvProblem:
    return ConvProblem(h, w, c, k, 3, 3, 1, 1, 1, n=n)


SHAPES = [
    _layer(13, 37, 3),   # row and column tails at every pitch (37 > 30: two tiles across on pitch 32)
    _layer(1, 1, 2),     # one pixel: every tap but the centre reads the padding
    _layer(7, 130, 1),   # wider than pitch 128's 126 outputs
    _layer(9, 5, 5),     # narrow: most positions of every tile are past the image
    _layer(16, 62, 2),   # exactly 62 wide (pitch 64's row) and a whole number of 4-row tiles
]
# every pitch and ring that fits the SM's shared memory (pitch 128's ring of 3 does not: the checker refuses it)
PLANS = [p for p in (tma_halo.make(pitch, ring) for pitch in TMA_HALO_PITCHES for ring in (2, 3, 4))
         if smem_bytes(p, Pass.FPROP) <= Target("sm_90").smem_limit]
IDS = dict(ids=lambda p: p.brief().replace(" ", "_"))


@pytest.mark.parametrize("pass_", [Pass.FPROP, Pass.DGRAD])
@pytest.mark.parametrize("problem", SHAPES, ids=lambda p: p.describe().replace(" ", "_"))
@pytest.mark.parametrize("plan", PLANS, **IDS)
def test_tma_halo_exact_tier(problem, plan, pass_):
    """Integer data, bit for bit (fprop with a bias): every tap's halo row offset, the
    padding's zeros, the swizzle, dgrad's flipped taps and transposed B, the stored positions."""
    res = run_pass(problem, pass_, seeded("tma-halo", problem, plan, pass_.value), out_dtype="float32",
                   bias=pass_ is Pass.FPROP, plan=plan, exact=True)
    check(res, "float32", exact=True, what=f"{pass_.value} {problem.describe()} {plan.brief()}")


@pytest.mark.parametrize("pass_", [Pass.FPROP, Pass.DGRAD])
@pytest.mark.parametrize("plan", [PLANS[0], PLANS[4], PLANS[-1]], **IDS)
def test_tma_halo_persistent_on_one_sm(plan, pass_, one_sm):
    problem = _layer(13, 37, 3)
    res = run_pass(problem, pass_, seeded("tma-halo-one-sm", plan, pass_.value), out_dtype="float32",
                   bias=pass_ is Pass.FPROP, plan=plan, exact=True)
    check(res, "float32", exact=True, what=f"{pass_.value} {problem.describe()} {plan.brief()} on one SM")


# Outputs of more than 64 channels as slices of 64 (a block's weights one slice, the grid whole
# sets of slices): fprop's K and dgrad's C of 128 and 192, on the whole GPU and on one SM.
SLICED = [(Pass.FPROP, _layer(13, 37, 3, k=128)), (Pass.FPROP, _layer(9, 70, 2, k=192)),
          (Pass.DGRAD, _layer(13, 37, 3, c=128)), (Pass.DGRAD, _layer(9, 70, 2, c=192))]


@pytest.mark.parametrize("pass_, problem", SLICED, ids=lambda v: getattr(v, "value", None) or v.describe().replace(" ", "_"))
@pytest.mark.parametrize("plan", [PLANS[0], PLANS[4]], **IDS)
@pytest.mark.parametrize("sms", ["all", "one"])
def test_tma_halo_slices_exact_tier(pass_, problem, plan, sms, request):
    if sms == "one":
        request.getfixturevalue("one_sm")
    res = run_pass(problem, pass_, seeded("tma-halo-sliced", problem, plan, pass_.value, sms), out_dtype="float32",
                   bias=pass_ is Pass.FPROP, plan=plan, exact=True)
    check(res, "float32", exact=True, what=f"{pass_.value} {problem.describe()} {plan.brief()} ({sms} SMs)")


@pytest.mark.parametrize("pass_", [Pass.FPROP, Pass.DGRAD])
def test_tma_halo_is_the_default_on_a_real_layer(pass_):
    """ResNet's 56x56 64 -> 64 layer, normal data through fp16: the planner's own plan."""
    from convgen.compile import detect_target
    from convgen.planner import plan as default_plan

    problem = _layer(56, 56, 8)
    assert isinstance(default_plan(problem, pass_, detect_target()).loop, tma_halo.TmaHalo)
    res = run_pass(problem, pass_, seeded("tma-halo-real", pass_.value), bias=pass_ is Pass.FPROP,
                   relu=pass_ is Pass.FPROP)
    check(res, "float16", what=f"{pass_.value} {problem.describe()}")


@pytest.mark.parametrize("plan", [PLANS[1], PLANS[5]], **IDS)
def test_tma_halo_residual_and_bf16(plan):
    problem = _layer(13, 37, 3)
    res = run_pass(problem, Pass.FPROP, seeded("tma-halo-residual", plan), bias=True, relu=True, residual=True,
                   alpha=0.5, beta=2.0, plan=plan)
    check(res, "float16", what=f"fprop residual {problem.describe()} {plan.brief()}")
    for pass_ in (Pass.FPROP, Pass.DGRAD):
        bf = tma_halo.make(plan.loop.pitch, plan.stages, "bfloat16")
        res = run_pass(problem, pass_, seeded("tma-halo-bf16", plan, pass_.value), in_dtype="bfloat16",
                       out_dtype="bfloat16", plan=bf)
        check(res, "bfloat16", what=f"bf16 {pass_.value} {problem.describe()} {bf.brief()}")


@given(h=st.integers(1, 70), w=st.integers(1, 140), n=st.integers(1, 6), plan=st.sampled_from(PLANS),
       pass_=st.sampled_from([Pass.FPROP, Pass.DGRAD]), out=st.sampled_from([64, 128, 192]),
       epilogue=st.sampled_from(["none", "bias-relu", "residual"]), seed=st.integers(0, 2**32 - 1))
def test_fuzz_tma_halo(h, w, n, plan, pass_, out, epilogue, seed):
    """Any image size (the tiles' row and column tails at every pitch, images narrower and
    shorter than a tile), any batch, either pass, 1-3 slices of output channels, fprop's
    epilogues, normal data through fp16."""
    problem = _layer(h, w, n, k=out) if pass_ is Pass.FPROP else _layer(h, w, n, c=out)
    fprop = pass_ is Pass.FPROP
    res = run_pass(problem, pass_, np.random.default_rng(seed), plan=plan, bias=fprop and epilogue != "none",
                   relu=fprop and epilogue == "bias-relu", residual=fprop and epilogue == "residual", beta=0.5)
    check(res, "float16", what=f"{pass_.value} {problem.describe()} {plan.brief()} {epilogue}")
