"""The TMA main loop (TmaWgmma) on the GPU, against the float64 reference.

The copy engine does this kind's im2col: its bounding box, traversal stride and tap offsets
come from the tensor map (convgen/tma.py) and the producer's coordinates, so the shapes
below vary each of them on its own axis (non-square padding, filters, strides and
dilations tell H from W), and the batch's last tile runs past the last pixel.  Outputs are
poisoned (NaN) before every launch.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from convgen.ir import ConvProblem, Pass, Plan
from convgen.mainloop import TmaWgmma

from gpu_helpers import check, run_pass

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("poison_outputs")]


@pytest.fixture(scope="module", autouse=True)
def _sm90():
    from convgen.compile import detect_target

    arch = detect_target().arch
    if arch != "sm_90":
        pytest.skip(f"the TMA main loop runs on sm_90 (sm_90a) only; this GPU is {arch}")


def _seed(*parts) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(repr(parts).encode()))


TMA_SHAPES = [
    ConvProblem(9, 11, 64, 16, 3, 3, 1, 1, 1, n=3),                  # M tail: 297 pixels; K < BN
    ConvProblem(14, 14, 128, 72, 1, 1, 1, 0, 1, n=2),                # pointwise; K tail of 72
    ConvProblem(16, 15, 64, 40, 1, 1, 2, 0, 1, n=3),                 # strided 1x1 (ResNet's shortcut)
    ConvProblem(15, 13, 64, 48, 3, 5, (2, 1), (1, 2), (2, 1), n=2),  # every H/W pair differs
    ConvProblem(12, 10, 64, 24, 3, 2, (1, 3), (0, 1), (1, 2), n=2),
    ConvProblem(9, 9, 64, 32, 7, 7, 2, 3, 1, n=2),                   # 7x7 stride 2 (a stem's reach)
    ConvProblem(8, 8, 192, 136, 3, 3, 1, 1, 1, n=5),                 # three channel steps per tap
    ConvProblem(7, 7, 64, 64, 3, 3, 1, 2, 2, n=3),                   # dilation 2, padding 2
]
TMA_PLANS = [
    Plan(128, 256, 64, 8, 1, 4, 8, 8, loop=TmaWgmma()),
    Plan(128, 128, 64, 8, 1, 5, 8, 8, loop=TmaWgmma()),
    Plan(64, 128, 64, 4, 1, 6, 8, 8, loop=TmaWgmma()),
    Plan(64, 48, 64, 4, 1, 2, 8, 8, loop=TmaWgmma()),
]


@pytest.mark.parametrize("problem", TMA_SHAPES, ids=lambda p: p.describe().replace(" ", "_"))
@pytest.mark.parametrize("plan", TMA_PLANS, ids=lambda p: p.brief().replace(" ", "_"))
def test_tma_exact_tier(problem, plan):
    """Integer data, bit for bit, with a bias: every pixel the copy engine gathers (the
    padding's zeros, the stride, each tap's offset), the swizzle the descriptors undo, and
    the accumulator layout the drain reads."""
    res = run_pass(problem, Pass.FPROP, _seed("tma", problem, plan), out_dtype="float32", bias=True, plan=plan,
                   exact=True)
    check(res, "float32", exact=True, what=f"fprop {problem.describe()} {plan.brief()}")


@pytest.mark.parametrize("out_dtype", ["float16", "float32"])
@pytest.mark.parametrize("relu", [False, True])
def test_tma_epilogues(out_dtype, relu):
    """Normal data through the fp16 and fp32 stores, with and without ReLU."""
    problem = ConvProblem(28, 28, 128, 128, 3, 3, 1, 1, 1, n=4)
    plan = TMA_PLANS[0]
    res = run_pass(problem, Pass.FPROP, _seed("tma-epi", out_dtype, relu), out_dtype=out_dtype, bias=True,
                   relu=relu, plan=plan)
    check(res, out_dtype, what=f"fprop {problem.describe()} {plan.brief()} relu={relu}")


def test_tma_maps_follow_the_buffers():
    """A prepared op gets new buffers each call (as a framework's allocator hands them out):
    each call's tensor maps must be the ones of its own arrays, including a buffer seen
    before, and a view that starts 16 bytes into an allocation."""
    import cupy as cp

    import convgen
    from convgen import reference

    problem = ConvProblem(10, 10, 64, 64, 3, 3, 1, 1, 1, n=2)
    op = convgen.prepare("fprop", problem.x_shape, problem.w_shape, padding=1, plan=TMA_PLANS[1])
    rng = _seed("tma-maps")
    xs = [rng.integers(-2, 3, size=problem.x_shape).astype(np.float16) for _ in range(3)]
    ws = [rng.integers(-2, 3, size=problem.w_shape).astype(np.float16) for _ in range(3)]
    dx = [cp.asarray(x) for x in xs]
    dw = [cp.asarray(w) for w in ws]
    padded = cp.zeros(xs[2].size + 8, dtype=cp.float16)  # xs[2] 16 bytes into its buffer
    padded[8:] = cp.asarray(xs[2]).ravel()
    dx[2] = padded[8:].reshape(problem.x_shape)
    for i in (0, 1, 0, 2, 1):
        y = cp.full(problem.y_shape, cp.nan, dtype=cp.float16)
        op(dx[i], dw[(i + 1) % 3], out=y)
        ref = reference.fprop(xs[i].astype(np.float64), ws[(i + 1) % 3].astype(np.float64), None, padding=1)
        np.testing.assert_array_equal(cp.asnumpy(y).astype(np.float64), ref.astype(np.float16).astype(np.float64),
                                      err_msg=f"call with x[{i}], w[{(i + 1) % 3}]")


@st.composite
def tma_problems(draw):
    n = draw(st.integers(1, 6))
    r, s = draw(st.integers(1, 5)), draw(st.integers(1, 5))
    stride = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    pad = (draw(st.integers(0, 3)), draw(st.integers(0, 3)))
    dil = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    reach_h, reach_w = (r - 1) * dil[0] + 1, (s - 1) * dil[1] + 1
    h = draw(st.integers(max(1, reach_h - 2 * pad[0]), 20))
    w = draw(st.integers(max(1, reach_w - 2 * pad[1]), 20))
    c = 64 * draw(st.integers(1, 3))
    k = draw(st.integers(1, 160))
    return ConvProblem(h, w, c, k, r, s, stride, pad, dil, n=n)


@given(problem=tma_problems(), plan=st.sampled_from(TMA_PLANS), seed=st.integers(0, 2**32 - 1))
def test_fuzz_tma(problem, plan, seed):
    res = run_pass(problem, Pass.FPROP, np.random.default_rng(seed), plan=plan, bias=True, relu=True)
    check(res, "float16", what=f"fprop {problem.describe()} {plan.brief()}")
