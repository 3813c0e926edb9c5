"""`convgen bench` without a GPU: traffic and floor arithmetic, statistics, summaries,
the table, file naming and JSON, the CLI, the timing loops against a fake device, and
the no-GPU exit path.  The GPU run itself is exercised on the GPU machine."""

from __future__ import annotations

import argparse
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
    x, w, y = 2 * 8 * 8 * 4, 6 * 3 * 3 * 4, 2 * 8 * 8 * 6
    assert rows.traffic(PROB, "fprop") == {"x": 2 * x, "w": 2 * w, "bias": 4 * 6, "y": 2 * y}
    assert rows.traffic(PROB, "fprop", bias=False) == {"x": 2 * x, "w": 2 * w, "y": 2 * y}
    assert rows.traffic(PROB, Pass.DGRAD) == {"dy": 2 * y, "w": 2 * w, "dx": 2 * x}
    assert rows.traffic(PROB, "wgrad") == {"x": 2 * x, "dy": 2 * y, "dw": 2 * w, "db": 2 * 6}
    assert rows.traffic(PROB, "wgrad", bias=False) == {"x": 2 * x, "dy": 2 * y, "dw": 2 * w}
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
    row = rows.new_row(rows.Item("s", Layer("l", STRIDED), Pass.DGRAD), bias=True, target=None, with_cudnn=True)
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


# --------------------------------------------------------------------------- rows and summaries

CEILINGS = {"gemm_tflops": 500.0, "copy_gbps": 4000.0}


def fake_row(suite: str, layer: Layer, pass_: Pass, cg_us, cd_us, err=1e-3, cudnn=True):
    row = rows.new_row(rows.Item(suite, layer, pass_), bias=True, target=Target("sm_90", 132), with_cudnn=cudnn)
    row["convgen"]["time_us"] = stats.time_stats([cg_us] * 3) if cg_us is not None else None
    row["convgen"]["host_us"] = 12.5
    if cudnn:
        row["cudnn"]["time_us"] = stats.time_stats([cd_us] * 3) if cd_us is not None else None
        row["check"] = {"rel_err": err, "parts": {}, "tol": rows.TOLERANCE, "ok": err < rows.TOLERANCE}
    return rows.finish_row(row, CEILINGS)


def fake_result(cudnn=True):
    rows = {}
    for suite in ("cifar-resnet", "cifar-vgg"):
        rs = []
        for i, layer in enumerate(SUITES[suite][:3]):
            for p in Pass:
                rs.append(fake_row(suite, layer, p, 10.0 + i, 20.0 + 2 * i if cudnn else None, cudnn=cudnn))
        rows[suite] = rs
    rows["cifar-vgg"][0] = fake_row("cifar-vgg", SUITES["cifar-vgg"][0], Pass.FPROP, 5.0, 50.0, err=0.5, cudnn=cudnn)
    return report.build_result(
        list(rows.items()), date="2026-01-02", timestamp="2026-01-02T00:00:00+00:00",
        git={"commit": "abc1234", "dirty": False}, gpu={"name": "NVIDIA H200", "sm_count": 132},
        versions={}, settings={"reps": 3}, ceilings=CEILINGS, host_overhead_us={}, notes=[],
    )


def test_new_row_static_fields():
    layer = Layer("l", PROB)
    row = rows.new_row(rows.Item("s", layer, Pass.WGRAD), bias=True, target=Target("sm_90", 132), with_cudnn=False)
    assert row["cudnn"] is None
    assert row["bytes"] == sum(row["traffic"].values())
    assert row["convgen"]["key"] and row["convgen"]["plan"]["split_k"] >= 1
    assert row["convgen"]["time_us"] is None and row["speedup"] is None  # nothing invented
    assert row["problem"] == PROB.as_dict()
    d = rows.new_row(rows.Item("s", layer, Pass.DGRAD), bias=True, target=None, with_cudnn=True)
    assert "db" not in d["traffic"] and "bias" not in d["traffic"] and d["convgen"]["key"] is None


