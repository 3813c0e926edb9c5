"""`convgen sass` and the SASS the shipped plans compile to, checked without a GPU.

Issue 6's checklist before spending GPU time: HMMA in the main loop, 16-byte loads, no
local-memory spills. Here it is a gate on every suite's shipped H200 plan, read from
NVRTC's cubins with cuobjdump (the cuda12/cuda13 extras' nvidia-cuda-cuobjdump/-nvdisasm wheels).
"""

from __future__ import annotations

import dataclasses
import functools
import multiprocessing
import os
import sys
from concurrent.futures import ProcessPoolExecutor

import pytest

from convgen import tuning_db
from convgen.tools import tune
from convgen.cli import main
from convgen.emit import emit
from convgen.ir import Epilogue, Pass, Target
from convgen.planner import make_spec
from convgen.footprint import halo_path
from convgen.mainloop import TmaHalo
from convgen.tools.sass import find_cuobjdump, kernel_sass, read_cubin, source_sass
from convgen.suites import SUITES

CUOBJDUMP = find_cuobjdump()
needs_cuobjdump = pytest.mark.skipif(
    CUOBJDUMP is None, reason="no cuobjdump: install the cuda13 or cuda12 extra (nvidia-cuda-cuobjdump, nvidia-cuda-nvdisasm)")

H200 = "NVIDIA H200"
# The candidate sweeps below compile some 590 kernels (about 5 CPU-minutes of NVRTC). CI
# checks every other candidate of each layer and pass, so each still meets several plans
# of every kind; CONVGEN_SASS_ALL=1 checks them all (run it when the planner's candidates
# or the templates change).
SASS_ALL = os.environ.get("CONVGEN_SASS_ALL", "") not in ("", "0")


def _every_other(plans: list) -> list:
    """Every other plan, counted per (layer, pass), so no layer's or pass's sweep is left out."""
    return plans if SASS_ALL else plans[::2]
SHIPPED = [(suite, layer, pass_) for suite in ("cifar-resnet", "cifar-vgg", "resnet50") for layer in SUITES[suite] for pass_ in Pass]


def _shipped_spec(layer, pass_):
    """The kernel convgen.conv2d & co. run on an H200 for this layer: the shipped tuned plan
    (the planner's where the database has none) and the runtime's default
    epilogue (bias in fprop, db in wgrad)."""
    target = Target("sm_90")
    tuned = tuning_db.lookup(H200, layer.problem.geometry, pass_, "float16", target.arch)
    return make_spec(layer.problem, pass_, target=target, epilogue=Epilogue(bias=pass_ is not Pass.DGRAD), plan_=tuned)


def _candidate_spec(layer, pass_, plan):
    """A tuning candidate's kernel as `convgen tune` times it (bias in fprop)."""
    return make_spec(layer.problem, pass_, target=Target("sm_90"), epilogue=Epilogue(bias=pass_ is Pass.FPROP), plan_=plan)


_SASS: dict[str, dict] = {}  # emitted source -> its kernels' SASS, read ahead by _read_ahead


def _main_sass(spec):
    src = emit(spec)
    kernels = _SASS.get(src.source) or kernel_sass(src, CUOBJDUMP)
    return kernels[src.main.kernel]


@pytest.fixture(scope="module", autouse=True)
def _read_ahead(request):
    """Compile and read back, across the CPUs, every kernel the selected tests of this module
    check: NVRTC and cuobjdump use one CPU each, and one test at a time left the rest idle."""
    if CUOBJDUMP is None:
        return
    sources: dict[str, str] = {}
    for item in request.session.items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if item.module is not sys.modules[__name__] or "layer" not in params:
            continue  # (the tests of hand-built layers compile their own)
        spec = (_candidate_spec(params["layer"], params["pass_"], params["plan"]) if "plan" in params
                else _shipped_spec(params["layer"], params["pass_"]))
        src = emit(spec)
        sources[src.source] = src.compile_arch
    if len(sources) < 2 or (os.cpu_count() or 1) < 2:
        return
    read = functools.partial(source_sass, cuobjdump=CUOBJDUMP)
    with ProcessPoolExecutor(max_workers=os.cpu_count(), mp_context=multiprocessing.get_context("spawn")) as pool:
        _SASS.update(zip(sources, pool.map(read, sources, sources.values(), chunksize=4)))


