"""convgen.ir: validation at construction, derived sizes, the GEMM views, and spec keys.

Every bad value must be rejected where it is typed, with a ValueError whose
message names the field and the value; the output sizes are checked against a
brute-force count of filter placements, not against the formula they use.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from convgen.ir import ARCHES, ConvGeometry, ConvProblem, Epilogue, Pass, Target, resolve_padding
from convgen.spec import KernelSpec, Plan
from convgen.mainloop import KINDS, Depthwise, FlatHalo, HaloLdsm, HaloTile, Im2col, StagedHalo, TmaHalo, TmaWgmma, Wgmma

ROOT = Path(__file__).resolve().parent.parent

GOOD = dict(h=8, w=9, c=4, k=5, r=3, s=3, stride=1, padding=1, dilation=1)


def problem(n=2, **changes):
    kw = {**GOOD, **changes}
    return ConvProblem(**kw, n=n)


def brute_out(size: int, pad: int, filt: int, stride: int, dil: int) -> int:
    """Output positions counted by placing the dilated filter at every stride step of
    the padded input and keeping the placements whose every tap lies inside it."""
    padded = size + 2 * pad
    count = 0
    for o in range(padded + 1):
        start = o * stride
        if start >= padded:
            break
        taps = [start + i * dil for i in range(filt)]
        if all(0 <= t < padded for t in taps):
            count += 1
    return count


# --------------------------------------------------------------------------- ConvProblem validation


@pytest.mark.parametrize("name", ["h", "w", "c", "k", "r", "s"])
@pytest.mark.parametrize("value", [0, -1, -7])
def test_sizes_below_one_are_rejected(name, value):
    with pytest.raises(ValueError, match=rf"^{name} must be >= 1, got {value}$"):
        problem(**{name: value})


@pytest.mark.parametrize("value", [-1, -256])
def test_negative_batch_is_rejected(value):
    with pytest.raises(ValueError, match=rf"n \(batch size\) must be >= 0, got {value}"):
        problem(n=value)


def test_empty_batch_is_valid():
    p = problem(n=0)
    assert p.n == 0
    assert p.x_shape == (0, 8, 9, 4) and p.y_shape == (0, p.p, p.q, 5)
    assert p.gemm("fprop").m == 0 and p.gemm("dgrad").m == 0 and p.gemm("wgrad").k == 0
    assert p.flops("fprop") == 0


@pytest.mark.parametrize("name", ["h", "w", "c", "k", "r", "s", "n"])
@pytest.mark.parametrize("value", [3.5, 2.0, True, False, "3", None])
def test_non_integers_are_rejected(name, value):
    with pytest.raises(ValueError, match=rf"^{name} must be an integer, got {re.escape(repr(value))}$"):
        problem(**{name: value})


def test_numpy_integers_are_accepted_and_normalised():
    p = problem(n=np.int64(3), h=np.int32(8), c=np.int64(4))
    assert (p.n, p.h, p.c) == (3, 8, 4)
    assert all(type(v) is int for v in (p.n, p.h, p.c))
    json.dumps(p.as_dict())  # plain ints all the way down


@pytest.mark.parametrize(
    "name, value, axis",
    [
        ("stride", 0, "height"), ("stride", -2, "height"), ("stride", (1, 0), "width"), ("stride", (0, 1), "height"),
        ("dilation", 0, "height"), ("dilation", (1, -1), "width"),
        ("padding", -1, "height"), ("padding", (0, -3), "width"),
    ],
)
def test_pair_values_out_of_range_are_rejected(name, value, axis):
    bad = value if isinstance(value, int) else [v for v in value if v < (0 if name == "padding" else 1)][0]
    with pytest.raises(ValueError, match=rf"^{name} \({axis}\) must be >= \d, got {bad}:"):
        problem(**{name: value})


@pytest.mark.parametrize("name", ["stride", "padding", "dilation"])
@pytest.mark.parametrize("value", [(1,), (1, 1, 1), [], [2, 2, 2, 2]])
def test_pairs_of_the_wrong_length_are_rejected(name, value):
    with pytest.raises(ValueError, match=rf"^{name} must be an int or a \(height, width\) pair, got {re.escape(repr(value))}$"):
        problem(**{name: value})


@pytest.mark.parametrize("name", ["stride", "padding", "dilation"])
@pytest.mark.parametrize("value", [1.5, True, (1, 2.0), (True, 1), "1"])
def test_pair_elements_must_be_integers(name, value):
    with pytest.raises(ValueError, match=rf"^{name}(\[[01]\])? must be an integer, got "):
        problem(**{name: value})


def test_pairs_accept_lists_and_store_tuples():
    p = problem(stride=[2, 1], padding=[1, 0], dilation=[1, 2], h=9, w=9)
    assert p.stride == (2, 1) and p.padding == (1, 0) and p.dilation == (1, 2)
    hash(p)  # frozen, hashable: usable as a cache key


@pytest.mark.parametrize(
    "changes, axis",
    [
        (dict(h=2, r=3, padding=0), "height"),
        (dict(w=4, s=5, padding=0), "width"),
        (dict(h=4, r=3, dilation=2, padding=0), "height"),  # dilated filter 5 > 4
        (dict(w=1, s=3, padding=(2, 0)), "width"),
    ],
)
def test_output_size_below_one_is_rejected(changes, axis):
    out = "p" if axis == "height" else "q"
    with pytest.raises(ValueError, match=rf"^output {axis} {out} would be <= 0: the padded input {axis} \d+ \+ 2\*\d+ = \d+"):
        problem(**changes)


def test_output_size_of_exactly_one_is_valid():
    p = problem(h=3, w=5, r=3, s=5, padding=0)
    assert (p.p, p.q) == (1, 1)


dims = st.integers(1, 24)


@settings(max_examples=400)
@given(
    h=dims, w=dims, r=st.integers(1, 7), s=st.integers(1, 7),
    sh=st.integers(1, 5), sw=st.integers(1, 5), ph=st.integers(0, 4), pw=st.integers(0, 4),
    dh=st.integers(1, 4), dw=st.integers(1, 4), n=st.integers(0, 5),
)
def test_output_sizes_match_a_brute_force_count(h, w, r, s, sh, sw, ph, pw, dh, dw, n):
    p_ref, q_ref = brute_out(h, ph, r, sh, dh), brute_out(w, pw, s, sw, dw)
    kw = dict(h=h, w=w, c=3, k=2, r=r, s=s, stride=(sh, sw), padding=(ph, pw), dilation=(dh, dw))
    if p_ref == 0 or q_ref == 0:
        with pytest.raises(ValueError, match="would be <= 0"):
            ConvProblem(**kw, n=n)
        with pytest.raises(ValueError, match="would be <= 0"):
            ConvGeometry(**kw)
        return
    prob = ConvProblem(**kw, n=n)
    assert (prob.p, prob.q) == (p_ref, q_ref)
    assert prob.y_shape == (n, p_ref, q_ref, 2)
    assert (prob.geometry.p, prob.geometry.q) == (p_ref, q_ref)


# --------------------------------------------------------------------------- padding modes


@given(
    h=st.integers(1, 30), w=st.integers(1, 30),
    r=st.sampled_from([1, 3, 5, 7]), s=st.sampled_from([1, 3, 5]),
    dh=st.integers(1, 3), dw=st.integers(1, 3),
)
def test_same_padding_keeps_the_size(h, w, r, s, dh, dw):
    p = ConvProblem.create(1, h, w, 2, 2, r, s, padding="same", dilation=(dh, dw))
    assert p.padding == (dh * (r - 1) // 2, dw * (s - 1) // 2)
    assert (p.p, p.q) == (h, w)
    assert (brute_out(h, p.padding[0], r, 1, dh), brute_out(w, p.padding[1], s, 1, dw)) == (h, w)


def test_same_padding_with_an_even_filter_made_odd_by_dilation():
    # r = 2 dilated by 2 spans 3 rows: symmetric padding 1 exists.
    p = ConvProblem.create(1, 8, 8, 2, 2, 2, 3, padding="same", dilation=(2, 1))
    assert p.padding == (1, 1) and (p.p, p.q) == (8, 8)


@pytest.mark.parametrize("r, s, axis, eff", [(2, 3, "height", 2), (3, 4, "width", 4), (4, 4, "height", 4)])
def test_same_padding_rejects_even_filters(r, s, axis, eff):
    with pytest.raises(ValueError, match=rf"padding='same' with an even dilated filter {axis} \({eff}\)"):
        ConvProblem.create(1, 8, 8, 2, 2, r, s, padding="same")


@pytest.mark.parametrize("stride", [2, (1, 2), (3, 1)])
def test_same_padding_rejects_strides(stride):
    with pytest.raises(ValueError, match=rf"padding='same' needs stride 1, got stride {re.escape(repr(stride))}"):
        ConvProblem.create(1, 8, 8, 2, 2, 3, 3, stride=stride, padding="same")


def test_valid_padding_is_zero():
    p = ConvProblem.create(3, 8, 9, 2, 2, 3, 2, stride=2, padding="valid")
    assert p.padding == (0, 0) and (p.p, p.q) == (3, 4) and p.n == 3


def test_padding_mode_is_case_insensitive_and_unknown_modes_are_rejected():
    assert resolve_padding("SAME", 3, 3) == (1, 1)
    assert resolve_padding("Valid", 3, 3) == (0, 0)
    with pytest.raises(ValueError, match=r"padding must be an int, a pair, 'same' or 'valid', got 'full'"):
        ConvProblem.create(1, 8, 8, 2, 2, 3, 3, padding="full")


def test_create_accepts_explicit_padding_and_validates_like_the_constructor():
    assert ConvProblem.create(1, 8, 8, 2, 2, 3, 3, padding=(1, 0)) == ConvProblem(8, 8, 2, 2, 3, 3, 1, (1, 0), 1, n=1)
    with pytest.raises(ValueError, match="padding \\(height\\) must be >= 0, got -1"):
        ConvProblem.create(1, 8, 8, 2, 2, 3, 3, padding=-1)
    with pytest.raises(ValueError, match="h must be >= 1, got 0"):
        ConvProblem.create(1, 0, 8, 2, 2, 1, 1, padding="same")


# --------------------------------------------------------------------------- GEMM views, geometry


def test_gemm_dims_for_every_pass():
    p = ConvProblem(7, 10, 3, 4, 3, 2, (2, 1), (1, 0), (1, 2), n=2)
    P, Q = brute_out(7, 1, 3, 2, 1), brute_out(10, 0, 2, 1, 2)
    assert (p.p, p.q) == (P, Q) == (4, 8)
    f, d, w = p.gemm(Pass.FPROP), p.gemm("dgrad"), p.gemm("WGRAD")
    assert (f.m, f.n, f.k) == (2 * P * Q, 4, 3 * 2 * 3)
    assert (f.m_axis, f.n_axis, f.k_axis) == ("N*P*Q", "K", "R*S*C")
    assert (d.m, d.n, d.k) == (2 * 7 * 10, 3, 3 * 2 * 4)
    assert (d.m_axis, d.n_axis, d.k_axis) == ("N*H*W", "C", "R*S*K")
    assert (w.m, w.n, w.k) == (4, 3 * 2 * 3, 2 * P * Q)
    assert (w.m_axis, w.n_axis, w.k_axis) == ("K", "R*S*C", "N*P*Q")
    assert f.flops == 2 * f.m * f.n * f.k == w.flops == p.flops("wgrad")
    assert p.flops("dgrad") == d.flops
    # an explicit batch overrides the problem's
    assert p.gemm("fprop", 5).m == 5 * P * Q and p.gemm("wgrad", 5).k == 5 * P * Q
    assert p.geometry.gemm("dgrad", 3) == p.with_batch(3).gemm("dgrad")


def test_pass_parse():
    assert Pass.parse("FPROP") is Pass.FPROP and Pass.parse(Pass.WGRAD) is Pass.WGRAD
    with pytest.raises(ValueError, match="pass must be one of fprop, dgrad, wgrad, got 'xgrad'"):
        Pass.parse("xgrad")


def test_geometry_drops_the_batch():
    a, b = problem(n=1), problem(n=512)
    assert a != b
    ga, gb = a.geometry, b.geometry
    assert type(ga) is ConvGeometry and not hasattr(ga, "n")
    assert ga == gb and hash(ga) == hash(gb)
    assert ga.as_dict() == {k: v for k, v in a.as_dict().items() if k != "n"}
    assert a.with_batch(512) == b
    assert "N=1 " in a.describe() and "N=" not in ga.describe()


# --------------------------------------------------------------------------- Target


@pytest.mark.parametrize("arch", ["sm_70", "sm90", "gfx90a", "", "SM_90"])
def test_unknown_arch_is_rejected(arch):
    with pytest.raises(ValueError, match=rf"unknown arch {re.escape(repr(arch))}; known: sm_75, "):
        Target(arch)


def test_target_defaults():
    t = Target()
    assert (t.arch, t.backend, t.warp_size, t.sm_count) == ("sm_90", "cuda", 32, 132)
    assert t.smem_limit == 227 * 1024
    for arch, info in ARCHES.items():
        t = Target(arch)
        assert t.sm_count == info.default_sm_count and t.backend == info.backend
        assert t.as_dict() == {"backend": info.backend, "arch": arch, "sm_count": info.default_sm_count}
    assert Target("gfx942").warp_size == 64 and Target("gfx942").backend == "hip"
    assert Target("sm_80", 7).sm_count == 7


CAPABILITIES = ("cp_async", "ldmatrix", "mma_sync", "wgmma", "tma")


@pytest.mark.parametrize("arch, caps, spelling", [
    ("sm_75", (False, True, False, False, False), ("cu", "nvcuda::wmma", "__half", "__syncwarp()", True)),
    ("sm_80", (True, True, True, False, False), ("cu", "nvcuda::wmma", "__half", "__syncwarp()", True)),
    ("sm_89", (True, True, True, False, False), ("cu", "nvcuda::wmma", "__half", "__syncwarp()", True)),
    ("sm_90", (True, True, True, True, True), ("cu", "nvcuda::wmma", "__half", "__syncwarp()", True)),
    ("gfx942", (False, False, False, False, False), ("hip", "rocwmma", "rocwmma::float16_t", None, False)),
    ("gfx1201", (False, False, False, False, False), ("hip", "rocwmma", "rocwmma::float16_t", None, False)),
])
def test_one_description_per_arch(arch, caps, spelling):
    """Capabilities and source spelling come from one description (target.info, what the
    emitter reads); mma.sync.m16n8k16 and cp.async start at sm_80, wgmma and TMA at sm_90."""
    info = Target(arch).info
    assert tuple(getattr(info, c) for c in CAPABILITIES) == caps
    ext, ns, half, sync, ptx = spelling
    assert (info.file_ext, info.wmma_ns, info.frag_half, info.ptx_store16) == (ext, ns, half, ptx)
    if sync:
        assert info.warp_sync == sync
    else:
        assert "__builtin_amdgcn_wave_barrier()" in info.warp_sync
    assert info.name == info.backend == ("cuda" if ext == "cu" else "hip")


@pytest.mark.parametrize("count, msg", [(0, "sm_count must be >= 1, got 0"), (-4, "sm_count must be >= 1, got -4"),
                                        (2.5, "sm_count must be an integer, got 2.5"),
                                        (True, "sm_count must be an integer, got True")])
def test_bad_sm_count_is_rejected(count, msg):
    with pytest.raises(ValueError, match=re.escape(msg)):
        Target("sm_90", count)


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


# --------------------------------------------------------------------------- Epilogue and KernelSpec

PROB = ConvProblem(16, 16, 8, 16, 3, 3, 1, 1, 1, n=4)
PLAN = Plan(128, 32, 32, 4, 1, 3, 8, 8)


def spec(**changes) -> KernelSpec:
    kw = dict(geometry=PROB, pass_=Pass.FPROP, epilogue=Epilogue(bias=True), in_dtype="float16",
              target=Target("sm_90"), plan=PLAN)
    kw.update(changes)
    return KernelSpec(**kw)


def canonical_key(s: KernelSpec) -> str:
    blob = json.dumps(s.as_dict(), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def test_epilogue_rejects_bad_out_dtype():
    with pytest.raises(ValueError, match=r"out_dtype must be one of \('float16', 'bfloat16', 'float32'\), got 'int8'"):
        Epilogue(out_dtype="int8")


def test_bias_dtype_is_fprops_bias_and_keeps_its_kernels_apart():
    """A float16 bias is a different kernel (its own key, so its own cache entry); it is
    fprop's with a bias only, and a dtype convgen has no kernels for is refused by name."""
    with pytest.raises(ValueError, match=r"bias_dtype must be one of \('float16', 'bfloat16', 'float32'\), got 'int8'"):
        Epilogue(bias=True, bias_dtype="int8")
    for pass_, epi in ((Pass.WGRAD, Epilogue(bias=True, bias_dtype="float16")),
                       (Pass.FPROP, Epilogue(bias_dtype="float16"))):
        with pytest.raises(ValueError, match="bias_dtype is what fprop's bias is read as"):
            spec(pass_=pass_, epilogue=epi)
    b16, b32 = spec(epilogue=Epilogue(bias=True, bias_dtype="float16")), spec(epilogue=Epilogue(bias=True))
    assert b16.key != b32.key and b16.name != b32.name