def test_finish_row_derived_fields():
    r = fake_row("s", Layer("l", PROB), Pass.FPROP, 10.0, 25.0)
    assert r["speedup"] == pytest.approx(2.5)
    assert r["convgen"]["tflops"] == pytest.approx(r["flops"] / 10.0 / 1e6)
    fl, _ = rows.floor_us(r["flops"], r["bytes"], 500.0, 4000.0)
    assert r["floor_us"] == pytest.approx(fl) and r["over_floor"] == pytest.approx(10.0 / fl)
    only = fake_row("s", Layer("l", PROB), Pass.FPROP, 10.0, None)
    assert only["speedup"] is None and only["over_floor"] is not None


def test_summarize_per_pass_and_excludes_mismatch():
    layer = Layer("l", PROB)
    rows = [
        fake_row("s", layer, Pass.FPROP, 10.0, 20.0),  # 2x
        fake_row("s", layer, Pass.FPROP, 10.0, 80.0),  # 8x -> geomean 4x
        fake_row("s", layer, Pass.DGRAD, 10.0, 10.0),  # 1x
        fake_row("s", layer, Pass.WGRAD, 10.0, 1000.0, err=0.5),  # mismatch: left out
    ]
    s = report.summarize(rows)
    assert s["speedup"]["fprop"] == pytest.approx(4.0)
    assert s["speedup"]["dgrad"] == pytest.approx(1.0)
    assert s["speedup"]["wgrad"] is None
    assert s["speedup"]["all"] == pytest.approx((2 * 8 * 1) ** (1 / 3))
    assert s["excluded_mismatch"] == 1
    assert s["count"] == {"fprop": 2, "dgrad": 1, "wgrad": 0, "all": 3}
    assert s["costs"]["convgen_host_us_median"] == pytest.approx(12.5)
    assert s["costs"]["compile_cold_ms_median"] is None  # not measured: null, not zero


def test_summary_costs_line():
    layer = Layer("l", PROB)
    rows = [fake_row("s", layer, p, 10.0, 20.0) for p in Pass]
    for i, r in enumerate(rows):
        r["convgen"]["compile_cold_ms"] = 100.0 * (i + 1)
        r["convgen"]["compile_warm_ms"] = 2.0
        r["cudnn"]["first_call_ms"] = 50.0
    s = report.summarize(rows)
    assert s["costs"]["compile_cold_ms_median"] == 200.0 and s["costs"]["compile_cold_ms_max"] == 300.0
    text = "\n".join(report.summary_lines(s))
    assert "cold median 200 ms (max 300)" in text and "warm disk 2.0 ms" in text and "autotune) 50 ms" in text


def test_table_alignment_and_marks():
    res = fake_result()
    lines = report.table_lines(res["suites"][1]["rows"])
    header = lines[0]
    assert header.split()[:2] == ["layer", "pass"] and "speedup" in header and "/floor" in header
    end = header.index("speedup") + len("speedup")
    for line in lines[2:]:
        cell = line[:end].split()[-1]
        assert cell.endswith("x") and line[end - len(cell):end] == cell  # right-aligned under the header
    assert "MISMATCH err=5.0e-01" in lines[2]
    assert all(line.isascii() for line in lines)


def test_table_dashes_for_unmeasured():
    res = fake_result(cudnn=False)
    line = report.table_lines(res["suites"][0]["rows"])[2]
    cells = line.split()
    assert cells[3] == "-" and cells[5] == "-"  # cuDNN us, speedup


