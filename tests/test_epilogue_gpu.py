"""fprop's residual epilogue, y = act(alpha * conv(x, w) + bias + beta * residual), and GELU,
on the GPU against the float64 reference, in every fprop main-loop kind (each drains its
accumulators through the same epilogue part; split-K applies it in the reduction)."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from convgen.ir import ConvProblem, Pass
from convgen.spec import Plan
from convgen.mainloop import HaloTile, StagedHalo, TmaWgmma

from gpu_helpers import check, run_pass

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("poison_outputs")]

# (problem, plan, needs sm_90): a layer and a hand plan per fprop main-loop kind, tails in M and N
KINDS = [
    ("planned", ConvProblem(9, 11, 16, 24, 3, 3, 1, 1, 1, n=3), None, False),
    ("split-k", ConvProblem(9, 11, 16, 24, 3, 3, 1, 1, 1, n=3), Plan(64, 32, 16, 2, 2, 2, 8, 8, split_k=3), False),
    ("halo", ConvProblem(9, 11, 16, 24, 3, 3, 1, 1, 1, n=3), Plan(64, 32, 16, 2, 2, 2, 8, 8, loop=HaloTile(16)), False),
    ("halo-tiles", ConvProblem(9, 11, 16, 24, 3, 3, 1, 1, 1, n=3), Plan(64, 32, 16, 2, 2, 2, 8, 8, loop=HaloTile(16, 2)),
     False),
    ("staged-halo", ConvProblem(17, 13, 3, 24, 3, 3, 1, 1, 1, n=2), Plan(64, 32, 32, 4, 1, 2, 1, 1, loop=StagedHalo(16)),
     False),
    ("tma", ConvProblem(9, 11, 64, 40, 3, 3, 1, 1, 1, n=3), Plan(64, 48, 64, 4, 1, 3, 8, 8, loop=TmaWgmma()), True),
    ("tma-persistent", ConvProblem(14, 13, 64, 40, 3, 3, 1, 1, 1, n=24),
     Plan(128, 64, 64, 8, 1, 3, 8, 8, loop=TmaWgmma(persistent=True)), True),
    ("tma-pingpong", ConvProblem(14, 13, 64, 40, 3, 3, 1, 1, 1, n=24),
     Plan(128, 64, 64, 8, 1, 3, 8, 8, loop=TmaWgmma(persistent=True, pingpong=True)), True),
]


def _skip_without_sm90(needs: bool) -> None:
    if needs:
        from convgen.compile import detect_target

        arch = detect_target().arch
        if arch != "sm_90":
            pytest.skip(f"the TMA main loop runs on sm_90 (sm_90a) only; this GPU is {arch}")


@pytest.mark.parametrize("name,problem,plan,sm90", KINDS, ids=[k[0] for k in KINDS])
@pytest.mark.parametrize("out_dtype", ["float32", "float16"])
def test_residual_exact_tier(name, problem, plan, sm90, out_dtype):
    """Integer data, bit for bit (every value of alpha * conv + bias + beta * r is exact in
    fp32, and in fp16 at these magnitudes), with ReLU: the residual's run is read at its own
    row and columns, its tail columns are never read past N, and the scales are applied."""
    _skip_without_sm90(sm90)
    rng = np.random.default_rng(zlib.crc32(repr(("residual", name, out_dtype)).encode()))
    res = run_pass(problem, Pass.FPROP, rng, out_dtype=out_dtype, bias=True, relu=True, plan=plan, exact=True,
                   residual=True, alpha=2.0, beta=-1.0)
    check(res, out_dtype, exact=out_dtype == "float32", what=f"fprop {problem.describe()} {name} residual")


@pytest.mark.parametrize("name,problem,plan,sm90", KINDS, ids=[k[0] for k in KINDS])
def test_gelu_with_and_without_residual(name, problem, plan, sm90):
    """Normal data through GELU (the erf form), alone and on a residual with beta = 0.5."""
    _skip_without_sm90(sm90)
    for residual in (False, True):
        rng = np.random.default_rng(zlib.crc32(repr(("gelu", name, residual)).encode()))
        res = run_pass(problem, Pass.FPROP, rng, bias=True, gelu=True, plan=plan, residual=residual, beta=0.5)
        check(res, "float16", what=f"fprop {problem.describe()} {name} gelu residual={residual}")


@pytest.mark.parametrize("view", ["strided", "offset"])
def test_residual_views_are_read_as_dense_arrays(view):
    """A residual the drain cannot read in vector runs (a channel slice of a wider array, or
    an array 2 bytes past a 16-byte boundary) gives the same y as its dense copy."""
    import cupy as cp
    import convgen
    from convgen import reference
    from gpu_helpers import draw, kernel_view

    problem = ConvProblem(9, 11, 16, 24, 3, 3, 1, 1, 1, n=3)
    rng = np.random.default_rng(zlib.crc32(repr(("residual-view", view)).encode()))
    x, w = draw(rng, problem.x_shape, "float16", True), draw(rng, problem.w_shape, "float16", True)
    r = draw(rng, problem.y_shape, "float16", True)
    if view == "strided":
        wide = cp.asarray(np.concatenate([r, r[..., :8]], axis=-1))
        r_dev = wide[..., :problem.k]
        assert not r_dev.flags.c_contiguous
    else:
        flat = cp.empty(r.size + 1, cp.float16)
        flat[1:] = cp.asarray(r.ravel())
        r_dev = flat[1:].reshape(r.shape)
        assert r_dev.data.ptr % 16
    y = convgen.conv2d(cp.asarray(x), cp.asarray(w), residual=r_dev, beta=-1.0, padding=1)  # small integers: exact in fp16
    ref = reference.fprop(kernel_view(x), kernel_view(w), None, padding=1, residual=r.astype(np.float64), beta=-1.0)
    assert np.abs(ref).max() < 2048
    np.testing.assert_array_equal(cp.asnumpy(y).astype(np.float64), ref)
