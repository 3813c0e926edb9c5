"""Narrow groups packed into slabs (convgen/group_pack.py), without a GPU: when the rule packs
and how far, that a slab's block-diagonal weights give every pass the grouped layer's own
result (on the float64 reference), that the CLI and tuner see the packed kernel, and that the
copy kernels are emitted deterministically and compile cleanly with NVRTC. The GPU tier is
tests/test_group_pack_gpu.py."""

from __future__ import annotations

import dataclasses
import json

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
    (128, 32, 2),    # 4 channels a group: 16 groups a slab of 64
    (256, 32, 4),    # 8 a group
    (512, 32, 8),    # 16 a group
    (1024, 32, 16),  # 32 a group: 2 a slab
    (96, 3, None),   # 32 a group, but 3 groups: 3 of them are wider than a slab
    (2048, 32, None),  # 64 a group: already a slab
    (48, 16, 1),     # 3 a group: all 16 fit one slab of 48, an ungrouped layer
    (90, 30, 2),     # 3 a group: 15 of the 30 (a divisor) in a slab of 45, not 21 of them
])
def test_resnext_groups_pack_into_slabs_of_at_most_64_channels(c, g, slabs, pass_):
    p = grouped(c, c, g)
    got = packed_groups(p, pass_, "float16", H200)
    assert got == slabs
    if got is not None:
        assert c // got <= SLAB
        assert kernel_problem(p, pass_, "float16", H200) == dataclasses.replace(p, groups=got)


def test_the_wider_side_of_a_group_bounds_its_slab():
    """K/G = 2 C/G: a slab of 64 filters holds 8 groups of 4 channels, not 16."""
    assert packed_groups(grouped(64, 128, 16), Pass.FPROP, "float16", H200) == 2
    assert packed_groups(grouped(128, 64, 16), Pass.DGRAD, "float16", H200) == 2


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


def test_every_resnext_layer_packs_and_its_kernel_plans():
    from convgen.planner import make_spec

    for layer in SUITES["resnext50-grouped"]:
        for pass_ in Pass:
            kp = kernel_problem(layer.problem, pass_, "float16", H200)
            assert kp.groups < layer.problem.groups, layer.name
            make_spec(kp, pass_, target=H200)  # the packed problem plans (a grouped im2col or a dense loop)


def test_cli_plan_says_it_packs(capsys):
    from convgen.cli import main

    assert main(["plan", "--suite", "resnext50-grouped", "--pass", "wgrad", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    layers = SUITES["resnext50-grouped"]
    assert [r["packed_groups"] for r in rows] == [kernel_problem(l.problem, Pass.WGRAD, "float16", H200).groups
                                                  for l in layers]
    assert all(r["reasons"][0].startswith("packs its 32 groups into") for r in rows)
    assert all(r["plan"] is not None for r in rows)


@pytest.mark.parametrize("in_item, out_item", [(2, 2), (2, 4), (4, 4)])
def test_copy_kernels_are_deterministic_and_compile_without_warnings(in_item, out_item):
    pytest.importorskip("cupy", reason="NVRTC comes with CuPy")
    import warnings

    from convgen.compile import compile_binary

    args = (128, 9, 4, 4, 16, in_item, out_item)
    src, expand, extract = pack_source(*args)
    pack_source.cache_clear()
    assert pack_source(*args) == (src, expand, extract)
    assert f'extern "C" __global__ void {expand}(' in src and f'extern "C" __global__ void {extract}(' in src
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        binary = compile_binary(src, arch="sm_90", name=f"{expand}.cu")
    assert binary[:4] == b"\x7fELF"
