"""The run-time API: conv2d, conv2d_dgrad and conv2d_wgrad on CuPy arrays.

Each call validates its arguments (naming the one at fault), makes every operand
something the kernel can read correctly (contiguous, the dtype the plan reads,
aligned for its vector width: a strided view or an offset pointer is copied, never
misread), finds the compiled kernel for its shape (planned, emitted and compiled
once per shape and device, whatever the batch size), and launches on the current
CuPy stream.  The launch path neither synchronises nor copies between host and
device, so it can be captured in a CUDA graph.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import warnings
from dataclasses import dataclass
from typing import Any, Iterator, Optional

import numpy as np

from .dtypes import BF16_HINT, default_mma_dtype, dtype_name, np_dtype, resolve_mma_dtype
from .emit import KernelSource, emit
from .ir import ConvProblem, Epilogue, Pass, PairLike, Target, resolve_padding
from .spec import Plan
from .limits import check_launch
from .planner import make_spec

_FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")


@dataclass
class _Kernel:
    """A loaded kernel plus what its launch needs, precomputed so a call does little Python."""

    source: KernelSource
    main: Any  # cupy.cuda.Function
    reduce: Any
    m_per_image: int  # GEMM M = batch * m_per_image (fprop, dgrad); fixed M for wgrad
    batch_scales_m: bool
    gemm_n: int
    db_len: int

    @classmethod
    def build(cls, source: KernelSource, main: Any, reduce: Any) -> "_Kernel":
        g = source.spec.geometry.gemm(source.spec.pass_, 1)
        scales = source.spec.pass_ is not Pass.WGRAD
        return cls(source, main, reduce, g.m, scales, g.n, source.spec.geometry.k)

    def gemm_m(self, batch: int) -> int:
        return batch * self.m_per_image if self.batch_scales_m else self.m_per_image

    @property
    def local_bytes(self) -> int:
        from .compile import local_bytes

        return max(local_bytes(f) for f in (self.main, self.reduce) if f is not None)


def kernels_for(plan: Plan) -> list[_Kernel]:
    """The kernels this process has built for a hand plan, or with it as the tuned plan
    (`convgen tune` reads their resources)."""
    with _lock:
        return [k for key, k in _cache.items() if key[5] == plan or k.source.spec.plan == plan]


# Tests set this so every output and workspace starts as NaN: an element a kernel
# forgets to write then fails the comparison instead of passing on leftover memory.
POISON_OUTPUTS = False

_cache: dict[tuple, _Kernel] = {}
_targets: dict[int, Any] = {}
_lock = threading.RLock()  # re-entrant: the autotuner builds its candidates' kernels under it


def _cupy():
    try:
        import cupy
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ImportError(
            "convgen's run-time API needs CuPy: pip install 'convgen[cuda13]' (or [cuda12])"
        ) from exc
    return cupy


# Each array argument's layout, for messages: activations NHWC, weights KRSC.
_LAYOUTS = {"x": "(N, H, W, C)", "dy": "(N, P, Q, K)", "w": "(K, R, S, C)", "bias": "(K,)"}


def _check_array(name: str, a: Any, ndim: int) -> None:
    cupy = _cupy()
    if not isinstance(a, cupy.ndarray):
        raise TypeError(f"{name} must be a cupy.ndarray, got {type(a).__name__}; convert it with cupy.asarray")
    if a.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions {_LAYOUTS[name]}, got shape {a.shape}")
    if a.dtype.name not in _FLOAT_DTYPES:
        raise TypeError(f"{name} must be float16, bfloat16, float32 or float64, got {a.dtype.name} ({BF16_HINT})")


def _out_dtype(out_dtype: Any, elem: str = "float16") -> str:
    """``out_dtype`` as a name; None: ``elem``, the MMA's 16-bit type (float16 unless the inputs
    are bfloat16 or mma_dtype says bfloat16)."""
    if out_dtype is None:
        return elem
    name = dtype_name(out_dtype)  # np.dtype("nonsense") raises NumPy's own message: never shown
    if name not in ("float16", "bfloat16", "float32"):
        raise ValueError(f"out_dtype must be None, 'float16', 'bfloat16' or 'float32' (a name or a NumPy/CuPy "
                         f"dtype), got {out_dtype!r}")
    return name


def _shape4(name: str, value: Any, layout: str) -> tuple[int, int, int, int]:
    """A shape argument (input_shape, weight_shape) as four ints.  Python and NumPy integers
    only: a float (3.5, or 3.0) or a bool is refused, never truncated."""
    if not isinstance(value, (tuple, list)):
        raise TypeError(f"{name} must be a tuple of four integers {layout}, got {type(value).__name__} {value!r}")
    if len(value) != 4:
        raise ValueError(f"{name} must be four integers {layout}, got {len(value)}: {tuple(value)!r}")
    for axis, v in zip(layout.strip("()").split(", "), value):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise TypeError(f"{name} {layout}: {axis} must be an integer, got {v!r} in {tuple(value)!r}")
        if v < 0:
            raise ValueError(f"{name} {layout}: {axis} must be >= 0, got {v} in {tuple(value)!r}")
    return tuple(int(v) for v in value)  # type: ignore[return-value]


def _check_options(plan: Any, scalar: Any) -> None:
    if plan is not None and not isinstance(plan, Plan):
        raise TypeError(f"plan must be a convgen.Plan or None, got {type(plan).__name__}")
    if not isinstance(scalar, (bool, np.bool_)):
        raise TypeError(f"scalar must be True or False, got {scalar!r}")


def _in_dtype(names: tuple[str, ...], *arrays: Any) -> str:
    """float32 only when every operand is float32/64: the planner may then read it in the
    gather; mixed inputs are all cast to the 16-bit one (fp16 or bf16), which is what the
    MMAs consume anyway.  float16 beside bfloat16 is refused, naming both: which one the
    other should be rounded to is the caller's choice."""
    kinds = {a.dtype.name for a in arrays}
    if {"float16", "bfloat16"} <= kinds:
        got = ", ".join(f"{n} {a.dtype.name}" for n, a in zip(names, arrays))
        raise TypeError(f"inputs mix float16 and bfloat16 ({got}); cast one to the other's type")
    return "bfloat16" if "bfloat16" in kinds else "float16" if "float16" in kinds else "float32"


