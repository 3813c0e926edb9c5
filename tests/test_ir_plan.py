"""convgen.spec's Plan and convgen.mainloop's kinds: derived values, the checks at construction,
and the dicts plans are written as.  A hand-written plan is rejected where it is typed, with a
ValueError that names the field at fault; the dict format is part of every spec key and of the
shipped tuning databases, so a plan written before must read back as the same kind and write
back unchanged.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from convgen.ir import ConvProblem, Pass
from convgen.spec import Plan
from convgen.mainloop import KINDS, Depthwise, FlatHalo, HaloLdsm, HaloTile, Im2col, StagedHalo, TmaHalo, TmaWgmma, Wgmma

from test_ir import ROOT  # the repository's root


# --------------------------------------------------------------------------- Plan

BASE_PLAN = dict(block_m=64, block_n=64, block_k=32, warps_m=2, warps_n=2, stages=3, vec_a=8, vec_b=8)


def make_plan(**changes):
    return Plan(**{**BASE_PLAN, **changes})


def test_plan_derived_values():
    p = make_plan(block_m=128, warps_m=4, warps_n=1)
    assert p.warps == 4 and p.warp_tile == (32, 64) and p.fragments == (2, 4)
    assert "reasons" not in p.as_dict()
    assert make_plan(reasons=("a",)) == make_plan(reasons=("b",))  # reasons are commentary


@pytest.mark.parametrize("name", ["block_m", "block_n", "block_k"])
@pytest.mark.parametrize("value", [8, 24, 40, 100])
def test_plan_tiles_must_be_fragment_multiples(name, value):
    with pytest.raises(ValueError, match=rf"plan\.{name} must be a multiple of 16 \(the fragment size\), got {value}"):
        make_plan(**{name: value})


@pytest.mark.parametrize("name", ["block_m", "block_n", "block_k", "warps_m", "warps_n", "stages", "vec_a", "vec_b", "split_k"])
def test_plan_values_below_one_are_rejected(name):
    with pytest.raises(ValueError, match=rf"plan\.{name} must be >= 1, got 0"):
        make_plan(**{name: 0})


@pytest.mark.parametrize(
    "changes, msg",
    [
        (dict(warps_m=3), r"plan\.block_m=64 does not split into warps_m=3"),
        (dict(warps_m=8), r"plan\.block_m=64 does not split into warps_m=8"),
        (dict(block_n=32, warps_n=4), r"plan\.block_n=32 does not split into warps_n=4"),
        (dict(block_n=48, warps_n=2), r"plan\.block_n=48 does not split into warps_n=2"),
    ],
)
def test_plan_warps_must_divide_the_block(changes, msg):
    with pytest.raises(ValueError, match=msg):
        make_plan(**changes)


@pytest.mark.parametrize("name", ["vec_a", "vec_b"])
@pytest.mark.parametrize("value", [3, 6, 16])
def test_plan_vector_widths(name, value):
    with pytest.raises(ValueError, match=rf"plan\.{name} must be 1, 2, 4 or 8 elements, got {value}"):
        make_plan(**{name: value})
    for ok in (1, 2, 4, 8):
        assert getattr(make_plan(**{name: ok}), name) == ok


def test_plan_sliced_k():
    p = make_plan(block_k=64, loop=Im2col(2))
    assert p.warps == 8 and p.warp_tile == (32, 32)  # a slice's warp tile is the unsliced one
    assert p.as_dict()["warps_k"] == 2 and "warps_k" not in make_plan().as_dict()  # old keys stay
    assert p.brief() == "64x64x64 w2x2x2 s3 k1" and "x2, K sliced 2 ways" in p.explain()
    with pytest.raises(ValueError, match=r"plan\.block_k=32 does not split into Im2col\.warps_k=4 slices"):
        make_plan(loop=Im2col(4))


def test_plan_wgmma_takes_whole_warpgroups_over_m():
    p = make_plan(block_m=128, warps_m=4, warps_n=1, loop=Wgmma())
    assert p.as_dict()["wgmma"] is True and "wgmma" not in make_plan().as_dict()
    assert p.brief() == "128x64x32 w4x1 s3 k1 wgmma" and p.explain().endswith(", wgmma on 1 warpgroup(s)")
    for bad, grid in ((dict(warps_m=2, warps_n=2), "2x2"), (dict(warps_m=2, warps_n=1), "2x1"),
                      (dict(block_m=128, warps_m=4, warps_n=2), "4x2")):
        with pytest.raises(ValueError, match=rf"Wgmma needs whole warpgroups over M: .* got {grid}"):
            make_plan(loop=Wgmma(), **bad)


def test_plan_loop_must_be_a_kind():
    for bad in (None, "im2col", dict(tile_w=16)):
        with pytest.raises(TypeError, match=r"plan\.loop must be a main-loop kind \(Im2col, Wgmma, TmaWgmma, TmaHalo, HaloTile"):
            make_plan(loop=bad)
    with pytest.raises(TypeError, match="unexpected keyword argument 'tile_w'"):  # flags are gone
        make_plan(tile_w=16)


@pytest.mark.parametrize("make, msg", [
    (lambda: Im2col(0), r"Im2col\.warps_k must be >= 1, got 0"),
    (lambda: Im2col(2.0), r"Im2col\.warps_k must be an integer, got 2\.0"),
    (lambda: HaloTile(8), r"HaloTile\.tile_w=8 must be a positive multiple of 16: .*HaloLdsm"),
    (lambda: HaloTile(24), r"HaloTile\.tile_w=24 must be a positive multiple of 16"),
    (lambda: HaloTile(0), r"HaloTile\.tile_w=0 must be a positive multiple of 16"),
    (lambda: HaloTile(16, 0), r"HaloTile\.tiles must be >= 1, got 0"),
    (lambda: HaloTile(True), r"HaloTile\.tile_w must be an integer, got True"),
    (lambda: HaloLdsm(16), r"HaloLdsm\.tile_w=16 must be an odd multiple of 8 .*: a multiple of 16 is a HaloTile"),
    (lambda: HaloLdsm(12), r"HaloLdsm\.tile_w=12 must be an odd multiple of 8"),
    (lambda: HaloLdsm(8, -1), r"HaloLdsm\.tiles must be >= 1, got -1"),
    (lambda: FlatHalo(0), r"FlatHalo\.tiles must be >= 1, got 0"),
    (lambda: StagedHalo(8), r"StagedHalo\.tile_w=8 must be a positive multiple of 16"),
    (lambda: StagedHalo(-16), r"StagedHalo\.tile_w=-16 must be a positive multiple of 16"),
])
def test_kinds_reject_bad_parameters_naming_the_field(make, msg):
    with pytest.raises(ValueError, match=msg):
        make()


@pytest.mark.parametrize("loop, changes, msg", [
    (HaloTile(32), dict(block_m=48, warps_m=1), r"HaloTile\.tile_w=32 does not divide plan\.block_m=48"),
    (HaloLdsm(24), dict(block_m=64), r"HaloLdsm\.tile_w=24 does not divide plan\.block_m=64"),
    (StagedHalo(32), dict(block_m=48, warps_m=1), r"StagedHalo\.tile_w=32 does not divide plan\.block_m=48"),
    (HaloTile(16, 2), dict(split_k=2), r"HaloTile\.tiles=2 needs plan\.split_k = 1, got 2"),
    (HaloLdsm(8, 4), dict(split_k=3), r"HaloLdsm\.tiles=4 needs plan\.split_k = 1, got 3"),
    (FlatHalo(2), dict(split_k=2), r"FlatHalo\.tiles=2 needs plan\.split_k = 1, got 2"),
])
def test_kinds_check_the_plans_shared_fields(loop, changes, msg):
    with pytest.raises(ValueError, match=msg):
        make_plan(loop=loop, **changes)


def test_kind_tags_name_their_configuration():
    tags = [Im2col().tag, Im2col(2).tag, Wgmma().tag, HaloTile(16).tag, HaloTile(32, 4).tag, HaloLdsm(8).tag,
            HaloLdsm(8, 2).tag, FlatHalo().tag, FlatHalo(3).tag, StagedHalo(16).tag, TmaWgmma().tag,
            Depthwise(16, 4).tag, Depthwise(32, 2, 1).tag, Depthwise(8, 4, 0, 3).tag, TmaHalo(32).tag, TmaHalo(128).tag]
    assert tags == ["im2col", "im2colk2", "wgmma", "halo16", "halo32x4", "ldsm8", "ldsm8x2", "flat", "flatx3",
                    "staged16", "tma", "dw16c4", "dw32c2r1", "dw8c4x3", "tmahalo32", "tmahalo128"]
    assert {k.__name__ for k in KINDS} == {"Im2col", "Wgmma", "TmaWgmma", "TmaHalo", "HaloTile", "HaloLdsm",
                                                "FlatHalo", "StagedHalo", "Depthwise"}


# Plans in the dicts they have always been written as (the tuning database's format, part of
# every spec key), with the kind each reads back as.
_SHARED = dict(block_m=128, block_n=64, block_k=32, warps_m=4, warps_n=1, stages=3, vec_a=8, vec_b=8,
               read_a="float16", read_b="float16", split_k=1)
LEGACY = [
    ({}, Im2col()),
    ({"warps_k": 2}, Im2col(2)),
    ({"wgmma": True}, Wgmma()),
    ({"tile_w": 16}, HaloTile(16)),
    ({"tile_w": 32, "tiles": 4}, HaloTile(32, 4)),
    ({"tile_w": 8}, HaloLdsm(8)),
    ({"tile_w": 8, "tiles": 2}, HaloLdsm(8, 2)),
    ({"flat": True}, FlatHalo()),
    ({"tiles": 2, "flat": True}, FlatHalo(2)),
]


@pytest.mark.parametrize("flags, loop", LEGACY, ids=[repr(l) for _, l in LEGACY])
def test_plan_dicts_keep_their_format(flags, loop):
    d = {**_SHARED, **flags}
    p = Plan(**{k: v for k, v in _SHARED.items()}, loop=loop)
    assert p.as_dict() == d and list(p.as_dict()) == [*_SHARED, *flags]
    assert Plan.from_dict(d) == p and Plan.from_dict(d).loop == loop


def test_a_2d_halo_dict_reads_as_staged_on_a_layer_that_stages_its_halo():
    d = {**_SHARED, "vec_a": 1, "vec_b": 1, "tile_w": 16}
    c3 = ConvProblem(32, 32, 3, 16, 3, 3, 1, 1, n=2)
    assert Plan.from_dict(d, c3, Pass.FPROP).loop == StagedHalo(16)
    assert Plan.from_dict(d, c3, "dgrad").loop == HaloTile(16)  # dgrad reads dy's K channels in place
    assert Plan.from_dict(d).loop == HaloTile(16)
    assert Plan.from_dict(d, c3, Pass.FPROP).as_dict() == d
    with pytest.raises(ValueError, match=r"plan\.tiles=2: a layer that stages its whole halo"):
        Plan.from_dict({**d, "tiles": 2}, c3, Pass.FPROP)


@pytest.mark.parametrize("flags, exc, msg", [
    (dict(tile_w=16, flat=True), ValueError, r"plan\.flat=True takes tile_w=0, got tile_w=16"),
    (dict(tile_w=16, warps_k=2), ValueError, r"plan\.warps_k=2 needs an im2col plan"),
    (dict(flat=True, warps_k=2), ValueError, r"plan\.warps_k=2 needs an im2col plan"),
    (dict(wgmma=True, tile_w=16), ValueError, r"plan\.wgmma=True takes no halo tile and no sliced K"),
    (dict(wgmma=True, warps_k=2), ValueError, r"plan\.wgmma=True takes no halo tile and no sliced K"),
    (dict(tiles=2), ValueError, r"plan\.tiles=2 must be 1 without a halo tile"),
    (dict(tile_w=12), ValueError, r"plan\.tile_w=12 must be 0 \(no halo tile\) or a multiple of 8"),
    (dict(tile_w=-8), ValueError, r"plan\.tile_w=-8 must be 0"),
    (dict(flat=1), TypeError, r"plan\.flat must be a bool, got 1"),
    (dict(wgmma="yes"), TypeError, r"plan\.wgmma must be a bool, got 'yes'"),
    (dict(warps_k=0), ValueError, r"Im2col\.warps_k must be >= 1, got 0"),
    (dict(halo=True), ValueError, r"plan dict has unknown keys \['halo'\]"),
])
def test_bad_plan_dicts_are_rejected_naming_the_field(flags, exc, msg):
    with pytest.raises(exc, match=msg):
        Plan.from_dict({**_SHARED, **flags})


def test_every_shipped_tuned_plan_round_trips():
    """The shipped databases' plans, now and as shipped until 27682a8 (58 entries of every
    kind), read back as kinds and write the same dicts again, with and without the layer
    they were tuned for."""
    entries = [e for path in (ROOT / "convgen" / "tuning" / "nvidia-h200.json", ROOT / "tests" / "data" /
                              "h200-tuning-27682a8.json")
               for gpu in json.loads(path.read_text())["gpus"].values() for e in gpu.values()]
    assert len(entries) == 3 + 58
    kinds = set()
    for e in entries:
        problem = ConvProblem(**e["shape"])
        for plan in (Plan.from_dict(e["plan"]), Plan.from_dict(e["plan"], problem, e["pass"])):
            assert plan.as_dict() == e["plan"]
            assert json.dumps(plan.as_dict(), sort_keys=True) == json.dumps(e["plan"], sort_keys=True)
        kinds.add(type(Plan.from_dict(e["plan"], problem, e["pass"]).loop).__name__)
    # (its FlatHalo entries went with resnet50's dropped ones; test_plan_dicts_keep_their_format round-trips the kind)
    assert kinds == {"Im2col", "HaloTile", "HaloLdsm", "StagedHalo", "TmaWgmma"}


def test_the_emitters_view_of_each_kind():
    """tile_w, tiles, flat, warps_k, wgmma and halo: the fields the templates read."""
    view = lambda p: (p.tile_w, p.tiles, p.flat, p.warps_k, p.wgmma, p.halo)  # noqa: E731
    assert view(make_plan()) == (0, 1, False, 1, False, False)
    assert view(make_plan(block_k=64, loop=Im2col(2))) == (0, 1, False, 2, False, False)
    assert view(make_plan(block_m=128, warps_m=4, warps_n=1, loop=Wgmma())) == (0, 1, False, 1, True, False)
    assert view(make_plan(loop=HaloTile(32, 2))) == (32, 2, False, 1, False, True)
    assert view(make_plan(loop=HaloLdsm(8))) == (8, 1, False, 1, False, True)
    assert view(make_plan(loop=FlatHalo(4))) == (0, 4, True, 1, False, True)
    assert view(make_plan(loop=StagedHalo(16))) == (16, 1, False, 1, False, True)


def test_explain_names_the_kind():
    assert make_plan(loop=HaloTile(16, 2)).explain() == (
        "block 64x64x32, 4 warps (2x2, warp tile 32x32), 3 stages, vec A/B 8/8, read A/B float16/float16, "
        "split-K 1, halo tile 4x16 pixels, 2 tiles per block")
    assert make_plan(loop=FlatHalo()).explain().endswith("split-K 1, flat halo tile of 64 grid positions")
    assert make_plan(loop=StagedHalo(32)).explain().endswith("split-K 1, halo tile 2x32 pixels")
    assert make_plan(block_k=64, loop=Im2col(2)).explain() == (
        "block 64x64x64, 8 warps (2x2x2, K sliced 2 ways, warp tile 32x32), 3 stages, vec A/B 8/8, "
        "read A/B float16/float16, split-K 1")


def test_replace_changes_the_kind():
    p = make_plan(loop=HaloTile(16))
    q = dataclasses.replace(p, loop=dataclasses.replace(p.loop, tiles=4))
    assert q.loop == HaloTile(16, 4) and q.as_dict()["tiles"] == 4 and p.tiles == 1
    assert dataclasses.replace(p, loop=Im2col()) == make_plan()


@pytest.mark.parametrize("stages", [1, 9])
def test_plan_stage_count(stages):
    with pytest.raises(ValueError, match=rf"plan\.stages must be between 2 and 8, got {stages}"):
        make_plan(stages=stages)


@pytest.mark.parametrize("name", ["read_a", "read_b"])
def test_plan_read_dtypes(name):
    with pytest.raises(ValueError, match=rf"plan\.{name} must be one of .*got 'int8'"):
        make_plan(**{name: "int8"})


@pytest.mark.parametrize("name", ["block_m", "stages", "split_k"])
def test_plan_rejects_non_integers(name):
    with pytest.raises(ValueError, match=rf"{name} must be an integer, got 32\.0"):
        make_plan(**{name: 32.0})