@needs_cuobjdump
@pytest.mark.parametrize("suite, layer, pass_", SHIPPED, ids=[f"{s}/{l.name}/{p.value}" for s, l, p in SHIPPED])
def test_shipped_plans_use_tensor_cores_16_byte_copies_and_no_spills(suite, layer, pass_):
    spec = _shipped_spec(layer, pass_)
    k = _main_sass(spec)
    assert k.count("HMMA") + k.count("HGMMA") > 0, "no tensor-core MMA in the kernel"
    p = spec.plan
    if p.tma:  # the copy engine moves both operands (im2col and tiled), warpgroup MMAs multiply
        assert k.count("UTMALDG") >= 2 and k.count("LDGSTS") == 0 and k.count("HGMMA") > 0, k.opcodes
        assert k.local == 0, f"{k.local} local-memory accesses (spills) with {k.registers} registers"
    elif min(p.vec_a, p.vec_b) >= 8:  # both operands gathered 16 bytes at a time by cp.async
        assert k.count("LDGSTS", "128") == k.count("LDGSTS") > 0, k.opcodes
        assert k.local == 0, f"{k.local} local-memory accesses (spills) with {k.registers} registers"


PACKED = [(layer, pass_) for layer in SUITES["resnext50-grouped"] for pass_ in Pass]


@needs_cuobjdump
@pytest.mark.parametrize("grouped_layer, grouped_pass", PACKED, ids=[f"{l.name}/{p.value}" for l, p in PACKED])
def test_packed_grouped_kernels_use_tensor_cores_the_copy_engine_and_no_spills(grouped_layer, grouped_pass):
    """The kernel a ResNeXt layer runs on an H200 once group_pack has packed its groups: the
    grouped TMA kernels (fprop and wgrad in slabs of one box) copy through the tensor maps and
    multiply with warpgroup MMAs; every kernel uses tensor cores and spills nothing."""
    from convgen.group_pack import kernel_problem

    target = Target("sm_90")
    kp = kernel_problem(grouped_layer.problem, grouped_pass, "float16", target)
    spec = make_spec(kp, grouped_pass, target=target, epilogue=Epilogue(bias=grouped_pass is not Pass.DGRAD))
    k = _main_sass(spec)
    assert k.count("HMMA") + k.count("HGMMA") > 0, "no tensor-core MMA in the kernel"
    if spec.plan.tma:
        assert k.count("UTMALDG") >= 2 and k.count("LDGSTS") == 0 and k.count("HGMMA") > 0, k.opcodes
    assert k.local == 0, f"{k.local} local-memory accesses (spills) with {k.registers} registers"


def _halo_plans():
    out = []
    for suite in ("cifar-resnet", "cifar-vgg"):
        for layer in SUITES[suite]:
            for pass_ in (Pass.FPROP, Pass.DGRAD):
                for p in _every_other([p for p in tune.candidates(layer.problem, pass_, Target("sm_90")) if p.halo]):
                    out.append(pytest.param(layer, pass_, p, id=f"{layer.name}/{pass_.value}/{p.explain().splitlines()[0]}"))
    return out


HALO = _halo_plans()


def _pointwise_plans():
    out = []
    for suite in ("mobilenetv2-pw", "efficientnet-b0-pw", "resnet50"):
        for layer in SUITES[suite]:
            for pass_ in (Pass.FPROP, Pass.DGRAD):
                plans = [p for p in tune.candidates(layer.problem, pass_, Target("sm_90"))
                         if layer.problem.r * layer.problem.s == 1 and p.halo]
                for p in _every_other(plans):
                    out.append(pytest.param(layer, pass_, p, id=f"{suite}/{layer.name}/{pass_.value}/{p.brief()}"))
    return out


POINTWISE = _pointwise_plans()


@needs_cuobjdump
@pytest.mark.parametrize("layer, pass_, plan", POINTWISE)
def test_pointwise_tile_candidates_use_tensor_cores_16_byte_copies_and_no_spills(layer, pass_, plan):
    """tune's multi-tile flat candidates for 1x1 layers (candidates._pointwise_tile_candidates):
    the pixels arrive by 16-byte cp.async, the MMAs are tensor-core ones, and no warp's
    accumulators spill (256-row tiles of 240 or 256 columns did: POINTWISE_MAX_WARP_FRAGMENTS)."""
    assert plan.tiles > 1
    k = _main_sass(_candidate_spec(layer, pass_, plan))
    assert k.count("HMMA") > 0 and k.count("LDGSTS", "128") == k.count("LDGSTS") > 0, k.opcodes
    assert k.local == 0, f"{k.local} local-memory accesses (spills) with {k.registers} registers"


