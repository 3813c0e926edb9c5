"""Tuning on first use, opt-in like ``torch.backends.cudnn.benchmark``.

With ``convgen.set_autotune(True)`` (or ``CONVGEN_AUTOTUNE=1``), the first call of a shape
and pass that no tuning database covers times the planner's default plan and the next
few candidates (:func:`convgen.candidates.candidates`) on fresh random data, keeps the
fastest whose output matches the default's, and records it in the user's tuning
database, so this process and every later one run that plan (read back through
:func:`convgen.tuning_db.tuned_plan`).  `convgen tune` does the same for whole suites,
more thoroughly; this module is its quick, bounded run-time twin and imports no tool.

Bounded: candidates compile in parallel on threads (warming the disk cache), and
once :data:`BUDGET_S` has passed for the shape, candidates still compiling or not yet
timed are skipped; the default plan is always measured.  A candidate that fails to
compile, uses local memory (register spills) or disagrees with the default is skipped
with its reason logged on the ``convgen.autotune`` logger.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from . import config, tuning_db
from .candidates import candidates
from .ir import ConvProblem, Epilogue, Pass, Target
from .spec import Plan

log = logging.getLogger("convgen.autotune")

CANDIDATES = 8  # the default plan and the next seven candidates
BUDGET_S = 3.0  # per shape and pass: past it, no new candidate is checked
# Timed launches per candidate (median), taken in turns (A B C A B C ...) so that clock drift falls
# on all alike, each behind an L2 flush, as `convgen tune` and `convgen bench` time them.  With 5
# launches a candidate in a row and L2 warm, tuning on first use chose plans that the bench then
# timed up to 1.25x slower than the planner's (MobileNetV2's pw28-144to32 fprop, H100,
# benchmarks/NOTES.md, forty-seventh session): a layer whose input fits L2 rewards, warm, the
# tiles that read it most often.  A round of 8 costs a few milliseconds.
REPS = 11
MAX_ERR = 1e-2  # norm-relative error against the default plan's output, as `convgen tune`
SPIN_US = 200.0  # GPU spin before each timed launch: the host's launch cost stays out of the time
L2_FLUSH_FACTOR = 2  # the flush writes this many times the GPU's L2 cache
# Why a candidate that ran is not timed: the runtime built another plan in its place
SWAPPED = ("the runtime ran another plan in its place (a cooperative grid this GPU cannot hold falls back to the "
           "reduction kernel)")

_override: Optional[bool] = None


def set_autotune(enabled: Optional[bool]) -> None:
    """Turn tuning on first use on or off for this process (None: follow CONVGEN_AUTOTUNE)."""
    global _override
    if enabled is not None and not isinstance(enabled, bool):
        raise TypeError(f"enabled must be True, False or None, got {enabled!r}")
    _override = enabled


def enabled() -> bool:
    """Whether a call should tune an untuned shape: set_autotune's choice, else CONVGEN_AUTOTUNE.
    CONVGEN_TUNED=0 (plan only) turns it off too: it asks for the planner's plans."""
    on = config.AUTOTUNE.enabled() if _override is None else _override
    return on and config.TUNED.enabled()


@dataclass(frozen=True)
class Measured:
    """One candidate's outcome: its time (inf if not timed), its error against the default
    plan's output, and why it was not timed (None if it was)."""

    plan: Plan
    us: float = math.inf
    err: float = 0.0
    skip: Optional[str] = None


def select(rows: Sequence[Measured], max_err: float = MAX_ERR) -> tuple[Measured, list[tuple[Plan, str]]]:
    """The winner among measured rows (rows[0] is the default plan, the reference the others
    were checked against) and each skipped candidate with its reason.  The default plan
    wins unless a candidate that matches it is faster."""
    if not rows or rows[0].skip is not None or not math.isfinite(rows[0].us):
        raise ValueError("the default plan was not measured: nothing to compare the candidates with")
    best, skipped = rows[0], []
    for r in rows[1:]:
        reason = r.skip
        if reason is None and not math.isfinite(r.err):
            reason = "output not finite (unwritten elements?)"
        elif reason is None and r.err > max_err:
            reason = f"disagrees with the default plan: relative error {r.err:.3g} > {max_err:g}"
        elif reason is None and not math.isfinite(r.us):
            reason = "not timed"
        if reason is not None:
            skipped.append((r.plan, reason))
        elif r.us < best.us:
            best = r
    return best, skipped


