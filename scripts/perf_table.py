#!/usr/bin/env python3
"""README's performance table, printed from `convgen bench` results (JSON), so that the table
quotes what the runs measured rather than figures copied by hand.

    python3 scripts/perf_table.py benchmarks/results/nvidia-h100_2026-12-07_*.json

Only results whose every row ran the plans ``--plans`` names count (default: the planner's, as
the device script's `CONVGEN_TUNED=0` runs record them); of several runs of one suite, the
newest (its timestamp) that measured a pass gives that pass, so a row may name two commits.  A row gives
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


def _label(name: str, commits: dict[str, str]) -> str:
    """The suite and its run's commit; where passes came from runs at other commits, those too."""
    counts = list(commits.values())
    main = max(counts, key=counts.count)
    others = ", ".join(f"{p} {c}" for p, c in commits.items() if c != main)
    return f"{name}, {main}" + (f" ({others})" if others else "")


def rows(paths: list[Path], plans: str = "planner") -> list[str]:
    """One markdown row per suite: suite and commit, GPU time, eager time, latency-bound rows.
    Each pass comes from the newest run that measured it, so a run of one pass (a wgrad change
    benched alone) updates that pass and leaves the others' figures as their last runs gave them.
    A run of some layers (`convgen bench --layers`) is no suite's figure and is left out."""
    newest: dict[tuple[str, str], tuple[str, dict, dict]] = {}  # (suite, pass) -> (timestamp, result, suite)
    for path in paths:
        result = json.loads(path.read_text())
        if result.get("settings", {}).get("layers_filter"):
            continue  # `--layers`: some rows of a suite, not the suite
        for suite in result["suites"]:
            if not _ran(suite, plans):
                continue
            for p in PASSES:
                key = (suite["name"], p)
                if suite["summary"]["count"].get(p) and (key not in newest or result["timestamp"] > newest[key][0]):
                    newest[key] = (result["timestamp"], result, suite)
    out = []
    for name in sorted({n for n, _ in newest}):
        picked = {p: newest[(name, p)][1:] for p in PASSES if (name, p) in newest}
        summaries = {p: suite["summary"] for p, (_, suite) in picked.items()}
        bound = {p: s["by_regime"]["latency/memory"] for p, s in summaries.items()}
        total = sum(s["count"][p] for p, s in summaries.items())
        counted = sum(b["count"].get(p, 0) for p, b in bound.items())
        regime = ("none" if not counted else f"all rows ({counted})" if counted == total else
                  f"{_three({p: b['speedup'].get(p) for p, b in bound.items() if b['count'].get(p, 0)})} "
                  f"({counted} rows)")
        commits = {p: result["git"]["commit"] for p, (result, _) in picked.items()}
        out.append(f"| {_label(name, commits)} | {_three({p: s['speedup'][p] for p, s in summaries.items()})} | "
                   f"{_three({p: s['eager_speedup'][p] for p, s in summaries.items()})} | {regime} |")
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
