"""`convgen bench` without a GPU: traffic and floor arithmetic, statistics, what each side
computes (the same work by default), summaries, the table, file naming and JSON, the CLI,
the timing loops and a row's harness against a fake device, and the no-GPU exit path.
The GPU run itself is exercised on the GPU machine (benchmarks/gpu_smoke.sh)."""

from __future__ import annotations

import json
import math
import sys

import pytest

from convgen.tools import timing
from convgen.tools.bench import command, harness, plot, report, rows, stats
from convgen.cli import build_parser, main
from convgen.ir import ConvProblem, Pass, Target
from convgen.suites import SUITES, Layer

PROB = ConvProblem(8, 8, 4, 6, 3, 3, 1, 1, 1, n=2)  # x 2x8x8x4, w 6x3x3x4, y 2x8x8x6
STRIDED = ConvProblem(8, 8, 4, 6, 3, 3, 2, 1, 1, n=2)  # y 2x4x4x6


# --------------------------------------------------------------------------- arithmetic


def test_traffic_per_pass():
    # x 2x8x8x4 = 512, w 6x3x3x4 = 216, y 2x8x8x6 = 768 elements, fp16
    assert rows.traffic(PROB, "fprop") == {"x": 1024, "w": 432, "y": 1536}  # no bias by default
    assert rows.traffic(PROB, "fprop", bias=True) == {"x": 1024, "w": 432, "bias": 24, "y": 1536}  # fp32 bias
    assert rows.traffic(PROB, Pass.DGRAD) == {"dy": 1536, "w": 432, "dx": 1024}
    assert rows.traffic(PROB, "wgrad") == {"x": 1024, "dy": 1536, "dw": 432}
    assert rows.traffic(PROB, "wgrad", bias=True) == {"x": 1024, "dy": 1536, "dw": 432, "db": 12}
    x, w, y = 512, 216, 768
    f32 = rows.traffic(PROB, "dgrad", out_dtype="float32")
    assert f32["dx"] == 4 * x and f32["dy"] == 2 * y
    assert rows.pass_bytes(PROB, "dgrad") == 2 * (x + w + y)


def test_traffic_uses_output_size_of_strided_layer():
    y = 2 * 4 * 4 * 6
    assert rows.traffic(STRIDED, "fprop", bias=False)["y"] == 2 * y
    assert rows.traffic(STRIDED, "dgrad")["dy"] == 2 * y


def test_useful_flops_same_for_all_passes():
    f = 2 * (2 * 4 * 4) * 6 * (3 * 3 * 4)
    assert rows.useful_flops(STRIDED) == f
    # convgen's implicit dgrad GEMM spans every input pixel: 4x larger at stride 2
    assert STRIDED.flops("dgrad") == 4 * f
    row = rows.new_row(rows.Item("s", Layer("l", STRIDED), Pass.DGRAD), target=None, with_cudnn=True)
    assert row["flops"] == f and row["gemm_flops"] == 4 * f


def test_floor_compute_and_memory_bound():
    # 1e12 FLOP at 100 TFLOP/s = 10,000 us; 1e6 B at 1000 GB/s = 1 us
    us, bound = rows.floor_us(1e12, 1e6, 100.0, 1000.0)
    assert us == pytest.approx(10_000.0) and bound == "compute"
    us, bound = rows.floor_us(1e6, 1e9, 100.0, 1000.0)
    assert us == pytest.approx(1000.0) and bound == "memory"
    assert rows.floor_us(1e6, 1e9, None, 1000.0) == (None, None)
    assert rows.floor_us(1e6, 1e9, 100.0, 0.0) == (None, None)


def test_tflops_and_ratio():
    assert stats.tflops(2e6, 1.0) == pytest.approx(2.0)
    assert stats.tflops(2e6, None) is None
    assert stats.ratio(30.0, 10.0) == pytest.approx(3.0)
    assert stats.ratio(None, 10.0) is None and stats.ratio(3.0, None) is None and stats.ratio(3.0, 0.0) is None


def test_geomean():
    assert stats.geomean([1.0, 4.0]) == pytest.approx(2.0)
    assert stats.geomean([2.0, None, 8.0]) == pytest.approx(4.0)
    assert stats.geomean([]) is None
    assert stats.geomean([None, float("nan"), 0.0, -1.0]) is None


def test_time_stats():
    s = stats.time_stats([3.0, 1.0, 2.0, 100.0])
    assert s["median"] == pytest.approx(2.5)
    assert s["min"] == 1.0 and s["max"] == 100.0 and s["n"] == 4
    assert s["p20"] <= s["median"] <= s["p80"]
    assert stats.time_stats([]) is None
    assert stats.time_stats([5.0])["p80"] == 5.0


# --------------------------------------------------------------------------- the same work on both sides


def test_default_rows_compute_the_same_work_on_both_sides():
    """The headline rows: fprop without bias on both sides, dgrad dx alone, wgrad dW alone.
    This fails if the default hands either side a bias or a db again."""
    _, items = command.resolve_items(_args(["--suite", "cifar-resnet"]))
    assert {it.variant for it in items} == {rows.SAME}
    for it in items[:3]:
        row = rows.new_row(it, target=None, with_cudnn=True)
        assert "bias" not in row["traffic"] and "db" not in row["traffic"], row["traffic"]
        assert row["variant"] == "same" and row["label"].startswith("same work")
        for side in ("convgen", "cudnn"):
            text = row[side]["computes"]
            assert "db" not in text and "relu" not in text.lower(), text
            assert "bias" not in text or "no bias" in text or "bias=False" in text or "bias_sizes=None" in text, text
    e = {p: rows.epilogue_for(p) for p in Pass}
    assert not any(x.bias or x.relu for x in e.values())
    wg = rows.computes(Pass.WGRAD)
    assert "bias=False" in wg["convgen"] and "output_mask=[False, True, False]" in wg["cudnn"]


