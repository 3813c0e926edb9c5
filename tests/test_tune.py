"""convgen tune's candidates without a GPU, for GEMM layers (split K, sliced K, wgmma, halo,
pointwise and TMA tiles) and for depthwise layers.  A tuning run on a GPU times every candidate,
so each list must start with the planner's default, hold only plans that check_plan accepts on
their part, repeat none, and offer a loop only where it can run.  The database, the timing glue
and the command are tests/test_tune_run.py's."""

from __future__ import annotations

import dataclasses

import pytest

from convgen.tools import tune
from convgen.ir import ARCHES, ConvProblem, Pass, Target
from convgen.spec import Plan
from convgen.mainloop import Depthwise, FlatHalo, HaloLdsm, HaloTile, Im2col, StagedHalo, TmaWgmma, Wgmma
from convgen.planner import check_plan, plan
from convgen.footprint import halo_path
from convgen.suites import SUITES

# GEMM layers: a depthwise suite's stencil has no im2col, sliced-K or TMA candidates
LAYERS = [layer for layers in SUITES.values() for layer in layers if layer.problem.groups == 1]


@pytest.mark.parametrize("arch", sorted(ARCHES))
@pytest.mark.parametrize("pass_", list(Pass), ids=lambda p: p.value)
def test_candidates_are_feasible_unique_and_start_with_the_default(arch, pass_):
    target = Target(arch)
    for layer in LAYERS:
        cands = tune.candidates(layer.problem, pass_, target)
        assert cands[0] == plan(layer.problem, pass_, target)
        bare = [dataclasses.replace(c, reasons=()) for c in cands]
        assert len(set(bare)) == len(bare), "duplicate candidates"
        # the limit bounds the im2col plans (their twins summing split-K in the kernel come on top)
        assert 1 <= len([c for c in cands if c.loop == Im2col() and c.split_reduce == "kernel"]) <= 48
        streamk = [c for c in cands if isinstance(c.loop, TmaWgmma) and c.loop.persistent and pass_ is Pass.WGRAD]
        assert len([c for c in cands if c.split_reduce == "grid" and c not in streamk]) <= 3
        assert len(streamk) <= 5  # the default, stream-K's three tiles and the first's kernel-summed twin
        assert len([c for c in cands if c.loop == Im2col(2)]) <= tune.SLICED_PER_LAYER
        assert len([c for c in cands if isinstance(c.loop, Wgmma)]) <= tune.WGMMA_PER_LAYER
        for c in cands:
            check_plan(c, layer.problem, pass_, target, "float16")  # raises if infeasible
            assert c.reasons, "every candidate says what it is"


def test_candidates_cover_an_exact_fit_for_awkward_n():
    # wgrad of a 3x3 16-channel layer has N = 144: a 144-wide tile avoids a mostly empty second tile.
    problem = SUITES["cifar-resnet"][1].problem
    cands = tune.candidates(problem, Pass.WGRAD, Target("sm_90"), limit=100)
    assert any(c.block_n == 144 for c in cands)


def test_split_k_candidates_reach_four_waves_and_many_slices():
    """With one output tile and a long reduction (CIFAR-ResNet shortcut wgrad: 32 x 16 outputs,
    N*P*Q = 65536), the candidates offer one, two and four waves of slices, up to MAX_SPLIT, and
    the split that fills 8 blocks an SM, past it but never past MAX_FILL_SPLIT, each slice keeping
    at least four K-steps (4,096 of 64 pixels here: 1,024 slices)."""
    from convgen.candidates import MAX_FILL_SPLIT

    problem = SUITES["cifar-resnet"][0].problem  # conv1 wgrad: 16 x 27 outputs, 262144 pixels
    cands = tune.candidates(problem, Pass.WGRAD, Target("sm_90"), limit=100)
    splits = {c.split_k for c in cands}
    assert {132, 264, tune.MAX_SPLIT, 1024} <= splits, splits
    assert max(splits) <= MAX_FILL_SPLIT


