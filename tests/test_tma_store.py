"""fprop's TMA plans that store y through the copy engine (TmaWgmma.tma_store): the plan, its
tuning candidates, its tensor map and its kernels, with no GPU.  What the kernels compute is
tests/test_tma_store_gpu.py's job."""

from __future__ import annotations

import dataclasses

import pytest

from convgen import autotune
from convgen.candidates import candidates
from convgen.emit import emit
from convgen.footprint import smem_bytes
from convgen.ir import ConvProblem, Epilogue, Pass, Target
from convgen.mainloop import TmaHalo, TmaWgmma
from convgen.planner import check_plan, make_spec
from convgen.spec import Plan
from convgen.tools.sass import find_cuobjdump, kernel_sass

LAYER = ConvProblem(28, 28, 128, 256, 3, 3, 1, 1, 1, n=64)
SM90 = Target("sm_90", 132)
STORED = Plan(128, 128, 64, 8, 1, 5, 8, 8, loop=TmaWgmma(tma_store=True))
PINGPONG = Plan(128, 128, 64, 8, 1, 4, 8, 8, loop=TmaWgmma(persistent=True, pingpong=True, tma_store=True))


def _without(plan: Plan) -> Plan:
    return dataclasses.replace(plan, loop=dataclasses.replace(plan.loop, tma_store=False))


def test_plan_round_trips_is_named_and_is_checked():
    d = PINGPONG.as_dict()
    assert d["tma_store"] is True and d["pingpong"] is True
    assert Plan.from_dict(d, LAYER.geometry, Pass.FPROP) == PINGPONG
    assert "tma_store" not in _without(STORED).as_dict()  # old entries keep their keys
    assert "_tmast_128x128x64_s5_" in make_spec(LAYER, Pass.FPROP, target=SM90, plan_=STORED).name
    assert "_tmappst_128x128x64_s4_" in make_spec(LAYER, Pass.FPROP, target=SM90, plan_=PINGPONG).name
    assert "output stored by the copy engine" in STORED.explain()
    with pytest.raises(TypeError, match="tma_store must be a bool"):
        TmaWgmma(tma_store=1)
    with pytest.raises(ValueError, match="needs plan.tma=True"):
        Plan.from_dict({**Plan(128, 128, 32, 4, 2, 3, 8, 8).as_dict(), "tma_store": True})
    strided = dataclasses.replace(LAYER, stride=(2, 2))
    for pass_, problem in ((Pass.WGRAD, LAYER), (Pass.DGRAD, strided)):  # dW's split-K sums; scattered classes
        with pytest.raises(ValueError, match="in fprop and in stride-1 dgrad"):
            check_plan(STORED, problem, pass_, SM90, "float16")
    with pytest.raises(ValueError, match="K=36 must be a multiple of 8"):  # y's rows: whole 16-byte runs
        check_plan(STORED, dataclasses.replace(LAYER, k=36), Pass.FPROP, SM90, "float16")
    check_plan(STORED, LAYER, Pass.FPROP, SM90, "float16")
    check_plan(STORED, LAYER, Pass.DGRAD, SM90, "float16")
    check_plan(PINGPONG, LAYER, Pass.FPROP, SM90, "float16")


def test_the_gpu_tests_plans_are_valid_on_their_shapes():
    """test_tma_store_gpu's plans pass the planner's checks on its shapes, so that file tests
    kernels, not refusals."""
    import test_tma_store_gpu
    from gpu_helpers import check_plans_pass_the_planner

    check_plans_pass_the_planner(test_tma_store_gpu, SM90)


def test_each_warp_has_room_for_its_strips():
    """The strips take shared memory of their own: past the ring in a persistent block, which
    a plan may then not fit; within the ring's (reused) room in a one-tile block."""
    persistent = Plan(128, 256, 64, 8, 1, 3, 8, 8, loop=TmaWgmma(persistent=True, tma_store=True))
    assert smem_bytes(persistent, Pass.FPROP, 32, LAYER) - smem_bytes(_without(persistent), Pass.FPROP, 32, LAYER) == \
        8 * 4096
    assert smem_bytes(STORED, Pass.FPROP, 32, LAYER) == smem_bytes(_without(STORED), Pass.FPROP, 32, LAYER)
    too_deep = Plan(128, 128, 64, 8, 1, 5, 8, 8, loop=TmaWgmma(persistent=True, tma_store=True))
    check_plan(_without(too_deep), LAYER, Pass.FPROP, SM90, "float16")
    with pytest.raises(ValueError, match="shared memory"):
        check_plan(too_deep, LAYER, Pass.FPROP, SM90, "float16")