def test_format_report():
    text = report.format_report(fake_result())
    assert "== cifar-resnet (9 rows) ==" in text and "== cifar-vgg (9 rows) ==" in text
    assert "== all suites ==" in text
    assert "geomean speedup (cuDNN/convgen): fprop" in text
    assert "1 row(s) left out of the means" in text
    assert "NVIDIA H200" in text


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

    def fake_run(args, suites, items, bias):
        seen.update(suites=suites, n=len(items), bias=bias)
        return fake_result()

    monkeypatch.setattr(command, "gpu_unavailable_reason", lambda: None)
    monkeypatch.setattr(harness, "run_bench", fake_run)
    argv = ["bench", "--suite", "cifar-resnet", "--suite", "cifar-vgg", "--out", str(tmp_path), "--no-bias"]
    import importlib.util

    have_mpl = importlib.util.find_spec("matplotlib") is not None
    assert main(argv + ["--plot", "auto"]) == 0
    captured = capsys.readouterr()
    assert seen == {"suites": ["cifar-resnet", "cifar-vgg"], "n": 33, "bias": False}
    path = tmp_path / "nvidia-h200_2026-01-02_abc1234-cifar-resnet+cifar-vgg.json"
    assert path.is_file() and path.with_suffix(".txt").is_file()
    assert "== cifar-vgg (9 rows) ==" in captured.out and f"JSON: {path}" in captured.out
    data = json.loads(path.read_text())
    assert data["summary"]["speedup"]["all"] is not None
    if have_mpl:
        assert path.with_suffix(".png").stat().st_size > 1000
    else:
        assert "needs matplotlib" in captured.err
    assert main(argv + ["--json-only"]) == 0
    assert capsys.readouterr().out.strip().endswith("cifar-resnet+cifar-vgg-2.json")


@pytest.mark.parametrize("cudnn", [True, False])
def test_plot(tmp_path, cudnn):
    pytest.importorskip("matplotlib")
    p = plot.plot(fake_result(cudnn=cudnn), tmp_path / "sub" / "speedup.png")
    assert p.stat().st_size > 1000


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


def test_epilogue_and_computes():
    assert rows.epilogue_for(Pass.DGRAD, True).bias is False
    assert rows.epilogue_for(Pass.WGRAD, True).bias is True
    assert rows.epilogue_for(Pass.FPROP, False).bias is False
    c = rows.computes(Pass.WGRAD, True)
    assert "db" in c["convgen"] and "[False, True, True]" in c["cudnn"]
    assert "[False, True, False]" in rows.computes(Pass.WGRAD, False)["cudnn"]


def test_bench_module_imports_no_gpu_libraries():
    import subprocess

    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    code = ("import sys, convgen.cli, convgen.tools.bench.command, convgen.tools.bench.harness, "
            "convgen.tools.bench.plot; convgen.cli.build_parser(); "
            "print(sorted(m for m in ('torch', 'cupy', 'matplotlib', 'tqdm') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root).stdout
    assert out.strip() == "[]"


def test_geomean_matches_math():
    vals = [1.5, 2.5, 0.7]
    assert stats.geomean(vals) == pytest.approx(math.prod(vals) ** (1 / 3))


def test_argparse_namespace_untouched_by_resolve():
    a = _args(["-n", "4", "-h", "16", "-w", "16", "-c", "8", "-k", "8", "-r", "3", "-s", "3"])
    before = dict(vars(a))
    command.resolve_items(a)
    assert vars(a) == before
    assert isinstance(a, argparse.Namespace)


def test_rows_record_the_tuned_plan_that_runs(monkeypatch):
    """A row names the plan convgen.conv2d runs on that GPU: the shipped tuned plan where
    there is one (the bench once recorded the planner's plan next to a tuned plan's time)."""
    from convgen import tuning_db
    from convgen.planner import plan as default_plan

    layer = SUITES["resnet50"][-2]  # l4-3x3: tuned on the H200, differently from the planner
    target = Target("sm_90", 132)
    tuned = tuning_db.lookup("NVIDIA H200", layer.problem.geometry, Pass.DGRAD, "float16", "sm_90")
    assert tuned is not None and tuned.as_dict() != default_plan(layer.problem, Pass.DGRAD, target).as_dict()
    item = rows.Item("resnet50", layer, Pass.DGRAD)
    row = rows.new_row(item, bias=True, target=target, with_cudnn=True, gpu_name="NVIDIA H200")
    assert row["convgen"]["plan"] == tuned.as_dict()
    assert rows.new_row(item, bias=True, target=target, with_cudnn=True, gpu_name="Some Other GPU")["convgen"]["plan"] \
        == default_plan(layer.problem, Pass.DGRAD, target).as_dict()
    monkeypatch.setenv("CONVGEN_TUNED", "0")
    assert rows.new_row(item, bias=True, target=target, with_cudnn=True, gpu_name="NVIDIA H200")["convgen"]["plan"] \
        == default_plan(layer.problem, Pass.DGRAD, target).as_dict()