def test_split_k_candidates_for_fprop_when_tiles_fill_under_two_waves():
    # CIFAR-VGG conv3 dgrad: 256 tiles of 64 x 64 (under 2 x 132) and 18 K-steps of 64.
    problem = SUITES["cifar-vgg"][2].problem
    cands = tune.candidates(problem, Pass.DGRAD, Target("sm_90"), limit=100)
    assert any(c.split_k > 1 and (c.block_m, c.block_n) == (64, 64) for c in cands)


def test_sliced_k_candidates_only_for_few_blocks_per_sm_and_never_wgrad_or_halo():
    """CIFAR-VGG conv3 dgrad: 16384 pixels, so a 128-row tile gives 128 blocks (under one per
    SM) and each reduces 36 K-steps alone; its sliced twins are offered.  A big ResNet-50 layer
    (l1-3x3: 200704 pixels, thousands of blocks) gets none; neither does wgrad."""
    conv3 = SUITES["cifar-vgg"][2].problem
    h200 = Target("sm_90", sm_count=132)
    sliced = [c for c in tune.candidates(conv3, Pass.DGRAD, h200) if isinstance(c.loop, Im2col) and c.loop.warps_k > 1]
    assert any((c.block_m, c.block_n, c.block_k, c.warps_m, c.warps_n) == (128, 64, 64, 2, 2) for c in sliced)
    for c in sliced:
        assert c.loop == Im2col(2) and c.split_k == 1 and c.warps <= 8
        assert "K sliced 2 ways" in c.reasons[0]
    l1 = next(layer for layer in SUITES["resnet50"] if layer.name == "l1-3x3").problem
    assert not [c for c in tune.candidates(l1, Pass.DGRAD, h200) if c.loop == Im2col(2)]
    for layer in LAYERS:  # wgrad's candidates: im2col plans of one K slice, or TMA plans
        assert all(c.loop == Im2col() or c.tma for c in tune.candidates(layer.problem, Pass.WGRAD, h200))


def test_wgmma_candidates_are_opt_in_and_only_on_sm_90_fprop_dgrad_with_16_byte_gathers():
    h200 = Target("sm_90", sm_count=132)
    l3 = next(layer for layer in SUITES["resnet50"] if layer.name == "l3-3x3").problem
    def wgmma(cands):
        return [c for c in cands if isinstance(c.loop, Wgmma)]

    for pass_ in (Pass.FPROP, Pass.DGRAD):
        assert not wgmma(tune.candidates(l3, pass_, h200))  # opt-in: slower so far
        wg = wgmma(tune.candidates(l3, pass_, h200, wgmma=True))
        assert 1 <= len(wg) <= tune.WGMMA_PER_LAYER
        assert all(c.warps_n == 1 and c.warps_m % 4 == 0 for c in wg)
        assert not wgmma(tune.candidates(l3, pass_, Target("sm_80"), wgmma=True))
    assert not wgmma(tune.candidates(l3, Pass.WGRAD, h200, wgmma=True))
    conv1 = SUITES["cifar-vgg"][0].problem  # C = 3: no 16-byte gathers
    assert not wgmma(tune.candidates(conv1, Pass.FPROP, h200, wgmma=True))


