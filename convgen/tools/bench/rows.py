"""The rows of `convgen bench`: what one row runs on each side, what it must move and
compute, and the figures derived from its measured times (floors, TFLOP/s, speedups).

Two kinds of row, never mixed in one mean:

* **same work** (the default and the headline): both sides compute exactly the same
  outputs.  fprop is ``conv(x, w)`` without bias, dgrad computes dx alone, wgrad dW alone.
* **fused** (``--fused``), a separate, labelled comparison of convgen's fused epilogue: fprop
  with bias and ReLU fused into convgen's kernel against PyTorch's path as a user writes
  it, ``relu(conv2d(x, w, b))``; wgrad with dW and db on both sides.

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

# The H200's ceilings as measured on our machine (fp16 dense tensor-core rate; HBM3e), printed
# beside the ceilings each run measures for itself: a floor from constants says what the
# chip can do, one from this run's ceilings what this run's GEMM and copy reached.
REFERENCE_TFLOPS = 781.0
REFERENCE_GBPS = 4200.0
REFERENCE_SOURCE = "NVIDIA H200: 781 TFLOP/s fp16 dense (measured), 4.2 TB/s HBM3e"
# Below this rate cuDNN is taken to be latency- or memory-bound on a layer (issue 16 counts
# those rows apart from the compute-bound rest, which belongs to the Hopper main loop).
LOW_RATE_TFLOPS = 300.0
REGIME_LOW = "latency/memory"
REGIME_COMPUTE = "compute"

SAME = "same"
FUSED = "fused"
RESIDUAL = "residual"
VARIANTS = (SAME, FUSED, RESIDUAL)
LABELS = {
    SAME: "same work: fprop conv(x, w) without bias on both sides, dgrad dx alone, wgrad dW alone",
    FUSED: "fused bias+ReLU vs PyTorch conv2d(x,w,b)+relu (fprop); dW+db on both sides (wgrad)",
    RESIDUAL: "fused bias+residual+ReLU (a ResNet block's epilogue) vs PyTorch relu(conv2d(x,w,b) + r) (fprop)",
}
FUSED_PASSES = (Pass.FPROP, Pass.WGRAD)  # dgrad has no epilogue to fuse: its same-work row is the row
RESIDUAL_PASSES = (Pass.FPROP,)


@dataclass(frozen=True)
class Item:
    """One row of work: a layer of a suite, a pass, and which comparison (same work or fused)."""

    suite: str
    layer: Layer
    pass_: Pass
    variant: str = SAME

    def __post_init__(self) -> None:
        if self.variant not in VARIANTS:
            raise ValueError(f"variant must be one of {VARIANTS}, got {self.variant!r}")
        if self.variant == FUSED and self.pass_ not in FUSED_PASSES:
            raise ValueError(f"{self.pass_.value} has no fused comparison")
        if self.variant == RESIDUAL and self.pass_ not in RESIDUAL_PASSES:
            raise ValueError(f"{self.pass_.value} has no residual comparison")

    @property
    def label(self) -> str:
        return f"{self.suite}/{self.layer.name} {self.pass_.value}" + ("" if self.variant == SAME else f" {self.variant}")


def work(pass_: Pass, variant: str) -> tuple[bool, bool]:
    """(bias, relu) that both sides of a row compute: nothing extra in the same-work rows;
    bias and ReLU in fused fprop, db in fused wgrad."""
    if variant == SAME:
        return False, False
    return True, pass_ is Pass.FPROP


def traffic(problem: ConvProblem, pass_: Pass | str, *, bias: bool = False, in_dtype: str = "float16",
            out_dtype: str = "float16", bias_dtype: str = "float32", residual: bool = False) -> dict[str, int]:
    """Bytes each tensor of one pass moves at the least: every input read once, every
    output written once.  fprop reads x, w (and, with bias, the bias, fp32 as convgen reads
    it) and writes y; dgrad reads dy, w and writes dx; wgrad reads x, dy and writes dw (and,
    with bias, db).  w is (K, R, S, C/groups).  Split-K workspaces and re-reads are
    implementation costs, not counted."""
    p = Pass.parse(pass_)
    i, o = _BYTES[in_dtype], _BYTES[out_dtype]
    n, h, w, c = problem.x_shape
    _, pp, q, k = problem.y_shape
    x = n * h * w * c
    y = n * pp * q * k
    wt = k * problem.r * problem.s * problem.cg  # C/groups channels a filter
    if p is Pass.FPROP:
        t = {"x": x * i, "w": wt * i}
        if bias:
            t["bias"] = k * _BYTES[bias_dtype]
        if residual:  # read once, y's dtype
            t["residual"] = y * o
        t["y"] = y * o
        return t
    if p is Pass.DGRAD:
        return {"dy": y * i, "w": wt * i, "dx": x * o}
    t = {"x": x * i, "dy": y * i, "dw": wt * o}
    if bias:
        t["db"] = k * o
    return t


def useful_flops(problem: ConvProblem) -> int:
    """2 * N*P*Q * K * R*S*C/groups: the multiply-adds of the convolution, the same for all
    three passes (each forward product has one counterpart in dgrad and one in wgrad).  This is
    what TFLOP/s and the floor use.  convgen's implicit GEMM of dgrad (M = N*H*W, K = R*S*K)
    is larger when stride > 1, as it spans filter taps that land between output pixels;
    that size is kept in the JSON as ``gemm_flops``."""
    return problem.flops(Pass.FPROP)


def torch_weight_shape(problem: ConvProblem) -> tuple[int, int, int, int]:
    """The weight's logical shape on PyTorch's side: (K, C/groups, R, S), a KCRS view of
    convgen's (K, R, S, C/groups) memory (channels_last)."""
    k, r, s, cg = problem.w_shape
    return (k, cg, r, s)


