"""Probe: `convgen bench` (or any convgen command) with every split-K plan the planner makes
summing its slices where REDUCE says: "kernel" (the reduction kernel, a second launch) or
"grid" (the main kernel's last phase after a grid-wide barrier, one cooperative launch),
whatever the planner's rule (small_layer_rules.grid_reduce, since the thirty-first session)
chose.  It wraps convgen.planner.plan in this process only; a plan the grid
reduction does not apply to (fprop, dgrad, grouped layers) is left as planned.  Run it once
per REDUCE, with separate CONVGEN_CACHE_DIRs and --out folders, then compare the two with
scripts/bench_compare.py (GPU time, eager time and host cost per call all move: one launch
fewer a call):

    REDUCE=grid CONVGEN_TUNED=0 CONVGEN_CACHE_DIR=/tmp/grid python3 benchmarks/probes/split_reduce_probe.py \\
        bench --suite cifar-resnet --pass wgrad --out /tmp/grid

(benchmarks/NOTES.md, thirtieth session.)"""
import dataclasses
import os
import sys

import convgen.planner as planner

REDUCE = os.environ.get("REDUCE", "kernel")
if REDUCE not in ("kernel", "grid"):
    sys.exit(f"split_reduce_probe: REDUCE must be 'kernel' or 'grid', got {REDUCE!r}")
_plan = planner.plan


def plan(problem, pass_, target=None, in_dtype="float16", **kw):
    p = _plan(problem, pass_, target, in_dtype, **kw)
    if p.split_k == 1:
        return p
    if REDUCE == "kernel":  # the planner's rule sums long splits in the kernel (thirty-first session)
        return dataclasses.replace(p, split_reduce="kernel")
    q = dataclasses.replace(p, split_reduce="grid", reasons=p.reasons + ("split-K summed in the main kernel (probe)",))
    try:
        planner.check_plan(q, problem, pass_, target or planner.Target(), in_dtype)
    except ValueError:
        return p
    return q


planner.plan = plan

if __name__ == "__main__":
    from convgen.cli import main

    sys.exit(main(sys.argv[1:]))