def test_fused_rows_are_apart_and_compute_bias_on_both_sides():
    _, items = command.resolve_items(_args(["--suite", "cifar-resnet", "--layers", "res3", "--fused"]))
    assert [(it.pass_.value, it.variant) for it in items] == [
        ("fprop", "same"), ("dgrad", "same"), ("wgrad", "same"), ("fprop", "fused"), ("wgrad", "fused")]
    f = rows.new_row(items[3], target=None, with_cudnn=True)
    assert "bias" in f["traffic"] and "relu(" in f["cudnn"]["computes"] and "activation='relu'" in f["convgen"]["computes"]
    w = rows.new_row(items[4], target=None, with_cudnn=True)
    assert "db" in w["traffic"] and "[False, True, True]" in w["cudnn"]["computes"] and "bias=True" in w["convgen"]["computes"]
    assert rows.epilogue_for(Pass.FPROP, rows.FUSED) == rows.Epilogue(bias=True, relu=True, out_dtype="float16")
    with pytest.raises(ValueError, match="no fused comparison"):
        rows.Item("s", Layer("l", PROB), Pass.DGRAD, rows.FUSED)


class _Recorder:
    """Stands in for convgen's and torch's calls: records what each side was asked to compute."""

    def __init__(self):
        self.calls = []

    def __call__(self, name):
        def fn(*args, **kw):
            self.calls.append((name, args, kw))
            return (None, "dw", None) if name == "convolution_backward" else name
        return fn


def _fake_torch(rec):
    from types import SimpleNamespace

    F = SimpleNamespace(conv2d=rec("conv2d"), relu=rec("relu"))
    return SimpleNamespace(nn=SimpleNamespace(functional=F),
                           ops=SimpleNamespace(aten=SimpleNamespace(convolution_backward=rec("convolution_backward"))))


def test_residual_rows_are_apart_and_add_the_residual_on_both_sides(monkeypatch):
    """--residual: one fprop row per layer, reported apart; convgen fuses bias, residual and
    ReLU, PyTorch adds the residual to conv2d(x, w, b) and applies ReLU as separate ops; the
    floor counts the residual's read."""
    import convgen

    _, items = command.resolve_items(_args(["--suite", "cifar-resnet", "--layers", "res3", "--residual"]))
    assert [(it.pass_.value, it.variant) for it in items][3:] == [("fprop", "residual")]
    row = rows.new_row(items[3], target=None, with_cudnn=True)
    assert row["traffic"]["residual"] == row["traffic"]["y"] and "+ r)" in row["cudnn"]["computes"]
    assert rows.epilogue_for(Pass.FPROP, rows.RESIDUAL) == rows.Epilogue(bias=True, relu=True, residual=True)
    with pytest.raises(ValueError, match="no residual comparison"):
        rows.Item("s", Layer("l", PROB), Pass.WGRAD, rows.RESIDUAL)
    rec = _Recorder()
    monkeypatch.setattr(convgen, "conv2d", rec("conv2d"))
    session = harness.Session(None, _fake_torch(rec), FakeDevice(), Target("sm_90", 132), _args(["--suite", "cifar-vgg"]))
    data = {k: k for k in ("x", "w", "dy", "b32", "x_t", "w_t", "dy_t", "b_t")}
    cg, cd = session.ops(PROB, Pass.FPROP, data, rows.RESIDUAL)
    cg(), cd()
    (_, a, kw), (_, ta, _), (_, relu_args, _) = rec.calls
    assert a[2] == "b32" and kw["residual"] == "dy" and kw["activation"] == "relu"
    assert ta[2] == "b_t" and relu_args == ("conv2d" + "dy_t",)  # relu(conv2d(x, w, b) + r)
    text = report.format_report(fake_result(residual=True))
    assert "apart from the means above: " + rows.LABELS[rows.RESIDUAL] in text


@pytest.mark.parametrize("variant", ["same", "fused"])
def test_the_harness_hands_both_sides_the_same_work(variant, monkeypatch):
    """Session.ops with convgen's and torch's calls recorded: the same-work rows give neither
    side a bias or a db, and the fused rows give both."""
    import convgen

    rec = _Recorder()
    for name in ("conv2d", "conv2d_dgrad", "conv2d_wgrad"):
        monkeypatch.setattr(convgen, name, rec(name))
    session = harness.Session(None, _fake_torch(rec), FakeDevice(), Target("sm_90", 132), _args(["--suite", "cifar-vgg"]))
    data = {k: k for k in ("x", "w", "dy", "b32", "x_t", "w_t", "dy_t", "b_t")}
    fused = variant == "fused"
    cg, cd = session.ops(PROB, Pass.FPROP, data, variant)
    cg(), cd()
    (_, a, kw), (_, ta, _) = rec.calls[0], rec.calls[1]
    assert a[2] == ("b32" if fused else None) and kw["activation"] == ("relu" if fused else None)
    assert ta[2] == ("b_t" if fused else None)
    assert [c[0] for c in rec.calls[2:]] == (["relu"] if fused else [])
    rec.calls.clear()
    cg, cd = session.ops(PROB, Pass.WGRAD, data, variant)
    cg()
    assert cd() == (("dw", None) if fused else ("dw",))
    (_, _, kw), (_, ta, _) = rec.calls
    assert kw["bias"] is fused
    assert ta[3] == ([6] if fused else None) and ta[-1] == [False, True, fused]  # bias_sizes, output_mask
    if not fused:
        rec.calls.clear()
        cg, cd = session.ops(PROB, Pass.DGRAD, data, variant)
        cg(), cd()
        assert rec.calls[1][1][-1] == [True, False, False]


# --------------------------------------------------------------------------- rows and summaries

CEILINGS = {"gemm_tflops": 500.0, "copy_gbps": 4000.0}


def fake_row(suite: str, layer: Layer, pass_: Pass, cg_us, cd_us, err=1e-3, cudnn=True, variant="same",
             cg_eager=None, cd_eager=None):
    row = rows.new_row(rows.Item(suite, layer, pass_, variant), target=Target("sm_90", 132), with_cudnn=cudnn)
    row["convgen"]["time_us"] = stats.time_stats([cg_us] * 3) if cg_us is not None else None
    row["convgen"]["eager_us"] = stats.time_stats([cg_eager or (cg_us or 0) + 20.0] * 3)
    row["convgen"]["host_us"] = 12.5
    if cudnn:
        row["cudnn"]["time_us"] = stats.time_stats([cd_us] * 3) if cd_us is not None else None
        row["cudnn"]["eager_us"] = stats.time_stats([cd_eager or (cd_us or 0) + 20.0] * 3)
        row["cudnn"]["host_us"] = 30.0
        row["check"] = {"rel_err": err, "parts": {}, "tol": rows.TOLERANCE, "ok": err < rows.TOLERANCE}
    return rows.finish_row(row, CEILINGS)