def test_halo_candidates_only_where_the_halo_path_applies():
    """Stride-1 3x3 fprop/dgrad with channels in multiples of 8 get halo-path candidates (right
    after the default plan, so the candidate limit never drops them); so does a 3-channel
    layer's dgrad (it reduces over K = 32; its narrow weights go through registers). Strided,
    wgrad, 1x1 layers and a 3-channel fprop get none."""
    target = Target("sm_90")
    by_name = {l.name: l.problem for l in SUITES["cifar-vgg"] + SUITES["resnet50"]}
    for name, pass_ in (("conv32", Pass.FPROP), ("conv32", Pass.DGRAD), ("l4-3x3", Pass.DGRAD)):
        cands = tune.candidates(by_name[name], pass_, target)  # (conv32's default is itself a halo plan)
        halo = [c for c in cands[1:] if c.loop.halo]
        first = cands.index(halo[0]) if halo else 0  # after the default and the TMA loop's tiles
        assert halo and cands[first:first + len(halo)] == halo and all(c.tma for c in cands[1:first]), name
        assert all(c.vec_a == c.vec_b == 8 for c in halo)
        assert {HaloTile, FlatHalo} <= {type(c.loop) for c in halo} <= {HaloTile, FlatHalo, HaloLdsm}, name
    vgg_conv1 = next(l.problem for l in SUITES["cifar-vgg"] if l.name == "conv1")
    conv1 = tune.candidates(vgg_conv1, Pass.DGRAD, target)
    halo = [c for c in conv1[1:] if c.loop.halo]
    assert halo and conv1[1:1 + len(halo)] == halo
    assert all((c.vec_a, c.vec_b, c.block_n) == (8, 1, 16) for c in halo)
    for problem in (vgg_conv1, by_name["conv1"]):  # 3 channels, stride 1 and 2: the staged halo
        halo = [c for c in tune.candidates(problem, Pass.FPROP, target)[1:] if c.loop.halo]
        assert {c.loop for c in halo} == {StagedHalo(16), StagedHalo(32)}
        assert all(halo_path(c) == "im2col" and c.vec_a == 1 for c in halo)
    for name, pass_ in (("conv32", Pass.WGRAD), ("l2-3x3-down", Pass.FPROP), ("l4-1x1", Pass.DGRAD)):
        assert not [c for c in tune.candidates(by_name[name], pass_, target) if c.loop.halo], (name, pass_)


@pytest.mark.parametrize("arch, offered", [("sm_90", True), ("sm_80", True), ("sm_75", False), ("gfx942", False),
                                           ("gfx1201", False)])
def test_8_pixel_halo_tiles_only_where_ldmatrix_and_mma_sync_are(arch, offered):
    """CIFAR-VGG conv3 (8x8 images): HaloLdsm candidates need ldmatrix and mma.sync.m16n8k16,
    which sm_75 (no m16n8k16) and the AMD targets lack."""
    conv3 = next(l.problem for l in SUITES["cifar-vgg"] if l.name == "conv3")
    for pass_ in (Pass.FPROP, Pass.DGRAD):
        narrow = [c for c in tune.candidates(conv3, pass_, Target(arch)) if isinstance(c.loop, HaloLdsm)]
        assert bool(narrow) is offered, (arch, pass_)
        assert all(c.loop.tile_w == 8 for c in narrow)


def test_pointwise_tile_candidates_come_last_and_only_for_one_step_1x1_layers():
    """tune's multi-tile flat plans for 1x1 layers: offered only where a block can own several
    tiles (stride 1, a reduction of at most 64 channels, fp16 in 16-byte runs, a CUDA part with
    cp.async), one tile covering all of N, and after the candidates tuning on first use times
    (autotune.CANDIDATES), since no GPU run has measured them yet."""
    from convgen.autotune import CANDIDATES

    h200 = Target("sm_90", 132)
    pw = ConvProblem(56, 56, 144, 24, 1, 1, 1, 0, 1, n=128)  # MobileNetV2 pw56-144to24: dgrad reduces K = 24
    plans = tune.candidates(pw, Pass.DGRAD, h200)
    mine = [i for i, p in enumerate(plans) if isinstance(p.loop, FlatHalo) and p.loop.tiles > 1]
    assert mine and min(mine) >= CANDIDATES and mine == list(range(min(mine), len(plans)))
    for i in mine:
        p = plans[i]
        assert p.block_n >= pw.c and p.block_k == 32 and p.stages == 2
        check_plan(p, pw, Pass.DGRAD, h200, "float16")
    assert {plans[i].loop.tiles for i in mine} == {2, 4, 8}

    def offered(problem, pass_, target=h200):
        return [p for p in tune.candidates(problem, pass_, target) if p.reasons[0].startswith("tuning candidate: pointwise")]

    assert len(offered(pw, Pass.DGRAD)) == len(mine)
    assert not offered(pw, Pass.FPROP)  # fprop reduces C = 144: more than one step
    assert not offered(ConvProblem(56, 56, 24, 144, 1, 1, 2, 0, 1, n=8), Pass.DGRAD)  # stride 2
    assert not offered(ConvProblem(56, 56, 24, 24, 3, 3, 1, 1, 1, n=8), Pass.DGRAD)  # 3x3: the halo kinds' own
    assert not offered(pw, Pass.WGRAD)
    assert not offered(pw, Pass.DGRAD, Target("gfx942"))


