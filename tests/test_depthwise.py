"""The depthwise kind on the CPU: groups in the IR and the reference, what the planner picks
and refuses (odd and drawn layers included), hand-plan checks that name the field at fault, the
fprop flags that round-trip through a plan's dict, the reasons a plan gives, and emission.
(Wgrad's tiles are tests/test_depthwise_wgrad.py's, the stencil's walk
tests/test_depthwise_stencil.py's, and the kernels' numbers tests/test_depthwise_gpu.py's.)"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, strategies as st

from convgen import reference
from convgen.emit import emit
from convgen.ir import ConvProblem, Epilogue, Pass
from convgen.spec import Plan
from convgen.mainloop import Depthwise, HaloTile
from convgen.spec import from_flags
from convgen.planner import check_plan, make_spec, plan
from convgen.ir import ARCHES, Target

PASSES = [Pass.FPROP, Pass.DGRAD, Pass.WGRAD]


def dw(h, w, c, r, s, stride=1, pad=0, dil=1, mult=1, n=2):
    return ConvProblem(h, w, c, c * mult, r, s, stride, pad, dil, groups=c, n=n)


def test_groups_in_the_ir():
    p = ConvProblem(8, 8, 32, 64, 3, 3, 1, 1, groups=4, n=2)
    assert p.w_shape == (64, 3, 3, 8)
    assert p.gemm("fprop").k == 9 * 8 and p.gemm("dgrad").k == 9 * 16 and p.gemm("wgrad").n == 9 * 8
    assert not p.depthwise and dw(8, 8, 16, 3, 3).depthwise
    assert "groups" not in ConvProblem(8, 8, 32, 64, 3, 3).geometry.as_dict()  # old keys unchanged
    with pytest.raises(ValueError, match="groups=3 must divide c=32"):
        ConvProblem(8, 8, 32, 48, 3, 3, groups=3)
    with pytest.raises(ValueError, match="groups=8 must divide k=12"):
        ConvProblem(8, 8, 32, 12, 3, 3, groups=8)
    with pytest.raises(ValueError, match="groups must be >= 1"):
        ConvProblem(8, 8, 32, 32, 3, 3, groups=0)


@pytest.mark.parametrize("groups,mult", [(1, 1), (4, 1), (12, 1), (12, 2)])
def test_grouped_reference_is_its_groups_side_by_side(groups, mult):
    """A grouped convolution is `groups` ungrouped ones over channel slices, concatenated:
    the reference's grouped path against its own ungrouped one, in all three passes."""
    rng = np.random.default_rng(groups * 10 + mult)
    n, h, w, c, r, s = 2, 9, 8, 12, 3, 3
    k = c * mult if groups == c else 24
    geo = dict(stride=(2, 1), padding=(1, 2), dilation=(1, 2))
    x = rng.standard_normal((n, h, w, c))
    wt = rng.standard_normal((k, r, s, c // groups))
    y = reference.fprop(x, wt, groups=groups, **geo)
    dy = rng.standard_normal(y.shape)
    dx = reference.dgrad(dy, wt, x.shape, groups=groups, **geo)
    dwt, db = reference.wgrad(x, dy, wt.shape, groups=groups, **geo)
    cg, kg = c // groups, k // groups
    for g in range(groups):
        xs, ws, ks = x[..., g * cg:(g + 1) * cg], wt[g * kg:(g + 1) * kg], slice(g * kg, (g + 1) * kg)
        np.testing.assert_allclose(y[..., ks], reference.fprop(xs, ws, **geo), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(dx[..., g * cg:(g + 1) * cg], reference.dgrad(dy[..., ks], ws, xs.shape, **geo),
                                   rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(dwt[ks], reference.wgrad(xs, dy[..., ks], ws.shape, **geo)[0], rtol=1e-12,
                                   atol=1e-12)
    np.testing.assert_allclose(db, dy.sum(axis=(0, 1, 2)))


def test_reference_names_grouped_channel_mismatch():
    with pytest.raises(ValueError, match="w has 4 input channels but x has 16 / groups 2"):
        reference.fprop(np.ones((1, 5, 5, 16)), np.ones((8, 3, 3, 4)), groups=2)


@pytest.mark.parametrize("pass_", PASSES, ids=lambda p: p.value)
@pytest.mark.parametrize("problem", [dw(56, 56, 144, 3, 3, 1, 1, n=128), dw(112, 112, 96, 3, 3, 2, 1, n=128),
                                     dw(56, 56, 96, 7, 7, 1, 3, n=64), dw(7, 7, 960, 3, 3, 1, 1, n=128),
                                     dw(9, 9, 8, 3, 3, 2, 1, mult=3), dw(5, 6, 3, 5, 5, 1, 2)],
                         ids=lambda p: p.describe().replace(" ", "_"))
def test_planner_takes_the_depthwise_kind_and_its_plan_checks(problem, pass_):
    pl = plan(problem, pass_)
    assert isinstance(pl.loop, Depthwise)
    assert any("depthwise" in r for r in pl.reasons)
    check_plan(pl, problem, pass_, Target(), "float16")
    # the plan's dict reads back as the same kind (tuning databases, spec keys)
    assert Plan.from_dict(pl.as_dict()) == pl
    src = emit(make_spec(problem, pass_))
    assert src.main.block[0] == pl.warps * 32
    assert src.main.shared_mem <= Target().smem_limit


def test_a_grouped_layer_with_several_channels_a_group_is_refused_the_depthwise_kind():
    p = ConvProblem(8, 8, 32, 32, 3, 3, 1, 1, groups=4, n=2)
    assert not isinstance(plan(p, "fprop").loop, Depthwise)
    with pytest.raises(ValueError, match=r"groups=4 with 8 input channels per group: the Depthwise kind runs one"):
        check_plan(Plan(64, 32, 16, 4, 1, 2, 8, 1, loop=Depthwise(8, 2)), p, "fprop", Target(), "float16")


def test_a_gemm_kind_is_refused_for_a_grouped_layer():
    p = dw(16, 16, 32, 3, 3, 1, 1)
    with pytest.raises(ValueError, match="depthwise layer runs the Depthwise kind, not HaloTile"):
        check_plan(Plan(64, 32, 16, 2, 2, 2, 8, 8, loop=HaloTile(16)), p, "fprop", Target(), "float16")


@pytest.mark.parametrize("change,match", [
    (dict(vec_a=16), "vec_a must be 1, 2, 4 or 8"),
    (dict(warps_m=2), "128 threads, 4 warp\\(s\\) of 32 on sm_90, but plan.warps_m=2"),
    (dict(split_k=2), "no reduction to split"),
    (dict(vec_b=8), "vec_b must be 1"),
    (dict(read_a="float32"), "read_a must be 'float16'"),
])
def test_hand_plan_errors_name_the_field(change, match):
    p = dw(16, 16, 32, 3, 3, 1, 1)
    base = Plan(64, 32, 16, 4, 1, 2, 8, 1, loop=Depthwise(8, 2))
    check_plan(base, p, "fprop", Target(), "float16")
    with pytest.raises(ValueError, match=match):
        check_plan(dataclasses.replace(base, **change), p, "fprop", Target(), "float16")


def test_depthwise_kind_validates_its_own_fields():
    with pytest.raises(ValueError, match="Depthwise.cols=3 must divide Depthwise.tile_w=8"):
        Depthwise(8, 3)
    with pytest.raises(ValueError, match="block_k = 16 and warps_n = 1"):
        Plan(64, 32, 32, 4, 1, 2, 8, 1, loop=Depthwise(8, 2))
    # stages is the ring of halo buffers: 2, or 3 where a block computes 3 tiles or more
    Plan(64, 32, 16, 4, 1, 3, 8, 1, loop=Depthwise(8, 2, 0, 4))
    for stages, tiles in ((3, 2), (4, 4), (3, 1)):
        with pytest.raises(ValueError, match="ring of halo buffers"):
            Plan(64, 32, 16, 4, 1, stages, 8, 1, loop=Depthwise(8, 2, 0, tiles))
    with pytest.raises(ValueError, match="wgrad stages two buffers"):
        check_plan(Plan(64, 32, 16, 4, 1, 3, 8, 8, loop=Depthwise(8, 2, 0, 4)), dw(16, 16, 32, 3, 3, 1, 1), "wgrad",
                   Target(), "float16")
    with pytest.raises(ValueError, match="Depthwise.rows=1 splits wgrad's filter rows"):
        check_plan(Plan(64, 32, 16, 4, 1, 2, 8, 1, loop=Depthwise(8, 2, 1)), dw(16, 16, 32, 3, 3, 1, 1), "fprop",
                   Target(), "float16")
    with pytest.raises(ValueError, match="needs plan.depthwise > 0"):
        from_flags(dw_rows=1)


def test_strided_dgrad_needs_stride_multiples():
    p = dw(16, 16, 32, 3, 3, 2, 1)
    with pytest.raises(ValueError, match="whole multiples of the stride"):
        check_plan(Plan(48, 32, 16, 3, 1, 2, 8, 1, loop=Depthwise(16, 4)), p, "dgrad", Target(), "float16")


def test_emission_is_deterministic_and_names_groups():
    p = dw(28, 28, 192, 3, 3, 2, 1, n=32)
    for pass_ in PASSES:
        a, b = emit(make_spec(p, pass_, epilogue=Epilogue(bias=pass_ is not Pass.DGRAD))), emit(
            make_spec(p, pass_, epilogue=Epilogue(bias=pass_ is not Pass.DGRAD)))
        assert a.source == b.source and "_g192_" in a.spec.name


def test_depthwise_plans_on_hip_targets_fit_their_shared_memory():
    for arch in ("gfx1100", "gfx942"):
        t = Target(arch)
        for pass_ in PASSES:
            for p in (dw(56, 56, 96, 7, 7, 1, 3, n=64), dw(112, 112, 96, 3, 3, 2, 1, n=8)):
                src = emit(make_spec(p, pass_, target=t))
                assert src.main.shared_mem <= t.smem_limit
                assert src.main.block[0] % t.warp_size == 0


# Layers the planner once could not plan (a fuzz of the planner alone): a strided dgrad whose
# tile grew past 1024 threads, a large multiplier's halo past a HIP part's 64 KB, and a wgrad
# whose row groups left no tile of whole warps within 1024 threads.
ODD = [
    (ConvProblem(36, 18, 17, 34, 7, 3, 3, 2, (2, 1), 17, n=7), Pass.DGRAD, Target("sm_86")),
    (ConvProblem(10, 13, 25, 25, 4, 5, 3, (0, 2), (2, 1), 25, n=64), Pass.DGRAD, Target("gfx1201")),
    (ConvProblem(21, 19, 120, 120, 2, 5, (3, 1), (1, 3), 2, 120, n=2), Pass.FPROP, Target("gfx1100")),
    (ConvProblem(31, 10, 4, 108, 6, 4, (1, 3), (3, 0), 1, 4, n=7), Pass.WGRAD, Target("sm_90")),
]


@pytest.mark.parametrize("problem, pass_, target", ODD, ids=lambda v: getattr(v, "arch", None) or str(v))
def test_the_planner_fits_odd_depthwise_layers_within_the_parts_limits(problem, pass_, target):
    p = plan(problem, pass_, target, "float16")
    check_plan(p, problem, pass_, target, "float16")  # <= 1024 threads, the part's shared memory
    assert isinstance(p.loop, Depthwise) and p.warps_m * target.warp_size <= 1024


def test_a_multiplier_too_large_for_the_depthwise_kind_is_refused_by_name():
    """K/C = 30 filters a channel over a 5-wide filter: wgrad's sums do not fit a thread's
    registers even for one channel and one filter row; the error says so, not an assertion."""
    with pytest.raises(ValueError, match=r"K/C = 30 filters a channel .* at most 22 filters a channel"):
        plan(ConvProblem(16, 16, 8, 240, 5, 5, 1, 2, 1, 8, n=2), Pass.WGRAD, Target("sm_90"))
    # and the last ODD layer, which fits an H200's 227 KB, not an A100's 163 KB
    with pytest.raises(ValueError, match=r"K/C = 27 filters .* 166912 bytes of shared memory on sm_80"):
        plan(ODD[-1][0], Pass.WGRAD, Target("sm_80"))


@st.composite
def depthwise_problems(draw):
    r, s, c = draw(st.integers(1, 7)), draw(st.integers(1, 7)), draw(st.integers(1, 200))
    pad = (draw(st.integers(0, 3)), draw(st.integers(0, 3)))
    dil = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    h = draw(st.integers(max(1, dil[0] * (r - 1) + 1 - 2 * pad[0]), 60))  # the dilated filter fits
    w = draw(st.integers(max(1, dil[1] * (s - 1) + 1 - 2 * pad[1]), 60))
    return ConvProblem(h, w, c, c * draw(st.sampled_from([1, 2, 3, 4, 8, 16, 30])), r, s,
                       (draw(st.integers(1, 3)), draw(st.integers(1, 3))), pad, dil, c,
                       n=draw(st.sampled_from([0, 1, 7, 64])))


@given(problem=depthwise_problems(), pass_=st.sampled_from(list(Pass)), arch=st.sampled_from(sorted(ARCHES)))
def test_every_depthwise_layer_plans_or_is_refused_by_name(problem, pass_, arch):
    """Any depthwise layer, any multiplier, stride, dilation and part: the planner's plan passes
    the checker, or the planner says which limit the layer is past (a large multiplier's sums
    or staged pixels); never an assertion or a plan the checker rejects."""
    target = Target(arch)
    try:
        p = plan(problem, pass_, target, "float16")
    except ValueError as e:
        assert "Depthwise" in str(e) and f"K/C = {problem.kg}" in str(e), str(e)
        return
    check_plan(p, problem, pass_, target, "float16")


def test_interleave_is_a_depthwise_fprop_and_dgrad_flag_that_round_trips():
    """Depthwise.interleave survives a plan dict (a tuning entry) and names its kernel; no
    other kind takes it, nor depthwise wgrad, whose grid already puts the chunk first."""
    problem = dw(13, 10, 144, 3, 3, 1, 1)
    inter = Plan(64, 64, 16, 4, 1, 2, 8, 1, loop=Depthwise(8, 4, 0, 2, True))
    d = inter.as_dict()
    assert d["dw_interleave"] is True and Plan.from_dict(d).loop.interleave
    assert "dw_interleave" not in dataclasses.replace(inter, loop=Depthwise(8, 4, 0, 2)).as_dict()
    assert emit(make_spec(problem, Pass.FPROP, plan_=inter)).main.kernel != emit(make_spec(
        problem, Pass.FPROP, plan_=dataclasses.replace(inter, loop=Depthwise(8, 4, 0, 2)))).main.kernel
    with pytest.raises(ValueError, match="needs plan.depthwise"):
        from_flags(dw_interleave=True)
    with pytest.raises(TypeError, match="must be a bool"):
        Depthwise(8, 4, 0, 2, 1)
    wgrad = plan(problem, Pass.WGRAD)
    with pytest.raises(ValueError, match="wgrad's grid already puts"):
        emit(make_spec(problem, Pass.WGRAD, plan_=dataclasses.replace(
            wgrad, loop=dataclasses.replace(wgrad.loop, interleave=True))))


def test_held_filter_is_an_fprop_field_that_round_trips_and_names_its_limits():
    """Depthwise.out_rows (a thread's output rows, its filter held in registers) survives a plan
    dict and names its kernel and template; it must divide the tile's rows, runs fprop alone,
    and is refused where the filter and sums would pass the register bound."""
    problem = dw(13, 11, 96, 7, 7, 1, 3)
    held = Plan(64, 64, 16, 4, 1, 2, 2, 1, loop=Depthwise(8, 4, 0, 2, out_rows=4))
    check_plan(held, problem, Pass.FPROP, Target("sm_90"), "float16")
    d = held.as_dict()
    assert d["dw_out_rows"] == 4 and Plan.from_dict(d) == held
    assert "dw_out_rows" not in dataclasses.replace(held, loop=Depthwise(8, 4, 0, 2)).as_dict()
    ks = emit(make_spec(problem, Pass.FPROP, plan_=held))
    assert "o4" in ks.main.kernel and "constexpr int OUT_ROWS = 4;" in ks.source and "IN_ROWS" in ks.source
    assert "constexpr int HALO_VEC = 8;" in ks.source  # 16-byte copies for a 2-channel thread
    with pytest.raises(ValueError, match="out_rows=3 does not divide the tile's 8 rows"):
        Plan(64, 64, 16, 4, 1, 2, 2, 1, loop=Depthwise(8, 4, 0, 2, out_rows=3))
    with pytest.raises(ValueError, match="out_rows must be >= 1"):
        Depthwise(8, 4, out_rows=0)
    with pytest.raises(ValueError, match="dgrad computes one row a thread"):
        check_plan(held, problem, Pass.DGRAD, Target("sm_90"), "float16")
    with pytest.raises(ValueError, match="7x7x4x1 weights and 4x4x4x1 sums, about 288 registers"):
        check_plan(Plan(64, 64, 16, 2, 1, 2, 4, 1, loop=Depthwise(8, 4, 0, 2, out_rows=4)), problem, Pass.FPROP,
                   Target("sm_90"), "float16")
    with pytest.raises(ValueError, match="needs plan.depthwise"):
        from_flags(dw_out_rows=2)


def test_mma_stencil_is_an_fprop_field_that_round_trips_and_names_what_it_needs():
    """Depthwise.mma (the stencil on mma.sync) survives a plan dict and picks its template; it is
    refused by name on what it cannot run: another pass, a stride, a dilation, a multiplier, a
    filter wider than 9, C not a multiple of 8, a part without mma.sync, or a tile that is not
    whole 16 x 8 blocks."""
    problem = dw(13, 11, 96, 7, 7, 1, 3)
    mma = Plan(256, 32, 16, 4, 1, 2, 8, 1, loop=Depthwise(16, 8, 0, 2, mma=True))
    check_plan(mma, problem, Pass.FPROP, Target("sm_90"), "float16")
    d = mma.as_dict()
    assert d["dw_mma"] is True and Plan.from_dict(d) == mma
    assert "dw_mma" not in dataclasses.replace(mma, loop=Depthwise(16, 8, 0, 2)).as_dict()
    ks = emit(make_spec(problem, Pass.FPROP, plan_=mma))
    assert ks.main.kernel.startswith("convgen_fprop_dw16c8x2m_") and "mma_16816<0>" in ks.source
    refusals = [(problem, Pass.DGRAD, "sm_90", "dgrad keeps the CUDA-core stencil"),
                (dw(13, 11, 96, 7, 7, 2, 3), Pass.FPROP, "sm_90", "stride 1"),
                (dw(13, 11, 96, 3, 3, 1, 2, 2), Pass.FPROP, "sm_90", "no dilation"),
                (dw(13, 11, 48, 3, 3, 1, 1, mult=2), Pass.FPROP, "sm_90", "2 filter"),
                (dw(13, 13, 96, 11, 11, 1, 5), Pass.FPROP, "sm_90", "S <= 9"),
                (dw(13, 11, 36, 3, 3, 1, 1), Pass.FPROP, "sm_90", "C = 36 is not a multiple of 8"),
                (problem, Pass.FPROP, "sm_75", "no mma.sync")]
    for prob, pass_, arch, match in refusals:
        with pytest.raises(ValueError, match=match):  # (4-channel stores: C = 36 reaches the stencil's own check)
            check_plan(dataclasses.replace(mma, vec_a=4), prob, pass_, Target(arch), "float16")
    for block_m, tile_w in ((128, 16), (128, 8)):  # 8 x 16 and 16 x 8 tiles: a warp sums pairs of 16 x 8 blocks
        with pytest.raises(ValueError, match="16-row and 16-column multiples"):
            check_plan(Plan(block_m, 32, 16, 4, 1, 2, 8, 1, loop=Depthwise(tile_w, 8, 0, 2, mma=True)), problem,
                       Pass.FPROP, Target("sm_90"), "float16")
    with pytest.raises(ValueError, match="needs plan.depthwise"):
        from_flags(dw_mma=True)
    with pytest.raises(TypeError, match="Depthwise.mma must be a bool"):
        Depthwise(16, 8, mma=1)


@pytest.mark.parametrize("pass_", [Pass.FPROP, Pass.DGRAD], ids=lambda p: p.value)
def test_the_depthwise_reasons_say_what_the_plan_runs(pass_):
    """`convgen plan`'s reasons for every depthwise suite layer's default agree with the plan:
    its tile, its tiles a block (dw144-56px-s2-5x5's said "4 tiles a block in turn" where two
    halos do not fit and one runs) and its run."""
    import re

    from convgen.depthwise import smem_bytes
    from convgen.suites import SUITES

    h200 = Target("sm_90", 132)
    for layers in SUITES.values():
        for layer in layers:
            if not layer.problem.depthwise:
                continue
            p = plan(layer.problem, pass_, h200)
            text = " | ".join(p.reasons)
            what = f"{layer.name} {pass_.value}: {text}"
            tiles = re.search(r"(\d+) tiles a block in turn", text)
            assert (int(tiles.group(1)) if tiles else 1) == p.loop.tiles, what
            if "one tile a block: two halos" in text:  # and they do not
                two = dataclasses.replace(p, loop=dataclasses.replace(p.loop, tiles=2))
                assert smem_bytes(two, layer.problem, pass_) > h200.smem_limit, what
            tile = re.search(r"tile (\d+)x(\d+) pixels, (\d+) a thread", text)
            vec = re.search(r"vec (\d+): ", text)
            assert tile is not None and vec is not None, what
            th, tw, cols = (int(v) for v in tile.groups())
            long_run = "then runs of 8 outputs over 4 channels" in text
            held = re.search(r"then 4 x 4 outputs over (\d+) channels a thread with its \dx\d filter held", text)
            assert (th * tw, tw) == (p.block_m, p.loop.tile_w), what
            if held:  # the held-filter default (depthwise.held_default): 4 rows of runs of 4
                assert (4, 4, int(held.group(1))) == (p.loop.out_rows, p.loop.cols, p.vec_a), what
                continue
            assert p.loop.out_rows == 1, what
            assert (8 if long_run else cols, 4 if long_run else int(vec.group(1))) == (p.loop.cols, p.vec_a), what
