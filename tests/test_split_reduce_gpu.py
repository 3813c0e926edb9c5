"""Split-K summed in the main kernel (plan.split_reduce="grid": a cooperative launch and a
grid-wide barrier, then every block sums a share of the slices) on the GPU.

Each kind that splits wgrad's K (the im2col loop, the TMA loop, the depthwise stencil), dense and
grouped, runs
its planner's plan with the slices summed in the kernel: the exact tier (small integers, so
every sum is exact and any slice summed twice or not at all shows), with and without db;
then normal data twice in a row and once replayed from a CUDA graph, which must agree bit
for bit (a fixed summing order); and a grid too large to be resident at once is refused
with a clear error instead of hanging.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import convgen
from convgen.compile import detect_target
from convgen.ir import ConvProblem, Pass
from convgen.planner import plan as plan_for
from convgen.spec import Plan

from gpu_helpers import check, draw_layer, geo, poisoned, run_pass, seeded

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("poison_outputs")]

CASES = [
    ConvProblem(32, 32, 16, 16, 3, 3, 1, 1, 1, n=64),  # im2col, many slices of one tile row
    ConvProblem(17, 13, 24, 40, 3, 3, 2, 1, 1, n=8),  # odd: N = 216 is a multiple of 4, K = 40
    ConvProblem(9, 11, 5, 21, 3, 1, 1, (1, 0), 1, n=16),  # N = R*S*C = 15, K = 21: one output a thread, dw and db
    ConvProblem(7, 7, 64, 96, 1, 1, 1, 0, 1, n=64),  # 1x1
    ConvProblem(14, 14, 64, 128, 3, 3, 1, 1, 1, n=32),  # the TMA loop's (C a multiple of 64)
    ConvProblem(28, 28, 64, 64, 3, 3, 1, 1, 1, groups=64, n=16),  # depthwise
    ConvProblem(14, 14, 32, 64, 5, 5, 2, 2, 1, groups=32, n=8),  # depthwise, multiplier 2, strided
    ConvProblem(14, 14, 64, 96, 3, 3, 1, 1, 1, groups=8, n=16),  # grouped: G GEMMs side by side (im2col)
    ConvProblem(14, 14, 256, 256, 3, 3, 1, 1, 1, groups=4, n=16),  # grouped, 64 channels a group: the TMA loop
]


def grid_plan(problem: ConvProblem) -> Plan:
    """The planner's wgrad plan for this GPU with its slices summed in the kernel (4 slices
    where the planner did not split)."""
    p = plan_for(problem, Pass.WGRAD, detect_target())
    return dataclasses.replace(p, split_k=max(p.split_k, 4), split_reduce="grid",
                               reasons=p.reasons + ("split-K summed in the main kernel (test)",))


@pytest.mark.parametrize("bias", [False, True], ids=["dw", "dw+db"])
@pytest.mark.parametrize("problem", CASES, ids=lambda p: p.describe().replace(" ", "_"))
def test_exact(problem, bias):
    p = grid_plan(problem)
    res = run_pass(problem, "wgrad", seeded("grid-exact", problem, bias), out_dtype="float32", bias=bias, plan=p,
                   exact=True)
    check(res, "float32", exact=True, what=f"wgrad {problem.describe()} {p.brief()}")


@pytest.mark.parametrize("problem", CASES, ids=lambda p: p.describe().replace(" ", "_"))
def test_repeatable_and_captured_in_a_graph(problem):
    """Normal data: within the tolerance of the reference; a second call and a CUDA-graph
    replay (a cooperative kernel captured on a stream) give the same bits."""
    import cupy as cp

    from convgen import reference
    from gpu_helpers import check_fp16, kernel_view

    p = grid_plan(problem)
    x, _, dy, _ = draw_layer("grid-repeat", problem)
    xd, dyd = cp.asarray(x), cp.asarray(dy)
    g = dict(geo(problem), groups=problem.groups)
    op = convgen.prepare("wgrad", problem.x_shape, problem.w_shape, bias=True, plan=p, **g)
    ref_dw, ref_db = reference.wgrad(kernel_view(x), kernel_view(dy), problem.w_shape, **g)
    outs = []
    for _ in range(2):
        dw, db = poisoned(problem.w_shape, cp.float16), poisoned((problem.k,), cp.float16)
        op(xd, dyd, out=(dw, db))
        check_fp16(dw, ref_dw, problem.gemm("wgrad").k, f"dw {p.brief()}")
        check_fp16(db, ref_db, problem.gemm("wgrad").k, f"db {p.brief()}")
        outs.append((cp.asnumpy(dw), cp.asnumpy(db)))
    stream = cp.cuda.Stream(non_blocking=True)
    dw, db = poisoned(problem.w_shape, cp.float16), poisoned((problem.k,), cp.float16)
    ws = cp.empty(op.workspace_elems, dtype=cp.float32)
    with stream:
        stream.begin_capture()
        op(xd, dyd, out=(dw, db), workspace=ws)
        graph = stream.end_capture()
    dw.fill(np.nan)
    db.fill(np.nan)
    cp.cuda.get_current_stream().synchronize()
    graph.launch(stream)
    stream.synchronize()
    outs.append((cp.asnumpy(dw), cp.asnumpy(db)))
    for i, (a, b) in enumerate(outs[1:], 1):
        assert np.array_equal(a, outs[0][0]) and np.array_equal(b, outs[0][1]), (
            f"{'the graph replay' if i == 2 else 'the second call'} differs from the first ({p.brief()})")


def test_a_grid_too_large_to_be_resident_is_refused():
    """8192 one-warp blocks (a 16x16 tile, 8192 slices) are more than any GPU holds at once:
    the kernel is refused when loaded, naming the plan's option, and never launched."""
    problem = ConvProblem(32, 32, 16, 16, 1, 1, 1, 0, 1, n=256)
    p = Plan(16, 16, 32, 1, 1, 3, 8, 8, split_k=8192, split_reduce="grid")
    x, _, dy, _ = draw_layer("grid-too-large", problem)
    import cupy as cp

    with pytest.raises(ValueError, match=r"split_reduce='grid' launches all 8192 blocks"):
        convgen.conv2d_wgrad(cp.asarray(x), cp.asarray(dy), problem.w_shape, plan=p)


def test_a_tuned_grid_that_is_not_resident_falls_back_exact(monkeypatch):
    """A tuned plan summing its slices in the kernel, on a GPU said to hold one block at once:
    the runtime warns and runs the same plan with the reduction kernel, exactly."""
    import convgen.compile as cc
    import convgen.runtime as rt

    problem = CASES[5]  # depthwise: tuning on first use offers its grid-summed twin second
    tuned = grid_plan(problem)
    real = rt.kernel_problem
    monkeypatch.setattr(rt, "kernel_problem", lambda prob, pass_, *a, **k: (
        real(prob, pass_, *a, **k)[0], tuned if Pass.parse(pass_) is Pass.WGRAD else None))
    monkeypatch.setattr(cc, "resident_blocks", lambda *a: 1)
    monkeypatch.setattr(rt, "_cache", {})
    monkeypatch.setattr(rt, "_calls", {})
    with pytest.warns(RuntimeWarning, match="sums its slices in a second kernel"):
        res = run_pass(problem, "wgrad", seeded("grid-fallback", problem), out_dtype="float32", bias=True, exact=True)
    check(res, "float32", exact=True, what=f"wgrad {problem.describe()} {tuned.brief()} -> kernel-summed")