def _same_device(**arrays: Any) -> int:
    ids = {name: a.device.id for name, a in arrays.items() if a is not None}
    if len(set(ids.values())) > 1:
        raise ValueError(f"arrays are on different devices: {ids}")
    return next(iter(ids.values()))


def _target(device_id: int):
    t = _targets.get(device_id)
    if t is None:
        from .compile import detect_target

        t = _targets[device_id] = detect_target()
    return t


def _gpu_name(device_id: int) -> str:
    cupy = _cupy()
    return cupy.cuda.runtime.getDeviceProperties(device_id)["name"].decode()


def _kernel(problem: ConvProblem, pass_: Pass, epilogue: Epilogue, in_dtype: str, device_id: int,
            plan: Optional[Plan], scalar: bool, mma_dtype: Optional[str] = None) -> _Kernel:
    """The compiled kernel for this shape on this device.  The batch size is not in the key:
    the first call's batch sizes the plan (split-K), and every later batch reuses it.
    Without a hand plan, a tuned plan for this GPU and shape wins over the planner's
    (``convgen tune``; set CONVGEN_TUNED=0 to plan only), and with autotune on, a shape
    no database covers is tuned here first (convgen/autotune.py)."""
    mma_dtype = resolve_mma_dtype(in_dtype, mma_dtype)
    # the MMAs' type only where it is not the inputs' default, so a float16 kernel keeps the key it had
    key = (problem.geometry, pass_, epilogue, in_dtype, device_id, plan, scalar) + (
        (mma_dtype,) if mma_dtype != default_mma_dtype(in_dtype) else ())
    k = _cache.get(key)
    if k is not None:
        check_launch(k.source, problem.n)  # built for another batch: check this one (convgen/limits.py)
        return k
    cupy = _cupy()
    with _lock, cupy.cuda.Device(device_id):  # detect, compile for and load on the arrays' device
        k = _cache.get(key)
        if k is None:
            src = _planned_source(problem, pass_, epilogue, in_dtype, device_id, plan, scalar, mma_dtype=mma_dtype)
            fns, main = _load(src)
            if src.main.cooperative:
                try:
                    _check_cooperative(src, main, problem.n, device_id)
                except ValueError as exc:
                    if plan is not None:
                        raise  # the caller's own plan: say why it cannot run here
                    src = _kernel_summed(src, exc)
                    fns, main = _load(src)
            k = _cache[key] = _Kernel.build(src, main, fns[src.reduce.kernel] if src.reduce else None)
    check_launch(k.source, problem.n)
    return k


