"""Grouped layers outside the kernels: the grouped suites, what `convgen bench`
runs and counts for a grouped layer on each side, and `--groups` on the command line.
No GPU: the bench's calls are recorded on stand-ins for convgen and torch."""

from __future__ import annotations

import pytest

from convgen.cli import build_parser, main
from convgen.ir import ConvProblem, Pass, Target
from convgen.mainloop import Depthwise, Im2col
from convgen.planner import make_spec
from convgen.suites import SUITE_INFO, SUITES, Layer
from convgen.tools.bench import command, harness, report, rows

from test_bench import _fake_torch, _Recorder  # the bench tests' stand-ins for convgen's and torch's calls

# N=2, 8x8, C=K=G=16, 3x3 pad 1 stride 2: x 2x8x8x16, w 16x3x3x1, y 2x4x4x16
DW = ConvProblem(8, 8, 16, 16, 3, 3, 2, 1, 1, 16, n=2)
# C=8, K=12, G=4: w 12x3x3x2 (two channels a group: a GEMM per group)
GROUPED = ConvProblem(8, 8, 8, 12, 3, 3, 1, 1, 1, 4, n=2)
PLAIN = ConvProblem(8, 8, 4, 6, 3, 3, 1, 1, 1, n=2)


# --------------------------------------------------------------------------- suites

MOBILENET = [(32, 112, 1), (96, 112, 2), (144, 56, 1), (144, 56, 2), (192, 28, 1), (192, 28, 2),
             (384, 14, 1), (576, 14, 1), (576, 14, 2), (960, 7, 1)]
CONVNEXT = [(96, 56), (192, 28), (384, 14), (768, 7)]


