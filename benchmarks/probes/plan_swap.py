"""What the plan-swapping probes share (tma_twin_probe, split_reduce_probe, stream_k_probe): any
convgen command run with convgen.planner.plan wrapped in this process only, so every plan the
planner makes passes through the probe's ``swap(plan, problem, pass_, target, in_dtype)``."""
import sys

import convgen.planner as planner


def swap_plans(swap):
    planned = planner.plan

    def plan(problem, pass_, target=None, in_dtype="float16", **kw):
        return swap(planned(problem, pass_, target, in_dtype, **kw), problem, pass_, target, in_dtype)

    planner.plan = plan


def run_cli():
    from convgen.cli import main

    sys.exit(main(sys.argv[1:]))