def test_tma_tiles_as_wide_as_n_are_offered_last_where_they_pad_less():
    """N = 576 (a 3x3 wgrad of 64 channels): 192 columns cover it in three tiles with no
    padding, where 128 pads 64 and 256 pads 192.  The default takes 64x192 (tma_rules.EXACT_TMA_BN,
    timed); the other 192-wide tiles come after every other candidate but the grid-reduction twins
    and stream-K's, beyond what tuning on first use times.  N = 384 (three taps of 128 channels):
    128 already covers it exactly, so no 192-wide tile."""
    from convgen.autotune import CANDIDATES
    from convgen.mainloop import TmaWgmma

    target = Target("sm_90")
    l1 = ConvProblem(56, 56, 64, 64, 3, 3, 1, 1, 1, n=64)  # ResNet-50's l1-3x3
    cands = tune.candidates(l1, Pass.WGRAD, target)
    wide = [i for i, c in enumerate(cands)
            if isinstance(c.loop, TmaWgmma) and c.block_n == 192 and c.split_reduce == "kernel"]  # not grid twins
    assert wide == [0] and (cands[0].block_m, cands[0].stages) == (64, 6)  # 128 rows: wider than M = 64
    assert any(isinstance(c.loop, TmaWgmma) and (c.block_m, c.block_n) == (64, 128) for c in cands[1:CANDIDATES])
    wider = ConvProblem(56, 56, 64, 128, 3, 3, 1, 1, 1, n=32)  # 128 filters (UNet's enc3a): timed, not taken
    cands = tune.candidates(wider, Pass.WGRAD, target)
    wide = [i for i, c in enumerate(cands) if isinstance(c.loop, TmaWgmma) and c.block_n == 192]
    assert cands[0].block_n != 192 and len(wide) >= 2 and min(wide) >= CANDIDATES
    after = cands[max(wide) + 1:]  # the grid-reduction twins, then stream-K's (untimed too)
    streamk = [isinstance(c.loop, TmaWgmma) and c.loop.persistent for c in after]
    assert all(c.split_reduce == "grid" for c, sk in zip(after, streamk) if not sk)
    assert streamk == sorted(streamk), "stream-K candidates come last"
    for i in wide:
        check_plan(cands[i], wider, Pass.WGRAD, target, "float16")
        assert cands[i].block_m in (64, 128) and cands[i].split_k > 1 and "exactly 3 tiles of N=576" in cands[i].reasons[0]
    exact = ConvProblem(28, 28, 128, 128, 3, 1, 1, (1, 0), 1, n=64)  # N = 3 x 128
    assert not any(c.block_n == 192 for c in tune.candidates(exact, Pass.WGRAD, target))
    assert not any(c.block_n == 192 and isinstance(c.loop, TmaWgmma)
                   for c in tune.candidates(l1, Pass.WGRAD, Target("sm_80")))  # no TMA there


DEPTHWISE = [layer for layers in SUITES.values() for layer in layers if layer.problem.depthwise]