def torch_conv_args(problem: ConvProblem) -> tuple[list[int], list[int], list[int], int]:
    """(stride, padding, dilation, groups) as torch.nn.functional.conv2d and
    torch.ops.aten.convolution_backward take them."""
    return list(problem.stride), list(problem.padding), list(problem.dilation), problem.groups


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


def regime(cudnn_tflops: Optional[float]) -> Optional[str]:
    """Whether cuDNN runs this row below LOW_RATE_TFLOPS (latency/memory) or not (compute)."""
    if cudnn_tflops is None:
        return None
    return REGIME_LOW if cudnn_tflops < LOW_RATE_TFLOPS else REGIME_COMPUTE


def mismatch(row: dict[str, Any]) -> bool:
    check = row.get("check")
    return bool(check) and check.get("ok") is False


def finish_row(row: dict[str, Any], ceilings: dict[str, Any]) -> dict[str, Any]:
    """Fill the derived fields of a row (floors, TFLOP/s, speedups, time over floor, cuDNN's
    regime) from its measured times and the run's ceilings.  A derived value is None when
    an input is."""
    fl, bound = floor_us(row["flops"], row["bytes"], ceilings.get("gemm_tflops"), ceilings.get("copy_gbps"))
    row["floor_us"], row["floor_bound"] = fl, bound
    row["floor_ref_us"], row["floor_ref_bound"] = floor_us(row["flops"], row["bytes"], REFERENCE_TFLOPS, REFERENCE_GBPS)
    cg = _median_of(row["convgen"].get("time_us"))
    cg_eager = _median_of(row["convgen"].get("eager_us"))
    row["convgen"]["tflops"] = tflops(row["flops"], cg)
    cd = cd_eager = None
    if row.get("cudnn") is not None:
        cd = _median_of(row["cudnn"].get("time_us"))
        cd_eager = _median_of(row["cudnn"].get("eager_us"))
        row["cudnn"]["tflops"] = tflops(row["flops"], cd)
    row["speedup"] = ratio(cd, cg)  # > 1: convgen is faster
    row["eager_speedup"] = ratio(cd_eager, cg_eager)
    row["over_floor"] = ratio(cg, fl)  # >= 1 normally: how far from the floor
    row["over_floor_ref"] = ratio(cg, row["floor_ref_us"])  # the same against the H200 reference rates
    row["cudnn_over_floor"] = ratio(cd, fl)  # the most a kernel at the floor could gain over cuDNN
    row["cudnn_regime"] = regime((row.get("cudnn") or {}).get("tflops"))
    return row


