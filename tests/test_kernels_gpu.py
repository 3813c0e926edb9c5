"""The generated kernels on a real GPU, against the float64 reference.

Every output starts as NaN (the poison_outputs fixture), every check draws
fresh random data, and the exact tier uses small integers so any indexing bug
shows as a bit difference, independent of tolerances.  Skipped without a GPU.
The halo, sliced-K and wgmma loops are tests/test_kernels_loops_gpu.py's, on the
shapes and helpers here.
"""

from __future__ import annotations

import dataclasses
import zlib

import numpy as np
import pytest
from hypothesis import given, strategies as st

import convgen
import convgen.runtime
from convgen import reference
from convgen.ir import ConvProblem, Pass
from convgen.spec import Plan
from convgen.mainloop import Im2col
from convgen.suites import SUITES

from gpu_helpers import check, rel_err, run_pass, tolerance

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("poison_outputs")]
PASSES = list(Pass)


@pytest.fixture(scope="module")
def target():
    from convgen.compile import detect_target

    return detect_target()


def _seed(*parts) -> np.random.Generator:
    """A generator per test case: fresh data for each case, the same from run to run."""
    return np.random.default_rng(zlib.crc32(repr(parts).encode()))


EXACT_SHAPES = [
    ConvProblem(9, 11, 8, 16, 3, 3, 1, 1, 1, n=3),
    ConvProblem(12, 10, 3, 20, 3, 3, 2, 1, 1, n=2),
    ConvProblem(15, 13, 24, 40, 3, 2, (2, 3), (1, 0), (2, 1), n=2),
    ConvProblem(8, 8, 16, 24, 1, 1, 2, 0, 1, n=4),
    ConvProblem(17, 9, 5, 7, 5, 4, 1, (2, 1), 1, n=2),
    ConvProblem(10, 10, 64, 48, 3, 3, 3, 3, 2, n=2),
    ConvProblem(7, 7, 136, 8, 7, 7, 1, 3, 1, n=1),
    # 1x1, stride 1, no padding: the gathers' plain-GEMM (POINTWISE) path, with tails in
    # M (189 pixels), in C (40: not a whole K-step) and in K; then a scalar one (C = 5).
    ConvProblem(7, 9, 40, 24, 1, 1, 1, 0, 1, n=3),
    ConvProblem(6, 5, 5, 7, 1, 1, 1, 0, 1, n=2),
]


@pytest.mark.parametrize("pass_", PASSES, ids=lambda p: p.value)
@pytest.mark.parametrize("problem", EXACT_SHAPES, ids=lambda p: p.describe().replace(" ", "_"))
@pytest.mark.parametrize("split", [1, 2, 3, 7])
def test_exact_tier(problem, pass_, split, target):
    """Integer data in [-2, 2]: every product and partial sum is exact in fp32, so the
    kernel must match the reference bit for bit, whatever the split-K."""
    plan = convgen.plan(problem, pass_, target)
    plan = dataclasses.replace(plan, split_k=split)
    rng = _seed("exact", problem, pass_, split)
    res = run_pass(problem, pass_, rng, out_dtype="float32", bias=pass_ is not Pass.DGRAD,
                   plan=plan, exact=True)
    check(res, "float32", exact=True, what=f"{pass_.value} split {split}")


@pytest.mark.parametrize("pass_", PASSES, ids=lambda p: p.value)
@pytest.mark.parametrize("problem", EXACT_SHAPES[:5], ids=lambda p: p.describe().replace(" ", "_"))
def test_exact_tier_scalar_and_fp32_inputs(problem, pass_):
    rng = _seed("exact-scalar", problem, pass_)
    res = run_pass(problem, pass_, rng, in_dtype="float32", out_dtype="float32",
                   bias=pass_ is not Pass.DGRAD, scalar=True, exact=True)
    check(res, "float32", exact=True, what=f"{pass_.value} scalar fp32-in")


