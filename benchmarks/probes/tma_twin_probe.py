"""Probe: `convgen bench` (or any convgen command) with every fprop and dgrad plan of the TMA loop
that the planner makes (TmaWgmma) replaced by one of its twins that have not yet run as defaults:
TWIN=cluster, in thread-block clusters of two (TmaWgmma.cluster = 2: two blocks side by side
along M share each stage's weight tile by TMA multicast; forty-second session); TWIN=store,
storing y through the copy engine (TmaWgmma.tma_store: a warp's drained strips; forty-third
session); TWIN=none (the default) leaves the planner alone.  It wraps convgen.planner.plan in
this process only (clusters and stores run in fprop and stride-1 dgrad: a strided dgrad keeps
its plan).  Run it once per setting, with separate CONVGEN_CACHE_DIRs and --out
folders, and compare them with scripts/bench_compare.py:

    TWIN=cluster CONVGEN_TUNED=0 CONVGEN_CACHE_DIR=/tmp/cl python3 benchmarks/probes/tma_twin_probe.py \\
        bench --suite large --pass fprop --out /tmp/cl

(benchmarks/NOTES.md, forty-second and forty-third sessions.)  A twin the planner's checks
refuse (a persistent ring too deep for the store's strips, a strided dgrad) is left as the planner made it,
and the probe says so on stderr."""
import dataclasses
import os
import sys

from convgen.ir import Pass, Target
from convgen.mainloop import TmaWgmma
from convgen.planner import check_plan
from plan_swap import run_cli, swap_plans

TWINS = {"none": {}, "cluster": {"cluster": 2}, "store": {"tma_store": True}}
TWIN = os.environ.get("TWIN", "none")
if TWIN not in TWINS:
    sys.exit(f"tma_twin_probe: TWIN must be one of {sorted(TWINS)}, got {TWIN!r}")


def swap(p, problem, pass_, target, in_dtype):
    if not TWINS[TWIN] or Pass.parse(pass_) is Pass.WGRAD or not isinstance(p.loop, TmaWgmma):
        return p
    q = dataclasses.replace(p, loop=dataclasses.replace(p.loop, **TWINS[TWIN]),
                            reasons=p.reasons + (f"tma_twin_probe: the {TWIN} twin",))
    try:
        check_plan(q, problem.geometry, pass_, target or Target(), in_dtype)
    except ValueError as exc:
        print(f"tma_twin_probe: {problem.describe()} keeps its plan: {exc}", file=sys.stderr)
        return p
    return q


swap_plans(swap)

if __name__ == "__main__":
    run_cli()
