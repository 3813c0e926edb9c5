"""Probe: `convgen bench` (or any convgen command) with the planner's stream-K wgrad plans
(TmaWgmma(persistent=True)) changed in this process only: SK_REDUCE ("kernel" or "grid") says
where the cut tiles' parts are summed, SK_TILE ("128x128", "128x256"; empty: the planner's) the
tile, on the deepest ring that fits.  Every other plan is left alone.  Run once per setting,
with separate CONVGEN_CACHE_DIRs and --out folders, and compare with scripts/bench_compare.py:

    SK_REDUCE=kernel SK_TILE=128x128 CONVGEN_TUNED=0 CONVGEN_CACHE_DIR=/tmp/skf \\
        python3 benchmarks/probes/stream_k_forms_probe.py bench --suite large --pass wgrad --out /tmp/skf

(benchmarks/NOTES.md, forty-eighth session.)"""
import dataclasses
import os
import sys

from convgen import stream_k
from convgen.ir import Pass
from plan_swap import run_cli, swap_plans

REDUCE = os.environ.get("SK_REDUCE", "grid")
TILE = os.environ.get("SK_TILE", "")
if REDUCE not in ("kernel", "grid"):
    sys.exit(f"stream_k_forms_probe: SK_REDUCE must be kernel or grid, got {REDUCE!r}")


def swap(p, problem, pass_, target, in_dtype):
    if Pass.parse(pass_) is not Pass.WGRAD or not stream_k.applies(p, Pass.WGRAD):
        return p
    if TILE:
        bm, bn = map(int, TILE.split("x"))
        from convgen.planner import Target

        p = next(q for _, q in stream_k.offered(problem, target or Target(), in_dtype)
                 if (q.block_m, q.block_n) == (bm, bn))
    return dataclasses.replace(p, split_reduce=REDUCE)


swap_plans(swap)
run_cli()
