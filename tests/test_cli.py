"""The `convgen` command, run both as a program (`python3 -m convgen.cli`) and in-process
(`convgen.cli.main([...])`): listings, emitted files and their manifest, plans, and
input errors (status 2, one `convgen: error:` line, no traceback, nothing written)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from convgen.cli import main
from convgen.emit import emit
from convgen.ir import ConvProblem, Epilogue, Pass, Target
from convgen.planner import make_spec
from convgen.resources import include_dir
from convgen.suites import SUITE_INFO, SUITES, get_suite

ROOT = Path(__file__).resolve().parent.parent


# the device headers the suites' default kernels include (sm_90 fprop has TMA kernels, which
# include convgen/hopper.h too), which `convgen emit -o DIR` copies next to them
HEADERS = ["convgen/device.h", "convgen/hopper.h"]

def run_cli(*args: str) -> subprocess.CompletedProcess:
    # PYTHONPATH: this checkout's convgen, whatever else is installed
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", "convgen.cli", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(params=["subprocess", "main"])
def cli(request, capsys):
    """Runs the CLI one of the two ways; returns (status, stdout, stderr)."""
    if request.param == "subprocess":
        def go(*args):
            r = run_cli(*args)
            return r.returncode, r.stdout, r.stderr
    else:
        def go(*args):
            capsys.readouterr()
            status = main(list(args))
            out, err = capsys.readouterr()
            return status, out, err
    return go


def default_epilogue(pass_: Pass) -> Epilogue:
    return Epilogue(bias=pass_ is not Pass.DGRAD)


# --------------------------------------------------------------------------- suites


def test_suites_lists_every_suite_with_its_source(cli):
    status, out, err = cli("suites")
    assert status == 0 and err == ""
    lines = out.splitlines()
    assert {"cifar-resnet", "cifar-vgg", "resnet50", "resnet18", "vgg16", "unet", "speech"} <= set(SUITES)
    for name, layers in SUITES.items():
        assert f"{name} ({len(layers)} layers): {SUITE_INFO[name].source}" in lines
        for layer in layers:
            assert any(l.split()[:1] == [layer.name] and layer.problem.describe() in l for l in lines)


def test_suite_layer_names_are_unique():
    for name, layers in SUITES.items():  # they name the emitted files
        assert len({l.name for l in layers}) == len(layers), name
        assert get_suite(name) is layers
    with pytest.raises(ValueError, match="unknown suite 'nope'; built-in suites: cifar-resnet, cifar-vgg, resnet50, resnet18"):
        get_suite("nope")


# --------------------------------------------------------------------------- emit


def read_manifest(folder: Path) -> list[dict]:
    data = json.loads((folder / "manifest.json").read_text())
    assert set(data) == {"kernels", "headers", "include_dir"}
    return data["kernels"]


def test_emit_suite_writes_one_file_per_layer_and_pass(cli, tmp_path):
    out = tmp_path / "vgg"
    status, stdout, err = cli("emit", "--suite", "cifar-vgg", "-o", str(out))
    assert status == 0 and err == ""
    layers = SUITES["cifar-vgg"]
    expected = {f"{l.name}.{p.value}.cu" for l in layers for p in Pass}
    assert {f.name for f in out.iterdir()} == expected | {"manifest.json", "convgen"}
    assert len(stdout.splitlines()) == len(expected)  # one line per file written
    # the kernels' #include "convgen/device.h", copied so that `nvcc -I out` finds it
    assert sorted(p.relative_to(out).as_posix() for p in (out / "convgen").iterdir()) == HEADERS
    assert (out / "convgen" / "device.h").read_bytes() == (include_dir() / "convgen" / "device.h").read_bytes()
    data = json.loads((out / "manifest.json").read_text())
    assert sorted(data["headers"]) == HEADERS and data["include_dir"] == "."
    assert all('#include "convgen/device.h"' in (out / f).read_text() for f in expected)

    entries = read_manifest(out)
    assert sorted(e["file"] for e in entries) == sorted(expected)
    for e in entries:
        layer = next(l for l in layers if l.name == e["layer"])
        pass_ = Pass(e["spec"]["pass"])
        assert e["file"] == f"{layer.name}.{pass_.value}.cu"
        assert e["batch"] == layer.problem.n
        spec = make_spec(layer.problem, pass_, target=Target("sm_90"), epilogue=default_epilogue(pass_))
        ks = emit(spec)
        text = (out / e["file"]).read_text()
        assert text == ks.source  # the file is exactly what emit() renders for the CLI's defaults
        assert e["key"] == spec.key and f"spec {spec.key}" in text
        assert e["spec"] == spec.as_dict()
        assert e["spec"]["plan"] == spec.plan.as_dict() and e["plan_reasons"] == list(spec.plan.reasons)
        assert [k["name"] for k in e["kernels"]] == list(ks.kernel_names)
        for k in e["kernels"]:
            assert set(k) >= {"name", "args", "block", "shared_mem", "grid"}
            assert 'extern "C"' in text and k["name"] + "(" in text
        main_k = e["kernels"][0]
        assert main_k["block"] == [spec.plan.warps * 32, 1, 1]
        assert main_k["shared_mem"] == ks.main.shared_mem
        assert e["kernels"] == ks.manifest_entry()["kernels"]  # the launches emit() describes
        assert main_k["args"] == list(ks.main.args)


def test_emit_is_the_same_both_ways(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    assert run_cli("emit", "--suite", "cifar-resnet", "-q", "-o", str(a)).returncode == 0
    assert main(["emit", "--suite", "cifar-resnet", "--quiet", "-o", str(b)]) == 0
    assert capsys.readouterr().out == ""  # --quiet
    names = sorted(f.relative_to(a).as_posix() for f in a.rglob("*") if f.is_file())
    assert names == sorted(f.relative_to(b).as_posix() for f in b.rglob("*") if f.is_file())
    assert len(names) == 3 * 7 + 1 + len(HEADERS)  # the kernels, the manifest and convgen's headers
    for n in names:
        assert (a / n).read_bytes() == (b / n).read_bytes(), n


@pytest.mark.parametrize(
    "flags, create",
    [
        (["-n", "8", "-h", "20", "-w", "18", "-c", "8", "-k", "16", "-r", "3", "-s", "3", "--padding", "same",
          "--dilation", "2"],
         dict(n=8, h=20, w=18, c=8, k=16, r=3, s=3, padding="same", dilation=2)),
        (["-n", "2", "-h", "15", "-w", "17", "-c", "3", "-k", "5", "-r", "3", "-s", "2", "--stride", "2,1",
          "--padding", "1,0", "--dilation", "1,2"],
         dict(n=2, h=15, w=17, c=3, k=5, r=3, s=2, stride=(2, 1), padding=(1, 0), dilation=(1, 2))),
        (["-n", "1", "-h", "7", "-w", "7", "-c", "16", "-k", "32", "-r", "3", "-s", "3", "--stride", "2",
          "--padding", "valid"],
         dict(n=1, h=7, w=7, c=16, k=32, r=3, s=3, stride=2, padding="valid")),
    ],
    ids=["same-dilated", "asymmetric", "valid-strided"],
)
def test_emit_single_shape(cli, tmp_path, flags, create):
    out = tmp_path / "one"
    status, _, err = cli("emit", *flags, "-o", str(out))
    assert status == 0 and err == ""
    prob = ConvProblem.create(**create)
    assert {f.name for f in out.iterdir()} == {f"conv.{p.value}.cu" for p in Pass} | {"manifest.json", "convgen"}
    for e in read_manifest(out):
        assert e["layer"] == "conv" and e["batch"] == prob.n
        assert e["spec"]["geometry"] == prob.geometry.as_dict()
        pass_ = Pass(e["spec"]["pass"])
        spec = make_spec(prob, pass_, epilogue=default_epilogue(pass_))
        assert (out / e["file"]).read_text() == emit(spec).source


def test_emit_one_pass(cli, tmp_path):
    out = tmp_path / "fp"
    status, _, _ = cli("emit", "--suite", "cifar-resnet", "--pass", "fprop", "-q", "-o", str(out))
    assert status == 0
    files = {f.name for f in out.iterdir()} - {"manifest.json", "convgen"}
    assert files == {f"{l.name}.fprop.cu" for l in SUITES["cifar-resnet"]}
    assert {e["spec"]["pass"] for e in read_manifest(out)} == {"fprop"}


@pytest.mark.parametrize(
    "flags, arch",
    [(["--backend", "hip", "--arch", "gfx942"], "gfx942"), (["--backend", "hip"], "gfx1201"),
     (["--arch", "gfx1100"], "gfx1100"), (["--backend", "cuda"], "sm_90"), (["--arch", "sm_75"], "sm_75")],
)
def test_emit_backends(cli, tmp_path, flags, arch):
    out = tmp_path / arch
    status, _, err = cli("emit", "--suite", "cifar-vgg", *flags, "-q", "-o", str(out))
    assert status == 0 and err == ""
    hip = arch.startswith("gfx")
    ext = "hip" if hip else "cu"
    files = {f.name for f in out.iterdir()} - {"manifest.json", "convgen"}
    assert files == {f"{l.name}.{p.value}.{ext}" for l in SUITES["cifar-vgg"] for p in Pass}
    for e in read_manifest(out):
        assert e["spec"]["target"]["arch"] == arch
        assert e["spec"]["target"]["backend"] == ("hip" if hip else "cuda")
        text = (out / e["file"]).read_text()
        assert ("rocwmma" in text) == hip and ("nvcuda" in text) == (not hip)


def test_emit_epilogue_dtype_and_sm_count_flags(cli, tmp_path):
    out = tmp_path / "flags"
    status, _, _ = cli("emit", "--suite", "cifar-resnet", "--in-dtype", "float32", "--out-dtype", "float32",
                       "--relu", "--no-bias", "--sm-count", "10", "-q", "-o", str(out))
    assert status == 0
    for e in read_manifest(out):
        s = e["spec"]
        assert s["in_dtype"] == "float32" and s["epilogue"]["out_dtype"] == "float32"
        assert s["epilogue"]["bias"] is False
        assert s["epilogue"]["relu"] is (s["pass"] == "fprop")  # ReLU is an fprop epilogue only
        assert s["target"]["sm_count"] == 10


# --------------------------------------------------------------------------- plan


def test_plan_json(cli):
    status, out, err = cli("plan", "--suite", "cifar-resnet", "--json")
    assert status == 0 and err == ""
    rows = json.loads(out)
    layers = SUITES["cifar-resnet"]
    assert len(rows) == len(layers) * 3
    assert {(r["layer"], r["pass"]) for r in rows} == {(l.name, p.value) for l in layers for p in Pass}
    for r in rows:
        layer = next(l for l in layers if l.name == r["layer"])
        pass_ = Pass(r["pass"])
        spec = make_spec(layer.problem, pass_, epilogue=default_epilogue(pass_))
        assert r["problem"] == layer.problem.as_dict() and r["padded_channels"] is None  # CIFAR's stem is too small
        assert r["plan"] == spec.plan.as_dict() and r["key"] == spec.key
        assert r["reasons"] == list(spec.plan.reasons) and len(r["reasons"]) >= 5


def test_plan_says_when_a_stem_is_padded_and_plans_the_padded_layer(cli):
    """What convgen.conv2d runs on an ImageNet stem: its 3 channels padded to 4, and the plan for that."""
    status, out, err = cli("plan", "--suite", "resnet50", "--pass", "all", "--json")
    assert status == 0 and err == ""
    rows = {(r["layer"], r["pass"]): r for r in json.loads(out)}
    stem = next(l for l in SUITES["resnet50"] if l.name == "conv1")
    for pass_ in Pass:
        r = rows[("conv1", pass_.value)]
        if pass_ is Pass.DGRAD:  # dx has the narrow channels: never padded
            assert r["padded_channels"] is None and not r["reasons"][0].startswith("pads")
            continue
        spec = make_spec(dataclasses.replace(stem.problem, c=4), pass_, epilogue=default_epilogue(pass_))
        assert r["padded_channels"] == 4 and r["reasons"][0].startswith("pads C=3 to 4 channels")
        x_vec = r["plan"]["vec_a" if pass_ is Pass.FPROP else "vec_b"]  # wgrad reads x as its B operand
        assert r["plan"] == spec.plan.as_dict() and r["key"] == spec.key and x_vec == 4


def test_plan_says_why_a_stride_1_stem_keeps_its_channels_in_fprop(cli):
    """VGG-16's stem: fprop runs the staged halo on its 3 channels (and says why), wgrad pads."""
    status, out, err = cli("plan", "--suite", "vgg16", "--pass", "all", "--json")
    assert status == 0 and err == ""
    rows = {(r["layer"], r["pass"]): r for r in json.loads(out)}
    fprop, wgrad = rows[("conv1_1", "fprop")], rows[("conv1_1", "wgrad")]
    assert fprop["padded_channels"] is None and fprop["reasons"][0].startswith("keeps C=3 unpadded: the staged halo")
    assert fprop["plan"].get("tile_w") and fprop["plan"]["vec_a"] == 1
    assert wgrad["padded_channels"] == 4 and wgrad["reasons"][0].startswith("pads C=3 to 4 channels")
    assert not any(r["reasons"][0].startswith("keeps C=3") for k, r in rows.items() if k != ("conv1_1", "fprop"))


