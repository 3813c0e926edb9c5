"""`convgen bench`'s report and command line without a GPU: the table, the report, file
naming and JSON, the plot, the CLI's parsing and usage errors, and the no-GPU exit path.
Results are kept and compared later (benchmarks/results), so a file is never overwritten and
a NaN is written as null; the fused rows stay out of the headline means; and on a machine
with no GPU the command exits with a message, importing no GPU library on the way."""

from __future__ import annotations

import json
import sys

import pytest

from convgen.tools.bench import command, harness, plot, report
from convgen.cli import main
from convgen.ir import Pass, Target
from convgen.suites import SUITES, Layer

from test_bench import STRIDED, _args, fake_result  # the bench tests' problems, CLI arguments and results


# --------------------------------------------------------------------------- table and report


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


def test_argparse_namespace_untouched_by_resolve():
    a = _args(["-n", "4", "-h", "16", "-w", "16", "-c", "8", "-k", "8", "-r", "3", "-s", "3"])
    before = dict(vars(a))
    command.resolve_items(a)
    assert vars(a) == before


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


def test_bench_module_imports_no_gpu_libraries():
    import subprocess

    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    code = ("import sys, convgen.cli, convgen.tools.bench.command, convgen.tools.bench.harness, "
            "convgen.tools.bench.plot; convgen.cli.build_parser(); "
            "print(sorted(m for m in ('torch', 'cupy', 'matplotlib', 'tqdm') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root).stdout
    assert out.strip() == "[]"