def fake_result(cudnn=True, fused=False, residual=False):
    by_suite, fused_by_suite, residual_by_suite = {}, {}, {}
    for suite in ("cifar-resnet", "cifar-vgg"):
        rs = []
        for i, layer in enumerate(SUITES[suite][:3]):
            for p in Pass:
                rs.append(fake_row(suite, layer, p, 10.0 + i, 20.0 + 2 * i if cudnn else None, cudnn=cudnn))
        by_suite[suite] = rs
        if fused:
            fused_by_suite[suite] = [fake_row(suite, SUITES[suite][0], p, 10.0, 1000.0, cudnn=cudnn, variant="fused")
                                     for p in (Pass.FPROP, Pass.WGRAD)]
        if residual:
            residual_by_suite[suite] = [fake_row(suite, SUITES[suite][0], Pass.FPROP, 10.0, 30.0, cudnn=cudnn,
                                                 variant="residual")]
    by_suite["cifar-vgg"][0] = fake_row("cifar-vgg", SUITES["cifar-vgg"][0], Pass.FPROP, 5.0, 50.0, err=0.5, cudnn=cudnn)
    return report.build_result(
        list(by_suite.items()), list(fused_by_suite.items()), list(residual_by_suite.items()), date="2026-01-02",
        timestamp="2026-01-02T00:00:00+00:00",
        git={"commit": "abc1234", "dirty": False}, gpu={"name": "NVIDIA H200", "sm_count": 132},
        versions={}, settings={"reps": 3, "eager_calls": 50, "eager_trials": 5}, ceilings=CEILINGS,
        reference={"gemm_tflops": 781.0, "copy_gbps": 4200.0, "source": rows.REFERENCE_SOURCE},
        launch_floor={"host_us": 4.2}, host_overhead_us={}, notes=[],
    )


def test_new_row_static_fields():
    layer = Layer("l", PROB)
    row = rows.new_row(rows.Item("s", layer, Pass.WGRAD), target=Target("sm_90", 132), with_cudnn=False)
    assert row["cudnn"] is None
    assert row["bytes"] == sum(row["traffic"].values())
    assert row["convgen"]["key"] and row["convgen"]["plan"]["split_k"] >= 1
    assert row["convgen"]["time_us"] is None and row["convgen"]["eager_us"] is None
    assert row["speedup"] is None and row["eager_speedup"] is None and row["cudnn_regime"] is None  # nothing invented
    assert row["problem"] == PROB.as_dict()
    d = rows.new_row(rows.Item("s", layer, Pass.DGRAD), target=None, with_cudnn=True)
    assert "db" not in d["traffic"] and "bias" not in d["traffic"] and d["convgen"]["key"] is None


def test_rows_plan_the_kernel_of_their_work():
    """A same-work fprop row names the kernel without bias; a fused one the bias+ReLU kernel."""
    from convgen.planner import make_spec

    layer, t = SUITES["cifar-vgg"][1], Target("sm_90", 132)
    same = rows.new_row(rows.Item("s", layer, Pass.FPROP), target=t, with_cudnn=True)
    fused = rows.new_row(rows.Item("s", layer, Pass.FPROP, "fused"), target=t, with_cudnn=True)
    assert same["convgen"]["key"] == make_spec(layer.problem, Pass.FPROP, target=t, epilogue=rows.Epilogue()).key
    assert fused["convgen"]["key"] == make_spec(layer.problem, Pass.FPROP, target=t,
                                                epilogue=rows.Epilogue(bias=True, relu=True)).key
    assert same["convgen"]["key"] != fused["convgen"]["key"]


def test_finish_row_derived_fields():
    r = fake_row("s", Layer("l", PROB), Pass.FPROP, 10.0, 25.0, cg_eager=40.0, cd_eager=60.0)
    assert r["speedup"] == pytest.approx(2.5) and r["eager_speedup"] == pytest.approx(1.5)
    assert r["convgen"]["tflops"] == pytest.approx(r["flops"] / 10.0 / 1e6)
    fl, _ = rows.floor_us(r["flops"], r["bytes"], 500.0, 4000.0)
    assert r["floor_us"] == pytest.approx(fl) and r["over_floor"] == pytest.approx(10.0 / fl)
    assert r["cudnn_over_floor"] == pytest.approx(25.0 / fl)  # what a kernel at the floor could gain over cuDNN
    # the constant reference: PROB moves 2992 bytes and does 82,944 FLOPs: memory-bound at 4.2 TB/s
    assert r["bytes"] == 2992 and r["floor_ref_bound"] == "memory"
    assert r["floor_ref_us"] == pytest.approx(2992 / 4200e3)
    assert r["over_floor_ref"] == pytest.approx(10.0 / (2992 / 4200e3))
    assert r["cudnn_regime"] == "latency/memory"  # a toy layer runs far below 300 TFLOP/s
    only = fake_row("s", Layer("l", PROB), Pass.FPROP, 10.0, None)
    assert only["speedup"] is None and only["over_floor"] is not None and only["cudnn_regime"] is None
    assert only["cudnn_over_floor"] is None


def test_regime_threshold():
    assert rows.regime(299.9) == "latency/memory" and rows.regime(300.0) == "compute" and rows.regime(None) is None


# A layer big enough to run compute-bound on the H200 (ResNet-50 l1-3x3 at batch 256: 945 GFLOP)
BIG = ConvProblem(56, 56, 256, 256, 3, 3, 1, 1, 1, n=256)


