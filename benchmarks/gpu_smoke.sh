#!/usr/bin/env bash
# A quick end-to-end check of `convgen bench` on a GPU machine (about a minute on an H200):
# one small suite, few reps, the same-work rows and the fused rows, JSON + .txt + .png into
# $RESULTS_DIR (default /tmp/convgen-gpu-smoke), then a check that the JSON holds what the
# same-work bench promises (every figure measured, nothing mismatched, no bias on either side
# of a same-work row).  Exit status non-zero on any failure.
#
#   benchmarks/gpu_smoke.sh
#   SUITE=cifar-vgg RESULTS_DIR=/tmp/out benchmarks/gpu_smoke.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PYTHON="${PYTHON:-python3}"
SUITE="${SUITE:-cifar-resnet}"
RESULTS_DIR="${RESULTS_DIR:-/tmp/convgen-gpu-smoke}"
mkdir -p "$RESULTS_DIR"

"$PYTHON" -m convgen.cli bench --suite "$SUITE" --reps 5 --warmup 3 --host-calls 30 \
    --eager-calls 20 --eager-trials 3 --fused --no-progress --out "$RESULTS_DIR" --plot auto "$@" \
    | tee "$RESULTS_DIR/smoke.log"

json=$(grep '^JSON: ' "$RESULTS_DIR/smoke.log" | tail -1 | cut -d' ' -f2-)
"$PYTHON" - "$json" <<'PY'
import json, sys

r = json.load(open(sys.argv[1]))
problems = []
assert r["format"] == 2, r["format"]
rows = [x for s in r["suites"] for x in s["rows"]]
fused = [x for s in (r["fused"] or {}).get("suites", []) for x in s["rows"]]
if not rows or not fused:
    problems.append(f"{len(rows)} same-work rows, {len(fused)} fused rows")
if r["launch_floor"]["host_us"] is None:
    problems.append(f"launch floor not measured: {r['launch_floor']['error']}")
for x in rows + fused:
    name = f"{x['layer']} {x['pass']} {x['variant']}"
    for side in ("convgen", "cudnn"):
        s = x[side]
        if s is None:
            problems.append(f"{name}: no {side} side (is torch installed with CUDA?)")
            continue
        if s["error"]:
            problems.append(f"{name}: {side} error: {s['error']}")
        for fig in ("time_us", "eager_us", "host_us"):
            if not s[fig]:
                problems.append(f"{name}: {side} {fig} not measured")
    if not x["check"] or x["check"]["ok"] is not True:
        problems.append(f"{name}: check {x['check']}")
    if x["variant"] == "same" and ("bias" in x["traffic"] or "db" in x["traffic"]):
        problems.append(f"{name}: a same-work row counts bias traffic")
s = r["summary"]
print(f"smoke: {len(rows)} same-work rows, {len(fused)} fused rows; GPU geomean {s['speedup']['all']}, "
      f"eager geomean {s['eager_speedup']['all']}; launch floor {r['launch_floor']['host_us']} us")
if problems:
    print("smoke: FAILED\n  " + "\n  ".join(problems))
    sys.exit(1)
print("smoke: OK")
PY
