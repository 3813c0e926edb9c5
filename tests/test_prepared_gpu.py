"""Prepared ops (convgen.prepare) on the GPU, against the float64 reference.

Each case runs with poisoned outputs and caller-supplied outputs, twice in a row (the second call reuses the packed
parameters and the arena's workspace), and once more on operands the fast path must
not take as they are (a strided view, fp32 where fp16 is read).
"""

from __future__ import annotations

import numpy as np
import pytest

import convgen
from convgen import reference
from convgen.ir import ConvProblem

from gpu_helpers import check_fp16 as _check, draw_layer as _draw, geo as _geo, kernel_view, poisoned, seeded as _rng

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("poison_outputs")]

SHAPES = [
    ConvProblem(16, 16, 32, 64, 3, 3, 1, 1, 1, n=8),    # halo-eligible 3x3
    ConvProblem(15, 13, 24, 40, 3, 2, (2, 3), (1, 0), (2, 1), n=3),  # strided, dilated, odd
    ConvProblem(7, 7, 64, 96, 1, 1, 1, 0, 1, n=64),     # 1x1: split-K wgrad
    ConvProblem(32, 32, 3, 16, 3, 3, 1, 1, 1, n=16),    # C = 3
]


@pytest.fixture
def launch_path():
    return "cupy"


@pytest.mark.parametrize("problem", SHAPES, ids=lambda p: p.describe().replace(" ", "_"))
def test_prepared_passes(problem, launch_path):
    import cupy as cp

    x, w, dy, b = _draw("prepared", problem)
    xd, wd, dyd, bd = cp.asarray(x), cp.asarray(w), cp.asarray(dy), cp.asarray(b)
    geo = _geo(problem)

    fprop = convgen.prepare("fprop", problem.x_shape, problem.w_shape, bias=True, activation="relu", **geo)
    ref_y = reference.fprop(kernel_view(x), kernel_view(w), b, relu=True, **geo)
    y = cp.full(problem.y_shape, np.nan, dtype=cp.float16)
    for _ in range(2):
        assert fprop(xd, wd, bd, out=y) is y
        _check(y, ref_y, problem.gemm("fprop").k, f"fprop {launch_path}")
    _check(fprop(xd[:, :, ::-1][:, :, ::-1], wd.astype(cp.float32), bd), ref_y, problem.gemm("fprop").k,
           "fprop, a view and fp32 weights (the copying path)")

    dgrad = convgen.prepare("dgrad", problem.x_shape, problem.w_shape, **geo)
    ref_dx = reference.dgrad(kernel_view(dy), kernel_view(w), problem.x_shape, **geo)
    for _ in range(2):
        _check(dgrad(dyd, wd), ref_dx, problem.gemm("dgrad").k, f"dgrad {launch_path}")

    wgrad = convgen.prepare("wgrad", problem.x_shape, problem.w_shape, bias=True, **geo)
    ref_dw, ref_db = reference.wgrad(kernel_view(x), kernel_view(dy), problem.w_shape, **geo)
    dw = cp.full(problem.w_shape, np.nan, dtype=cp.float16)
    db = cp.full((problem.k,), np.nan, dtype=cp.float16)
    for _ in range(2):
        got_dw, got_db = wgrad(xd, dyd, out=(dw, db))
        assert got_dw is dw and got_db is db
        _check(dw, ref_dw, problem.gemm("wgrad").k, f"wgrad dw {launch_path}")
        _check(db, ref_db, problem.gemm("wgrad").k, f"wgrad db {launch_path}")


@pytest.mark.parametrize("split", [False, True], ids=["planned", "split-K"])
@pytest.mark.parametrize("problem", SHAPES, ids=lambda p: p.describe().replace(" ", "_"))
def test_a_float16_bias_is_read_as_it_is(problem, split):
    """fprop built with bias_dtype="float16" (convgen.torch's float16 models) adds the
    bias it is handed with no cast, in the main kernel's epilogue and in a split-K
    reduction's, and the plain function takes that path for a float16 bias."""
    import cupy as cp
    from convgen.spec import Plan

    x, w, _, b = _draw("bias16", problem)
    b16 = b.astype(np.float16)
    xd, wd, bd = cp.asarray(x), cp.asarray(w), cp.asarray(b16)
    geo = _geo(problem)
    plan = Plan(64, 32, 16, 2, 2, 2, 8 if problem.c % 8 == 0 else 1, 8 if problem.c % 8 == 0 else 1, split_k=3) \
        if split else None
    op = convgen.prepare("fprop", problem.x_shape, problem.w_shape, bias=True, bias_dtype="float16",
                         activation="relu", plan=plan, **geo)
    assert op.epilogue.bias_dtype == "float16" and (op.workspace_elems > 0) == split
    ref = reference.fprop(kernel_view(x), kernel_view(w), b16.astype(np.float64), relu=True, **geo)
    k = problem.gemm("fprop").k
    _check(op(xd, wd, bd), ref, k, "prepared, float16 bias")
    _check(convgen.conv2d(xd, wd, bd, activation="relu", plan=plan, **geo), ref, k, "convgen.conv2d, float16 bias")