# ------------------------------------------------------------------------ the GPU side
def _compile_all(sources: list[Optional[tuple[str, str]]], deadline: float) -> list[Optional[str]]:
    """Compile in parallel (:func:`convgen.compile.compile_async`: threads, each warming the
    memory and disk caches); None per source that compiled, else why not.  A source still
    compiling at the deadline reads as skipped (its compile runs on and still warms the
    cache); the default plan's (index 0) is always waited for, since the call needs it."""
    from concurrent.futures import TimeoutError as FutureTimeout

    from .compile import compile_async

    out: list[Optional[str]] = [None if s is not None else "could not be emitted" for s in sources]
    jobs = [(i, s) for i, s in enumerate(sources) if s is not None]
    for (i, _), fut in zip(jobs, compile_async([s for _, s in jobs])):
        try:
            fut.result(None if i == 0 else max(0.0, deadline - time.perf_counter()))
        except FutureTimeout:  # (the builtin TimeoutError since 3.11, its own class on 3.10)
            out[i] = "still compiling when the tuning budget ran out"
        except Exception as exc:  # noqa: BLE001 - any compile failure skips the candidate
            out[i] = f"compile failed: {type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"
    return out


def _runner(problem: ConvProblem, pass_: Pass, epilogue: Epilogue, in_dtype: str,
            hand_plan: bool = True) -> Callable[[Plan], Any]:
    """A call of this pass on fresh random data (the dtype the first call had), per plan;
    without ``hand_plan`` the call names no plan (a packed wgrad's layer, whose slabs' plan
    is pinned around it: runtime.kernel_pinned)."""
    import cupy as cp
    import numpy as np

    from . import runtime

    rng = np.random.default_rng()
    dt = np.float16 if in_dtype == "float16" else np.float32

    def arr(shape):
        return cp.asarray(rng.standard_normal(shape, dtype=np.float32).astype(dt))

    geo = dict(stride=problem.stride, padding=problem.padding, dilation=problem.dilation,
               groups=problem.groups, out_dtype=epilogue.out_dtype)
    if pass_ is Pass.FPROP:
        x, w = arr(problem.x_shape), arr(problem.w_shape)
        b = cp.asarray(rng.standard_normal(problem.k).astype(epilogue.bias_dtype)) if epilogue.bias else None
        act = "relu" if epilogue.relu else None
        return lambda p: runtime.conv2d(x, w, b, activation=act, plan=p, **geo)
    if pass_ is Pass.DGRAD:
        dy, w = arr(problem.y_shape), arr(problem.w_shape)
        return lambda p: runtime.conv2d_dgrad(dy, w, problem.x_shape, plan=p, **geo)
    x, dy = arr(problem.x_shape), arr(problem.y_shape)
    return lambda p: runtime.conv2d_wgrad(x, dy, problem.w_shape, bias=epilogue.bias, plan=p if hand_plan else None,
                                          **geo)


def _as_host(out: Any):
    import cupy as cp
    import numpy as np

    outs = out if isinstance(out, tuple) else (out,)
    return [cp.asnumpy(o).astype(np.float64) for o in outs if o is not None]


def _rel_err(out: list, ref: list) -> float:
    import numpy as np

    num = math.sqrt(sum(float(np.sum((o - r) ** 2)) for o, r in zip(out, ref)))
    den = math.sqrt(sum(float(np.sum(r ** 2)) for r in ref))
    return num / max(den, 1e-30) if all(np.isfinite(o).all() for o in out) else math.inf


_SPIN_SRC = r"""
extern "C" __global__ void convgen_autotune_spin(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) { }
}
"""


