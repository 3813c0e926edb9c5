"""Shared machinery of the GPU tests: draw data, run one pass through convgen, and
compute what the float64 reference says it should be, on the values the kernel saw."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

import convgen
from convgen import reference
from convgen.ir import ConvProblem, Pass, Plan


@dataclass
class Result:
    out: list[np.ndarray]  # kernel outputs, float64 on the host
    ref: list[np.ndarray]  # reference outputs
    reduction: int  # GEMM reduction length, for the tolerance


def draw(rng: np.random.Generator, shape, dtype: str, exact: bool) -> np.ndarray:
    """Fresh random data: small integers (every product and partial sum exact in fp32)
    for the exact tier, else normal values; never zeros."""
    if exact:
        a = rng.integers(-2, 3, size=shape).astype(np.float64)
    else:
        a = rng.standard_normal(shape)
    return a.astype(dtype)


def kernel_view(a: np.ndarray) -> np.ndarray:
    """The values a kernel computes with: fp16 (fp32 inputs are rounded as astype(float16))."""
    return a.astype(np.float32).astype(np.float16).astype(np.float64)


def tolerance(reduction: int, out_dtype: str) -> float:
    # fp32 accumulation of `reduction` fp16 products: error grows like sqrt(length);
    # an fp16 output adds its own rounding (2^-11 relative).
    acc = 4e-7 * math.sqrt(max(reduction, 1))
    return acc + (1e-3 if out_dtype == "float16" else 1e-6)


def rel_err(out: np.ndarray, ref: np.ndarray) -> float:
    assert out.shape == ref.shape, (out.shape, ref.shape)
    assert np.isfinite(out).all(), f"{np.size(out) - np.isfinite(out).sum()} of {out.size} outputs are not finite (unwritten?)"
    denom = max(np.linalg.norm(ref), 1e-30)
    return float(np.linalg.norm(out - ref) / denom)


def run_pass(
    problem: ConvProblem, pass_: Pass | str, rng: np.random.Generator, *,
    in_dtype: str = "float16", out_dtype: str = "float16", bias: bool = False, relu: bool = False,
    scalar: bool = False, plan: Plan | None = None, exact: bool = False,
    gelu: bool = False, residual: bool = False, alpha: float = 1.0, beta: float = 1.0,
) -> Result:
    import cupy as cp

    pass_ = Pass.parse(pass_)
    geo = dict(stride=problem.stride, padding=problem.padding, dilation=problem.dilation)
    opts = dict(out_dtype=out_dtype, plan=plan, scalar=scalar)
    gemm = problem.gemm(pass_)
    if pass_ is Pass.FPROP:
        x = draw(rng, problem.x_shape, in_dtype, exact)
        w = draw(rng, problem.w_shape, in_dtype, exact)
        b = draw(rng, (problem.k,), "float32", exact) if bias else None
        r = draw(rng, problem.y_shape, out_dtype, exact) if residual else None
        scales = dict(residual=cp.asarray(r), alpha=alpha, beta=beta) if residual else {}
        y = convgen.conv2d(cp.asarray(x), cp.asarray(w), None if b is None else cp.asarray(b),
                           activation="relu" if relu else "gelu" if gelu else None, **geo, **opts, **scales)
        ref = reference.fprop(kernel_view(x), kernel_view(w), b, relu=relu, gelu=gelu, **geo,
                              **(dict(residual=r.astype(np.float64), alpha=alpha, beta=beta) if residual else {}))
        return Result([cp.asnumpy(y).astype(np.float64)], [ref], gemm.k)
    if pass_ is Pass.DGRAD:
        dy = draw(rng, problem.y_shape, in_dtype, exact)
        w = draw(rng, problem.w_shape, in_dtype, exact)
        dx = convgen.conv2d_dgrad(cp.asarray(dy), cp.asarray(w), problem.x_shape, **geo, **opts)
        ref = reference.dgrad(kernel_view(dy), kernel_view(w), problem.x_shape, **geo)
        return Result([cp.asnumpy(dx).astype(np.float64)], [ref], gemm.k)
    x = draw(rng, problem.x_shape, in_dtype, exact)
    dy = draw(rng, problem.y_shape, in_dtype, exact)
    dw, db = convgen.conv2d_wgrad(cp.asarray(x), cp.asarray(dy), problem.w_shape, bias=bias, **geo, **opts)
    rdw, rdb = reference.wgrad(kernel_view(x), kernel_view(dy), problem.w_shape, **geo)
    outs, refs = [cp.asnumpy(dw).astype(np.float64)], [rdw]
    if bias:
        outs.append(cp.asnumpy(db).astype(np.float64))
        refs.append(rdb)
    return Result(outs, refs, gemm.k)


def check(res: Result, out_dtype: str, exact: bool = False, what: str = "") -> None:
    for i, (o, r) in enumerate(zip(res.out, res.ref)):
        if exact:
            bad = np.flatnonzero(o != r)
            assert bad.size == 0, (
                f"{what} output {i}: {bad.size} of {o.size} elements differ from the exact reference; "
                f"first at flat index {bad[0]}: got {o.flat[bad[0]]}, want {r.flat[bad[0]]}"
            )
        else:
            err = rel_err(o, r)
            tol = tolerance(res.reduction, out_dtype)
            assert err <= tol, f"{what} output {i}: relative error {err:.3g} > {tol:.3g}"
