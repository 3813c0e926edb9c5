"""convgen.emit: pure, deterministic rendering, and a KernelSource that agrees with its source.

What the launcher is told (kernel names, argument order and C types, block,
shared memory, grid) is checked against the emitted source itself, so a template
edit that drifts from emit.py fails here rather than as a garbage launch on a GPU.
What each backend and main loop puts in its source is tests/test_emit_loops.py's, on the
cases and helpers here.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import jinja2
import pytest

import convgen
from convgen.emit import KernelSource, _context, _environment, emit
from convgen.reduction import REDUCE_BLOCK
from convgen.resources import templates_dir
from convgen.ir import ConvProblem, Epilogue, Pass, Target
from convgen.spec import KernelSpec, Plan
from convgen.mainloop import Depthwise, HaloLdsm, HaloTile, Im2col, StagedHalo, TmaHalo, TmaWgmma, Wgmma
from convgen.planner import make_spec, plan
from convgen.footprint import smem_bytes
from convgen.suites import SUITES

ROOT = Path(__file__).resolve().parent.parent
C_TYPE = {"float16": "half_t", "float32": "float"}


def default_epilogue(pass_: Pass, **kw) -> Epilogue:
    return Epilogue(bias=pass_ is not Pass.DGRAD, **kw)


def cases():
    """(id, spec) over every suite layer and pass on a few targets, plus the epilogue/dtype variants."""
    out = []
    for suite, layers in SUITES.items():
        for layer in layers:
            for pass_ in Pass:
                for arch in ("sm_90", "sm_75", "gfx942", "gfx1201"):
                    spec = make_spec(layer.problem, pass_, target=Target(arch), epilogue=default_epilogue(pass_))
                    out.append((f"{suite}/{layer.name}/{pass_.value}/{arch}", spec))
    prob = SUITES["cifar-resnet"][0].problem  # C = 3: scalar fprop gather, split-K wgrad
    for pass_ in Pass:
        variants = {
            "in32": dict(in_dtype="float32"),
            "out32": dict(epilogue=default_epilogue(pass_, out_dtype="float32")),
            "scalar": dict(scalar=True),
            "in32-scalar": dict(in_dtype="float32", scalar=True),
            "nobias": dict(epilogue=Epilogue()),
        }
        if pass_ is Pass.FPROP:
            variants["relu"] = dict(epilogue=Epilogue(bias=True, relu=True))
            variants["relu-nobias"] = dict(epilogue=Epilogue(relu=True))
            variants["bias16"] = dict(epilogue=Epilogue(bias=True, bias_dtype="float16"))
            variants["residual-gelu"] = dict(epilogue=Epilogue(bias=True, gelu=True, residual=True))
        for name, kw in variants.items():
            for arch in ("sm_90", "sm_75"):
                out.append((f"cifar-resnet/conv1/{pass_.value}/{arch}/{name}", make_spec(prob, pass_, target=Target(arch), **kw)))
    # split-K on fprop and dgrad (the planner does not pick it for the suites): hand plans
    big = ConvProblem(8, 8, 64, 64, 3, 3, 1, 1, n=2)
    for pass_ in (Pass.FPROP, Pass.DGRAD):
        hand = Plan(64, 64, 32, 2, 2, 2, 8, 8, split_k=3)
        for epi in ({"relu": True, "bias": True}, {"bias": True, "bias_dtype": "float16"}, {},
                    {"residual": True, "relu": True, "out_dtype": "float32"}) \
                if pass_ is Pass.FPROP else ({},):
            out.append((f"split/{pass_.value}/{'-'.join(epi) or 'plain'}",
                        make_spec(big, pass_, epilogue=Epilogue(**epi), plan_=hand)))
    # the halo path (stride-1 fprop and dgrad; tuning candidates, never the planner's default):
    # an image narrower than the tile, dilation, asymmetric padding, split-K, fp32 output, HIP
    for prob, hand, arch in (
        (ConvProblem(8, 8, 64, 32, 3, 3, 1, 1, n=2), Plan(128, 32, 32, 4, 1, 3, 8, 8, loop=HaloTile(16)), "sm_90"),
        (ConvProblem(20, 36, 16, 24, 3, 2, 1, (2, 0), (2, 1), n=2), Plan(128, 32, 16, 2, 2, 2, 8, 8, split_k=2, loop=HaloTile(32)), "sm_90"),
        (ConvProblem(16, 16, 32, 64, 5, 5, 1, 2, n=2), Plan(64, 32, 16, 2, 2, 2, 8, 8, loop=HaloTile(16)), "sm_90"),
        (ConvProblem(16, 16, 16, 16, 3, 3, 1, 1, n=2), Plan(64, 16, 16, 4, 1, 2, 8, 8, loop=HaloTile(16)), "gfx1201"),
    ):
        for pass_ in (Pass.FPROP, Pass.DGRAD):
            fprop_epis = ({"bias": True, "relu": True}, {"out_dtype": "float32"}, {"bias": True, "bias_dtype": "float16"})
            for epi in fprop_epis if pass_ is Pass.FPROP else ({},):
                out.append((f"halo/{prob.describe()}/{pass_.value}/{arch}/{'-'.join(epi) or 'plain'}",
                            make_spec(prob, pass_, target=Target(arch), epilogue=Epilogue(**epi), plan_=hand)))
    # fprop of narrow-channel layers: the staged-halo im2col path, stride 1 and 2, 1 and 4 channels per access
    for prob, hand in ((ConvProblem(32, 32, 3, 32, 3, 3, 1, 1, n=2), Plan(256, 32, 32, 4, 1, 3, 1, 1, loop=StagedHalo(16))),
                       (ConvProblem(40, 44, 4, 16, 7, 7, 2, 3, n=1), Plan(128, 16, 32, 4, 1, 3, 4, 4, split_k=2, loop=StagedHalo(16)))):
        for arch in ("sm_90", "gfx1201"):
            out.append((f"halo/{prob.describe()}/fprop/{arch}/staged-im2col",
                        make_spec(prob, Pass.FPROP, target=Target(arch), epilogue=Epilogue(bias=True, relu=True), plan_=hand)))
    # several pixel tiles per block (one-step reductions): fprop with its epilogue, dgrad
    prob = ConvProblem(20, 36, 32, 24, 3, 3, 1, 1, n=3)
    for pass_, epi in ((Pass.FPROP, Epilogue(bias=True, relu=True)), (Pass.DGRAD, Epilogue())):
        out.append((f"halo-tiles/{prob.describe()}/{pass_.value}/sm_90",
                    make_spec(prob, pass_, epilogue=epi, plan_=Plan(256, 32, 32, 4, 1, 2, 8, 8, loop=HaloTile(16, 4)))))
    # dgrad of a 3-channel first layer: halo over K = 32 dy channels, weights one channel per access
    prob = ConvProblem(32, 32, 3, 32, 3, 3, 1, 1, n=2)
    for arch in ("sm_90", "gfx1201"):
        out.append((f"halo/{prob.describe()}/dgrad/{arch}/narrow-weights",
                    make_spec(prob, Pass.DGRAD, target=Target(arch), plan_=Plan(128, 16, 32, 4, 1, 2, 8, 1, loop=HaloTile(16)))))
    # sliced K: two and four warp grids per block, every pass, split-K on top, HIP; wgrad with db
    prob = ConvProblem(8, 8, 64, 128, 3, 3, 1, 1, n=2)
    for pass_ in Pass:
        for hand, arch in ((Plan(128, 64, 64, 2, 2, 3, 8, 8, loop=Im2col(2)), "sm_90"),
                           (Plan(64, 64, 64, 2, 2, 2, 8, 8, split_k=2, loop=Im2col(4)), "sm_90"),
                           (Plan(64, 64, 32, 2, 2, 2, 8, 8, loop=Im2col(2)), "gfx942")):
            out.append((f"sliced/{pass_.value}/{arch}/w{hand.warps_k}k{hand.split_k}",
                        make_spec(prob, pass_, target=Target(arch), epilogue=default_epilogue(pass_), plan_=hand)))
    # the TMA main loop (sm_90a fprop): two consumer warpgroups and one, with and without bias
    prob = ConvProblem(14, 14, 128, 96, 3, 3, 1, 1, n=2)
    for hand, epi in ((Plan(128, 96, 64, 8, 1, 4, 8, 8, loop=TmaWgmma()), Epilogue(bias=True, relu=True)),
                      (Plan(64, 64, 64, 4, 1, 3, 8, 8, loop=TmaWgmma()), Epilogue(out_dtype="float32"))):
        out.append((f"tma/{prob.describe()}/fprop/{hand.block_m}", make_spec(prob, Pass.FPROP, epilogue=epi, plan_=hand)))
    # 8-pixel-wide halo tiles (ldmatrix rows, raw mma.sync), one and several tiles per block
    for prob in (ConvProblem(8, 8, 64, 128, 3, 3, 1, 1, n=2), ConvProblem(7, 20, 32, 24, 3, 3, 1, 1, n=2)):
        for pass_ in (Pass.FPROP, Pass.DGRAD):
            out.append((f"ldsm/{prob.describe()}/{pass_.value}",
                        make_spec(prob, pass_, epilogue=default_epilogue(pass_), plan_=Plan(64, 32, 16, 4, 1, 3, 8, 8, loop=HaloLdsm(8)))))
    out.append(("ldsm-tiles/dgrad", make_spec(ConvProblem(8, 8, 32, 16, 3, 3, 1, 1, n=3), Pass.DGRAD,
                                              plan_=Plan(64, 16, 16, 4, 1, 2, 8, 8, loop=HaloLdsm(8, 2)))))
    # two and four whole 8x8 images stacked in one 128- or 256-row tile (footprint.halo_images)
    for pass_, hand in ((Pass.DGRAD, Plan(128, 64, 16, 4, 1, 3, 8, 8, loop=HaloLdsm(8))),
                        (Pass.FPROP, Plan(256, 64, 16, 8, 1, 3, 8, 8, loop=HaloLdsm(8)))):
        out.append((f"ldsm-stacked/{pass_.value}/{hand.block_m}",
                    make_spec(ConvProblem(8, 8, 64, 128, 3, 3, 1, 1, n=3), pass_, epilogue=default_epilogue(pass_), plan_=hand)))
    # wgmma: one and two warpgroups, split-K, strided dgrad's residue classes
    for prob in (ConvProblem(8, 8, 64, 128, 3, 3, 1, 1, n=2), ConvProblem(12, 12, 32, 48, 3, 3, 2, 1, n=2)):
        for pass_ in (Pass.FPROP, Pass.DGRAD):
            for hand in (Plan(128, 64, 64, 4, 1, 3, 8, 8, loop=Wgmma()), Plan(128, 128, 32, 8, 1, 4, 8, 8, split_k=2, loop=Wgmma())):
                out.append((f"wgmma/{prob.describe()}/{pass_.value}/{hand.brief().replace(' ', '_')}",
                            make_spec(prob, pass_, epilogue=default_epilogue(pass_), plan_=hand)))
    # the depthwise stencil with its filter held in registers (fprop): CUDA and HIP
    prob = ConvProblem(14, 14, 64, 64, 5, 5, 1, 2, groups=64, n=2)
    for arch, warps in (("sm_90", 2), ("gfx942", 1)):
        hand = Plan(64, 64, 16, warps, 1, 2, 4, 1, loop=Depthwise(8, 4, out_rows=4))
        out.append((f"depthwise-held/{prob.describe()}/fprop/{arch}",
                    make_spec(prob, Pass.FPROP, target=Target(arch), epilogue=Epilogue(bias=True, relu=True), plan_=hand)))
    # ... and on mma.sync (CUDA)
    out.append((f"depthwise-mma/{prob.describe()}/fprop/sm_90", make_spec(
        prob, Pass.FPROP, epilogue=Epilogue(bias=True, relu=True),
        plan_=Plan(256, 32, 16, 4, 1, 2, 8, 1, loop=Depthwise(16, 8, 0, 1, mma=True)))))
    return out


CASES = cases()
IDS = [c[0] for c in CASES]
# The implicit-GEMM kernels: the depthwise suites' stencils (groups > 1) have none of their
# tiles, fragments or gathers (tests/test_depthwise*.py test those).
GEMM_CASES = [c for c in CASES if c[1].geometry.groups == 1]
GEMM_IDS = [c[0] for c in GEMM_CASES]


@pytest.fixture(scope="module")
def sources() -> dict[str, KernelSource]:
    return {name: emit(spec) for name, spec in CASES}


def code_only(source: str) -> str:
    """The source without // and /* */ comments."""
    source = re.sub(r"/\*.*?\*/", "", source, flags=re.S)
    return re.sub(r"//[^\n]*", "", source)