def _load(src: KernelSource) -> tuple[dict[str, Any], Any]:
    """The source's kernels, compiled (or read from the cache) and loaded, and its main one."""
    from .compile import load_kernels, set_max_dynamic_shared_memory

    fns = load_kernels(src.source, src.kernel_names, arch=src.compile_arch)
    main = fns[src.main.kernel]
    if src.main.shared_mem > 48 * 1024:  # above 48 KB a block must opt in
        set_max_dynamic_shared_memory(main, src.main.shared_mem)
    return fns, main


def _kernel_summed(src: KernelSource, why: ValueError) -> KernelSource:
    """A plan the caller did not choose that sums its slices in the kernel, on a GPU that cannot
    hold its grid at once (the planner sized it at an estimated register count, or a tuning
    database or tuning on first use timed it where it fit: another part of the same name, or
    before MPS limited the SMs): the same plan with the slices summed by the reduction kernel,
    with a warning, rather than a call that fails."""
    warnings.warn(f"convgen: {why}; this shape's plan ({src.spec.plan.brief()}) sums its slices in a second "
                  "kernel instead", RuntimeWarning, stacklevel=4)
    return emit(dataclasses.replace(src.spec, plan=dataclasses.replace(src.spec.plan, split_reduce="kernel")))


def _check_cooperative(src: KernelSource, main: Any, batch: int, device_id: int) -> None:
    """A cooperative launch needs every block resident at once; the driver refuses one that
    is not (CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE).  Say so when the kernel is loaded, with
    the counts and the way out, rather than at its first call.  (Its grid, wgrad's, does not
    grow with the batch.)"""
    from .compile import resident_blocks

    gx, gy, gz = src.grid(batch)
    blocks = gx * gy * gz
    threads = src.main.block[0] * src.main.block[1] * src.main.block[2]
    holds = resident_blocks(main, threads, src.main.shared_mem, device_id)
    if blocks > holds:
        raise ValueError(
            f"plan.split_reduce='grid' launches all {blocks} blocks of {src.main.kernel} at once (a cooperative launch, "
            f"for its grid-wide barrier), but this GPU holds {holds} of them ({threads} threads and "
            f"{src.main.shared_mem} bytes of shared memory a block); use split_reduce='kernel' or fewer split-K slices")


def _tunable(plan: Optional[Plan], scalar: bool, in_dtype: str, mma_dtype: Optional[str]) -> bool:
    """Whether a call may take a tuned plan: no hand plan, not the scalar path, fp16 MMAs (no
    database holds bf16 plans, and a float32 input's were timed for fp16 MMAs)."""
    return plan is None and not scalar and resolve_mma_dtype(in_dtype, mma_dtype) == "float16"


