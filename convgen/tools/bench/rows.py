"""The rows of `convgen bench`: what one row runs, what it must move and compute, and the
figures derived from its measured times (floor, TFLOP/s, speedup).

A row is a plain dict (it is what the JSON holds); :func:`new_row` fills its static facts
with every measurement null, and :func:`finish_row` derives the rest once the harness has
timed it.  Nothing here touches a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from ...ir import ConvProblem, Epilogue, Pass, Target
from ...suites import Layer
from .stats import _median_of, ratio, tflops

TOLERANCE = 1e-2  # norm-relative difference allowed between convgen's and cuDNN's outputs
_BYTES = {"float16": 2, "float32": 4}


@dataclass(frozen=True)
class Item:
    """One row of work: a layer of a suite and a pass."""

    suite: str
    layer: Layer
    pass_: Pass

    @property
    def label(self) -> str:
        return f"{self.suite}/{self.layer.name} {self.pass_.value}"


def traffic(problem: ConvProblem, pass_: Pass | str, *, bias: bool = True, in_dtype: str = "float16",
            out_dtype: str = "float16", bias_dtype: str = "float32") -> dict[str, int]:
    """Bytes each tensor of one pass moves at the least: every input read once, every
    output written once.  fprop reads x, w (and the bias, fp32 as convgen reads it) and
    writes y; dgrad reads dy, w and writes dx; wgrad reads x, dy and writes dw (and db).
    Split-K workspaces and re-reads are implementation costs and are not counted."""
    p = Pass.parse(pass_)
    i, o = _BYTES[in_dtype], _BYTES[out_dtype]
    n, h, w, c = problem.x_shape
    _, pp, q, k = problem.y_shape
    x = n * h * w * c
    y = n * pp * q * k
    wt = k * problem.r * problem.s * c
    if p is Pass.FPROP:
        t = {"x": x * i, "w": wt * i}
        if bias:
            t["bias"] = k * _BYTES[bias_dtype]
        t["y"] = y * o
        return t
    if p is Pass.DGRAD:
        return {"dy": y * i, "w": wt * i, "dx": x * o}
    t = {"x": x * i, "dy": y * i, "dw": wt * o}
    if bias:
        t["db"] = k * o
    return t


def useful_flops(problem: ConvProblem) -> int:
    """2 * N*P*Q * K * R*S*C: the multiply-adds of the convolution, the same for all three
    passes (each forward product has one counterpart in dgrad and one in wgrad).  This is
    what TFLOP/s and the floor use.  convgen's implicit GEMM of dgrad (M = N*H*W, K = R*S*K)
    is larger when stride > 1, as it spans filter taps that land between output pixels;
    that size is kept in the JSON as ``gemm_flops``."""
    return problem.flops(Pass.FPROP)


def pass_bytes(problem: ConvProblem, pass_: Pass | str, **kw: Any) -> int:
    return sum(traffic(problem, pass_, **kw).values())


def floor_us(flops: float, nbytes: float, gemm_tflops: Optional[float],
             copy_gbps: Optional[float]) -> tuple[Optional[float], Optional[str]]:
    """The roofline floor in microseconds and what bounds it ("compute" or "memory"):
    max(flops / GEMM rate, bytes / copy bandwidth).  (None, None) without both ceilings."""
    if not gemm_tflops or not copy_gbps or gemm_tflops <= 0 or copy_gbps <= 0:
        return None, None
    compute = flops / (gemm_tflops * 1e6)  # TFLOP/s = 1e6 FLOP/us
    memory = nbytes / (copy_gbps * 1e3)  # GB/s = 1e3 B/us
    return (compute, "compute") if compute >= memory else (memory, "memory")


def mismatch(row: dict[str, Any]) -> bool:
    check = row.get("check")
    return bool(check) and check.get("ok") is False


def finish_row(row: dict[str, Any], ceilings: dict[str, Any]) -> dict[str, Any]:
    """Fill the derived fields of a row (floor, TFLOP/s, speedup, time over floor) from
    its measured times and the run's ceilings.  Derived values are None when an input is."""
    fl, bound = floor_us(row["flops"], row["bytes"], ceilings.get("gemm_tflops"), ceilings.get("copy_gbps"))
    row["floor_us"], row["floor_bound"] = fl, bound
    cg = _median_of(row["convgen"].get("time_us"))
    row["convgen"]["tflops"] = tflops(row["flops"], cg)
    cd = None
    if row.get("cudnn") is not None:
        cd = _median_of(row["cudnn"].get("time_us"))
        row["cudnn"]["tflops"] = tflops(row["flops"], cd)
    row["speedup"] = ratio(cd, cg)  # > 1: convgen is faster
    row["over_floor"] = ratio(cg, fl)  # >= 1 normally: how far from the floor
    return row