@pytest.mark.parametrize("pass_", [Pass.DGRAD, Pass.WGRAD])
def test_relu_is_fprop_only(pass_):
    with pytest.raises(ValueError, match=rf"relu is an fprop epilogue; {pass_.value} cannot apply it"):
        spec(pass_=pass_, epilogue=Epilogue(relu=True))


def test_bias_on_dgrad_is_rejected_but_wgrad_bias_means_db():
    with pytest.raises(ValueError, match="bias does not apply to dgrad"):
        spec(pass_=Pass.DGRAD, epilogue=Epilogue(bias=True))
    assert spec(pass_=Pass.WGRAD, epilogue=Epilogue(bias=True)).epilogue.bias


def test_spec_rejects_bad_in_dtype_and_pass():
    with pytest.raises(ValueError, match=r"in_dtype must be one of .*got 'float64'"):
        spec(in_dtype="float64")
    with pytest.raises(ValueError, match="pass must be one of"):
        spec(pass_="backward")


def test_spec_key_is_stable():
    a, b = spec(), spec()
    assert a.key == b.key == canonical_key(a)
    assert re.fullmatch(r"[0-9a-f]{16}", a.key)
    assert spec(pass_="fprop").key == a.key  # a pass given by name is the same spec
    assert a.name == f"convgen_fprop_im2col_128x32x32_s3_sm90_16x16_c8_k16_3x3_s11_p11_d11_{a.key[:8]}"
    assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", a.name)  # a C identifier


