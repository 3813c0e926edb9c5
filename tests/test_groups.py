"""Grouped convolutions with several channels a group on the CPU: what the planner picks and
refuses, the launch geometry of G GEMMs side by side, and emission that compiles.  (The
kernels' numbers are tests/test_groups_gpu.py's.)"""

from __future__ import annotations

import dataclasses
import re

import pytest

from convgen.emit import emit
from convgen.ir import ConvProblem, Epilogue, Pass, Target
from convgen.spec import Plan
from convgen.mainloop import HaloTile, Im2col, TmaWgmma
from convgen.planner import check_plan, make_spec, plan

PASSES = [Pass.FPROP, Pass.DGRAD, Pass.WGRAD]
# 32 groups of 4 channels in, 8 out: x 2x14x14x128, w 256x3x3x4
P = ConvProblem(14, 14, 128, 256, 3, 3, 1, 1, groups=32, n=2)


@pytest.mark.parametrize("pass_", PASSES, ids=lambda p: p.value)
def test_one_groups_gemm_is_the_full_gemm_cut_along_its_channel_axis(pass_):
    full, one = P.gemm(pass_), P.group_gemm(pass_)
    assert one.k == full.k  # each output reduces over its own group only, as before
    if pass_ is Pass.WGRAD:
        assert (one.m * 32, one.n) == (full.m, full.n)
    else:
        assert (one.m, one.n * 32) == (full.m, full.n)
    assert one.flops * 32 == full.flops
    dense = ConvProblem(14, 14, 128, 256, 3, 3, 1, 1, n=2)
    assert dense.group_gemm(pass_) == dense.gemm(pass_)


@pytest.mark.parametrize("pass_", PASSES, ids=lambda p: p.value)
def test_planner_runs_a_grouped_layer_on_the_im2col_loop_and_says_why(pass_):
    pl = plan(P, pass_)
    assert isinstance(pl.loop, Im2col)
    text = "\n".join(pl.reasons)
    assert "32 of them side by side" in text and "one GEMM per group" in text
    # the TMA loop's refusal names the groups (the halo kinds are not even considered for wgrad)
    assert "not the TMA main loop: groups=32" in text
    # one group's channels bound the vectors: 4 in (fprop's x, wgrad's x), 8 out (dgrad's dy, wgrad's dy)
    assert (pl.vec_a, pl.vec_b) == {Pass.FPROP: (4, 4), Pass.DGRAD: (8, 4), Pass.WGRAD: (8, 4)}[pass_]


def test_a_halo_or_tma_plan_is_refused_for_a_grouped_layer_naming_groups():
    p = ConvProblem(16, 16, 64, 64, 3, 3, 1, 1, groups=4, n=2)
    with pytest.raises(ValueError, match=r"HaloTile: groups=4: the halo kinds stage every channel"):
        check_plan(Plan(256, 16, 16, 4, 1, 2, 8, 8, loop=HaloTile(16)), p, "fprop", Target(), "float16")
    # fprop's and wgrad's TMA kernels take groups of whole 64-channel boxes, dgrad's none
    with pytest.raises(ValueError, match="groups=4: a group's C/G=16 and K/G=16 must be whole 64-channel boxes"):
        check_plan(Plan(128, 64, 64, 8, 1, 4, 8, 8, loop=TmaWgmma()), p, "fprop", Target(), "float16")
    with pytest.raises(ValueError, match="groups=4: its dgrad kernel boxes every channel of a pixel"):
        check_plan(Plan(128, 64, 64, 8, 1, 4, 8, 8, loop=TmaWgmma()), p, "dgrad", Target(), "float16")


def test_a_hand_plan_wider_than_a_groups_channels_is_refused_naming_the_vector():
    p = ConvProblem(8, 8, 24, 24, 3, 3, 1, 1, groups=6, n=2)  # 4 channels a group
    with pytest.raises(ValueError, match="plan.vec_a=8 does not divide the operand's contiguous run of 4"):
        check_plan(Plan(128, 16, 32, 4, 1, 3, 8, 4), p, "fprop", Target(), "float16")


