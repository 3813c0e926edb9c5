"""The TMA main loop's kind, its checks, candidates and emission (no GPU needed).

What the kernels compute is tests/test_tma_gpu.py's job, on the H200."""

from __future__ import annotations

import dataclasses

import pytest

from convgen.candidates import candidates
from convgen.emit import emit
from convgen.ir import ConvProblem, Epilogue, Pass, Target
from convgen.spec import Plan
from convgen.mainloop import Im2col, TmaWgmma
from convgen.planner import check_plan, make_spec, tma_eligible

LAYER = ConvProblem(28, 28, 128, 256, 3, 3, 1, 1, 1, n=64)
PLAN = Plan(128, 256, 64, 8, 1, 4, 8, 8, loop=TmaWgmma())
SM90 = Target("sm_90")


def test_plan_dict_round_trip_and_name():
    d = PLAN.as_dict()
    assert d["tma"] is True and "wgmma" not in d
    back = Plan.from_dict(d, LAYER.geometry, Pass.FPROP)
    assert back == PLAN and isinstance(back.loop, TmaWgmma)
    assert back.warps == 12  # two consumer warpgroups and the producer's
    spec = make_spec(LAYER, Pass.FPROP, target=SM90, plan_=PLAN)
    assert "_tma_128x256x64_s4_sm90_" in spec.name
    # an im2col plan's dict has no tma key: old tuning entries and spec keys are unchanged
    assert "tma" not in dataclasses.replace(PLAN, loop=Im2col()).as_dict()


@pytest.mark.parametrize("change,needle", [
    (dict(block_k=32), "block_k must be 64"),
    (dict(warps_m=4), "consumer warpgroups"),
    (dict(block_m=256, warps_m=16), "consumer warpgroups"),
])
def test_kind_rejects_plans_it_cannot_run(change, needle):
    with pytest.raises(ValueError, match=needle):
        dataclasses.replace(PLAN, **change)


@pytest.mark.parametrize("layer,pass_,target,in_dtype,needle", [
    (dataclasses.replace(LAYER, c=20), Pass.FPROP, SM90, "float16", "C=20 must be a multiple of 8"),
    (dataclasses.replace(LAYER, c=96), Pass.WGRAD, SM90, "float16", "C=96 must be a multiple of 64"),
    (dataclasses.replace(LAYER, k=100), Pass.WGRAD, SM90, "float16", "K=100 is not a multiple of 8"),
    (dataclasses.replace(LAYER, stride=(5, 4)), Pass.DGRAD, SM90, "float16", "at most 16: stride (5, 4) has 20"),
    (dataclasses.replace(LAYER, k=100), Pass.DGRAD, SM90, "float16", "K=100 and C=128 must be multiples of 8"),
    (dataclasses.replace(LAYER, r=1, padding=(130, 1)), Pass.DGRAD, SM90, "float16", "along H"),
    (LAYER, Pass.FPROP, Target("sm_80"), "float16", "sm_80 does not have"),
    (LAYER, Pass.FPROP, SM90, "float32", "fp16 inputs"),
    (dataclasses.replace(LAYER, stride=(9, 1)), Pass.FPROP, SM90, "float16", "stride"),
])
def test_check_plan_names_what_the_layer_lacks(layer, pass_, target, in_dtype, needle):
    assert needle in tma_eligible(layer.geometry, pass_, target, in_dtype)
    with pytest.raises(ValueError, match="TmaWgmma|does not divide"):  # K=100: the vector width says first
        check_plan(PLAN, layer, pass_, target, in_dtype)


def test_candidates_offer_the_kind_only_where_it_runs():
    tma = [p for p in candidates(LAYER, Pass.FPROP, SM90) if p.tma]
    assert {(p.block_m, p.block_n) for p in tma} >= {(128, 256), (128, 128), (64, 128)}
    for p in tma:
        check_plan(p, LAYER, Pass.FPROP, SM90, "float16")
    assert not [p for p in candidates(LAYER, Pass.FPROP, Target("sm_80")) if p.tma]
    dgrad = [p for p in candidates(LAYER, Pass.DGRAD, SM90) if p.tma]
    assert {(p.block_m, p.block_n) for p in dgrad} >= {(128, 128), (64, 128)}  # N = C = 128: no 256-wide tile
    assert max(p.block_n for p in dgrad) == 128
    strided = [p for p in candidates(dataclasses.replace(LAYER, stride=(2, 2)), Pass.DGRAD, SM90) if p.tma]
    assert {(p.block_m, p.block_n) for p in strided} == {(p.block_m, p.block_n) for p in dgrad}  # the same tiles
    wgrad = [p for p in candidates(LAYER, Pass.WGRAD, SM90) if p.tma]
    assert {(p.block_m, p.block_n) for p in wgrad} >= {(128, 256), (64, 128)} and any(p.split_k > 1 for p in wgrad)
    narrow = dataclasses.replace(LAYER, k=64)  # no tile wider than N
    assert max(p.block_n for p in candidates(narrow, Pass.FPROP, SM90) if p.tma) == 64