@needs_cuobjdump
@pytest.mark.parametrize("layer, pass_, plan", HALO)
def test_halo_candidates_use_tensor_cores_16_byte_copies_and_no_spills(layer, pass_, plan):
    """The halo path's tuning candidates.  "taps": every tap's MMAs read the staged halo, and
    the halo arrives by 16-byte cp.async.  "im2col" (3-channel fprop): the gather reads the
    staged input halo from shared memory.  Neither spills."""
    spec = _candidate_spec(layer, pass_, plan)
    k = _main_sass(spec)
    g = spec.geometry
    if halo_path(plan, g, pass_) == "taps":
        assert k.count("HMMA") >= 2 * g.r * g.s, "fewer MMAs than taps"
        assert k.count("LDGSTS", "128") == k.count("LDGSTS") > 0, k.opcodes
    else:
        assert k.count("HMMA") > 0 and k.count("LDS") > 0, k.opcodes
    assert k.local == 0, f"{k.local} local-memory accesses (spills) with {k.registers} registers"


# resnet50's l1-3x3 (64 -> 64, fprop and dgrad) and unet's dec2-cat192 dgrad (64 into 192: three slices)
TMA_HALO = [pytest.param(layer, pass_, p, id=f"{layer.name}/{pass_.value}/{p.brief()}")
            for suite, name in (("resnet50", "l1-3x3"), ("unet", "dec2-cat192"))
            for layer in SUITES[suite] if layer.name == name for pass_ in (Pass.FPROP, Pass.DGRAD)
            for p in tune.candidates(layer.problem, pass_, Target("sm_90")) if isinstance(p.loop, TmaHalo)]


@needs_cuobjdump
@pytest.mark.parametrize("layer, pass_, plan", TMA_HALO)
def test_tma_halo_candidates_copy_each_halo_once_and_multiply_every_tap(layer, pass_, plan):
    """Every pitch and ring of the TMA halo loop, one slice and three: nine taps x four k16
    wgmmas, nine weight boxes and one halo box (the copies in the producer's loop count
    once), no spills."""
    k = _main_sass(_candidate_spec(layer, pass_, plan))
    assert k.count("HGMMA") == 36 and k.count("UTMALDG") == 10 and k.count("LDGSTS") == 0, k.opcodes
    assert k.local == 0, f"{k.local} local-memory accesses (spills) with {k.registers} registers"


def _stream_k_plans():
    h200 = Target("sm_90", sm_count=132)
    return [pytest.param(layer, Pass.WGRAD, p, id=f"{suite}/{layer.name}/{p.brief()}")
            for suite, name in (("resnet50", "l4-3x3"), ("resnet50", "l4-1x1"), ("large", "vgg-conv4_2"))
            for layer in SUITES[suite] if layer.name == name
            for streamk in [[p for p in tune.candidates(layer.problem, Pass.WGRAD, h200)
                             if p.tma and p.loop.flags().persistent]]
            for p in (streamk[0], streamk[-1])]  # summed by a second kernel, and in the kernel (the twin, last)


@needs_cuobjdump
@pytest.mark.parametrize("db", [False, True], ids=["dw", "dw+db"])
@pytest.mark.parametrize("layer, pass_, plan", _stream_k_plans())
def test_stream_k_candidates_use_the_copy_engine_hgmma_and_no_spills(layer, pass_, plan, db):
    """Stream-K wgrad (its first candidate on three layers, summed by a second kernel, and its
    twin summed in the kernel), dW alone and with db: the main kernel copies with TMA and
    multiplies with wgmma, and neither it nor its reduction spills (db's warps keep to the
    producer warpgroup's 40 registers beside the walk; the grid form's accumulators stay in
    registers over its barrier)."""
    src = emit(make_spec(layer.problem, pass_, target=Target("sm_90"), epilogue=Epilogue(bias=db), plan_=plan))
    kernels = _SASS.get(src.source) or kernel_sass(src, CUOBJDUMP)
    k = kernels[src.main.kernel]
    assert (src.reduce is None) == (plan.split_reduce == "grid")
    red = kernels[src.reduce.kernel].local if src.reduce else 0
    assert k.count("HGMMA") > 0 and k.count("UTMALDG") > 0, k.opcodes
    assert k.local == 0 and red == 0, f"local-memory accesses: main {k.local}, reduction {red}"


def _sliced_plans():
    h200 = Target("sm_90", sm_count=132)  # candidates depend on the SM count: the H200's
    return [pytest.param(layer, pass_, p, id=f"{suite}/{layer.name}/{pass_.value}/{p.brief()}")
            for suite in ("cifar-resnet", "cifar-vgg", "resnet50") for layer in SUITES[suite]
            for pass_ in (Pass.FPROP, Pass.DGRAD)
            for p in _every_other([p for p in tune.candidates(layer.problem, pass_, h200) if p.warps_k > 1])]


