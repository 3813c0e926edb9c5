#!/usr/bin/env bash
# One command for the GPU machine: benchmark every built-in suite against cuDNN and write,
# per suite, a JSON file, a text report (.txt) and a plot (.png) into benchmarks/results
# (or $RESULTS_DIR).  Each suite runs in its own process, so a crash in one suite
# (a sticky CUDA error, say) does not lose the others; the exit status is non-zero if
# any suite failed.
#
#   benchmarks/run_all.sh                                   # 30 reps, 5 warm-up calls
#   REPS=20 benchmarks/run_all.sh --no-compile-time         # faster
#   SUITES="cifar-resnet cifar-vgg" benchmarks/run_all.sh
#   RESULTS_DIR=/tmp/out CONVGEN_BENCH_COMMIT=abc1234 benchmarks/run_all.sh
#   benchmarks/run_all.sh --fused                          # also the fused-epilogue rows, reported apart
#
# Every row is the same work on both sides (fprop without bias, dgrad dx alone, wgrad dW
# alone) and carries three figures per side: GPU time, eager time per call, host cost.
#
# CONVGEN_BENCH_COMMIT names the results where the tree is not a git checkout.
# Any further arguments are passed to `convgen bench` as they are.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

RESULTS_DIR="${RESULTS_DIR:-benchmarks/results}"
PYTHON="${PYTHON:-python3}"
# Default: every built-in suite (`convgen suites` lists them), asked of convgen itself so a
# new suite is never left out.
SUITES="${SUITES:-$("$PYTHON" -c 'from convgen.suites import SUITES; print(" ".join(SUITES))')}"
[ -n "$SUITES" ] || { echo "run_all.sh: no suites (is convgen importable by $PYTHON?)" >&2; exit 1; }
mkdir -p "$RESULTS_DIR"

status=0
for suite in $SUITES; do
    echo "=== convgen bench --suite $suite ===" >&2
    if ! "$PYTHON" -m convgen.cli bench --suite "$suite" --reps "${REPS:-30}" --warmup "${WARMUP:-5}" \
            --out "$RESULTS_DIR" --plot auto "$@"; then
        echo "run_all.sh: suite $suite failed" >&2
        status=1
    fi
done
exit "$status"