def test_launch_takes_tensor_maps_and_the_producer_warpgroup():
    src = emit(make_spec(LAYER, Pass.FPROP, target=SM90, plan_=PLAN, epilogue=Epilogue(bias=True)))
    assert src.main.args == ("x_map", "w_map", "bias", "y", "batch")
    assert src.main.block == (384, 1, 1)
    assert src.compile_arch == "sm_90a"
    assert src.main.shared_mem <= SM90.info.smem_limit
    assert src.reduce is None
    assert emit(make_spec(LAYER, Pass.FPROP, target=SM90, plan_=PLAN, epilogue=Epilogue(bias=True))).source == src.source


def test_dgrad_takes_maps_of_dy_and_w_and_boxes_of_64_channels():
    plan = Plan(128, 128, 64, 8, 1, 6, 8, 8, loop=TmaWgmma())
    src = emit(make_spec(LAYER, Pass.DGRAD, target=SM90, plan_=plan))
    assert src.main.args == ("dy_map", "w_map", "dx", "batch")
    assert src.main.block == (384, 1, 1) and src.compile_arch == "sm_90a" and src.reduce is None
    assert src.grid(64) == (-(-64 * 28 * 28 // 128), 1, 1)  # one tile row per 128 dx pixels, N = C = 128
    with pytest.raises(ValueError, match="multiple of 64"):
        check_plan(dataclasses.replace(plan, block_n=96), LAYER, Pass.DGRAD, SM90, "float16")


def test_default_plans_take_the_loop_where_the_reduction_is_long():
    """fprop and stride-1 dgrad of a 3x3 layer of 128 channels (18 and 36 K-steps) take the
    TMA loop.  A 1x1 dgrad of K=256 (4 K-steps) takes it only through the persistent kernel:
    with tiles enough (392 at batch 64; at batch 4 no persistent tile has 1.5 an SM), steps
    more than half full (K=96, not K=32), and more than one 64-wide step a tile.  Strided
    dgrad counts its heaviest residue class: 4 taps x 4 steps of K=256 at stride 2 take the
    loop, a 1x1 at stride 2 (one tap, 2 steps of K=128) does not; each says why."""
    from convgen.planner import plan as default_plan

    assert default_plan(LAYER, Pass.FPROP, SM90).tma and default_plan(LAYER, Pass.DGRAD, SM90).tma
    short = default_plan(ConvProblem(14, 14, 1024, 256, 1, 1, 1, 0, 1, n=64), Pass.DGRAD, SM90)
    assert short.tma and short.loop.persistent and any("4 K-step(s), fewer than" in r for r in short.reasons)
    few = default_plan(ConvProblem(14, 14, 1024, 256, 1, 1, 1, 0, 1, n=4), Pass.DGRAD, SM90)
    assert not few.tma and any("4 K-step(s)" in r and "fewer than 1.5 per SM" in r for r in few.reasons)
    single = default_plan(ConvProblem(56, 56, 64, 64, 1, 1, 1, 0, 1, n=64), Pass.FPROP, SM90)  # one step, N = 64
    assert not single.tma and any("fewer than 128 step-columns" in r for r in single.reasons)
    part = default_plan(ConvProblem(14, 14, 1024, 96, 1, 1, 1, 0, 1, n=64), Pass.DGRAD, SM90)  # steps 3/4 full
    assert part.tma and part.loop.persistent
    half = default_plan(ConvProblem(14, 14, 1024, 32, 1, 1, 1, 0, 1, n=64), Pass.DGRAD, SM90)  # half-empty steps
    assert not half.tma and any("32 channels fill 50% of their 64-channel steps" in r for r in half.reasons)
    assert default_plan(dataclasses.replace(LAYER, stride=(2, 2)), Pass.DGRAD, SM90).tma
    strided_1x1 = default_plan(ConvProblem(28, 28, 256, 128, 1, 1, 2, 0, 1, n=64), Pass.DGRAD, SM90)
    assert not strided_1x1.tma and any("2 K-step(s)" in r for r in strided_1x1.reasons)
    assert not default_plan(LAYER, Pass.DGRAD, Target("sm_80")).tma


TMA_COMPILE = [
    (LAYER, PLAN, Epilogue(bias=True)),
    (ConvProblem(7, 7, 512, 2048, 1, 1, 1, 0, 1, n=64), Plan(128, 128, 64, 8, 1, 6, 8, 8, loop=TmaWgmma()),
     Epilogue(relu=True, out_dtype="float32")),
    (ConvProblem(15, 13, 64, 40, 3, 5, (2, 1), (1, 2), (2, 1), n=2), Plan(64, 48, 64, 4, 1, 2, 8, 8, loop=TmaWgmma()),
     Epilogue()),
    (LAYER, PLAN, Epilogue(bias=True, relu=True, bias_dtype="float16")),  # a float16 model's bias, read as it is
    (LAYER, Plan(128, 128, 64, 8, 1, 5, 8, 8, loop=TmaWgmma(persistent=True)), Epilogue(bias=True, relu=True)),
    (dataclasses.replace(LAYER, k=64), Plan(128, 64, 64, 8, 1, 6, 8, 8, loop=TmaWgmma(persistent=True)), Epilogue()),
    (LAYER, Plan(64, 128, 64, 4, 1, 4, 8, 8, loop=TmaWgmma(persistent=True)), Epilogue(out_dtype="float32")),
    (LAYER, Plan(128, 128, 64, 8, 1, 5, 8, 8, loop=TmaWgmma(persistent=True, pingpong=True)),
     Epilogue(bias=True, relu=True)),
    (dataclasses.replace(LAYER, k=40), Plan(128, 64, 64, 8, 1, 2, 8, 8, loop=TmaWgmma(persistent=True, pingpong=True)),
     Epilogue(out_dtype="float32")),
    (ConvProblem(14, 14, 40, 72, 1, 1, 1, 0, 1, n=2),  # a 1x1's channel tail: one step, part zeros
     Plan(128, 64, 64, 8, 1, 6, 8, 8, loop=TmaWgmma(persistent=True, pingpong=True)), Epilogue(bias=True)),
    (ConvProblem(9, 11, 96, 48, 3, 3, 1, 1, 1, n=2),  # a 3x3's: w as (C, R*S, K), each tap's last step part zeros
     Plan(128, 64, 64, 8, 1, 5, 8, 8, loop=TmaWgmma(persistent=True)), Epilogue(bias=True, relu=True)),
]


PERSISTENT = Plan(128, 128, 64, 8, 1, 5, 8, 8, loop=TmaWgmma(persistent=True))


def test_persistent_plan_round_trips_and_is_named():
    d = PERSISTENT.as_dict()
    assert d["tma"] is True and d["persistent"] is True
    assert Plan.from_dict(d, LAYER.geometry, Pass.FPROP) == PERSISTENT
    assert "persistent" not in PLAN.as_dict()  # the one-block-per-tile kernels keep their keys
    assert "_tmap_128x128x64_s5_" in make_spec(LAYER, Pass.FPROP, target=SM90, plan_=PERSISTENT).name
    with pytest.raises(ValueError, match="needs plan.tma=True"):
        Plan.from_dict({**Plan(128, 128, 32, 4, 2, 3, 8, 8).as_dict(), "persistent": True})
    with pytest.raises(TypeError, match="persistent must be a bool"):
        TmaWgmma(persistent=1)


PINGPONG = Plan(128, 128, 64, 8, 1, 5, 8, 8, loop=TmaWgmma(persistent=True, pingpong=True))


def test_pingpong_plan_round_trips_and_is_checked():
    d = PINGPONG.as_dict()
    assert d["pingpong"] is True and d["persistent"] is True
    assert Plan.from_dict(d, LAYER.geometry, Pass.FPROP) == PINGPONG
    assert "pingpong" not in PERSISTENT.as_dict()  # the cooperative kernels keep their keys
    assert "_tmapp_128x128x64_s5_" in make_spec(LAYER, Pass.FPROP, target=SM90, plan_=PINGPONG).name
    with pytest.raises(ValueError, match="needs persistent=True"):
        TmaWgmma(pingpong=True)
    with pytest.raises(ValueError, match="needs plan.persistent=True"):
        Plan.from_dict({**PLAN.as_dict(), "pingpong": True})
    with pytest.raises(TypeError, match="pingpong must be a bool"):
        TmaWgmma(persistent=True, pingpong=1)
    for bad in (dict(block_n=256, stages=3), dict(block_m=64, warps_m=4)):
        with pytest.raises(ValueError, match="block_m = 128 and block_n <= 128"):
            check_plan(dataclasses.replace(PINGPONG, **bad), LAYER, Pass.FPROP, SM90, "float16")


def test_pingpong_gives_each_warpgroup_whole_tiles():
    """One reader a stage (the warpgroup whose tile it is), two turn barriers past the ring's,
    and each warpgroup's accumulators the tile's 128 rows (two m64 steps); the cooperative
    kernel of the same tile keeps two readers and one m64 step a warpgroup."""
    pp = emit(make_spec(LAYER, Pass.FPROP, target=SM90, plan_=PINGPONG)).source
    co = emit(make_spec(LAYER, Pass.FPROP, target=SM90, plan_=PERSISTENT)).source
    assert "ring_init(smem_raw, 1)" in pp and "ring_init(smem_raw, CONSUMERS)" in co
    assert "constexpr int FM = BM / 64, FN = BN / 16, WG_ROWS = 0;" in pp
    assert "constexpr int FM = 1, FN = BN / 16, WG_ROWS = 64;" in co
    assert "pos.skip(STEPS)" in pp and "turns.wait(ring, group)" in pp and "skip(" not in co


def test_persistent_runs_whole_tiles_of_fprop_and_dgrad():
    """(wgrad's persistent kind is stream-K: tests/test_stream_k.py)"""
    with pytest.raises(ValueError, match="split_k must be 1"):
        check_plan(dataclasses.replace(PERSISTENT, split_k=2), LAYER, Pass.FPROP, SM90, "float16")


def test_persistent_grid_is_the_blocks_the_gpu_holds():
    """One row of as many blocks as fit at once (two of a small one-consumer tile on an SM,
    one of a two-consumer tile), never more than there are tiles; the drain's scratch sits
    past the ring, so the block needs both."""
    from convgen.footprint import smem_bytes

    src = emit(make_spec(LAYER, Pass.FPROP, target=Target("sm_90", 132), plan_=PERSISTENT))
    tiles = -(-64 * 28 * 28 // 128) * 2
    assert src.grid(64) == (132, 1, 1) and src.grid(1) == (-(-28 * 28 // 128) * 2, 1, 1) and tiles > 132
    assert src.manifest_entry()["kernels"][0]["grid"] == {"x": "min(ceil(batch * 784 / 128) * 2, 132)", "y": 1, "z": 1}
    ring = 5 * (128 + 128) * 64 * 2
    assert src.main.shared_mem >= ring + 8 * 16 * 16 * 4  # the ring, then eight warps' strips
    assert smem_bytes(dataclasses.replace(PERSISTENT, loop=TmaWgmma()), Pass.FPROP, 32, LAYER.geometry) < src.main.shared_mem
    small = Plan(64, 64, 64, 4, 1, 3, 8, 8, loop=TmaWgmma(persistent=True))
    assert emit(make_spec(LAYER, Pass.FPROP, target=Target("sm_90", 132), plan_=small)).grid(64) == (264, 1, 1)
    one = emit(make_spec(LAYER, Pass.FPROP, target=Target("sm_90", 132), plan_=PLAN))
    assert one.grid(64) == (392, 1, 1) and one.manifest_entry()["kernels"][0]["grid"]["y"] == 1


def test_defaults_run_persistent_where_tiles_outnumber_the_sms():
    """The measured rule (tma_rules.PERSISTENT_TILES): a long run of tiles takes the
    persistent kernel in fprop and dgrad, 64x64 becoming 128x64 ping-pong, fprop's 128x128
    ping-pong and dgrad's cooperative; too few tiles, or wgrad, keep one block per tile, and
    each plan says why."""
    from convgen.planner import plan as default_plan

    vgg = default_plan(ConvProblem(112, 112, 64, 128, 3, 3, 1, 1, 1, n=32), Pass.FPROP, SM90)
    assert vgg.loop == TmaWgmma(persistent=True, pingpong=True) and vgg.warps_m == 8
    assert (vgg.block_m, vgg.block_n, vgg.stages) == (128, 128, 4) and any("ping-pong" in r for r in vgg.reasons)
    # (64 -> 64 3x3 layers run the TMA halo loop: tests/test_tma_halo.py; these take 128 or give 128 channels)
    narrow = default_plan(ConvProblem(224, 224, 128, 64, 3, 3, 1, 1, 1, n=32), Pass.FPROP, SM90)
    assert narrow.loop.pingpong and (narrow.block_m, narrow.block_n) == (128, 64)
    assert any("in place of the 64x64 tile" in r for r in narrow.reasons)
    wide = default_plan(ConvProblem(28, 28, 512, 512, 3, 3, 1, 1, 1, n=64), Pass.FPROP, SM90)  # VGG-16 conv4_2
    assert wide.loop == TmaWgmma(persistent=True) and (wide.block_m, wide.block_n) == (128, 256)
    narrow_dgrad = default_plan(ConvProblem(128, 128, 64, 128, 3, 3, 1, 1, 1, n=16), Pass.DGRAD, SM90)  # UNet dec-like
    assert narrow_dgrad.loop.pingpong and (narrow_dgrad.block_m, narrow_dgrad.block_n) == (128, 64)
    few = default_plan(ConvProblem(14, 14, 512, 512, 3, 3, 1, 1, 1, n=32), Pass.FPROP, SM90)  # 98 tiles
    assert few.tma and not few.loop.persistent and any("fewer than 2 per SM" in r for r in few.reasons)
    # A 1x1 layer's long reduction whose cost-model tile has too few tiles for its persistent
    # kernel: where that tile pads N (MobileNetV2's N = 320 on 128x256, 37%) the roofline's
    # persistent tile replaces it (245 128x64 tiles); where it fits N (ResNet-50 l3-1x1, 98
    # 128x256 tiles, N = 256) it stays.
    pointwise = default_plan(ConvProblem(7, 7, 960, 320, 1, 1, 1, 0, 1, n=128), Pass.FPROP, SM90)
    assert pointwise.loop == TmaWgmma(persistent=True, pingpong=True) and pointwise.block_n == 64
    assert any("persistent 128x64 tile (ping-pong): 245 tiles" in r for r in pointwise.reasons)
    fits = default_plan(ConvProblem(14, 14, 1024, 256, 1, 1, 1, 0, 1, n=64), Pass.FPROP, SM90)
    assert fits.tma and not fits.loop.persistent and (fits.block_m, fits.block_n) == (128, 256)
    dgrad = default_plan(ConvProblem(112, 112, 128, 128, 3, 3, 1, 1, 1, n=32), Pass.DGRAD, SM90)
    assert dgrad.loop == TmaWgmma(persistent=True) and (dgrad.block_m, dgrad.block_n, dgrad.stages) == (128, 128, 5)
    strided = default_plan(ConvProblem(64, 64, 128, 256, 3, 3, 2, 1, 1, n=64), Pass.DGRAD, SM90)  # Darknet's down3
    assert strided.loop.persistent
    wgrad = default_plan(ConvProblem(112, 112, 64, 128, 3, 3, 1, 1, 1, n=32), Pass.WGRAD, SM90)
    assert wgrad.tma and not wgrad.loop.persistent and any("split-K slices" in r for r in wgrad.reasons)


def test_wgrad_splits_its_pixels_and_takes_maps_of_x_and_dy():
    """The planner splits a wgrad whose few tiles would leave SMs idle, and the split's
    reduction kernel follows; with bias the db arguments come along."""
    from convgen.planner import plan as default_plan

    plan = default_plan(LAYER, Pass.WGRAD, SM90)  # M = 256 x N = 1,152: a few dozen tiles
    assert plan.tma and plan.split_k > 1
    src = emit(make_spec(LAYER, Pass.WGRAD, target=SM90, plan_=plan, epilogue=Epilogue(bias=True)))
    assert src.main.args == ("x_map", "dy_map", "dw", "db", "db_workspace", "workspace", "batch")
    assert src.reduce is not None and src.main.grid_z == plan.split_k
    for bad, needle in ((dict(block_n=96), "multiple of 64"),):
        with pytest.raises(ValueError, match=needle):
            check_plan(dataclasses.replace(plan, **bad), LAYER, Pass.WGRAD, SM90, "float16")
    with pytest.raises(ValueError, match="split_k must be 1"):  # fprop and dgrad reduce in one block
        check_plan(dataclasses.replace(plan, split_k=2), LAYER, Pass.FPROP, SM90, "float16")


def test_wgrad_cost_model_trades_waves_for_workspace():
    """More slices fill the SMs but write more partials: the modelled best split of a layer
    with 18 tiles is above 1, and a split past the SMs' one wave costs more than the best."""
    from convgen.tma_rules import tma_splits, tma_tile_cost

    costs = {s: tma_tile_cost(LAYER, Pass.WGRAD, SM90, 128, 256, 704.0, s)[1] for s in tma_splits(LAYER, Pass.WGRAD)}
    best = min(costs, key=costs.get)
    assert best > 1 and costs[best] < costs[1] and costs[best] < costs[max(costs)]


TMA_COMPILE_DGRAD = [
    (LAYER, Plan(128, 128, 64, 8, 1, 6, 8, 8, loop=TmaWgmma()), Epilogue(out_dtype="float32")),
    (ConvProblem(15, 13, 48, 72, 3, 5, 1, (1, 2), (2, 1), n=2), Plan(64, 64, 64, 4, 1, 3, 8, 8, loop=TmaWgmma()),
     Epilogue()),
    # strided: four classes of 4, 2, 2 and 1 taps; a 1x1 stride 2 whose three other classes
    # no tap reaches; odd sizes with stride (2, 3) and dilation (2, 1)
    (ConvProblem(56, 56, 128, 128, 3, 3, 2, 1, 1, n=2), Plan(128, 128, 64, 8, 1, 6, 8, 8, loop=TmaWgmma()), Epilogue()),
    (ConvProblem(14, 14, 256, 64, 1, 1, 2, 0, 1, n=2), Plan(64, 256, 64, 4, 1, 5, 8, 8, loop=TmaWgmma()),
     Epilogue(out_dtype="float32")),
    # persistent: one class, and four of unequal taps walked as one sequence
    (LAYER, Plan(128, 128, 64, 8, 1, 5, 8, 8, loop=TmaWgmma(persistent=True)), Epilogue()),
    (ConvProblem(56, 56, 128, 128, 3, 3, 2, 1, 1, n=2), Plan(128, 64, 64, 8, 1, 6, 8, 8, loop=TmaWgmma(persistent=True)),
     Epilogue(out_dtype="float32")),
    # ping-pong: the classes' tiles (those with pixels) handed to the two warpgroups in turn
    (ConvProblem(56, 56, 128, 128, 3, 3, 2, 1, 1, n=2),
     Plan(128, 128, 64, 8, 1, 4, 8, 8, loop=TmaWgmma(persistent=True, pingpong=True)), Epilogue()),
    (ConvProblem(15, 13, 64, 40, 3, 5, (2, 3), (1, 2), (2, 1), n=2), Plan(64, 64, 64, 4, 1, 3, 8, 8, loop=TmaWgmma()),
     Epilogue()),
    # one column, stride (2, 2): the classes of odd columns have no pixels (the GPU fuzz's
    # example whose kernel divided by their zero pixel count, a warning the tests make an error)
    (ConvProblem(5, 1, 64, 64, 4, 1, 2, 0, 1, n=3), Plan(128, 256, 64, 8, 1, 4, 8, 8, loop=TmaWgmma()), Epilogue()),
]


TMA_COMPILE_GROUPED_FPROP = [
    (ConvProblem(28, 28, 256, 256, 3, 3, 1, 1, 1, 4, n=2), Plan(64, 64, 64, 4, 1, 6, 8, 8, loop=TmaWgmma()),
     Epilogue(bias=True, relu=True)),
    (ConvProblem(14, 14, 256, 512, 1, 1, 2, 0, 1, 2, n=2), Plan(128, 256, 64, 8, 1, 4, 8, 8, loop=TmaWgmma()),
     Epilogue(out_dtype="float32", residual=True)),
    (ConvProblem(28, 28, 256, 256, 3, 3, 1, 1, 1, 2, n=2),
     Plan(128, 128, 64, 8, 1, 4, 8, 8, loop=TmaWgmma(persistent=True, pingpong=True)), Epilogue()),
]
TMA_COMPILE_WGRAD = [
    (LAYER, Plan(128, 256, 64, 8, 1, 4, 8, 8, split_k=4, loop=TmaWgmma()), Epilogue(bias=True)),
    (ConvProblem(15, 13, 64, 40, 3, 5, (2, 1), (1, 2), (2, 1), n=2), Plan(64, 64, 64, 4, 1, 3, 8, 8, loop=TmaWgmma()),
     Epilogue(bias=True, out_dtype="float32")),
    # grouped: G GEMMs side by side along the grid's y, with and without split-K and db
    (ConvProblem(28, 28, 256, 256, 3, 3, 1, 1, 1, 4, n=2), Plan(64, 128, 64, 4, 1, 4, 8, 8, split_k=6, loop=TmaWgmma()),
     Epilogue(bias=True)),
    (ConvProblem(14, 14, 256, 512, 1, 1, 2, 0, 1, 2, n=2), Plan(128, 128, 64, 8, 1, 6, 8, 8, loop=TmaWgmma()),
     Epilogue(out_dtype="float32")),
]


def test_grouped_fprop_and_wgrad_take_the_loop_in_whole_boxes_a_group():
    """fprop's and wgrad's TMA kernels take groups whose C/G and K/G are whole 64-channel boxes,
    on tiles whose filters stay within a group (wgrad's M, fprop's N): wgrad one block a tile,
    fprop the persistent walk (tma_rules.GROUPED_PERSISTENT); dgrad keeps the im2col loop for
    any grouping."""
    g4 = ConvProblem(28, 28, 256, 256, 3, 3, 1, 1, 1, 4, n=64)
    for pass_ in (Pass.FPROP, Pass.WGRAD):
        assert tma_eligible(g4.geometry, pass_, SM90) is None
        p = make_spec(g4, pass_, target=SM90).plan
        assert p.tma and p.loop.persistent == (pass_ is Pass.FPROP)
        assert 64 % (p.block_m if pass_ is Pass.WGRAD else p.block_n) == 0
        assert "whole 64-channel boxes" in tma_eligible(dataclasses.replace(g4, groups=8).geometry, pass_, SM90)
    assert "fprop's and wgrad's TMA kernels take groups" in tma_eligible(g4.geometry, Pass.DGRAD, SM90)
    with pytest.raises(ValueError, match="must divide K/G=64"):
        check_plan(Plan(128, 128, 64, 8, 1, 6, 8, 8, split_k=2, loop=TmaWgmma()), g4, Pass.WGRAD, SM90, "float16")
    with pytest.raises(ValueError, match="block_n=128 must divide K/G=64"):
        check_plan(Plan(128, 128, 64, 8, 1, 6, 8, 8, loop=TmaWgmma()), g4, Pass.FPROP, SM90, "float16")


@pytest.mark.parametrize("pass_,layer,plan,epi", [(Pass.DGRAD, *c) for c in TMA_COMPILE_DGRAD]
                         + [(Pass.WGRAD, *c) for c in TMA_COMPILE_WGRAD]
                         + [(Pass.FPROP, *c) for c in TMA_COMPILE_GROUPED_FPROP],
                         ids=lambda v: getattr(v, "brief", lambda: getattr(v, "value", None))() or None)
def test_nvrtc_compiles_tma_gradient_kernels(pass_, layer, plan, epi):
    pytest.importorskip("cupy", reason="NVRTC comes with CuPy")
    from convgen.compile import compile_binary

    src = emit(make_spec(layer, pass_, target=SM90, plan_=plan, epilogue=epi))
    binary = compile_binary(src.source, arch=src.compile_arch, name=src.filename)
    assert binary[:4] == b"\x7fELF" and src.main.kernel.encode() in binary


@pytest.mark.parametrize("layer,plan,epi", TMA_COMPILE, ids=lambda v: getattr(v, "brief", lambda: None)() or None)
def test_nvrtc_compiles_tma_kernels(layer, plan, epi):
    """sm_90a cubins with the kernel in them, and no compiler warning (the test session makes
    warnings errors): ptxas's C7515 (wgmma serialised) or C7508 (setmaxnreg ignored) would fail here."""
    pytest.importorskip("cupy", reason="NVRTC comes with CuPy")
    from convgen.compile import compile_binary

    src = emit(make_spec(layer, Pass.FPROP, target=SM90, plan_=plan, epilogue=epi))
    binary = compile_binary(src.source, arch=src.compile_arch, name=src.filename)
    assert binary[:4] == b"\x7fELF" and src.main.kernel.encode() in binary


@pytest.mark.parametrize("layer", [
    ConvProblem(56, 56, 128, 128, 3, 3, 2, 1, 1, n=1), ConvProblem(14, 14, 64, 64, 1, 1, 2, 0, 1, n=1),
    ConvProblem(15, 13, 64, 40, 3, 5, (2, 3), (1, 2), (2, 1), n=1), ConvProblem(9, 10, 8, 8, 4, 4, (3, 2), (2, 1), (2, 3), n=1),
    ConvProblem(7, 7, 8, 8, 3, 3, 1, 1, 2, n=1),
], ids=lambda p: p.describe().replace(" ", "_"))
def test_residue_classes_are_the_dgrad_sum(layer):
    """Each class's flipped taps, read at the pixel offsets the TMA maps are built from,
    are exactly the (dx pixel, tap, dy pixel) triples of dgrad's definition: every tap
    (r, s) with h + PH - r*DH = p*SH in dy, none twice, and longest classes first."""
    from convgen.residues import residue_classes

    g = layer.geometry
    (sh, sw), (ph, pw), (dh, dw) = g.stride, g.padding, g.dilation
    want = {(h, w, r, s, (h + ph - r * dh) // sh, (w + pw - s * dw) // sw)
            for h in range(g.h) for w in range(g.w) for r in range(g.r) for s in range(g.s)
            if (h + ph - r * dh) % sh == 0 and (w + pw - s * dw) % sw == 0}
    got = []
    classes = residue_classes(g)
    for cls in classes:
        for i in range(cls.hc):
            for j in range(cls.wc):
                for a in range(cls.th.count):
                    for b in range(cls.tw.count):
                        r, s = cls.tap(a, b)
                        got.append((i * sh + cls.ch, j * sw + cls.cw, r, s,
                                    i - cls.flip_h + a * cls.pstep, j - cls.flip_w + b * cls.qstep))
    assert len(got) == len(set(got)) and set(got) == want
    assert [c.taps for c in classes] == sorted((c.taps for c in classes), reverse=True)
    assert sum(c.hc * c.wc for c in classes) == g.h * g.w


def test_wgrad_db_readers_hand_the_ring_back_through_an_mbarrier():
    """The db warps read every stage beside the consumers; the drain may reuse the ring only
    once they are done.  They say so on an mbarrier the consumers await (joining the
    consumers' named barrier from another code location is what synccheck flagged), and a
    wgrad without db has no reader at all."""
    plan = Plan(128, 64, 64, 8, 1, 3, 8, 8, split_k=3, loop=TmaWgmma())
    with_db = emit(make_spec(LAYER, Pass.WGRAD, target=SM90, plan_=plan, epilogue=Epilogue(bias=True))).source
    assert "mbar_wait(ring.reader_done, 0)" in with_db and "mbar_arrive(ring.reader_done)" in with_db
    assert "consumers_sync(CONSUMERS * 128);" in with_db and "CONSUMERS * 128 +" not in with_db
    without = emit(make_spec(LAYER, Pass.WGRAD, target=SM90, plan_=plan)).source
    assert "read_ring" not in without and "reader_done" not in without


def test_strided_dgrad_defaults_follow_the_h200_measurements(monkeypatch):
    """The real strided layers whose dgrad the TMA loop beat the im2col loop on by 1.3-2.4x
    with 16 or more K-steps (H200, 145e8e4 against 209e778) take it by default; the 3x3 ones
    of 8 steps, where the one-block kernel ran within 10% either way but the persistent one
    won by 1.59-1.93x (tuning runs at 1c23207 and b41f285), take the persistent kernel; the
    strided 1x1 layer of 8 steps and the 3x3 one of 4 (0.82x and a tie) keep the im2col loop."""
    from convgen.planner import plan as default_plan
    from convgen.suites import SUITES

    monkeypatch.setenv("CONVGEN_TUNED", "0")
    won = {("resnet18", "l3-3x3-down"), ("resnet18", "l4-3x3-down"), ("darknet53-down", "down3"),
           ("darknet53-down", "down4"), ("darknet53-down", "down5")}
    persistent = {("resnet18", "l2-3x3-down"), ("darknet53-down", "down2"), ("resnet50", "l2-3x3-down")}
    even = {("resnet18", "l4-proj"), ("darknet53-down", "down1")}
    for suite, name in won | persistent | even:
        layer = next(l for l in SUITES[suite] if l.name == name)
        assert layer.problem.stride != (1, 1)
        chosen = default_plan(layer.problem, Pass.DGRAD, SM90)
        assert chosen.tma == ((suite, name) not in even), (suite, name)
        if (suite, name) in persistent:
            assert chosen.loop.persistent, (suite, name, chosen.brief())


def test_grouped_fprop_runs_persistent_where_the_tuning_log_timed_it_best():
    """ResNeXt-50's grouped layers packed into 64-channel groups (group_pack.TMA_SLAB), tuned on
    an H100 (tma_rules.GROUPED_PERSISTENT): the default fprop plan of every grouped layer is the
    persistent 128x64 ping-pong, which the log timed fastest on each (1.06-1.43x the 64x64 tile
    one block a tile, the default before).  Grouped wgrad keeps one block per tile and says why."""
    import json
    import math
    from pathlib import Path

    from convgen.planner import plan as default_plan
    from test_short_reduction_rules import _bare, _problem

    log = Path(__file__).resolve().parent.parent / "benchmarks" / "results" / "tuning" / \
        "nvidia-h100_2026-12-06_dd95543-tune-resnext50-grouped-fprop.json"
    gains = []
    for layer in json.loads(log.read_text())["layers"]:
        problem = _problem(layer["problem"])
        if problem.groups == 1:
            continue
        rows = [r for r in layer["rows"] if r["ok"] and math.isfinite(r["us"])]
        chosen = default_plan(problem, Pass.FPROP, SM90)
        assert chosen.loop == TmaWgmma(persistent=True, pingpong=True), (layer["layer"], chosen.brief())
        timed = [r["us"] for r in rows if _bare(r["plan"]) == _bare(chosen.as_dict())]
        assert timed and timed[0] == min(r["us"] for r in rows), (layer["layer"], chosen.brief())
        gains.append(next(r["us"] for r in rows if r.get("default")) / timed[0])
    assert len(gains) == 6 and min(gains) > 1.05, gains
    grouped = ConvProblem(28, 28, 256, 256, 3, 3, 1, 1, 1, groups=4, n=64)
    wgrad = default_plan(grouped, Pass.WGRAD, SM90)
    assert not (wgrad.tma and wgrad.loop.persistent)


def test_wgrad_takes_the_192_wide_tile_where_it_covers_n_exactly_as_timed():
    """tma_rules.EXACT_TMA_BN, from the H100's wgrad tuning logs (dW alone): every timed layer
    of 64 filters (a group) and N = 576 takes 64x192 on 6 stages at the split the log timed it
    with, 1.05x or more the 64x128 default it replaced as a geometric mean over the 12; the
    128-filter layers keep their tile, whose 128x192 twin the logs timed slower."""
    import json
    import math
    from pathlib import Path

    from convgen.planner import plan as default_plan
    from test_short_reduction_rules import _bare, _problem

    tuning = Path(__file__).resolve().parent.parent / "benchmarks" / "results" / "tuning"
    gains, kept = [], 0
    for path in sorted(tuning.glob("nvidia-h100_2026-12-06_dc620aa-tune-*-wgrad.json")):
        for layer in json.loads(path.read_text())["layers"]:
            problem = _problem(layer["problem"])
            rows = [r for r in layer["rows"] if r["ok"] and math.isfinite(r["us"])]
            chosen = default_plan(problem, Pass.WGRAD, SM90).as_dict()
            old = next(r for r in layer["rows"] if r.get("default"))
            if problem.group_gemm(Pass.WGRAD).m == 64:
                assert (chosen["block_m"], chosen["block_n"], chosen["stages"]) == (64, 192, 6), layer["layer"]
                (us,) = [r["us"] for r in rows if _bare(r["plan"]) == _bare(chosen)]
                gains.append(old["us"] / us)
            else:
                assert chosen["block_n"] != 192 and _bare(chosen) == _bare(old["plan"]), layer["layer"]
                wide = [r["us"] for r in rows if (r["plan"]["block_m"], r["plan"]["block_n"]) == (128, 192)]
                assert wide and min(wide) > old["us"], layer["layer"]
                kept += 1
    assert len(gains) == 12 and kept == 4
    assert math.exp(sum(map(math.log, gains)) / len(gains)) >= 1.05, gains


def _twins(problem: ConvProblem, pass_: Pass) -> list[tuple[int, Plan, Plan]]:
    """(position, tile's own plan, its co-resident twin) among the layer's candidates."""
    plans = candidates(problem, pass_, SM90)
    out = []
    for i, twin in enumerate(plans):
        if "co-resident twin" in twin.reasons[0]:
            own = next(p for p in plans[:i] if (p.block_m, p.block_n, p.stages) == (twin.block_m, twin.block_n, twin.stages)
                       and isinstance(p.loop, TmaWgmma) and "co-resident" not in p.reasons[0])
            out.append((i, own, twin))
    return out


@pytest.mark.parametrize("layer", [
    ConvProblem(7, 7, 320, 1280, 1, 1, 1, 0, 1, n=128),   # MobileNetV2's pw7-320to1280: 64x128 at 2 slices, 120 blocks
    ConvProblem(7, 7, 960, 320, 1, 1, 1, 0, 1, n=128),    # pw7-960to320
    ConvProblem(7, 7, 512, 2048, 1, 1, 1, 0, 1, n=64),    # ResNet-50's l4-1x1: 64x128 unsplit, 128 blocks
], ids=["pw7-320to1280", "pw7-960to320", "l4-1x1"])
def test_wgrad_offers_a_split_that_fills_both_slots_of_a_two_block_tile(layer):
    """The tuner's co-resident twins: where a 64x128 tile's split leaves each SM one block though
    two fit (one consumer warpgroup, about 100 KB of ring), a twin of the same tile whose blocks
    take more than one an SM and no more than two, early enough for tuning on first use."""
    from convgen import autotune
    from convgen.footprint import resident_blocks

    twins = {(own.block_m, own.block_n): (i, own, twin) for i, own, twin in _twins(layer, Pass.WGRAD)}
    i, own, twin = twins[(64, 128)]
    gemm = layer.gemm(Pass.WGRAD)
    tiles = -(-gemm.m // 64) * -(-gemm.n // 128)
    assert resident_blocks(own, Pass.WGRAD, SM90) == 2
    assert tiles * own.split_k <= SM90.sm_count < tiles * twin.split_k <= 2 * SM90.sm_count
    assert i < autotune.CANDIDATES
    assert dataclasses.replace(twin, split_k=own.split_k, reasons=()) == dataclasses.replace(own, reasons=())
    # one block an SM at most (two consumer warpgroups, or a ring past half the SM): no twin
    assert all(resident_blocks(o, Pass.WGRAD, SM90) == 2 for _, o, _ in twins.values())


def test_co_resident_twins_only_in_wgrad_and_only_of_tiles_an_sm_holds_two_of():
    from convgen.footprint import resident_blocks

    pointwise = ConvProblem(7, 7, 512, 2048, 1, 1, 1, 0, 1, n=64)
    assert _twins(pointwise, Pass.FPROP) == [] and _twins(pointwise, Pass.DGRAD) == []
    # VGG-16 conv4_2 at batch 64: many waves; twins where counting two blocks an SM moves the split
    big = ConvProblem(28, 28, 512, 512, 3, 3, 1, 1, 1, n=64)
    twins = _twins(big, Pass.WGRAD)
    assert twins and all(resident_blocks(o, Pass.WGRAD, SM90) == 2 and t.split_k != o.split_k for _, o, t in twins)
    assert not any(o.block_m == 128 or o.block_n == 256 for _, o, _ in twins)
