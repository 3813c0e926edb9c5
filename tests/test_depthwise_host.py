"""Depthwise kernels run on the host (tests/host_kernel.py): their emitted CUDA, compiled by g++,
against the float64 reference.

The held-filter fprop loop (Depthwise.out_rows, kernels/fprop_depthwise_held.j2) was written
with no GPU to run it; here its source runs, block by block and thread by thread, on integer
data whose sums are exact, on layers that take every branch of its walk: strides, dilation,
channel multipliers, tiles past the image's edge and the batch's last tile, chunks past C,
spare lanes, and the fused epilogues.  The default plans (which the GPU suite has run) go
through the same harness as its control.
"""

from __future__ import annotations

import dataclasses
import zlib

import numpy as np
import pytest

import host_kernel
from convgen import reference
from convgen.candidates import candidates
from convgen.depthwise_wgrad import plan_wgrad
from convgen.emit import emit
from convgen.ir import ConvProblem, Epilogue, Pass, Target
from convgen.spec import KernelSpec

pytestmark = pytest.mark.skipif(host_kernel.GXX is None, reason="no host C++ compiler (g++) to run kernels on the host")


def dw(h, w, c, f, stride=1, pad=0, dil=1, mult=1, n=2):
    return ConvProblem(n=n, h=h, w=w, c=c, k=c * mult, r=f, s=f, stride=(stride, stride), padding=(pad, pad),
                       dilation=(dil, dil), groups=c)


LAYERS = [
    dw(13, 11, 96, 7, 1, 3),            # ConvNeXt's 7x7 on an odd image: edge tiles, a 32-channel last chunk
    dw(7, 7, 48, 7, 1, 3, n=3),         # a 7x7 image under 8x8 tiles, three images
    dw(12, 9, 40, 5, 2, 2),             # EfficientNet's 5x5 at stride 2, C = 40: 8-channel vectors only
    dw(10, 10, 24, 3, 1, 2, dil=2),     # dilation 2, a narrow chunk (wide tiles, spare lanes)
    dw(9, 10, 16, 3, 2, 1, mult=2),     # two filters a channel, stride 2
    ConvProblem(n=2, h=11, w=13, c=8, k=24, r=3, s=5, stride=(1, 2), padding=(1, 2), groups=8),  # 3x5, three filters
]


def _held(problem: ConvProblem) -> list:
    plans = candidates(problem, Pass.FPROP, Target("sm_90"))
    return [p for p in plans if p.loop.out_rows > 1]


def _data(problem: ConvProblem, *parts):
    rng = np.random.default_rng(zlib.crc32(repr((problem, *parts)).encode()))
    x = rng.integers(-3, 4, (problem.n, problem.h, problem.w, problem.c)).astype(np.float16)
    w = rng.integers(-3, 4, problem.w_shape).astype(np.float16)
    bias = rng.integers(-4, 5, problem.k).astype(np.float32)
    return x, w, bias


