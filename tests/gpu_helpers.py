"""Shared machinery of the GPU tests: draw data, run one pass through convgen, and
compute what the float64 reference says it should be, on the values the kernel saw."""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import numpy as np

import convgen
from convgen import reference
from convgen.ir import ConvProblem, Pass
from convgen.spec import Plan


@dataclass
class Result:
    out: list[np.ndarray]  # kernel outputs, float64 on the host
    ref: list[np.ndarray]  # reference outputs
    reduction: int  # GEMM reduction length, for the tolerance


def draw(rng: np.random.Generator, shape, dtype: str, exact: bool, span: int = 2) -> np.ndarray:
    """Fresh random data: small integers in [-span, span] (every product and partial sum
    exact in fp32, and exact in any 16-bit input type: bf16 holds every integer up to 256)
    for the exact tier, else normal values; never zeros."""
    if exact:
        a = rng.integers(-span, span + 1, size=shape).astype(np.float64)
    else:
        a = rng.standard_normal(shape)
    return a.astype(np_dtype(dtype))


def np_dtype(name: str):
    """A dtype name as NumPy's dtype; bfloat16 is ml_dtypes' (NumPy has none of its own)."""
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def kernel_view(a: np.ndarray, mma_dtype: str = "float16") -> np.ndarray:
    """The values a kernel computes with: its MMAs' 16-bit type (float32 inputs are rounded to
    nearest even, as astype(float16) or ml_dtypes' astype(bfloat16) round)."""
    return a.astype(np.float32).astype(np_dtype(mma_dtype)).astype(np.float64)


# Relative rounding of one 16-bit output (half an ulp at the worst): fp16's 10-bit mantissa,
# bf16's 7-bit one (8 bits with the implicit one), which is 8x coarser.
_OUT_ROUNDING = {"float16": 1e-3, "bfloat16": 8e-3, "float32": 1e-6}


def tolerance(reduction: int, out_dtype: str) -> float:
    # fp32 accumulation of `reduction` products of 16-bit inputs (exact in fp32 whether fp16 or
    # bf16): error grows like sqrt(length); a 16-bit output adds its own rounding.
    acc = 4e-7 * math.sqrt(max(reduction, 1))
    return acc + _OUT_ROUNDING[out_dtype]


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
    mma_dtype: str | None = None, span: int = 2,
) -> Result:
    """``mma_dtype``: what the kernel's MMAs read (None: convgen's default for ``in_dtype``);
    ``span``: the exact tier's integers are in [-span, span]."""
    import cupy as cp

    pass_ = Pass.parse(pass_)
    geo = dict(stride=problem.stride, padding=problem.padding, dilation=problem.dilation,
               **({"groups": problem.groups} if problem.groups > 1 else {}))
    opts = dict(out_dtype=out_dtype, plan=plan, scalar=scalar, **({"mma_dtype": mma_dtype} if mma_dtype else {}))
    elem = mma_dtype or ("bfloat16" if in_dtype == "bfloat16" else "float16")
    draw_ = lambda shape, dtype: draw(rng, shape, dtype, exact, span)  # noqa: E731
    view = lambda a: kernel_view(a, elem)  # noqa: E731
    gemm = problem.gemm(pass_)
    if pass_ is Pass.FPROP:
        x = draw_(problem.x_shape, in_dtype)
        w = draw_(problem.w_shape, in_dtype)
        b = draw_((problem.k,), "float32") if bias else None
        r = draw_(problem.y_shape, out_dtype) if residual else None
        scales = dict(residual=cp.asarray(r), alpha=alpha, beta=beta) if residual else {}
        y = convgen.conv2d(cp.asarray(x), cp.asarray(w), None if b is None else cp.asarray(b),
                           activation="relu" if relu else "gelu" if gelu else None, **geo, **opts, **scales)
        ref = reference.fprop(view(x), view(w), b, relu=relu, gelu=gelu, **geo,
                              **(dict(residual=r.astype(np.float64), alpha=alpha, beta=beta) if residual else {}))
        return Result([cp.asnumpy(y).astype(np.float64)], [ref], gemm.k)
    if pass_ is Pass.DGRAD:
        dy = draw_(problem.y_shape, in_dtype)
        w = draw_(problem.w_shape, in_dtype)
        dx = convgen.conv2d_dgrad(cp.asarray(dy), cp.asarray(w), problem.x_shape, **geo, **opts)
        ref = reference.dgrad(view(dy), view(w), problem.x_shape, **geo)
        return Result([cp.asnumpy(dx).astype(np.float64)], [ref], gemm.k)
    x = draw_(problem.x_shape, in_dtype)
    dy = draw_(problem.y_shape, in_dtype)
    dw, db = convgen.conv2d_wgrad(cp.asarray(x), cp.asarray(dy), problem.w_shape, bias=bias, **geo, **opts)
    rdw, rdb = reference.wgrad(view(x), view(dy), problem.w_shape, **geo)
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