def kernel_signatures(source: str) -> dict[str, tuple[str | None, list[str]]]:
    """extern "C" kernels: name -> (__launch_bounds__ argument, [parameter declarations])."""
    sigs = {}
    pattern = r'extern\s+"C"\s+__global__\s+void\s+(?:__launch_bounds__\(([^)]*)\)\s+)?(\w+)\s*\('
    for m in re.finditer(pattern, source):
        i = j = m.end()
        depth = 1
        while depth:
            depth += {"(": 1, ")": -1}.get(source[j], 0)
            j += 1
        params = [" ".join(p.split()) for p in source[i:j - 1].split(",")]
        sigs[m.group(2)] = (m.group(1), params)
    return sigs


def constant(source: str, name: str) -> int:
    """The value of `constexpr int NAME = value` (alone or in a comma list) in the code."""
    m = re.search(rf"constexpr\s+int\s+(?:\w+\s*=\s*[^,;]+,\s*)*{name}\s*=\s*(\d+)\s*[,;]", code_only(source))
    assert m, f"constexpr {name} not found in the source"
    return int(m.group(1))


# --------------------------------------------------------------------------- determinism


def test_same_spec_same_bytes_twice():
    for name, spec in CASES[::7]:
        a, b = emit(spec), emit(spec)
        assert a.source == b.source and a.source.encode() == b.source.encode(), name
        assert a == b and a.manifest_entry() == b.manifest_entry()