def _reference(problem: ConvProblem, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    return reference.fprop(x.astype(np.float64), w.astype(np.float64), stride=problem.stride,
                           padding=problem.padding, dilation=problem.dilation, groups=problem.groups)


@pytest.mark.parametrize("problem", LAYERS, ids=lambda p: p.describe().replace(" ", "_"))
def test_held_filter_fprop_runs_exactly_on_the_host(problem, tmp_path):
    """Every held-filter candidate of the layer (and the default, the harness's control), bias
    added, float32 out: bit for bit the float64 reference, every output written."""
    plans = _held(problem)
    assert plans, "the tuner offers held-filter plans on this layer"
    default = candidates(problem, Pass.FPROP, Target("sm_90"))[0]
    x, w, bias = _data(problem, "held")
    want = _reference(problem, x, w) + bias
    for plan in [default, *plans]:
        ks = emit(KernelSpec(problem, Pass.FPROP, Epilogue(bias=True, out_dtype="float32"), "float16",
                             Target("sm_90"), plan))
        got = host_kernel.run(ks, problem.n, dict(x=x, w=w, bias=bias), want.shape, np.float32, tmp_path)
        np.testing.assert_array_equal(got, want, err_msg=f"{plan.brief()} ({plan.reasons[0]})")


@pytest.mark.parametrize("problem", [LAYERS[2], LAYERS[4]], ids=lambda p: p.describe().replace(" ", "_"))
def test_depthwise_dgrad_default_runs_exactly_on_the_host(problem, tmp_path):
    """The harness on the other stencil (dgrad's residue walk, strides 2, a multiplier): the
    default plan, which the GPU suite runs, bit for bit the reference here too."""
    rng = np.random.default_rng(zlib.crc32(repr((problem, "dgrad")).encode()))
    dy = rng.integers(-3, 4, (problem.n, problem.p, problem.q, problem.k)).astype(np.float16)
    w = rng.integers(-3, 4, problem.w_shape).astype(np.float16)
    want = reference.dgrad(dy.astype(np.float64), w.astype(np.float64), (problem.n, problem.h, problem.w, problem.c),
                           stride=problem.stride, padding=problem.padding, dilation=problem.dilation,
                           groups=problem.groups)
    plan = candidates(problem, Pass.DGRAD, Target("sm_90"))[0]
    ks = emit(KernelSpec(problem, Pass.DGRAD, Epilogue(out_dtype="float32"), "float16", Target("sm_90"), plan))
    got = host_kernel.run(ks, problem.n, dict(dy=dy, w=w), want.shape, np.float32, tmp_path)
    np.testing.assert_array_equal(got, want, err_msg=plan.brief())


MMA_LAYERS = [
    LAYERS[0],                          # ConvNeXt's 7x7 on an odd image, a 32-channel last chunk
    LAYERS[1],                          # a 7x7 image under 16-row tiles, three images
    dw(11, 19, 40, 5, 1, 2),            # 5x5, C = 40: chunks past C
    dw(9, 9, 24, 3, 1, 1, n=3),         # 3x3
    ConvProblem(n=2, h=10, w=13, c=16, k=16, r=3, s=5, padding=(1, 2), groups=16),  # 3x5, unequal padding
    dw(6, 8, 8, 9, 1, 4),               # a 9-wide filter: B's 16 rows all taps or zeros at the window's end
]


def _mma(problem: ConvProblem) -> list:
    return [p for p in candidates(problem, Pass.FPROP, Target("sm_90")) if p.loop.mma]


@pytest.mark.parametrize("problem", MMA_LAYERS, ids=lambda p: p.describe().replace(" ", "_"))
def test_mma_stencil_fprop_runs_exactly_on_the_host(problem, tmp_path):
    """Every mma.sync stencil candidate of the layer (Depthwise.mma: channel-major planes,
    ldmatrix, banded Toeplitz filter rows, sums back through shared memory), bias added, float32
    out: bit for bit the float64 reference, every output written."""
    plans = _mma(problem)
    assert plans, "the tuner offers the mma.sync stencil on this layer"
    x, w, bias = _data(problem, "mma")
    want = _reference(problem, x, w) + bias
    for plan in plans:
        ks = emit(KernelSpec(problem, Pass.FPROP, Epilogue(bias=True, out_dtype="float32"), "float16",
                             Target("sm_90"), plan))
        got = host_kernel.run(ks, problem.n, dict(x=x, w=w, bias=bias), want.shape, np.float32, tmp_path)
        np.testing.assert_array_equal(got, want, err_msg=f"{plan.brief()} ({plan.reasons[0]})")


@pytest.mark.parametrize("form", ["held", "mma"])
def test_fprop_forms_fused_epilogues_on_the_host(form, tmp_path):
    """The stencils' shared epilogue piece in the held-filter and mma.sync loops: bias and ReLU
    to float16 (exact: small integers), then alpha*conv + beta*residual with GELU (float32, to
    rounding)."""
    problem = LAYERS[0]
    plan = (_held if form == "held" else _mma)(problem)[0]
    x, w, bias = _data(problem, form, "epilogue")
    conv = _reference(problem, x, w)
    ks = emit(KernelSpec(problem, Pass.FPROP, Epilogue(bias=True, relu=True), "float16", Target("sm_90"), plan))
    got = host_kernel.run(ks, problem.n, dict(x=x, w=w, bias=bias), conv.shape, np.float16, tmp_path)
    np.testing.assert_array_equal(got.astype(np.float64), np.maximum(conv + bias, 0))
    residual = np.random.default_rng(7).standard_normal(conv.shape).astype(np.float32)
    ks = emit(KernelSpec(problem, Pass.FPROP, Epilogue(out_dtype="float32", gelu=True, residual=True), "float16",
                         Target("sm_90"), plan))
    got = host_kernel.run(ks, problem.n, dict(x=x, w=w, residual=residual, alpha=0.5, beta=-1.25), conv.shape,
                          np.float32, tmp_path)
    from math import erf

    v = 0.5 * conv - 1.25 * residual.astype(np.float64)
    want = 0.5 * v * (1 + np.vectorize(erf)(v / np.sqrt(2)))
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-6


def _unsplit(plan):
    """The plan summing all the batch's tiles in one slice: the host runs no grid-wide barrier."""
    return dataclasses.replace(plan, split_k=1, split_reduce="kernel")


# (the dilated layer at stride 2: at stride 1 a dilation of 2 leaves two dy rows no x row to share)
ROW_LAYERS = [*LAYERS[:3], dw(12, 12, 24, 3, 2, 2, dil=2), *LAYERS[4:]]


@pytest.mark.parametrize("problem", ROW_LAYERS, ids=lambda p: p.describe().replace(" ", "_"))
def test_wgrad_row_runs_run_exactly_on_the_host(problem, tmp_path):
    """wgrad's runs of several dy rows (Depthwise.out_rows, depthwise_wgrad.row_run): each staged
    x row meets every (dy row, filter row) pair of the run once, through the stride and dilation
    of the layer.  Every such candidate (the default among them on 7x7), and the plan of one-row
    runs (the control, which the GPU suite runs), unsplit, float32 out: bit for bit the float64
    reference on integer data, every dW written."""
    plans = [p for p in candidates(problem, Pass.WGRAD, Target("sm_90")) if p.loop.out_rows > 1]
    assert plans, "the tuner offers runs of several rows on this layer"
    one_row = plan_wgrad(problem, Target("sm_90"), "float16", [], row_runs=False)  # (what the GPU suite ran before)
    rng = np.random.default_rng(zlib.crc32(repr((problem, "wgrad")).encode()))
    x = rng.integers(-3, 4, (problem.n, problem.h, problem.w, problem.c)).astype(np.float16)
    dy = rng.integers(-3, 4, (problem.n, problem.p, problem.q, problem.k)).astype(np.float16)
    want, _ = reference.wgrad(x.astype(np.float64), dy.astype(np.float64), problem.w_shape, stride=problem.stride,
                              padding=problem.padding, dilation=problem.dilation, groups=problem.groups)
    for plan in [one_row, *plans]:
        ks = emit(KernelSpec(problem, Pass.WGRAD, Epilogue(bias=False, out_dtype="float32"), "float16",
                             Target("sm_90"), _unsplit(plan)))
        got = host_kernel.run(ks, problem.n, dict(x=x, dy=dy), want.shape, np.float32, tmp_path)
        np.testing.assert_array_equal(got, want, err_msg=f"{plan.brief()} {plan.reasons[:1]}")
