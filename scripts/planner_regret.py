"""Where today's planner sits furthest from what tuning runs measured: for every layer of the
committed `convgen tune --log` files, the time of the plan the planner picks today over the
fastest candidate's, worst first, so that a session looking for a rule starts from the largest
misses rather than from the layers it happens to remember.

    python3 scripts/planner_regret.py                       # every log under benchmarks/results/tuning
    python3 scripts/planner_regret.py --pass wgrad --top 20 LOG.json ...

A layer whose default plan no log timed is counted apart ("untimed"): the planner moved it since
the run, and only a new tuning run can say how far it is.  The planner is asked for the sm_90
part the logs were taken on (132 SMs), without the tuning databases (CONVGEN_TUNED=0)."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path
from typing import Any, Iterable, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from convgen.ir import ConvProblem, Pass, Target  # noqa: E402
from convgen.planner import plan  # noqa: E402

TUNING = ROOT / "benchmarks" / "results" / "tuning"
SM90 = Target("sm_90", 132)


def plan_key(p: dict[str, Any]) -> tuple:
    """A plan as the logs record it, less what the input dtype decides (read_a, read_b)."""
    return tuple(sorted((k, v) for k, v in p.items() if k not in ("read_a", "read_b", "reasons")))


def regrets(logs: Iterable[Path], pass_: Optional[str] = None) -> tuple[list[tuple[float, str, str, str, float, float]],
                                                                       list[tuple[str, str, str]]]:
    """((today's time / best, log, layer, pass, today's us, best us) worst first, [(log, layer,
    pass) whose default no log row timed])."""
    timed, untimed = [], []
    for path in logs:
        data = json.loads(path.read_text())
        for layer in data.get("layers", []):
            if pass_ and layer["pass"] != pass_:
                continue
            rows = [r for r in layer["rows"] if r.get("ok") and r.get("us") is not None and math.isfinite(r["us"])]
            if len(rows) < 2:
                continue
            today = plan_key(plan(ConvProblem(**layer["problem"]), Pass(layer["pass"]), SM90).as_dict())
            mine = [r["us"] for r in rows if plan_key(r["plan"]) == today]
            best = min(r["us"] for r in rows)
            if mine:
                timed.append((min(mine) / best, path.name, layer["layer"], layer["pass"], min(mine), best))
            else:
                untimed.append((path.name, layer["layer"], layer["pass"]))
    timed.sort(key=lambda t: -t[0])
    return timed, untimed


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("logs", nargs="*", type=Path, help="tuning logs (default: every one under benchmarks/results/tuning)")
    ap.add_argument("--pass", dest="pass_", choices=[p.value for p in Pass])
    ap.add_argument("--top", type=int, default=40, help="rows to print (default 40)")
    args = ap.parse_args(argv)
    os.environ["CONVGEN_TUNED"] = "0"
    logs = args.logs or sorted(p for p in TUNING.glob("*.json") if p.name.startswith("nvidia-"))
    timed, untimed = regrets(logs, args.pass_)
    for ratio, log, layer, p, mine, best in timed[:args.top]:
        print(f"{ratio:5.2f}x  {layer:<22} {p:<5}  today {mine:8.1f} us, best {best:8.1f} us  ({log})")
    over = sum(t[0] > 1.10 for t in timed)
    print(f"{len(timed)} layers timed at today's default, {over} over 1.10x the best; {len(untimed)} untimed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