def _gpu_times(fns: Sequence[Callable[[], Any]], reps: int) -> list[float]:
    """Median GPU time (us) of each of `fns` by CUDA events, in turns (rep by rep, every fn),
    each launch behind a short spin kernel, so the events bracket the kernel alone and not the
    host's launch cost, and an L2 flush, so it reads its inputs from DRAM."""
    import cupy as cp

    spin = cp.RawKernel(_SPIN_SRC, "convgen_autotune_spin")
    device = cp.cuda.Device()
    try:  # the spin's length only needs to outlast a launch's host cost: the rated clock will do
        clock_khz = cp.cuda.runtime.deviceGetAttribute(cp.cuda.runtime.cudaDevAttrClockRate, device.id)
        l2_bytes = cp.cuda.runtime.deviceGetAttribute(cp.cuda.runtime.cudaDevAttrL2CacheSize, device.id)
    except Exception:  # noqa: BLE001 - an attribute a driver no longer reports
        clock_khz, l2_bytes = 2_000_000, 64 << 20
    cycles = cp.int64(int(SPIN_US * max(clock_khz, 1_000_000) / 1000))
    try:
        flush = cp.empty(L2_FLUSH_FACTOR * max(l2_bytes, 1 << 20), dtype=cp.uint8)
    except cp.cuda.memory.OutOfMemoryError:  # a full GPU: time with L2 as the candidates leave it, and say so
        log.warning("autotune: no memory for the L2 flush (%d bytes); timing without it", L2_FLUSH_FACTOR * l2_bytes)
        flush = None
    events = [[(cp.cuda.Event(), cp.cuda.Event()) for _ in range(reps)] for _ in fns]
    cp.cuda.get_current_stream().synchronize()
    for rep in range(reps):
        for fn, pairs in zip(fns, events):
            spin((1,), (1,), (cycles,))
            if flush is not None:
                flush.fill(0)
            pairs[rep][0].record()
            fn()
            pairs[rep][1].record()
    events[-1][-1][1].synchronize()
    return [statistics.median(cp.cuda.get_elapsed_time(a, b) * 1000.0 for a, b in pairs) for pairs in events]


def _capturing() -> bool:
    import cupy as cp

    return bool(cp.cuda.get_current_stream().is_capturing())