def test_summarize_per_pass_and_excludes_mismatch():
    layer = Layer("l", PROB)
    rs = [
        fake_row("s", layer, Pass.FPROP, 10.0, 20.0),  # 2x
        fake_row("s", layer, Pass.FPROP, 10.0, 80.0),  # 8x -> geomean 4x
        fake_row("s", layer, Pass.DGRAD, 10.0, 10.0),  # 1x
        fake_row("s", layer, Pass.WGRAD, 10.0, 1000.0, err=0.5),  # mismatch: left out
    ]
    s = report.summarize(rs)
    assert s["speedup"]["fprop"] == pytest.approx(4.0)
    assert s["speedup"]["dgrad"] == pytest.approx(1.0)
    assert s["speedup"]["wgrad"] is None
    assert s["speedup"]["all"] == pytest.approx((2 * 8 * 1) ** (1 / 3))
    # eager: +20 us on both sides: 40/30 and 100/30 for fprop, 30/30 for dgrad
    assert s["eager_speedup"]["fprop"] == pytest.approx(math.sqrt(40 / 30 * 100 / 30))
    assert s["eager_speedup"]["dgrad"] == pytest.approx(1.0)
    assert s["excluded_mismatch"] == 1
    assert s["count"] == {"fprop": 2, "dgrad": 1, "wgrad": 0, "all": 3}
    assert s["costs"]["convgen_host_us_median"] == pytest.approx(12.5)
    assert s["costs"]["compile_cold_ms_median"] is None  # not measured: null, not zero
    fl = rs[0]["floor_us"]  # one layer: one floor; cuDNN's 20 and 80 us over it, the mismatch left out
    assert s["cudnn_over_floor"]["fprop"] == pytest.approx(40.0 / fl)
    assert s["cudnn_over_floor"]["all"] == pytest.approx((20 * 80 * 10) ** (1 / 3) / fl)
    text = "\n".join(report.summary_lines(s))
    assert f"the most a kernel at this run's floor could gain over cuDNN: fprop {40.0 / fl:.2f}x" in text


def test_summary_splits_rows_by_cudnn_regime_and_lists_the_compute_bound():
    big, small = Layer("big", BIG), Layer("small", PROB)
    flops = rows.useful_flops(BIG)
    at = lambda tf: flops / (tf * 1e6)  # noqa: E731  the time of a given rate, us
    rs = [
        fake_row("s", big, Pass.FPROP, at(500.0), at(400.0)),  # cuDNN 400 TFLOP/s: compute-bound, 1.25x
        fake_row("s", big, Pass.DGRAD, at(450.0), at(300.0)),  # cuDNN at 300: compute-bound, 1.5x
        fake_row("s", small, Pass.FPROP, 10.0, 30.0),  # toy layer: latency-bound, 3x
    ]
    s = report.summarize(rs)
    low, comp = s["by_regime"]["latency/memory"], s["by_regime"]["compute"]
    assert low["count"]["all"] == 1 and low["speedup"]["all"] == pytest.approx(3.0)
    assert comp["count"]["all"] == 2 and comp["speedup"]["all"] == pytest.approx(math.sqrt(1.25 * 1.5))
    assert comp["speedup"]["fprop"] == pytest.approx(1.25)
    listed = {(r["layer"], r["pass"]): r for r in s["compute_bound_rows"]}
    assert set(listed) == {("big", "fprop"), ("big", "dgrad")}
    assert listed[("big", "fprop")]["cudnn_tflops"] == pytest.approx(400.0)
    assert listed[("big", "fprop")]["convgen_tflops"] == pytest.approx(500.0)
    text = "\n".join(report.summary_lines(s))
    assert "cuDNN below 300 TFLOP/s (latency/memory-bound), 1 rows: GPU fprop 3.00x" in text
    assert "compute-bound: big fprop: convgen 500 TFLOP/s, cuDNN 400 TFLOP/s, 1.25x" in text


def test_summary_costs_line():
    layer = Layer("l", PROB)
    rs = [fake_row("s", layer, p, 10.0, 20.0) for p in Pass]
    for i, r in enumerate(rs):
        r["convgen"]["compile_cold_ms"] = 100.0 * (i + 1)
        r["convgen"]["compile_warm_ms"] = 2.0
        r["cudnn"]["first_call_ms"] = 50.0
    s = report.summarize(rs)
    assert s["costs"]["compile_cold_ms_median"] == 200.0 and s["costs"]["compile_cold_ms_max"] == 300.0
    text = "\n".join(report.summary_lines(s))
    assert "cold median 200 ms (max 300)" in text and "warm disk 2.0 ms" in text and "autotune) 50 ms" in text


def test_table_alignment_and_marks():
    res = fake_result()
    lines = report.table_lines(res["suites"][1]["rows"])
    header = lines[0]
    assert header.split()[:2] == ["layer", "pass"] and "GPU x" in header and "eager x" in header and "/floor" in header
    for col in ("GPU x", "eager x"):
        end = header.index(col) + len(col)
        for line in lines[2:]:
            cell = line[:end].split()[-1]
            assert cell.endswith("x") and line[end - len(cell):end] == cell  # right-aligned under the header
    assert "MISMATCH err=5.0e-01" in lines[2]
    assert all(line.isascii() for line in lines)
    cells = lines[3].split()  # cifar-vgg conv1 dgrad: 10 us vs 20 us; eager 30 vs 40; host 12.5 vs 30
    assert cells[2:10] == ["10.0", "20.0", "2.00x", "30.0", "40.0", "1.33x", "12.5", "30.0"]


def test_table_dashes_for_unmeasured():
    res = fake_result(cudnn=False)
    line = report.table_lines(res["suites"][0]["rows"])[2]
    cells = line.split()
    assert cells[3] == "-" and cells[4] == "-" and cells[6] == "-"  # cuDNN GPU, GPU x, cuDNN eager


def test_format_report():
    text = report.format_report(fake_result())
    assert "== cifar-resnet (9 rows) ==" in text and "== cifar-vgg (9 rows) ==" in text
    assert "== all suites ==" in text
    assert "geomean speedup (cuDNN/convgen), GPU time: fprop" in text
    assert "geomean speedup (cuDNN/convgen), eager time: fprop" in text
    assert "1 row(s) left out of the means" in text
    assert "NVIDIA H200" in text and "781 TFLOP/s" in text and "4.2 TB/s" in text
    assert "empty kernel costs 4.2 us" in text
    assert "same work: fprop conv(x, w) without bias on both sides, dgrad dx alone, wgrad dW alone" in text
    assert "fused" not in text  # no fused section unless asked for