def kernel_problem(problem: ConvProblem, pass_: Pass, in_dtype: str, target: Target, gpu_name: Optional[str],
                   plan: Optional[Plan] = None, scalar: bool = False,
                   mma_dtype: Optional[str] = None) -> tuple[ConvProblem, Optional[Plan]]:
    """The problem this shape's kernel is built for, and the plan tuned for it on ``gpu_name``
    (None if none serves, without a GPU name, or where a hand plan, the scalar path or a
    non-fp16 MMA is asked for).  The problem is ``problem``, or it with a stem's channels
    padded to 4 (convgen/channel_pad.py) or its narrow groups packed into slabs
    (convgen/group_pack.py), unless a plan tuned for the layer as it is exists for this GPU:
    that plan was measured, the two rules only fitted.  Each problem is looked up once: a
    lookup plans the shape to see whether its entry is stale.  `convgen bench` names its rows'
    kernels through here, so a row's plan is the one the call runs."""
    from .group_pack import copied_problem
    from .tuning_db import tuned_plan

    tunable = gpu_name is not None and _tunable(plan, scalar, in_dtype, mma_dtype)
    if tunable:
        tuned = tuned_plan(gpu_name, problem, pass_, in_dtype, target)
        if tuned is not None:
            return problem, tuned
    kernel = copied_problem(problem, pass_, in_dtype, target, plan, scalar)
    if tunable and kernel is not problem:
        return kernel, tuned_plan(gpu_name, kernel, pass_, in_dtype, target)
    return kernel, None


def _planned_source(problem: ConvProblem, pass_: Pass, epilogue: Epilogue, in_dtype: str, device_id: int,
                    plan: Optional[Plan], scalar: bool, *, tune: bool = True,
                    mma_dtype: Optional[str] = None) -> KernelSource:
    """The source this shape's kernel is built from on this device: a hand plan, else the
    tuning database's, else (with autotune on and ``tune``) the tuner's, else the planner's.
    bfloat16 kernels take the planner's: no database holds bf16 plans yet, and a float32 input's
    tuned plans were timed for fp16 MMAs. A stem's kernel may be for its channels padded to 4, a
    grouped layer's for its groups packed (:func:`kernel_problem`): the spec's geometry says
    which, and the op copies around it."""
    target = _target(device_id)
    layer = problem
    problem, tuned = kernel_problem(problem, pass_, in_dtype, target, _gpu_name(device_id), plan, scalar, mma_dtype)
    pack = layer.groups // problem.groups if pass_ is Pass.WGRAD else 1  # wgrad writes packed groups' dW as it is
    if tuned is not None:
        plan = tuned
    elif tune and _tunable(plan, scalar, in_dtype, mma_dtype):
        from . import autotune

        if autotune.enabled():  # tune on first use (convgen.set_autotune)
            plan = autotune.tune(problem, pass_, epilogue, in_dtype, target, _gpu_name(device_id),
                                 layer=layer if pack > 1 else None)
    return emit(make_spec(problem, pass_, target=target, epilogue=epilogue, in_dtype=in_dtype, plan_=plan,
                          scalar=scalar, mma_dtype=mma_dtype, pack=pack))


def _empty(shape: Any, dtype: Any) -> Any:
    cupy = _cupy()
    if POISON_OUTPUTS:
        return cupy.full(shape, np.nan, dtype=dtype)
    return cupy.empty(shape, dtype=dtype)


def _operand(name: str, a: Any, read_dtype: str, vec: int) -> Any:
    """A copy of `a` only when the kernel could not read `a` itself: wrong dtype, a
    non-contiguous view, or a pointer not aligned to the gather's vector width."""
    cupy = _cupy()
    if a.dtype.name != read_dtype:
        a = a.astype(np_dtype(read_dtype))  # fp64 -> fp32 -> fp16 (bf16) rounds through fp32, as documented
    if not a.flags.c_contiguous:
        a = cupy.ascontiguousarray(a)
    if a.data.ptr % (vec * a.itemsize):
        a = a.copy()
    return a


def _problem(n: int, h: int, w: int, c: int, k: int, r: int, s: int, stride: PairLike,
             padding: PairLike | str, dilation: PairLike, groups: Any = 1) -> ConvProblem:
    return ConvProblem(h, w, c, k, r, s, stride, resolve_padding(padding, r, s, stride, dilation), dilation, groups, n=n)