def tune(problem: ConvProblem, pass_: Pass, epilogue: Epilogue, in_dtype: str, target: Target,
         gpu_name: str, layer: Optional[ConvProblem] = None) -> Optional[Plan]:
    """Tune this shape and pass now, record the winner in the user's database and return it
    as a later process reads it back; None (the planner's plan is then used) if even the
    default plan could not be measured.  Called by runtime._kernel under its lock.
    ``layer``: the grouped layer whose wgrad runs as ``problem``'s packed slabs: each candidate
    then runs through the layer's own call, pinned as the slabs' plan, so what is timed is the
    kernel the op runs (it stores each filter's own channels, KernelSpec.pack), not the slabs
    run as a layer of their own."""
    import contextlib

    from . import runtime
    from .emit import emit
    from .planner import make_spec

    what = f"{pass_.value} {problem.describe()}"
    # Depthwise variations were timed before this tuned them: fprop and dgrad on the H200
    # (mobilenetv2-dw, convnext-dw: their first 8 gain up to 1.40x over the planner's plan), wgrad
    # on an H100 (mobilenetv2-dw: 1.03x a layer, up to 1.09x; benchmarks/NOTES.md).
    if _capturing():  # tuning synchronises: not inside a graph capture
        log.info("autotune %s: not tuned, the stream is capturing a CUDA graph; using the planner's plan", what)
        return None
    t0 = time.perf_counter()
    deadline = t0 + BUDGET_S
    plans = candidates(problem, pass_, target, in_dtype)[:CANDIDATES]
    log.info("tuning %s: %d candidate plans, budget %.1f s", what, len(plans), BUDGET_S)
    pack = layer.groups // problem.groups if layer is not None and pass_ is Pass.WGRAD else 1
    sources: list[Optional[tuple[str, str]]] = []
    for p in plans:
        try:
            src = emit(make_spec(problem, pass_, target=target, epilogue=epilogue, in_dtype=in_dtype, plan_=p,
                                 pack=pack))
            sources.append((src.source, src.compile_arch))
        except Exception as exc:  # noqa: BLE001 - a candidate the emitter refuses is skipped
            log.warning("autotune %s: candidate %s skipped: could not be emitted (%s)", what, p.brief(), exc)
            sources.append(None)
    compiled = _compile_all(sources, deadline)
    if pack > 1:
        run = _runner(layer, pass_, epilogue, in_dtype, hand_plan=False)
        scope = lambda p: runtime.kernel_pinned(problem, pass_, in_dtype, p)  # noqa: E731
    else:
        run = _runner(problem, pass_, epilogue, in_dtype)
        scope = lambda p: contextlib.nullcontext()  # noqa: E731
    rows: list[Measured] = []
    ref: list = []
    for i, (p, failed) in enumerate(zip(plans, compiled)):  # each run once: loaded, checked
        if i and time.perf_counter() > deadline:
            failed = failed or "not timed: the tuning budget ran out"
        if failed:
            rows.append(Measured(p, skip=failed))
            continue
        try:
            with scope(p):
                out = _as_host(run(p))  # compiles (or loads from the warm disk cache) and runs once
                kernels = runtime.kernels_for(p)
                if i and not kernels:  # a pinned grid-reduce plan the runtime swapped for its twin
                    rows.append(Measured(p, skip=SWAPPED))
                    continue
                spill = max((k.local_bytes for k in kernels), default=0)
                if i and spill:
                    rows.append(Measured(p, skip=f"uses {spill} bytes of local memory per thread (register spills)"))
                    continue
                if i == 0:
                    ref = out
            rows.append(Measured(p, err=_rel_err(out, ref)))
        except Exception as exc:  # noqa: BLE001 - a candidate that fails to load or launch is skipped
            if i == 0:
                log.warning("autotune %s: the default plan failed (%s); using the planner's plan untuned", what, exc)
                return None
            rows.append(Measured(p, skip=f"failed to load or run: {exc}"))
    timed = [i for i, r in enumerate(rows) if r.skip is None and math.isfinite(r.err) and r.err <= MAX_ERR]

    def call(p: Plan) -> Callable[[], Any]:
        def once() -> Any:
            with scope(p):
                return run(p)
        return once

    try:  # then timed in turns
        for i, us in zip(timed, _gpu_times([call(rows[i].plan) for i in timed], REPS)):
            rows[i] = Measured(rows[i].plan, us, rows[i].err)
    except Exception as exc:  # noqa: BLE001 - a launch that fails only when timed leaves the planner's plan
        log.warning("autotune %s: timing failed (%s); using the planner's plan untuned", what, exc)
        return None
    try:
        best, skipped = select(rows)
    except ValueError as exc:  # the default failed to compile or gave no finite output
        log.warning("autotune %s: %s (%s); using the planner's plan untuned", what, exc, rows[0].skip or "not finite")
        return None
    for p, reason in skipped:
        log.info("autotune %s: candidate %s skipped: %s", what, p.brief(), reason)
    default = rows[0]
    key = tuning_db.tune_key(problem.geometry, pass_, in_dtype, target.arch)
    try:
        tuning_db.record(tuning_db.user_db_path(), gpu_name, {key: {
            "plan": best.plan.as_dict(), "us": best.us, "default_us": default.us,
            "default_plan": default.plan.as_dict(), "shape": problem.as_dict(), "pass": pass_.value}})
    except OSError as exc:  # a read-only cache costs the next process a re-tune, not this call
        log.warning("autotune %s: could not record the winner in %s (%s); it is used in this process only",
                    what, tuning_db.user_db_path(), exc)
        return best.plan
    log.info("tuned %s in %.1f s: %s, %.1f us (default %.1f us; %d of %d candidates timed)", what,
             time.perf_counter() - t0, best.plan.brief(), best.us, default.us, len(timed), len(rows))
    return tuning_db.lookup(gpu_name, problem.geometry, pass_, in_dtype, target.arch, batch=problem.n,
                            default=lambda: default.plan)