def test_kernel_hands_its_strips_to_the_copy_engine():
    src = emit(make_spec(LAYER, Pass.FPROP, target=SM90, plan_=PINGPONG, epilogue=Epilogue(bias=True)))
    assert src.main.args == ("x_map", "w_map", "bias", "y_map", "batch")  # y only through its map
    text = src.source
    assert "const __grid_constant__ TmaMap y_map, int batch)" in text and "__restrict__ y," not in text
    assert "out.put(row % 16, col % STRIP_W, v);" in text and "store_run" not in text.split("extern \"C\"")[1]
    assert "}, [&](int row, int col) { out.send(&y_map, tile_n + col, tile_m + row); });" in text
    assert text.rstrip().endswith("out.finish();\n  }\n}")
    plain = emit(make_spec(LAYER, Pass.FPROP, target=SM90, plan_=_without(PINGPONG), epilogue=Epilogue(bias=True)))
    assert "y_map" not in plain.source and "OutStrips" not in plain.source and "flush" not in plain.source
    assert plain.main.args == ("x_map", "w_map", "bias", "y", "batch")
    dgrad = emit(make_spec(LAYER, Pass.DGRAD, target=SM90, plan_=PINGPONG))
    assert dgrad.main.args == ("dy_map", "w_map", "dx_map", "batch")
    assert "consume_class<Class<0, 0>>(ring, pos, &dx_map, out, batch, tile_m, tile_n, tile, turns)" in dgrad.source
    assert "}, [&](int row, int col) { out.send(dx_map, tile_n + col, tile_m + row); });" in dgrad.source


def test_twins_are_offered_when_asked_for_last_and_in_fprop_only():
    """Only when asked for (`convgen tune --tma-store`) until a GPU has run them, after every
    other candidate but the untimed TMA halo slices (and the cluster twins, when both are asked
    for), so tuning on first use never times them; the default's twin first."""
    for problem in (LAYER, ConvProblem(14, 14, 1024, 256, 1, 1, 1, 0, 1, n=64),
                    ConvProblem(56, 56, 64, 128, 3, 3, 1, 1, 1, n=64)):  # the last also offers halo slices
        assert not any(getattr(p.loop, "tma_store", False) for p in candidates(problem, Pass.FPROP, SM90))
        plans = candidates(problem, Pass.FPROP, SM90, tma_store=True)
        twins = [i for i, p in enumerate(plans) if getattr(p.loop, "tma_store", False)]
        assert twins and twins == list(range(twins[0], twins[0] + len(twins)))
        assert all(isinstance(p.loop, TmaHalo) for p in plans[twins[-1] + 1:])
        assert min(twins) >= autotune.CANDIDATES
        assert dataclasses.replace(_without(plans[twins[0]]), reasons=()) == dataclasses.replace(plans[0], reasons=())
        both = candidates(problem, Pass.FPROP, SM90, clusters=True, tma_store=True)
        assert [p for p in both if getattr(p.loop, "tma_store", False)] == [plans[i] for i in twins]
        assert not any(getattr(p.loop, "tma_store", False) for p in candidates(problem, Pass.WGRAD, SM90, tma_store=True))
        dgrad = candidates(problem, Pass.DGRAD, SM90, tma_store=True)
        assert any(getattr(p.loop, "tma_store", False) for p in dgrad) == isinstance(dgrad[0].loop, TmaWgmma)
        strided = dataclasses.replace(problem, stride=(2, 2))
        assert not any(getattr(p.loop, "tma_store", False) for p in candidates(strided, Pass.DGRAD, SM90, tma_store=True))