def test_equal_specs_built_separately_emit_the_same_bytes():
    for name, spec in CASES[::11]:
        twin = KernelSpec(dataclasses.replace(spec.geometry), spec.pass_.value, dataclasses.replace(spec.epilogue),
                          spec.in_dtype, Target(spec.target.arch, spec.target.sm_count), dataclasses.replace(spec.plan))
        assert twin == spec and emit(twin).source == emit(spec).source, name


def _digests_in_subprocess(seed: str) -> dict[str, str]:
    code = (
        "import hashlib, json, sys\n"
        "sys.path.insert(0, 'tests')\n"
        "from test_emit import CASES\n"
        "from convgen.emit import emit\n"
        "print(json.dumps({n: hashlib.sha256(emit(s).source.encode()).hexdigest() for n, s in CASES}))\n"
    )
    env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_same_bytes_in_fresh_processes_with_different_hash_seeds(sources):
    here = {n: hashlib.sha256(s.source.encode()).hexdigest() for n, s in sources.items()}
    a, b = _digests_in_subprocess("1"), _digests_in_subprocess("987654")
    assert a == b == here


def test_source_does_not_depend_on_the_batch():
    """A KernelSpec has no batch: problems that differ only in n make one spec and one source."""
    for suite, layers in SUITES.items():
        for layer in layers:
            for pass_ in Pass:
                p = plan(layer.problem, pass_)
                specs = [KernelSpec(layer.problem.with_batch(n), pass_, default_epilogue(pass_), "float16", Target(), p)
                         for n in (0, 1, 37, 256)]
                srcs = {emit(s).source for s in specs}
                assert len({s.key for s in specs}) == 1 and len(srcs) == 1, (suite, layer.name, pass_)


