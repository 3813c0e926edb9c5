"""Depthwise wgrad on the CPU: pixel tiles staged in shared memory (convgen/depthwise_wgrad.py).
Its plans must keep to the rules fitted on the H200 and to a part's shared memory, and a bad
hand plan names its field; its tiling, walked in NumPy from the facts its template reads, must
sum exactly what the reference sums on integer data, since a tile that misses or repeats a
pixel is wrong only on some layers; and NVRTC builds its odd corners with no local memory."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from convgen import reference
from convgen.emit import emit
from convgen.ir import ConvProblem, Epilogue, Pass
from convgen.spec import Plan
from convgen.mainloop import Depthwise
from convgen.planner import check_plan, make_spec, plan
from convgen.ir import Target

from test_depthwise import dw  # a depthwise ConvProblem


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