def test_fused_rows_never_enter_the_headline_means():
    plain, with_fused = fake_result(), fake_result(fused=True)
    assert with_fused["summary"] == plain["summary"]
    assert [s["summary"] for s in with_fused["suites"]] == [s["summary"] for s in plain["suites"]]
    f = with_fused["fused"]
    assert f["label"].startswith("fused bias+ReLU vs PyTorch conv2d(x,w,b)+relu")
    assert f["summary"]["speedup"]["fprop"] == pytest.approx(100.0) and f["summary"]["count"]["all"] == 4
    text = report.format_report(with_fused)
    head, _, tail = text.partition("=== apart from the means above: fused bias+ReLU vs PyTorch conv2d(x,w,b)+relu")
    assert tail and "== cifar-vgg fused (2 rows) ==" in tail and "100.00x" in tail and "100.00x" not in head


# --------------------------------------------------------------------------- files


def test_slug_and_filename():
    assert report.slug("NVIDIA H200") == "nvidia-h200"
    assert report.slug("NVIDIA GeForce RTX 4090 (x)") == "nvidia-geforce-rtx-4090-x"
    assert report.result_filename("NVIDIA H200", "2026-01-02", "abc1234", "all") == "nvidia-h200_2026-01-02_abc1234-all.json"
    assert report.result_filename("NVIDIA H200", "2026-01-02", None) == "nvidia-h200_2026-01-02_nogit.json"


def test_run_tag():
    assert report.run_tag(list(SUITES)) == "all"
    assert report.run_tag(["cifar-vgg"]) == "cifar-vgg"
    assert report.run_tag(["cifar-vgg", "resnet50"]) == "cifar-vgg+resnet50"
    tag = report.run_tag([], [Layer("conv", STRIDED)])
    assert tag.startswith("shape-n2-8x8-c4-k6-3x3-s22-p11")


def test_write_json_never_overwrites_and_nulls_nan(tmp_path):
    res = fake_result()
    res["ceilings"] = {"gemm_tflops": float("nan"), "copy_gbps": float("inf"), "pair": (1, 2)}
    p1 = report.write_json(res, tmp_path / "out", "a.json")
    p2 = report.write_json(res, tmp_path / "out", "a.json")
    assert p1.name == "a.json" and p2.name == "a-2.json"

    def no_constants(c):
        raise AssertionError(f"non-JSON constant {c}")

    data = json.loads(p1.read_text(), parse_constant=no_constants)
    assert data["ceilings"] == {"gemm_tflops": None, "copy_gbps": None, "pair": [1, 2]}
    assert data["suites"][0]["rows"][0]["problem"]["stride"] == [1, 1]
    assert data["format"] == report.RESULT_FORMAT
    assert not list((tmp_path / "out").glob("*.tmp"))


def test_git_info(tmp_path):
    info = report.git_info(tmp_path, override="deadbeef")
    assert info == {"commit": "deadbeef", "dirty": None}
    assert report.git_info(tmp_path) == {"commit": None, "dirty": None}


# --------------------------------------------------------------------------- CLI


def _args(argv):
    return build_parser().parse_args(["bench", *argv])


def test_cli_parse():
    a = _args(["--suite", "cifar-vgg", "--suite", "resnet50", "--pass", "dgrad", "--reps", "7", "--plot", "x.png",
               "--no-torch", "--json-only", "--layers", "conv1,conv2"])
    assert a.suite == ["cifar-vgg", "resnet50"] and a.pass_ == "dgrad" and a.reps == 7
    assert a.plot == "x.png" and a.no_torch and a.json_only and a.func is command.cmd_bench
    d = _args(["--suite", "all"])
    assert d.reps == command.DEFAULT_REPS and d.warmup == command.DEFAULT_WARMUP and d.out is None
    s = _args(["-n", "4", "-h", "16", "-w", "16", "-c", "8", "-k", "8", "-r", "3", "-s", "3", "--padding", "1"])
    assert (s.n, s.h, s.w) == (4, 16, 16) and s.suite is None


def test_resolve_items():
    suites, items = command.resolve_items(_args(["--suite", "all"]))
    assert suites == list(SUITES)
    assert len(items) == 3 * sum(len(v) for v in SUITES.values())
    suites, items = command.resolve_items(_args(["--suite", "cifar-resnet,cifar-vgg", "--layers", "conv1", "--pass", "wgrad"]))
    assert [(i.suite, i.layer.name, i.pass_) for i in items] == [
        ("cifar-resnet", "conv1", Pass.WGRAD), ("cifar-vgg", "conv1", Pass.WGRAD)]
    _, items = command.resolve_items(_args(["-n", "4", "-h", "16", "-w", "16", "-c", "8", "-k", "8", "-r", "3", "-s", "3",
                                          "--padding", "same", "--pass", "fprop"]))
    assert len(items) == 1 and items[0].suite == "shape" and items[0].layer.problem.padding == (1, 1)


@pytest.mark.parametrize("argv, msg", [
    (["--suite", "nope"], "unknown suite"),
    (["--suite", "cifar-vgg", "-n", "4"], "not both"),
    (["--suite", "cifar-vgg", "--layers", "conv9"], "no layer named conv9"),
    (["--suite", "cifar-vgg", "--reps", "0"], "--reps must be >= 1"),
    (["-n", "4", "-h", "16"], "missing"),
])
def test_cli_usage_errors_exit_2(argv, msg, capsys, monkeypatch):
    monkeypatch.setattr(command, "gpu_unavailable_reason", lambda: pytest.fail("GPU probed before the arguments"))
    assert main(["bench", *argv]) == 2
    assert msg in capsys.readouterr().err


