"""Tests for convgen.reference, the float64 conv2d every kernel is checked against.

The reference is checked three independent ways: against naive loops written
straight from the definition (every index, no slicing tricks), against the
adjoint identities that tie fprop, dgrad and wgrad together, and against a few
cases whose answer is known in closed form.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from convgen.reference import dgrad, fprop, wgrad

# -- naive loop implementations (deliberately slow and obvious) ----------------


def _pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


def _out_size(size, pad, dil, k, stride):
    return (size + 2 * pad - dil * (k - 1) - 1) // stride + 1


def naive_fprop(x, w, bias=None, stride=1, padding=0, dilation=1, relu=False):
    (sh, sw), (ph, pw), (dh, dw) = _pair(stride), _pair(padding), _pair(dilation)
    n_, h_, w_, c_ = x.shape
    k_, r_, s_, _ = w.shape
    p_, q_ = _out_size(h_, ph, dh, r_, sh), _out_size(w_, pw, dw, s_, sw)
    y = np.zeros((n_, p_, q_, k_))
    for n in range(n_):
        for p in range(p_):
            for q in range(q_):
                for k in range(k_):
                    acc = 0.0 if bias is None else float(bias[k])
                    for r in range(r_):
                        for s in range(s_):
                            ih, iw = p * sh - ph + r * dh, q * sw - pw + s * dw
                            if 0 <= ih < h_ and 0 <= iw < w_:
                                for c in range(c_):
                                    acc += float(x[n, ih, iw, c]) * float(w[k, r, s, c])
                    y[n, p, q, k] = max(acc, 0.0) if relu else acc
    return y


def naive_dgrad(dy, w, input_shape, stride=1, padding=0, dilation=1):
    """Gather form: for each input pixel, find every (output pixel, tap) that read it."""
    (sh, sw), (ph, pw), (dh, dw) = _pair(stride), _pair(padding), _pair(dilation)
    n_, h_, w_, c_ = input_shape
    k_, r_, s_, _ = w.shape
    _, p_, q_, _ = dy.shape
    dx = np.zeros(input_shape)
    for n in range(n_):
        for ih in range(h_):
            for iw in range(w_):
                for c in range(c_):
                    acc = 0.0
                    for r in range(r_):
                        for s in range(s_):
                            # ih = p*sh - ph + r*dh  =>  p = (ih + ph - r*dh) / sh
                            ph_num, pw_num = ih + ph - r * dh, iw + pw - s * dw
                            if ph_num % sh or pw_num % sw:
                                continue
                            p, q = ph_num // sh, pw_num // sw
                            if 0 <= p < p_ and 0 <= q < q_:
                                for k in range(k_):
                                    acc += float(dy[n, p, q, k]) * float(w[k, r, s, c])
                    dx[n, ih, iw, c] = acc
    return dx


def naive_wgrad(x, dy, weight_shape, stride=1, padding=0, dilation=1):
    (sh, sw), (ph, pw), (dh, dw) = _pair(stride), _pair(padding), _pair(dilation)
    n_, h_, w_, c_ = x.shape
    k_, r_, s_, _ = weight_shape
    _, p_, q_, _ = dy.shape
    dw_ = np.zeros(weight_shape)
    db = np.zeros(k_)
    for k in range(k_):
        for n in range(n_):
            for p in range(p_):
                for q in range(q_):
                    db[k] += dy[n, p, q, k]
        for r in range(r_):
            for s in range(s_):
                for c in range(c_):
                    acc = 0.0
                    for n in range(n_):
                        for p in range(p_):
                            for q in range(q_):
                                ih, iw = p * sh - ph + r * dh, q * sw - pw + s * dw
                                if 0 <= ih < h_ and 0 <= iw < w_:
                                    acc += float(dy[n, p, q, k]) * float(x[n, ih, iw, c])
                    dw_[k, r, s, c] = acc
    return dw_, db


# -- against the naive loops -----------------------------------------------------

# (n, h, w, c, k, r, s, stride, padding, dilation)
CASES = {
    "3x3-pad1": (2, 5, 5, 3, 4, 3, 3, 1, 1, 1),
    "1x1": (2, 4, 3, 3, 5, 1, 1, 1, 0, 1),
    "1x1-stride2": (1, 5, 6, 2, 3, 1, 1, 2, 0, 1),
    "stride2-pad1": (2, 7, 6, 3, 4, 3, 3, 2, 1, 1),
    "stride-hw-2-1": (1, 7, 5, 3, 2, 3, 3, (2, 1), 1, 1),
    "stride3-leftover": (1, 8, 8, 1, 2, 2, 2, 3, 0, 1),  # last input rows never read
    "stride>filter": (1, 9, 7, 2, 3, 2, 2, (4, 3), 0, 1),
    "pad-hw-0-2": (1, 5, 4, 3, 2, 3, 3, 1, (0, 2), 1),
    "big-pad": (1, 3, 2, 1, 2, 2, 3, 1, 3, 1),  # output sees mostly padding
    "dilation2": (2, 7, 7, 3, 2, 3, 3, 1, 2, 2),
    "dilation-hw-1-3": (1, 5, 9, 2, 3, 2, 3, 1, 1, (1, 3)),
    "dilation-stride": (1, 9, 8, 3, 2, 3, 2, 2, 1, (2, 3)),
    "nonsquare-filter": (2, 6, 5, 1, 3, 2, 4, 1, (1, 2), 1),
    "filter=input": (2, 4, 3, 3, 2, 4, 3, 1, 0, 1),  # P = Q = 1
    "c1-k1": (3, 4, 4, 1, 1, 3, 3, 1, 1, 1),
    "1x1-image": (2, 1, 1, 3, 2, 3, 3, 1, 1, 1),
}


def _case(name):
    n, h, w, c, k, r, s, stride, padding, dilation = CASES[name]
    rng = np.random.default_rng(list(CASES).index(name) + 1000)
    x = rng.standard_normal((n, h, w, c))
    wt = rng.standard_normal((k, r, s, c))
    conv = dict(stride=stride, padding=padding, dilation=dilation)
    return rng, x, wt, conv


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("bias,relu", [(False, False), (True, False), (True, True)])
def test_fprop_matches_naive(name, bias, relu):
    rng, x, w, conv = _case(name)
    b = rng.standard_normal(w.shape[0]) if bias else None
    want = naive_fprop(x, w, b, relu=relu, **conv)
    got = fprop(x, w, b, relu=relu, **conv)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    if relu and got.size >= 8:
        assert (got == 0).any() and (got > 0).any()  # relu actually clipped something


@pytest.mark.parametrize("name", list(CASES))
def test_dgrad_matches_naive(name):
    rng, x, w, conv = _case(name)
    dy = rng.standard_normal(naive_fprop(x, w, **conv).shape)
    want = naive_dgrad(dy, w, x.shape, **conv)
    got = dgrad(dy, w, x.shape, **conv)
    assert got.shape == x.shape and got.dtype == np.float64
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", list(CASES))
def test_wgrad_matches_naive(name):
    rng, x, w, conv = _case(name)
    dy = rng.standard_normal(naive_fprop(x, w, **conv).shape)
    want_dw, want_db = naive_wgrad(x, dy, w.shape, **conv)
    got_dw, got_db = wgrad(x, dy, w.shape, **conv)
    assert got_dw.shape == w.shape and got_db.shape == (w.shape[0],)
    np.testing.assert_allclose(got_dw, want_dw, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got_db, want_db, rtol=1e-12, atol=1e-12)


# -- closed-form cases -----------------------------------------------------------


def test_1x1_conv_is_a_matmul():
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal((2, 3, 4, 5)), rng.standard_normal((6, 1, 1, 5))
    np.testing.assert_allclose(fprop(x, w), x @ w[:, 0, 0, :].T, rtol=1e-13)


def test_delta_filter_is_a_shift():
    """A filter that is 1 at tap (r, s) reads x shifted by (r - pad, s - pad): no flip."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((1, 5, 6, 1))
    w = np.zeros((1, 3, 3, 1))
    w[0, 2, 0, 0] = 1.0
    y = fprop(x, w, padding=1)
    np.testing.assert_array_equal(y[0, :4, 1:, 0], x[0, 1:, :5, 0])
    np.testing.assert_array_equal(y[0, 4, :, 0], 0.0)  # reads the bottom padding
    np.testing.assert_array_equal(y[0, :, 0, 0], 0.0)  # reads the left padding