@needs_cuobjdump
@pytest.mark.parametrize("layer, pass_, plan", _sliced_plans())
def test_sliced_k_candidates_use_tensor_cores_16_byte_copies_and_no_spills(layer, pass_, plan):
    """Every sliced-K plan `convgen tune` may pick for the suites on an H200."""
    spec = _candidate_spec(layer, pass_, plan)
    k = _main_sass(spec)
    assert k.count("HMMA") > 0, "no tensor-core MMA in the kernel"
    assert k.count("LDGSTS", "128") == k.count("LDGSTS") > 0, k.opcodes
    assert k.local == 0, f"{k.local} local-memory accesses (spills) with {k.registers} registers"


def _wgmma_plans():
    h200 = Target("sm_90", sm_count=132)
    return [pytest.param(layer, pass_, p, id=f"{suite}/{layer.name}/{pass_.value}/{p.brief()}")
            for suite, names in (("cifar-vgg", ("conv3",)), ("resnet50", ("l3-3x3", "l1-1x1b", "l4-1x1")))
            for layer in SUITES[suite] if layer.name in names
            for pass_ in (Pass.FPROP, Pass.DGRAD)
            for p in _every_other([p for p in tune.candidates(layer.problem, pass_, h200, wgmma=True) if p.wgmma])]


@needs_cuobjdump
@pytest.mark.parametrize("layer, pass_, plan", _wgmma_plans())
def test_wgmma_candidates_use_hgmma_16_byte_copies_and_no_spills(layer, pass_, plan):
    """wgmma candidates compile (sm_90a) to warpgroup MMAs and no WMMA, stage by 16-byte
    cp.async, and do not spill."""
    spec = _candidate_spec(layer, pass_, plan)
    k = _main_sass(spec)
    assert k.count("HGMMA") > 0 and k.count("HMMA") == 0, k.opcodes
    if plan.block_k // 16 * (plan.block_m // (plan.warps_m // 4) // 64) >= 4:
        # A step's MMAs issue back to back: ptxas did not serialize them (a wait after each).
        assert k.count("WARPGROUP", "DEPBAR") < k.count("HGMMA"), k.opcodes
    assert k.count("LDGSTS", "128") == k.count("LDGSTS") > 0, k.opcodes
    assert k.local == 0, f"{k.local} local-memory accesses (spills) with {k.registers} registers"


FPROP_DGRAD = [(s, l, p) for s, l, p in SHIPPED if p is not Pass.WGRAD]


@needs_cuobjdump
def test_epilogue_stores_are_16_bytes_wide():
    """NVVM splits a uint4 store of eight converted fp16 values into four 4-byte STG.E; the
    epilogue's PTX st.global.v4 must stay one STG.E.128."""
    split = []
    for suite, layer, pass_ in FPROP_DGRAD:
        spec = _shipped_spec(layer, pass_)
        k = _main_sass(spec)
        if spec.geometry.gemm(pass_, 1).n % 8 == 0 and k.count("STG", "128") != k.count("STG"):
            split.append(f"{suite}/{layer.name}/{pass_.value}")
    assert not split, f"narrower than 16-byte output stores in {split}"


@needs_cuobjdump
def test_read_cubin_counts_mmas_registers_and_stack():
    from convgen.compile import compile_binary
    from test_compile import WMMA_SRC  # one warp, one 16x16x16 WMMA

    kernels = read_cubin(compile_binary(WMMA_SRC, arch="sm_90"), CUOBJDUMP)
    k = kernels["wmma16"]
    assert k.count("HMMA") == 2  # m16n16k16 = two m16n8k16 MMAs
    assert k.registers > 0 and k.stack == 0 and k.local == 0
    assert k.total > k.count("HMMA")