def _groups(groups: Any) -> int:
    if isinstance(groups, bool) or not isinstance(groups, (int, np.integer)) or groups < 1:
        raise ValueError(f"groups must be a positive integer, got {groups!r}")
    return int(groups)


def _check_group_channels(wc: int, c: int, groups: int, w_name: str, c_name: str) -> None:
    """w's last axis holds C / groups channels (C for an ungrouped convolution)."""
    if wc * groups != c:
        per = f" / groups {groups} = {c / groups:g}" if groups > 1 else ""
        raise ValueError(f"{w_name} has {wc} input channels ({w_name}[3]) but {c_name} has {c}{per}")


@dataclass(frozen=True)
class _Call:
    """A validated call signature: what a repeat of the same shapes and options needs."""

    problem: ConvProblem
    out_dtype: str
    device: int
    op: Any = None  # the PreparedConv a repeat call runs (convgen/prepared.py); None for an empty batch


def _prepared_call(pass_: Pass, problem: ConvProblem, epi: Epilogue, in_dtype: str, device: int,
                   plan: Optional[Plan], scalar: bool, out: str, alpha: float = 1.0, beta: float = 1.0,
                   mma_dtype: Optional[str] = None) -> _Call:
    """A call signature bound to a prepared op: the plain functions' repeat path is then the
    prepared op's (a few attribute checks and the launch), so they cost no more than it."""
    from .prepared import PreparedConv

    op = PreparedConv(pass_, problem, epi, in_dtype, device, plan, scalar=scalar, alpha=alpha, beta=beta,
                      mma_dtype=mma_dtype)
    return _Call(problem, out, device, op)


# Calls seen before, keyed by the raw arguments' shapes, dtypes, devices and options:
# a repeat skips validation and planning (the host cost of a small layer matters).
_calls: dict[tuple, _Call] = {}


def _call_key(tag: str, arrays: tuple, *options: Any) -> Optional[tuple]:
    """None for non-CuPy arrays (full checks); hashed once, by the lookup, which catches a list option."""
    try:
        return (tag, *[None if a is None else (type(a), a.shape, a.dtype.char, a.data.device_id) for a in arrays],
                *options)
    except AttributeError:
        return None


def _known(key: Optional[tuple]) -> Optional[_Call]:
    try:
        return None if key is None else _calls.get(key)
    except TypeError:  # an unhashable option: full checks on every call
        return None


def _remember(key: Optional[tuple], call: _Call) -> _Call:
    with contextlib.suppress(TypeError):
        if key is not None:
            _calls[key] = call
    return call


