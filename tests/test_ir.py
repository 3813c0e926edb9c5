"""convgen.ir's problems and targets: validation at construction, padding modes, derived sizes,
and the GEMM views.  Every bad value must be rejected where it is typed, with a ValueError
whose message names the field and the value; the output sizes are checked against a
brute-force count of filter placements, not against the formula they use.  Plans are
tests/test_ir_plan.py's; epilogues and spec keys, tests/test_ir_spec.py's.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from convgen.ir import ARCHES, ConvGeometry, ConvProblem, Pass, Target, resolve_padding

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
