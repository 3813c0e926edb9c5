"""Narrow groups packed into slabs (convgen/group_pack.py), without a GPU: when the rule packs
and how far, that a slab's block-diagonal weights give every pass the grouped layer's own
result (on the float64 reference), that the CLI and tuner see the packed kernel, and that the
copy kernels are emitted deterministically and compile cleanly with NVRTC. The GPU tier is
tests/test_group_pack_gpu.py."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess

import numpy as np
import pytest

from convgen import reference
from convgen.group_pack import SLAB, expand_weights, kernel_problem, pack_source, packed_groups
from convgen.ir import ConvProblem, Pass, Target
from convgen.suites import SUITES

H200 = Target("sm_90", sm_count=132)


def grouped(c, k, g, r=3, s=3, stride=1, pad=1, n=2, h=9, w=9):
    return ConvProblem(h, w, c, k, r, s, stride, pad, 1, groups=g, n=n)


@pytest.mark.parametrize("pass_", list(Pass), ids=lambda p: p.value)
@pytest.mark.parametrize("c, g, slabs", [
    (128, 32, 4),    # 4 channels a group: 8 groups a slab of 32
    (256, 32, 8),    # 8 a group: 4 a slab
    (512, 32, 16),   # 16 a group: 2 a slab
    (1024, 32, None),  # 32 a group: already a slab
    (2048, 32, None),  # 64 a group
    (96, 32, 4),     # 3 a group: 10 would fill 30 channels, but only a divisor of 32 packs: 8 (24)
    (96, 3, None),   # 32 a group
])
def test_groups_pack_into_slabs_of_at_most_32_channels(c, g, slabs, pass_):
    """On a part without the TMA loop (sm_80): slabs alone, never a dense layer."""
    p = grouped(c, c, g)
    got = packed_groups(p, pass_, "float16", Target("sm_80"))
    assert got == slabs
    if got is not None:
        assert c // got <= SLAB
        assert kernel_problem(p, pass_, "float16", Target("sm_80")) == dataclasses.replace(p, groups=got)


@pytest.mark.parametrize("pass_", [Pass.FPROP, Pass.DGRAD], ids=lambda p: p.value)
def test_a_dense_layer_where_the_tma_loop_pays_for_the_waste(pass_):
    """ResNeXt's first stage (4 channels a group): one dense 128-channel layer does 32x the
    work. dgrad's slabs of 32 run the grouped im2col loop at a fifth of the TMA loop's rate
    (group_pack.RATE_RATIO), fprop's slabs of one box the TMA loop at 1/2.35 of the dense
    layer's (DENSE_OVER_SLAB_RATE): the dense layer wins both. Off sm_90, or where the dense
    layer would not take the TMA loop, the slabs stay."""
    p = grouped(128, 128, 32, h=56, w=56, n=64)
    assert packed_groups(p, pass_, "float16", H200) == 1
    assert packed_groups(p, pass_, "float16", Target("sm_80")) == 4
    # 8 a group: one dense layer would do 32x the work, 8x dgrad's slabs' 4x (fprop's slabs of a
    # box: 4x their 8x): slabs on the H200 too
    assert packed_groups(grouped(256, 256, 32, h=28, w=28, n=64), pass_, "float16", H200) == (
        8 if pass_ is Pass.DGRAD else 4)
    # 3 a group, C = 36: a dense layer would waste 2x the slabs' work, but C is not in 16-byte
    # runs, so the copy engine cannot run it: slabs
    assert packed_groups(grouped(36, 36, 12, h=28, w=28, n=64), pass_, "float16", H200) == 2


@pytest.mark.parametrize("c, g, slabs", [
    # 4 a group: 16 in a slab of one box; fprop's dense layer (32x the work) ran faster still
    (128, 32, {Pass.FPROP: 1, Pass.WGRAD: 2}),
    (512, 32, 8),    # 16 a group
    (1024, 32, 16),  # 32 a group: two a slab
    (2048, 32, None),  # 64 a group: wgrad's TMA kernel takes the groups as they are
    # 3 a group: 16 fill 48 channels, not a whole box; fprop runs the dense layer (C = 96 on the
    # TMA loop, 32x the work, under 5x the slabs' 8x), wgrad the slabs of 24 (its TMA kernel
    # takes a channel tail only on a 1x1 filter)
    (96, 32, {Pass.FPROP: 1, Pass.WGRAD: 4}),
])
@pytest.mark.parametrize("pass_", [Pass.FPROP, Pass.WGRAD], ids=lambda p: p.value)
def test_fprop_and_wgrad_pack_into_slabs_of_one_box_for_the_tma_loop(c, g, slabs, pass_):
    """fprop's and wgrad's TMA kernels take groups of whole 64-channel boxes
    (tma_rules.tma_eligible): on the H200 a narrow grouping packs into slabs of one box, so that
    it runs there, not on the grouped im2col loop (dgrad, which has no grouped TMA kernel, keeps
    slabs of 32 or one dense layer)."""
    p = grouped(c, c, g, h=28, w=28, n=64)
    slabs = slabs[pass_] if isinstance(slabs, dict) else slabs
    assert packed_groups(p, pass_, "float16", H200) == slabs
    if slabs is not None and c // slabs == 64:
        from convgen.planner import plan

        assert plan(dataclasses.replace(p, groups=slabs), pass_, H200).tma


def test_the_wider_side_of_a_group_bounds_its_slab():
    """K/G = 2 C/G: a slab of 32 filters holds 4 groups of 4 channels, not 8."""
    assert packed_groups(grouped(64, 128, 16), Pass.FPROP, "float16", Target("sm_80")) == 4
    assert packed_groups(grouped(128, 64, 16), Pass.DGRAD, "float16", Target("sm_80")) == 4


@pytest.mark.parametrize("why, problem, kwargs", [
    ("ungrouped", ConvProblem(9, 9, 64, 64, 3, 3, 1, 1, 1, n=2), {}),
    ("depthwise: its own stencil loop", grouped(64, 64, 64), {}),
    ("depthwise with a channel multiplier", grouped(32, 64, 32), {}),
    ("a hand plan names the kernel", grouped(128, 128, 32), {"plan": "hand"}),
    ("the scalar path names the kernel", grouped(128, 128, 32), {"scalar": True}),
    ("HIP has no copies around its kernels", grouped(128, 128, 32), {"target": Target("gfx942")}),
])
def test_no_packing(why, problem, kwargs):
    from convgen.planner import plan

    target = kwargs.pop("target", H200)
    if kwargs.get("plan") == "hand":
        kwargs["plan"] = plan(problem, Pass.FPROP)
    assert packed_groups(problem, Pass.FPROP, "float16", target, **kwargs) is None, why


@pytest.mark.parametrize("g, slabs, cg, kg", [(8, 2, 4, 4), (6, 3, 3, 5), (4, 1, 2, 6)])
def test_slab_weights_give_each_pass_the_grouped_result(g, slabs, cg, kg):
    """The premise of packing, on the float64 reference with random data: fprop and dgrad of
    the slabs on block-diagonal weights are the grouped layer's, and each filter's own
    channels of the slabs' dW are the grouped dW."""
    rng = np.random.default_rng(7)
    p = ConvProblem(7, 8, g * cg, g * kg, 3, 2, (2, 1), (1, 0), (1, 2), groups=g, n=2)
    x, w, dy = (rng.standard_normal(s) for s in (p.x_shape, p.w_shape, p.y_shape))
    geo = dict(stride=p.stride, padding=p.padding, dilation=p.dilation)
    ws = expand_weights(w, g, slabs)
    assert ws.shape == (p.k, p.r, p.s, cg * g // slabs)
    assert np.count_nonzero(ws) == np.count_nonzero(w)  # each weight once, the rest zeros
    np.testing.assert_allclose(reference.fprop(x, ws, groups=slabs, **geo), reference.fprop(x, w, groups=g, **geo),
                               rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(reference.dgrad(dy, ws, p.x_shape, groups=slabs, **geo),
                               reference.dgrad(dy, w, p.x_shape, groups=g, **geo), rtol=1e-12, atol=1e-12)
    dws, _ = reference.wgrad(x, dy, ws.shape, groups=slabs, **geo)
    dw, _ = reference.wgrad(x, dy, w.shape, groups=g, **geo)
    pack = g // slabs
    own = np.stack([dws[f, :, :, (f // kg) % pack * cg:((f // kg) % pack + 1) * cg] for f in range(p.k)])
    np.testing.assert_allclose(own, dw, rtol=1e-12, atol=1e-12)


def test_every_narrow_resnext_layer_packs_and_its_kernel_plans():
    from convgen.planner import make_spec

    for layer in SUITES["resnext50-grouped"]:
        for pass_ in Pass:
            kp = kernel_problem(layer.problem, pass_, "float16", H200)
            # dgrad: 32 a group run as they are; fprop and wgrad: every layer in slabs of one box
            packs = pass_ is not Pass.DGRAD or layer.problem.c // layer.problem.groups < SLAB
            assert (kp.groups < layer.problem.groups) == packs, layer.name
            make_spec(kp, pass_, target=H200)  # the packed problem plans (a grouped im2col or a dense loop)


def test_cli_plan_says_it_packs(capsys):
    from convgen.cli import main

    assert main(["plan", "--suite", "resnext50-grouped", "--pass", "wgrad", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    layers = SUITES["resnext50-grouped"]
    want = [packed_groups(l.problem, Pass.WGRAD, "float16", H200) for l in layers]
    assert [r["packed_groups"] for r in rows] == want and set(want) == {2, 4, 8, 16}  # slabs of 64 channels
    assert all(r["reasons"][0].startswith(("packs its 32 groups into", "packs all 32 groups into one dense"))
               for r, slabs in zip(rows, want) if slabs is not None)
    assert all(r["plan"] is not None for r in rows)


@pytest.mark.parametrize("itemsize", [2, 4])
def test_copy_kernel_is_deterministic_and_compiles_without_warnings(itemsize):
    pytest.importorskip("cupy", reason="NVRTC comes with CuPy")
    import warnings

    from convgen.compile import compile_binary

    args = (128, 9, 4, 4, 16, itemsize)
    src, expand = pack_source(*args)
    pack_source.cache_clear()
    assert pack_source(*args) == (src, expand)
    assert f'extern "C" __global__ void {expand}(' in src
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        binary = compile_binary(src, arch="sm_90", name=f"{expand}.cu")
    assert binary[:4] == b"\x7fELF"


def test_packed_wgrad_spec_refuses_what_it_cannot_store():
    """KernelSpec.pack is wgrad's alone, and must split each slab into whole groups."""
    from convgen.planner import make_spec

    slabs = grouped(64, 64, 2)  # two slabs of 32 channels and 32 filters
    make_spec(slabs, Pass.WGRAD, target=H200, pack=8)
    for pass_, pack, words in ((Pass.FPROP, 2, "only wgrad"), (Pass.DGRAD, 2, "only wgrad"),
                               (Pass.WGRAD, 3, "must divide"), (Pass.WGRAD, 0, "positive integer")):
        with pytest.raises(ValueError, match=f"pack.*{words}"):
            make_spec(slabs, pass_, target=H200, pack=pack)


@pytest.mark.parametrize("target", [H200, Target("sm_80")], ids=lambda t: t.arch)
def test_packed_wgrad_stores_each_filters_own_channels_with_no_copy_after(target):
    """The kernel a packed wgrad runs is the slabs' plan storing dW in the layer's layout:
    its split-K slices (where it splits) hold each filter's own columns, 1 / pack of the
    slabs' dW, and `convgen plan` says no copy follows.  (Their values: test_group_pack_gpu.)"""
    from convgen.emit import emit
    from convgen.planner import make_spec
    from convgen.tools.cli_common import as_run

    split = 0
    for layer in SUITES["resnext50-grouped"]:
        kp = kernel_problem(layer.problem, Pass.WGRAD, "float16", target)
        if kp.groups == layer.problem.groups:
            continue
        pack = layer.problem.groups // kp.groups
        plain = make_spec(kp, Pass.WGRAD, target=target)
        spec, why = as_run(layer.problem, Pass.WGRAD, make_spec(layer.problem, Pass.WGRAD, target=target),
                           "float16", "float16")
        assert spec == dataclasses.replace(plain, pack=pack) and "no copy after" in why, layer.name
        assert spec.name != plain.name and spec.key != plain.key  # its own kernel and cache entry
        n = layer.problem.n
        assert emit(spec).workspace_elems(n) * pack == emit(plain).workspace_elems(n), layer.name
        split += plain.plan.split_k > 1
    assert split, "no packed layer splits its reduction: the slices' layout is untested"


PACKED_HOST_MAIN = r"""
#include <cstdio>
#define __device__
#define __forceinline__ inline
template <typename T> T from_float(float v) { return static_cast<T>(v); }
constexpr int C = %(c)d, K = %(k)d, R = %(r)d, S = %(s)d, GEMM_N = R * S * C, EPT = 8;
%(part)s
int main() {
  // stdin: G slabs' GEMM rows (K of them a slab, GEMM_N columns each); stdout: dW as the kernel stores it
  constexpr int G = %(g)d;
  static float slab[G * K * GEMM_N], dw[G * K * DW_N];
  for (float& v : slab) std::scanf("%%f", &v);
  for (float& v : dw) v = -1e30f;  // unwritten
  for (int grp = 0; grp < G; ++grp)
    for (int m = 0; m < K; ++m)
      for (int n = 0; n < GEMM_N; n += EPT) {  // the drain's runs of EPT columns, the last one past GEMM_N
        float v[EPT];
        for (int e = 0; e < EPT; ++e) v[e] = n + e < GEMM_N ? slab[(grp * K + m) * GEMM_N + n + e] : 1e30f;
        store_dw<float>(dw + static_cast<long long>(grp) * K * DW_N + static_cast<long long>(m) * DW_N, m, n, v);
      }
  for (float v : dw) std::printf("%%.9g\n", v);
}
"""


@pytest.mark.skipif(shutil.which("g++") is None, reason="no host C++ compiler (g++) to run the packed store on the CPU")
@pytest.mark.parametrize("g, slabs, cg, kg", [(8, 2, 4, 4), (6, 3, 3, 5), (4, 1, 2, 6), (32, 2, 4, 4)])
def test_packed_wgrad_store_keeps_each_filters_own_channels(tmp_path, g, slabs, cg, kg):
    """parts/packed_dw.j2's stores, run on the host over the slabs' whole dW (from the float64
    reference, random data) in the drain's runs of 8 columns: what lands in dW is the grouped
    layer's own dW, every element written."""
    from types import SimpleNamespace

    from convgen.emit import _environment

    rng = np.random.default_rng(11)
    p = ConvProblem(7, 8, g * cg, g * kg, 3, 2, (2, 1), (1, 0), (1, 2), groups=g, n=2)
    x, dy = rng.standard_normal(p.x_shape), rng.standard_normal(p.y_shape)
    geo = dict(stride=p.stride, padding=p.padding, dilation=p.dilation)
    pack = g // slabs
    dws, _ = reference.wgrad(x, dy, (p.k, p.r, p.s, cg * pack), groups=slabs, **geo)
    want, _ = reference.wgrad(x, dy, p.w_shape, groups=g, **geo)
    part = _environment().get_template("parts/packed_dw.j2").render(ctx=SimpleNamespace(shape=SimpleNamespace(pack=pack)))
    src = tmp_path / "packed.cpp"
    src.write_text(PACKED_HOST_MAIN % dict(c=cg * pack, k=kg * pack, r=p.r, s=p.s, g=slabs, part=part))
    exe = tmp_path / "packed"
    subprocess.run(["g++", "-std=c++17", "-O1", "-o", str(exe), str(src)], check=True)
    out = subprocess.run([str(exe)], input="\n".join(map(repr, dws.astype(np.float32).ravel().tolist())),
                         capture_output=True, text=True, check=True).stdout.split()
    got = np.array(out, dtype=np.float64).reshape(p.w_shape)
    assert (got > -1e29).all(), "an element of dW no store reached"
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
