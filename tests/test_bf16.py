"""bfloat16 kernels without a GPU: the dtype rules, the planner's refusal on targets with no
bf16 MMA, the spec keys of float16 kernels left as they were, and every main-loop kind's bf16
kernel compiled by NVRTC (the GPU tiers are tests/test_bf16_gpu.py)."""

from __future__ import annotations

import numpy as np
import pytest

import convgen.compile as cc
from convgen import runtime
from convgen.cli import main as cli_main
from convgen.dtypes import check_dtypes, resolve_mma_dtype
from convgen.emit import emit
from convgen.ir import ConvProblem, Epilogue, Pass, Target
from convgen.spec import KernelSpec, Plan
from convgen.mainloop import FlatHalo, HaloLdsm, HaloTile, Im2col, StagedHalo, TmaWgmma, Wgmma
from convgen.planner import make_spec, plan
from convgen.resources import include_dir

P = ConvProblem(12, 12, 64, 64, 3, 3, 1, 1, 1, n=2)
BF = ("bfloat16", "bfloat16")


def _plan(*args, loop=Im2col(), split_k=1) -> Plan:
    return Plan(*args, *BF, split_k=split_k, loop=loop)


# (problem, pass, hand plan or None, epilogue, arch): each main-loop kind and MMA flavour once
KINDS = {
    "fprop-im2col-wmma": (P, "fprop", _plan(128, 64, 32, 4, 1, 3, 8, 8), dict(out_dtype="bfloat16"), "sm_80"),
    "fprop-split-bias": (P, "fprop", _plan(64, 32, 16, 2, 2, 2, 8, 8, split_k=3),
                         dict(bias=True, relu=True, bias_dtype="bfloat16", out_dtype="bfloat16"), "sm_80"),
    "fprop-sliced": (P, "fprop", _plan(64, 64, 64, 2, 2, 3, 8, 8, loop=Im2col(2)), {}, "sm_80"),
    "fprop-halo": (P, "fprop", _plan(64, 32, 16, 2, 2, 2, 8, 8, loop=HaloTile(16)), dict(out_dtype="float32"), "sm_80"),
    "fprop-halo-tiles": (ConvProblem(12, 12, 16, 24, 3, 3, 1, 1, 1, n=2), "fprop",
                         _plan(64, 32, 16, 2, 2, 2, 8, 8, loop=HaloTile(16, 2)), {}, "sm_80"),
    "fprop-ldsm": (ConvProblem(8, 8, 64, 64, 3, 3, 1, 1, 1, n=2), "fprop",
                   _plan(64, 64, 32, 4, 1, 3, 8, 8, loop=HaloLdsm(8)), {}, "sm_80"),
    "fprop-flat": (P, "fprop", _plan(64, 32, 16, 2, 2, 2, 8, 8, loop=FlatHalo()), {}, "sm_80"),
    "fprop-staged-halo": (ConvProblem(32, 32, 3, 32, 3, 3, 1, 1, 1, n=2), "fprop",
                          _plan(64, 32, 32, 4, 1, 2, 1, 1, loop=StagedHalo(16)), {}, "sm_80"),
    "fprop-residual-gelu": (P, "fprop", None, dict(bias=True, gelu=True, residual=True, bias_dtype="bfloat16"), "sm_80"),
    "dgrad-strided": (ConvProblem(12, 12, 64, 64, 3, 3, 2, 1, 1, n=2), "dgrad", None, {}, "sm_80"),
    "dgrad-halo": (P, "dgrad", _plan(64, 32, 16, 2, 2, 2, 8, 8, loop=HaloTile(16)), {}, "sm_80"),
    "wgrad-db": (P, "wgrad", None, dict(bias=True), "sm_80"),
    "wgrad-split": (P, "wgrad", _plan(64, 64, 32, 2, 2, 3, 8, 8, split_k=4), dict(bias=True), "sm_80"),
    "fprop-wgmma": (P, "fprop", _plan(64, 64, 32, 4, 1, 3, 8, 8, loop=Wgmma()), {}, "sm_90"),
    "dgrad-wgmma": (P, "dgrad", _plan(64, 64, 32, 4, 1, 3, 8, 8, loop=Wgmma()), {}, "sm_90"),
    "fprop-tma": (P, "fprop", _plan(64, 32, 64, 4, 1, 3, 8, 8, loop=TmaWgmma()), {}, "sm_90"),
    "fprop-tma-persistent": (P, "fprop", _plan(128, 32, 64, 8, 1, 3, 8, 8, loop=TmaWgmma(persistent=True)),
                             dict(bias=True, residual=True, bias_dtype="bfloat16"), "sm_90"),
    "fprop-tma-pingpong": (P, "fprop", _plan(128, 64, 64, 8, 1, 4, 8, 8, loop=TmaWgmma(persistent=True, pingpong=True)),
                           dict(bias=True, residual=True, bias_dtype="bfloat16"), "sm_90"),
    "dgrad-tma-pingpong": (P, "dgrad", _plan(128, 64, 64, 8, 1, 4, 8, 8, loop=TmaWgmma(persistent=True, pingpong=True)),
                           {}, "sm_90"),
    "dgrad-tma": (P, "dgrad", _plan(64, 64, 64, 4, 1, 3, 8, 8, loop=TmaWgmma()), {}, "sm_90"),
    "dgrad-tma-strided": (ConvProblem(12, 12, 64, 64, 3, 3, 2, 1, 1, n=2), "dgrad",
                          _plan(64, 64, 64, 4, 1, 3, 8, 8, loop=TmaWgmma()), {}, "sm_90"),
    "wgrad-tma-db": (P, "wgrad", _plan(64, 64, 64, 4, 1, 3, 8, 8, split_k=2, loop=TmaWgmma()), dict(bias=True), "sm_90"),
}