@pytest.mark.parametrize("arch", ["sm_90", "sm_75", "gfx1201", "gfx942"])
@pytest.mark.parametrize("pass_", list(Pass), ids=lambda p: p.value)
def test_depthwise_candidates_are_feasible_unique_and_start_with_the_default(arch, pass_):
    """A depthwise layer's candidates are its own kind's variations (no GEMM kind applies), the
    default first, each checked for the part, none twice, at most MAX_VARIATIONS more."""
    from convgen.depthwise_variations import MAX_VARIATIONS

    target = Target(arch)
    for layer in DEPTHWISE:
        cands = tune.candidates(layer.problem, pass_, target)
        assert cands[0] == plan(layer.problem, pass_, target)
        assert 2 <= len(cands) <= 1 + MAX_VARIATIONS, layer.name
        bare = [dataclasses.replace(c, reasons=()) for c in cands]
        assert len(set(bare)) == len(bare), "duplicate candidates"
        for c in cands:
            assert isinstance(c.loop, Depthwise) and c.reasons
            check_plan(c, layer.problem, pass_, target, "float16")
            # a winner goes into the tuning database as a dict, and comes back the same plan
            assert Plan.from_dict(c.as_dict(), layer.problem.geometry, pass_) == c


def test_depthwise_candidates_try_the_chunk_that_pads_c_least_first():
    """C = 96 in 64-channel chunks is 64 + 32: a third of the second chunk's lanes idle (C = 144
    now takes whole pixels: tests/test_depthwise.py).  The first variation of fprop and dgrad
    after the runs of 8 over 4 channels (depthwise.long_run) keeps the default's tile and takes
    48-channel chunks; where 64 already divides C the chunk is not varied."""
    h200 = Target("sm_90", 132)
    odd = ConvProblem(56, 56, 96, 96, 3, 3, 1, 1, groups=96, n=128)
    for pass_ in (Pass.FPROP, Pass.DGRAD):
        base, long_run, first = tune.candidates(odd, pass_, h200)[:3]
        assert (long_run.vec_a, long_run.loop.cols, long_run.block_n) == (4, 8, 64)
        assert base.block_n == 64 and first.block_n == 48
        assert (first.block_m, first.loop.tile_w, first.loop.cols) == (base.block_m, base.loop.tile_w, base.loop.cols)
    even = ConvProblem(28, 28, 192, 192, 3, 3, 1, 1, groups=192, n=128)
    assert {c.block_n for c in tune.candidates(even, Pass.FPROP, h200) if not c.loop.mma} == {64}  # (the MMA's own)
    # a strided dgrad's runs stay whole multiples of the stride
    strided = ConvProblem(112, 112, 96, 96, 3, 3, 2, 1, groups=96, n=128)
    assert all(c.loop.cols % 2 == 0 for c in tune.candidates(strided, Pass.DGRAD, h200))


