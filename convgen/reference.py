"""NumPy float64 reference for conv2d: the numbers every generated kernel is checked against.

This module is the definition of what convgen computes.  Layouts are the ones the
kernels use: activations NHWC, weights KRSC (``w[k, r, s, c]``).  For output pixel
``(n, p, q)`` and output channel ``k``::

    y[n, p, q, k] = bias[k] + sum over r, s, c of
                    x[n, p*sh - ph + r*dh, q*sw - pw + s*dw, c] * w[k, r, s, c]

where ``(sh, sw)``, ``(ph, pw)``, ``(dh, dw)`` are stride, padding and dilation,
(with ``groups`` G, c runs over the C/G channels of k's group, ``g*C/G + c`` with
``g = k // (K/G)``, and w is ``(K, R, S, C/G)``),
and input positions outside ``[0, H) x [0, W)`` read as zero (the padding).  This
is a cross-correlation, as in PyTorch and cuDNN; the filter is not flipped.
:func:`dgrad` and :func:`wgrad` are the exact adjoints of this map with respect
to ``x`` and ``w``.

Why float64, and why this shape of code:

* Kernels compute in fp16/fp32, so the reference must be much more precise than
  what it checks; otherwise a tolerance would hide the reference's own error.
  Inputs are converted to float64 *before* any arithmetic, so the reference sees
  exactly the (e.g. fp16-rounded) values the kernel was given.
* The code loops only over the R*S filter taps; each tap is one matrix product
  over all pixels and channels.  That keeps it fast enough to check real layers
  while staying close to the formula above: a tap ``(r, s)`` pairs output pixel
  ``(p, q)`` with padded-input pixel ``(p*sh + r*dh, q*sw + s*dw)``, which for
  all ``(p, q)`` at once is a strided slice of the zero-padded input.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np
from numpy.typing import ArrayLike, NDArray

from convgen.ir import ConvProblem, PairLike, as_pair

__all__ = ["fprop", "dgrad", "wgrad"]

Shape4 = tuple[int, int, int, int]
F64Array = NDArray[np.float64]


# -- validation ----------------------------------------------------------------


def _as_float64(name: str, value: ArrayLike, layout: str, ndim: int = 4) -> F64Array:
    """Convert an input tensor to float64, checking it is a real ``ndim``-D array.

    Float and integer inputs are widened exactly (integers beyond 2**53 aside);
    bool, complex and object arrays are rejected, as they are always a mistake here.
    """
    arr = np.asarray(value)
    if arr.dtype == np.bool_ or not (
        np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)
    ):
        raise ValueError(f"{name} must be a float or integer array, got dtype {arr.dtype}")
    if arr.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D {layout}, got shape {arr.shape}")
    return arr.astype(np.float64, copy=False)


def _as_shape4(name: str, value: Sequence[int], layout: str) -> Shape4:
    """Check a shape argument (``input_shape``/``weight_shape``) is four integers."""
    try:
        dims = tuple(value)
    except TypeError:
        raise ValueError(f"{name} must be a 4-tuple {layout}, got {value!r}") from None
    if len(dims) != 4 or any(
        isinstance(d, bool) or not isinstance(d, (int, np.integer)) for d in dims
    ):
        raise ValueError(f"{name} must be a 4-tuple of integers {layout}, got {value!r}")
    n, a, b, c = (int(d) for d in dims)
    return (n, a, b, c)


def _problem(
    x_shape: tuple[int, ...],
    w_shape: tuple[int, ...],
    stride: PairLike,
    padding: PairLike,
    dilation: PairLike,
    groups: int = 1,
) -> ConvProblem:
    """Build (and so validate) the convolution described by an x shape and a w shape.

    :class:`~convgen.ir.ConvProblem` is the single place where geometry rules
    live (positive sizes, stride/dilation >= 1, padding >= 0, output size >= 1),
    so the reference accepts exactly the problems the code generator does.
    """
    n, h, w, c = x_shape
    k, r, s, _ = w_shape
    return ConvProblem(
        h, w, c, k, r, s,
        as_pair("stride", stride),
        as_pair("padding", padding),
        as_pair("dilation", dilation),
        groups,
        n=n,
    )


def _check_channels(
    w_name: str, w_shape: tuple[int, ...], x_name: str, x_shape: tuple[int, ...], groups: int = 1
) -> None:
    """The weights' C (last axis of KRSC) must be the activations' C (last axis of NHWC) over groups."""
    if isinstance(groups, bool) or not isinstance(groups, (int, np.integer)) or groups < 1:
        raise ValueError(f"groups must be a positive integer, got {groups!r}")
    if w_shape[3] * groups != x_shape[3]:
        per = f" / groups {groups}" if groups > 1 else ""
        raise ValueError(
            f"{w_name} has {w_shape[3]} input channels but {x_name} has {x_shape[3]}{per} "
            f"({w_name} shape {w_shape} is (K, R, S, C{'/groups' if groups > 1 else ''}), "
            f"{x_name} shape {x_shape} is (N, H, W, C))"
        )


def _grouped(a: F64Array, groups: int) -> F64Array:
    """A (rows, channels) matrix as (rows, groups, channels per group)."""
    return a.reshape(a.shape[0], groups, a.shape[1] // groups)


def _check_dy(dy_shape: tuple[int, ...], prob: ConvProblem, x_desc: str, w_desc: str) -> None:
    """dy must have exactly the shape fprop would produce for this problem."""
    if dy_shape != prob.y_shape:
        raise ValueError(
            f"dy shape {dy_shape} does not match the output shape {prob.y_shape} of "
            f"{x_desc} with {w_desc}, stride {prob.stride}, padding {prob.padding}, "
            f"dilation {prob.dilation}"
        )


# -- the filter-tap view ---------------------------------------------------------


def _pad(x: F64Array, prob: ConvProblem) -> F64Array:
    """Zero-pad H and W, so every tap's window is an in-bounds strided slice."""
    ph, pw = prob.padding
    return np.pad(x, ((0, 0), (ph, ph), (pw, pw), (0, 0)))