def _compile(src) -> None:
    opts = cc._fixed_flags(src.compile_arch, False) + [f"-I{d}" for d in [include_dir(), *cc.cuda_include_dirs()]]
    binary, log = cc._nvrtc_compile(src.source, src.filename, opts)
    assert binary and log.strip() == "", log[:3000]


@pytest.mark.parametrize("case", sorted(KINDS))
def test_every_kind_compiles_in_bf16_without_warnings(case):
    """Each main-loop kind's bf16 kernel: bf16 stages and fragments, the .bf16 form of the raw
    MMAs, and NVRTC compiles it with an empty log for the arch it names."""
    prob, pass_, hand, epi, arch = KINDS[case]
    epi = {"out_dtype": "bfloat16", **epi}
    src = emit(make_spec(prob, pass_, target=Target(arch), epilogue=Epilogue(**epi), in_dtype="bfloat16", plan_=hand))
    assert "typedef __nv_bfloat16 half_t;" in src.source and "#define CONVGEN_BF16 1" in src.source
    assert ".f16" not in src.source  # no fp16 MMA left behind in the raw PTX
    if src.spec.plan.tma or src.spec.plan.wgmma:
        assert ".f32.bf16.bf16 " in src.source
    if "ldsm" in case:  # raw mma.sync through convgen/mma_sync.h, its bf16 form under CONVGEN_BF16
        assert '#include "convgen/mma_sync.h"' in src.source
        from convgen.tools.sass import find_cuobjdump, kernel_sass

        cuobjdump = find_cuobjdump()
        if cuobjdump:  # what NVRTC made of it: bf16 HMMAs, no fp16 ones
            ops = kernel_sass(src, cuobjdump)[src.main.kernel].opcodes
            hmma = [op for op in ops if op.startswith("HMMA")]
            assert hmma and all(".BF16" in op for op in hmma), hmma
    _compile(src)


@pytest.mark.parametrize("scalar", [False, True])
def test_float32_inputs_round_to_bf16_when_asked(scalar):
    """float32 inputs with mma_dtype='bfloat16': the plan reads bf16 after the cast pass, or
    float32 in a scalar gather that rounds to bf16 (ReadAs<float>), and it compiles."""
    spec = make_spec(P, "fprop", target=Target("sm_80"), in_dtype="float32", scalar=scalar, mma_dtype="bfloat16",
                     epilogue=Epilogue(out_dtype="float32"))
    assert (spec.plan.read_a, spec.plan.read_b) == (("float32",) * 2 if scalar else BF)
    assert spec.mma_dtype == "bfloat16"
    src = emit(spec)
    assert "typedef __nv_bfloat16 half_t;" in src.source
    _compile(src)


def test_no_bf16_mma_is_refused_by_name():
    """sm_75 has no bf16 tensor-core MMA: the planner says so rather than planning fp16."""
    for kw in (dict(in_dtype="bfloat16"), dict(in_dtype="float32", mma_dtype="bfloat16")):
        with pytest.raises(ValueError, match="sm_75 has no bfloat16 MMA"):
            make_spec(P, "fprop", target=Target("sm_75"), **kw)
        with pytest.raises(ValueError, match="sm_75 has no bfloat16 MMA"):
            plan(P, "wgrad", Target("sm_75"), kw["in_dtype"], mma_dtype=kw.get("mma_dtype"))