def test_y_map_is_the_warps_strip(tma_encodes):
    """y as [N*P*Q][K] of y's own dtype, a box of 16 pixels x the drain's strip (64 filters,
    or all of a narrower tile's), rows unswizzled as the warps write them: another box would
    store other bytes than the strip holds."""
    from convgen import tma

    maps = tma.TmaMaps(LAYER, Pass.FPROP, 128, 128, store=(64, "float16"))
    maps.out(4096)
    (e,) = [e for e in tma_encodes if e["ptr"] == 4096]
    assert e["dims"] == [256, 64 * 28 * 28] and e["strides"] == [256 * 2] and e["box"] == [64, 16]
    assert e["dtype"] == "CU_TENSOR_MAP_DATA_TYPE_FLOAT16" and e["swizzle"] == "CU_TENSOR_MAP_SWIZZLE_NONE"
    tma.TmaMaps(LAYER, Pass.FPROP, 64, 48, store=(16, "float32")).out(8192)  # a 48-wide tile drains 16 at a time
    (e,) = [e for e in tma_encodes if e["ptr"] == 8192]
    assert e["strides"] == [256 * 4] and e["box"] == [16, 16] and e["dtype"] == "CU_TENSOR_MAP_DATA_TYPE_FLOAT32"
    assert maps.out(4096) is maps.out(4096) and len([e for e in tma_encodes if e["ptr"] == 4096]) == 1  # kept
    tma.TmaMaps(dataclasses.replace(LAYER, c=96), Pass.DGRAD, 128, 128, store=(64, "float16")).out(12288)
    (e,) = [e for e in tma_encodes if e["ptr"] == 12288]  # dx as [N*H*W][C]
    assert e["dims"] == [96, 64 * 28 * 28] and e["strides"] == [96 * 2] and e["box"] == [64, 16]


CUOBJDUMP = find_cuobjdump()


@pytest.mark.skipif(CUOBJDUMP is None, reason="no cuobjdump: install the cuda13 or cuda12 extra")
@pytest.mark.parametrize("layer,plan,epi", [
    (LAYER, STORED, Epilogue(bias=True)),
    (LAYER, PINGPONG, Epilogue(bias=True, relu=True)),
    (LAYER, Plan(128, 256, 64, 8, 1, 3, 8, 8, loop=TmaWgmma(persistent=True, tma_store=True)),
     Epilogue(bias=False, residual=True)),
    (LAYER, Plan(128, 128, 64, 8, 1, 4, 8, 8, loop=TmaWgmma(persistent=True, tma_store=True)),
     Epilogue(bias=True, out_dtype="float32")),
    (ConvProblem(14, 14, 256, 256, 3, 3, 1, 1, 1, 4, n=8), Plan(128, 64, 64, 8, 1, 4, 8, 8, loop=TmaWgmma(tma_store=True)),
     Epilogue(bias=True)),
    (LAYER, PINGPONG, None),
    (ConvProblem(14, 14, 96, 256, 3, 3, 1, 1, 1, n=8),
     Plan(128, 128, 64, 8, 1, 4, 8, 8, loop=TmaWgmma(persistent=True, tma_store=True)), None),
], ids=["one-tile", "pingpong", "residual-256", "fp32", "grouped", "dgrad-pingpong", "dgrad-c96"])
def test_nvrtc_stores_the_output_only_through_the_copy_engine(layer, plan, epi):
    """NVRTC's sm_90a SASS: no global store at all; one bulk tensor store per strip, fed by one
    16-byte shared store per lane and run; no register spills.  (epi None: dgrad.)"""
    spec = (make_spec(layer, Pass.FPROP, target=SM90, plan_=plan, epilogue=epi) if epi else
            make_spec(layer, Pass.DGRAD, target=SM90, plan_=plan))
    src = emit(spec)
    sass = kernel_sass(src, CUOBJDUMP)[src.main.kernel]
    plain = kernel_sass(emit(dataclasses.replace(spec, plan=_without(plan))), CUOBJDUMP)
    stg = sum(n for op, n in next(iter(plain.values())).opcodes.items() if op.startswith("STG"))
    assert not any(op.startswith(("STG", "ST.", "RED", "ATOM")) for op in sass.opcodes), sass.opcodes
    assert sass.opcodes.get("STS.128", 0) >= stg  # a 16-byte store a run, as the other kernel's global ones
    assert sass.opcodes["UTMASTG.2D"] * 16 * 64 * 2 >= 16 * stg  # and one bulk store takes a strip of them
    assert sass.local == 0 and sass.stack == 0