# -- adjoint identities (Hypothesis) ---------------------------------------------


@st.composite
def conv_problems(draw):
    """A valid problem: h and w are drawn no smaller than the dilated filter needs."""
    n, c, k = draw(st.integers(1, 3)), draw(st.integers(1, 6)), draw(st.integers(1, 6))
    dims = []
    for _axis in ("height", "width"):
        f = draw(st.integers(1, 4))
        stride, pad, dil = draw(st.integers(1, 3)), draw(st.integers(0, 3)), draw(st.integers(1, 3))
        eff = dil * (f - 1) + 1  # at most 10, so some size in 1..12 is always valid
        size = draw(st.integers(max(1, eff - 2 * pad), 12))
        dims.append((size, f, stride, pad, dil))
    (h, r, sh, ph, dh), (w, s, sw, pw, dw) = dims
    seed = draw(st.integers(0, 2**32 - 1))
    return dict(n=n, h=h, w=w, c=c, k=k, r=r, s=s, stride=(sh, sw), padding=(ph, pw),
                dilation=(dh, dw), seed=seed)


def _assert_same_sum(a, b, scale):
    """a and b are one sum of products computed two ways; scale bounds the sum of |terms|."""
    assert abs(a - b) <= 1e-10 * scale, (a, b, scale)