def conv2d(
    x: Any, w: Any, bias: Any = None, stride: PairLike = 1, padding: PairLike | str = 0,
    dilation: PairLike = 1, activation: Optional[str] = None, out_dtype: Any = None,
    *, residual: Any = None, alpha: float = 1.0, beta: float = 1.0, plan: Optional[Plan] = None,
    scalar: bool = False, mma_dtype: Optional[str] = None, groups: int = 1,
) -> Any:
    """y = act(alpha * conv(x, w) [+ bias] [+ beta * residual]), NHWC activations and KRSC weights.

    x: (N, H, W, C), w: (K, R, S, C), bias: (K,) or None; float16 inputs are read as
    they are, float32 too where the plan reads them in the gather, else cast once (the bias
    is read as float16 or float32, whichever it is; other dtypes as float32).  bfloat16 inputs
    are CuPy arrays of ``ml_dtypes.bfloat16`` (CuPy 14 takes that NumPy extension dtype; NumPy
    and CuPy have no bfloat16 of their own), read as they are by bf16 MMAs with fp32
    accumulators (sm_80+, sm_90's wgmma and TMA loops, rocWMMA); a bfloat16 bias is read as it is.
    ``mma_dtype``: the MMAs' input type, "float16" or "bfloat16"; None: the inputs' 16-bit type
    (float16 for float32 inputs).  float32 inputs with ``mma_dtype="bfloat16"`` are rounded to
    bf16 in the gather (or in one cast pass), as they are to fp16 otherwise.
    ``out_dtype``: None (the MMAs' 16-bit type), float16, bfloat16 or float32.
    ``activation``: None, "relu" or "gelu" (erf form).  ``residual``: None, or an array of y's
    shape (N, P, Q, K) and ``out_dtype`` (a ResNet block's skip connection), read in the
    epilogue; ``alpha`` and ``beta`` scale the convolution and the residual (they need one).
    Returns y: (N, P, Q, K) of ``out_dtype``.
    ``plan`` takes a hand-made :class:`Plan`; ``scalar`` forces the scalar staging path.
    ``groups`` as in ``torch.nn.functional.conv2d``: w is then (K, R, S, C / groups).  Depthwise
    layers (groups = C) run a stencil kind, other groupings one GEMM per group side by side.
    """
    cupy = _cupy()
    key = _call_key("fprop", (x, w, bias, residual), stride, padding, dilation, activation, out_dtype, alpha, beta,
                    plan, scalar, mma_dtype, groups)
    call = _known(key)
    if call is None:
        call = _remember(key, _setup_fprop(x, w, bias, stride, padding, dilation, activation, out_dtype, plan, scalar,
                                           residual, alpha, beta, mma_dtype, groups))
    if call.op is None:
        return cupy.empty(call.problem.y_shape, dtype=call.out_dtype)
    if residual is None:
        return call.op(x, w, bias)
    return call.op(x, w, bias, residual=residual)


def _check_scales(alpha: Any, beta: Any, residual: bool, needs: str) -> None:
    """alpha and beta (fprop's residual epilogue) are finite numbers, and stay 1 without a
    residual: the kernel without one has no scales (``needs`` names what to pass)."""
    for name, v in (("alpha", alpha), ("beta", beta)):
        if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) or not np.isfinite(v):
            raise ValueError(f"{name} must be a finite number, got {v!r}")
    if not residual and (alpha != 1.0 or beta != 1.0):
        raise ValueError(f"alpha and beta scale the convolution and the residual: they need {needs} "
                         "(without one, scale w instead)")


def _setup_fprop(x, w, bias, stride, padding, dilation, activation, out_dtype, plan, scalar, residual=None,
                 alpha=1.0, beta=1.0, mma_dtype=None, groups=1) -> _Call:
    _check_array("x", x, 4)
    _check_array("w", w, 4)
    if bias is not None:
        _check_array("bias", bias, 1)
    if residual is not None:
        _check_array("residual", residual, 4)
    if activation not in (None, "relu", "gelu"):
        raise ValueError(f"activation must be None, 'relu' or 'gelu', got {activation!r}")
    _check_scales(alpha, beta, residual is not None, "a residual")
    _check_options(plan, scalar)
    n, h, wd, c = x.shape
    kk, r, s, wc = w.shape
    groups = _groups(groups)
    _check_group_channels(wc, c, groups, "w", "x (x.shape[3])")
    if bias is not None and bias.shape != (kk,):
        raise ValueError(f"bias must have shape ({kk},) to match w's {kk} output channels, got {bias.shape}")
    problem = _problem(n, h, wd, c, kk, r, s, stride, padding, dilation, groups)
    in_dtype = _in_dtype(("x", "w"), x, w)
    elem = resolve_mma_dtype(in_dtype, mma_dtype)
    out = _out_dtype(out_dtype, elem)
    if residual is not None and (residual.shape != problem.y_shape or residual.dtype.name != out):
        raise ValueError(f"residual must have y's shape {problem.y_shape} and dtype {out} (out_dtype), got "
                         f"{residual.shape} {residual.dtype.name}")
    device = _same_device(x=x, w=w, bias=bias, residual=residual)
    if n == 0:
        return _Call(problem, out, device)
    # A bias of the MMAs' 16-bit type is read as it is; any other as float32 (cast once if need be).
    b_dtype = elem if bias is not None and bias.dtype.name == elem else "float32"
    epi = Epilogue(bias=bias is not None, relu=activation == "relu", gelu=activation == "gelu",  # type: ignore[arg-type]
                   out_dtype=out, bias_dtype=b_dtype, residual=residual is not None)  # type: ignore[arg-type]
    return _prepared_call(Pass.FPROP, problem, epi, in_dtype, device, plan, scalar, out, float(alpha),
                          float(beta), mma_dtype=elem)