def test_equal_planned_specs_for_different_batches_emit_the_same_source():
    prob = SUITES["cifar-resnet"][1].problem  # fprop: the same plan for both batches
    a, b = make_spec(prob, "fprop"), make_spec(prob.with_batch(128), "fprop")
    assert a == b and a.key == b.key
    assert emit(a).source == emit(b).source


# --------------------------------------------------------------------------- header and names


@pytest.mark.parametrize("name, spec", CASES[::5], ids=IDS[::5])
def test_header_names_key_plan_and_version(name, spec, sources):
    src = sources[name].source
    lines = src.splitlines()
    assert lines[0].startswith("// Generated by convgen") and convgen.__version__ in lines[0]
    header = "\n".join(l for l in lines[:40] if l.startswith("//"))
    assert f"spec {spec.key}" in header
    assert spec.pass_.value in header and spec.target.arch in header
    head = spec.plan.explain().splitlines()[0]
    assert head in header  # the plan's summary line, verbatim
    # The reasons quote the batch the plan was sized for, which is not part of the kernel:
    # they go to the manifest and `convgen plan`, never into the (batch-independent) source.
    assert not any(reason in header for reason in spec.plan.reasons if "GEMM M=" in reason)


@pytest.mark.parametrize("name, spec", GEMM_CASES, ids=GEMM_IDS)
def test_kernels_are_extern_c_with_the_launch_contract(name, spec, sources):
    ks = sources[name]
    src = ks.source
    sigs = kernel_signatures(src)
    assert set(sigs) == set(ks.kernel_names), "exactly the kernels the launcher is told about"
    assert ks.main.kernel == spec.name
    assert ks.filename == f"{spec.name}.{'cu' if spec.target.backend == 'cuda' else 'hip'}"
    threads = spec.plan.warps * spec.target.warp_size
    assert ks.main.block == (threads, 1, 1)
    assert constant(src, "WARPS_M") == spec.plan.warps_m and constant(src, "WARPS_N") == spec.plan.warps_n
    assert constant(src, "WARP_SIZE") == spec.target.warp_size
    bounds, params = sigs[ks.main.kernel]
    assert bounds in ("THREADS", str(threads)) or (spec.plan.tma and bounds == "THREADS, 1")
    _check_params(spec, ks.main.args, params, reduce=False)
    assert ks.main.shared_mem == smem_bytes(spec.plan, spec.pass_, spec.target.warp_size, spec.geometry) <= spec.target.smem_limit
    if ks.main.stream_k:  # a one-wave grid, and its own reduction or its grid's barrier (tests/test_stream_k.py)
        assert ks.main.grid_z == 1 and spec.plan.split_k == 1 and ks.main.grid_blocks > 0
        if spec.plan.split_reduce == "grid":
            assert ks.reduce is None and ks.main.cooperative
        else:
            assert ks.reduce.kernel == spec.name + "_reduce" and not ks.main.cooperative
        return
    assert (ks.reduce is not None) == (spec.plan.split_k > 1) == (ks.main.grid_z > 1)
    if ks.reduce:
        assert ks.reduce.kernel == spec.name + "_reduce"
        bounds, params = sigs[ks.reduce.kernel]
        assert ks.reduce.block == REDUCE_BLOCK and bounds == "32 * RED_ROWS"
        assert constant(src, "RED_ROWS") == REDUCE_BLOCK[1] and REDUCE_BLOCK[0] == 32
        assert ks.reduce.shared_mem == 0
        # One block per run of outputs: the grid covers all M x N sums for any batch.
        for batch in (1, 3):
            gemm = spec.geometry.gemm(spec.pass_, batch)
            assert (ks.reduce.grid_x(batch) - 1) * ks.reduce.grid_m_tile < gemm.m * gemm.n <= ks.reduce.grid_x(batch) * ks.reduce.grid_m_tile
        ways, vec = constant(src, "RED_WAYS"), constant(src, "RED_V")
        assert ways == min(8, 1 << (spec.plan.split_k.bit_length() - 1)) and vec == (4 if gemm.n % 4 == 0 else 1)
        assert ks.reduce.grid_m_tile == 32 * vec * (REDUCE_BLOCK[1] // ways)
        assert constant(src, "SLICES") == spec.plan.split_k
        _check_params(spec, ks.reduce.args, params, reduce=True)


def _check_params(spec: KernelSpec, args: tuple[str, ...], params: list[str], *, reduce: bool) -> None:
    """Parameter i of the kernel is launch argument i, with the C type the runtime passes."""
    assert len(params) == len(args), (args, params)
    out_t = C_TYPE[spec.epilogue.out_dtype]
    ta, tb = C_TYPE[spec.plan.read_a], C_TYPE[spec.plan.read_b]
    a_name, b_name = {Pass.FPROP: ("x", "w"), Pass.DGRAD: ("dy", "w"), Pass.WGRAD: ("dy", "x")}[spec.pass_]
    out_name = {Pass.FPROP: "y", Pass.DGRAD: "dx", Pass.WGRAD: "dw"}[spec.pass_]
    expected = {
        a_name: f"const {ta}*", b_name: f"const {tb}*", "bias": f"const {C_TYPE[spec.epilogue.bias_dtype]}*",
        out_name: f"{out_t}*", "db": f"{out_t}*", "workspace": "float*", "db_workspace": "float*",
        "batch": "int", "m_rows": "long long", "residual": f"const {out_t}*", "alpha": "float", "beta": "float",
        **{m: "const __grid_constant__ TmaMap" for m in ("x_map", "w_map", "dy_map")},  # by value (tma.py)
    }
    if spec.pass_ is Pass.DGRAD and not isinstance(spec.plan.loop, TmaHalo):  # one map of dy per stride residue class
        expected["dy_map"] = "const __grid_constant__ DyMaps"
    if reduce:
        expected["workspace"] = expected["db_workspace"] = "const float*"
    for arg, decl in zip(args, params):
        words = decl.replace("__restrict__", "").split()
        pname, ctype = words[-1], " ".join(words[:-1])
        assert pname == arg or (reduce and arg == out_name and pname == "out"), (arg, decl)
        assert ctype == expected[arg], (arg, decl)


@pytest.mark.parametrize("name, spec", GEMM_CASES[::3], ids=GEMM_IDS[::3])
def test_source_constants_are_the_spec(name, spec, sources):
    src, g, p = sources[name].source, spec.geometry, spec.plan
    for const, value in dict(H=g.h, W=g.w, C=g.c, K=g.k, R=g.r, S=g.s, P=g.p, Q=g.q, SH=g.stride[0], SW=g.stride[1],
                             PH=g.padding[0], PW=g.padding[1], DH=g.dilation[0], DW=g.dilation[1],
                             BM=p.block_m, BN=p.block_n, BK=p.block_k, STAGES=p.stages).items():
        assert constant(src, const) == value, const


# (case, the plan's block_m, grid for a batch of 3, manifest grid.x, split-K workspace elements
# for a batch of 3), worked out by hand from the shape and plan:
GRIDS = [
    # the staged halo (small_layer_rules): 16x16-pixel tiles of 32x32 outputs, 4 per image, 3 * 4 = 12
    # blocks; N = 16 channels, one tile
    ("cifar-resnet/conv1/fprop/sm_90", 256, (12, 1, 1), "ceil(batch * 4 / 1)", 0),
    # stride 2: 4 residue classes of 16x16 = 256 dx pixels, 3 * 256 / 128 = 6 blocks each
    ("cifar-resnet/res2-down/dgrad/sm_90", 128, (24, 1, 1), "4 * ceil(batch * 256 / 128)", 0),
    # wgrad: M = K = 32 rows whatever the batch; N = 3*3*16 = 144 over BN 128: 2; 132 slices of 32 x 144
    # (2 tiles on 132 SMs x 2 resident blocks each: small_layer_rules.split_k)
    ("cifar-resnet/res2-down/wgrad/sm_90", 32, (1, 2, 132), "ceil(32 / 32)", 132 * 32 * 144),
    # split-K fprop: 8x8 = 64 rows per image, 3 slices of 192 x 64
    ("split/fprop/relu-bias", 64, (3, 1, 3), "ceil(batch * 64 / 64)", 3 * 192 * 64),
    # halo tiles: 8x16 tile over an 8x8 image: 1 tile per image
    ("halo/N=2 8x8 64->32 3x3 stride 1,1 pad 1,1 dil 1,1/fprop/sm_90/bias-relu", 128, (3, 1, 1), "ceil(batch * 1 / 1)", 0),
    # 4x32 tiles over 20x35 outputs: 5 * 2 = 10 per image; split-K 2 over 3 * 700 pixels x 24 channels
    ("halo/N=2 20x36 16->24 3x2 stride 1,1 pad 2,0 dil 2,1/fprop/sm_90/bias-relu", 128, (30, 1, 2),
     "ceil(batch * 10 / 1)", 2 * 3 * 700 * 24),
    # 16x16 tiles over 20x36: 2 * 3 = 6 per image, 4 per block: 18 / 4 -> 5
    ("halo-tiles/N=3 20x36 32->24 3x3 stride 1,1 pad 1,1 dil 1,1/fprop/sm_90", 256, (5, 1, 1), "ceil(batch * 6 / 4)", 0),
    # 8x8 tiles over a 7x20 image: 1 * 3 per image
    ("ldsm/N=2 7x20 32->24 3x3 stride 1,1 pad 1,1 dil 1,1/fprop", 64, (9, 1, 1), "ceil(batch * 3 / 1)", 0),
    # 8x8 images, two per 16x8 tile: 3 images -> 2 blocks; dx has 64 channels over BN 64
    ("ldsm-stacked/dgrad/128", 128, (2, 1, 1), "ceil(batch * 1 / 2)", 0),
    # four 8x8 images per 32x8 tile: 1 block; 128 output channels over BN 64: 2
    ("ldsm-stacked/fprop/256", 256, (1, 2, 1), "ceil(batch * 1 / 4)", 0),
]


@pytest.mark.parametrize("name, block_m, grid, grid_x, workspace", GRIDS, ids=[g[0] for g in GRIDS])
def test_grid_and_workspace_for_a_batch_of_three(name, block_m, grid, grid_x, workspace, sources):
    ks = sources[name]
    assert ks.spec.plan.block_m == block_m  # the plan the values were worked out for
    assert ks.grid(3) == grid
    assert ks.manifest_entry()["kernels"][0]["grid"] == {"x": grid_x, "y": grid[1], "z": grid[2]}
    assert ks.workspace_elems(3) == workspace


def _manifest_grid_x(text: str, batch: int) -> int:
    """Evaluates the manifest's grid.x text, "[G * ]ceil(A / B)" with A "batch * R" or "R", or
    a persistent grid's "min(ceil(A / B) * T, BLOCKS)", or stream-K's one wave, a number."""
    if text.isdigit():
        return int(text)
    persistent = re.fullmatch(r"min\((.*) \* (\d+), (\d+)\)", text)
    if persistent:
        return min(_manifest_grid_x(persistent.group(1), batch) * int(persistent.group(2)), int(persistent.group(3)))
    m = re.fullmatch(r"(?:(\d+) \* )?ceil\((?:(batch) \* )?(\d+) / (\d+)\)", text)
    assert m, text
    groups, per, rows, tile = int(m.group(1) or 1), m.group(2), int(m.group(3)), int(m.group(4))
    return groups * max(1, -(-(batch * rows if per else rows) // tile))


def test_grid_follows_the_batch_as_the_manifest_says(sources):
    """The launcher's grid and the manifest's formula agree for every case and batch, and a
    grid never has zero blocks (an empty batch still launches one per class)."""
    for name, spec in CASES:
        ks = sources[name]
        x = ks.manifest_entry()["kernels"][0]["grid"]["x"]
        for batch in (0, 1, 5, 300):
            assert ks.grid(batch)[0] == _manifest_grid_x(x, batch) >= 1, (name, batch)
            assert ks.grid(batch)[1:] == ks.grid(1)[1:]


# --------------------------------------------------------------------------- manifest


@pytest.mark.parametrize("name, spec", CASES[::4], ids=IDS[::4])
def test_manifest_entry_is_json(name, spec, sources):
    ks = sources[name]
    entry = ks.manifest_entry()
    text = json.dumps(entry, sort_keys=True)
    assert json.loads(text) == entry
    assert entry["file"] == ks.filename and entry["key"] == spec.key
    assert entry["spec"] == spec.as_dict() and entry["spec"]["plan"] == spec.plan.as_dict()
    assert entry["plan_reasons"] == list(spec.plan.reasons)
    assert [k["name"] for k in entry["kernels"]] == list(ks.kernel_names)
    main = entry["kernels"][0]
    assert main["args"] == list(ks.main.args) and main["block"] == list(ks.main.block)
    assert main["shared_mem"] == ks.main.shared_mem
    assert main["grid"]["y"] == ks.grid(1)[1] and main["grid"]["z"] == spec.plan.split_k
    if ks.reduce:
        gemm = spec.geometry.gemm(spec.pass_, 1)
        rows = f"{gemm.m * gemm.n}" if spec.pass_ is Pass.WGRAD else f"batch * {gemm.m * gemm.n}"
        if ks.main.stream_k:  # a thread per float4 of every tile's slot, whole tiles too: past dW's edges
            tiles = math.ceil(gemm.m / spec.plan.block_m) * math.ceil(gemm.n / spec.plan.block_n)
            rows = f"{tiles * spec.plan.block_m * spec.plan.block_n // 4}"
        assert entry["kernels"][1]["grid"] == {"x": f"ceil({rows} / {ks.reduce.grid_m_tile})", "y": 1, "z": 1}


# --------------------------------------------------------------------------- the template environment


def test_strict_undefined_on_a_tiny_template():
    env = _environment()
    assert env.undefined is jinja2.StrictUndefined
    assert env.from_string("{{ a }}-{{ b.c }}").render(a=1, b={"c": 2}) == "1-2"
    with pytest.raises(jinja2.UndefinedError, match="missing"):
        env.from_string("x = {{ missing }};").render()
    with pytest.raises(jinja2.UndefinedError):
        env.from_string("{{ k.nope }}").render(k={})
    with pytest.raises(jinja2.UndefinedError):
        env.from_string("{% if flag %}1{% endif %}").render()


KERNEL_TEMPLATES = sorted(p.relative_to(templates_dir()).as_posix() for p in (templates_dir() / "kernels").glob("*.j2"))


@pytest.mark.parametrize("template", KERNEL_TEMPLATES)
def test_real_templates_refuse_an_incomplete_context(template):
    with pytest.raises(jinja2.UndefinedError, match="ctx"):
        _environment().get_template(template).render()  # no emission context


def test_every_kernel_template_is_reached():
    """Each (pass, loop) kernel template is the one some case emits through: a template no
    kind reaches would rot unseen, and a kind without a template would fail to emit."""
    reached = {_context(spec, spec.target.info).template for _, spec in CASES}
    assert reached == set(KERNEL_TEMPLATES), set(KERNEL_TEMPLATES) ^ reached