def test_whole_pixel_5x5_layers_offer_the_long_run_over_the_pixel_and_the_least_padding_chunk():
    """EfficientNet-B0's 5x5 layers at C = 144 and 240 take whole-pixel blocks, whose runs of 8
    over 4 channels (36 and 60 lanes) no GPU has timed as a default, so their default keeps runs
    of 4 over 8; the tuner offers runs of 8 over 4 channels over the whole pixel (more lanes than
    a warp: fprop and dgrad only) and over 48-channel chunks, among its first 8 (what tuning on
    first use times), on the default's tile.  A 3x3 layer of the same width gets neither."""
    h200 = Target("sm_90", 132)
    for c, f in ((144, 5), (240, 5), (240, 3)):
        layer = ConvProblem(28, 28, c, c, f, f, 1, f // 2, groups=c, n=128)
        for pass_ in (Pass.FPROP, Pass.DGRAD):
            cands = tune.candidates(layer, pass_, h200)
            base = cands[0]
            assert (base.block_n, base.vec_a, base.loop.cols) == (c, 8, 4)
            long_runs = [p for p in cands[:8] if (p.vec_a, p.loop.cols, p.loop.out_rows) == (4, 8, 1)]
            assert sorted(p.block_n for p in long_runs) == ([48, c] if f == 5 else []), (c, f, pass_)
            for p in long_runs:
                assert (p.block_m, p.loop.tile_w, p.loop.tiles) == (base.block_m, base.loop.tile_w, base.loop.tiles)
                check_plan(p, layer, pass_, h200, "float16")
        with pytest.raises(ValueError, match="more than a warp"):  # wgrad's lanes stay within a warp
            wide = Plan(64, c, 16, c // 4 * 8 // 32 or 1, 1, 2, 4, 4, "float16", "float16", 1, Depthwise(8, 8))
            check_plan(wide, layer, Pass.WGRAD, h200, "float16")


def test_depthwise_tiles_fitted_to_outputs_the_default_overhangs():
    """An 8x8 tile grid computes 1024 outputs of a 28x28 image to keep 784 (and 256 of 196 at 14
    pixels); the tuner offers, after the default's other runs, the default's block on a tile that
    costs its threads less (within the part's shared memory, holding no fewer threads an SM; its
    last warp may hold lanes past its runs), and where a whole pixel keeps the default from the
    long run, that run's block fitted too, among the first 8 (what tuning on first use times).
    Runs of 7 tile 28-, 14- and 7-pixel images exactly on 5x5 and 7x7 filters, runs of 2 a
    14-pixel image on 3x3 (a 7-pixel 3x3 image keeps runs of 2 on 7x8 tiles); at 56 pixels,
    which 8x8 tiles divide, nothing is offered."""
    from convgen.depthwise import smem_bytes

    h200 = Target("sm_90", 132)

    def tile(p):
        return p.block_m // p.loop.tile_w, p.loop.tile_w

    for px, c, f, exact in ((28, 240, 5, True), (14, 480, 5, True), (28, 192, 7, True), (14, 384, 3, True),
                            (7, 768, 7, True), (7, 960, 3, False), (56, 144, 3, None), (56, 96, 7, None)):
        layer = ConvProblem(px, px, c, c, f, f, 1, f // 2, groups=c, n=128)

        def computed(p):
            th, tw = tile(p)
            return -(-px // th) * th * -(-px // tw) * tw

        for pass_ in (Pass.FPROP, Pass.DGRAD):
            cands = tune.candidates(layer, pass_, h200)
            fitted = [p for p in cands[:8] if "fitted to the" in p.reasons[0]]
            assert bool(fitted) == (exact is not None), (px, c, f, pass_, [p.reasons[0] for p in cands[:8]])
            if not fitted:
                continue
            assert any(computed(p) == px * px for p in fitted) == exact, (px, c, f, [tile(p) for p in fitted])
            base = cands[0]
            assert computed(fitted[0]) < computed(base) / 1.08
            assert (fitted[0].block_n, fitted[0].loop.tiles, fitted[0].stages) == (base.block_n, base.loop.tiles,
                                                                                    base.stages)
            resident = [min(2048, (h200.smem_limit + 1024) // (smem_bytes(p, layer, pass_) + 1024) * p.warps_m * 32)
                        for p in (base, fitted[0])]
            assert resident[1] >= resident[0]
            for p in fitted:
                check_plan(p, layer, pass_, h200, "float16")
                owners = p.block_m // p.loop.cols * (p.block_n // p.vec_a)
                assert 0 <= p.warps_m * 32 - owners < 32, p.brief()  # whole warps, a few lanes past the runs


def test_depthwise_wgrad_candidates_vary_tile_chunk_and_slices():
    h200 = Target("sm_90", 132)
    layer = ConvProblem(56, 56, 144, 144, 3, 3, 1, 1, groups=144, n=128)
    base, *rest = tune.candidates(layer, Pass.WGRAD, h200)
    assert {c.block_n for c in rest} >= {16, 32, 64}
    assert {base.split_k // 2, base.split_k * 2} <= {c.split_k for c in rest if c.block_m == base.block_m
                                                      and c.loop == base.loop and c.block_n == base.block_n}
    assert len({(c.block_m, c.loop.tile_w, c.loop.cols) for c in rest}) >= 4
