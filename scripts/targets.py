"""The open issues' speed targets, checked against `convgen bench` results (JSON), so a closing
note quotes figures a run produced rather than figures read off by eye.

    python3 scripts/targets.py benchmarks/results/nvidia-h200_DATE_COMMIT-*.json

Each file is one bench run of one or more suites; give the runs to judge (a suite named by
several files is judged once per file, so give one run per suite and plan source).  Per suite
and pass it prints the targets that apply, the figure, and met / MISSED / "-" (no verdict: the
run's plan source is not the one the target names, or the rows it needs are absent):

- issue 16: rows where cuDNN runs below 300 TFLOP/s (latency- or memory-bound), geometric
  mean of GPU-time speedup: >= 0.9x with the planner's defaults, >= 1.0x with tuning on first
  use.  The plan source is the run's `settings.plans` (`convgen bench` records it since
  10e1077); older runs have none and get no verdict unless ``--assume-plans`` names it.  The compute-bound rest is listed with
  TFLOP/s on both sides, for issue 17.
- issue 17: resnet50's geometric mean >= 1.0x in each pass; 3x3 rows of >= 128 channels and
  >= 25 GFLOP (the large suite's, resnet50's and any other's) at >= 600 TFLOP/s in fprop and
  dgrad, >= 500 in wgrad.
- issue 21: the depthwise suites (MobileNetV2's and ConvNeXt's) >= 1.5x cuDNN per pass, and
  convgen within 2x of the roofline floor (geometric mean of time over floor).

Only same-work rows count; a row that failed or disagreed with cuDNN is left out and named.

``--pool NAME`` judges the rows of all the files as one suite NAME, with every pass's geometric
mean over all its rows besides: how `next_device_call.sh holdout` is read, whose layers (of
networks with no suite here) each come back as a one-shape run of their own.  The files must
come from one GPU, commit and plan source, so that the pool is one measurement.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any, Iterable, Optional

LOW_RATE = 300.0  # TFLOP/s: cuDNN below it is latency- or memory-bound (issue 16)
DEPTHWISE = ("mobilenetv2-dw", "convnext-dw")  # issue 21's suites
BIG_3X3 = {"fprop": 600.0, "dgrad": 600.0, "wgrad": 500.0}  # issue 17, TFLOP/s
PASSES = ("fprop", "dgrad", "wgrad")


def geomean(values: Iterable[float]) -> Optional[float]:
    vals = [v for v in values if v and v > 0]
    return math.exp(sum(math.log(v) for v in vals) / len(vals)) if vals else None


def source(result: dict[str, Any], assume: Optional[str] = None) -> Optional[str]:
    """"defaults", "first use" or "database": the run's plan source; for a run that did not
    record it, ``assume`` (what its notes say it ran), else None."""
    plans = (result.get("settings") or {}).get("plans")
    if not plans:
        return assume
    if "tuned on its first call" in plans:
        return "first use"
    return "defaults" if plans.startswith("the planner's defaults") else "database"


def usable(row: dict[str, Any]) -> bool:
    """A same-work row both sides timed, whose outputs agreed."""
    cg, cd = row.get("convgen") or {}, row.get("cudnn") or {}
    ok = (row.get("check") or {}).get("ok")
    return row.get("variant", "same") == "same" and row.get("speedup") is not None and not cg.get("error") \
        and not cd.get("error") and ok is not False


def verdict(value: Optional[float], bound: float, applies: bool = True, at_most: bool = False) -> str:
    if value is None or not applies:
        return "-"
    return "met" if (value <= bound if at_most else value >= bound) else "MISSED"


def _x(v: Optional[float]) -> str:
    return "-" if v is None else f"{v:.2f}x"


def judge(result: dict[str, Any], name: str, assume: Optional[str] = None) -> list[str]:
    """The report's lines for one bench result (``assume``: the plan source of a run that did
    not record one)."""
    gpu = (result.get("gpu") or {}).get("name", "?")
    commit = (result.get("git") or {}).get("commit", "?")
    src = source(result, assume)
    said = src if src is None or (result.get("settings") or {}).get("plans") else f"{src} (assumed: not recorded)"
    out = [f"== {name}: {gpu}, {result.get('date', '?')}, commit {commit}, plans: {said or 'not recorded'} =="]
    for suite in result.get("suites", []):
        rows = suite.get("rows", [])
        bad = [f"{r['layer']} {r['pass']}" for r in rows if r.get("variant", "same") == "same" and not usable(r)]
        if bad:
            out.append(f"{suite['name']}: left out (failed or mismatched): {', '.join(bad)}")
        for p in PASSES:
            mine = [r for r in rows if r["pass"] == p and usable(r)]
            if not mine:
                continue
            low = [r for r in mine if (r["cudnn"].get("tflops") or 0) < LOW_RATE]
            g_low = geomean(r["speedup"] for r in low)
            bound16 = {"defaults": 0.9, "first use": 1.0}.get(src or "")
            out.append(f"{suite['name']} {p}: issue 16, {len(low)} of {len(mine)} rows under {LOW_RATE:.0f} TFLOP/s: "
                       f"{_x(g_low)} (target {'-' if bound16 is None else f'{bound16}x'}): "
                       f"{verdict(g_low, bound16 or 0.0, bound16 is not None and bool(low))}")
            for r in mine:
                if (r["cudnn"].get("tflops") or 0) >= LOW_RATE:
                    out.append(f"    compute-bound {r['layer']}: convgen {r['convgen']['tflops']:.0f}, cuDNN "
                               f"{r['cudnn']['tflops']:.0f} TFLOP/s ({_x(r['speedup'])})")
            if suite["name"] == "resnet50":
                g = geomean(r["speedup"] for r in mine)
                out.append(f"{suite['name']} {p}: issue 17, all {len(mine)} rows: {_x(g)} (target 1.0x): "
                           f"{verdict(g, 1.0)}")
            for r in mine:
                pr = r["problem"]
                if pr["r"] == pr["s"] == 3 and min(pr["c"], pr["k"]) >= 128 and r["flops"] >= 25e9:
                    tf = r["convgen"]["tflops"]
                    out.append(f"{suite['name']} {p}: issue 17, {r['layer']} ({r['flops'] / 1e9:.0f} GFLOP): "
                               f"{tf:.0f} TFLOP/s (target {BIG_3X3[p]:.0f}): {verdict(tf, BIG_3X3[p])}")
            if suite["name"] in DEPTHWISE:
                g = geomean(r["speedup"] for r in mine)
                fl = geomean(r.get("over_floor") for r in mine)
                out.append(f"{suite['name']} {p}: issue 21, {_x(g)} cuDNN (target 1.5x): {verdict(g, 1.5)}; "
                           f"{_x(fl)} the floor (target 2x): {verdict(fl, 2.0, at_most=True)}")
    return out


def pool(results: list[tuple[str, dict[str, Any]]], name: str) -> dict[str, Any]:
    """One result whose single suite ``name`` holds every file's rows, each named after its file
    where a file has one layer (a one-shape run names its layer by its shape); ValueError when
    the files differ in GPU, commit or plan source."""
    keys = {((r.get("gpu") or {}).get("name"), (r.get("git") or {}).get("commit"),
             (r.get("settings") or {}).get("plans")) for _, r in results}
    if len(keys) > 1:
        raise ValueError(f"--pool takes runs of one GPU, commit and plan source, got {sorted(map(str, keys))}")
    rows = []
    for label, result in results:
        mine = [row for suite in result.get("suites", []) for row in suite.get("rows", [])]
        one_layer = len({row["layer"] for row in mine}) == 1
        rows += [{**row, "layer": label if one_layer else f"{label}:{row['layer']}"} for row in mine]
    first = results[0][1]
    return {**first, "suites": [{"name": name, "rows": rows}]}


def pooled_means(result: dict[str, Any]) -> list[str]:
    """Each pass's geometric-mean speedup over all of the pool's usable rows."""
    rows = result["suites"][0]["rows"]
    out = []
    for p in PASSES:
        mine = [r for r in rows if r["pass"] == p and usable(r)]
        if mine:
            out.append(f"{result['suites'][0]['name']} {p}: all {len(mine)} rows: "
                       f"{_x(geomean(r['speedup'] for r in mine))} cuDNN's GPU time")
    return out


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", nargs="+", type=Path, help="convgen bench JSON files")
    ap.add_argument("--assume-plans", choices=("defaults", "first use"),
                    help="the plan source of runs that did not record one, as their notes say (the "
                         "device script's runs are the planner's defaults: CONVGEN_TUNED=0)")
    ap.add_argument("--pool", metavar="NAME", help="judge all the files' rows as one suite NAME (held-out layers)")
    args = ap.parse_args(argv)
    if args.pool:
        labels = [p.parent.name if p.parent.name not in ("", ".") else p.stem for p in args.results]
        try:
            merged = pool([(lb, json.loads(p.read_text())) for lb, p in zip(labels, args.results)], args.pool)
        except ValueError as e:
            ap.error(str(e))
        print("\n".join(judge(merged, f"{args.pool} ({len(args.results)} files)", args.assume_plans)
                        + pooled_means(merged)))
        return 0
    for path in args.results:
        print("\n".join(judge(json.loads(path.read_text()), path.name, args.assume_plans)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
