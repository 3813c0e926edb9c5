"""Probe: `convgen bench` (or any convgen command) with every depthwise wgrad plan that sums
its slices in the grid sized as before the forty-sixth session: RESIDENCY=old takes the split-K
kernels' general register bound (reduction.GRID_REDUCE_REGS, 128 a thread: 2 blocks of 256 an
SM), RESIDENCY=new (the default) leaves the planner's (depthwise_wgrad.DW_WGRAD_REGS, 80: 3
blocks).  It wraps convgen.planner.plan in this process only.  Run it once per setting, with
separate CONVGEN_CACHE_DIRs and --out folders, and compare them with scripts/bench_compare.py:

    RESIDENCY=old CONVGEN_TUNED=0 CONVGEN_CACHE_DIR=/tmp/old python3 benchmarks/probes/dw_wgrad_residency_probe.py \\
        bench --suite convnext-dw --pass wgrad --out /tmp/old

(benchmarks/NOTES.md, forty-sixth session.)"""
import dataclasses
import math
import os
import sys

from convgen.depthwise import smem_bytes
from convgen.ir import Pass, Target
from convgen.mainloop import Depthwise
from convgen.reduction import GRID_REDUCE_REGS, resident_split
from plan_swap import run_cli, swap_plans

RESIDENCY = os.environ.get("RESIDENCY", "new")
if RESIDENCY not in ("old", "new"):
    sys.exit(f"dw_wgrad_residency_probe: RESIDENCY must be 'old' or 'new', got {RESIDENCY!r}")


def swap(p, problem, pass_, target, in_dtype):
    if RESIDENCY == "new" or Pass(pass_) is not Pass.WGRAD or not isinstance(p.loop, Depthwise) or p.split_reduce != "grid":
        return p
    target = target or Target()
    whole = resident_split(target.sm_count, target.smem_limit, smem_bytes(p, problem, Pass.WGRAD, target.warp_size),
                           p.warps_m * target.warp_size, math.ceil(problem.c / p.block_n), regs=GRID_REDUCE_REGS)
    if whole >= p.split_k:
        return p
    return dataclasses.replace(p, split_k=whole, split_reduce="grid" if whole > 1 else "kernel",
                               reasons=p.reasons + (f"{whole} slices: the grid sized at {GRID_REDUCE_REGS} registers a "
                                                    "thread (probe)",))


swap_plans(swap)

if __name__ == "__main__":
    run_cli()