def test_prepared_ops_share_one_stream_workspace_in_order(launch_path):
    """Two split-K ops on one stream use the same arena buffer; the second must not see the
    first's partial sums (stream order), and each result must match its reference."""
    import cupy as cp

    a = ConvProblem(7, 7, 64, 96, 1, 1, 1, 0, 1, n=64)
    b = ConvProblem(7, 7, 96, 64, 1, 1, 1, 0, 1, n=64)
    rng = _rng("arena")
    ops, refs, args = [], [], []
    for p in (a, b):
        x = rng.standard_normal(p.x_shape).astype(np.float16)
        dy = rng.standard_normal(p.y_shape).astype(np.float16)
        ops.append(convgen.prepare("wgrad", p.x_shape, p.w_shape))
        refs.append(reference.wgrad(kernel_view(x), kernel_view(dy), p.w_shape)[0])
        args.append((cp.asarray(x), cp.asarray(dy)))
    outs = [op(*xy)[0] for op, xy in zip(ops, args) for _ in range(3)]
    for i, out in enumerate(outs):
        _check(out, refs[i // 3], 64 * 49, f"wgrad {i} {launch_path}")


def test_prepared_op_under_cuda_graph_capture(launch_path):
    import cupy as cp

    p = ConvProblem(16, 16, 32, 64, 3, 3, 1, 1, 1, n=8)
    rng = _rng("graph")
    x = rng.standard_normal(p.x_shape).astype(np.float16)
    w = rng.standard_normal(p.w_shape).astype(np.float16)
    xd, wd = cp.asarray(x), cp.asarray(w)
    op = convgen.prepare("fprop", p.x_shape, p.w_shape, padding=1)
    y = cp.empty(p.y_shape, dtype=cp.float16)
    op(xd, wd, out=y)  # compile and warm before capture
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        op(xd, wd, out=y)
        graph = stream.end_capture()
    y.fill(np.nan)
    cp.cuda.get_current_stream().synchronize()  # the poison lands before the graph runs on its own stream
    graph.launch(stream)
    stream.synchronize()
    _check(y, reference.fprop(kernel_view(x), kernel_view(w), padding=1), p.gemm("fprop").k, f"graph {launch_path}")


def test_prepared_rejects_arrays_it_was_not_built_for():
    import cupy as cp

    p = ConvProblem(8, 8, 16, 32, 3, 3, 1, 1, 1, n=2)
    op = convgen.prepare("fprop", p.x_shape, p.w_shape, padding=1)
    x = cp.ones(p.x_shape, cp.float16)
    w = cp.ones(p.w_shape, cp.float16)
    with pytest.raises(ValueError, match=r"x has shape \(3, 8, 8, 16\)"):
        op(cp.ones((3, 8, 8, 16), cp.float16), w)
    with pytest.raises(ValueError, match="out must be a C-contiguous"):
        op(x, w, out=cp.empty((2, 8, 8, 32), cp.float32))
    with pytest.raises(ValueError, match="built without a bias"):
        op(x, w, cp.ones(32, cp.float32))
    with pytest.raises(TypeError, match="x must be a cupy.ndarray"):
        op(np.ones(p.x_shape, np.float16), w)


@pytest.mark.parametrize("problem", SHAPES, ids=lambda p: p.describe().replace(" ", "_"))
def test_prepared_launch_on_pointers(problem):
    """launch(): the framework path (convgen.torch), pointers and a raw stream, no CuPy
    arrays built; a side stream, a caller's split-K workspace, and db through it."""
    import cupy as cp

    x, w, dy, b = _draw("launch", problem)
    xd, wd, dyd, bd = cp.asarray(x), cp.asarray(w), cp.asarray(dy), cp.asarray(b)
    geo = _geo(problem)
    side = cp.cuda.Stream(non_blocking=True)
    cp.cuda.get_current_stream().synchronize()

    def workspace(op):  # the caller's split-K workspace, poisoned: the kernels must overwrite it
        ws = poisoned(max(op.workspace_elems, 1), cp.float32)
        keep.append(ws)
        return ws.data.ptr if op.workspace_elems else 0

    keep = []
    fprop = convgen.prepare("fprop", problem.x_shape, problem.w_shape, bias=True, **geo)
    y = poisoned(problem.y_shape, cp.float16)
    fprop.launch(xd.data.ptr, wd.data.ptr, (y.data.ptr,), bias=bd.data.ptr, workspace=workspace(fprop), stream=side.ptr)
    dgrad = convgen.prepare("dgrad", problem.x_shape, problem.w_shape, **geo)
    dx = poisoned(problem.x_shape, cp.float16)
    dgrad.launch(dyd.data.ptr, wd.data.ptr, (dx.data.ptr,), workspace=workspace(dgrad), stream=side.ptr)
    wgrad = convgen.prepare("wgrad", problem.x_shape, problem.w_shape, bias=True, **geo)
    dw = poisoned(problem.w_shape, cp.float16)
    db = poisoned((problem.k,), cp.float16)
    wgrad.launch(xd.data.ptr, dyd.data.ptr, (dw.data.ptr, db.data.ptr), workspace=workspace(wgrad), stream=side.ptr)
    side.synchronize()
    _check(y, reference.fprop(kernel_view(x), kernel_view(w), b, **geo), problem.gemm("fprop").k, "fprop launch")
    _check(dx, reference.dgrad(kernel_view(dy), kernel_view(w), problem.x_shape, **geo), problem.gemm("dgrad").k,
           "dgrad launch")
    ref_dw, ref_db = reference.wgrad(kernel_view(x), kernel_view(dy), problem.w_shape, **geo)
    _check(dw, ref_dw, problem.gemm("wgrad").k, "wgrad dw launch")
    _check(db, ref_db, problem.gemm("wgrad").k, "wgrad db launch")


def test_prepared_launch_refuses_bad_pointers():
    import cupy as cp

    p = ConvProblem(7, 7, 64, 96, 1, 1, 1, 0, 1, n=64)
    x, w = cp.ones(p.x_shape, cp.float16), cp.ones(p.w_shape, cp.float16)
    y = cp.empty(p.y_shape, cp.float16)
    op = convgen.prepare("fprop", p.x_shape, p.w_shape)
    with pytest.raises(ValueError, match="x must be a nonzero device pointer aligned to 16 bytes"):
        op.launch(x.data.ptr + 2, w.data.ptr, (y.data.ptr,))
    with pytest.raises(ValueError, match="out must hold 1 pointer"):
        op.launch(x.data.ptr, w.data.ptr, (y.data.ptr, y.data.ptr))
    with pytest.raises(ValueError, match="built without a bias"):
        op.launch(x.data.ptr, w.data.ptr, (y.data.ptr,), bias=y.data.ptr)
    rop = convgen.prepare("fprop", p.x_shape, p.w_shape, residual=True)
    with pytest.raises(ValueError, match="residual must be aligned to 16 bytes"):
        rop.launch(x.data.ptr, w.data.ptr, (y.data.ptr,), residual=y.data.ptr + 8)
    wg = convgen.prepare("wgrad", p.x_shape, p.w_shape)
    assert wg.workspace_elems > 0, "this layer's wgrad is expected to split K"
    with pytest.raises(ValueError, match="workspace: this op needs"):
        wg.launch(x.data.ptr, y.data.ptr, (cp.empty(p.w_shape, cp.float16).data.ptr,))


def test_prepare_many_compiles_in_parallel_and_gives_prepared_ops(tmp_path, monkeypatch):
    """A cold cache: prepare_many builds every layer's three ops (kernels compiled side by
    side), each computing what its reference says; its binaries are the ones prepare()
    then finds (no compile: the memory cache already has them)."""
    import cupy as cp

    from convgen import compile as cg_compile

    monkeypatch.setenv("CONVGEN_CACHE_DIR", str(tmp_path))
    convgen.clear_cache()
    cg_compile.clear_memory_cache()
    layers = [dict(pass_=pass_, x_shape=p.x_shape, w_shape=p.w_shape, bias=pass_ == "wgrad", **_geo(p))
              for p in SHAPES for pass_ in ("fprop", "dgrad", "wgrad")]
    ops = convgen.prepare_many(layers, workers=4)
    assert len(ops) == len(layers)
    def no_compile(*args, **kwargs):
        raise AssertionError("prepare() compiled a kernel prepare_many had built")

    monkeypatch.setattr(cg_compile, "compile_binary", no_compile)
    for i, p in enumerate(SHAPES):
        rng = _rng("many", p)
        x = rng.standard_normal(p.x_shape).astype(np.float16)
        w = rng.standard_normal(p.w_shape).astype(np.float16)
        dy = rng.standard_normal(p.y_shape).astype(np.float16)
        geo = _geo(p)
        fprop, dgrad, wgrad = ops[3 * i: 3 * i + 3]
        convgen.clear_cache()  # a new op from the binaries in memory (compile_binary would raise)
        convgen.prepare("fprop", p.x_shape, p.w_shape, **geo)
        _check(fprop(cp.asarray(x), cp.asarray(w)), reference.fprop(kernel_view(x), kernel_view(w), None, **geo),
               p.gemm("fprop").k, "prepare_many fprop")
        _check(dgrad(cp.asarray(dy), cp.asarray(w)), reference.dgrad(kernel_view(dy), kernel_view(w), p.x_shape, **geo),
               p.gemm("dgrad").k, "prepare_many dgrad")
        dw, db = wgrad(cp.asarray(x), cp.asarray(dy))
        ref_dw, ref_db = reference.wgrad(kernel_view(x), kernel_view(dy), p.w_shape, **geo)
        _check(dw, ref_dw, p.gemm("wgrad").k, "prepare_many wgrad dw")
        _check(db, ref_db, p.gemm("wgrad").k, "prepare_many wgrad db")
