"""PreparedConv.launch, the pointer path convgen.torch takes, without a GPU.

The op is built on an emitted kernel whose CuPy Function is a recorder, so what a call
launches (grid, block, the arguments by value, shared memory, stream, cooperative or not) is
read back and compared with what the emitter says, and every refusal is checked by name.
launch() tests the common path in one expression and builds its messages only on a
failure: each case here breaks one condition, so a condition dropped from that expression
lets a bad pointer through and fails here.  tests/test_prepared_gpu.py runs the real thing.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import convgen.prepared as pr
import convgen.runtime as rt
from convgen.emit import emit
from convgen.ir import ConvProblem, Epilogue, Pass, Target
from convgen.planner import make_spec, plan as plan_for

SM90 = Target("sm_90")
FPROP = ConvProblem(16, 16, 24, 40, 3, 3, 1, 1, 1, n=8)  # im2col or halo: no tensor maps
WGRAD = ConvProblem(32, 32, 16, 16, 3, 3, 1, 1, 1, n=256)  # split-K: two launches, or one cooperative


class Recorder:
    """A kernel Function that notes each launch instead of running it."""

    ptr = 0

    def __init__(self, name: str, log: list) -> None:
        self.name, self.log = name, log

    def __call__(self, grid, block, args, shared_mem=0, stream=None, enable_cooperative_groups=False):
        self.log.append(dict(kernel=self.name, grid=grid, block=block, args=args, shared_mem=shared_mem,
                             stream=stream.ptr, cooperative=enable_cooperative_groups))


class _Runtime:
    @staticmethod
    def getDevice() -> int:
        return 0


class _Cuda:
    runtime = _Runtime


class _Cupy:
    cuda = _Cuda


@pytest.fixture
def launches(monkeypatch):
    log: list[dict] = []

    def kernel(problem, pass_, epilogue, in_dtype, device, plan, scalar, mma_dtype):
        src = emit(make_spec(problem, pass_, target=SM90, epilogue=epilogue, plan_=plan))
        return rt._Kernel.build(src, Recorder(src.main.kernel, log),
                                Recorder(src.reduce.kernel, log) if src.reduce else None)

    monkeypatch.setattr(rt, "_kernel", kernel)
    monkeypatch.setattr(rt, "_cupy", lambda: _Cupy)
    return log


def op(pass_: str, problem: ConvProblem, plan=None, **epi) -> pr.PreparedConv:
    return pr.PreparedConv(Pass.parse(pass_), problem, Epilogue(**epi), "float16", 0, plan)


def test_a_launch_passes_the_pointers_by_value_in_the_kernels_order(launches):
    fprop = op("fprop", FPROP)
    src = fprop._kernel.source
    fprop.launch(0x10000, 0x20000, (0x30000,), stream=0x77)
    (call,) = launches
    assert call["kernel"] == src.main.kernel and call["grid"] == src.grid(FPROP.n) and not call["cooperative"]
    assert call["block"] == src.main.block and call["shared_mem"] == src.main.shared_mem and call["stream"] == 0x77
    by_name = dict(zip(src.main.args, call["args"]))
    assert (by_name["x"], by_name["w"], by_name["y"]) == (0x10000, 0x20000, 0x30000)
    assert all(type(v) is np.uint64 for v in (by_name["x"], by_name["w"], by_name["y"]))
    assert by_name["batch"] == FPROP.n and type(by_name["batch"]) is np.int32
    fprop.launch(0x10000, 0x40000, (0x30000,), stream=0x77)  # a new pointer after cached ones
    assert dict(zip(src.main.args, launches[-1]["args"]))["w"] == 0x40000


@pytest.mark.parametrize("reduce", ["kernel", "grid"])
def test_split_k_wgrad_launches_with_its_workspace(launches, reduce):
    """The reduction kernel as a second launch, or the main kernel alone, cooperatively; the
    slices at the caller's workspace, db's after them."""
    base = plan_for(WGRAD, Pass.WGRAD, SM90)
    wgrad = op("wgrad", WGRAD, dataclasses.replace(base, split_reduce=reduce), bias=True)
    src = wgrad._kernel.source
    ws = 0x800000
    wgrad.launch(0x10000, 0x20000, (0x30000, 0x40000), workspace=ws)
    assert [c["kernel"] for c in launches] == [src.main.kernel] + ([src.reduce.kernel] if reduce == "kernel" else [])
    assert launches[0]["cooperative"] == (reduce == "grid")
    main = dict(zip(src.main.args, launches[0]["args"]))
    assert main["workspace"] == ws and main["db_workspace"] == ws + 4 * wgrad._ws_elems
    assert (main["x"], main["dy"], main["dw"], main["db"]) == (0x10000, 0x20000, 0x30000, 0x40000)
    assert wgrad.workspace_elems >= wgrad._ws_elems + WGRAD.k * base.split_k


def test_every_refusal_names_its_argument(launches):
    fprop = op("fprop", FPROP)
    align_x = fprop._aligns[0]
    good = dict(a=0x10000, b=0x20000, out=(0x30000,))
    cases = [
        (dict(a=0), r"x must be a nonzero device pointer aligned to \d+ bytes, got 0x0"),
        (dict(a=0x10000 + align_x // 2), r"x must be a nonzero device pointer aligned"),
        (dict(b=0), r"w must be a nonzero device pointer"),
        (dict(b=0x20002), r"w must be a nonzero device pointer"),
        (dict(out=(0,)), r"out must be a nonzero device pointer aligned to 16 bytes"),
        (dict(out=(0x30008,)), r"out must be a nonzero device pointer aligned to 16 bytes"),
        (dict(out=(0x30000, 0x50000)), r"out must hold 1 pointer\(s\) for this fprop, got 2"),
        (dict(bias=0x60000), r"bias: this prepared op was built without a bias"),
        (dict(residual=0x60000), r"residual: this prepared op was built without a residual"),
    ]
    for change, match in cases:
        with pytest.raises(ValueError, match=match):
            fprop.launch(**{**good, **change})
    biased = op("fprop", FPROP, bias=True)
    with pytest.raises(ValueError, match=r"bias: this prepared op was built with a bias"):
        biased.launch(**good)
    with pytest.raises(ValueError, match=r"bias must be aligned to 16 bytes, got 0x60008"):
        biased.launch(**good, bias=0x60008)
    res = op("fprop", FPROP, residual=True)
    with pytest.raises(ValueError, match=r"residual must be aligned to 16 bytes, got 0x60004"):
        res.launch(**good, residual=0x60004)
    wgrad = op("wgrad", WGRAD)
    for ws in (0, 0x800004):
        with pytest.raises(ValueError, match=r"workspace: this op needs \d+ fp32 elements of workspace"):
            wgrad.launch(0x10000, 0x20000, (0x30000,), workspace=ws)
    two = op("wgrad", WGRAD, bias=True)
    with pytest.raises(ValueError, match=r"out\[1\] must be a nonzero device pointer"):
        two.launch(0x10000, 0x20000, (0x30000, 0x40008), workspace=0x800000)
    assert not launches, "a refused call launched something"
    empty = op("fprop", dataclasses.replace(FPROP, n=0))
    with pytest.raises(ValueError, match=r"launch: this op's batch is empty"):
        empty.launch(**good)


def test_the_pointer_cache_is_bounded(monkeypatch):
    monkeypatch.setattr(pr, "_PTRS", {})
    for p in range(1, 5000):
        assert pr._ptr(p * 16) == p * 16
    assert 0 < len(pr._PTRS) <= 4096
    assert pr._ptr(16) is pr._ptr(16)  # a repeat address: the same scalar, not a new one


def test_stream_k_wgrad_launches_one_wave_then_its_reduction_on_the_same_workspace(launches, monkeypatch):
    """Stream-K (TmaWgmma(persistent=True) in wgrad, with db): the main kernel on one wave of
    blocks, then the reduction over dW's outputs, both reading the caller's workspace (the
    parts' slots, db's after them) and writing dW and db; the tensor maps stand in as their
    base pointers (encoding them needs a driver)."""
    from convgen.mainloop import TmaWgmma
    from convgen.spec import Plan
    from convgen.tma import TmaMaps

    monkeypatch.setattr(TmaMaps, "a", lambda self, ptr: ("map", ptr))
    monkeypatch.setattr(TmaMaps, "b", lambda self, ptr: ("map", ptr))
    layer = ConvProblem(14, 14, 128, 256, 3, 3, 1, 1, 1, n=8)
    wgrad = op("wgrad", layer, Plan(64, 64, 64, 4, 1, 4, 8, 8, loop=TmaWgmma(persistent=True)), bias=True)
    src = wgrad._kernel.source
    sk = src.main.grid(layer.n)[0]
    slots = 4 * 18 + sk - 1  # 72 tiles of 64x64 and a wave of blocks
    assert src.main.grid(layer.n) == (sk, 1, 1) and sk == SM90.sm_count * 2  # two 64x64 blocks an SM
    assert wgrad._ws_elems == slots * 64 * 64 and wgrad.workspace_elems == slots * 64 * 64 + slots * 64
    ws = 0x800000
    wgrad.launch(0x10000, 0x20000, (0x30000, 0x40000), workspace=ws, stream=0x99)
    assert [c["kernel"] for c in launches] == [src.main.kernel, src.reduce.kernel]
    main, red = (dict(zip(l.args, c["args"])) for l, c in zip((src.main, src.reduce), launches))
    assert (main["x_map"], main["dy_map"]) == (("map", 0x10000), ("map", 0x20000))
    db_ws = ws + 4 * wgrad._ws_elems
    for args in (main, red):
        assert (args["workspace"], args["db_workspace"], args["dw"], args["db"], args["batch"]) == (
            ws, db_ws, 0x30000, 0x40000, layer.n)
    assert launches[1]["grid"] == (-(-256 * 1152 // (256 * 4)), 1, 1) and launches[1]["block"] == (256, 1, 1)
    assert all(c["stream"] == 0x99 and not c["cooperative"] for c in launches)


@pytest.mark.parametrize("block_n,out_dtype", [(128, "float16"), (48, "float32"), (16, "float16")])
def test_a_tma_store_launch_maps_y_in_the_kernels_strips(launches, tma_encodes, block_n, out_dtype):
    """TmaWgmma(tma_store=True): y leaves through a third map, built at the first call on y's
    address, whose box must be the strip the kernel's warps fill (16 pixels x 16 * DRAIN_G
    filters, in y's dtype): a wider box would store bytes past the strip, a narrower one drop
    filters, and both compile and launch."""
    import re

    from convgen.mainloop import TmaWgmma
    from convgen.spec import Plan

    layer = ConvProblem(14, 14, 64, 96, 3, 3, 1, 1, 1, n=4)
    fprop = op("fprop", layer, Plan(64, block_n, 64, 4, 1, 3, 8, 8, loop=TmaWgmma(tma_store=True)),
               out_dtype=out_dtype)
    src = fprop._kernel.source
    fprop.launch(0x10000, 0x20000, (0x30000,))
    (y_map,) = [e for e in tma_encodes if e["ptr"] == 0x30000]
    strip = 16 * int(re.search(r"constexpr int DRAIN_G = (\d+);", src.source).group(1))
    assert y_map["box"] == [strip, 16] and y_map["dims"] == [96, 4 * 14 * 14]
    assert y_map["dtype"] == {"float16": "CU_TENSOR_MAP_DATA_TYPE_FLOAT16",
                              "float32": "CU_TENSOR_MAP_DATA_TYPE_FLOAT32"}[out_dtype]
    assert "y" not in src.main.args and dict(zip(src.main.args, launches[0]["args"]))["y_map"] is not None


def test_a_prepared_op_names_the_plan_its_kernel_runs(launches):
    """PreparedConv.plan: the caller's plan, else the one the runtime chose (here the
    planner's); and the bench's record of a row's plan reads it through a prepared twin of
    the row's call (convgen/tools/bench/rows.py: plan_run), which must name that same plan."""
    from convgen.suites import Layer
    from convgen.tools.bench import rows

    assert op("fprop", FPROP).plan == plan_for(FPROP, Pass.FPROP, SM90)
    hand = dataclasses.replace(plan_for(WGRAD, Pass.WGRAD, SM90), split_reduce="grid")
    assert op("wgrad", WGRAD, hand).plan == hand != plan_for(WGRAD, Pass.WGRAD, SM90)
    assert op("fprop", dataclasses.replace(FPROP, n=0)).plan is None  # an empty batch has no kernel
    item = rows.Item("t", Layer("wgrad-layer", WGRAD), Pass.WGRAD, rows.FUSED)  # dW and db
    assert rows.plan_run(item) == plan_for(WGRAD, Pass.WGRAD, SM90).as_dict()
