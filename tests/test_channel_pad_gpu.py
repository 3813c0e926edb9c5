"""An RGB stem's channels padded to 4 (convgen/channel_pad.py) on the GPU, against the float64
reference: fprop and wgrad of C = 3 layers through the plain functions, a prepared op with a
NaN-filled workspace of the caller's (the pad copies' scratch lies in it, so a channel the
copy leaves unwritten turns every sum it meets into NaN), and the pointer path. The small
shapes run with the rule's size floor lowered to 0, so every copy path (whole 8-row groups,
a short last group, fprop's w rows) meets odd sizes; one ImageNet-sized stem runs at the
real floor."""

from __future__ import annotations

import numpy as np
import pytest

import convgen
import convgen.channel_pad
from convgen import reference
from convgen.ir import ConvProblem, Pass
from convgen.mainloop import StagedHalo

from gpu_helpers import check_fp16 as _check, draw_layer, geo as _geo, kernel_view, poisoned

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("poison_outputs")]

SHAPES = [
    ConvProblem(40, 36, 3, 64, 7, 7, 2, 3, 1, n=4),     # an ImageNet stem, smaller
    ConvProblem(33, 31, 3, 32, 3, 3, 1, 1, 1, n=5),     # a VGG/UNet stem, odd sizes
    ConvProblem(17, 19, 3, 24, 3, 3, (2, 1), (0, 2), (1, 2), n=3),  # strided, dilated
    ConvProblem(13, 11, 3, 16, 1, 1, 1, 0, 1, n=7),     # 1x1; 1001 pixels: a short last group
    ConvProblem(20, 20, 3, 40, 5, 5, 1, 2, 1, n=6),     # 5x5: 1000 w rows
]
# VGG-16's stem, just over the floor (ResNet's 7x7 stem has a tuned plan in the shipped
# database for the H200, and a plan tuned for the layer as it is runs unpadded)
REAL = ConvProblem(224, 224, 3, 64, 3, 3, 1, 1, 1, n=14)


@pytest.fixture
def no_floor(monkeypatch):
    monkeypatch.setattr(convgen.channel_pad, "MIN_X_BYTES", 0)
    convgen.clear_cache()
    yield
    convgen.clear_cache()


@pytest.mark.parametrize("problem", SHAPES, ids=lambda p: p.describe().replace(" ", "_"))
def test_padded_fprop_and_wgrad_match_the_reference(problem, no_floor):
    _padded_passes(problem)


def test_an_imagenet_stem_pads_at_the_real_floor():
    convgen.clear_cache()
    _padded_passes(REAL)


def _padded_passes(problem: ConvProblem) -> None:
    import cupy as cp

    x, w, dy, bias = draw_layer("pad", problem)
    xd, wd, dyd, bd = (cp.asarray(a) for a in (x, w, dy, bias))
    ref_y = reference.fprop(kernel_view(x), kernel_view(w), bias.astype(np.float64), **_geo(problem))
    ref_dw, ref_db = reference.wgrad(kernel_view(x), kernel_view(dy), problem.w_shape, **_geo(problem))
    red_f, red_w = problem.r * problem.s * problem.c, problem.n * problem.p * problem.q

    _check(convgen.conv2d(xd, wd, bd, **_geo(problem)), ref_y, red_f, "conv2d")
    dw, db = convgen.conv2d_wgrad(xd, dyd, problem.w_shape, bias=True, **_geo(problem))
    _check(dw, ref_dw, red_w, "conv2d_wgrad dw")
    _check(db, ref_db, red_w, "conv2d_wgrad db")

    fop = convgen.prepare("fprop", problem.x_shape, problem.w_shape, bias=True, **_geo(problem))
    wop = convgen.prepare("wgrad", problem.x_shape, problem.w_shape, bias=True, **_geo(problem))
    for op, x_vec in ((fop, "vec_a"), (wop, "vec_b")):  # wgrad reads x as its B operand
        if op is fop and isinstance(op._kernel.source.spec.plan.loop, StagedHalo):
            assert op._copies is None, "a stride-1 stem's fprop runs the staged halo unpadded"
            continue
        assert isinstance(op._copies, convgen.channel_pad.ChannelPad) and op._copies.cp == 4, "the op does not pad its channels"
        plan = op._kernel.source.spec.plan
        assert getattr(plan, x_vec) == 4, f"the padded kernel does not gather x in 8-byte runs: {plan.brief()}"
    for trial in range(2):  # the second call reuses the op's packed launch and its scratch
        ws = cp.full(fop.workspace_elems, np.nan, dtype=cp.float32)
        _check(fop(xd, wd, bd, workspace=ws), ref_y, red_f, f"prepared fprop, call {trial}")
        ws = cp.full(wop.workspace_elems, np.nan, dtype=cp.float32)
        dw, db = wop(xd, dyd, workspace=ws)
        _check(dw, ref_dw, red_w, f"prepared wgrad dw, call {trial}")
        _check(db, ref_db, red_w, f"prepared wgrad db, call {trial}")

    # the pointer path (convgen.torch's): caller's outputs and workspace, a raw stream
    # (every buffer poisoned before either launch and kept until the stream is done: a
    # buffer freed while its kernel runs on the raw stream could be handed out again)
    y, fws = poisoned(problem.y_shape, cp.float16), poisoned(fop.workspace_elems, cp.float32)
    dw, db = poisoned(problem.w_shape, cp.float16), poisoned(problem.k, cp.float16)
    wws = poisoned(wop.workspace_elems, cp.float32)
    stream = cp.cuda.Stream(non_blocking=True)
    fop.launch(xd.data.ptr, wd.data.ptr, (y.data.ptr,), bias=bd.data.ptr, workspace=fws.data.ptr, stream=stream.ptr)
    wop.launch(xd.data.ptr, dyd.data.ptr, (dw.data.ptr, db.data.ptr), workspace=wws.data.ptr, stream=stream.ptr)
    stream.synchronize()
    _check(y, ref_y, red_f, "launch() fprop")
    _check(dw, ref_dw, red_w, "launch() wgrad dw")
    _check(db, ref_db, red_w, "launch() wgrad db")


def test_a_hand_plan_and_dgrad_run_unpadded(no_floor):
    """dgrad writes the narrow channels itself, and a hand plan names the kernel to run."""
    problem = SHAPES[1]
    op = convgen.prepare("dgrad", problem.x_shape, problem.w_shape, **_geo(problem))
    assert op._copies is None
    plan = convgen.plan(problem, Pass.FPROP)
    op = convgen.prepare("fprop", problem.x_shape, problem.w_shape, plan=plan, **_geo(problem))
    assert op._copies is None and op._kernel.source.spec.geometry.c == 3