def _tap(prob: ConvProblem, r: int, s: int) -> tuple[slice, slice, slice, slice]:
    """Index of the padded-input pixels that filter tap ``(r, s)`` reads, one per output pixel.

    Output row ``p`` reads padded row ``p*sh + r*dh``; over ``p = 0 .. P-1`` that
    is the slice ``r*dh : r*dh + sh*(P-1) + 1 : sh`` (likewise for columns).  The
    result indexes an ``(N, H+2ph, W+2pw, C)`` array and yields ``(N, P, Q, C)``.
    """
    (sh, sw), (dh, dw) = prob.stride, prob.dilation
    rows = slice(r * dh, r * dh + sh * (prob.p - 1) + 1, sh)
    cols = slice(s * dw, s * dw + sw * (prob.q - 1) + 1, sw)
    return (slice(None), rows, cols, slice(None))


# -- the three passes ----------------------------------------------------------


def fprop(
    x: ArrayLike,
    w: ArrayLike,
    bias: Optional[ArrayLike] = None,
    stride: PairLike = 1,
    padding: PairLike = 0,
    dilation: PairLike = 1,
    relu: bool = False,
    *,
    residual: Optional[ArrayLike] = None,
    alpha: float = 1.0,
    beta: float = 1.0,
    gelu: bool = False,
    groups: int = 1,
) -> F64Array:
    """Forward convolution ``y = act(alpha * conv(x, w) + bias + beta * residual)`` in float64.

    Args:
        x: activations, shape ``(N, H, W, C)``.
        w: weights, shape ``(K, R, S, C/groups)``.
        bias: per-output-channel bias, shape ``(K,)``, or None.
        stride, padding, dilation: an int or a ``(height, width)`` pair.
        relu: apply ``max(., 0)`` after the bias, as the fused epilogue does.
        residual: a tensor of y's shape ``(N, P, Q, K)``, added times ``beta`` (``alpha``
            scales the convolution); None adds nothing and leaves alpha unused.
        gelu: apply GELU in its erf form (``torch.nn.functional.gelu``'s default) instead.
        groups: channel groups, as ``torch.nn.functional.conv2d``'s (C = K = groups: depthwise).

    Returns:
        y, shape ``(N, P, Q, K)``, float64.
    """
    x = _as_float64("x", x, "(N, H, W, C)")
    w = _as_float64("w", w, "(K, R, S, C)")
    _check_channels("w", w.shape, "x", x.shape, groups)
    prob = _problem(x.shape, w.shape, stride, padding, dilation, groups)
    n, c, k, g = prob.n, prob.c, prob.k, prob.groups
    b = None if bias is None else _as_float64("bias", bias, "(K,)", ndim=1)
    if b is not None and b.shape != (k,):
        raise ValueError(f"bias shape {b.shape} does not match the K = {k} output channels of w")

    xp = _pad(x, prob)
    y = np.zeros((n * prob.p * prob.q, k))
    for r in range(prob.r):
        for s in range(prob.s):
            # (N*P*Q, C) pixels this tap reads, times the tap's (C, K) weights (per group).
            pix = xp[_tap(prob, r, s)].reshape(-1, c)
            if g == 1:
                y += pix @ w[:, r, s, :].T
            else:
                wt = w[:, r, s, :].reshape(g, k // g, c // g)
                y += np.einsum("mgc,gkc->mgk", _grouped(pix, g), wt, optimize=True).reshape(-1, k)
    y = y.reshape(prob.y_shape)

    if relu and gelu:
        raise ValueError("relu and gelu are two activations; choose one")
    if residual is not None:
        res = _as_float64("residual", residual, "(N, P, Q, K)")
        if res.shape != y.shape:
            raise ValueError(f"residual shape {res.shape} does not match y's {y.shape}")
        y = float(alpha) * y + float(beta) * res
    if b is not None:
        y += b  # broadcasts over N, P, Q
    if relu:
        np.maximum(y, 0.0, out=y)
    if gelu:
        y = 0.5 * y * (1.0 + np.vectorize(math.erf, otypes=[np.float64])(y / math.sqrt(2.0)))
    return y


def dgrad(
    dy: ArrayLike,
    w: ArrayLike,
    input_shape: Sequence[int],
    stride: PairLike = 1,
    padding: PairLike = 0,
    dilation: PairLike = 1,
    groups: int = 1,
) -> F64Array:
    """Data gradient ``dx = d<fprop(x, w), dy>/dx`` in float64 (the transposed convolution).

    ``input_shape`` is needed because it is not recoverable from ``dy``: with a
    stride, several input sizes give the same output size, and the input rows
    the last window never reaches get a zero gradient.

    Each output pixel ``(p, q)`` sends ``dy[n, p, q, :] @ w[:, r, s, :]`` back to the
    input pixel that tap ``(r, s)`` read, so each tap is one matrix product
    scatter-added through the same strided slice fprop gathers through.  Within
    one tap distinct output pixels read distinct input pixels, so a slice ``+=``
    never adds to one element twice.

    Args:
        dy: output gradient, shape ``(N, P, Q, K)``.
        w: weights, shape ``(K, R, S, C/groups)``.
        input_shape: ``(N, H, W, C)`` of the forward input x.
        stride, padding, dilation, groups: as for :func:`fprop`.

    Returns:
        dx, shape ``(N, H, W, C)``, float64.
    """
    dy = _as_float64("dy", dy, "(N, P, Q, K)")
    w = _as_float64("w", w, "(K, R, S, C)")
    x_shape = _as_shape4("input_shape", input_shape, "(N, H, W, C)")
    _check_channels("w", w.shape, "input_shape", x_shape, groups)
    prob = _problem(x_shape, w.shape, stride, padding, dilation, groups)
    _check_dy(dy.shape, prob, f"input_shape {x_shape}", f"w {w.shape}")
    n, c, k, g = prob.n, prob.c, prob.k, prob.groups
    ph, pw = prob.padding

    dy_rows = dy.reshape(-1, k)  # (N*P*Q, K)
    dxp = np.zeros((n, prob.h + 2 * ph, prob.w + 2 * pw, c))
    for r in range(prob.r):
        for s in range(prob.s):
            if g == 1:
                back = dy_rows @ w[:, r, s, :]
            else:
                wt = w[:, r, s, :].reshape(g, k // g, c // g)
                back = np.einsum("mgk,gkc->mgc", _grouped(dy_rows, g), wt, optimize=True)
            dxp[_tap(prob, r, s)] += back.reshape(n, prob.p, prob.q, c)
    # Gradient that landed on the zero padding belongs to no input element.
    return dxp[:, ph : ph + prob.h, pw : pw + prob.w, :].copy()


def wgrad(
    x: ArrayLike,
    dy: ArrayLike,
    weight_shape: Sequence[int],
    stride: PairLike = 1,
    padding: PairLike = 0,
    dilation: PairLike = 1,
    groups: int = 1,
) -> tuple[F64Array, F64Array]:
    """Weight and bias gradients ``(dw, db)`` of ``<fprop(x, w, bias), dy>`` in float64.

    ``weight_shape`` is needed because R and S are not recoverable from x and dy.
    Tap ``(r, s)`` of dw is ``dy^T @ (pixels the tap read)``: a reduction over all
    N*P*Q output pixels, which is how the wgrad kernel's implicit GEMM is laid out.
    ``db`` is returned too since the bias epilogue produces it in the same pass.

    Args:
        x: forward input, shape ``(N, H, W, C)``.
        dy: output gradient, shape ``(N, P, Q, K)``.
        weight_shape: ``(K, R, S, C/groups)`` of the weights.
        stride, padding, dilation, groups: as for :func:`fprop`.

    Returns:
        ``(dw, db)``: dw of shape ``(K, R, S, C/groups)`` and db = dy summed over N, P, Q,
        shape ``(K,)``; both float64.
    """
    x = _as_float64("x", x, "(N, H, W, C)")
    dy = _as_float64("dy", dy, "(N, P, Q, K)")
    w_shape = _as_shape4("weight_shape", weight_shape, "(K, R, S, C)")
    _check_channels("weight_shape", w_shape, "x", x.shape, groups)
    prob = _problem(x.shape, w_shape, stride, padding, dilation, groups)
    _check_dy(dy.shape, prob, f"x {x.shape}", f"weight_shape {w_shape}")
    c, k, g = prob.c, prob.k, prob.groups

    xp = _pad(x, prob)
    dy_cols = dy.reshape(-1, k).T  # (K, N*P*Q)
    dw = np.empty(prob.w_shape)
    for r in range(prob.r):
        for s in range(prob.s):
            pix = xp[_tap(prob, r, s)].reshape(-1, c)
            if g == 1:
                dw[:, r, s, :] = dy_cols @ pix
            else:
                dw[:, r, s, :] = np.einsum("mgk,mgc->gkc", _grouped(dy_cols.T, g), _grouped(pix, g),
                                           optimize=True).reshape(k, c // g)
    db = dy.sum(axis=(0, 1, 2))
    return dw, db