def seeded(*parts) -> np.random.Generator:
    """A generator seeded by ``parts`` (their repr's CRC): fresh data per case, the same on a rerun."""
    return np.random.default_rng(zlib.crc32(repr(parts).encode()))


def draw_layer(tag: str, p: ConvProblem) -> tuple[np.ndarray, ...]:
    """Fresh fp16 x, w, dy and an fp32 bias for layer ``p``, seeded by ``tag``."""
    rng = seeded(tag, p)
    return (rng.standard_normal(p.x_shape).astype(np.float16), rng.standard_normal(p.w_shape).astype(np.float16),
            rng.standard_normal(p.y_shape).astype(np.float16), rng.standard_normal(p.k).astype(np.float32))


def geo(p: ConvProblem) -> dict:
    """``p``'s stride, padding and dilation, as convgen's functions take them."""
    return dict(stride=p.stride, padding=p.padding, dilation=p.dilation)


def check_fp16(out, ref: np.ndarray, reduction: int, what: str) -> None:
    """A float16 output (a CuPy array) within the tolerance of ``reduction`` terms of ``ref``."""
    import cupy as cp

    err = rel_err(cp.asnumpy(out).astype(np.float64), ref)
    assert err <= tolerance(reduction, "float16"), f"{what}: relative error {err:.3g}"


def poisoned(shape, dtype):
    """A NaN-filled CuPy array whose fill has finished.  launch() runs on the caller's raw
    stream, which does not wait for CuPy's current stream: a fill still queued there could
    land after the kernel's writes (seen on the H200 as all-NaN outputs under load)."""
    import cupy as cp

    a = cp.full(shape, np.nan, dtype=dtype)
    cp.cuda.get_current_stream().synchronize()
    return a


def plan_id(v) -> str:
    """A test id for a Plan or a ConvProblem."""
    return v.brief().replace(" ", "_") if hasattr(v, "brief") else v.describe().replace(" ", "_")


def check_tma_fprop_on_real_layers(plan: Plan, tag: str) -> None:
    """An fprop TMA plan with several tiles an SM on the whole GPU: normal data through fp16 with
    bias and ReLU, on a 64->128 3x3 layer and on a grouped one (8 groups of 64, where the plan
    takes 64-filter tiles), against the float64 reference."""
    for problem in (ConvProblem(56, 56, 64, 128, 3, 3, 1, 1, 1, n=40), ConvProblem(14, 14, 512, 512, 3, 3, 1, 1, 1, 8, n=16)):
        if problem.groups > 1 and plan.block_n > 64:
            plan = Plan(128, 64, 64, 8, 1, 4, 8, 8, loop=plan.loop)
        res = run_pass(problem, Pass.FPROP, seeded(tag, problem), bias=True, relu=True, plan=plan)
        check(res, "float16", what=f"fprop {problem.describe()} {plan.brief()}")


def check_tma_fprop_fuzz_case(h: int, w: int, c: int, k: int, r: int, s: int, stride: int, n: int, plan: Plan,
                              seed: int) -> None:
    """One drawn fprop case of a TMA plan's fuzz: K rounded up to 8 (the TMA loop's rows of
    16-byte runs), padding r // 2, normal data with a bias, against the float64 reference."""
    problem = ConvProblem(h, w, c, -(-k // 8) * 8, r, s, stride, r // 2, 1, n=n)
    res = run_pass(problem, Pass.FPROP, np.random.default_rng(seed), bias=True, plan=plan)
    check(res, "float16", what=f"fprop {problem.describe()} {plan.brief()}")


def check_exact_fp32(problem: ConvProblem, pass_: Pass, plan: Plan, tag: str, where: str = "") -> None:
    """The exact tier of one plan on one shape: small integers in, fp32 out (fprop with a
    bias), equal to the float64 reference in every element; ``where`` names the target in the
    message (" on one SM")."""
    res = run_pass(problem, pass_, seeded(tag, problem, plan), out_dtype="float32", bias=pass_ is Pass.FPROP,
                   plan=plan, exact=True)
    check(res, "float32", exact=True, what=f"{pass_.value} {problem.describe()} {plan.brief()}{where}")


def check_plans_pass_the_planner(gpu_tests, target) -> None:
    """A TMA GPU test module's plans (PLANS and PERSISTENT on SHAPES in fprop, DGRAD_PLANS on
    DGRAD_SHAPES in dgrad) pass the planner's checks, so that module tests kernels, not refusals."""
    from convgen.planner import check_plan

    for plans, shapes, pass_ in ((gpu_tests.PLANS + gpu_tests.PERSISTENT, gpu_tests.SHAPES, Pass.FPROP),
                                 (gpu_tests.DGRAD_PLANS, gpu_tests.DGRAD_SHAPES, Pass.DGRAD)):
        for plan in plans:
            for problem in shapes:
                check_plan(plan, problem, pass_, target, "float16")