def test_plan_text_explains_each_choice(cli):
    status, out, _ = cli("plan", "-n", "4", "-h", "16", "-w", "16", "-c", "3", "-k", "8", "-r", "3", "-s", "3",
                         "--padding", "same", "--pass", "wgrad", "--arch", "sm_75")
    assert status == 0
    prob = ConvProblem.create(4, 16, 16, 3, 8, 3, 3, padding="same")
    spec = make_spec(prob, "wgrad", target=Target("sm_75"), epilogue=Epilogue(bias=True))
    assert out.splitlines()[0] == f"conv wgrad: {prob.describe()}"
    for line in spec.plan.explain().splitlines():
        assert "  " + line in out.splitlines()


def test_plan_groups_is_depthwise_and_matches_the_planner(cli):
    """--groups G goes into the ConvProblem: groups = C plans the depthwise kind for each pass."""
    status, out, err = cli("plan", "-n", "2", "-h", "16", "-w", "16", "-c", "32", "-k", "32", "-r", "3", "-s", "3",
                           "--padding", "1", "--groups", "32", "--json")
    assert status == 0 and err == ""
    prob = ConvProblem.create(2, 16, 16, 32, 32, 3, 3, padding=1, groups=32)
    rows = json.loads(out)
    assert [r["pass"] for r in rows] == [p.value for p in Pass]
    for r in rows:
        spec = make_spec(prob, r["pass"], epilogue=default_epilogue(Pass(r["pass"])))
        assert r["problem"] == prob.as_dict() and r["problem"]["groups"] == 32
        assert r["plan"] == spec.plan.as_dict() and r["key"] == spec.key and "depthwise" in r["plan"]
        assert any("depthwise" in why for why in r["reasons"])
    status, out, err = cli("plan", "-n", "2", "-h", "16", "-w", "16", "-c", "32", "-k", "32", "-r", "3", "-s", "3",
                           "--padding", "1", "--groups", "32", "--pass", "fprop")
    assert status == 0 and out.splitlines()[0] == f"conv fprop: {prob.describe()}" and "depthwise" in out


