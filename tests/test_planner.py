"""convgen.planner: deterministic, feasible, explained plans, and hand plans checked like planned ones."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from convgen.ir import ARCHES, DTYPES, ConvProblem, Epilogue, Pass, Target
from convgen.spec import KernelSpec, Plan
from convgen.mainloop import FlatHalo, HaloLdsm, HaloTile, Im2col, StagedHalo, Wgmma
from convgen.planner import check_plan, make_spec, plan
from convgen.footprint import gathered_channels, smem_bytes
from convgen.suites import SUITES

ROOT = Path(__file__).resolve().parent.parent
ALL_LAYERS = [(f"{suite}/{layer.name}", layer.problem) for suite, layers in SUITES.items() for layer in layers]


@st.composite
def problems(draw) -> ConvProblem:
    r, s = draw(st.integers(1, 7)), draw(st.integers(1, 7))
    dil = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    pad = (draw(st.integers(0, 3)), draw(st.integers(0, 3)))
    stride = (draw(st.integers(1, 4)), draw(st.integers(1, 4)))
    eff_r, eff_s = dil[0] * (r - 1) + 1, dil[1] * (s - 1) + 1
    h = draw(st.integers(max(1, eff_r - 2 * pad[0]), 96))
    w = draw(st.integers(max(1, eff_s - 2 * pad[1]), 96))
    channels = st.one_of(st.integers(1, 40), st.sampled_from([3, 8, 16, 24, 64, 100, 128, 256, 512, 1000, 2048]))
    c, k = draw(channels), draw(channels)
    n = draw(st.sampled_from([0, 1, 2, 3, 16, 64, 256, 1024]))
    return ConvProblem(h, w, c, k, r, s, stride, pad, dil, n=n)


def k_steps(problem: ConvProblem, pass_: Pass, p: Plan) -> int:
    return math.ceil(problem.gemm(pass_).k / p.block_k)


# --------------------------------------------------------------------------- determinism


def test_plan_is_deterministic():
    for _, prob in ALL_LAYERS:
        for pass_ in Pass:
            for arch in ARCHES:
                a = plan(prob, pass_, Target(arch))
                b = plan(prob, pass_, Target(arch))
                assert a == b and a.reasons == b.reasons and a.explain() == b.explain()


def test_plan_is_the_same_in_another_process():
    code = (
        "from convgen.suites import SUITES\n"
        "from convgen.ir import Pass, Target, ARCHES\n"
        "from convgen.planner import plan\n"
        "for layers in SUITES.values():\n"
        "    for l in layers:\n"
        "        for p in Pass:\n"
        "            for a in ARCHES: print(plan(l.problem, p, Target(a)).explain())\n"
    )
    outs = []
    for seed in ("0", "4242"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(ROOT)}
        outs.append(subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True,
                                   text=True, check=True).stdout)
    here = "".join(plan(prob, p, Target(a)).explain() + "\n" for _, prob in ALL_LAYERS for p in Pass for a in ARCHES)
    assert outs[0] == outs[1] == here


def test_make_spec_uses_plan_and_the_defaults():
    prob = SUITES["cifar-resnet"][1].problem
    s = make_spec(prob, "fprop")
    assert s == KernelSpec(prob.geometry, Pass.FPROP, Epilogue(), "float16", Target(), plan(prob, "fprop"))
    assert s.target == Target("sm_90") and s.epilogue == Epilogue() and s.in_dtype == "float16"


# --------------------------------------------------------------------------- invariants


def check_invariants(prob: ConvProblem, pass_: Pass, target: Target, in_dtype: str, scalar: bool) -> Plan | None:
    if in_dtype == "bfloat16" and not target.info.bf16_mma:  # refused by name, never planned in fp16
        with pytest.raises(ValueError, match=rf"{target.arch} has no bfloat16 MMA"):
            plan(prob, pass_, target, in_dtype, scalar=scalar)
        return None
    p = plan(prob, pass_, target, in_dtype, scalar=scalar)
    where = f"{prob.describe()} {pass_.value} {target.arch} {in_dtype} scalar={scalar}: {p}"
    assert smem_bytes(p, pass_, target.warp_size, prob) <= target.smem_limit, where
    assert p.warps * target.warp_size <= 1024, where
    ca, cb = gathered_channels(prob, pass_)
    assert ca % p.vec_a == 0 and cb % p.vec_b == 0, where
    if scalar:
        assert p.vec_a == p.vec_b == 1, where
    steps = k_steps(prob, pass_, p)
    assert 1 <= p.split_k <= max(1, steps), where
    if steps < 8:
        assert p.split_k == 1, where
    for read, vec in ((p.read_a, p.vec_a), (p.read_b, p.vec_b)):
        assert (read == "float32") == (in_dtype == "float32" and vec == 1), where
    g = prob.gemm(pass_)
    if g.n <= 32:  # narrow N, narrow tiles; the TMA loop's 64-wide tiles only where N fills half
        assert p.block_n <= 32 or (p.tma and 2 * g.n >= p.block_n), where
    if pass_ is Pass.WGRAD and prob.k <= 32:  # the TMA loop's 64-row tile only where K fills half of it
        assert p.block_m <= 32 or (p.tma and 2 * prob.k >= p.block_m), where
    assert p.block_m <= 256 and p.block_n <= 256 and p.block_k <= 256, where
    assert p.reasons and all(isinstance(r, str) and r for r in p.reasons), where
    check_plan(p, prob, pass_, target, in_dtype)  # a planned plan passes the hand-plan check
    return p


@settings(max_examples=150)
@given(prob=problems(), in_dtype=st.sampled_from(DTYPES), scalar=st.booleans())
def test_plan_invariants_hold_for_every_pass_and_arch(prob, in_dtype, scalar):
    for pass_ in Pass:
        for arch in ARCHES:
            check_invariants(prob, pass_, Target(arch), in_dtype, scalar)


@settings(max_examples=40)
@given(prob=problems(), sm_count=st.integers(1, 400), arch=st.sampled_from(sorted(ARCHES)))
def test_plan_invariants_hold_for_any_sm_count(prob, sm_count, arch):
    for pass_ in Pass:
        check_invariants(prob, pass_, Target(arch, sm_count), "float16", False)


GEMM_LAYERS = [(n, p) for n, p in ALL_LAYERS if p.groups == 1]  # the depthwise suites' stencils: test_depthwise*.py


@pytest.mark.parametrize("name, prob", GEMM_LAYERS, ids=[n for n, _ in GEMM_LAYERS])
def test_suite_layers_plan_on_every_arch(name, prob):
    for pass_ in Pass:
        for arch in ARCHES:
            for in_dtype in DTYPES:
                for scalar in (False, True):
                    check_invariants(prob, pass_, Target(arch), in_dtype, scalar)


@pytest.mark.parametrize("pass_", list(Pass))
def test_empty_batch_plans(pass_):
    prob = ConvProblem(32, 32, 16, 16, 3, 3, 1, 1, n=0)
    for arch in ARCHES:
        p = check_invariants(prob, pass_, Target(arch), "float16", False)
        assert p.split_k == 1


# --------------------------------------------------------------------------- specific rules


@pytest.mark.parametrize("arch", ["sm_90", "sm_75", "gfx942"])
def test_three_channels_gives_a_scalar_a_gather_in_fprop(arch):
    prob = ConvProblem(32, 32, 3, 16, 3, 3, 1, 1, n=8)
    p = plan(prob, "fprop", Target(arch))
    assert p.vec_a == 1 and p.vec_b == 1  # R*S*C = 27 is odd too
    assert p.read_a == "float16"
    assert any("vec A 1 (run of 3)" in r for r in p.reasons)
    assert plan(prob, "fprop", Target(arch), "float32").read_a == "float32"  # scalar fp32 gather reads fp32


@pytest.mark.parametrize("c", [8, 16, 24, 64, 136, 512])
def test_channels_multiple_of_8_give_vec_8(c):
    prob = ConvProblem(14, 14, c, 8 * 5, 3, 3, 1, 1, n=4)
    assert plan(prob, "fprop").vec_a == 8  # im2col(x) runs over C
    assert plan(prob, "fprop").vec_b == 8  # w rows run over R*S*C
    assert plan(prob, "dgrad").vec_b == 8  # w viewed [R*S*K][C]
    assert plan(prob, "dgrad").vec_a == 8  # dy runs over K = 40
    assert plan(prob, "wgrad").vec_b == 8  # im2col(x) again
    assert plan(prob, "wgrad").vec_a == 8  # dy^T over K


@pytest.mark.parametrize("c, vec", [(4, 4), (12, 4), (2, 2), (6, 2), (5, 1), (7, 1)])
def test_other_channel_counts_get_the_widest_divisor(c, vec):
    prob = ConvProblem(14, 14, c, 16, 1, 1, n=4)
    assert plan(prob, "fprop").vec_a == vec
    assert plan(prob, "wgrad").vec_b == vec
    assert plan(prob, "dgrad").vec_b == vec


@settings(max_examples=100)
@given(prob=problems(), pass_=st.sampled_from(list(Pass)), arch=st.sampled_from(sorted(ARCHES)))
def test_narrow_gemm_n_gets_a_narrow_block(prob, pass_, arch):
    assume(prob.gemm(pass_).n <= 32)
    p = plan(prob, pass_, Target(arch))
    assert p.block_n <= 32
    assert p.block_n >= prob.gemm(pass_).n  # and still covers it in one tile


@pytest.mark.parametrize("k", [1, 3, 16, 17, 32])
def test_wgrad_with_few_output_channels_gets_a_short_block(k):
    prob = ConvProblem(32, 32, 64, k, 3, 3, 1, 1, n=64)
    for arch in ARCHES:
        p = plan(prob, "wgrad", Target(arch))
        assert p.block_m <= 32 and p.block_m >= min(k, 32)


CIFAR_WGRAD = [(f"{s}/{l.name}", l.problem) for s in ("cifar-resnet", "cifar-vgg") for l in SUITES[s]]
SPLIT_ARCHES = [a for a, info in ARCHES.items() if info.default_sm_count // 2 <= 128]


@pytest.mark.parametrize("arch", SPLIT_ARCHES)
@pytest.mark.parametrize("name, prob", CIFAR_WGRAD, ids=[n for n, _ in CIFAR_WGRAD])
def test_cifar_wgrad_uses_split_k_to_fill_the_gpu(name, prob, arch):
    target = Target(arch)
    p = plan(prob, "wgrad", target)
    g = prob.gemm("wgrad")
    tiles = math.ceil(g.m / p.block_m) * math.ceil(g.n / p.block_n)
    assert p.split_k > 1, p.explain()
    assert tiles * p.split_k >= target.sm_count / 2, p.explain()
    assert p.split_k <= k_steps(prob, Pass.WGRAD, p)
    assert any(r.startswith(f"split-K {p.split_k}:") and "deterministic" in r for r in p.reasons)


def test_split_k_is_off_when_the_grid_is_already_full():
    prob = ConvProblem(56, 56, 64, 64, 3, 3, 1, 1, n=64)
    for pass_ in (Pass.FPROP, Pass.DGRAD):
        assert plan(prob, pass_).split_k == 1


def test_split_k_follows_the_sm_count():
    prob = SUITES["cifar-resnet"][3].problem
    few, many = plan(prob, "wgrad", Target("sm_90", 8)), plan(prob, "wgrad", Target("sm_90", 132))
    assert few.split_k < many.split_k


def test_plans_fit_small_shared_memory_by_shrinking():
    prob = ConvProblem(14, 14, 512, 512, 3, 3, 1, 1, n=64)
    big = plan(prob, "fprop", Target("sm_90"))
    small = plan(prob, "fprop", Target("sm_86"))
    assert smem_bytes(small, Pass.FPROP) <= Target("sm_86").smem_limit
    assert (small.stages, small.block_k) <= (big.stages, big.block_k)
    if (small.stages, small.block_k) != (big.stages, big.block_k):
        assert any(r.startswith("shrunk to") for r in small.reasons)


def test_targets_without_cp_async_double_buffer():
    prob = SUITES["resnet50"][6].problem
    for arch, info in ARCHES.items():
        p = plan(prob, "fprop", Target(arch))
        if not info.cp_async:
            assert p.stages == 2, arch
        elif not any(r.startswith("shrunk to") for r in p.reasons):
            assert p.stages >= 3, arch


# --------------------------------------------------------------------------- reasons and explain()


@pytest.mark.parametrize("name, prob", ALL_LAYERS[:9], ids=[n for n, _ in ALL_LAYERS[:9]])
def test_every_plan_is_explained(name, prob):
    for pass_ in Pass:
        for arch in ("sm_90", "sm_75", "gfx942"):
            for in_dtype in DTYPES:
                if in_dtype == "bfloat16" and arch == "sm_75":
                    continue  # refused by name (test_plan_invariants_hold_for_every_pass_and_arch)
                p = plan(prob, pass_, Target(arch), in_dtype)
                text = p.explain()
                lines = text.splitlines()
                assert len(lines) == 1 + len(p.reasons)
                for reason in p.reasons:
                    assert f"  - {reason}" in lines
                head = lines[0]
                for needle in (f"block {p.block_m}x{p.block_n}x{p.block_k}", f"{p.warps} warps",
                               f"{p.stages} stages", f"vec A/B {p.vec_a}/{p.vec_b}",
                               f"read A/B {p.read_a}/{p.read_b}", f"split-K {p.split_k}"):
                    assert needle in head
                g = prob.gemm(pass_)
                assert p.reasons[0] == f"GEMM M={g.m} ({g.m_axis}) x N={g.n} ({g.n_axis}) x K={g.k} ({g.k_axis})"
                # each decision has its reason
                for prefix in ("block N", "block M", "K-step", f"{p.warps} warps as", "vec A", f"{p.stages} stages",
                               f"split-K {p.split_k}:"):
                    assert any(r.startswith(prefix) for r in p.reasons), prefix
                if in_dtype == "float32":
                    assert sum(r.startswith("read ") for r in p.reasons) == 2


def test_scalar_plans_say_so():
    p = plan(SUITES["cifar-resnet"][1].problem, "fprop", scalar=True)
    assert p.vec_a == p.vec_b == 1
    assert "vec A/B 1/1: scalar staging forced by the caller" in p.reasons


def test_strided_dgrad_reason():
    p = plan(SUITES["cifar-resnet"][2].problem, "dgrad")
    assert any(r.startswith("strided dgrad") for r in p.reasons)


# --------------------------------------------------------------------------- hand plans

C3 = ConvProblem(32, 32, 3, 16, 3, 3, 1, 1, n=8)
C64 = ConvProblem(16, 16, 64, 64, 3, 3, 1, 1, n=8)


@pytest.mark.parametrize(
    "prob, pass_, hand, target, in_dtype, msg",
    [
        (C3, "fprop", Plan(128, 16, 32, 4, 1, 2, 8, 1), "sm_90", "float16",
         r"plan\.vec_a=8 does not divide the operand's contiguous run of 3 channels; use 1 or less"),
        (C3, "dgrad", Plan(128, 16, 32, 4, 1, 2, 8, 4), "sm_90", "float16",
         r"plan\.vec_b=4 does not divide the operand's contiguous run of 3 channels"),
        (C3, "wgrad", Plan(16, 32, 32, 1, 2, 2, 8, 2), "sm_90", "float16",
         r"plan\.vec_b=2 does not divide the operand's contiguous run of 3 channels"),
        (C64, "fprop", Plan(256, 256, 64, 4, 2, 8, 8, 8), "sm_90", "float16",
         r"plan needs \d+ bytes of shared memory but sm_90 allows 232448"),
        (C64, "fprop", Plan(128, 128, 64, 2, 4, 3, 8, 8), "sm_75", "float16",
         r"plan needs 110592 bytes of shared memory but sm_75 allows 65536"),
        (C64, "fprop", Plan(256, 256, 32, 8, 8, 2, 8, 8), "sm_90", "float16",
         r"plan has 64 warps = 2048 threads; a block holds at most 1024"),
        (C64, "fprop", Plan(128, 256, 32, 4, 8, 2, 8, 8), "gfx942", "float16",
         r"plan has 32 warps = 2048 threads; a block holds at most 1024"),
        (C64, "fprop", Plan(128, 64, 32, 4, 1, 2, 1, 8, read_a="float32"), "sm_90", "float16",
         r"plan\.read_a='float32' needs float32 inputs, but in_dtype is float16"),
        (C64, "wgrad", Plan(64, 64, 32, 2, 2, 2, 8, 1, read_b="float32"), "sm_90", "float16",
         r"plan\.read_b='float32' needs float32 inputs, but in_dtype is float16"),
        (C64, "fprop", Plan(512, 64, 32, 4, 1, 2, 8, 8), "sm_90", "float16",
         r"plan\.block_m=512 is larger than convgen's largest tile \(256\)"),
        # the halo path: stride-1 fprop/dgrad with 16-byte fp16 runs only
        (C64, "wgrad", Plan(128, 64, 32, 4, 1, 2, 8, 8, loop=HaloTile(16)), "sm_90", "float16",
         r"HaloTile\(tile_w=16, tiles=1\): the halo path computes fprop and dgrad only"),
        (ConvProblem(16, 16, 64, 64, 3, 3, 2, 1, n=8), "fprop", Plan(128, 64, 32, 4, 1, 2, 8, 8, loop=FlatHalo()), "sm_90",
         "float16", r"FlatHalo\(tiles=1\): the halo path needs stride 1, got \(2, 2\)"),
        (ConvProblem(200, 200, 7, 16, 7, 7, 3, 9, 3, n=1), "fprop", Plan(256, 16, 16, 4, 1, 2, 1, 1, loop=StagedHalo(16)),
         "sm_90", "float16",
         r"StagedHalo\(tile_w=16\): the block's input halo takes 57344 bytes of shared memory \(at most 49152\)"),
        (ConvProblem(16, 16, 16, 12, 3, 3, 1, 1, n=8), "dgrad", Plan(128, 16, 16, 4, 1, 2, 4, 8, loop=HaloTile(16)), "sm_90",
         "float16", r"HaloTile\(tile_w=16, tiles=1\): the halo path stages 16-byte runs of the reduced channels: K=12 is not"),
        # each halo kind on the layers it is for: a 2-D or flat tile reads C in place, StagedHalo
        # is for fprop whose C is not a multiple of 8
        (C3, "fprop", Plan(128, 16, 32, 4, 1, 2, 1, 1, loop=HaloTile(16)), "sm_90", "float16",
         r"HaloTile\(tile_w=16, tiles=1\): reads each tap's fragments in place, which needs C in 16-byte runs \(C=3\); "
         r"StagedHalo stages"),
        (C3, "fprop", Plan(128, 16, 32, 4, 1, 2, 1, 1, loop=FlatHalo()), "sm_90", "float16",
         r"FlatHalo\(tiles=1\): reads each tap's fragments in place, which needs C in 16-byte runs \(C=3\)"),
        (C64, "fprop", Plan(128, 64, 32, 4, 1, 2, 8, 8, loop=StagedHalo(16)), "sm_90", "float16",
         r"StagedHalo\(tile_w=16\): stages the whole halo of fprop layers whose C is not a multiple of 8 only"),
        (C3, "dgrad", Plan(128, 16, 32, 4, 1, 2, 8, 1, loop=StagedHalo(16)), "sm_90", "float16",
         r"StagedHalo\(tile_w=16\): stages the whole halo of fprop layers whose C is not a multiple of 8 only"),
        (ConvProblem(16, 16, 3, 32, 3, 3, 1, 1, n=8), "dgrad", Plan(128, 16, 32, 4, 1, 2, 8, 8, loop=HaloTile(16)), "sm_90",
         "float16", r"plan\.vec_b=8 does not divide the operand's contiguous run of 3 channels"),
        (C64, "dgrad", Plan(128, 64, 32, 4, 1, 2, 8, 8, loop=HaloTile(16)), "sm_90", "float32",
         r"HaloTile\(tile_w=16, tiles=1\): the halo path reads fp16 inputs"),
        (C64, "fprop", Plan(128, 64, 32, 4, 1, 2, 8, 8, split_k=1, loop=HaloTile(32)), "sm_75", "float16",
         r"plan needs \d+ bytes of shared memory but sm_75 allows 65536"),
    ],
)
def test_infeasible_hand_plans_are_rejected(prob, pass_, hand, target, in_dtype, msg):
    with pytest.raises(ValueError, match=msg):
        make_spec(prob, pass_, target=Target(target), in_dtype=in_dtype, plan_=hand)
    with pytest.raises(ValueError, match=msg):
        check_plan(hand, prob, pass_, Target(target), in_dtype)


def test_feasible_hand_plans_are_used_as_given():
    hand = Plan(64, 64, 32, 2, 2, 2, 4, 2, split_k=3)
    s = make_spec(C64, "fprop", target=Target("sm_75"), plan_=hand)
    assert s.plan == hand and s.plan.split_k == 3
    # float32 reads are fine once the inputs are float32 and the gather is scalar
    hand32 = Plan(64, 64, 32, 2, 2, 2, 1, 1, read_a="float32", read_b="float32")
    assert make_spec(C64, "fprop", in_dtype="float32", plan_=hand32).plan == hand32


def test_hand_plan_goes_through_the_epilogue_check():
    with pytest.raises(ValueError, match="relu is an fprop epilogue"):
        make_spec(C64, "dgrad", epilogue=Epilogue(relu=True), plan_=Plan(64, 64, 32, 2, 2, 2, 8, 8))


@pytest.mark.parametrize("prob, pass_, target", [
    (ConvProblem(8, 8, 64, 128, 3, 3, 1, 1, n=2), "dgrad", "gfx942"),  # HIP keeps WMMA's 16-pixel rows
    (ConvProblem(8, 8, 64, 128, 3, 3, 1, 1, n=2), "dgrad", "sm_75"),  # ldmatrix, but no mma.sync.m16n8k16
    (ConvProblem(8, 8, 3, 32, 3, 3, 1, 1, n=2), "fprop", "sm_90"),  # a layer that stages its whole halo
])
def test_tiles_narrower_than_a_fragment_need_ldmatrix_and_mma_sync_in_place(prob, pass_, target):
    vec = 1 if prob.c % 8 else 8
    narrow = Plan(64, 32, 16, 4, 1, 2, vec, vec, loop=HaloLdsm(8))
    with pytest.raises(ValueError, match=r"HaloLdsm\(tile_w=8, tiles=1\): tiles narrower than a 16-pixel fragment "
                                         r"need ldmatrix and mma\.sync\.m16n8k16"):
        check_plan(narrow, prob, pass_, Target(target), "float16")
    check_plan(Plan(64, 32, 16, 4, 1, 2, 8, 8, loop=HaloLdsm(8)), ConvProblem(8, 8, 64, 128, 3, 3, 1, 1, n=2), "dgrad",
               Target("sm_90"), "float16")


def test_tall_narrow_halo_tiles_stack_whole_images():
    """halo_images: an 8-pixel-wide tile a whole number of images tall holds that many images
    (each with its own halo rows); a 16-wide tile, a single 8x8 tile, 7-row images under a
    16-row tile and multi-tile blocks do not stack."""
    from convgen.footprint import halo_images, halo_shape

    g8 = ConvProblem(8, 8, 64, 128, 3, 3, 1, 1, n=2).geometry
    g7 = ConvProblem(7, 7, 64, 128, 3, 3, 1, 1, n=2).geometry
    tall = Plan(128, 64, 16, 4, 1, 3, 8, 8, loop=HaloLdsm(8))
    assert halo_images(tall, g8, Pass.DGRAD) == 2
    assert halo_images(Plan(256, 64, 16, 8, 1, 3, 8, 8, loop=HaloLdsm(8)), g8, Pass.FPROP) == 4
    assert halo_images(Plan(64, 64, 16, 4, 1, 3, 8, 8, loop=HaloLdsm(8)), g8, Pass.DGRAD) == 1
    assert halo_images(Plan(128, 64, 16, 4, 1, 3, 8, 8, loop=HaloTile(16)), g8, Pass.DGRAD) == 1
    assert halo_images(tall, g7, Pass.DGRAD) == 1
    assert halo_images(Plan(64, 16, 16, 4, 1, 2, 8, 8, loop=HaloLdsm(8, 2)), g8, Pass.DGRAD) == 1
    assert halo_shape(tall, g8, 2) == (16, 8, 20, 10)  # two 10-row halos, stacked
    assert halo_shape(tall, g8) == (16, 8, 18, 10)


def test_halo_shared_memory_counts_the_halo_and_every_taps_weights():
    """4 x 32 output pixels of a 3x3, dilation-2 filter reach 8 x 36 input pixels; fprop stages
    them (2 slabs of 16 channels, each pixel padded to 24 halves) and 9 taps of [BN][BK + 8]
    weights per stage; 64 channels (C in fprop, K in dgrad) are two K-steps: two stages."""
    from convgen.footprint import halo_shape

    prob = ConvProblem(40, 40, 64, 64, 3, 3, 1, 2, 2, n=2)
    p = Plan(128, 32, 32, 4, 1, 2, 8, 8, loop=HaloTile(32))
    assert halo_shape(p, prob) == (4, 32, 8, 36)
    assert smem_bytes(p, Pass.FPROP, geometry=prob) == 2 * (8 * 36 * 2 * 24 + 9 * 32 * 40) * 2
    assert smem_bytes(p, Pass.DGRAD, geometry=prob) == 2 * (8 * 36 * 2 * 24 + 9 * 32 * 40) * 2
    with pytest.raises(ValueError, match="halo plan's shared memory depends on the filter"):
        smem_bytes(p, Pass.FPROP)


def test_halo_fragments_read_shared_memory_without_bank_conflicts():
    """Whatever pixel a tap's fragment starts at, the 8 rows of each ldmatrix phase (16 bytes
    each, HALO_LD halves apart) cover 8 distinct 16-byte groups of the 32 banks."""
    from convgen.footprint import HALO_LD

    for start in range(64):
        for half in (0, 8):  # the k 0-7 and k 8-15 phases of one 16 x 16 fragment
            for rows in (range(0, 8), range(8, 16)):
                groups = {((start + r) * HALO_LD + half) * 2 // 16 % 8 for r in rows}
                assert len(groups) == 8, (start, half, sorted(groups))
    assert HALO_LD * 2 % 16 == 0, "ldmatrix rows must stay 16-byte aligned"


@pytest.mark.parametrize("pass_, c, k, loop, want", [
    (Pass.FPROP, 3, 32, Im2col(), 1),      # R*S*C = 27: one K-step of 32, whatever the plan's depth
    (Pass.FPROP, 32, 32, Im2col(), 4),     # 288: nine steps, the plan's 4 stages
    (Pass.DGRAD, 32, 16, Im2col(), 4),     # R*S*K = 144: five steps
    (Pass.FPROP, 32, 32, HaloTile(16), 1),  # a halo step is every tap of 32 channels: one step
    (Pass.DGRAD, 32, 64, HaloTile(16), 2),  # 64 dy channels: two steps
    (Pass.FPROP, 3, 32, StagedHalo(16), 1),  # the staged halo runs the im2col reduction: 27, one step
    (Pass.FPROP, 5, 32, StagedHalo(16), 2),  # 45: two steps
    (Pass.WGRAD, 3, 32, Im2col(), 4),      # wgrad reduces over the batch: only the launch knows
])
def test_one_step_reductions_allocate_one_stage(pass_, c, k, loop, want):
    from convgen.footprint import ring_stages

    prob = ConvProblem(32, 32, c, k, 3, 3, 1, 1, 1, n=8)
    p = Plan(256, 32, 32, 4, 1, 4, 8, 8, loop=loop)
    assert ring_stages(p, pass_, prob) == want
    assert ring_stages(p, pass_, None) == 4


def test_im2col_plans_keep_their_keys():
    """tile_w = 0 is left out of a plan's dict, so specs, caches and tuning entries made
    before the halo path existed still match."""
    p = Plan(128, 64, 32, 4, 1, 3, 8, 8)
    assert "tile_w" not in p.as_dict() and Plan.from_dict(p.as_dict()) == p
    h = Plan(128, 64, 32, 4, 1, 3, 8, 8, loop=HaloTile(16))
    assert h.as_dict()["tile_w"] == 16 and Plan.from_dict(h.as_dict()) == h
    assert "halo tile 8x16 pixels" in h.explain()


def test_narrow_fprop_takes_the_staged_halo_path_at_any_stride():
    """A 3-channel fprop (ResNet-50's 7x7 stride-2 first layer here) stages its block's whole
    input halo, every channel, next to the pipeline: 8 x 16 output pixels at stride 2 reach
    21 x 37 input pixels.  Its reduction (R*S*C = 147) is five K-steps, so all 3 stages stay."""
    from convgen.footprint import halo_path, halo_shape, staged_halo_halves

    prob = ConvProblem(224, 224, 3, 64, 7, 7, 2, 3, n=1)
    p = Plan(128, 64, 32, 4, 1, 3, 1, 1, loop=StagedHalo(16))
    check_plan(p, prob, Pass.FPROP, Target("sm_90"), "float16")
    assert halo_path(p, prob, Pass.FPROP) == "im2col"
    assert halo_path(Plan(128, 64, 32, 4, 1, 3, 8, 8, loop=HaloTile(16)), prob, Pass.DGRAD) == "taps"
    assert halo_shape(p, prob) == (8, 16, 21, 37)
    assert staged_halo_halves(p, prob) == 2368  # 21 * 37 * 3 = 2331, rounded up to 128 bytes
    assert smem_bytes(p, Pass.FPROP, geometry=prob) == 2368 * 2 + 3 * (128 * 40 + 64 * 40) * 2
    assert halo_path(Plan(128, 64, 32, 4, 1, 3, 1, 1), prob, Pass.FPROP) == ""


def test_several_tiles_per_block_need_a_one_step_halo_reduction():
    """tiles > 1 keeps every tap's weights, two halo slots and the epilogue scratch live at
    once; it needs the "taps" halo path with the whole reduction in one K-step."""
    from convgen.footprint import halo_stage_halves

    prob = ConvProblem(32, 32, 32, 32, 3, 3, 1, 1, n=8)
    p = Plan(256, 32, 32, 4, 1, 2, 8, 8, loop=HaloTile(16, 4))
    check_plan(p, prob, Pass.DGRAD, Target("sm_90"), "float16")
    a, b = halo_stage_halves(p, prob, Pass.DGRAD)
    assert smem_bytes(p, Pass.DGRAD, geometry=prob) == (b + 2 * a) * 2 + 4 * 16 * (16 * 2 + 8) * 4
    with pytest.raises(ValueError, match=r"HaloTile\.tiles=4: several tiles per block need the halo path's one-step reductions"):
        check_plan(p, ConvProblem(32, 32, 32, 64, 3, 3, 1, 1, n=8), Pass.DGRAD, Target("sm_90"), "float16")  # K = 64: 2 steps
    with pytest.raises(ValueError, match=r"HaloTile\.tiles=2 needs plan\.split_k = 1, got 2"):
        Plan(256, 32, 32, 4, 1, 2, 8, 8, split_k=2, loop=HaloTile(16, 2))
    assert "tiles" not in Plan(256, 32, 32, 4, 1, 2, 8, 8, loop=HaloTile(16)).as_dict() and p.as_dict()["tiles"] == 4
    assert p.brief() == "256x32x32 w4x1 s2 k1 halo16x4" and "4 tiles per block" in p.explain()


# --------------------------------------------------------------------------- flat halo grid


@settings(max_examples=150)
@given(
    r=st.integers(1, 5), s=st.integers(1, 5), pad=st.tuples(st.integers(0, 4), st.integers(0, 4)),
    dil=st.tuples(st.integers(1, 3), st.integers(1, 3)), h=st.integers(1, 12), w=st.integers(1, 12),
    n=st.integers(1, 3), pass_=st.sampled_from([Pass.FPROP, Pass.DGRAD]), seed=st.integers(0, 2**32 - 1),
)
def test_flat_grid_taps_are_fixed_shifts(r, s, pad, dil, h, w, n, pass_, seed):
    """The flat halo path's whole claim, on one channel in NumPy: lay the batch out on
    `flat_grid`'s pitch, and every output's tap is the same shift of its position, the
    wrapped reads past a row or image landing on zeros.  (The kernel's gather maps positions
    to pixels exactly as `place` does here; the GPU tests check that part.)"""
    import numpy as np

    from convgen import reference
    from convgen.footprint import flat_grid, halo_frame

    assume(h + 2 * pad[0] >= dil[0] * (r - 1) + 1 and w + 2 * pad[1] >= dil[1] * (s - 1) + 1)
    prob = ConvProblem(h, w, 1, 1, r, s, 1, pad, dil, n=n)
    g = prob.geometry
    rng = np.random.default_rng(seed)
    wt = rng.standard_normal((1, r, s, 1))
    (ih, iw), (oh, ow), (org_h, org_w) = halo_frame(g, pass_)
    inp = rng.standard_normal((n, ih, iw, 1))
    gh, gw = flat_grid(g, pass_)
    assert gh >= oh and gw >= ow
    shifts = [(rr * dil[0] * gw + ss * dil[1], (r - 1 - rr, s - 1 - ss) if pass_ is Pass.DGRAD else (rr, ss))
              for rr in range(r) for ss in range(s)]
    positions = n * gh * gw
    span = positions + max(sh for sh, _ in shifts)
    # place: grid position -> its input pixel, or zero (outside the image, or past the batch)
    flat = np.zeros(span)
    for pos in range(span):
        img, rem = divmod(pos, gh * gw)
        y, x = divmod(rem, gw)
        y, x = y + org_h, x + org_w
        if img < n and 0 <= y < ih and 0 <= x < iw:
            flat[pos] = inp[img, y, x, 0]
    out = np.zeros(positions)
    for sh, (rr, ss) in shifts:
        out += flat[sh: sh + positions] * wt[0, rr, ss, 0]
    got = out.reshape(n, gh, gw)[:, :oh, :ow]
    if pass_ is Pass.FPROP:
        want = reference.fprop(inp, wt, stride=1, padding=pad, dilation=dil)[..., 0]
    else:
        want = reference.dgrad(inp, wt, (n, h, w, 1), stride=1, padding=pad, dilation=dil)[..., 0]
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_sliced_k_shared_memory_holds_the_parked_sums():
    """Slices 1.. park a block's worth of fp32 sums each before slice 0 drains: with four
    slices of a 128x128 tile that is 192 KiB, more than the pipeline, and more than sm_75 has."""
    problem = ConvProblem(8, 8, 64, 128, 3, 3, 1, 1, n=2)
    p = Plan(128, 128, 64, 2, 2, 2, 8, 8, loop=Im2col(4))
    assert smem_bytes(p, Pass.DGRAD, 32, problem.geometry) == 3 * 128 * 128 * 4
    check_plan(p, problem.geometry, Pass.DGRAD, Target("sm_90"), "float16")
    with pytest.raises(ValueError, match=r"plan needs 196608 bytes of shared memory but sm_75 allows"):
        check_plan(p, problem.geometry, Pass.DGRAD, Target("sm_75"), "float16")


@pytest.mark.parametrize("arch, pass_, changes, why", [
    ("sm_80", Pass.FPROP, {}, "needs warpgroup MMAs, which sm_80 does not have"),
    ("gfx942", Pass.DGRAD, {}, "needs warpgroup MMAs, which gfx942 does not have"),
    ("sm_90", Pass.WGRAD, {}, "computes fprop and dgrad only"),
    ("sm_90", Pass.FPROP, dict(vec_a=4), "reads both operands as fp16 in 16-byte runs"),
])
def test_wgmma_plans_are_checked(arch, pass_, changes, why):
    problem = ConvProblem(8, 8, 64, 128, 3, 3, 1, 1, n=2)
    import dataclasses

    good = Plan(128, 64, 64, 4, 1, 3, 8, 8, loop=Wgmma())
    check_plan(good, problem.geometry, Pass.DGRAD, Target("sm_90"), "float16")
    p = dataclasses.replace(good, **changes)
    with pytest.raises(ValueError, match=rf"Wgmma: the wgmma main loop {why}"):
        check_plan(p, problem.geometry, pass_, Target(arch), "float16")


def test_wgmma_stages_are_dense_core_matrices():
    """wgmma's operands are unpadded 8x8 core matrices: a 128x64x64 stage pair is exactly
    (128 + 64) x 64 halves, where the WMMA plan pads each row by 8 halves."""
    g = ConvProblem(8, 8, 64, 128, 3, 3, 1, 1, n=2).geometry
    wg = Plan(128, 64, 64, 4, 1, 3, 8, 8, loop=Wgmma())
    assert smem_bytes(wg, Pass.FPROP, 32, g) == 3 * (128 + 64) * 64 * 2
    assert smem_bytes(Plan(128, 64, 64, 4, 1, 3, 8, 8), Pass.FPROP, 32, g) == 3 * (128 + 64) * 72 * 2


@pytest.mark.parametrize("pass_", list(Pass), ids=lambda p: p.value)
def test_an_empty_batch_plans_on_every_suite_layer(pass_):
    """N = 0 is a valid problem (the runtime launches nothing for it), and `convgen plan -n 0`
    must plan it like any other: wgrad's TMA cost model once found no split for a reduction of
    zero pixels and raised from min() of nothing."""
    from convgen.suites import SUITES

    for layers in SUITES.values():
        for layer in layers:
            p = plan(layer.problem.with_batch(0), pass_, Target("sm_90", 132))
            assert p.split_k >= 1
