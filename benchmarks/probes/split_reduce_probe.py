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
from plan_swap import run_cli, swap_plans

REDUCE = os.environ.get("REDUCE", "kernel")
if REDUCE not in ("kernel", "grid"):
    sys.exit(f"split_reduce_probe: REDUCE must be 'kernel' or 'grid', got {REDUCE!r}")


def swap(p, problem, pass_, target, in_dtype):
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


swap_plans(swap)

if __name__ == "__main__":
    run_cli()