@needs_cuobjdump
def test_cli_reports_one_row_per_kernel(capsys):
    assert main(["sass", "-n", "2", "-h", "8", "-w", "8", "-c", "16", "-k", "32", "-r", "3", "-s", "3",
                 "--padding", "1"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].split()[:4] == ["layer", "pass", "plan", "regs"]
    assert [ln.split()[1] for ln in lines[1:]] == ["fprop", "dgrad", "wgrad"]
    hmma = lines[0].split().index("HMMA")
    assert all(int(ln.split()[hmma + 3]) > 0 for ln in lines[1:])  # plan takes 4 columns


@needs_cuobjdump
def test_cli_compiles_the_kernels_that_run(capsys):
    """A stem's wgrad runs on its channels padded to 4 and a grouped fprop on its groups
    packed (convgen/channel_pad.py, group_pack.py): the table reads those kernels, as
    `convgen plan` explains them, not the unpadded ones convgen.conv2d never launches."""
    assert main(["sass", "-n", "64", "-h", "224", "-w", "224", "-c", "3", "-k", "64", "-r", "7", "-s", "7",
                 "--stride", "2", "--padding", "3", "--pass", "wgrad", "--no-bias"]) == 0
    row = capsys.readouterr().out.strip().splitlines()[1]
    assert "C4" in row.split() and " v8/4 " in row  # 8-byte runs of the padded channels
    assert main(["sass", "--suite", "resnext50-grouped", "--pass", "fprop"]) == 0
    rows = capsys.readouterr().out.strip().splitlines()[1:]
    assert rows and all(" G" in ln.split(" k1 ")[1] for ln in rows)


def test_cli_refuses_hip_targets(capsys):
    assert main(["sass", "--suite", "cifar-resnet", "--arch", "gfx1201"]) == 2
    assert "CUDA cubins" in capsys.readouterr().err


def test_cli_without_cuobjdump_says_what_to_install(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("CONVGEN_CUOBJDUMP", str(tmp_path / "missing"))
    assert main(["sass", "--suite", "cifar-resnet", "--pass", "fprop"]) == 1
    assert "cuda13 or cuda12 extra" in capsys.readouterr().err


@needs_cuobjdump
@pytest.mark.parametrize("probe, want", [
    ("wgmma_probe.py", "HGMMA x1"),
    ("wgmma_row_offset_probe.py", "HGMMA x1"),
    ("tma_halo_probe.py", "HGMMA x36, UTMALDG x10"),  # 9 taps x 4 k16 steps; 9 weight boxes and the halo
    # the pipelined halo loop: the same 36 wgmmas a tile, the 9 weight boxes and one halo box a tile
    ("tma_halo_loop_probe.py", "HGMMA x36, UTMALDG x10"),
])
def test_wgmma_probes_compile_to_hgmma(probe, want):
    """The wgmma probes (run on the GPU before a new wgmma use enters the templates) still
    compile for sm_90a, and their MMAs are warpgroup HGMMAs, not HMMAs."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    path = root / "benchmarks" / "probes" / probe
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])))
    out = subprocess.run([sys.executable, str(path), "--compile"], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert want in out.stdout, out.stdout


@needs_cuobjdump
def test_cli_names_the_tuned_plans(capsys):
    """ResNet-50's l4-1x1 wgrad ships a tuned plan for the H200; the table must say so."""
    assert main(["sass", "--suite", "resnet50", "--pass", "wgrad", "--tuned", "NVIDIA H200"]) == 0
    row = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("l4-1x1"))
    tuned = tuning_db.lookup(H200, next(l for l in SUITES["resnet50"] if l.name == "l4-1x1").problem.geometry,
                             Pass.WGRAD, "float16", "sm_90")
    assert tuned is not None and f"{tuned.layout()} tuned" in row


def test_tuned_for_a_gpu_with_no_database_says_so(capsys, monkeypatch, tmp_path):
    """`--tuned` naming a GPU no database covers is a usage error, not a silent fall-back
    to the planner's plans (issue 20)."""
    monkeypatch.setenv("CONVGEN_CACHE_DIR", str(tmp_path))
    assert main(["sass", "--suite", "cifar-vgg", "--pass", "dgrad", "--tuned", "NVIDIA A100"]) == 2
    err = capsys.readouterr().err
    assert "no tuning database has plans for 'NVIDIA A100'" in err and "nvidia-h200" in err


# wgrad layers whose x is gathered one channel at a time (C odd; K = 33 is odd too, so dy
# as well): with 4 warps of 8 fragments their default plans spilled 72-128 bytes a thread.
# With K = 27 (a 32-row tile) both operands' one-channel accesses, 40 a thread and step on 4
# warps, held 254-255 registers whatever the warp tile and spilled in bf16 (sm_80: 26 accesses).
SCALAR_WGRAD = [(17, 33, 3, "float16", "sm_90"), (33, 64, 3, "float16", "sm_90"), (255, 33, 1, "float16", "sm_90"),
                (255, 64, 3, "float16", "sm_90"), (63, 27, 5, "bfloat16", "sm_80"), (33, 27, 3, "float16", "sm_90")]


@needs_cuobjdump
@pytest.mark.parametrize("c, k, f, dtype, arch", SCALAR_WGRAD,
                         ids=[f"c{c}-k{k}-{f}x{f}-{d}-{a}" for c, k, f, d, a in SCALAR_WGRAD])
def test_scalar_gather_wgrad_defaults_do_not_spill(c, k, f, dtype, arch):
    """The planner gives such a tile 8 warps (planner.CROWDED_FRAGMENTS, REGISTER_GATHER_ACCESSES):
    no local memory."""
    from convgen.ir import ConvProblem

    problem = ConvProblem(40, 36, c, k, f, f, 1, f // 2, n=32)
    spec = make_spec(problem, Pass.WGRAD, target=Target(arch), epilogue=Epilogue(bias=True, out_dtype=dtype),
                     in_dtype=dtype, mma_dtype=dtype)
    assert spec.plan.vec_b == 1
    k_ = _main_sass(spec)
    assert k_.count("HMMA") > 0 and k_.local == 0 and k_.stack == 0, (
        f"{k_.local} local-memory accesses, {k_.stack}-byte stack with {k_.registers} registers ({spec.plan.brief()})")


# fprop and dgrad whose gathers move two channels at a time (C or K twice an odd number): on a
# 64-deep step a 128x64 tile of 4 warps held 255 registers and spilled (110-158 local-memory
# accesses); they keep the 32-deep step (planner.WIDE_STEP_VEC).
TWO_CHANNEL = [(Pass.FPROP, 226, 64, 3), (Pass.FPROP, 230, 35, 5), (Pass.DGRAD, 42, 254, 3), (Pass.FPROP, 266, 17, 5)]


@needs_cuobjdump
@pytest.mark.parametrize("pass_, c, k, f", TWO_CHANNEL, ids=[f"{p.value}-c{c}-k{k}-{f}x{f}" for p, c, k, f in TWO_CHANNEL])
def test_two_channel_gathers_do_not_spill(pass_, c, k, f):
    from convgen.ir import ConvProblem

    problem = ConvProblem(40, 44, c, k, f, f, 1, f // 2, n=64)
    spec = make_spec(problem, pass_, target=Target("sm_90"), epilogue=Epilogue())
    assert min(spec.plan.vec_a, spec.plan.vec_b) == 2 and not spec.plan.tma, spec.plan.brief()
    k_ = _main_sass(spec)
    assert k_.count("HMMA") > 0 and k_.local == 0, (
        f"{k_.local} local-memory accesses with {k_.registers} registers ({spec.plan.brief()})")


# Depthwise layers with several filters a channel, whose default blocks once had more threads
# than their registers allowed (65536 / threads): 512-thread fprop blocks of 32 filters a
# channel, 896- and 960-thread wgrad blocks of 7x7 and 5x5 filters (depthwise.stencil_registers,
# depthwise.WGRAD_REG_OVERHEAD).
MULTIPLIED = [(Pass.FPROP, 8, 32, 3), (Pass.FPROP, 64, 32, 7), (Pass.WGRAD, 40, 2, 7), (Pass.WGRAD, 12, 2, 7),
              (Pass.WGRAD, 8, 4, 7), (Pass.WGRAD, 64, 16, 5), (Pass.WGRAD, 8, 24, 3)]


@needs_cuobjdump
@pytest.mark.parametrize("pass_, c, m, f", MULTIPLIED, ids=[f"{p.value}-c{c}-m{m}-{f}x{f}" for p, c, m, f in MULTIPLIED])
def test_depthwise_multiplier_defaults_do_not_spill(pass_, c, m, f):
    from convgen.ir import ConvProblem

    problem = ConvProblem(32, 32, c, c * m, f, f, 1, f // 2, 1, c, n=8)
    spec = make_spec(problem, pass_, target=Target("sm_90"), epilogue=Epilogue())
    k_ = _main_sass(spec)
    assert k_.local == 0, f"{k_.local} local-memory accesses with {k_.registers} registers ({spec.plan.brief()})"


# Stride-1 layers of N <= 64 that the halo rule gave spilling tiles (small_layer_rules): fp16
# dgrads on 6x6 and 7x7 filters and bf16 on 5x5 (a halo tile's registers grow with its taps:
# MAX_HALO_TAPS), and bf16 3x3 dgrads of C = 32 on warps of 8 fragments (BF16_HALO_FRAGMENTS).
CROWDED_HALO = [(Pass.DGRAD, 3, 64, 6, "float16"), (Pass.DGRAD, 32, 32, 7, "float16"),
                (Pass.FPROP, 32, 32, 5, "bfloat16"), (Pass.DGRAD, 32, 64, 3, "bfloat16")]


@needs_cuobjdump
@pytest.mark.parametrize("pass_, c, k, f, dtype", CROWDED_HALO,
                         ids=[f"{p.value}-c{c}-k{k}-{f}x{f}-{d}" for p, c, k, f, d in CROWDED_HALO])
def test_narrow_stride1_layers_do_not_spill(pass_, c, k, f, dtype):
    from convgen.ir import ConvProblem

    spec = make_spec(ConvProblem(56, 56, c, k, f, f, 1, f // 2, n=16), pass_, target=Target("sm_90"),
                     epilogue=Epilogue(out_dtype=dtype), in_dtype=dtype)
    k_ = _main_sass(spec)
    assert k_.count("HMMA") > 0 and k_.local == 0, (
        f"{k_.local} local-memory accesses with {k_.registers} registers ({spec.plan.brief()})")


LONG_RUNS = [(suite, layer, pass_)
             for suite, layer in (("mobilenetv2-dw", "dw192-28px"), ("mobilenetv2-dw", "dw192-28px-s2"),
                                  ("convnext-dw", "dw96-56px"))
             for pass_ in (Pass.FPROP, Pass.DGRAD)]


@needs_cuobjdump
@pytest.mark.parametrize("suite, name, pass_", LONG_RUNS, ids=[f"{s}/{n}/{p.value}" for s, n, p in LONG_RUNS])
def test_depthwise_long_runs_hold_fewer_registers_and_fewer_conversions(suite, name, pass_):
    """Runs of 8 outputs over 4 channels (depthwise.long_run: the 7x7 default, and the second
    candidate of `convgen tune` and tuning on first use on 3x3 filters): its reason is fewer
    staged-column reads and conversions per sum at no more registers, so on sm_90 it holds no
    more registers than runs of 4 over 8 channels, no local memory, as many FFMA and fewer
    HADD2 conversions."""
    from convgen.candidates import candidates

    problem = next(l.problem for l in SUITES[suite] if l.name == name)
    stencils = [p for p in candidates(problem, pass_, Target("sm_90")) if p.loop.out_rows == 1 and not p.loop.mma]
    runs = {(p.vec_a, p.loop.cols): p for p in stencils[:2]}
    base, long_run = runs[8, 4], runs[4, 8]  # the stencil's default and its other run, first and second either way
    sass = [_main_sass(make_spec(problem, pass_, target=Target("sm_90"), epilogue=Epilogue(bias=False), plan_=p))
            for p in (base, long_run)]
    assert sass[1].local == 0 and sass[1].registers <= sass[0].registers, (sass[0].registers, sass[1].registers)
    assert sass[1].count("FFMA") == sass[0].count("FFMA") and sass[1].count("HADD2") < sass[0].count("HADD2")


WIDE_RUNS = [("convnext-dw", name, pass_) for name in ("dw96-56px", "dw768-7px") for pass_ in (Pass.FPROP, Pass.DGRAD)]


@needs_cuobjdump
@pytest.mark.parametrize("suite, name, pass_", WIDE_RUNS, ids=[f"{s}/{n}/{p.value}" for s, n, p in WIDE_RUNS])
def test_depthwise_wide_runs_convert_less_per_fma_without_spilling(suite, name, pass_):
    """The third depthwise candidate on 7x7 filters (runs of 8 over 8 channels on a tile twice as
    tall, depthwise_variations._wide_run): its reason is fewer half-to-float conversions per FFMA
    in the same threads, so on sm_90 its SASS keeps no local memory and converts less per FFMA
    than the runs of 4 over 8 channels it doubles."""
    from convgen.candidates import candidates

    problem = next(l.problem for l in SUITES[suite] if l.name == name)
    stencils = [p for p in candidates(problem, pass_, Target("sm_90")) if p.loop.out_rows == 1 and not p.loop.mma]
    runs = {(p.vec_a, p.loop.cols): p for p in stencils[:3]}
    base, wide = runs[8, 4], runs[8, 8]  # the runs of 4 over 8 channels it doubles
    assert (wide.vec_a, wide.loop.cols, wide.block_m, wide.warps) == (8, 8, 2 * base.block_m, base.warps)
    sass = [_main_sass(make_spec(problem, pass_, target=Target("sm_90"), epilogue=Epilogue(bias=False), plan_=p))
            for p in (base, wide)]
    assert sass[1].local == 0, sass[1].registers
    ratio = [s.count("HADD2") / s.count("FFMA") for s in sass]
    assert ratio[1] < 0.8 * ratio[0], ratio


HELD = [(suite, name) for suite, name in (("convnext-dw", "dw96-56px"), ("efficientnet-b0-dw", "dw480-14px-5x5"),
                                          ("mobilenetv2-dw", "dw192-28px-s2"))]


@needs_cuobjdump
@pytest.mark.parametrize("suite, name", HELD, ids=[f"{s}/{n}" for s, n in HELD])
def test_depthwise_held_filters_fit_registers_and_read_less_per_fma(suite, name):
    """The held-filter fprop candidates (depthwise_variations.held_filters) keep a 3x3, 5x5 or
    7x7 filter and their sums in registers: on sm_90 no local memory and at most 255
    registers (held_registers' bound), and, their reason, fewer half-to-float conversions and
    fewer shared-memory loads per FFMA than the stencil of one row a thread."""
    from convgen.candidates import candidates

    problem = next(l.problem for l in SUITES[suite] if l.name == name)
    plans = candidates(problem, Pass.FPROP, Target("sm_90"))
    held = [p for p in plans if p.loop.out_rows > 1]
    stencil = next(p for p in plans if p.loop.out_rows == 1 and not p.loop.mma)  # one row a thread (the default's or
    assert len(held) >= 3                                                         # what a held default replaced)
    sass = [_main_sass(make_spec(problem, Pass.FPROP, target=Target("sm_90"), epilogue=Epilogue(bias=False), plan_=p))
            for p in (stencil, *held)]
    base = sass[0]
    for p, k in zip(held, sass[1:]):
        assert k.local == 0 and k.registers <= 255, (p.brief(), k.registers, k.local)
        for op in ("HADD2", "LDS"):
            assert k.count(op) / k.count("FFMA") < base.count(op) / base.count("FFMA"), (p.brief(), op)


@needs_cuobjdump
@pytest.mark.parametrize("suite, name", HELD, ids=[f"{s}/{n}" for s, n in HELD])
def test_depthwise_mma_stencils_run_on_the_tensor_cores_without_spills(suite, name):
    """The mma.sync stencil candidates (depthwise_variations.mma_stencils), where the layer takes
    them (stride 1): a job's 8 channels by two 16 x 8 blocks unrolled, an HMMA and an ldmatrix
    (.x4, then .x2 for the second block's 8 more columns) each per block, channel and filter row,
    and one transposing ldmatrix for the planes; no local memory, in float16 and bfloat16."""
    from convgen.candidates import candidates

    problem = next(l.problem for l in SUITES[suite] if l.name == name)
    plans = [p for p in candidates(problem, Pass.FPROP, Target("sm_90")) if p.loop.mma]
    assert bool(plans) == (problem.stride == (1, 1))
    for p in plans:
        for dt in ("float16", "bfloat16"):
            plan = dataclasses.replace(p, read_a=dt, read_b=dt)
            k = _main_sass(make_spec(problem, Pass.FPROP, target=Target("sm_90"), in_dtype=dt,
                                     epilogue=Epilogue(bias=False, out_dtype=dt), plan_=plan))
            assert k.local == 0, (p.brief(), dt, k.registers)
            assert k.count("HMMA") == 16 * problem.r, (p.brief(), dt, k.opcodes)
            assert k.count("LDSM") == 16 * problem.r + 1 and k.count("LDSM", "2") == 8 * problem.r, (p.brief(), dt)


ROW_RUNS = [("convnext-dw", "dw96-56px"), ("efficientnet-b0-dw", "dw480-14px-5x5"), ("mobilenetv2-dw", "dw144-56px")]


@needs_cuobjdump
@pytest.mark.parametrize("suite, name", ROW_RUNS, ids=[f"{s}/{n}" for s, n in ROW_RUNS])
def test_depthwise_wgrad_row_runs_convert_and_load_less_per_fma_without_spilling(suite, name):
    """wgrad's runs of several dy rows (depthwise_wgrad.row_run): their reason is
    that each staged x row is read and converted once for every dy row it meets, so on sm_90
    they keep no local memory and issue fewer HADD2 conversions and fewer shared loads per FFMA
    than one row a thread, on 7x7 (where the default is one of them), 5x5 and 3x3 filters."""
    from convgen.candidates import candidates

    from convgen.depthwise_wgrad import plan_wgrad

    problem = next(l.problem for l in SUITES[suite] if l.name == name)
    runs = [p for p in candidates(problem, Pass.WGRAD, Target("sm_90", 132)) if p.loop.out_rows > 1]
    one_row = plan_wgrad(problem, Target("sm_90", 132), "float16", [], row_runs=False)  # (the default but on 7x7)
    assert runs
    sass = [_main_sass(make_spec(problem, Pass.WGRAD, target=Target("sm_90", 132), epilogue=Epilogue(bias=False),
                                 plan_=p)) for p in (one_row, *runs)]
    base = sass[0]
    for p, k in zip(runs, sass[1:]):
        assert k.local == 0, (p.brief(), k.registers, k.local)
        for op in ("HADD2", "LDS"):
            assert k.count(op) / k.count("FFMA") < base.count(op) / base.count("FFMA"), (p.brief(), op)