def conv2d_dgrad(
    dy: Any, w: Any, input_shape: tuple[int, int, int, int], stride: PairLike = 1,
    padding: PairLike | str = 0, dilation: PairLike = 1, out_dtype: Any = None,
    *, plan: Optional[Plan] = None, scalar: bool = False, mma_dtype: Optional[str] = None, groups: int = 1,
) -> Any:
    """dx, the gradient of conv2d's input: dy (N, P, Q, K), w (K, R, S, C) -> dx of ``input_shape`` (N, H, W, C).
    Dtypes (bfloat16 among them), ``out_dtype``, ``mma_dtype`` and ``groups`` as :func:`conv2d`'s."""
    cupy = _cupy()
    shape_key = tuple(input_shape) if isinstance(input_shape, (tuple, list)) else input_shape
    key = _call_key("dgrad", (dy, w), shape_key, stride, padding, dilation, out_dtype, plan, scalar, mma_dtype, groups)
    call = _known(key)
    if call is None:
        call = _remember(key, _setup_dgrad(dy, w, input_shape, stride, padding, dilation, out_dtype, plan, scalar,
                                           mma_dtype, groups))
    if call.op is None:
        return cupy.empty(call.problem.x_shape, dtype=call.out_dtype)
    return call.op(dy, w)


def _setup_dgrad(dy, w, input_shape, stride, padding, dilation, out_dtype, plan, scalar, mma_dtype=None,
                 groups=1) -> _Call:
    _check_array("dy", dy, 4)
    _check_array("w", w, 4)
    n, h, wd, c = _shape4("input_shape", input_shape, "(N, H, W, C)")
    _check_options(plan, scalar)
    kk, r, s, wc = w.shape
    groups = _groups(groups)
    _check_group_channels(wc, c, groups, "w", "input_shape")
    problem = _problem(n, h, wd, c, kk, r, s, stride, padding, dilation, groups)
    if dy.shape != problem.y_shape:
        raise ValueError(
            f"dy shape {dy.shape} does not match the output shape {problem.y_shape} of input_shape "
            f"{tuple(input_shape)} with w {w.shape}"
        )
    in_dtype = _in_dtype(("dy", "w"), dy, w)
    elem = resolve_mma_dtype(in_dtype, mma_dtype)
    out = _out_dtype(out_dtype, elem)
    device = _same_device(dy=dy, w=w)
    if n == 0:
        return _Call(problem, out, device)
    epi = Epilogue(out_dtype=out)  # type: ignore[arg-type]
    return _prepared_call(Pass.DGRAD, problem, epi, in_dtype, device, plan, scalar, out, mma_dtype=elem)