def _image(draw, r, s, pad, dil, largest=40):
    """An image height and width (up to `largest`) that the padded, dilated filter fits."""
    h_min = max(1, dil[0] * (r - 1) + 1 - 2 * pad[0])
    w_min = max(1, dil[1] * (s - 1) + 1 - 2 * pad[1])
    return draw(st.integers(h_min, max(h_min, largest))), draw(st.integers(w_min, max(w_min, largest)))


@st.composite
def problems(draw):
    n = draw(st.integers(1, 8))
    r, s = draw(st.integers(1, 7)), draw(st.integers(1, 7))
    stride = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    pad = (draw(st.integers(0, 3)), draw(st.integers(0, 3)))
    dil = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    h, w = _image(draw, r, s, pad, dil)
    c, k = draw(st.integers(1, 80)), draw(st.integers(1, 80))
    return ConvProblem(h, w, c, k, r, s, stride, pad, dil, n=n)


@given(problem=problems(), pass_=st.sampled_from(PASSES), scalar=st.booleans(),
       in_dtype=st.sampled_from(["float16", "float32"]), out_dtype=st.sampled_from(["float16", "float32"]),
       bias=st.booleans(), relu=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_fuzz_against_reference(problem, pass_, scalar, in_dtype, out_dtype, bias, relu, seed):
    res = run_pass(problem, pass_, np.random.default_rng(seed), in_dtype=in_dtype, out_dtype=out_dtype,
                   bias=bias and pass_ is not Pass.DGRAD, relu=relu and pass_ is Pass.FPROP, scalar=scalar)
    check(res, out_dtype, what=f"{pass_.value} {problem.describe()}")


# Short reductions whose default is a tile exactly N wide (convgen/short_reduction_rules.py):
# 96, 144 and 48 columns on 2 x 3 warps, 192 on 2 x 4, with M tails.  The 3x3 layer's default
# has been a halo plan since the halo rule took images of up to 256 pixels, so its 48-wide
# tile (a 3x3 filter's gather feeding the same tile) is given by hand.
EXACT_N_CASES = [
    (ConvProblem(9, 11, 16, 96, 1, 1, 1, 0, 1, n=3), Pass.FPROP, None),
    (ConvProblem(7, 9, 144, 24, 1, 1, 1, 0, 1, n=3), Pass.DGRAD, None),
    (ConvProblem(10, 10, 24, 144, 1, 1, 1, 0, 1, n=2), Pass.FPROP, None),
    (ConvProblem(6, 40, 16, 40, 3, 3, 1, 1, 1, n=2), Pass.FPROP, Plan(64, 48, 16, 2, 3, 3, 8, 8, "float16", "float16", 1)),
    (ConvProblem(13, 6, 192, 32, 1, 1, 1, 0, 1, n=2), Pass.DGRAD, None),
]


@pytest.mark.parametrize("problem,pass_,hand", EXACT_N_CASES,
                         ids=lambda v: "planned" if v is None else "hand" if isinstance(v, Plan)
                         else getattr(v, "value", None) or v.describe().replace(" ", "_"))
def test_exact_n_tiles_exact_tier(problem, pass_, hand, target):
    plan = hand or convgen.plan(problem, pass_, target)
    n = problem.gemm(pass_).n
    assert plan.block_n == -(-n // 16) * 16 and plan.block_m == 64 and not plan.tma, plan.brief()
    res = run_pass(problem, pass_, _seed("exact-n", problem, pass_), out_dtype="float32", plan=plan, exact=True,
                   bias=pass_ is Pass.FPROP)
    check(res, "float32", exact=True, what=f"{pass_.value} {problem.describe()} {plan.brief()}")


SUITE_LAYERS = [(suite, layer) for suite, layers in SUITES.items() for layer in layers]


@pytest.mark.parametrize("pass_", PASSES, ids=lambda p: p.value)
@pytest.mark.parametrize("suite,layer", SUITE_LAYERS, ids=lambda v: getattr(v, "name", v))
def test_suite_layers(suite, layer, pass_, target):
    """The plan the suite's real batch gets (split-K included), run at a small batch:
    the batch is a run-time argument."""
    plan = convgen.plan(layer.problem, pass_, target)
    small = layer.problem.with_batch(8 if suite.startswith("cifar") else 2)
    res = run_pass(small, pass_, _seed("suite", suite, layer.name, pass_), plan=plan,
                   bias=pass_ is not Pass.DGRAD, relu=pass_ is Pass.FPROP)
    check(res, "float16", what=f"{suite}/{layer.name} {pass_.value}")


@pytest.mark.parametrize("pass_", PASSES, ids=lambda p: p.value)
@pytest.mark.parametrize("problem", [EXACT_SHAPES[0], EXACT_SHAPES[2], EXACT_SHAPES[5],
                                     ConvProblem(16, 16, 32, 64, 3, 3, 2, 1, 1, n=4)],
                         ids=lambda p: p.describe().replace(" ", "_"))
def test_vector_and_scalar_paths_agree(problem, pass_, target):
    """Same tile, same k order, only the staging differs: fprop and dgrad must agree bit
    for bit; wgrad too, since its split-K order is also the same.  On the im2col loop, the
    one with both stagings (a default that takes the halo path, which reads whole 16-byte
    runs only, is moved to it)."""
    vec = convgen.plan(problem, pass_, target)
    if not isinstance(vec.loop, Im2col):
        vec = dataclasses.replace(vec, loop=Im2col())
    scal = dataclasses.replace(vec, vec_a=1, vec_b=1)
    assert (vec.vec_a, vec.vec_b) != (1, 1), "this shape should take a vector path"
    outs = []
    for plan in (vec, scal):
        res = run_pass(problem, pass_, _seed("paths", problem, pass_), plan=plan, out_dtype="float32",
                       bias=pass_ is Pass.WGRAD)
        check(res, "float32", what=f"{pass_.value} vec {plan.vec_a}/{plan.vec_b}")
        outs.append(res.out)
    for a, b in zip(*outs):
        np.testing.assert_array_equal(a, b)


def test_non_contiguous_views():
    import cupy as cp

    rng = np.random.default_rng(7)
    problem = ConvProblem(12, 12, 16, 24, 3, 3, 1, 1, 1, n=3)
    # x arrives as an NCHW tensor viewed as NHWC: a transposed, non-contiguous view.
    x_nchw = rng.standard_normal((3, 16, 12, 12)).astype(np.float16)
    w = rng.standard_normal(problem.w_shape).astype(np.float16)
    x_view = cp.asarray(x_nchw).transpose(0, 2, 3, 1)
    assert not x_view.flags.c_contiguous
    w_wide = cp.asarray(np.concatenate([w, w], axis=3))[..., ::2]  # strided channels
    w_view = w_wide  # w_wide[..., ::2] picks every other channel of [w, w]
    expect_w = np.concatenate([w, w], axis=3)[..., ::2]
    y = convgen.conv2d(x_view, w_view, padding=1, out_dtype="float32")
    ref = reference.fprop(x_nchw.transpose(0, 2, 3, 1).astype(np.float64), expect_w.astype(np.float64), padding=1)
    assert rel_err(cp.asnumpy(y).astype(np.float64), ref) <= tolerance(problem.gemm("fprop").k, "float32")


@pytest.mark.parametrize("offset_bytes", [2, 4, 8])
@pytest.mark.parametrize("pass_", PASSES, ids=lambda p: p.value)
def test_misaligned_pointers(offset_bytes, pass_):
    """Operands starting at ptr % 16 == 2, 4 or 8 must be copied or read unaligned, never misread."""
    import cupy as cp

    rng = np.random.default_rng(offset_bytes)
    problem = ConvProblem(10, 10, 16, 32, 3, 3, 1, 1, 1, n=2)

    def shifted(a: np.ndarray):
        buf = cp.empty(a.size + 16, dtype=cp.float16)
        off = offset_bytes // 2
        v = buf[off:off + a.size].reshape(a.shape)
        v[...] = cp.asarray(a)
        assert v.data.ptr % 16 == offset_bytes % 16
        return v

    x = rng.standard_normal(problem.x_shape).astype(np.float16)
    w = rng.standard_normal(problem.w_shape).astype(np.float16)
    dy = rng.standard_normal(problem.y_shape).astype(np.float16)
    f64 = lambda a: a.astype(np.float64)  # noqa: E731
    if pass_ is Pass.FPROP:
        out = [convgen.conv2d(shifted(x), shifted(w), padding=1, out_dtype="float32")]
        ref = [reference.fprop(f64(x), f64(w), padding=1)]
    elif pass_ is Pass.DGRAD:
        out = [convgen.conv2d_dgrad(shifted(dy), shifted(w), problem.x_shape, padding=1, out_dtype="float32")]
        ref = [reference.dgrad(f64(dy), f64(w), problem.x_shape, padding=1)]
    else:
        out = list(convgen.conv2d_wgrad(shifted(x), shifted(dy), problem.w_shape, padding=1, out_dtype="float32"))
        ref = list(reference.wgrad(f64(x), f64(dy), problem.w_shape, padding=1))
    for o, r in zip(out, ref):
        assert rel_err(cp.asnumpy(o).astype(np.float64), r) <= tolerance(problem.gemm(pass_).k, "float32")


@pytest.mark.parametrize("pass_", PASSES, ids=lambda p: p.value)
def test_nan_and_inf_reach_exactly_their_receptive_field(pass_):
    import cupy as cp

    rng = np.random.default_rng(11)
    problem = ConvProblem(11, 12, 8, 16, 3, 3, 2, 1, 1, n=2)
    geo = dict(stride=2, padding=1)
    x = rng.standard_normal(problem.x_shape).astype(np.float16)
    w = rng.standard_normal(problem.w_shape).astype(np.float16)
    dy = rng.standard_normal(problem.y_shape).astype(np.float16)
    # One NaN inside, one +Inf on the border pixel next to the padded halo.
    src = dy if pass_ is Pass.DGRAD else x
    bad = np.zeros(src.shape, dtype=bool)
    bad[0, src.shape[1] // 2, src.shape[2] // 2, 3] = True
    bad[1, 0, src.shape[2] - 1, 5] = True
    src[bad] = [np.nan, np.inf]
    ind = bad.astype(np.float64)
    clean = np.where(bad, 0, src).astype(np.float64)
    ones_w = np.ones(problem.w_shape)
    if pass_ is Pass.FPROP:
        out = cp.asnumpy(convgen.conv2d(cp.asarray(x), cp.asarray(w), out_dtype="float32", **geo))
        mask = reference.fprop(ind, ones_w, **geo) > 0
        ref = reference.fprop(clean, w.astype(np.float64), **geo)
    elif pass_ is Pass.DGRAD:
        out = cp.asnumpy(convgen.conv2d_dgrad(cp.asarray(dy), cp.asarray(w), problem.x_shape, out_dtype="float32", **geo))
        mask = reference.dgrad(ind, ones_w, problem.x_shape, **geo) > 0
        ref = reference.dgrad(clean, w.astype(np.float64), problem.x_shape, **geo)
    else:
        dw, db = convgen.conv2d_wgrad(cp.asarray(x), cp.asarray(dy), problem.w_shape, out_dtype="float32", **geo)
        out = cp.asnumpy(dw)
        mask = reference.wgrad(ind, np.ones(problem.y_shape), problem.w_shape, **geo)[0] > 0
        ref = reference.wgrad(clean, dy.astype(np.float64), problem.w_shape, **geo)[0]
        assert np.isfinite(cp.asnumpy(db)).all(), "db does not depend on x"
    assert mask.any() and (~mask).any()
    np.testing.assert_array_equal(~np.isfinite(out), mask)
    keep = ~mask
    assert rel_err(out[keep].astype(np.float64), ref[keep]) <= tolerance(problem.gemm(pass_).k, "float32")


def test_overflow_gives_inf_not_nan_in_fp16():
    import cupy as cp

    rng = np.random.default_rng(3)
    problem = ConvProblem(6, 6, 8, 8, 3, 3, 1, 1, 1, n=1)
    x = rng.uniform(50000, 65504, problem.x_shape).astype(np.float16)
    w = rng.uniform(0.5, 2, problem.w_shape).astype(np.float16)
    w[:4] *= -1  # channels 0-3 overflow to -inf, 4-7 to +inf
    y = cp.asnumpy(convgen.conv2d(cp.asarray(x), cp.asarray(w), padding=1, out_dtype="float16"))
    assert not np.isnan(y).any()
    assert (y[..., :4] == -np.inf).all() and (y[..., 4:] == np.inf).all()
    # fp32 inputs past the fp16 range round to inf exactly as astype(float16) does.
    x32 = np.full(problem.x_shape, 70000.0, dtype=np.float32)
    y2 = cp.asnumpy(convgen.conv2d(cp.asarray(x32), cp.asarray(np.abs(w).astype(np.float32)), padding=1, scalar=True))
    assert (y2 == np.inf).all()


def test_past_2_to_the_31_elements():
    """One tensor of more than 2^31 elements: index arithmetic must be 64-bit."""
    import cupy as cp

    h = w = 8200
    c, k = 32, 8
    assert h * w * c > 2**31
    x = cp.random.standard_normal((1, h, w, c), dtype=cp.float32).astype(cp.float16)
    wt = cp.random.standard_normal((k, 1, 1, c), dtype=cp.float32).astype(cp.float16)
    y = convgen.conv2d(x, wt, out_dtype="float32")
    tail_x = cp.asnumpy(x[0, -3:]).astype(np.float64)
    ref = tail_x @ cp.asnumpy(wt[:, 0, 0, :]).astype(np.float64).T
    assert rel_err(cp.asnumpy(y[0, -3:]).astype(np.float64), ref) < 1e-5
    del y
    dy = cp.random.standard_normal((1, h, w, k), dtype=cp.float32).astype(cp.float16)
    dx = convgen.conv2d_dgrad(dy, wt, x.shape, out_dtype="float16")
    ref = cp.asnumpy(dy[0, -3:]).astype(np.float64) @ cp.asnumpy(wt[:, 0, 0, :]).astype(np.float64)
    assert rel_err(cp.asnumpy(dx[0, -3:]).astype(np.float64), ref) < 2e-3


def test_empty_batch_and_new_batch_sizes_do_not_compile(monkeypatch):
    import cupy as cp

    import convgen.compile as cc

    rng = np.random.default_rng(5)
    problem = ConvProblem(9, 9, 16, 16, 3, 3, 1, 1, 1, n=6)
    w = cp.asarray(rng.standard_normal(problem.w_shape).astype(np.float16))
    x = cp.asarray(rng.standard_normal(problem.x_shape).astype(np.float16))
    convgen.conv2d(x, w, padding=1, out_dtype="float32")
    calls = []
    real = cc.compile_binary
    monkeypatch.setattr(cc, "compile_binary", lambda *a, **k: calls.append(1) or real(*a, **k))
    before = len(convgen.runtime._cache)
    for n in (5, 1, 13, 0):
        xn = cp.asarray(rng.standard_normal((n, 9, 9, 16)).astype(np.float16))
        y = convgen.conv2d(xn, w, padding=1, out_dtype="float32")
        assert y.shape == (n, 9, 9, 16)
        ref = reference.fprop(cp.asnumpy(xn).astype(np.float64), cp.asnumpy(w).astype(np.float64), padding=1)
        if n:
            assert rel_err(cp.asnumpy(y).astype(np.float64), ref) <= tolerance(144, "float32")
    assert not calls and len(convgen.runtime._cache) == before
    assert convgen.conv2d_dgrad(cp.empty((0, 9, 9, 16), cp.float16), w, (0, 9, 9, 16), padding=1).shape == (0, 9, 9, 16)
    dw, db = convgen.conv2d_wgrad(cp.empty((0, 9, 9, 16), cp.float16), cp.empty((0, 9, 9, 16), cp.float16),
                                  (16, 3, 3, 16), padding=1)
    assert dw.shape == (16, 3, 3, 16) and not cp.asnumpy(dw).any() and not cp.asnumpy(db).any()


def test_wgrad_split_k_is_deterministic(target):
    import cupy as cp

    problem = SUITES["cifar-resnet"][1].problem.with_batch(32)
    plan = convgen.plan(SUITES["cifar-resnet"][1].problem, "wgrad", target)
    assert plan.split_k > 1
    rng = np.random.default_rng(9)
    x = cp.asarray(rng.standard_normal(problem.x_shape).astype(np.float16))
    dy = cp.asarray(rng.standard_normal(problem.y_shape).astype(np.float16))
    first = convgen.conv2d_wgrad(x, dy, problem.w_shape, padding=1, plan=plan, out_dtype="float32")
    for _ in range(3):
        again = convgen.conv2d_wgrad(x, dy, problem.w_shape, padding=1, plan=plan, out_dtype="float32",
                                     deterministic=True)
        for a, b in zip(first, again):
            np.testing.assert_array_equal(cp.asnumpy(a), cp.asnumpy(b))


def test_wgrad_fill_split_past_max_split_exact(target):
    """A one-tile wgrad with a long reduction (UNet's 32 -> 1 head, at a smaller batch) on
    tuning's fill split, more slices than candidates.MAX_SPLIT (one 16x32 tile, 2 warps, 8
    blocks an SM): exact integers, so a slice summed twice or left out shows, with and
    without db."""
    from convgen.candidates import MAX_SPLIT, candidates

    problem = ConvProblem(128, 128, 32, 1, 1, 1, 1, 0, 1, n=16)
    fill = [p for p in candidates(problem, Pass.WGRAD, target) if p.split_k > MAX_SPLIT]
    assert fill, "no candidate splits past MAX_SPLIT on this GPU"
    for bias in (False, True):
        rng = _seed("fill-split", bias)
        res = run_pass(problem, Pass.WGRAD, rng, out_dtype="float32", bias=bias, plan=fill[0], exact=True)
        check(res, "float32", exact=True, what=f"wgrad {fill[0].brief()} bias={bias}")


@pytest.mark.parametrize("c,k", [(24, 144), (144, 24)], ids=["M144", "N144"])
def test_wgrad_one_tile_past_128_exact(c, k, target):
    """small_layer_rules.ONE_TILE_OVERFLOW's plans (MobileNetV2's pw56 wgrads at a smaller batch:
    one 256x32x32 tile over M = 144, or one 32x144x64 tile over N = 144, split for two blocks an
    SM), the planner's default on parts with cp.async: exact integers, so a row or column past
    128 dropped, or a slice summed twice, shows; with and without db."""
    problem = ConvProblem(56, 56, c, k, 1, 1, 1, 0, 1, n=8)
    plan = convgen.plan(problem, Pass.WGRAD, target)
    if not any("ONE_TILE_OVERFLOW" in r for r in plan.reasons):
        pytest.skip(f"the rule is for parts with cp.async; {target.arch}'s plan is {plan.brief()}")
    assert plan.split_k > 1 and max(plan.block_m, plan.block_n) > 128
    for bias in (False, True):
        res = run_pass(problem, Pass.WGRAD, _seed("one-tile", c, k, bias), out_dtype="float32", bias=bias,
                       plan=plan, exact=True)
        check(res, "float32", exact=True, what=f"wgrad {plan.brief()} bias={bias}")


def test_bad_arguments_name_the_problem():
    import cupy as cp

    x = cp.zeros((2, 8, 8, 4), cp.float16)
    w = cp.zeros((8, 3, 3, 4), cp.float16)
    with pytest.raises(TypeError, match="x must be a cupy.ndarray"):
        convgen.conv2d(np.zeros((2, 8, 8, 4), np.float16), w)
    with pytest.raises(ValueError, match="w has 5 input channels"):
        convgen.conv2d(x, cp.zeros((8, 3, 3, 5), cp.float16))
    with pytest.raises(TypeError, match="int8"):
        convgen.conv2d(x.astype(cp.int8), w)
    with pytest.raises(ValueError, match="bias must have shape"):
        convgen.conv2d(x, w, bias=cp.zeros(7, cp.float32))
    with pytest.raises(ValueError, match="output height"):
        convgen.conv2d(x, cp.zeros((8, 9, 3, 4), cp.float16))
    with pytest.raises(ValueError, match="dy shape"):
        convgen.conv2d_dgrad(cp.zeros((2, 7, 7, 8), cp.float16), w, x.shape)
    with pytest.raises(ValueError, match="activation"):
        convgen.conv2d(x, w, activation="tanh")
    with pytest.raises(ValueError, match=r"residual must have y's shape \(2, 6, 6, 8\) and dtype float16"):
        convgen.conv2d(x, w, residual=cp.zeros((2, 6, 6, 8), cp.float32))
    with pytest.raises(ValueError, match="residual must have y's shape"):
        convgen.conv2d(x, w, residual=cp.zeros((2, 8, 8, 8), cp.float16))
    with pytest.raises(ValueError, match="they need a residual"):
        convgen.conv2d(x, w, alpha=0.5)


def _tuned_cases():
    from convgen.tuning_db import SHIPPED_DIR, read_db

    cases = []
    for path in sorted(SHIPPED_DIR.glob("*.json")):
        for gpu, entries in read_db(path).get("gpus", {}).items():
            for key, entry in sorted(entries.items()):
                cases.append(pytest.param(gpu, entry, id=f"{gpu}-{entry['pass']}-{key[:8]}"))
    return cases


@pytest.mark.parametrize("gpu,entry", _tuned_cases())
def test_shipped_tuned_plans_match_the_reference(gpu, entry, target):
    """Every plan a shipped tuning database can hand the runtime is checked like the planner's."""
    import cupy as cp

    from convgen.tuning_db import gpu_slug

    name = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["name"].decode()
    if gpu_slug(name) != gpu:
        pytest.skip(f"tuned for {gpu}, this GPU is {name}")
    shape = dict(entry["shape"])
    n = shape.pop("n")
    problem = ConvProblem(**shape, n=min(n, 8))
    pass_ = Pass(entry["pass"])
    plan = Plan.from_dict(entry["plan"], problem, pass_)
    res = run_pass(problem, pass_, _seed("tuned", entry["shape"], pass_), plan=plan,
                   bias=pass_ is not Pass.DGRAD, relu=pass_ is Pass.FPROP)
    check(res, "float16", what=f"tuned {pass_.value} {problem.describe()}")


@pytest.mark.parametrize("layer", ["conv1", "conv32"])
def test_full_batch_wgrad_matches_the_reference(layer, target):
    """wgrad over the suite's real batch (a 262144-long reduction) with the plan the runtime picks."""
    problem = next(l.problem for l in SUITES["cifar-vgg"] if l.name == layer)
    res = run_pass(problem, Pass.WGRAD, _seed("full-wgrad", layer), bias=True)
    check(res, "float16", what=f"full-batch wgrad {problem.describe()}")