def test_no_gpu_exits_1_with_message(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(command, "gpu_unavailable_reason", lambda: "test: no device")
    assert main(["bench", "--suite", "cifar-vgg", "--out", str(tmp_path)]) == 1
    assert "convgen bench: no CUDA GPU (test: no device)" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_no_gpu_on_this_machine(capsys):
    from conftest import gpu_unavailable_reason

    if gpu_unavailable_reason() is None:
        pytest.skip("this machine has a GPU")
    assert main(["bench", "--suite", "cifar-vgg", "--no-torch"]) == 1
    assert "convgen bench: no CUDA GPU (" in capsys.readouterr().err


def test_dry_run(capsys, monkeypatch):
    monkeypatch.setattr(command, "gpu_unavailable_reason", lambda: pytest.fail("--dry-run probed the GPU"))
    assert main(["bench", "--suite", "cifar-resnet", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "21 rows" in out and "res3-down" in out and "wgrad" in out
    from convgen.planner import plan
    from convgen.suites import SUITES

    res3 = next(l for l in SUITES["cifar-resnet"] if l.name == "res3")
    assert plan(res3.problem, Pass.DGRAD, Target("sm_90")).brief() in out  # plans are shown


def test_cmd_bench_writes_json_table_and_plot(capsys, monkeypatch, tmp_path):
    """The whole command around a faked GPU run: naming, JSON, .txt report, printed table."""
    seen = {}

    def fake_run(args, suites, items):
        seen.update(suites=suites, n=len(items), variants={it.variant for it in items})
        return fake_result(fused=args.fused)

    monkeypatch.setattr(command, "gpu_unavailable_reason", lambda: None)
    monkeypatch.setattr(harness, "run_bench", fake_run)
    argv = ["bench", "--suite", "cifar-resnet", "--suite", "cifar-vgg", "--out", str(tmp_path), "--no-bias"]
    import importlib.util

    have_mpl = importlib.util.find_spec("matplotlib") is not None
    assert main(argv + ["--plot", "auto"]) == 0
    captured = capsys.readouterr()
    assert seen == {"suites": ["cifar-resnet", "cifar-vgg"], "n": 33, "variants": {"same"}}  # --no-bias: still accepted
    path = tmp_path / "nvidia-h200_2026-01-02_abc1234-cifar-resnet+cifar-vgg.json"
    assert path.is_file() and path.with_suffix(".txt").is_file()
    assert "== cifar-vgg (9 rows) ==" in captured.out and f"JSON: {path}" in captured.out
    data = json.loads(path.read_text())
    assert data["summary"]["speedup"]["all"] is not None
    if have_mpl:
        assert path.with_suffix(".png").stat().st_size > 1000
    else:
        assert "needs matplotlib" in captured.err
    assert data["format"] == 2 and data["fused"] is None
    row = data["suites"][0]["rows"][0]
    assert row["convgen"]["computes"].startswith("convgen.conv2d(x, w):") and row["variant"] == "same"
    assert main(argv + ["--json-only"]) == 0
    assert capsys.readouterr().out.strip().endswith("cifar-resnet+cifar-vgg-2.json")
    assert main(argv + ["--json-only", "--fused"]) == 0
    assert seen["variants"] == {"same", "fused"} and seen["n"] == 33 + 22  # fprop and wgrad of each layer
    fused = json.loads(tmp_path.joinpath("nvidia-h200_2026-01-02_abc1234-cifar-resnet+cifar-vgg-3.json").read_text())
    assert fused["fused"]["suites"][0]["rows"][0]["variant"] == "fused"
    assert "=== apart from the means above" in tmp_path.joinpath(
        "nvidia-h200_2026-01-02_abc1234-cifar-resnet+cifar-vgg-3.txt").read_text()


@pytest.mark.parametrize("cudnn", [True, False])
def test_plot(tmp_path, cudnn):
    pytest.importorskip("matplotlib")
    p = plot.plot(fake_result(cudnn=cudnn, fused=True), tmp_path / "sub" / "speedup.png")
    assert p.stat().st_size > 1000


def test_plot_panels_keep_the_fused_comparison_apart():
    titles = [t for t, _ in plot._panels(fake_result(fused=True))]
    assert titles[:2] == ["cifar-resnet  (same work)", "cifar-vgg  (same work)"]
    assert len(titles) == 4 and all("fused bias+ReLU" in t for t in titles[2:])


def test_default_out_dir_is_the_repositorys():
    from pathlib import Path

    assert report.default_out_dir() == Path(__file__).resolve().parent.parent / "benchmarks" / "results"


def test_progress_fallback_without_tqdm(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "tqdm", None)  # import tqdm -> ImportError
    p = harness.Progress(3)
    for label in ("a", "b", "c"):
        p.step(label)
        p.update()
    p.close()
    err = capsys.readouterr().err
    assert "[1/3] a" in err and "[3/3] c" in err
    q = harness.Progress(3, enabled=False)
    q.step("x")
    q.update()
    q.close()
    assert capsys.readouterr().err == ""


# --------------------------------------------------------------------------- timing loops (fake device)


class FakeDevice:
    """A GPU that runs everything in order on a fake clock; logs what was enqueued."""

    def __init__(self):
        self.t = 0.0
        self.log = []
        self.pending_until = 0.0

    def sync(self):
        self.log.append("sync")

    def spin(self, us):
        self.log.append(f"spin{us:g}")
        self.t += us
        self.pending_until = self.t

    def flush(self):
        self.log.append("flush")
        self.t += 70.0

    def event(self):
        return {"t": None}

    def record(self, ev):
        self.log.append("record")
        ev["t"] = self.t

    def done(self, ev):
        return False

    def elapsed_us(self, a, b):
        return b["t"] - a["t"]

    def op(self, name, us):
        def fn():
            self.log.append(name)
            self.t += us
        return fn


def test_time_interleaved_abab_flush_and_events_around_op_only():
    dev = FakeDevice()
    out = timing.time_interleaved(dev, [("A", dev.op("A", 5.0)), ("B", dev.op("B", 7.0))], 3, spin_us=20.0,
                                 head_start_us=100.0)
    assert out == {"A": [5.0] * 3, "B": [7.0] * 3}
    body = dev.log[dev.log.index("spin100") + 1:-1]
    assert dev.log[0] == "sync" and dev.log[-1] == "sync"
    assert body == ["spin20", "flush", "record", "A", "record", "spin20", "flush", "record", "B", "record"] * 3


def test_time_interleaved_without_flush():
    dev = FakeDevice()
    out = timing.time_interleaved(dev, [("G", dev.op("G", 3.0))], 2, flush=False, spin_us=0.0)
    assert out == {"G": [3.0, 3.0]} and "flush" not in dev.log


def test_host_overhead_per_call():
    dev = FakeDevice()
    clock = {"t": 0.0}

    def fn():  # 4 us of host time per call
        clock["t"] += 4e-6

    us, clean = timing.host_overhead(dev, fn, 50, clock=lambda: clock["t"])
    assert us == pytest.approx(4.0) and clean is True
    spins = [e for e in dev.log if e.startswith("spin")]
    assert spins == ["spin1000"]  # at least 1 ms of spin in front of the calls


class AsyncDevice(FakeDevice):
    """A GPU that runs behind the host: a call costs `host` us of the host's clock and queues
    `gpu` us of work; sync waits for the queue.  What a user's eager loop meets."""

    def __init__(self, host, gpu):
        super().__init__()
        self.host, self.gpu, self.now, self.free_at = host, gpu, 0.0, 0.0

    def sync(self):
        self.now = max(self.now, self.free_at)

    def clock(self):
        return self.now * 1e-6

    def call(self):
        self.now += self.host
        self.free_at = max(self.free_at, self.now) + self.gpu


@pytest.mark.parametrize("host, gpu, expect", [(5.0, 20.0, 20.0), (30.0, 10.0, 30.0)])
def test_eager_time_is_the_larger_of_host_and_gpu_per_call(host, gpu, expect):
    dev = AsyncDevice(host, gpu)
    per_call = timing.eager_per_call(dev, dev.call, 100, clock=dev.clock)
    assert per_call == pytest.approx(expect, rel=0.02)  # within the first call's latency


def test_eager_interleaved_alternates_the_sides():
    dev = FakeDevice()
    out = timing.eager_interleaved(dev, [("A", dev.op("A", 1.0)), ("B", dev.op("B", 1.0))], calls=2, trials=3,
                                   clock=lambda: 0.0)
    assert [e for e in dev.log if e in "AB"] == ["A", "A", "B", "B"] * 3
    assert {k: len(v) for k, v in out.items()} == {"A": 3, "B": 3}


class RowSession(harness.Session):
    """The harness's row logic on a fake device: each side is an op of known GPU time."""

    def ops(self, problem, pass_, d, variant="same"):
        def side(name, us):
            op = self.dev.op(name, us)

            def fn():
                op()
                return name  # an output, so the two sides get compared
            return fn
        return side("convgen", 7.0), (side("cudnn", 11.0) if self.torch is not None else None)

    def compare(self, pass_, cg_out, cd_out):
        return {"rel_err": 1e-4, "parts": {}, "tol": rows.TOLERANCE, "ok": True}


def test_run_row_fills_the_three_figures_of_both_sides():
    dev = FakeDevice()
    dev.empty = dev.op("empty", 0.0)
    args = _args(["--suite", "cifar-vgg", "--reps", "4", "--eager-calls", "3", "--eager-trials", "2", "--host-calls", "5"])
    session = RowSession(None, object(), dev, Target("sm_90", 132), args)
    item = rows.Item("s", Layer("l", PROB), Pass.FPROP)
    row = rows.new_row(item, target=None, with_cudnn=True)
    session.run_row(item, row, {"x": 1}, 0, None)
    rows.finish_row(row, CEILINGS)
    for side, us in (("convgen", 7.0), ("cudnn", 11.0)):
        r = row[side]
        assert r["time_us"]["median"] == pytest.approx(us) and r["time_us"]["n"] == 4, side
        assert r["eager_us"]["n"] == 2 and r["eager_us"]["median"] >= 0.0
        assert r["host_us"] is not None and r["host_clean"] is True
        assert r["error"] is None
    assert row["speedup"] == pytest.approx(11.0 / 7.0) and row["check"]["ok"] is True
    assert row["cudnn"]["first_call_ms"] is not None and row["spin_us"] >= timing.MIN_SPIN_US
    assert dev.log.count("convgen") == args.warmup + 3 + 5 + 4 + 2 * 3  # warm-up, host probe + calls, reps, eager
    floor = session.launch_floor(10)
    assert floor["host_us"] is not None and floor["error"] is None and "empty" in dev.log


def test_run_row_without_eager_leaves_it_null():
    dev = FakeDevice()
    args = _args(["--suite", "cifar-vgg", "--reps", "2", "--eager-calls", "0", "--host-calls", "0"])
    session = RowSession(None, object(), dev, Target("sm_90", 132), args)
    item = rows.Item("s", Layer("l", PROB), Pass.WGRAD)
    row = rows.new_row(item, target=None, with_cudnn=True)
    session.run_row(item, row, {"x": 1}, 0, None)
    assert row["convgen"]["eager_us"] is None and row["convgen"]["time_us"]["n"] == 2
    assert row["spin_us"] == 100.0  # host cost not measured: the generous spin


def test_bench_module_imports_no_gpu_libraries():
    import subprocess

    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    code = ("import sys, convgen.cli, convgen.tools.bench.command, convgen.tools.bench.harness, "
            "convgen.tools.bench.plot; convgen.cli.build_parser(); "
            "print(sorted(m for m in ('torch', 'cupy', 'matplotlib', 'tqdm') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root).stdout
    assert out.strip() == "[]"


def test_geomean_of_known_values():
    assert stats.geomean([2.0, 8.0]) == pytest.approx(4.0)
    assert stats.geomean([1.0, 10.0, 100.0]) == pytest.approx(10.0)


def test_argparse_namespace_untouched_by_resolve():
    a = _args(["-n", "4", "-h", "16", "-w", "16", "-c", "8", "-k", "8", "-r", "3", "-s", "3"])
    before = dict(vars(a))
    command.resolve_items(a)
    assert vars(a) == before


def test_rows_record_the_tuned_plan_that_runs(monkeypatch):
    """A row names the plan convgen.conv2d runs on that GPU: the shipped tuned plan where
    there is one (the bench once recorded the planner's plan next to a tuned plan's time)."""
    from convgen import tuning_db
    from convgen.planner import plan as default_plan

    layer = next(l for l in SUITES["resnet50"] if l.name == "l4-1x1")  # tuned on the H200, unlike the planner
    target = Target("sm_90", 132)
    tuned = tuning_db.lookup("NVIDIA H200", layer.problem.geometry, Pass.WGRAD, "float16", "sm_90")
    assert tuned is not None and tuned.as_dict() != default_plan(layer.problem, Pass.WGRAD, target).as_dict()
    item = rows.Item("resnet50", layer, Pass.WGRAD)
    row = rows.new_row(item, target=target, with_cudnn=True, gpu_name="NVIDIA H200")
    assert row["convgen"]["plan"] == tuned.as_dict()
    assert rows.new_row(item, target=target, with_cudnn=True, gpu_name="Some Other GPU")["convgen"]["plan"] \
        == default_plan(layer.problem, Pass.WGRAD, target).as_dict()
    monkeypatch.setenv("CONVGEN_TUNED", "0")
    assert rows.new_row(item, target=target, with_cudnn=True, gpu_name="NVIDIA H200")["convgen"]["plan"] \
        == default_plan(layer.problem, Pass.WGRAD, target).as_dict()


def test_rows_and_settings_name_where_the_plans_come_from(monkeypatch):
    """Issue 16's targets differ by plan source (the planner's defaults, or tuning on first
    use), so each row and the run's settings say which it was: a database entry, the planner,
    or the tuner at the first call, whose plan the run reads back afterwards."""
    import convgen

    layer = next(l for l in SUITES["resnet50"] if l.name == "l4-1x1")  # tuned on the H200
    target = Target("sm_90", 132)
    item = rows.Item("resnet50", layer, Pass.WGRAD)

    def source(gpu: str) -> str:
        return rows.new_row(item, target=target, with_cudnn=True, gpu_name=gpu)["convgen"]["plan_source"]

    try:
        convgen.set_autotune(False)
        assert (source("NVIDIA H200"), source("Some Other GPU")) == ("tuning database", "planner")
        assert rows.plans_setting() == "this GPU's tuning databases, else the planner"
        convgen.set_autotune(True)
        assert (source("NVIDIA H200"), source("Some Other GPU")) == ("tuning database", "first use")
        assert rows.plans_setting().endswith("; a shape neither covers is tuned on its first call (autotune)")
        monkeypatch.setenv("CONVGEN_TUNED", "0")  # the planner's plans only: no tuning on first use either
        assert source("NVIDIA H200") == "planner"
        assert rows.plans_setting() == "the planner's defaults (CONVGEN_TUNED=0: no tuning database)"
    finally:
        convgen.set_autotune(None)


def test_run_bench_end_to_end_on_a_fake_gpu(monkeypatch, tmp_path):
    """run_bench's orchestration (stream, device, ceilings, launch floor, one data set per
    layer, rows of both variants, settings, grouping) with CuPy, the device and the session's
    GPU calls faked: what the H200 run goes through, minus the kernels."""
    import contextlib
    from types import SimpleNamespace

    import convgen.compile
    import convgen.runtime

    dev = FakeDevice()
    dev.empty = dev.op("empty", 0.0)
    dev.recalibrate = lambda: None
    dev.cycles_per_us = 1980.0
    fake_cupy = SimpleNamespace(cuda=SimpleNamespace(Stream=SimpleNamespace(null=contextlib.nullcontext()),
                                                     Device=lambda *a: SimpleNamespace(id=0)))
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy)
    monkeypatch.setattr(convgen.compile, "detect_target", lambda: Target("sm_90", 132))
    monkeypatch.setattr(convgen.runtime, "_gpu_name", lambda i: "NVIDIA H200")
    monkeypatch.setattr(harness, "CudaDevice", lambda cp, stream: dev)
    monkeypatch.setattr(harness, "_environment", lambda cp, torch, target: {
        "gpu": {"name": "NVIDIA H200", "arch": target.arch, "sm_count": target.sm_count}, "versions": {}})
    monkeypatch.setattr(harness.Session, "ceilings", lambda self: {"gemm_tflops": 700.0, "copy_gbps": 4000.0})
    made = []
    monkeypatch.setattr(harness.Session, "make_data", lambda self, problem, seed: made.append(problem) or {"x": 1})
    monkeypatch.setattr(harness.Session, "ops", RowSession.ops)
    monkeypatch.setattr(harness.Session, "compare", RowSession.compare)
    args = _args(["--suite", "cifar-resnet", "--layers", "conv1,res3", "--fused", "--no-torch", "--no-compile-time",
                  "--no-progress", "--reps", "3", "--eager-calls", "2", "--eager-trials", "2", "--host-calls", "4"])
    suites, items = command.resolve_items(args)
    result = harness.run_bench(args, suites, items)
    assert len(made) == 2  # one data set per layer, shared by its passes and variants
    assert [r["pass"] for r in result["suites"][0]["rows"]] == ["fprop", "dgrad", "wgrad"] * 2
    assert [(r["layer"], r["pass"]) for r in result["fused"]["suites"][0]["rows"]] == [
        ("conv1", "fprop"), ("conv1", "wgrad"), ("res3", "fprop"), ("res3", "wgrad")]
    row = result["suites"][0]["rows"][0]
    assert row["convgen"]["time_us"]["median"] == pytest.approx(7.0) and row["convgen"]["eager_us"]["n"] == 2
    assert row["cudnn"] is None and row["variant"] == "same" and "bias" not in row["traffic"]
    assert row["convgen"]["plan"] is not None  # the tuned H200 plan it would run
    assert result["launch_floor"]["host_us"] is not None and result["launch_floor"]["calls"] == 100
    assert result["settings"]["fused"] is True and result["settings"]["eager_calls"] == 2
    assert result["reference"]["gemm_tflops"] == 781.0 and result["format"] == report.RESULT_FORMAT
    path = report.write_json(result, tmp_path, "r.json")
    assert json.loads(path.read_text())["fused"]["summary"]["count"]["all"] == 0  # no cuDNN side: no speedups
    assert "launch floor" in report.format_report(result)
    assert result["settings"]["plans"] == rows.plans_setting()
    assert f"convgen's plans: {rows.plans_setting()}" in report.format_report(result)
    # with tuning on first use, a row whose shape no database covers names the plan its calls ran
    ran = {"block_m": 999}
    monkeypatch.setattr(harness, "plan_run", lambda it: ran)
    monkeypatch.setattr(convgen.runtime, "_gpu_name", lambda i: "Some Other GPU")
    convgen.set_autotune(True)
    try:
        tuned = harness.run_bench(args, suites, items)
    finally:
        convgen.set_autotune(None)
    assert all(r["convgen"]["plan_source"] == "first use" and r["convgen"]["plan"] is ran
               for r in tuned["suites"][0]["rows"])
    assert all(r["convgen"]["plan"] is not ran for r in result["suites"][0]["rows"])
