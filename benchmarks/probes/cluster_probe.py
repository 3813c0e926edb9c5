"""Probe: `convgen bench` (or any convgen command) with every fprop plan of the TMA loop that the
planner makes (TmaWgmma, cluster 1) replaced by its twin in clusters of two
(TmaWgmma.cluster = 2: two blocks side by side along M sharing each stage's weight tile by TMA
multicast) where CLUSTER=1.  CLUSTER=0 (the default) leaves the planner alone.  It wraps
convgen.planner.plan in this process only.  Run it once per setting, with separate
CONVGEN_CACHE_DIRs and --out folders, and compare the two with scripts/bench_compare.py:

    CLUSTER=1 CONVGEN_TUNED=0 CONVGEN_CACHE_DIR=/tmp/cl python3 benchmarks/probes/cluster_probe.py \\
        bench --suite large --pass fprop --out /tmp/cl

(benchmarks/NOTES.md, forty-second session.)"""
import dataclasses
import os
import sys

from convgen.ir import Pass
from convgen.mainloop import TmaWgmma
from plan_swap import run_cli, swap_plans

CLUSTER = os.environ.get("CLUSTER", "0")
if CLUSTER not in ("0", "1"):
    sys.exit(f"cluster_probe: CLUSTER must be 0 or 1, got {CLUSTER!r}")


def swap(p, problem, pass_, target, in_dtype):
    if CLUSTER == "0" or Pass.parse(pass_) is not Pass.FPROP or not isinstance(p.loop, TmaWgmma):
        return p
    return dataclasses.replace(p, loop=dataclasses.replace(p.loop, cluster=2),
                               reasons=p.reasons + ("cluster_probe: in clusters of 2 (TMA multicast of the weights)",))


swap_plans(swap)

if __name__ == "__main__":
    run_cli()