def test_mobilenetv2_dw_is_every_depthwise_3x3_of_the_network():
    layers = SUITES["mobilenetv2-dw"]
    assert [(l.problem.c, l.problem.h, l.problem.stride[0]) for l in layers] == MOBILENET
    for l in layers:
        p = l.problem
        assert p.depthwise and p.groups == p.c == p.k and p.w_shape == (p.c, 3, 3, 1)
        assert (p.h, p.r, p.s, p.padding, p.dilation, p.stride[0]) == (p.w, 3, 3, (1, 1), (1, 1), p.stride[1])
        assert p.n == 128  # as mobilenetv2-pw and the other ImageNet suites at batch 128
        assert p.p == -(-p.h // p.stride[0])  # same padding: 112 -> 56 at stride 2
    assert "Sandler" in SUITE_INFO["mobilenetv2-dw"].source and "batch 128" in SUITE_INFO["mobilenetv2-dw"].source


def test_convnext_dw_is_convnext_t_s_7x7_depthwise_layers():
    layers = SUITES["convnext-dw"]
    assert [(l.problem.c, l.problem.h) for l in layers] == CONVNEXT
    for l in layers:
        p = l.problem
        assert p.depthwise and p.groups == p.c == p.k and p.w_shape == (p.c, 7, 7, 1)
        assert (p.r, p.s, p.padding, p.stride, p.n) == (7, 7, (3, 3), (1, 1), 64)
        assert (p.p, p.q) == (p.h, p.w)
    assert "ConvNeXt" in SUITE_INFO["convnext-dw"].source and "batch 64" in SUITE_INFO["convnext-dw"].source


def test_efficientnet_dw_is_efficientnet_b0s_depthwise_layers_mobilenetv2_lacks():
    """Table 1 of Tan & Le: stages 4, 6 and 7 are 5x5, 5 and 8 are 3x3; widths are 6x each block's
    input channels (24 -> 144, 40 -> 240, 80 -> 480, 112 -> 672, 192 -> 1152)."""
    layers = SUITES["efficientnet-b0-dw"]
    shapes = [(l.problem.c, l.problem.h, l.problem.r, l.problem.stride[0]) for l in layers]
    assert shapes == [(144, 56, 5, 2), (240, 28, 5, 1), (480, 14, 5, 1), (672, 14, 5, 1), (672, 14, 5, 2),
                      (1152, 7, 5, 1), (240, 28, 3, 2), (480, 14, 3, 1), (1152, 7, 3, 1)]
    for l in layers:
        p = l.problem
        assert p.depthwise and p.groups == p.c == p.k and p.n == 128 and p.r == p.s
        assert p.padding == (p.r // 2, p.r // 2) and p.p == -(-p.h // p.stride[0])
    mnv2 = {l.problem for l in SUITES["mobilenetv2-dw"]}
    assert not mnv2 & {l.problem for l in layers} and len({l.name for l in layers}) == len(layers)
    assert "Tan & Le" in SUITE_INFO["efficientnet-b0-dw"].source


@pytest.mark.parametrize("suite", ["mobilenetv2-dw", "convnext-dw", "efficientnet-b0-dw"])
def test_depthwise_suites_plan_the_depthwise_kind_for_every_pass(suite):
    for layer in SUITES[suite]:
        for pass_ in Pass:
            spec = make_spec(layer.problem, pass_, target=Target("sm_90", 132))
            assert isinstance(spec.plan.loop, Depthwise), (layer.name, pass_)


def test_only_the_depthwise_and_resnext_suites_are_grouped():
    grouped = {name for name, layers in SUITES.items() if any(l.problem.groups > 1 for l in layers)}
    assert grouped == {"mobilenetv2-dw", "convnext-dw", "efficientnet-b0-dw", "resnext50-grouped"}


def test_resnext_suite_is_resnext50s_grouped_layers_on_the_im2col_loop():
    layers = SUITES["resnext50-grouped"]
    assert len(layers) == 7 and all(l.problem.groups == 32 and l.problem.n == 64 for l in layers)
    # 4 channels a group at the first stage's width, doubling with it; each stage's stride-2 layer
    assert [l.problem.cg for l in layers] == [4, 8, 8, 16, 16, 32, 32]
    assert [l.problem.stride for l in layers].count((2, 2)) == 3
    assert "Xie" in SUITE_INFO["resnext50-grouped"].source
    for layer in layers:
        for pass_ in Pass:
            spec = make_spec(layer.problem, pass_, target=Target("sm_90", 132))
            assert isinstance(spec.plan.loop, Im2col), (layer.name, pass_, spec.plan.loop)
            assert any("one GEMM per group" in r for r in spec.plan.reasons)


# --------------------------------------------------------------------------- bench: bytes, FLOPs, floors


def test_grouped_traffic_counts_the_weights_c_over_g_channels():
    # x 2*8*8*16 = 2048, w 16*3*3*1 = 144, y 2*4*4*16 = 512 elements, fp16
    assert rows.traffic(DW, "fprop") == {"x": 4096, "w": 288, "y": 1024}
    assert rows.traffic(DW, "dgrad") == {"dy": 1024, "w": 288, "dx": 4096}
    assert rows.traffic(DW, "wgrad", bias=True) == {"x": 4096, "dy": 1024, "dw": 288, "db": 32}
    assert rows.traffic(GROUPED, "fprop")["w"] == 2 * 12 * 3 * 3 * 2  # (K, R, S, C/G) = 12x3x3x2
    assert rows.traffic(GROUPED, "fprop")["w"] == 2 * GROUPED.k * GROUPED.r * GROUPED.s * GROUPED.cg
    assert rows.traffic(PLAIN, "fprop") == {"x": 1024, "w": 432, "y": 1536}  # ungrouped: unchanged


def test_grouped_flops_reduce_over_one_groups_channels():
    assert rows.useful_flops(DW) == 2 * (2 * 4 * 4) * 16 * (3 * 3 * 1)
    assert rows.useful_flops(GROUPED) == 2 * (2 * 8 * 8) * 12 * (3 * 3 * 2)
    assert rows.useful_flops(PLAIN) == 2 * (2 * 8 * 8) * 6 * (3 * 3 * 4)


@pytest.mark.parametrize("pass_", list(Pass))
def test_grouped_row_floors_use_the_grouped_flops_and_bytes(pass_):
    row = rows.new_row(rows.Item("s", Layer("dw", DW), pass_), target=None, with_cudnn=True)
    flops = 2 * (2 * 4 * 4) * 16 * 9
    nbytes = 2 * (2048 + 144 + 512)
    assert row["flops"] == flops and row["bytes"] == nbytes and row["problem"]["groups"] == 16
    ceil = {"gemm_tflops": 1e-6, "copy_gbps": 1e-3}  # 1 FLOP/us, 1 B/us: floor = max(flops, bytes)
    rows.finish_row(row, ceil)
    assert row["floor_us"] == pytest.approx(max(flops, nbytes))
    assert row["floor_bound"] == ("compute" if flops >= nbytes else "memory")
    assert row["floor_ref_us"] == pytest.approx(max(flops / (rows.REFERENCE_TFLOPS * 1e6),
                                                    nbytes / (rows.REFERENCE_GBPS * 1e3)))
    assert "groups=16" in row["convgen"]["computes"] and "w (K, C/16, R, S)" in row["cudnn"]["computes"]


def test_ungrouped_rows_say_nothing_of_groups():
    row = rows.new_row(rows.Item("s", Layer("l", PLAIN), Pass.FPROP), target=None, with_cudnn=True)
    assert "groups" not in row["problem"] and "groups" not in row["convgen"]["computes"]
    assert row["cudnn"]["computes"] == "torch.nn.functional.conv2d(x, w): fp16 channels_last, no bias, y fp16"


def test_torch_side_weight_shape_and_args():
    assert DW.w_shape == (16, 3, 3, 1) and rows.torch_weight_shape(DW) == (16, 1, 3, 3)
    assert GROUPED.w_shape == (12, 3, 3, 2) and rows.torch_weight_shape(GROUPED) == (12, 2, 3, 3)
    assert rows.torch_weight_shape(PLAIN) == (6, 4, 3, 3)
    assert rows.torch_conv_args(DW) == ([2, 2], [1, 1], [1, 1], 16)
    assert rows.torch_conv_args(PLAIN) == ([1, 1], [1, 1], [1, 1], 1)


def test_suite_rows_plan_depthwise_kernels():
    layer = SUITES["convnext-dw"][0]
    for pass_ in Pass:
        row = rows.new_row(rows.Item("convnext-dw", layer, pass_), target=Target("sm_90", 132), with_cudnn=True)
        assert row["convgen"]["error"] is None and "depthwise" in row["convgen"]["plan"]
        spec = make_spec(layer.problem, pass_, target=Target("sm_90", 132), epilogue=rows.epilogue_for(pass_))
        assert row["convgen"]["key"] == spec.key and isinstance(spec.plan.loop, Depthwise)


# --------------------------------------------------------------------------- bench: the calls


def _session(rec):
    args = build_parser().parse_args(["bench", "--suite", "convnext-dw"])
    return harness.Session(None, _fake_torch(rec), None, Target("sm_90", 132), args)


DATA = {k: k for k in ("x", "w", "dy", "b32", "x_t", "w_t", "dy_t", "b_t")}


@pytest.mark.parametrize("variant", ["same", "fused", "residual"])
def test_the_harness_passes_groups_to_both_sides(variant, monkeypatch):
    import convgen

    rec = _Recorder()
    for name in ("conv2d", "conv2d_dgrad", "conv2d_wgrad"):
        monkeypatch.setattr(convgen, name, rec(name))
    session = _session(rec)
    passes = {"same": list(Pass), "fused": [Pass.FPROP, Pass.WGRAD], "residual": [Pass.FPROP]}[variant]
    for pass_ in passes:
        rec.calls.clear()
        cg, cd = session.ops(DW, pass_, DATA, variant)
        cg(), cd()
        (_, cg_args, cg_kw), (cd_name, cd_args, _) = rec.calls[0], rec.calls[1]
        assert cg_kw["groups"] == 16 and cg_kw["stride"] == (2, 2), (pass_, cg_kw)
        if pass_ is Pass.FPROP:
            assert cd_name == "conv2d" and cd_args[3:] == ([2, 2], [1, 1], [1, 1], 16)
        else:
            assert cd_name == "convolution_backward" and cd_args[9] == 16  # groups
            assert cd_args[4:7] == ([2, 2], [1, 1], [1, 1])
        if pass_ is Pass.DGRAD:
            assert cg_args[2] == DW.x_shape
        if pass_ is Pass.WGRAD:
            assert cg_args[2] == DW.w_shape == (16, 3, 3, 1)


def test_ungrouped_calls_are_as_before(monkeypatch):
    import convgen

    rec = _Recorder()
    for name in ("conv2d", "conv2d_dgrad", "conv2d_wgrad"):
        monkeypatch.setattr(convgen, name, rec(name))
    session = _session(rec)
    for pass_ in Pass:
        rec.calls.clear()
        cg, cd = session.ops(PLAIN, pass_, DATA)
        cg(), cd()
        assert "groups" not in rec.calls[0][2]  # convgen's call: no groups argument at all
        torch_groups = rec.calls[1][1][6] if pass_ is Pass.FPROP else rec.calls[1][1][9]
        assert torch_groups == 1


def test_bench_dry_run_and_resolve_items_for_the_depthwise_suites(capsys):
    args = build_parser().parse_args(["bench", "--suite", "mobilenetv2-dw,convnext-dw", "--dry-run"])
    suites, items = command.resolve_items(args)
    assert suites == ["mobilenetv2-dw", "convnext-dw"] and len(items) == 3 * (10 + 4)
    assert all(it.layer.problem.depthwise for it in items)
    assert command.dry_run(items) == 0
    out = capsys.readouterr().out
    assert "== mobilenetv2-dw ==" in out and "== convnext-dw ==" in out
    assert "Error" not in out and "error" not in out


def test_bench_single_grouped_shape(capsys):
    shape = ["-n", "2", "-h", "8", "-w", "8", "-c", "16", "-k", "16", "-r", "3", "-s", "3", "--padding", "1"]
    args = build_parser().parse_args(["bench", *shape, "--groups", "16", "--dry-run"])
    _, items = command.resolve_items(args)
    assert {it.layer.problem.groups for it in items} == {16}
    assert report.run_tag([], [items[0].layer]).endswith("-g16")
    assert not report.run_tag([], [Layer("conv", PLAIN)]).endswith("-g1")
    with pytest.raises(command.UsageError, match="not both"):
        command.resolve_items(build_parser().parse_args(["bench", "--suite", "convnext-dw", "--groups", "4"]))


def test_tune_passes_groups_to_the_runtime(monkeypatch):
    """convgen tune builds its data from the problem: w (K, R, S, C/G) and groups=G on the call."""
    cp = pytest.importorskip("cupy")  # noqa: F841  (tune_layer imports it; no GPU is touched below)
    from convgen import runtime
    from convgen.tools import tune

    seen = []

    class Stop(Exception):
        pass

    def fake_conv2d(x, w, b, **kw):
        seen.append((w.shape, kw))
        raise Stop

    monkeypatch.setattr(runtime, "conv2d", fake_conv2d)
    monkeypatch.setattr(tune, "candidates", lambda *a, **k: ["plan"])
    monkeypatch.setattr(cp, "asarray", lambda a: a)  # stay on the host
    with pytest.raises(Stop):
        tune.tune_layer(DW, Pass.FPROP, None, Target("sm_90", 132))
    assert seen == [((16, 3, 3, 1), {"plan": "plan", "stride": (2, 2), "padding": (1, 1), "dilation": (1, 1),
                                     "groups": 16})]


# --------------------------------------------------------------------------- CLI

SHAPE = ["-n", "2", "-h", "16", "-w", "16", "-r", "3", "-s", "3", "--padding", "1"]


def test_plan_groups_c_is_depthwise(capsys):
    assert main(["plan", *SHAPE, "-c", "32", "-k", "32", "--groups", "32"]) == 0
    out, err = capsys.readouterr()
    assert err == "" and "groups 32" in out and "depthwise" in out
    assert out.count("groups 32") == 3  # fprop, dgrad, wgrad


def test_emit_and_plan_without_groups_are_ungrouped(capsys):
    assert main(["plan", *SHAPE, "-c", "32", "-k", "32", "--pass", "fprop"]) == 0
    out = capsys.readouterr().out
    assert "groups" not in out and "depthwise" not in out