def epilogue_for(pass_: Pass, variant: str = SAME) -> Epilogue:
    """The epilogue of convgen's kernel in a row (it decides which plan and kernel run)."""
    bias, relu = work(pass_, variant)
    return Epilogue(bias=bias and pass_ is not Pass.DGRAD, relu=relu, out_dtype="float16", residual=variant == RESIDUAL)


def computes(pass_: Pass, variant: str = SAME, groups: int = 1) -> dict[str, str]:
    """What each side computes in a row, in words, for the JSON and the report; a grouped
    layer's calls pass groups=G on both sides (w (K, R, S, C/G) for convgen, (K, C/G, R, S)
    for PyTorch)."""
    what = _computes(pass_, variant)
    if groups > 1:
        what = {"convgen": f"{what['convgen']}; groups={groups}, w (K, R, S, C/{groups})",
                "cudnn": f"{what['cudnn']}; groups={groups}, w (K, C/{groups}, R, S)"}
    return what


def _computes(pass_: Pass, variant: str = SAME) -> dict[str, str]:
    bias, relu = work(pass_, variant)
    if pass_ is Pass.FPROP:
        if variant == RESIDUAL:
            return {
                "convgen": "convgen.conv2d(x, w, bias, residual=r, activation='relu'): x NHWC, w KRSC fp16, bias "
                           "fp32, the residual r (y's shape, fp16), bias and ReLU fused in the epilogue, y fp16",
                "cudnn": "torch.nn.functional.relu(torch.nn.functional.conv2d(x, w, bias) + r): fp16 channels_last, "
                         "bias fp16, the add and ReLU separate ops, y fp16",
            }
        if relu:
            return {
                "convgen": "convgen.conv2d(x, w, bias, activation='relu'): x NHWC, w KRSC fp16, bias fp32 "
                           "and ReLU fused in the epilogue, y fp16",
                "cudnn": "torch.nn.functional.relu(torch.nn.functional.conv2d(x, w, bias)): fp16 channels_last, bias fp16, "
                         "ReLU a separate op, y fp16",
            }
        return {
            "convgen": "convgen.conv2d(x, w): x NHWC, w KRSC fp16, no bias, y fp16",
            "cudnn": "torch.nn.functional.conv2d(x, w): fp16 channels_last, no bias, y fp16",
        }
    if pass_ is Pass.DGRAD:
        return {
            "convgen": "convgen.conv2d_dgrad(dy, w, x.shape): fp16 in, dx fp16",
            "cudnn": "torch.ops.aten.convolution_backward(dy, x, w, output_mask=[True, False, False]): dx fp16, channels_last",
        }
    return {
        "convgen": f"convgen.conv2d_wgrad(x, dy, w.shape, bias={bias}): dw" + (" and db" if bias else "") + " fp16",
        "cudnn": "torch.ops.aten.convolution_backward(dy, x, w, "
                 + ("bias_sizes=[K], output_mask=[False, True, True]): dw and db" if bias
                    else "bias_sizes=None, output_mask=[False, True, False]): dw") + " fp16, channels_last",
    }


def _side(what: str, cudnn: bool) -> dict[str, Any]:
    side: dict[str, Any] = {"computes": what, "time_us": None, "eager_us": None, "tflops": None,
                            "host_us": None, "host_clean": None, "error": None}
    if cudnn:
        side["first_call_ms"] = None
    else:
        side.update(key=None, plan=None, compile_cold_ms=None, compile_warm_ms=None)
    return side


