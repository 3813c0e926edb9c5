"""The main loops other than the default im2col on a real GPU, against the float64 reference:
the halo path (tuning's candidates, hand plans, every candidate of the suites' layers, drawn
plans), sliced K (warp grids that split every staged step) and wgmma (sm_90 only).  Tuning may
pick any of them for a layer, so each must hold to what the default loop holds to: bit for bit
in the exact tier on small integers, within tolerance on drawn cases, every output starting as
NaN.  The shapes, data and fixtures are tests/test_kernels_gpu.py's; skipped without a GPU."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, strategies as st

import convgen
from convgen.ir import ConvProblem, Pass
from convgen.spec import Plan
from convgen.mainloop import FlatHalo, HaloLdsm, HaloTile, Im2col, StagedHalo, Wgmma
from convgen.suites import SUITES

from gpu_helpers import check, run_pass

from test_kernels_gpu import EXACT_SHAPES, PASSES, _image, _seed, problems, target  # noqa: F401  (a fixture)

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("poison_outputs")]


# ------------------------------------------------------------------ the halo path (tuning candidates)
HALO_EXACT = [
    # (problem, block_m, block_n, block_k, warps_m, warps_n, stages, tile_w): an image narrower
    # than the tile, channels not a multiple of BK (zero tails), dilation and asymmetric
    # padding, a 5x5 filter, a tile row that straddles the right edge, 8 warps.
    (ConvProblem(8, 8, 40, 24, 3, 3, 1, 1, 1, n=3), 128, 32, 32, 4, 1, 3, 16),
    (ConvProblem(13, 37, 16, 24, 3, 2, 1, (2, 0), (2, 1), n=2), 128, 32, 16, 2, 2, 2, 32),
    (ConvProblem(11, 18, 32, 48, 5, 5, 1, 2, 1, n=2), 64, 32, 16, 2, 2, 2, 16),
    (ConvProblem(9, 20, 64, 64, 3, 3, 1, 1, 1, n=2), 256, 64, 32, 4, 2, 3, 32),
]


@pytest.mark.parametrize("pass_", [Pass.FPROP, Pass.DGRAD], ids=lambda p: p.value)
@pytest.mark.parametrize("case", HALO_EXACT, ids=lambda c: c[0].describe().replace(" ", "_"))
@pytest.mark.parametrize("split", [1, 2, 3])
def test_halo_exact_tier(case, pass_, split, target):
    """The halo path with integer data: bit for bit, whatever the split-K."""
    problem, bm, bn, bk, wm, wn, stages, tile_w = case
    plan = Plan(bm, bn, bk, wm, wn, stages, 8, 8, split_k=split, loop=HaloTile(tile_w))
    res = run_pass(problem, pass_, _seed("halo-exact", problem, pass_, split), out_dtype="float32",
                   bias=pass_ is Pass.FPROP, plan=plan, exact=True)
    check(res, "float32", exact=True, what=f"halo {pass_.value} split {split}")


# Hand plans for the halo paths' least-covered cases.  "narrow": dgrad whose dx channels are
# not a multiple of 8, so the weights move 1, 2 or 4 channels per access (C = 3 is the CIFAR
# first layers' case).  "staged": fprop with C not a multiple of 8, the staged-halo im2col
# path, at strides 1 to 3, with dilation, asymmetric padding, tiles past the image edge.
HALO_HAND = [
    ("narrow", Pass.DGRAD, ConvProblem(12, 20, 3, 32, 3, 3, 1, 1, 1, n=2), Plan(128, 16, 32, 4, 1, 2, 8, 1, loop=HaloTile(16))),
    ("narrow", Pass.DGRAD, ConvProblem(9, 17, 6, 24, 3, 3, 1, (1, 2), (1, 2), n=2),
     Plan(64, 16, 16, 2, 1, 2, 8, 2, loop=HaloTile(16))),
    ("narrow", Pass.DGRAD, ConvProblem(16, 33, 20, 48, 5, 3, 1, 2, 1, n=1), Plan(256, 32, 16, 4, 2, 3, 8, 4, loop=HaloTile(32))),
    ("staged", Pass.FPROP, ConvProblem(12, 20, 3, 32, 3, 3, 1, 1, 1, n=2), Plan(256, 32, 32, 4, 1, 3, 1, 1, loop=StagedHalo(16))),
    ("staged", Pass.FPROP, ConvProblem(30, 34, 3, 24, 7, 7, 2, 3, 1, n=2), Plan(128, 32, 32, 4, 1, 3, 1, 1, loop=StagedHalo(16))),
    ("staged", Pass.FPROP, ConvProblem(17, 23, 6, 16, 5, 3, (1, 3), (2, 0), (2, 1), n=2),
     Plan(128, 16, 32, 4, 1, 2, 2, 2, loop=StagedHalo(32))),
    ("staged", Pass.FPROP, ConvProblem(9, 40, 12, 40, 3, 3, 3, (0, 1), 1, n=3), Plan(64, 48, 32, 2, 1, 3, 4, 4, loop=StagedHalo(16))),
    # "flat": the batch as one padded grid (footprint.flat_grid).  8x8 images (CIFAR's last
    # stage); odd sizes with dilation and unequal padding; no padding; a narrow-weight
    # dgrad; and a dgrad whose padding exceeds the filter's reach (its grid starts inside dy).
    ("flat", Pass.DGRAD, ConvProblem(8, 8, 64, 128, 3, 3, 1, 1, 1, n=3), Plan(256, 64, 32, 4, 2, 3, 8, 8, loop=FlatHalo())),
    ("flat", Pass.FPROP, ConvProblem(7, 9, 16, 24, 3, 3, 1, (2, 1), (2, 1), n=2), Plan(128, 32, 16, 4, 1, 2, 8, 8, loop=FlatHalo())),
    ("flat", Pass.FPROP, ConvProblem(10, 6, 8, 8, 3, 3, 1, 0, 1, n=2), Plan(64, 16, 16, 2, 1, 2, 8, 8, loop=FlatHalo())),
    ("flat", Pass.DGRAD, ConvProblem(5, 13, 3, 16, 5, 3, 1, (1, 2), 1, n=3), Plan(64, 16, 16, 2, 1, 2, 8, 1, loop=FlatHalo())),
    ("flat", Pass.DGRAD, ConvProblem(6, 7, 8, 16, 2, 2, 1, (2, 1), 1, n=2), Plan(64, 16, 16, 2, 1, 2, 8, 8, loop=FlatHalo())),
    # "ldsm": 8-pixel-wide tiles, each fragment row read through its own ldmatrix address, so
    # a fragment spans two tile rows: an 8x8 image (one tile), 7x7 (a tile past the edge),
    # wider images (several tiles across, the last one partial), dilation, a narrow-weight
    # dgrad, 2 warps of two fragment rows, fprop's [BN][BK] and dgrad's [BK][BN] weights.
    ("ldsm", Pass.DGRAD, ConvProblem(8, 8, 64, 128, 3, 3, 1, 1, 1, n=3), Plan(64, 32, 16, 4, 1, 3, 8, 8, loop=HaloLdsm(8))),
    ("ldsm", Pass.FPROP, ConvProblem(8, 8, 64, 128, 3, 3, 1, 1, 1, n=3), Plan(64, 64, 16, 4, 1, 3, 8, 8, loop=HaloLdsm(8))),
    ("ldsm", Pass.DGRAD, ConvProblem(7, 7, 40, 32, 3, 3, 1, 1, 1, n=2), Plan(64, 16, 16, 4, 1, 2, 8, 8, loop=HaloLdsm(8))),
    ("ldsm", Pass.FPROP, ConvProblem(7, 7, 40, 32, 3, 3, 1, 1, 1, n=2), Plan(64, 32, 16, 2, 1, 2, 8, 8, loop=HaloLdsm(8))),
    ("ldsm", Pass.FPROP, ConvProblem(11, 19, 24, 40, 3, 3, 1, (2, 1), (2, 1), n=2), Plan(64, 48, 16, 4, 1, 2, 8, 8, loop=HaloLdsm(8))),
    ("ldsm", Pass.DGRAD, ConvProblem(12, 20, 3, 32, 3, 3, 1, 1, 1, n=2), Plan(64, 16, 16, 4, 1, 2, 8, 1, loop=HaloLdsm(8))),
    # "stacked": whole images stacked in one tall 8-wide tile (footprint.halo_images), the last
    # block's stack running past the batch: 2 and 4 8x8 images; 4 4x4 images (half of each
    # tile row past the image); 2 6x5 images of a dilated, unevenly padded filter.
    ("stacked", Pass.DGRAD, ConvProblem(8, 8, 64, 128, 3, 3, 1, 1, 1, n=3), Plan(128, 64, 16, 4, 1, 3, 8, 8, loop=HaloLdsm(8))),
    ("stacked", Pass.FPROP, ConvProblem(8, 8, 64, 128, 3, 3, 1, 1, 1, n=5), Plan(256, 64, 16, 8, 1, 3, 8, 8, loop=HaloLdsm(8))),
    ("stacked", Pass.DGRAD, ConvProblem(4, 4, 16, 32, 3, 3, 1, 1, 1, n=3), Plan(128, 16, 16, 4, 1, 2, 8, 8, loop=HaloLdsm(8))),
    ("stacked", Pass.FPROP, ConvProblem(6, 5, 24, 16, 3, 3, 1, (2, 1), (2, 1), n=3), Plan(96, 16, 16, 2, 1, 2, 8, 8, loop=HaloLdsm(8))),
]


# "tiles": several pixel tiles per block (one-step reductions), with a last block that gets
# fewer tiles than the others, and tiles past the image edge.
HALO_TILES = [
    ("tiles", Pass.FPROP, ConvProblem(20, 36, 32, 24, 3, 3, 1, 1, 1, n=3), Plan(256, 32, 32, 4, 1, 2, 8, 8, loop=HaloTile(16, 4))),
    ("tiles", Pass.DGRAD, ConvProblem(20, 36, 40, 32, 3, 3, 1, 1, 1, n=3), Plan(256, 48, 32, 4, 1, 2, 8, 8, loop=HaloTile(16, 4))),
    ("tiles", Pass.DGRAD, ConvProblem(13, 17, 3, 16, 3, 3, 1, (2, 1), (2, 1), n=2), Plan(128, 16, 16, 4, 1, 2, 8, 1, loop=HaloTile(16, 3))),
    ("tiles", Pass.FPROP, ConvProblem(9, 40, 16, 40, 5, 3, 1, 2, 1, n=1), Plan(128, 48, 16, 2, 1, 2, 8, 8, loop=HaloTile(32, 2))),
    ("flat-tiles", Pass.FPROP, ConvProblem(8, 8, 32, 24, 3, 3, 1, 1, 1, n=5), Plan(128, 32, 32, 4, 1, 2, 8, 8, loop=FlatHalo(3))),
    ("flat-tiles", Pass.DGRAD, ConvProblem(11, 6, 16, 16, 3, 3, 1, 1, 1, n=3), Plan(128, 16, 16, 4, 1, 2, 8, 8, loop=FlatHalo(2))),
    # 1x1 layers (tune's pointwise candidates): the tile is its own halo; a tile exactly N wide
    # (48 and 144 columns), a block's last tiles past the batch, dgrad's narrow dx channels.
    ("pointwise", Pass.FPROP, ConvProblem(13, 11, 16, 40, 1, 1, 1, 0, 1, n=3), Plan(128, 48, 16, 4, 3, 2, 8, 8, loop=FlatHalo(3))),
    ("pointwise", Pass.DGRAD, ConvProblem(9, 14, 144, 24, 1, 1, 1, 0, 1, n=2), Plan(128, 144, 32, 4, 3, 2, 8, 8, loop=FlatHalo(4))),
    ("pointwise", Pass.DGRAD, ConvProblem(7, 7, 6, 64, 1, 1, 1, 0, 1, n=5), Plan(256, 16, 64, 4, 1, 2, 8, 2, loop=FlatHalo(8))),
    ("pointwise", Pass.FPROP, ConvProblem(12, 12, 64, 256, 1, 1, 1, 0, 1, n=2), Plan(128, 256, 64, 4, 4, 2, 8, 8, loop=FlatHalo(2))),
]


@pytest.mark.parametrize("case,split", [(c, s) for c in HALO_HAND for s in (1, 2)] + [(c, 1) for c in HALO_TILES],
                         ids=lambda v: f"{v[0]}-{v[1].value}-" + v[2].describe().replace(" ", "_") if isinstance(v, tuple) else f"split{v}")
def test_halo_hand_plans_exact(case, split):
    """Integer data, bit for bit, with split-K 1 and 2 (a one-step reduction's second slice is empty)."""
    kind, pass_, problem, plan = case
    plan = dataclasses.replace(plan, split_k=split)
    res = run_pass(problem, pass_, _seed("halo-hand", kind, problem, split), out_dtype="float32",
                   bias=pass_ is Pass.FPROP, plan=plan, exact=True)
    check(res, "float32", exact=True, what=f"{kind} halo {pass_.value} C={problem.c} vec {plan.vec_a}/{plan.vec_b} split {split}")


def _halo_candidates():
    from convgen.tools import tune
    from convgen.ir import Target

    out = []
    for suite, names in (("cifar-resnet", None), ("cifar-vgg", None), ("resnet50", None), ("unet", ("dec1-cat96",))):
        for layer in SUITES[suite]:
            if names is not None and layer.name not in names:
                continue  # (UNet's dec1-cat96: N = 96, whose halo tiles exactly 96 wide the tuner also offers)
            for pass_ in (Pass.FPROP, Pass.DGRAD):
                for plan in tune.candidates(layer.problem, pass_, Target("sm_90")):
                    if plan.halo:
                        out.append(pytest.param(suite, layer, pass_, plan,
                                                id=f"{suite}/{layer.name}/{pass_.value}/{plan.explain().splitlines()[0]}"))
    return out


@pytest.mark.parametrize("suite,layer,pass_,plan", _halo_candidates())
def test_every_halo_candidate_matches_the_reference(suite, layer, pass_, plan, target):
    """Every halo plan `convgen tune` may pick for the suites, at a small batch, with the
    epilogue tune times them with (so a device run after `convgen tune` finds them compiled;
    the halo exact tiers and the fuzz cover ReLU)."""
    small = layer.problem.with_batch(2)
    res = run_pass(small, pass_, _seed("halo-cand", suite, layer.name, pass_, plan), plan=plan,
                   bias=pass_ is Pass.FPROP)
    check(res, "float16", what=f"halo {suite}/{layer.name} {pass_.value}")


@st.composite
def halo_cases(draw):
    """A shape one of the halo paths accepts, and one of the halo plans tune offers it."""
    from convgen.tools import tune

    n = draw(st.integers(1, 4))
    pointwise = draw(st.integers(0, 4)) == 0  # a 1x1 layer: tune's pointwise multi-tile candidates
    r, s = (1, 1) if pointwise else (draw(st.integers(2, 5)), draw(st.integers(1, 5)))
    pad = (0, 0) if pointwise else (draw(st.integers(0, 2)), draw(st.integers(0, 2)))
    dil = (1, 1) if pointwise else (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    h, w = _image(draw, r, s, pad, dil)
    pass_ = draw(st.sampled_from([Pass.FPROP, Pass.DGRAD]))
    # dgrad reduces over K in 16-byte runs ("taps" path), its C is free.  fprop with C in
    # multiples of 8 is the "taps" path (stride 1); any other C is the staged-halo im2col
    # path, at any stride.
    c = draw(st.integers(1, 80))
    k = 8 * draw(st.integers(1, 10)) if pass_ is Pass.DGRAD else draw(st.integers(1, 80))
    stride = (1, 1)
    if pass_ is Pass.FPROP and c % 8:
        stride = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    problem = ConvProblem(h, w, c, k, r, s, stride, pad, dil, n=n)
    from convgen.compile import detect_target

    from convgen.candidates import _pointwise_tile_candidates

    plans = (tune._halo_candidates(problem, pass_, detect_target(), "float16")
             + _pointwise_tile_candidates(problem, pass_, detect_target(), "float16"))
    plan = draw(st.sampled_from(plans)) if plans else None
    if plan is not None and plan.tiles == 1:  # a multi-tile block owns whole reductions
        plan = dataclasses.replace(plan, split_k=draw(st.sampled_from([1, 1, 2, 3])))
    return problem, pass_, plan


@given(case=halo_cases(), seed=st.integers(0, 2**32 - 1))
def test_fuzz_halo_plans(case, seed):
    """The halo path on shapes the suites never reach: tile edges, dilation, tails in C and K."""
    from hypothesis import assume

    problem, pass_, plan = case
    assume(plan is not None)
    res = run_pass(problem, pass_, np.random.default_rng(seed), plan=plan,
                   bias=pass_ is Pass.FPROP, relu=pass_ is Pass.FPROP)
    check(res, "float16", what=f"halo {pass_.value} {problem.describe()} {plan.explain().splitlines()[0]}")


# ---- sliced K: WARPS_K warp grids split every staged step, their sums meet in shared memory

SLICED_SHAPES = [EXACT_SHAPES[i] for i in (0, 2, 5, 6, 7)]


def _sliced(plan: Plan, warps_k: int, split: int = 1) -> Plan:
    return dataclasses.replace(plan, block_k=max(plan.block_k, 16 * warps_k), loop=Im2col(warps_k), split_k=split)


@pytest.mark.parametrize("pass_", PASSES, ids=lambda p: p.value)
@pytest.mark.parametrize("problem", SLICED_SHAPES, ids=lambda p: p.describe().replace(" ", "_"))
@pytest.mark.parametrize("warps_k,split", [(2, 1), (2, 3), (4, 1)])
def test_sliced_k_exact_tier(problem, pass_, warps_k, split, target):
    """Integer data: the slices' sums, added in the accumulator's layout, must give the
    reference bit for bit, with split-K on top and with four slices."""
    plan = _sliced(convgen.plan(problem, pass_, target), warps_k, split)
    res = run_pass(problem, pass_, _seed("sliced", problem, pass_, warps_k, split), out_dtype="float32",
                   bias=pass_ is not Pass.DGRAD, plan=plan, exact=True)
    check(res, "float32", exact=True, what=f"{pass_.value} warps_k {warps_k} split {split}")


@pytest.mark.parametrize("pass_", PASSES, ids=lambda p: p.value)
def test_sliced_k_scalar_fp32_gathers(pass_, target):
    problem = EXACT_SHAPES[4]
    plan = _sliced(convgen.plan(problem, pass_, target, "float32", scalar=True), 2)
    res = run_pass(problem, pass_, _seed("sliced-scalar", pass_), in_dtype="float32", out_dtype="float32",
                   bias=pass_ is not Pass.DGRAD, plan=plan, exact=True)
    check(res, "float32", exact=True, what=f"{pass_.value} scalar fp32-in warps_k 2")


@given(problem=problems(), pass_=st.sampled_from(PASSES), warps_k=st.sampled_from([2, 4]),
       split=st.sampled_from([1, 1, 2]), seed=st.integers(0, 2**32 - 1))
def test_fuzz_sliced_k(problem, pass_, warps_k, split, seed):
    from hypothesis import assume

    from convgen.compile import detect_target
    from convgen.planner import check_plan

    target = detect_target()
    plan = _sliced(convgen.plan(problem, pass_, target), warps_k, split)
    try:
        check_plan(plan, problem.geometry, pass_, target, "float16")
    except ValueError:  # e.g. four slices of a 128x128 tile's sums overflow shared memory
        assume(False)
    res = run_pass(problem, pass_, np.random.default_rng(seed), plan=plan, bias=pass_ is not Pass.DGRAD,
                   relu=pass_ is Pass.FPROP)
    check(res, "float16", what=f"{pass_.value} {problem.describe()} {plan.explain().splitlines()[0]}")


# ---- wgmma (sm_90a): warpgroup MMAs on core-matrix-staged operands

WGMMA_SHAPES = [EXACT_SHAPES[i] for i in (0, 2, 5, 6, 7)]  # C and K in 16-byte runs
WGMMA_PLANS = [Plan(64, 64, 32, 4, 1, 2, 8, 8, loop=Wgmma()), Plan(128, 64, 64, 4, 1, 3, 8, 8, loop=Wgmma()),
               Plan(128, 128, 64, 8, 1, 3, 8, 8, loop=Wgmma()), Plan(256, 32, 16, 8, 1, 4, 8, 8, loop=Wgmma())]


def _needs_sm90(target):
    if target.arch != "sm_90":
        pytest.skip(f"wgmma runs on sm_90 only; this GPU is {target.arch}")


@pytest.mark.parametrize("pass_", [Pass.FPROP, Pass.DGRAD], ids=lambda p: p.value)
@pytest.mark.parametrize("problem", WGMMA_SHAPES, ids=lambda p: p.describe().replace(" ", "_"))
@pytest.mark.parametrize("plan", WGMMA_PLANS, ids=lambda p: p.brief().replace(" ", "_"))
@pytest.mark.parametrize("split", [1, 3])
def test_wgmma_exact_tier(problem, pass_, plan, split, target):
    """Integer data, bit for bit: the descriptors' strides, the core-matrix staging (K-major A,
    fprop's K-major and dgrad's N-major B) and the accumulator layout the drain reads."""
    _needs_sm90(target)
    plan = dataclasses.replace(plan, split_k=split)
    res = run_pass(problem, pass_, _seed("wgmma", problem, pass_, plan), out_dtype="float32",
                   bias=pass_ is Pass.FPROP, plan=plan, exact=True)
    check(res, "float32", exact=True, what=f"{pass_.value} {plan.brief()}")


@given(problem=problems(), pass_=st.sampled_from([Pass.FPROP, Pass.DGRAD]), plan=st.sampled_from(WGMMA_PLANS),
       split=st.sampled_from([1, 1, 2]), seed=st.integers(0, 2**32 - 1))
def test_fuzz_wgmma(problem, pass_, plan, split, seed):
    from convgen.compile import detect_target

    target = detect_target()
    _needs_sm90(target)
    problem = dataclasses.replace(problem, c=8 * max(1, problem.c // 8), k=8 * max(1, problem.k // 8))
    plan = dataclasses.replace(plan, split_k=split)
    res = run_pass(problem, pass_, np.random.default_rng(seed), plan=plan, bias=pass_ is Pass.FPROP,
                   relu=pass_ is Pass.FPROP)
    check(res, "float16", what=f"{pass_.value} {problem.describe()} {plan.brief()}")
