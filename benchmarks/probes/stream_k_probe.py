"""Probe: `convgen bench` (or any convgen command) with every dense TMA wgrad plan the planner
makes replaced by a stream-K one (TmaWgmma(persistent=True) in wgrad) where STREAMK=1: the
candidate `convgen tune` offers first for the layer (the tile its cost model,
tma_rules.tma_stream_k_cost, predicts fastest, on the deepest ring that fits).  STREAMK=0 (the
default) leaves the planner alone.  It wraps convgen.planner.plan in this process only.  Run
it once per setting, with separate CONVGEN_CACHE_DIRs and --out folders, and compare the two
with scripts/bench_compare.py:

    STREAMK=1 CONVGEN_TUNED=0 CONVGEN_CACHE_DIR=/tmp/sk python3 benchmarks/probes/stream_k_probe.py \\
        bench --suite large --pass wgrad --out /tmp/sk

(benchmarks/NOTES.md, thirty-third session.)"""
import os
import sys

import convgen.planner as planner
from convgen.ir import Pass
from plan_swap import run_cli, swap_plans

STREAMK = os.environ.get("STREAMK", "0")
if STREAMK not in ("0", "1"):
    sys.exit(f"stream_k_probe: STREAMK must be 0 or 1, got {STREAMK!r}")


def swap(p, problem, pass_, target, in_dtype):
    if STREAMK == "0" or Pass.parse(pass_) is not Pass.WGRAD or not p.tma or problem.groups > 1:
        return p
    from convgen.candidates import _stream_k_candidates

    offered = _stream_k_candidates(problem, Pass.WGRAD, target or planner.Target(), in_dtype, set())
    return offered[0] if offered else p


swap_plans(swap)

if __name__ == "__main__":
    run_cli()
