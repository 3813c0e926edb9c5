"""The depthwise kind on the CPU: groups in the IR and the reference, what the planner picks
and refuses, hand-plan checks that name the field at fault, and emission that compiles.
(The kernels' numbers are tests/test_depthwise_gpu.py's.)"""

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


# ---- wgrad: pixel tiles staged in shared memory (convgen/depthwise_wgrad.py) ----

def _suite_layers(*names):
    from convgen.suites import SUITES

    return [layer.problem for name in names for layer in SUITES[name]]


@pytest.mark.parametrize("problem", _suite_layers("mobilenetv2-dw", "convnext-dw", "efficientnet-b0-dw"),
                         ids=lambda p: p.describe().replace(" ", "_"))
def test_wgrad_plans_fit_the_h200_rules(problem):
    """Each suite layer's wgrad plan: at most 256 threads, two tiles' buffers within a third of
    the SM's shared memory, sums and held dy values within the register budget, and blocks
    (channel chunks x slices) for 4 to 9 an SM, or, summed in the kernel, all resident at once
    at 128 registers a thread (2 an SM of 256 threads), every slice at least one tile."""
    from convgen.depthwise import MAX_WGRAD_ACCS, MAX_WGRAD_HELD, facts, smem_bytes

    t = Target()
    pl = plan(problem, Pass.WGRAD)
    f = facts(pl, problem, Pass.WGRAD)
    assert f.threads == pl.warps * 32 <= 256 and pl.loop.tiles == 1
    assert smem_bytes(pl, problem, Pass.WGRAD) <= t.smem_limit // 3
    acc = f.vec * f.mult * (problem.r // f.row_groups) * problem.s
    assert acc <= MAX_WGRAD_ACCS and acc + f.cols * f.vec * f.mult <= MAX_WGRAD_HELD
    chunks = -(-problem.c // f.chunk)
    blocks = chunks * pl.split_k
    tiles = problem.n * f.tiles_h * f.tiles_w
    if pl.split_reduce == "grid":
        assert (65536 // (pl.warps * 32 * 128) * t.sm_count) - chunks < blocks <= 4 * t.sm_count
    else:
        assert 4 * t.sm_count <= blocks <= 9 * t.sm_count
    assert pl.split_k <= tiles
    assert any("tile" in r and "modelled cost" in r for r in pl.reasons)


def test_wgrad_facts_and_shared_memory():
    """The halo a tile's taps reach, the run's staged columns, and shared memory: two x halos
    and two dy tiles, or the warps' sums where those are larger (they alias the buffers)."""
    from convgen.depthwise import facts, smem_bytes

    p = dw(20, 21, 32, 5, 3, (2, 1), (2, 1), (1, 2), n=2)  # P x Q = 10 x 17
    pl = Plan(64, 32, 16, 4, 1, 2, 4, 4, split_k=3, loop=Depthwise(16, 4))
    check_plan(pl, p, "wgrad", Target(), "float16")
    f = facts(pl, p, Pass.WGRAD)
    assert (f.tile_h, f.tile_w, f.tiles_h, f.tiles_w) == (4, 16, 3, 2)
    assert (f.halo_h, f.halo_w, f.in_cols) == (3 * 2 + 4 + 1, 15 + 4 + 1, 3 + 4 + 1)
    assert f.pix_ld >= 32 and f.dy_ld >= 32 and f.pix_ld % 8 == 0 and f.dy_ld % 8 == 0 and f.stage_vec == 8
    buffers = (f.halo_halves + f.dy_halves) * 2 * 2
    assert smem_bytes(pl, p, Pass.WGRAD) == max(buffers, f.weight_floats * 4)
    assert f.weight_floats == 4 * (5 * 3 + 1) * 32  # 4 warps' dw taps and db


@pytest.mark.parametrize("change,match", [
    (dict(loop=Depthwise(32, 2, 0, 2)), "Depthwise.tiles must be 1"),
    (dict(block_m=256, loop=Depthwise(32, 16), warps_m=1), r"Depthwise.out_rows x cols x vec_a x m = 128"),
    (dict(warps_m=1), "64 threads, but plan.warps_m=1 gives 32"),
    (dict(vec_b=1), "vec_b must be 8"),
    (dict(loop=Depthwise(32, 2, 2)), "Depthwise.rows=2 splits wgrad's filter rows"),
])
def test_wgrad_hand_plan_errors_name_the_field(change, match):
    p = dw(13, 19, 32, 3, 3, 1, 1)
    base = Plan(64, 16, 16, 2, 1, 2, 8, 8, split_k=2, loop=Depthwise(32, 2))  # a 2x32 tile
    check_plan(base, p, "wgrad", Target(), "float16")
    with pytest.raises(ValueError, match=match):
        check_plan(dataclasses.replace(base, **change), p, "wgrad", Target(), "float16")


def _emulate_wgrad(problem, pl, rng):
    """The wgrad kernel's walk in NumPy (tiles of slices, zero-filled staging, runs, row groups),
    from the facts the template reads; returns (dw, db) as [K, R, S, 1] and [K]."""
    from convgen.depthwise import facts

    f = facts(pl, problem, Pass.WGRAD)
    g = problem
    (sh, sw), (ph, pw), (dh, dl) = g.stride, g.padding, g.dilation
    x = rng.integers(-3, 4, (g.n, g.h, g.w, g.c)).astype(np.float64)
    dy = rng.integers(-3, 4, (g.n, g.p, g.q, g.k)).astype(np.float64)
    m, rows_t, per_row = g.kg, g.r // f.row_groups, f.tile_w // f.cols
    # zero padding everywhere a staged copy can reach, so the slices below never leave the arrays
    xp = np.zeros((g.n, g.h + 2 * (ph + f.halo_h), g.w + 2 * (pw + f.halo_w), g.c + f.chunk))
    xp[:, ph + f.halo_h:ph + f.halo_h + g.h, pw + f.halo_w:pw + f.halo_w + g.w, :g.c] = x
    dyp = np.zeros((g.n, g.p + f.tile_h, g.q + f.tile_w, g.k + f.chunk * m))
    dyp[:, :g.p, :g.q, :g.k] = dy
    out_dw, out_db = np.zeros((g.k, g.r * g.s)), np.zeros(g.k)
    tiles = g.n * f.tiles_h * f.tiles_w
    per = -(-tiles // pl.split_k)
    for c0 in range(0, g.c, f.chunk):
        for z in range(pl.split_k):
            acc = np.zeros((f.row_groups, f.tile_h, per_row, rows_t * g.s, f.chunk * m))
            dbs = np.zeros(f.chunk * m)
            for t in range(z * per, min(z * per + per, tiles)):
                n, p0, q0 = t // (f.tiles_h * f.tiles_w), t // f.tiles_w % f.tiles_h * f.tile_h, t % f.tiles_w * f.tile_w
                y0, x0 = p0 * sh - ph + ph + f.halo_h, q0 * sw - pw + pw + f.halo_w
                halo = xp[n, y0:y0 + f.halo_h, x0:x0 + f.halo_w, c0:c0 + f.chunk]
                tile = dyp[n, p0:p0 + f.tile_h, q0:q0 + f.tile_w, c0 * m:(c0 + f.chunk) * m]
                dbs += tile.sum(axis=(0, 1))
                for grp, ty, tx in np.ndindex(f.row_groups, f.tile_h, per_row):
                    d = tile[ty, tx * f.cols:(tx + 1) * f.cols]
                    for ri, j, o in np.ndindex(rows_t, f.in_cols, f.cols):
                        sd = j - o * sw
                        if sd < 0 or sd % dl or sd // dl >= g.s:
                            continue
                        xv = halo[ty * sh + (grp * rows_t + ri) * dh, tx * f.cols * sw + j]
                        acc[grp, ty, tx, ri * g.s + sd // dl] += d[o] * np.repeat(xv, m)
            k1 = min(g.k, (c0 + f.chunk) * m)
            for grp in range(f.row_groups):
                part = acc[grp].sum(axis=(0, 1))[:, :k1 - c0 * m].T
                out_dw[c0 * m:k1, grp * rows_t * g.s:(grp + 1) * rows_t * g.s] += part
            out_db[c0 * m:k1] += dbs[:k1 - c0 * m]
    ref_dw, ref_db = reference.wgrad(x, dy, g.w_shape, stride=g.stride, padding=g.padding, dilation=g.dilation,
                                     groups=g.groups)
    return out_dw.reshape(ref_dw.shape), out_db, ref_dw, ref_db


@pytest.mark.parametrize("problem,hand", [
    (dw(13, 10, 24, 3, 3, 2, 1), None),
    (dw(9, 7, 4, 3, 5, (1, 2), (1, 2), mult=3), None),
    (dw(14, 14, 96, 7, 7, 1, 3), None),
    (dw(6, 6, 3, 3, 3, 1, 1), None),
    (dw(1, 1, 4, 1, 1, 1, 0, n=1), None),  # a 1x1 image: the block's runs lie mostly past its edge
    (dw(2, 3, 8, 3, 3, 2, 1, mult=2), None),
    (dw(10, 13, 16, 3, 3, 1, 2, 2, n=3), None),
    (dw(11, 12, 32, 3, 3, (2, 1), (1, 2), n=2), Plan(32, 16, 16, 3, 1, 2, 8, 8, split_k=3, loop=Depthwise(32, 2, 1))),
    (dw(20, 21, 32, 5, 3, (2, 1), (2, 1), (1, 2), n=2), Plan(64, 32, 16, 4, 1, 2, 4, 4, split_k=4, loop=Depthwise(16, 4))),
], ids=lambda v: v.describe().replace(" ", "_") if isinstance(v, ConvProblem) else "hand" if v else "planned")
def test_wgrad_tiling_emulated_is_exact(problem, hand):
    """The kernel's walk over tiles, slices (1, 3 and the plan's: several tiles a slice, slices
    that end mid-image, edge tiles partly outside) and staged halos covers every (pixel, tap)
    pair exactly once: integer data, equal to the float64 reference."""
    base = hand or plan(problem, Pass.WGRAD)
    for split in sorted({1, 3, base.split_k}):
        pl = dataclasses.replace(base, split_k=split, split_reduce=base.split_reduce if split > 1 else "kernel")
        check_plan(pl, problem, "wgrad", Target(), "float16")
        got_dw, got_db, ref_dw, ref_db = _emulate_wgrad(problem, pl, np.random.default_rng(split))
        np.testing.assert_array_equal(got_dw, ref_dw)
        np.testing.assert_array_equal(got_db, ref_db)


def test_wgrad_kernels_compile_without_spills():
    """NVRTC builds wgrad's odd corners (channel multipliers, C = 3 with vec 1, stride 3,
    dilation, bf16, no db, unsplit, fp32 out) for sm_90 and for sm_75 (no cp.async; sm_80 for bf16), with
    no local memory."""
    pytest.importorskip("cupy", reason="NVRTC comes with CuPy")
    from convgen.compile import compile_binary

    cases = [(dw(9, 7, 4, 3, 5, (1, 2), (1, 2), mult=3), "float16", True, None),
             (dw(6, 6, 3, 3, 3, 1, 1), "bfloat16", True, None),
             (dw(16, 16, 32, 3, 3, 3, 1), "float16", False, 1),
             (dw(10, 13, 16, 3, 3, 1, 2, 2), "float32", True, 1),
             (dw(56, 56, 96, 7, 7, 1, 3, n=64), "bfloat16", False, None),
             (dw(1, 1, 4, 1, 1, 1, 0, n=1), "float16", True, None)]
    for problem, out, bias, split in cases:
        for arch in ("sm_90", "sm_80" if out == "bfloat16" else "sm_75"):  # sm_75 has no bf16 MMA
            in_dtype = "bfloat16" if out == "bfloat16" else "float16"
            spec = make_spec(problem, Pass.WGRAD, target=Target(arch), in_dtype=in_dtype,
                             epilogue=Epilogue(bias=bias, out_dtype=out))
            if split is not None:
                spec = make_spec(problem, Pass.WGRAD, target=Target(arch), in_dtype=in_dtype,
                                 epilogue=Epilogue(bias=bias, out_dtype=out),
                                 plan_=dataclasses.replace(spec.plan, split_k=split, split_reduce="kernel"))
            src = emit(spec)
            binary = compile_binary(src.source, arch=arch, name=src.filename)
            assert binary[:4] == b"\x7fELF"
            _assert_no_local_memory(binary)


def _assert_no_local_memory(binary: bytes) -> None:
    import subprocess
    import tempfile

    from convgen.tools.sass import find_cuobjdump

    tool = find_cuobjdump()
    if tool is None:
        return
    with tempfile.NamedTemporaryFile(suffix=".cubin") as fh:
        fh.write(binary)
        fh.flush()
        report = subprocess.run([tool, "--dump-resource-usage", fh.name], capture_output=True, text=True).stdout
    for line in report.splitlines():
        if "REG:" in line and "_reduce" not in line:
            assert " STACK:0 " in line and " LOCAL:0" in line, line


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


def _emulate_stencil(problem, pass_, pl, rng):
    """The fprop or dgrad kernel's walk in NumPy, from the facts its template reads and the grid
    its launch takes: blocks of TILES_PB tiles per channel chunk, a zero-filled staged halo,
    runs of COLS outputs per thread whose staged reads must stay inside the halo, and stores
    guarded as the kernel guards them.  Returns (got, reference); unwritten outputs are NaN."""
    from convgen.depthwise import facts

    g, f = problem, facts(pl, problem, pass_)
    (sh, sw), (ph, pw), (dh, dl), m = g.stride, g.padding, g.dilation, g.kg
    fprop = pass_ is Pass.FPROP
    src = rng.integers(-3, 4, (g.n, g.h, g.w, g.c) if fprop else (g.n, g.p, g.q, g.k)).astype(np.float64)
    wt = rng.integers(-3, 4, g.w_shape).astype(np.float64)
    src_h, src_w, src_c = (g.h, g.w, g.c) if fprop else (g.p, g.q, g.k)
    out_h, out_w = (g.p, g.q) if fprop else (g.h, g.w)
    got = np.full((g.n, out_h, out_w, g.k if fprop else g.c), np.nan)
    grid = emit(make_spec(problem, pass_, plan_=pl)).main.grid(g.n)
    total = g.n * f.tiles_h * f.tiles_w
    assert grid[0] * f.tiles_pb >= total and grid[1] * f.chunk >= g.c, "the grid covers every tile and channel"
    wide = f.chunk * m  # staged channels a pixel (dgrad: the chunk's dy channels)
    for by, bx in np.ndindex(grid[1], grid[0]):
        if f.interleave:  # block_work's order: consecutive blocks take one group's chunks in turn
            b = by * grid[0] + bx
            by, bx = b % grid[1], b // grid[1]
        c0 = by * f.chunk
        wts = np.zeros((wide, g.r, g.s))
        k1 = min(g.k, (c0 + f.chunk) * m)
        wts[:k1 - c0 * m] = wt[c0 * m:k1, :, :, 0]
        for tile in range(bx * f.tiles_pb, min(bx * f.tiles_pb + f.tiles_pb, total)):
            n, t0, u0 = tile // (f.tiles_h * f.tiles_w), tile // f.tiles_w % f.tiles_h * f.tile_h, tile % f.tiles_w * f.tile_w
            row0, col0 = (t0 * sh - ph, u0 * sw - pw) if fprop else (t0 // sh + f.row0, u0 // sw + f.col0)
            halo = np.zeros((f.halo_h, f.halo_w, wide))
            for hy, hx in np.ndindex(f.halo_h, f.halo_w):
                iy, ix = row0 + hy, col0 + hx
                if 0 <= iy < src_h and 0 <= ix < src_w:
                    run = src[n, iy, ix, c0 * (1 if fprop else m):][:wide]
                    halo[hy, hx, :len(run)] = run
            for ty, tx in np.ndindex(f.tile_h, f.tile_w // f.cols):
                acc = np.zeros((f.cols, wide if fprop else f.chunk))
                for r in range(g.r):
                    if fprop:
                        hy = ty * sh + r * dh
                    else:
                        num = ty + ph - r * dh
                        if num % sh:
                            continue
                        hy = num // sh - f.row0
                    base = tx * f.cols * sw if fprop else tx * f.cols // sw
                    for j in range(f.in_cols):
                        assert 0 <= hy < f.halo_h and 0 <= base + j < f.halo_w, "a staged read outside the halo"
                        v = halo[hy, base + j]
                        for o, s in np.ndindex(f.cols, g.s):
                            if fprop:
                                sd = j - o * sw
                                if sd != s * dl:
                                    continue
                                acc[o] += np.repeat(v[:f.chunk], m) * wts[:, r, s]
                            else:
                                off = o + pw - s * dl
                                if off % sw or off // sw - f.col0 != j:
                                    continue
                                acc[o] += (v * wts[:, r, s]).reshape(f.chunk, m).sum(axis=1)
                oy, ox = t0 + ty, u0 + tx * f.cols
                valid = (min(g.c, c0 + f.chunk) - c0) * (m if fprop else 1)
                if oy < out_h and valid > 0:
                    for o in range(f.cols):
                        if ox + o >= out_w:
                            break
                        first = c0 * (m if fprop else 1)
                        got[n, oy, ox + o, first:first + valid] = acc[o][:valid]
    geo = dict(stride=g.stride, padding=g.padding, dilation=g.dilation, groups=g.groups)
    ref = reference.fprop(src, wt, **geo) if fprop else reference.dgrad(src, wt, (g.n, g.h, g.w, g.c), **geo)
    return got, ref


@pytest.mark.parametrize("pass_", [Pass.FPROP, Pass.DGRAD], ids=lambda p: p.value)
@pytest.mark.parametrize("problem", [dw(13, 10, 48, 3, 3, 1, 1), dw(12, 11, 144, 3, 3, 2, 1, n=1),
                                     dw(9, 20, 96, 5, 5, 1, 2), dw(10, 9, 16, 3, 3, 1, 2, 2, mult=2),
                                     dw(11, 12, 24, 7, 7, 2, 3, n=1), dw(14, 14, 64, 5, 5, 1, 2, n=1)],
                         ids=lambda p: p.describe().replace(" ", "_"))
def test_tuning_variations_emulated_are_exact(problem, pass_):
    """Every fourth of the depthwise tuning variations (chunks of 48 past C, runs of 2-8,
    several tiles a block, edge tiles), the second, the runs of 8 over 4 channels where the
    default has 8, and the tiles fitted to the output (runs of 7, tiles not whole 16-pixel
    fragments), walked as its kernel walks its layer, on integer data: each staged read lands
    inside the halo and every output equals the float64 reference."""
    from convgen.candidates import candidates

    plans = candidates(problem, pass_, Target())
    assert len(plans) > 8 and len(set(plans)) == len(plans)
    fitted = [p for p in plans if "fitted to the" in p.reasons[0]]
    if problem.h == 14:  # 8-pixel tiles overhang the 14x14 output: runs of 7 tile it exactly
        assert any(p.loop.cols == 7 and p.block_m % 16 for p in fitted), [p.brief() for p in fitted]
    # (the held-filter and mma.sync stencils walk otherwise: tests/test_depthwise_host.py runs their source)
    stencils = [p for p in plans if p.loop.out_rows == 1 and not p.loop.mma]
    for i, pl in enumerate([*stencils[::4], plans[1], *fitted]):
        got, ref = _emulate_stencil(problem, pass_, pl, np.random.default_rng(i))
        np.testing.assert_array_equal(got, ref, err_msg=pl.brief())


@pytest.mark.parametrize("pass_", [Pass.FPROP, Pass.DGRAD], ids=lambda p: p.value)
@pytest.mark.parametrize("problem", [dw(12, 11, 144, 3, 3, 2, 1, n=1), dw(13, 10, 144, 3, 3, 1, 1)],
                         ids=lambda p: p.describe().replace(" ", "_"))
def test_whole_pixel_chunk_is_the_default_where_it_fits_and_walks_exactly(problem, pass_, monkeypatch):
    """C = 144 (288-byte pixels: not whole 64-byte DRAM granules) in 64-channel chunks reads each
    granule twice, once per chunk's blocks (1.27-1.53x slower on an H100).  The default takes
    all 144 channels a block, the default's tile otherwise, and walks its layer exactly; C = 96
    (192 bytes, three granules) keeps 64-channel chunks, as C = 144 does on a GDDR part (32-byte
    granules, Arch.dram_granule), and C = 272 (34 lanes: no whole-pixel
    block) keeps them too, with tuning offering them chunk first (Depthwise.interleave) within
    tuning on first use's few, also exact."""
    from convgen.autotune import CANDIDATES
    from convgen.candidates import candidates

    plans = candidates(problem, pass_, Target())
    assert plans[0].block_n == 144 and not any(p.loop.interleave for p in plans), [p.brief() for p in plans]
    from convgen import depthwise
    with monkeypatch.context() as m:  # the tile, run and tiles a block are those of split pixels
        m.setattr(depthwise, "whole_pixel_chunk", lambda *a: None)
        split = plan(problem, pass_, Target())
    assert split.block_n == 64 and (plans[0].loop.cols, plans[0].loop.tiles) == (split.loop.cols, split.loop.tiles)
    got, ref = _emulate_stencil(problem, pass_, plans[0], np.random.default_rng(7))
    np.testing.assert_array_equal(got, ref, err_msg=plans[0].brief())
    c96 = dataclasses.replace(problem, c=96, k=96, groups=96)
    others = candidates(c96, pass_, Target())
    assert others[0].block_n == 64 and not any(p.loop.interleave for p in others)
    gddr = candidates(problem, pass_, Target("sm_86"))  # 32-byte granules: 288-byte pixels are whole ones
    assert gddr[0].block_n == 64 and not any(p.block_n == 144 or p.loop.interleave for p in gddr)
    c272 = dataclasses.replace(problem, c=272, k=272, groups=272)
    wide = candidates(c272, pass_, Target())
    inter = [i for i, p in enumerate(wide) if p.loop.interleave]
    assert wide[0].block_n == 64 and len(inter) == 1 and inter[0] < CANDIDATES, [p.brief() for p in wide]
    assert wide[inter[0]] == dataclasses.replace(wide[0], loop=dataclasses.replace(wide[0].loop, interleave=True),
                                                 reasons=wide[inter[0]].reasons)
    got, ref = _emulate_stencil(c272, pass_, wide[inter[0]], np.random.default_rng(8))
    np.testing.assert_array_equal(got, ref, err_msg=wide[inter[0]].brief())


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


HALO_HOST_MAIN = r"""
#include <cstdio>
#include <cstdlib>
#include <cstring>
#define __device__
#define __forceinline__ inline
typedef unsigned short half_t;
template <int V> struct HalfVec { struct T { half_t h[V]; }; };
template <int V> typename HalfVec<V>::T load_halves(const half_t* p) { typename HalfVec<V>::T t; std::memcpy(&t, p, sizeof t); return t; }
// cp.async with zero-fill: BYTES copied where pred, zeros where not (the source is not read then)
template <int BYTES> void cp_async(void* dst, const void* src, bool pred) {
  if (pred) std::memcpy(dst, src, BYTES); else std::memset(dst, 0, BYTES);
}
void cp_async_commit() {}
struct { unsigned x; } threadIdx;  // the host runs the block's threads one after another
constexpr int VEC = %(vec)d, HALO_VEC = VEC, THREADS = %(threads)d, HALO_H = %(hh)d, HALO_W = %(hw)d, PIX_LD = %(ld)d;
constexpr bool ASYNC_HALO = %(async)s;
%(fn)s
int main(int argc, char** argv) {
  constexpr int CH = %(ch)d, ROWS = %(rows)d, COLS_IMG = %(cols)d, CHANS = %(chans)d;
  const int row0 = std::atoi(argv[1]), col0 = std::atoi(argv[2]), ch0 = std::atoi(argv[3]);
  static half_t img[ROWS * COLS_IMG * CHANS], halo[HALO_H * HALO_W * PIX_LD];
  for (int i = 0; i < ROWS * COLS_IMG * CHANS; ++i) img[i] = static_cast<half_t>(1 + i %% 60000);
  for (half_t& h : halo) h = 0xFFFF;  // unwritten
  for (unsigned t = 0; t < THREADS; ++t) {
    threadIdx.x = t;
    stage_halo<CH, ROWS, COLS_IMG, CHANS>(halo, img, row0, col0, ch0);
  }
  for (int p = 0; p < HALO_H * HALO_W; ++p)
    for (int c = 0; c < CH; ++c) std::printf("%%d\n", halo[p * PIX_LD + c]);
}
"""


def _stage_halo_source() -> str:
    """The stage_halo function as templates/parts/depthwise.j2 writes it (no Jinja inside)."""
    from convgen.resources import templates_dir

    text = (templates_dir() / "parts" / "depthwise.j2").read_text()
    start = text.index("template <int CH, int ROWS, int COLS_IMG, int CHANS>\n__device__ __forceinline__ void stage_halo(")
    return text[start:text.index("\n}\n", start) + 3]


@pytest.mark.skipif(__import__("shutil").which("g++") is None, reason="no host C++ compiler (g++) for the halo copy")
@pytest.mark.parametrize("async_", [True, False], ids=["cp.async", "registers"])
@pytest.mark.parametrize("vec, threads, hh, hw, ch, rows, cols, chans, origins", [
    (8, 128, 14, 14, 64, 20, 20, 96, [(-3, -3, 0), (10, 10, 64), (3, 9, 32)]),  # ConvNeXt's 7x7, a part chunk
    (8, 64, 10, 10, 32, 12, 12, 32, [(-1, -1, 0), (7, 3, 0)]),                 # dw32: 64 threads, 4 vectors
    (8, 128, 17, 17, 64, 30, 30, 64, [(-1, -1, 0), (15, 15, 0)]),              # stride 2: a step shorter than a row
    (8, 128, 10, 10, 96, 12, 12, 96, [(-1, 5, 0)]),                             # 12 vectors: the flat index
    (4, 128, 10, 10, 16, 9, 11, 16, [(-1, -1, 0), (2, 4, 0)]),                  # 8-byte copies
    (2, 32, 6, 9, 8, 5, 7, 8, [(-2, -3, 0), (1, 0, 0)]),                        # 4-byte copies, one warp
])
def test_halo_staging_copies_every_pixel_once_on_the_host(tmp_path, async_, vec, threads, hh, hw, ch, rows, cols,
                                                          chans, origins):
    """The depthwise halo's copies (parts/depthwise.j2's stage_halo), run on the host thread by
    thread: every halo pixel and channel holds the image's, zeros outside the image or past
    its channels, whichever path (a thread's pixels walked, or the flat index) the block's
    shape takes."""
    import subprocess

    ld = ch + 8
    src = tmp_path / "halo.cpp"
    src.write_text(HALO_HOST_MAIN % dict(vec=vec, threads=threads, hh=hh, hw=hw, ld=ld, ch=ch, rows=rows, cols=cols,
                                         chans=chans, fn=_stage_halo_source(),
                                         **{"async": "true" if async_ else "false"}))
    exe = tmp_path / "halo"
    subprocess.run(["g++", "-std=c++17", "-O1", "-o", str(exe), str(src)], check=True)
    for row0, col0, ch0 in origins:
        got = np.array(subprocess.run([str(exe), str(row0), str(col0), str(ch0)], capture_output=True, text=True,
                                      check=True).stdout.split(), dtype=np.int64).reshape(hh, hw, ch)
        y, x, c = np.meshgrid(np.arange(hh) + row0, np.arange(hw) + col0, np.arange(ch) + ch0, indexing="ij")
        inside = (y >= 0) & (y < rows) & (x >= 0) & (x < cols) & (c < chans)
        want = np.where(inside, 1 + ((y * cols + x) * chans + c) % 60000, 0)
        np.testing.assert_array_equal(got, want, err_msg=f"origin {(row0, col0, ch0)}")


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
