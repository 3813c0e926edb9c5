"""`convgen tune`: time the planner's candidate plans on the live GPU, keep the fastest.

The planner's rules are a good start but cannot know a chip's cache sizes,
occupancy limits and launch costs; timing a handful of candidates per shape can.
Winners go to a tuning database keyed by GPU name and shape (the user's, under the
cache directory, written atomically), which ``convgen.conv2d`` and friends consult
before planning (:mod:`convgen.tuning_db`, the library's side: this module writes it,
the run-time path only reads it).  Databases measured on our own machines ship in
``convgen/tuning/`` and are used when the user has not tuned that shape.  Candidates
are timed by :mod:`convgen.tools.timing`, the same method as `convgen bench`.

Every candidate's output is checked against the default plan's before its time
counts, so a tuned plan can be faster but never wrong.  A candidate that fails to load or
launch (a cooperative grid the GPU cannot hold) is skipped with its reason, as tuning on
first use skips it; only the default plan's failure stops the run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
from pathlib import Path
from typing import Any, Callable

from .. import group_pack, tuning_db
from ..autotune import SWAPPED
from ..candidates import (  # noqa: F401  (re-exported: scripts and tests use tune.candidates & co.)
    MAX_SPLIT, SLICED_PER_LAYER, WGMMA_PER_LAYER, HALO_PER_LAYOUT, MULTI_TILE_SHAPES,
    _HALO_SHAPES, _NARROW_HALO_SHAPES, _SHAPES, _STACKED_DEEP_SHAPES, _WGMMA_SHAPES,
    _add_unique, _halo_candidates, _wgmma_candidates, candidates,
)
from ..fsio import atomic_write
from ..ir import ConvProblem, Pass, Target
from ..spec import Plan
from . import timing
from .cli_common import add_shape_args, layers, passes, select_layers


# ---------------------------------------------------------------------- timing
def _compile_one(args: tuple[str, str]) -> None:
    from ..compile import cached_binary

    source, arch = args
    cached_binary(source, arch=arch)


def tune_layer(problem: ConvProblem, pass_: Pass, dev: Any, target: Target, reps: int = 20,
               wgmma: bool = False, bias: bool = True, layer: ConvProblem | None = None,
               clusters: bool = False, tma_store: bool = False) -> list[dict[str, Any]]:
    """Time every candidate on random data; returns one row per candidate, fastest first
    among those whose output matches the default plan's.  ``bias``: fprop adds a bias and
    wgrad computes db beside dW (False: the same-work bench's rows, conv(x, w) and dW alone).
    ``layer``: the grouped layer whose wgrad runs as ``problem``'s slabs (group_pack): each
    candidate then runs through the layer's own call, pinned as the slabs' tuned plan, so the
    kernel timed is the one the op runs, storing each filter's own channels (KernelSpec.pack);
    a hand plan would run the slabs as a layer of their own, storing all of their dW."""
    import contextlib

    import cupy as cp
    import numpy as np

    from .. import runtime

    packed = layer is not None and pass_ is Pass.WGRAD and layer != problem
    called = layer if packed else problem
    rng = np.random.default_rng(0)
    geo: dict[str, Any] = dict(stride=called.stride, padding=called.padding, dilation=called.dilation)
    if called.groups > 1:  # w_shape is then (K, R, S, C/groups)
        geo["groups"] = called.groups

    def arr(shape):
        return cp.asarray(rng.standard_normal(shape, dtype=np.float32).astype(np.float16))

    if pass_ is Pass.FPROP:
        x, w, b = arr(problem.x_shape), arr(problem.w_shape), cp.asarray(rng.standard_normal(problem.k, dtype=np.float32))
        run = lambda p: runtime.conv2d(x, w, b if bias else None, plan=p, **geo)  # noqa: E731
    elif pass_ is Pass.DGRAD:
        dy, w = arr(problem.y_shape), arr(problem.w_shape)
        run = lambda p: runtime.conv2d_dgrad(dy, w, problem.x_shape, plan=p, **geo)  # noqa: E731
    elif not packed:
        x, dy = arr(problem.x_shape), arr(problem.y_shape)
        run = lambda p: runtime.conv2d_wgrad(x, dy, problem.w_shape, bias=bias, plan=p, **geo)[0]  # noqa: E731
    else:  # the layer's own call, no hand plan: the slabs' plan is pinned around it (``scope``)
        x, dy = arr(called.x_shape), arr(called.y_shape)
        run = lambda p: runtime.conv2d_wgrad(x, dy, called.w_shape, bias=bias, **geo)[0]  # noqa: E731

    def scope(p: Plan) -> Any:
        return runtime.kernel_pinned(problem, pass_, "float16", p) if packed else contextlib.nullcontext()

    def as_np(out):
        return cp.asnumpy(out).astype(np.float64)

    plans = candidates(problem, pass_, target, wgmma=wgmma, clusters=clusters, tma_store=tma_store)
    with scope(plans[0]):
        ref = as_np(run(plans[0]))  # the default plan: what the library runs untuned, so its failure is the caller's
    rows = []
    for p in plans:
        with scope(p):
            rows.append(_measure(p, p is plans[0], run, as_np, ref, dev, reps, runtime))
    return rows


def _measure(p: Plan, default: bool, run: Callable[[Plan], Any], as_np: Callable[[Any], Any], ref: Any,
             dev: Any, reps: int, runtime: Any) -> dict[str, Any]:
    """One candidate's row: checked against the default's output ``ref``, then timed."""
    import numpy as np

    try:
        out = as_np(run(p))
    except Exception as exc:  # noqa: BLE001 - a candidate that fails to load or launch is skipped
        # (a grid-reduce twin whose cooperative grid this GPU cannot hold, a kernel the driver
        # refuses): the rest of the layer's candidates, and the rest of the layers, still run
        return {"plan": p.as_dict(), "us": math.inf, "ok": False, "err": None, "spill_bytes": 0,
                "default": False, "skipped": f"{type(exc).__name__}: {exc}"}
    kernels = runtime.kernels_for(p)
    if not kernels and not default:  # a pinned grid-reduce plan the runtime swapped for its twin
        return {"plan": p.as_dict(), "us": math.inf, "ok": False, "err": None, "spill_bytes": 0,
                "default": False, "skipped": SWAPPED}
    err = float(np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-30))
    # A kernel that spills registers to local memory is not shipped, even when it
    # times well: its speed then hangs on the spill traffic staying in L1.
    spill = max((k.local_bytes for k in kernels), default=0)
    ok = bool(np.isfinite(out).all() and err < 1e-2)
    us = timing.median_gpu_us(dev, lambda: run(p), reps) if ok and (spill == 0 or default) else math.inf
    return {"plan": p.as_dict(), "us": us, "ok": ok, "err": err, "spill_bytes": spill, "default": default}


def tune_and_record(work: list[tuple[Any, Pass]], measure: Callable[[ConvProblem, Pass], list[dict[str, Any]]],
                    target: Target, gpu_name: str, db: Path, log_path: str | None,
                    bias: bool) -> dict[str, dict[str, Any]]:
    """Measure each (layer, pass) of ``work`` and keep its fastest plan in the database ``db``.
    The database and the log are written after every layer, so a long run that is stopped (a
    time limit, Ctrl-C) keeps what it has measured, and a second run merges into it."""
    entries, log = {}, []
    print(f"{'layer':14s} {'pass':5s} {'planned us':>10s} {'tuned us':>9s} {'gain':>6s}  best plan")
    for layer, pass_ in work:
        rows = measure(layer.problem, pass_)
        default = next(r for r in rows if r["default"])
        best = min(rows, key=lambda r: r["us"])
        bad = [r for r in rows if not r["ok"] and not r.get("skipped")]
        for r in rows:
            if r.get("skipped"):
                print(f"  (skipped a candidate of {layer.name} {pass_.value}, "
                      f"{Plan.from_dict(r['plan'], layer.problem, pass_).brief()}: {r['skipped']})", file=sys.stderr)
        if bad:
            print(f"  WARNING: {len(bad)} candidate(s) of {layer.name} {pass_.value} disagree with the default plan: "
                  + "; ".join(f"{r['plan']} err {r['err']:.3g}" for r in bad), file=sys.stderr)
        spilled = [r for r in rows if r["spill_bytes"] and not r["default"]]
        if spilled:
            print(f"  ({len(spilled)} candidate(s) of {layer.name} {pass_.value} spill registers and were not timed)",
                  file=sys.stderr)
        key = tuning_db.tune_key(layer.problem.geometry, pass_, "float16", target.arch)
        with_bias = bias and pass_ is not Pass.DGRAD
        entries[key] = {"plan": best["plan"], "us": best["us"], "default_us": default["us"],
                        "default_plan": default["plan"], "shape": layer.problem.as_dict(), "pass": pass_.value,
                        "bias": with_bias}
        log.append({"layer": layer.name, "pass": pass_.value, "problem": layer.problem.as_dict(),
                    "bias": with_bias, "rows": rows})
        print(f"{layer.name:14s} {pass_.value:5s} {default['us']:10.1f} {best['us']:9.1f} {default['us'] / best['us']:6.2f}  "
              f"{Plan.from_dict(best['plan'], layer.problem, pass_).brief()}", flush=True)
        tuning_db.record(db, gpu_name, {key: entries[key]})
        if log_path:
            atomic_write(log_path, json.dumps({"gpu": gpu_name, "layers": log}, indent=1, default=str))
    return entries


def add_parser(sub: Any) -> None:
    p = sub.add_parser("tune", help="time candidate plans on this GPU and store the fastest",
                       conflict_handler="resolve")
    add_shape_args(p)
    p.add_argument("--pass", dest="pass_", default="all", choices=("fprop", "dgrad", "wgrad", "all"))
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--db", help="tuning database to update (default: the user's, under the cache dir)")
    p.add_argument("--log", help="also write every candidate's timing to this JSON file")
    p.add_argument("--layers", help="only these layer names of --suite (comma-separated)")
    p.add_argument("--no-bias", action="store_true",
                   help="time fprop without a bias and wgrad without db, as the bench's same-work rows do "
                        "(convolutions that feed a BatchNorm have no bias); by default both are timed with it")
    p.add_argument("--wgmma", action="store_true",
                   help="also time warpgroup-MMA plans (sm_90; slower than the WMMA plans so far)")
    p.add_argument("--clusters", action="store_true",
                   help="also time the TMA plans in thread-block clusters of two (fprop, stride-1 dgrad; sm_90; not yet "
                        "run on a GPU)")
    p.add_argument("--tma-store", action="store_true",
                   help="also time the TMA plans that store their output through the copy engine (fprop, stride-1 "
                        "dgrad; sm_90; not yet run on a GPU)")
    p.set_defaults(func=cmd_tune)


def cmd_tune(args: argparse.Namespace) -> int:
    from ..compile import DeviceError, detect_target
    from ..emit import emit
    from ..ir import Epilogue
    from ..planner import make_spec

    # The arguments first: no arguments, an unknown suite or a partial shape is a usage
    # error (exit 2) whether or not this machine has a GPU.
    work = [(layer, pass_) for layer in select_layers(layers(args), args.layers) for pass_ in passes(args)]
    try:
        import cupy as cp

        target = detect_target()
        gpu_name = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["name"].decode()
    except (ImportError, DeviceError) as exc:
        print(f"convgen tune: no usable CUDA GPU ({exc})", file=sys.stderr)
        return 1
    from concurrent.futures import ProcessPoolExecutor
    import multiprocessing

    # A grouped layer's kernel runs its groups packed into slabs where group_pack's rule says
    # so (the op copies its weights around it): that kernel's problem is what is tuned and stored;
    # a wgrad's candidates run through the layer's own call (tune_layer's ``layer``).
    # (Two layers whose slabs are one shape, G = 32 and 16 packed 8 and 4 to a slab, would run
    # different kernels: those time the slabs as a layer, as tuning on first use does.)
    called: dict[tuple[Any, Pass], ConvProblem | None] = {}
    for i, (layer, pass_) in enumerate(work):
        kernel = group_pack.kernel_problem(layer.problem, pass_, "float16", target)
        key = (kernel.geometry, pass_)
        called[key] = layer.problem if called.get(key, layer.problem) == layer.problem else None
        work[i] = (dataclasses.replace(layer, problem=kernel), pass_)
    # Compile every candidate in parallel first (NVRTC is single-threaded per program).
    sources = []
    for layer, pass_ in work:
        epi = Epilogue(bias=pass_ is not Pass.DGRAD and not args.no_bias)
        whole = called.get((layer.problem.geometry, pass_))  # its kernel then stores each filter's own channels
        pack = whole.groups // layer.problem.groups if whole is not None and pass_ is Pass.WGRAD else 1
        for p in candidates(layer.problem, pass_, target, wgmma=args.wgmma, clusters=args.clusters,
                            tma_store=args.tma_store):
            src = emit(make_spec(layer.problem, pass_, target=target, epilogue=epi, plan_=p, pack=pack))
            sources.append((src.source, src.compile_arch))
    with ProcessPoolExecutor(max_workers=os.cpu_count(), mp_context=multiprocessing.get_context("spawn")) as pool:
        list(pool.map(_compile_one, sources, chunksize=4))
    dev = timing.CudaDevice(cp, cp.cuda.get_current_stream())
    bias = not args.no_bias
    measure = lambda problem, pass_: tune_layer(problem, pass_, dev, target, args.reps,  # noqa: E731
                                                wgmma=args.wgmma, bias=bias, layer=called.get((problem.geometry, pass_)),
                                                clusters=args.clusters, tma_store=args.tma_store)
    path = Path(args.db) if args.db else tuning_db.user_db_path()
    entries = tune_and_record(work, measure, target, gpu_name, path, args.log, bias)
    print(f"wrote {len(entries)} tuned plans for {gpu_name} to {path}")
    return 0
