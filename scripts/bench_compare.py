"""Compare two `convgen bench` JSON results row by row: an A/B of one change (a probe's
variant, a planner rule, a commit) timed in two runs.

    python3 scripts/bench_compare.py A.json B.json

Each row matched by suite, layer and pass prints convgen's GPU time in A and in B and the
speedup B gives (A/B), and cuDNN's A/B beside it.  cuDNN runs the same work in both, so its
ratio is the runs' drift (clocks, another process): the adjusted speedup divides it out,
(A/B of convgen) / (A/B of cuDNN), the ratio of the two runs' speedups over cuDNN.  A
geometric mean per suite and pass ends the table.  Rows either run lacks, or that failed in
either, are listed and left out of the means.  Both runs should come from one GPU kind:
the script says so when the JSONs name different GPUs.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from pathlib import Path

Key = tuple[str, str, str]


def rows(path: Path) -> tuple[str, dict[Key, dict]]:
    """The GPU's name and the same-work rows (suite, layer, pass) -> row of one result JSON."""
    data = json.loads(path.read_text())
    suites = data["suites"].values() if isinstance(data["suites"], dict) else data["suites"]
    out = {}
    for suite in suites:
        for row in suite["rows"]:
            if row.get("variant") in (None, "same"):
                out[(row["suite"], row["layer"], row["pass"])] = row
    return data["gpu"]["name"], out


def _median(side: dict | None) -> float | None:
    if not side or side.get("error") or not side.get("time_us"):
        return None
    us = side["time_us"]["median"]
    return us if us and math.isfinite(us) else None


def _geomean(values: list[float]) -> float:
    return math.exp(sum(map(math.log, values)) / len(values))


def compare(a: Path, b: Path) -> tuple[list[str], dict[tuple[str, str], tuple[float, float, int]]]:
    """The report's lines, and per (suite, pass): geometric means of convgen's A/B and of the
    drift-adjusted A/B, and how many rows they cover."""
    gpu_a, rows_a = rows(a)
    gpu_b, rows_b = rows(b)
    lines = [f"A: {a.name} ({gpu_a})", f"B: {b.name} ({gpu_b})"]
    if gpu_a != gpu_b:
        lines.append(f"warning: the runs name different GPUs ({gpu_a} / {gpu_b}): their times do not compare")
    lines.append(f"{'suite':16s} {'layer':16s} {'pass':5s} {'cg A':>8s} {'cg B':>8s} {'A/B':>6s} {'cuDNN A/B':>9s} "
                 f"{'adjusted':>8s}")
    ratios: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
    for key in sorted(rows_a.keys() & rows_b.keys()):
        ra, rb = rows_a[key], rows_b[key]
        cg_a, cg_b = _median(ra.get("convgen")), _median(rb.get("convgen"))
        if cg_a is None or cg_b is None:
            lines.append(f"{key[0]:16s} {key[1]:16s} {key[2]:5s} skipped: convgen has no time in "
                         + ("A" if cg_a is None else "B"))
            continue
        cu_a, cu_b = _median(ra.get("cudnn")), _median(rb.get("cudnn"))
        drift = cu_a / cu_b if cu_a and cu_b else None
        speedup = cg_a / cg_b
        adjusted = speedup / drift if drift else speedup
        ratios[(key[0], key[2])].append((speedup, adjusted))
        lines.append(f"{key[0]:16s} {key[1]:16s} {key[2]:5s} {cg_a:8.1f} {cg_b:8.1f} {speedup:6.3f} "
                     + (f"{drift:9.3f}" if drift else f"{'-':>9s}") + f" {adjusted:8.3f}")
    for key in sorted(rows_a.keys() ^ rows_b.keys()):
        lines.append(f"{key[0]:16s} {key[1]:16s} {key[2]:5s} only in {'A' if key in rows_a else 'B'}")
    means = {}
    for (suite, pass_), rs in sorted(ratios.items()):
        means[(suite, pass_)] = (_geomean([s for s, _ in rs]), _geomean([d for _, d in rs]), len(rs))
        g, d, n = means[(suite, pass_)]
        lines.append(f"geomean {suite} {pass_}: A/B {g:.3f}, adjusted for cuDNN's drift {d:.3f} ({n} rows)")
    return lines, means


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a", type=Path, help="the baseline's bench JSON")
    ap.add_argument("b", type=Path, help="the variant's bench JSON")
    args = ap.parse_args(argv)
    lines, means = compare(args.a, args.b)
    print("\n".join(lines))
    return 0 if means else 1


if __name__ == "__main__":
    sys.exit(main())