@given(conv_problems())
def test_adjoint_identities(prob):
    rng = np.random.default_rng(prob["seed"])
    conv = {key: prob[key] for key in ("stride", "padding", "dilation")}
    x = rng.standard_normal((prob["n"], prob["h"], prob["w"], prob["c"]))
    w = rng.standard_normal((prob["k"], prob["r"], prob["s"], prob["c"]))
    y = fprop(x, w, **conv)
    assert y.shape[1] >= 1 and y.shape[2] >= 1
    dy = rng.standard_normal(y.shape)

    dx = dgrad(dy, w, x.shape, **conv)
    dw, db = wgrad(x, dy, w.shape, **conv)
    assert dx.shape == x.shape and dw.shape == w.shape and db.shape == (prob["k"],)

    # All three inner products expand to the same sum of x*w*dy terms.
    scale = float(np.vdot(fprop(np.abs(x), np.abs(w), **conv), np.abs(dy))) + 1e-300
    lhs = float(np.vdot(y, dy))
    _assert_same_sum(lhs, float(np.vdot(x, dx)), scale)
    _assert_same_sum(lhs, float(np.vdot(w, dw)), scale)
    np.testing.assert_allclose(db, dy.sum(axis=(0, 1, 2)), rtol=1e-12, atol=1e-12)


# -- batch size zero -------------------------------------------------------------


def test_empty_batch():
    x, w = np.zeros((0, 7, 6, 3)), np.ones((4, 3, 2, 3))
    conv = dict(stride=2, padding=1, dilation=(1, 2))
    y = fprop(x, w, np.ones(4), relu=True, **conv)
    assert y.shape == (0, 4, 3, 4) and y.dtype == np.float64
    dx = dgrad(np.zeros((0, 4, 3, 4)), w, x.shape, **conv)
    assert dx.shape == (0, 7, 6, 3)
    dw, db = wgrad(x, np.zeros((0, 4, 3, 4)), w.shape, **conv)
    assert dw.shape == w.shape and db.shape == (4,)
    assert not dw.any() and not db.any()


# -- dtypes ----------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.int8, np.int64])
def test_inputs_are_widened_to_float64_before_computing(dtype):
    rng = np.random.default_rng(3)
    scale = 1 if np.issubdtype(dtype, np.floating) else 4
    x = (rng.standard_normal((2, 6, 5, 3)) * scale).astype(dtype)
    w = (rng.standard_normal((4, 3, 3, 3)) * scale).astype(dtype)
    b = (rng.standard_normal(4) * scale).astype(dtype)
    x64, w64, b64 = (a.astype(np.float64) for a in (x, w, b))
    conv = dict(stride=(2, 1), padding=1, dilation=1)

    y = fprop(x, w, b, relu=True, **conv)
    assert y.dtype == np.float64
    np.testing.assert_array_equal(y, fprop(x64, w64, b64, relu=True, **conv))

    dy = (rng.standard_normal(y.shape) * scale).astype(dtype)
    dy64 = dy.astype(np.float64)
    dx = dgrad(dy, w, x.shape, **conv)
    assert dx.dtype == np.float64
    np.testing.assert_array_equal(dx, dgrad(dy64, w64, x.shape, **conv))
    dw, db = wgrad(x, dy, w.shape, **conv)
    want_dw, want_db = wgrad(x64, dy64, w.shape, **conv)
    assert dw.dtype == db.dtype == np.float64
    np.testing.assert_array_equal(dw, want_dw)
    np.testing.assert_array_equal(db, want_db)


def test_fp16_is_not_computed_in_fp16():
    """Sums that overflow or lose precision in fp16 are exact in the reference."""
    x = np.full((1, 1, 1, 4), 60000.0, dtype=np.float16)  # near fp16 max (65504)
    w = np.ones((1, 1, 1, 4), dtype=np.float16)
    assert fprop(x, w)[0, 0, 0, 0] == 240000.0


# -- bad inputs ------------------------------------------------------------------

X, W = np.ones((2, 5, 5, 3)), np.ones((4, 3, 3, 3))
DY = np.ones((2, 3, 3, 4))  # fprop(X, W) with no padding


