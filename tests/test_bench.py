"""`convgen bench` without a GPU, the numbers in a row: traffic and floor arithmetic,
statistics, what each side computes (the same work by default, so that a speedup compares
like with like), the plan a row names and where it comes from, and the summaries over rows.
The stand-ins the other bench tests import (a fake device, the CLI's arguments, a fake
result) are kept here.  The table, the files and the CLI are tests/test_bench_cli.py's, the
timing loops tests/test_bench_timing.py's; the GPU run itself is exercised on the GPU machine
(benchmarks/gpu_smoke.sh)."""

from __future__ import annotations

import math

import pytest

from convgen.tools.bench import command, harness, report, rows, stats
from convgen.cli import build_parser
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


def test_geomean_of_known_values():
    assert stats.geomean([2.0, 8.0]) == pytest.approx(4.0)
    assert stats.geomean([1.0, 10.0, 100.0]) == pytest.approx(10.0)


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


# --------------------------------------------------------------------------- stand-ins the other bench tests share


def _args(argv):
    return build_parser().parse_args(["bench", *argv])


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