def epilogue_for(pass_: Pass, bias: bool) -> Epilogue:
    """What convgen's call computes in the bench: fprop with bias, wgrad with db, fp16 out."""
    return Epilogue(bias=bias and pass_ is not Pass.DGRAD, relu=False, out_dtype="float16")


def computes(pass_: Pass, bias: bool) -> dict[str, str]:
    """What each side computes in a row, for the JSON."""
    if pass_ is Pass.FPROP:
        return {
            "convgen": "convgen.conv2d(x, w" + (", bias" if bias else "")
                       + "): x NHWC, w KRSC fp16" + (", bias fp32 (fused)" if bias else "") + ", y fp16",
            "cudnn": "torch.nn.functional.conv2d(x, w" + (", bias" if bias else "")
                     + "): fp16 channels_last" + (", bias fp16" if bias else "") + ", y fp16",
        }
    if pass_ is Pass.DGRAD:
        return {
            "convgen": "convgen.conv2d_dgrad(dy, w, x.shape): fp16 in, dx fp16",
            "cudnn": "torch.ops.aten.convolution_backward(dy, x, w, output_mask=[True, False, False]): dx fp16, channels_last",
        }
    return {
        "convgen": f"convgen.conv2d_wgrad(x, dy, w.shape, bias={bias}): dw" + (" and db" if bias else "") + " fp16",
        "cudnn": "torch.ops.aten.convolution_backward(dy, x, w, output_mask=[False, True, "
                 + ("True]): dw and db" if bias else "False]): dw") + " fp16, channels_last",
    }


def new_row(item: Item, *, bias: bool, target: Optional[Target], with_cudnn: bool,
            gpu_name: Optional[str] = None) -> dict[str, Any]:
    """A row with the static facts filled in and every measurement null."""
    prob = item.layer.problem
    g = prob.gemm(item.pass_)
    what = computes(item.pass_, bias)
    row: dict[str, Any] = {
        "suite": item.suite, "layer": item.layer.name, "pass": item.pass_.value,
        "problem": prob.as_dict(), "describe": prob.describe(),
        "gemm": {"m": g.m, "n": g.n, "k": g.k},
        "flops": useful_flops(prob),
        "gemm_flops": g.flops,
        "traffic": traffic(prob, item.pass_, bias=bias and item.pass_ is not Pass.DGRAD),
        "convgen": {"computes": what["convgen"], "key": None, "plan": None, "time_us": None, "tflops": None,
                    "host_us": None, "host_clean": None, "compile_cold_ms": None, "compile_warm_ms": None,
                    "error": None},
        "cudnn": ({"computes": what["cudnn"], "time_us": None, "tflops": None, "host_us": None,
                   "host_clean": None, "first_call_ms": None, "error": None} if with_cudnn else None),
        "check": None, "floor_us": None, "floor_bound": None, "speedup": None, "over_floor": None,
    }
    row["bytes"] = sum(row["traffic"].values())
    if target is not None:
        try:
            from ...planner import make_spec
            from ...tuning_db import tuned_plan

            # The plan convgen.conv2d will run: the tuned one for this GPU when there is one.
            tuned = tuned_plan(gpu_name, prob.geometry, item.pass_, "float16", target.arch) if gpu_name else None
            spec = make_spec(prob, item.pass_, target=target, epilogue=epilogue_for(item.pass_, bias),
                             in_dtype="float16", plan_=tuned)
            row["convgen"]["key"] = spec.key
            row["convgen"]["plan"] = spec.plan.as_dict()
        except Exception as exc:  # a shape the planner refuses: the run says so in the row
            row["convgen"]["error"] = _err(exc)
    return row


def _err(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= 600 else text[:600] + "..."