@pytest.mark.parametrize(
    "call, match",
    [
        pytest.param(
            lambda: fprop(X, np.ones((4, 3, 3, 2))),
            r"w has 2 input channels but x has 3",
            id="fprop-channels",
        ),
        pytest.param(
            lambda: dgrad(DY, np.ones((4, 3, 3, 2)), X.shape),
            r"w has 2 input channels but input_shape has 3",
            id="dgrad-channels",
        ),
        pytest.param(
            lambda: wgrad(X, DY, (4, 3, 3, 2)),
            r"weight_shape has 2 input channels but x has 3",
            id="wgrad-channels",
        ),
        pytest.param(lambda: fprop(X[0], W), r"x must be 4-D .*got shape \(5, 5, 3\)", id="x-rank"),
        pytest.param(lambda: fprop(X, W[None]), r"w must be 4-D", id="w-rank"),
        pytest.param(lambda: dgrad(DY[0], W, X.shape), r"dy must be 4-D", id="dy-rank"),
        pytest.param(
            lambda: dgrad(DY, W, (2, 5, 5)),
            r"input_shape must be a 4-tuple",
            id="input_shape-len",
        ),
        pytest.param(
            lambda: wgrad(X, DY, (4, 3, 3)),
            r"weight_shape must be a 4-tuple",
            id="weight_shape-len",
        ),
        pytest.param(
            lambda: fprop(X, np.ones((4, 7, 3, 3))),
            r"output height p would be <= 0",
            id="p<=0",
        ),
        pytest.param(
            lambda: fprop(X, W, dilation=(1, 3)),
            r"output width q would be <= 0",
            id="q<=0-dilation",
        ),
        pytest.param(
            lambda: fprop(X, W, padding=-1),
            r"padding \(height\) must be >= 0",
            id="negative-pad",
        ),
        pytest.param(
            lambda: dgrad(DY, W, X.shape, padding=(0, -1)),
            r"padding \(width\) must be >= 0",
            id="negative-pad-width",
        ),
        pytest.param(
            lambda: fprop(X, W, stride=0),
            r"stride \(height\) must be >= 1",
            id="stride0",
        ),
        pytest.param(
            lambda: fprop(X, W, stride=(1, 2, 3)),
            r"stride must be an int or a \(height, width\) pair",
            id="stride-triple",
        ),
        pytest.param(
            lambda: fprop(X, W, bias=np.ones(3)),
            r"bias shape \(3,\) does not match the K = 4",
            id="bias-length",
        ),
        pytest.param(
            lambda: fprop(X, W, bias=np.ones((1, 4))),
            r"bias must be 1-D",
            id="bias-rank",
        ),
        pytest.param(
            lambda: dgrad(DY, W, X.shape, padding=1),
            r"dy shape \(2, 3, 3, 4\) does not match the output shape \(2, 5, 5, 4\)",
            id="dy-vs-padding",
        ),
        pytest.param(
            lambda: dgrad(np.ones((2, 3, 3, 5)), W, X.shape),
            r"dy shape .* does not match",
            id="dy-channels",
        ),
        pytest.param(
            lambda: wgrad(X, np.ones((1, 3, 3, 4)), W.shape),
            r"dy shape \(1, 3, 3, 4\) does not match the output shape \(2, 3, 3, 4\)",
            id="wgrad-dy-batch",
        ),
        pytest.param(
            lambda: fprop(X.astype(complex), W),
            r"x must be a float or integer array",
            id="complex",
        ),
        pytest.param(
            lambda: fprop(X, W.astype(bool)),
            r"w must be a float or integer array",
            id="bool",
        ),
        pytest.param(lambda: fprop(np.ones((2, 0, 5, 3)), W), r"h must be >= 1", id="zero-height"),
    ],
)
def test_bad_inputs_raise_value_error_naming_the_problem(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_residual_and_gelu_match_torch():
    """The reference's residual epilogue and GELU against PyTorch's own ops (float64, CPU):
    gelu(alpha * conv2d(x, w) + bias + beta * residual), GELU in its erf form."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    x, w = rng.standard_normal((2, 7, 6, 3)), rng.standard_normal((4, 3, 2, 3))
    b = rng.standard_normal(4)
    y0 = fprop(x, w, stride=(2, 1), padding=1)
    res = rng.standard_normal(y0.shape)
    got = fprop(x, w, b, stride=(2, 1), padding=1, residual=res, alpha=0.5, beta=-2.0, gelu=True)
    tx, tw = torch.from_numpy(x).permute(0, 3, 1, 2), torch.from_numpy(w).permute(0, 3, 1, 2)
    conv = torch.nn.functional.conv2d(tx, tw, stride=(2, 1), padding=1).permute(0, 2, 3, 1)
    want = torch.nn.functional.gelu(0.5 * conv + torch.from_numpy(b) - 2.0 * torch.from_numpy(res)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="residual shape"):
        fprop(x, w, residual=res[:, :1])
    with pytest.raises(ValueError, match="two activations"):
        fprop(x, w, relu=True, gelu=True)