@pytest.mark.parametrize("changes, middle", [
    (dict(plan=Plan(128, 32, 64, 4, 1, 4, 8, 8, loop=HaloTile(16, 2))), "fprop_halo16x2_128x32x64_s4_sm90"),
    (dict(plan=Plan(128, 32, 32, 4, 1, 3, 8, 8, loop=Wgmma()), pass_=Pass.DGRAD, epilogue=Epilogue()),
     "dgrad_wgmma_128x32x32_s3_sm90"),
    (dict(plan=Plan(64, 32, 16, 4, 1, 2, 8, 8, loop=HaloLdsm(8)), target=Target("gfx942")),
     "fprop_ldsm8_64x32x16_s2_gfx942"),
    (dict(plan=Plan(128, 32, 64, 2, 1, 2, 8, 8, loop=Im2col(2)), pass_=Pass.WGRAD), "wgrad_im2colk2_128x32x64_s2_sm90"),
])
def test_kernel_names_say_kind_tile_stages_and_arch(changes, middle):
    s = spec(**changes)
    assert s.name == f"convgen_{middle}_16x16_c8_k16_3x3_s11_p11_d11_{s.key[:8]}"
    assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", s.name) and len(s.name) <= 96


def test_spec_key_is_the_same_in_another_process():
    code = (
        "from convgen.ir import *\n"
        "from convgen.spec import *\n"
        "p = ConvProblem(16, 16, 8, 16, 3, 3, 1, 1, 1, n=4)\n"
        "s = KernelSpec(p, Pass.FPROP, Epilogue(bias=True), 'float16', Target('sm_90'), Plan(128, 32, 32, 4, 1, 3, 8, 8))\n"
        "print(s.key, s.name)\n"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.split() == [spec().key, spec().name]


def test_spec_drops_the_batch():
    a = spec(geometry=PROB.with_batch(1))
    b = spec(geometry=PROB.with_batch(999))
    c = spec(geometry=PROB.geometry)
    assert type(a.geometry) is ConvGeometry
    assert a == b == c
    assert a.key == b.key == c.key and a.name == b.name == c.name
    assert "n" not in a.as_dict()["geometry"]


def _variants():
    g = PROB.geometry
    for name in ("h", "w", "c", "k"):
        yield f"geometry.{name}", dict(geometry=dataclasses.replace(g, **{name: getattr(g, name) * 2}))
    yield "geometry.r", dict(geometry=dataclasses.replace(g, r=1))
    yield "geometry.s", dict(geometry=dataclasses.replace(g, s=5))
    yield "geometry.stride", dict(geometry=dataclasses.replace(g, stride=(1, 2)))
    yield "geometry.padding", dict(geometry=dataclasses.replace(g, padding=(1, 0)))
    yield "geometry.dilation", dict(geometry=dataclasses.replace(g, dilation=(2, 1)))
    yield "pass", dict(pass_=Pass.WGRAD)
    yield "epilogue.bias", dict(epilogue=Epilogue(bias=False))
    yield "epilogue.relu", dict(epilogue=Epilogue(bias=True, relu=True))
    yield "epilogue.out_dtype", dict(epilogue=Epilogue(bias=True, out_dtype="float32"))
    yield "in_dtype", dict(in_dtype="float32")
    yield "target.arch", dict(target=Target("sm_80"))
    yield "target.sm_count", dict(target=Target("sm_90", 100))
    for name, value in dict(block_m=64, block_n=64, block_k=64, warps_m=2, warps_n=2, stages=2,
                            vec_a=4, vec_b=2, split_k=3).items():
        yield f"plan.{name}", dict(plan=dataclasses.replace(PLAN, **{name: value}))
    yield "plan.read_a", dict(plan=dataclasses.replace(PLAN, vec_a=1, read_a="float32"), in_dtype="float32")
    yield "plan.read_b", dict(plan=dataclasses.replace(PLAN, vec_b=1, read_b="float32"), in_dtype="float32")


VARIANTS = list(_variants())


@pytest.mark.parametrize("changes", [v[1] for v in VARIANTS], ids=[v[0] for v in VARIANTS])
def test_spec_key_changes_with_every_field(changes):
    base, other = spec(), spec(**changes)
    if "plan" in changes and "in_dtype" in changes:  # read_* needs float32 inputs: compare like with like
        base = spec(in_dtype="float32", plan=dataclasses.replace(changes["plan"], read_a="float16", read_b="float16"))
    assert other != base
    assert other.key != base.key
    assert other.name != base.name


def test_all_variant_keys_are_distinct():
    keys = {spec(**changes).key for _, changes in VARIANTS} | {spec().key}
    assert len(keys) == len(VARIANTS) + 1


def test_spec_key_ignores_plan_reasons():
    a = spec(plan=dataclasses.replace(PLAN, reasons=("one reason",)))
    assert a.key == spec().key and a == spec()


# --------------------------------------------------------------------------- regressions


def test_numpy_ints_in_target_and_plan_give_a_key():
    s = spec(target=Target("sm_90", np.int64(100)), plan=dataclasses.replace(PLAN, block_m=np.int64(128)))
    assert s.key == spec(target=Target("sm_90", 100), plan=dataclasses.replace(PLAN, block_m=128)).key
    assert type(s.target.sm_count) is int and type(s.plan.block_m) is int


def test_epilogue_flags_must_be_bools():
    with pytest.raises(ValueError, match="bias"):
        Epilogue(bias="yes")
    with pytest.raises(ValueError, match="relu"):
        Epilogue(relu=1)


def test_plan_brief_names_the_halo_tile():
    """tune's and bench's tables print plans this way; a halo plan must not read as im2col."""
    from convgen.spec import Plan

    assert Plan(256, 32, 32, 4, 1, 2, 8, 8).brief() == "256x32x32 w4x1 s2 k1"
    assert Plan(256, 32, 32, 4, 1, 2, 8, 8, split_k=3, loop=HaloTile(16)).brief() == "256x32x32 w4x1 s2 k3 halo16"
    assert Plan(256, 32, 32, 4, 1, 2, 8, 8, loop=StagedHalo(32)).brief() == "256x32x32 w4x1 s2 k1 halo32"
    assert Plan(128, 32, 32, 4, 1, 2, 8, 8, loop=HaloLdsm(8, 2)).brief() == "128x32x32 w4x1 s2 k1 halo8x2"
    assert Plan(128, 32, 32, 4, 1, 2, 8, 8, loop=FlatHalo(2)).brief() == "128x32x32 w4x1 s2 k1 flatx2"


def test_residual_and_gelu_are_fprop_epilogues_that_keep_other_kernels_keys():
    """A residual (act(alpha * conv + bias + beta * residual)) and GELU: fprop only, GELU or
    ReLU and not both, and left out of the key when off, so every kernel without them keeps
    its key, name and cache entry (the emission hashes hold the source)."""
    assert "residual" not in Epilogue(bias=True).as_dict() and "gelu" not in Epilogue().as_dict()
    assert Epilogue(residual=True, gelu=True).as_dict()["residual"] is True
    with pytest.raises(ValueError, match="two activations"):
        Epilogue(relu=True, gelu=True)
    with pytest.raises(ValueError, match="epilogue residual must be True or False"):
        Epilogue(residual=1)
    for name in ("residual", "gelu"):
        for pass_ in (Pass.DGRAD, Pass.WGRAD):
            with pytest.raises(ValueError, match=f"{name} is an fprop epilogue; {pass_.value} cannot apply it"):
                Epilogue(**{name: True}).check_pass(pass_)
    keys = {Epilogue(**kw).as_dict().__repr__() for kw in ({}, {"residual": True}, {"gelu": True},
                                                            {"residual": True, "gelu": True})}
    assert len(keys) == 4
