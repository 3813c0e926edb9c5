#!/usr/bin/env bash
# The next device call, as benchmarks/NOTES.md (twenty-ninth and thirtieth sessions) lists it:
# every kernel those sessions changed or added, checked first, then timed.  Three parts, each
# within one call's 10 minutes; run from the repository root on the GPU machine:
#
#   COMMIT=$(git rev-parse --short HEAD) OUT=... bash benchmarks/next_device_call.sh suite
#   COMMIT=... OUT=... bash benchmarks/next_device_call.sh ab
#   COMMIT=... OUT=... bash benchmarks/next_device_call.sh train
#
# `suite` installs convgen and runs the whole GPU suite (the new work's tests among them);
# `check` only the new work's GPU tests and the two halo probes, for a call with less time;
# `ab` runs the A/B probes (each suite and variant in its own kernel cache) and the host-cost
# probe; `train` the two halo probes and the training-step example in its three modes.  Each
# part installs convgen.
# Everything lands under $OUT (logs, and bench folders as tar.gz).  Nothing here is run by CI.
set -uo pipefail
: "${OUT:?set OUT to the folder whose files come back}" "${COMMIT:?set COMMIT to the commit under test}"
export PYTHONUNBUFFERED=1 CONVGEN_BENCH_COMMIT="$COMMIT" CONVGEN_TUNED=0
ROOT=$(pwd)
PYTEST="python3 -m pytest -q -m gpu -n 16 --dist worksteal --timeout 200 --timeout-method thread -rfE -p no:cacheprovider"
BENCH="--reps 30 --warmup 5 --no-compile-time --plot off --no-progress"

check() {
    nvidia-smi --query-gpu=name --format=csv,noheader
    install
    # the thirtieth session's kernels and bridges, then the twenty-ninth's depthwise loop
    CONVGEN_CACHE_DIR=/tmp/cg-check timeout 420 $PYTEST tests/test_split_reduce_gpu.py tests/test_tma_gpu.py \
        tests/test_torch_gpu.py tests/test_prepared_gpu.py tests/test_depthwise_gpu.py tests/test_groups_gpu.py \
        tests/test_autotune_gpu.py 2>&1 | tee "$OUT/gpu-tests.log" | tail -8
    probes
}

install() {
    python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
}

suite() {
    nvidia-smi --query-gpu=name --format=csv,noheader
    install
    CONVGEN_CACHE_DIR=/tmp/cg-suite timeout 540 $PYTEST 2>&1 | tee "$OUT/gpu-suite.log" | tail -12
}

probes() {
    timeout 60 python3 benchmarks/probes/wgmma_row_offset_probe.py 2>&1 | tee "$OUT/row-offset-probe.log"
    timeout 60 python3 benchmarks/probes/tma_halo_probe.py 2>&1 | tee "$OUT/tma-halo-probe.log"
}

ab() {
    install
    timeout 90 python3 benchmarks/probes/host_cost.py --json "$OUT/host-cost.json" 2>&1 | tee "$OUT/host-cost.log"
    mkdir -p "$OUT/ab"
    # split-K summed in the kernel against the reduction kernel: wgrad rows, all three figures
    for s in cifar-resnet mobilenetv2-pw resnet50; do
        for r in kernel grid; do
            REDUCE=$r CONVGEN_CACHE_DIR=/tmp/cg-red-$r timeout 150 python3 benchmarks/probes/split_reduce_probe.py \
                bench --suite "$s" --pass wgrad $BENCH --out "$OUT/ab/$s-wgrad-$r" 2>&1 | grep -E "geomean|rror" | head -4
        done
        python3 scripts/bench_compare.py "$OUT/ab/$s-wgrad-kernel/"*.json "$OUT/ab/$s-wgrad-grid/"*.json \
            > "$OUT/ab/$s-wgrad-compare.txt" 2>&1
    done
    # the depthwise ring of halos, two against three (twenty-ninth session)
    for r in 2 3; do
        RING=$r CONVGEN_CACHE_DIR=/tmp/cg-ring$r timeout 100 python3 benchmarks/probes/halo_ring_probe.py \
            bench --suite mobilenetv2-dw --pass all $BENCH --host-calls 0 --eager-calls 0 --out "$OUT/ab/ring$r" \
            2>&1 | grep -E "geomean speedup.*GPU"
    done
    (cd "$OUT" && tar czf ab.tgz ab && rm -rf ab)
}

train() {
    install
    probes
    cd "$ROOT" && timeout 500 python3 examples/train_step.py --steps 50 2>&1 | tee "$OUT/train-step.log" | tail -14
}

case "${1:-}" in
    suite) suite ;;
    check) check ;;
    ab) ab ;;
    train) train ;;
    *) echo "usage: $0 suite|check|ab|train" >&2; exit 2 ;;
esac
