"""The depthwise kind on the CPU: groups in the IR and the reference, what the planner picks
and refuses, hand-plan checks that name the field at fault, and emission that compiles.
(The kernels' numbers are tests/test_depthwise_gpu.py's.)"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from convgen import reference
from convgen.emit import emit
from convgen.ir import ConvProblem, Epilogue, Pass, Plan
from convgen.mainloop import Depthwise, HaloTile, from_flags
from convgen.planner import check_plan, make_spec, plan
from convgen.ir import Target

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


def test_planner_refuses_other_groupings_naming_groups():
    with pytest.raises(ValueError, match=r"groups=4 with 8 input channels per group: only depthwise"):
        plan(ConvProblem(8, 8, 32, 32, 3, 3, 1, 1, groups=4, n=2), "fprop")


def test_a_gemm_kind_is_refused_for_a_grouped_layer():
    p = dw(16, 16, 32, 3, 3, 1, 1)
    with pytest.raises(ValueError, match="grouped layer runs the Depthwise kind, not HaloTile"):
        check_plan(Plan(64, 32, 16, 2, 2, 2, 8, 8, loop=HaloTile(16)), p, "fprop", Target(), "float16")


@pytest.mark.parametrize("change,match", [
    (dict(vec_a=16), "vec_a must be 1, 2, 4 or 8"),
    (dict(warps_m=2), "128 threads, but plan.warps_m=2 gives 64"),
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
    with pytest.raises(ValueError, match="block_k = 16, stages = 2"):
        Plan(64, 32, 32, 4, 1, 2, 8, 1, loop=Depthwise(8, 2))
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