@pytest.mark.parametrize("pass_", PASSES, ids=lambda p: p.value)
@pytest.mark.parametrize("split", [1, 3])
def test_launch_covers_every_groups_tiles_and_outputs(pass_, split):
    spec = make_spec(P, pass_, epilogue=Epilogue(bias=pass_ is not Pass.DGRAD))
    spec = dataclasses.replace(spec, plan=dataclasses.replace(spec.plan, split_k=split))
    src = emit(spec)
    one, full = P.group_gemm(pass_), P.gemm(pass_)
    bm, bn = spec.plan.block_m, spec.plan.block_n
    gx, gy, gz = src.grid(P.n)
    classes = 1  # stride 1: one dgrad residue class
    assert gy == 32 * -(-one.n // bn) and gz == split
    assert gx == classes * -(-one.m // bm)
    if split == 1:
        assert src.reduce is None and src.workspace_elems(P.n) == 0
    else:
        # the slices are laid out as the output is (every group's columns), and the reduction
        # covers all of it
        assert src.workspace_elems(P.n) == split * full.m * full.n
        per_block = src.reduce.grid_m_tile
        assert src.reduce.grid_x(P.n) == -(-full.m * full.n // per_block)


def test_ungrouped_kernels_keep_their_names_and_read_their_pixel_strides_as_before():
    dense = ConvProblem(14, 14, 64, 64, 3, 3, 1, 1, n=2)
    src = emit(make_spec(dense, "fprop")).source
    assert "constexpr int G = 1, C_PIX = C, K_PIX = K;" in src
    assert "GROUP_TILES" not in src and "grp" not in src
    assert "_g" not in make_spec(dense, "fprop").name.split("_d11")[1][:3]


@pytest.mark.parametrize("pass_", PASSES, ids=lambda p: p.value)
def test_grouped_source_offsets_each_tensor_by_its_group(pass_):
    spec = make_spec(P, pass_, epilogue=Epilogue(bias=pass_ is Pass.FPROP))
    src = emit(dataclasses.replace(spec, plan=dataclasses.replace(spec.plan, split_k=1))).source
    assert "constexpr int G = 32, C_PIX = 128, K_PIX = 256;" in src
    assert re.search(r"C = 4, K = 8;", src)  # the GEMM's channels are one group's
    moved = set(re.findall(r"^\s+(\w+) \+= static_cast<long long>\(grp\)", src, re.M))
    assert moved == {Pass.FPROP: {"x", "w", "y", "bias"}, Pass.DGRAD: {"dy", "w", "dx"}, Pass.WGRAD: {"dy", "x", "dw"}}[pass_]


cupy = pytest.importorskip("cupy", reason="NVRTC comes with CuPy")


@pytest.mark.parametrize("pass_", PASSES, ids=lambda p: p.value)
@pytest.mark.parametrize("problem", [P, ConvProblem(9, 7, 12, 6, 3, 2, 2, 1, groups=3, n=2),
                                     ConvProblem(8, 8, 64, 64, 1, 1, groups=4, n=2),
                                     ConvProblem(7, 9, 6, 8, 3, 3, 1, 1, groups=2, n=2)],
                         ids=lambda p: p.describe().replace(" ", "_"))
def test_grouped_kernels_compile(problem, pass_):
    from convgen.compile import compile_binary

    for split in (1, 3):
        spec = make_spec(problem, pass_, epilogue=Epilogue(bias=pass_ is not Pass.DGRAD, relu=pass_ is Pass.FPROP))
        spec = dataclasses.replace(spec, plan=dataclasses.replace(spec.plan, split_k=split))
        src = emit(spec)
        binary = compile_binary(src.source, arch=src.compile_arch, name=src.filename)
        assert binary[:4] == b"\x7fELF"
        for name in src.kernel_names:
            assert name.encode() in binary
