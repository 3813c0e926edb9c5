"""The TMA main loop's kind, its checks, candidates and emission (no GPU needed).

What the kernels compute is tests/test_tma_gpu.py's job, on the H200."""

from __future__ import annotations

import dataclasses

import pytest

from convgen.candidates import candidates
from convgen.emit import emit
from convgen.ir import ConvProblem, Epilogue, Pass, Plan, Target
from convgen.mainloop import Im2col, TmaWgmma
from convgen.planner import check_plan, make_spec, tma_eligible

LAYER = ConvProblem(28, 28, 128, 256, 3, 3, 1, 1, 1, n=64)
PLAN = Plan(128, 256, 64, 8, 1, 4, 8, 8, loop=TmaWgmma())
SM90 = Target("sm_90")


def test_plan_dict_round_trip_and_name():
    d = PLAN.as_dict()
    assert d["tma"] is True and "wgmma" not in d
    back = Plan.from_dict(d, LAYER.geometry, Pass.FPROP)
    assert back == PLAN and isinstance(back.loop, TmaWgmma)
    assert back.warps == 12  # two consumer warpgroups and the producer's
    spec = make_spec(LAYER, Pass.FPROP, target=SM90, plan_=PLAN)
    assert "_tma_128x256x64_s4_sm90_" in spec.name
    # an im2col plan's dict has no tma key: old tuning entries and spec keys are unchanged
    assert "tma" not in dataclasses.replace(PLAN, loop=Im2col()).as_dict()


@pytest.mark.parametrize("change,needle", [
    (dict(block_k=32), "block_k must be 64"),
    (dict(warps_m=4), "consumer warpgroups"),
    (dict(block_m=256, warps_m=16), "consumer warpgroups"),
    (dict(split_k=2), "split_k must be 1"),
])
def test_kind_rejects_plans_it_cannot_run(change, needle):
    with pytest.raises(ValueError, match=needle):
        dataclasses.replace(PLAN, **change)


@pytest.mark.parametrize("layer,pass_,target,in_dtype,needle", [
    (dataclasses.replace(LAYER, c=96), Pass.FPROP, SM90, "float16", "C=96 is not a multiple of 64"),
    (LAYER, Pass.DGRAD, SM90, "float16", "fprop only"),
    (LAYER, Pass.FPROP, Target("sm_80"), "float16", "sm_80 does not have"),
    (LAYER, Pass.FPROP, SM90, "float32", "fp16 inputs"),
    (dataclasses.replace(LAYER, stride=(9, 1)), Pass.FPROP, SM90, "float16", "stride"),
])
def test_check_plan_names_what_the_layer_lacks(layer, pass_, target, in_dtype, needle):
    assert needle in tma_eligible(layer.geometry, pass_, target, in_dtype)
    with pytest.raises(ValueError, match="TmaWgmma"):
        check_plan(PLAN, layer, pass_, target, in_dtype)


def test_candidates_offer_the_kind_only_where_it_runs():
    tma = [p for p in candidates(LAYER, Pass.FPROP, SM90) if p.tma]
    assert {(p.block_m, p.block_n) for p in tma} >= {(128, 256), (128, 128), (64, 128)}
    for p in tma:
        check_plan(p, LAYER, Pass.FPROP, SM90, "float16")
    assert not [p for p in candidates(LAYER, Pass.FPROP, Target("sm_80")) if p.tma]
    assert not [p for p in candidates(LAYER, Pass.DGRAD, SM90) if p.tma]
    narrow = dataclasses.replace(LAYER, k=64)  # no tile wider than N
    assert max(p.block_n for p in candidates(narrow, Pass.FPROP, SM90) if p.tma) == 64


def test_launch_takes_tensor_maps_and_the_producer_warpgroup():
    src = emit(make_spec(LAYER, Pass.FPROP, target=SM90, plan_=PLAN, epilogue=Epilogue(bias=True)))
    assert src.main.args == ("x_map", "w_map", "bias", "y", "batch")
    assert src.main.block == (384, 1, 1)
    assert src.compile_arch == "sm_90a"
    assert src.main.shared_mem <= SM90.info.smem_limit
    assert src.reduce is None
    assert emit(make_spec(LAYER, Pass.FPROP, target=SM90, plan_=PLAN, epilogue=Epilogue(bias=True))).source == src.source


TMA_COMPILE = [
    (LAYER, PLAN, Epilogue(bias=True)),
    (ConvProblem(7, 7, 512, 2048, 1, 1, 1, 0, 1, n=64), Plan(128, 128, 64, 8, 1, 6, 8, 8, loop=TmaWgmma()),
     Epilogue(relu=True, out_dtype="float32")),
    (ConvProblem(15, 13, 64, 40, 3, 5, (2, 1), (1, 2), (2, 1), n=2), Plan(64, 48, 64, 4, 1, 2, 8, 8, loop=TmaWgmma()),
     Epilogue()),
]


@pytest.mark.parametrize("layer,plan,epi", TMA_COMPILE, ids=lambda v: getattr(v, "brief", lambda: None)() or None)
def test_nvrtc_compiles_tma_kernels(layer, plan, epi):
    """sm_90a cubins with the kernel in them, and no compiler warning (the test session makes
    warnings errors): ptxas's C7515 (wgmma serialised) or C7508 (setmaxnreg ignored) would fail here."""
    pytest.importorskip("cupy", reason="NVRTC comes with CuPy")
    from convgen.compile import compile_binary

    src = emit(make_spec(layer, Pass.FPROP, target=SM90, plan_=plan, epilogue=epi))
    binary = compile_binary(src.source, arch=src.compile_arch, name=src.filename)
    assert binary[:4] == b"\x7fELF" and src.main.kernel.encode() in binary