def new_row(item: Item, *, target: Optional[Target], with_cudnn: bool,
            gpu_name: Optional[str] = None) -> dict[str, Any]:
    """A row with the static facts filled in and every measurement null."""
    prob = item.layer.problem
    g = prob.gemm(item.pass_)
    what = computes(item.pass_, item.variant, prob.groups)
    bias, _ = work(item.pass_, item.variant)
    row: dict[str, Any] = {
        "suite": item.suite, "layer": item.layer.name, "pass": item.pass_.value,
        "variant": item.variant, "label": LABELS[item.variant],
        "problem": prob.as_dict(), "describe": prob.describe(),
        "gemm": {"m": g.m, "n": g.n, "k": g.k},
        "flops": useful_flops(prob),
        "gemm_flops": g.flops,
        "traffic": traffic(prob, item.pass_, bias=bias and item.pass_ is not Pass.DGRAD,
                           residual=item.variant == RESIDUAL),
        "convgen": _side(what["convgen"], cudnn=False),
        "cudnn": _side(what["cudnn"], cudnn=True) if with_cudnn else None,
        "check": None, "floor_us": None, "floor_bound": None, "floor_ref_us": None, "floor_ref_bound": None,
        "speedup": None, "eager_speedup": None, "over_floor": None, "over_floor_ref": None, "cudnn_over_floor": None,
        "cudnn_regime": None,
        "spin_us": None,
    }
    row["bytes"] = sum(row["traffic"].values())
    if target is not None:
        try:
            from ...planner import make_spec
            from ...runtime import kernel_problem

            # The plan convgen.conv2d will run: the tuned one for this GPU when there is one, else
            # the planner's, for a stem's channels padded to 4 or a layer's groups packed into
            # slabs where those rules apply.
            kprob, tuned = kernel_problem(prob, item.pass_, "float16", target, gpu_name or None)
            if kprob is not prob:
                if kprob.c != prob.c:
                    row["convgen"]["padded_channels"] = kprob.c
                if kprob.groups != prob.groups:
                    row["convgen"]["packed_groups"] = kprob.groups
            spec = make_spec(kprob, item.pass_, target=target, epilogue=epilogue_for(item.pass_, item.variant),
                             in_dtype="float16", plan_=tuned)
            row["convgen"]["key"] = spec.key
            row["convgen"]["plan"] = spec.plan.as_dict()
            row["convgen"]["plan_source"] = plan_source(tuned is not None)
        except Exception as exc:  # a shape the planner refuses: the run says so in the row
            row["convgen"]["error"] = _err(exc)
    return row


def plan_source(tuned: bool) -> str:
    """Where a row's plan comes from, as the run's settings decide: this GPU's tuning database,
    the tuner on the shape's first call (autotune on, no database entry; the plan is read back
    after the run, :func:`plan_run`), or the planner.  Issue 16's targets differ by source."""
    from ...autotune import enabled

    return "tuning database" if tuned else "first use" if enabled() else "planner"


def plans_setting() -> str:
    """The run's plan sources in words, for the JSON's settings and the report's header."""
    from ... import config
    from ...autotune import enabled

    base = ("this GPU's tuning databases, else the planner" if config.TUNED.enabled()
            else "the planner's defaults (CONVGEN_TUNED=0: no tuning database)")
    return base + ("; a shape neither covers is tuned on its first call (autotune)" if enabled() else "")


def plan_run(item: Item) -> dict[str, Any]:
    """The plan convgen's call in a row ran, as a dict: its prepared twin (the same arguments,
    so the same cached kernel) names it.  Read after the row's calls, when tuning on first use
    has chosen it."""
    import convgen

    prob, epi = item.layer.problem, epilogue_for(item.pass_, item.variant)
    op = convgen.prepare(item.pass_, prob.x_shape, prob.w_shape, stride=prob.stride, padding=prob.padding,
                         dilation=prob.dilation, bias=epi.bias, activation="relu" if epi.relu else None,
                         residual=epi.residual, groups=prob.groups)
    return op.plan.as_dict()


def _err(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= 600 else text[:600] + "..."