def test_float16_keys_are_unchanged_and_bf16_keys_differ():
    """mma_dtype is in a spec's dict only where it is not float16, so every earlier kernel
    keeps its key (its cache entries and tuning keys); a bf16 kernel is another kernel."""
    p = make_spec(P, "fprop").plan
    old = KernelSpec(P, Pass.FPROP, Epilogue(), "float16", Target(), p)
    same = KernelSpec(P, Pass.FPROP, Epilogue(), "float16", Target(), p, mma_dtype="float16")
    assert "mma_dtype" not in old.as_dict() and same.key == old.key
    f32 = KernelSpec(P, Pass.FPROP, Epilogue(out_dtype="float32"), "float32", Target(), p)
    f32_bf = KernelSpec(P, Pass.FPROP, Epilogue(out_dtype="float32"), "float32", Target(), Plan.from_dict({**p.as_dict(), "read_a": "bfloat16",
                                                                                       "read_b": "bfloat16"}),
                        mma_dtype="bfloat16")
    assert f32_bf.as_dict()["mma_dtype"] == "bfloat16" and f32_bf.key != f32.key


@pytest.mark.parametrize("kw, match", [
    (dict(in_dtype="float16", mma_dtype="bfloat16"), "16-bit inputs are read as they are"),
    (dict(in_dtype="bfloat16", mma_dtype="float16"), "16-bit inputs are read as they are"),
    (dict(in_dtype="float32", mma_dtype="int8"), "mma_dtype must be one of"),
    (dict(in_dtype="bfloat16", out_dtype="float16"), "out_dtype='float16' with bfloat16 MMAs"),
    (dict(in_dtype="float16", bias_dtype="bfloat16"), "bias_dtype='bfloat16' with float16 MMAs"),
])
def test_dtype_mixes_are_refused_naming_the_field(kw, match):
    in_dtype, mma = kw["in_dtype"], kw.get("mma_dtype")
    with pytest.raises(ValueError, match=match):
        check_dtypes(in_dtype, resolve_mma_dtype(in_dtype, mma), kw.get("out_dtype", "float32"),
                     kw.get("bias_dtype", "float32"))


def test_a_plan_reading_the_other_16_bit_type_is_refused():
    with pytest.raises(ValueError, match=r"plan.read_a='float16': a kernel with bfloat16 MMAs reads bfloat16 or float32"):
        make_spec(P, "fprop", target=Target("sm_80"), in_dtype="float32", mma_dtype="bfloat16",
                  plan_=Plan(128, 64, 32, 4, 1, 3, 8, 8, "float16", "bfloat16"))


def test_bf16_tma_maps_name_the_bfloat16_data_type(tma_encodes):
    """The copy engine's maps of a bf16 kernel hold BFLOAT16 (the same 2-byte strides)."""
    from convgen import tma

    for pass_ in Pass:
        maps = tma.TmaMaps(P, pass_, 64, 64, "bfloat16")
        maps.a(256), maps.b(512)
    seen = [e["dtype"] for e in tma_encodes]
    assert seen and set(seen) == {"CU_TENSOR_MAP_DATA_TYPE_BFLOAT16"}
    tma.TmaMaps(P, Pass.FPROP, 64, 64).a(256)
    assert tma_encodes[-1]["dtype"] == "CU_TENSOR_MAP_DATA_TYPE_FLOAT16"


def test_front_end_dtypes():
    """The arrays' dtypes choose the kernel's: bfloat16 beside float16 is refused naming both,
    and out_dtype None is the MMAs' 16-bit type."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    bf = np.zeros(2, ml_dtypes.bfloat16)
    assert runtime._in_dtype(("x", "w"), bf, np.zeros(2, np.float32)) == "bfloat16"
    assert runtime._in_dtype(("x", "w"), np.zeros(2, np.float32), np.zeros(2, np.float64)) == "float32"
    with pytest.raises(TypeError, match=r"x bfloat16, w float16"):
        runtime._in_dtype(("x", "w"), bf, np.zeros(2, np.float16))
    assert runtime._out_dtype(None, "bfloat16") == "bfloat16"
    assert runtime._out_dtype(ml_dtypes.bfloat16) == "bfloat16"


def test_cli_plans_and_emits_bf16(tmp_path, capsys):
    shape = ["-n", "2", "-h", "12", "-w", "12", "-c", "64", "-k", "64", "-r", "3", "-s", "3", "--padding", "1"]
    assert cli_main(["plan", *shape, "--dtype", "bfloat16", "--pass", "dgrad", "--arch", "sm_80"]) == 0
    assert "read A/B bfloat16/bfloat16" in capsys.readouterr().out
    assert cli_main(["emit", *shape, "--dtype", "bfloat16", "--pass", "fprop", "-o", str(tmp_path)]) == 0
    (kernel,) = tmp_path.glob("*.cu")
    assert "typedef __nv_bfloat16 half_t;" in kernel.read_text()
    assert cli_main(["plan", *shape, "--dtype", "bfloat16", "--arch", "sm_75"]) != 0
    assert "sm_75 has no bfloat16 MMA" in capsys.readouterr().err