def conv2d_wgrad(
    x: Any, dy: Any, weight_shape: tuple[int, int, int, int], stride: PairLike = 1,
    padding: PairLike | str = 0, dilation: PairLike = 1, bias: bool = True,
    out_dtype: Any = None, deterministic: bool = True,
    *, plan: Optional[Plan] = None, scalar: bool = False, mma_dtype: Optional[str] = None, groups: int = 1,
) -> tuple[Any, Any]:
    """(dw, db), the gradients of conv2d's weight and bias: x (N, H, W, C), dy (N, P, Q, K).

    db is None when ``bias`` is False.  Split-K partial sums always go to a workspace
    and are reduced in a fixed order, so results are bit-identical from run to run;
    ``deterministic`` is accepted for API compatibility and is always honoured.
    Dtypes (bfloat16 among them), ``out_dtype``, ``mma_dtype`` and ``groups`` as :func:`conv2d`'s
    (``weight_shape`` is then (K, R, S, C / groups)).
    """
    cupy = _cupy()
    shape_key = tuple(weight_shape) if isinstance(weight_shape, (tuple, list)) else weight_shape
    key = _call_key("wgrad", (x, dy), shape_key, stride, padding, dilation, bias, out_dtype, plan, scalar, mma_dtype,
                    groups)
    call = _known(key)
    if call is None:
        call = _remember(key, _setup_wgrad(x, dy, weight_shape, stride, padding, dilation, bias, out_dtype, plan, scalar,
                                           mma_dtype, groups))
    if call.op is None:  # an empty batch contributes nothing: the gradients are exactly zero
        problem = call.problem
        with cupy.cuda.Device(call.device):
            return (cupy.zeros(problem.w_shape, dtype=call.out_dtype),
                    cupy.zeros((problem.k,), dtype=call.out_dtype) if bias else None)
    return call.op(x, dy)


def _setup_wgrad(x, dy, weight_shape, stride, padding, dilation, bias, out_dtype, plan, scalar, mma_dtype=None,
                 groups=1) -> _Call:
    _check_array("x", x, 4)
    _check_array("dy", dy, 4)
    kk, r, s, c = _shape4("weight_shape", weight_shape, "(K, R, S, C)")
    if not isinstance(bias, (bool, np.bool_)):
        raise TypeError(f"bias must be True or False (whether to return db), got {type(bias).__name__}")
    _check_options(plan, scalar)
    n, h, wd, xc = x.shape
    groups = _groups(groups)
    _check_group_channels(c, xc, groups, "weight_shape", "x (x.shape[3])")
    problem = _problem(n, h, wd, xc, kk, r, s, stride, padding, dilation, groups)
    if dy.shape != problem.y_shape:
        raise ValueError(
            f"dy shape {dy.shape} does not match the output shape {problem.y_shape} of x {x.shape} "
            f"with weight_shape {tuple(weight_shape)}"
        )
    in_dtype = _in_dtype(("x", "dy"), x, dy)
    elem = resolve_mma_dtype(in_dtype, mma_dtype)
    out = _out_dtype(out_dtype, elem)
    device = _same_device(x=x, dy=dy)
    if n == 0:
        return _Call(problem, out, device)
    epi = Epilogue(bias=bool(bias), out_dtype=out)  # type: ignore[arg-type]
    return _prepared_call(Pass.WGRAD, problem, epi, in_dtype, device, plan, scalar, out, mma_dtype=elem)


@contextlib.contextmanager
def kernel_pinned(kernel: ConvProblem, pass_: Pass, in_dtype: str, plan: Plan) -> Iterator[None]:
    """While open, a call whose kernel is built for ``kernel`` (a grouped wgrad's packed slabs:
    group_pack) builds it with ``plan``, in a scratch cache that is dropped on exit, the
    process's kernels and calls then as they were.  Tuning times a packed wgrad's candidates
    through the layer's own call this way: a hand plan names the caller's problem as it is,
    and would run the slabs as a layer of their own, storing all of their dW rather than each
    filter's own channels (KernelSpec.pack).  The databases stay out (CONVGEN_TUNED=0, which
    also keeps tuning on first use from starting inside), and the lock is held throughout."""
    from . import config, tuning_db

    with _lock:
        saved = dict(_cache), dict(_calls)
        _cache.clear()
        _calls.clear()
        try:
            with tuning_db.pinned(kernel, pass_, in_dtype, plan), config.overridden(config.TUNED, "0"):
                yield
        finally:
            _cache.clear()
            _cache.update(saved[0])
            _calls.clear()
            _calls.update(saved[1])


def clear_cache() -> None:
    """Forget compiled kernels of this process (the disk cache is kept)."""
    with _lock:
        _cache.clear()
        _calls.clear()
        _targets.clear()