def test_emit_groups_writes_the_depthwise_kernels(cli, tmp_path):
    out = tmp_path / "dw"
    status, _, err = cli("emit", "-n", "2", "-h", "16", "-w", "16", "-c", "32", "-k", "64", "-r", "3", "-s", "3",
                         "--padding", "1", "--groups", "32", "-q", "-o", str(out))
    assert status == 0 and err == ""
    prob = ConvProblem.create(2, 16, 16, 32, 64, 3, 3, padding=1, groups=32)
    entries = read_manifest(out)
    assert sorted(e["file"] for e in entries) == sorted(f"conv.{p.value}.cu" for p in Pass)
    for e in entries:
        pass_ = Pass(e["spec"]["pass"])
        spec = make_spec(prob, pass_, target=Target("sm_90"), epilogue=default_epilogue(pass_))
        assert (out / e["file"]).read_text() == emit(spec).source and e["key"] == spec.key
        assert e["spec"]["geometry"]["groups"] == 32 and "depthwise" in e["spec"]["plan"]


# --------------------------------------------------------------------------- errors


SHAPE = ["-n", "1", "-h", "8", "-w", "8", "-c", "4", "-k", "4", "-r", "3", "-s", "3"]

ERRORS = {
    "unknown-suite": (["emit", "--suite", "nope"], "unknown suite 'nope'"),
    "h=0": (["emit", "-n", "1", "-h", "0", "-w", "8", "-c", "4", "-k", "4", "-r", "3", "-s", "3"], "h must be >= 1, got 0"),
    "negative-n": (["emit", "-n", "-1", *SHAPE[2:]], "n (batch size) must be >= 0, got -1"),
    "hip-backend-cuda-arch": (["emit", "--suite", "cifar-vgg", "--backend", "hip", "--arch", "sm_90"],
                              "--arch sm_90 is a cuda target, not hip"),
    "cuda-backend-hip-arch": (["emit", "--suite", "cifar-vgg", "--backend", "cuda", "--arch", "gfx942"],
                              "--arch gfx942 is a hip target, not cuda"),
    "missing-shape-flags": (["emit", "-n", "1", "-h", "8"], "missing -w -c -k -r -s"),
    "no-shape-at-all": (["plan"], "give --suite NAME or a full shape"),
    "suite-plus-shape": (["emit", "--suite", "cifar-vgg", "-n", "4"], "give either --suite or a single shape"),
    "same-with-stride": (["emit", *SHAPE, "--padding", "same", "--stride", "2"], "padding='same' needs stride 1"),
    "same-even-filter": (["emit", *SHAPE[:10], "-r", "2", "-s", "2", "--padding", "same"], "even dilated filter"),
    "bad-padding": (["emit", *SHAPE, "--padding", "1,2,3"], "--padding: expected N or H,W, got '1,2,3'"),
    "bad-stride": (["emit", *SHAPE, "--stride", "x"], "argument --stride: expected N or H,W, got 'x'"),
    "zero-stride": (["plan", *SHAPE, "--stride", "0"], "stride (height) must be >= 1, got 0"),
    "bad-sm-count": (["plan", *SHAPE, "--sm-count", "0"], "sm_count must be >= 1, got 0"),
    "unknown-arch": (["plan", *SHAPE, "--arch", "sm_70"], "argument --arch: invalid choice: 'sm_70'"),
    "unknown-command": (["frobnicate"], "invalid choice: 'frobnicate'"),
    # a grouping that divides neither channel count: the IR's message, not a traceback
    "groups-not-dividing-k": (["emit", *SHAPE[:6], "-c", "64", "-k", "6", *SHAPE[10:], "--groups", "4"],
                              "groups=4 must divide k=6"),
    "groups-not-dividing-c": (["plan", *SHAPE, "--groups", "3"], "groups=3 must divide c=4"),
    "groups-zero": (["plan", *SHAPE, "--groups", "0"], "groups must be >= 1, got 0"),
    "groups-not-int": (["plan", *SHAPE, "--groups", "x"], "argument --groups: invalid int value: 'x'"),
    "groups-with-suite": (["plan", "--suite", "convnext-dw", "--groups", "96"], "--groups goes with a single shape"),
    "no-command": ([], "the following arguments are required: command"),
}


@pytest.mark.parametrize("args, message", ERRORS.values(), ids=ERRORS.keys())
def test_bad_input_is_one_line_and_status_2(cli, tmp_path, args, message):
    out_dir = tmp_path / "out"
    if args and args[0] == "emit":
        args = [*args, "-o", str(out_dir)]
    status, out, err = cli(*args)
    assert status == 2
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("convgen: error: ")
    assert message in lines[0]
    assert out == ""
    assert not out_dir.exists()  # nothing written, not even the folder


def test_emit_requires_an_output_folder(cli):
    status, _, err = cli("emit", "--suite", "cifar-vgg")
    assert status == 2 and err.startswith("convgen: error: ") and len(err.splitlines()) == 1
    assert "-o/--output" in err


def test_unwritable_output_is_an_error_not_a_traceback(cli, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    status, _, err = cli("emit", "--suite", "cifar-vgg", "-o", str(blocker / "sub"))
    assert status == 2 and "Traceback" not in err
    assert len(err.splitlines()) == 1 and err.startswith("convgen: error: ")


def test_help_is_status_0(cli):
    status, out, _ = cli("emit", "--help")
    assert status == 0 and "--suite" in out and "--padding" in out
