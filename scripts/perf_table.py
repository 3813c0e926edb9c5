#!/usr/bin/env python3
"""README's performance table, printed from `convgen bench` results (JSON), so that the table
quotes what the runs measured rather than figures copied by hand.

    python3 scripts/perf_table.py benchmarks/results/nvidia-h100_2026-12-07_*.json

Only results whose every row ran the plans ``--plans`` names count (default: the planner's, as
the device script's `CONVGEN_TUNED=0` runs record them); of several of one suite, the newest
(its timestamp) wins.  A row gives
the geometric-mean speedup over cuDNN (above 1: convgen faster) of GPU time and of eager time
per pass, and GPU time over the rows where cuDNN runs below 300 TFLOP/s (latency- or
memory-bound: issue 16's rows), with their count.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

PASSES = ("fprop", "dgrad", "wgrad")


def _three(speedups: dict) -> str:
    return " / ".join("-" if speedups.get(p) is None else f"{speedups[p]:.2f}" for p in PASSES)


def _ran(suite: dict, plans: str) -> bool:
    """Whether every row of ``suite`` ran plans of that source (a run that did not record it: no)."""
    return all(row["convgen"].get("plan_source") == plans for row in suite["rows"])


def rows(paths: list[Path], plans: str = "planner") -> list[str]:
    """One markdown row per suite: suite and commit, GPU time, eager time, latency-bound rows."""
    newest: dict[str, tuple[str, dict, dict]] = {}
    for path in paths:
        result = json.loads(path.read_text())
        for suite in result["suites"]:
            if _ran(suite, plans) and (suite["name"] not in newest or result["timestamp"] > newest[suite["name"]][0]):
                newest[suite["name"]] = (result["timestamp"], result, suite)
    out = []
    for name in sorted(newest):
        _, result, suite = newest[name]
        summary = suite["summary"]
        bound = summary["by_regime"]["latency/memory"]
        total, counted = sum(summary["count"].values()) - summary["count"]["all"], bound["count"]["all"]
        regime = ("none" if not counted else f"all rows ({counted})" if counted == total else
                  f"{_three(bound['speedup'])} ({counted} rows)")
        out.append(f"| {name}, {result['git']['commit']} | {_three(summary['speedup'])} | "
                   f"{_three(summary['eager_speedup'])} | {regime} |")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="+", type=Path, help="convgen bench JSON files")
    parser.add_argument("--plans", default="planner", choices=("planner", "first use", "tuning database"),
                        help="the plans the counted runs ran, as each row records them (default: the planner's)")
    args = parser.parse_args(argv)
    print("| suite, commit | GPU time fprop / dgrad / wgrad | eager time fprop / dgrad / wgrad | "
          "GPU time, rows where cuDNN < 300 TFLOP/s |")
    print("| --- | --- | --- | --- |")
    for row in rows(args.results, args.plans):
        print(row)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
