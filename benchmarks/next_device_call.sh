#!/usr/bin/env bash
# The next device calls, as benchmarks/NOTES.md (forty-second session) lists them.  Each part fits
# one call's 10 minutes; run from the repository root on the GPU machine, most urgent first.  Give
# COMMIT this machine's `git rev-parse --short HEAD` literally: the device's copy of the tree can
# carry a stale git HEAD, and its git may not hold recent commits (thirty-sixth session).  The
# device returns at most 8 files a call: parts with many outputs tar them.
#
#   COMMIT=... OUT=... bash benchmarks/next_device_call.sh s44one  # issue 17's twins in one call (about 8.5 min):
#                     # the store's and the clusters' GPU tests, then (if they pass) both twins against the
#                     # planner's fprop on large and resnet50
#   COMMIT=... OUT=... S57_BUDGET=... bash benchmarks/next_device_call.sh s59  # the fiftieth session's one call: GPU tests of
#                     # what has not run, Darknet/ResNet-18 strided dgrad benched, then s57's tuning (about 9 min)
#   COMMIT=... OUT=... bash benchmarks/next_device_call.sh s57  # the fiftieth session's first: few-tile split-K wgrads
#                     # tuned again, stream-K's two forms beside the default (about 7 min)
#   COMMIT=... OUT=... bash benchmarks/next_device_call.sh s58  # ncu on l4-3x3's stream-K default, SASS stall samples
#   COMMIT=... OUT=... bash benchmarks/next_device_call.sh s54  # stream-K's parts from the accumulators: GPU tests,
#                     # before/after on resnet18's, vgg16's (and large's) wgrad, memcheck (about 8 min)
#   COMMIT=... OUT=... bash benchmarks/next_device_call.sh s53  # never run on a GPU (autotune's timing, the mma.sync
#                     # stencil), Nsight Compute on ResNet-18's l4-3x3 wgrad, MobileNetV2's pointwise tuned on first use
#   COMMIT=... OUT=... bash benchmarks/next_device_call.sh s52  # autotune's GPU tests and MobileNetV2's pointwise
#                     # fprop with tuning on first use (about 3 min; forty-eighth session's first)
#   COMMIT=... OUT=... bash benchmarks/next_device_call.sh s51  # stream-K's two forms and two tiles, one machine
#   COMMIT=... OUT=... bash benchmarks/next_device_call.sh s49  # s48b then ncu-mma in one call (about 9 min)
#   COMMIT=... OUT=... bash benchmarks/next_device_call.sh s48b  # autotune's new timing: its GPU tests, MobileNetV2's
#                     # pointwise suite with tuning on first use (about 3 min)
#   COMMIT=... OUT=... bash benchmarks/next_device_call.sh ncu-mma  # the mma.sync stencil: GPU tests, ConvNeXt fprop
#                     # tuned, Nsight Compute (about 6 min)
#   COMMIT=... OUT=... bash benchmarks/next_device_call.sh s48  # the mma.sync stencil restaged: GPU tests, sanitizers,
#                     # ConvNeXt fprop tuned; then s48at in the time left (about 9.5 min)
#   COMMIT=... OUT=... [AT_SUITES=...] bash benchmarks/next_device_call.sh s48at  # issue 16's suites under 1.0x
#                     # at the defaults, benched with tuning on first use (about 9 min)
#   COMMIT=... OUT=... bash benchmarks/next_device_call.sh s47  # the forty-sixth session's depthwise wgrad: every
#                     # depthwise GPU test, the three depthwise suites benched, EfficientNet-B0's and MobileNetV2's
#                     # wgrad tuned (about 7 min)
#   COMMIT=... OUT=... bash benchmarks/next_device_call.sh s47b  # issue 17's 30-60 GFLOP rows tuned (about 8 min)
#   COMMIT=... OUT=... bash benchmarks/next_device_call.sh s45dw  # the held-filter depthwise fprop: its GPU tests, then
#                     # ConvNeXt and EfficientNet-B0 fprop tuned, held plans beside the default (about 6 min)
#   COMMIT=... OUT=... bash benchmarks/next_device_call.sh dw-ablate  # where depthwise fprop's time goes: its
#                     # halo copies or its filter loop, taken away in turn (about 5 min)
#   COMMIT=... OUT=... bash benchmarks/next_device_call.sh s44   # all that has not run since 40d7cdc, in one call
#                     # (about 9.5 min): the store's and the clusters' GPU tests, then the rest of the GPU suite,
#                     # racecheck on the store's cases and memcheck on the clusters'
#   COMMIT=... OUT=... bash benchmarks/next_device_call.sh step-batch  # the training step at batch 256 and 2048,
#                     # all three modes (about 6 min): where the GPU sets the pace, not torch's host work
#   COMMIT=... OUT=... bash benchmarks/next_device_call.sh s43   # what no GPU has run (about 7 min): the TMA store's,
#                     # the cluster twins', the depthwise tiles', packed-wgrad and first-use tuning GPU tests; memcheck
#                     # and racecheck on the store's and the clusters' cases
#   COMMIT=... OUT=... bash benchmarks/next_device_call.sh s43min  # a short lease (about 4 min): the store's and the
#                     # clusters' GPU tests, racecheck on the store's cases
#   COMMIT=... OUT=... bash benchmarks/next_device_call.sh s43ab  # the store twins and the cluster twins against the
#                     # planner's fprop on large and resnet50 (about 9 min)
#   COMMIT=... OUT=... bash benchmarks/next_device_call.sh s42min  # a short lease (about 4 min): the cluster twins'
#                     # and the depthwise fitted tiles' GPU tests, racecheck on the cluster cases
#   COMMIT=... OUT=... bash benchmarks/next_device_call.sh s42c  # the changed parts' GPU tests (cluster, depthwise,
#                     # packed-wgrad and first-use tuning), the cluster sanitizers, one cluster A/B run (about 8 min)
#   COMMIT=... OUT=... bash benchmarks/next_device_call.sh suite      # whole GPU suite: last passed whole at 40d7cdc (H100)
#   COMMIT=... OUT=... bash benchmarks/next_device_call.sh cluster  # clusters of two (TmaWgmma.cluster): checked, then
#                     # the planner's fprop against its cluster twins on large and resnet50, twice
#   COMMIT=<this machine's short HEAD> OUT=... bash benchmarks/next_device_call.sh s42   # fitted tiles, the whole-pixel
#                     # and 48-channel long runs, first-use tuning of packed wgrads: GPU tests, EfficientNet-B0 and
#                     # ConvNeXt fprop/dgrad tuned
#   COMMIT=... OUT=... [README_SUITES="..."] bash benchmarks/next_device_call.sh readme  # on an H200: README's table
#                     # (every suite, planner defaults), as many suites as fit; it names those not reached
#   COMMIT=... OUT=... bash benchmarks/next_device_call.sh s42b       # MobileNetV2 tuned; EfficientNet fprop autotuned
#   COMMIT=... OUT=... bash benchmarks/next_device_call.sh ncu-effnet # what bounds the whole-pixel 5x5 fprop rows
#   (done on the H100 in the fortieth session: s41)
#   (done on the H100 in the fortieth session: s40, s40b, s40c, suite)
#   (done on the H100 in the thirty-ninth session: s39b, s39c, suite, the large suite's wgrad tune, ncu of ConvNeXt's fprop)
#   COMMIT=... OUT=... bash benchmarks/next_device_call.sh l2-check   # on an H200: the kept L2 hint (H100 so far)
#   COMMIT=... OUT=... bash benchmarks/next_device_call.sh tune-wide
#   COMMIT=... OUT=... bash benchmarks/next_device_call.sh probes
#   (done on the H100 in the thirty-eighth session: tune-dw7, verify38, verify38b, suite, verify38c's benches)
#   (done on the H100 in the thirty-seventh session: verify36, verify37, verify37b, verify37c)
#   COMMIT=... OUT=... bash benchmarks/next_device_call.sh l2-ab      # the hint on every copy, on and off (done on the H100)
#   COMMIT=... OUT=... bash benchmarks/next_device_call.sh gather-ab  # (done on the H100: no difference)
#
# Earlier sessions' parts, still runnable:
#   COMMIT=... OUT=... bash benchmarks/next_device_call.sh gather
#       (every GPU wgrad test, stream-K's too; the suites whose im2col wgrads changed, timed; stream-K memcheck)
#   COMMIT=... OUT=... bash benchmarks/next_device_call.sh quick
#       (stream-K's and the wgrad gather's GPU tests, the stem's wgrad bench and tuning, stream-K memcheck)
#   COMMIT=... OUT=... bash benchmarks/next_device_call.sh verify     # quick, then the suite in the rest
#   COMMIT=... OUT=... bash benchmarks/next_device_call.sh suite
#   COMMIT=... OUT=... bash benchmarks/next_device_call.sh ncu        # Nsight Compute, depthwise and pointwise rows, both sides
#   COMMIT=... OUT=... bash benchmarks/next_device_call.sh streamk    # stream-K wgrad: tests, sanitizers, resnet50 A/B
#   COMMIT=... OUT=... bash benchmarks/next_device_call.sh streamk-large  # the same A/B on the large suite
#   COMMIT=... OUT=... bash benchmarks/next_device_call.sh halo       # on an H200: the H100 ran it at 321e0e3
#   COMMIT=... OUT=... bash benchmarks/next_device_call.sh halo-tune  # TmaHalo's pitch rule against every candidate
#   COMMIT=... OUT=... bash benchmarks/next_device_call.sh tune       # on an H200: branch grid-reduce-rule's guard
#   COMMIT=... OUT=... bash benchmarks/next_device_call.sh tune-wide
#   COMMIT=... OUT=... bash benchmarks/next_device_call.sh host
#   COMMIT=... OUT=... bash benchmarks/next_device_call.sh ab
#   COMMIT=... OUT=... bash benchmarks/next_device_call.sh probes
#
# `l2-check` first where an H200 comes (the thirty-seventh session's ten calls all got H100s); then
# `suite` (the depthwise defaults and wgrad slices changed since its last whole run; their 350
# GPU tests passed on the H100).
# `halo`: the TMA halo loop (TmaHalo, thirty-second session): its GPU tests, then convgen against
# cuDNN on the suites' four 64-channel 3x3 layers it takes and on three such layers of networks
# outside the suites (EDSR's 48x48 and 96x96 training patches, SSD300's conv1_2), fprop and
# dgrad, then the whole GPU suite in what time is left.
# `streamk`: stream-K wgrad (thirty-third session, written without a GPU): its GPU tests and
# compute-sanitizer runs, then the planner's wgrad against the stream-K candidate on resnet50 and
# large (STREAMK=0 / 1, benchmarks/probes/stream_k_probe.py), compared with bench_compare.py.
# `host`: host cost (the registered operators' rows: their own Autograd kernels and FastConvs
# since the thirty-third session, and the operator's kernel and the dispatcher's floor apart)
# and the training step's three modes.
# `probes`: the halo-reusing loop's kernel (checked and timed beside cuDNN), the eager step's
# stall with and without Python's collector, the compiled step's cudagraph and recompile hints
# and its host time per phase, host cost (the registered operators' rows too) and the training
# step's three modes.
# `ab`: split-K summed in the kernel against the reduction kernel, twice on one machine, on
# three suites' wgrad rows (a rule needs two runs).  `tune`: `convgen tune` on the wgrad rows
# whose 192-wide tiles and grid twins are untimed (the pointwise suites' logs decide whether
# branch grid-reduce-rule, the planner's rule for summing in the kernel, can land); `tune-wide`
# the same for resnet50, vgg16 and unet (the 192-wide TMA tiles).  `suite`: the whole GPU
# suite (needed again once kernels or templates change; it last passed whole at 7428884, H100).
# Each part installs convgen; everything lands under $OUT.  Nothing here is run by CI.
set -uo pipefail
: "${OUT:?set OUT to the folder whose files come back}" "${COMMIT:?set COMMIT to the commit under test}"
# CONVGEN_TUNED=0: the planner's plans, unless a part says otherwise.  It also turns tuning on first
# use off (autotune.enabled), so a part that times autotune sets CONVGEN_TUNED=1 with it.
export PYTHONUNBUFFERED=1 CONVGEN_BENCH_COMMIT="$COMMIT" CONVGEN_TUNED=0
PYTEST="python3 -m pytest -q -m gpu -n 16 --dist worksteal --timeout 200 --timeout-method thread -rfE -p no:cacheprovider"
BENCH="--reps 30 --warmup 5 --no-compile-time --plot off --no-progress"

install() {
    nvidia-smi --query-gpu=name --format=csv,noheader
    python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
}

probes() {
    install
    timeout 120 python3 benchmarks/probes/fp32_stem_probe.py 2>&1 | tee "$OUT/fp32-stem-probe.log"
    timeout 150 python3 benchmarks/probes/tma_halo_loop_probe.py 2>&1 | tee "$OUT/halo-loop-probe.log"
    for m in gc nogc gc nogc; do
        timeout 45 python3 benchmarks/probes/step_hitch.py $m 2>&1 | grep -E "eager +(convgen|cuDNN) |collections" \
            | tee -a "$OUT/step-hitch.log"
    done
    TORCH_LOGS=perf_hints,recompiles,graph_breaks timeout 100 python3 examples/train_step.py --modes compiled-step \
        --steps 30 --warmup 20 > "$OUT/compiled-step-hints.log" 2>&1
    grep -iE "skipping|recompil|break|ms/step" "$OUT/compiled-step-hints.log" | head -20
    timeout 120 python3 benchmarks/probes/compiled_step_profile.py > "$OUT/compiled-step-profile.log" 2>&1
    grep -E "ms/step" "$OUT/compiled-step-profile.log"
    timeout 70 python3 benchmarks/probes/host_cost.py --calls 200 --json "$OUT/host-cost.json" > "$OUT/host-cost.log" 2>&1
    grep -E "operator|launch\(\)|floor   " "$OUT/host-cost.log"
    timeout 150 python3 examples/train_step.py --steps 50 2>&1 | tee "$OUT/train-step.log" | tail -12
}

halo() {
    install
    CONVGEN_CACHE_DIR=/tmp/cg-halo timeout 150 $PYTEST tests/test_tma_halo_gpu.py 2>&1 | tee "$OUT/tma-halo-gpu.log" | tail -4
    for p in fprop dgrad; do
        CONVGEN_CACHE_DIR=/tmp/cg-halo timeout 90 python3 -m convgen.cli bench --suite resnet50,resnet18,vgg16,unet \
            --layers l1-3x3,conv1_2,enc2b --pass $p $BENCH --out "$OUT/suites-$p" 2>&1 | grep -E "^ *(l1-3x3|conv1_2|enc2b) "
        for shape in "16 48 48" "16 96 96" "8 300 300"; do  # EDSR's patches, SSD300's conv1_2: N H W, 64 -> 64 3x3
            set -- $shape
            CONVGEN_CACHE_DIR=/tmp/cg-halo timeout 45 python3 -m convgen.cli bench -n "$1" -h "$2" -w "$3" -c 64 -k 64 \
                -r 3 -s 3 --padding 1 --pass $p $BENCH --out "$OUT/outside-$p-$2" 2>&1 | grep -E "^ *\S+ +$p " | tail -1
        done
    done
    for tool in memcheck racecheck; do
        CONVGEN_CACHE_DIR=/tmp/cg-halo timeout 60 /usr/local/cuda/bin/compute-sanitizer --tool $tool --report-api-errors no \
            python3 benchmarks/probes/sanitize_tma.py halo > "$OUT/sanitize-halo-$tool.log" 2>&1
        tail -3 "$OUT/sanitize-halo-$tool.log"
    done
    CONVGEN_CACHE_DIR=/tmp/cg-suite timeout "${SUITE_S:-330}" $PYTEST --ignore=tests/test_tma_halo_gpu.py 2>&1 \
        | tee "$OUT/gpu-suite.log" | tail -8
}

halo_tune() {  # every candidate of the four suite layers TmaHalo takes: its pitch rule against tuned
    install
    for p in fprop dgrad; do
        for sl in resnet50:l1-3x3 resnet18:l1-3x3 vgg16:conv1_2 unet:enc2b; do
            CONVGEN_CACHE_DIR=/tmp/cg-tune timeout 70 python3 -m convgen.cli tune --suite "${sl%%:*}" --layers "${sl#*:}" \
                --pass $p --no-bias --log "$OUT/tune-${sl%%:*}-${sl#*:}-$p.json" > "$OUT/tune-${sl%%:*}-${sl#*:}-$p.log" 2>&1
            tail -1 "$OUT/tune-${sl%%:*}-${sl#*:}-$p.log"
        done
    done
    # the sliced kernels (untimed candidates, offered last): VGG-16 conv2_1's 64 -> 128 fprop, UNet's
    # dec2-cat192 dgrad (64 into 192)
    CONVGEN_CACHE_DIR=/tmp/cg-tune timeout 90 python3 -m convgen.cli tune -n 32 -h 112 -w 112 -c 64 -k 128 -r 3 -s 3 \
        --padding 1 --pass fprop --no-bias --log "$OUT/tune-vgg-conv2_1-fprop.json" > "$OUT/tune-vgg-conv2_1-fprop.log" 2>&1
    CONVGEN_CACHE_DIR=/tmp/cg-tune timeout 90 python3 -m convgen.cli tune --suite unet --layers dec2-cat192 --pass dgrad \
        --no-bias --log "$OUT/tune-unet-dec2-cat192-dgrad.json" > "$OUT/tune-unet-dec2-cat192-dgrad.log" 2>&1
    tail -1 "$OUT"/tune-vgg-conv2_1-fprop.log "$OUT"/tune-unet-dec2-cat192-dgrad.log
}

streamk() {
    install
    CONVGEN_CACHE_DIR=/tmp/cg-sk timeout 200 $PYTEST tests/test_stream_k_gpu.py 2>&1 | tee "$OUT/stream-k-gpu.log" | tail -4
    for tool in memcheck racecheck; do
        CONVGEN_CACHE_DIR=/tmp/cg-sk timeout 60 /usr/local/cuda/bin/compute-sanitizer --tool $tool --report-api-errors no \
            python3 benchmarks/probes/sanitize_tma.py streamk > "$OUT/sanitize-streamk-$tool.log" 2>&1
        tail -4 "$OUT/sanitize-streamk-$tool.log"
    done
    streamk_ab resnet50
}

streamk_ab() {  # the planner's wgrad against stream-K's first candidate, on each suite named
    for s in "$@"; do
        for k in 0 1; do
            STREAMK=$k CONVGEN_CACHE_DIR=/tmp/cg-sk$k timeout 100 python3 benchmarks/probes/stream_k_probe.py bench \
                --suite $s --pass wgrad $BENCH --out "$OUT/sk$k-$s" 2>&1 | grep -E "rror|geomean" | head -3
        done
        python3 scripts/bench_compare.py "$OUT/sk0-$s/"*.json "$OUT/sk1-$s/"*.json > "$OUT/stream-k-$s-compare.txt" 2>&1
        tail -3 "$OUT/stream-k-$s-compare.txt"
    done
}

host() {  # the operators' host cost since they are torch.library.Library operators, and the step
    install
    timeout 70 python3 benchmarks/probes/host_cost.py --calls 200 --json "$OUT/host-cost.json" > "$OUT/host-cost.log" 2>&1
    grep -E "operator|launch\(\)|fwd\+bwd|floor   " "$OUT/host-cost.log"
    timeout 150 python3 examples/train_step.py --steps 50 2>&1 | tee "$OUT/train-step.log" | tail -12
}

ab() {
    install
    mkdir -p "$OUT/ab"
    for run in 1 2; do
        for s in cifar-resnet mobilenetv2-pw resnet50; do
            for r in kernel grid; do
                REDUCE=$r CONVGEN_CACHE_DIR=/tmp/cg-red-$r timeout 60 python3 benchmarks/probes/split_reduce_probe.py \
                    bench --suite "$s" --pass wgrad $BENCH --out "$OUT/ab/$s-wgrad-$r-$run" 2>&1 | grep -E "rror" | head -4
            done
            python3 scripts/bench_compare.py "$OUT/ab/$s-wgrad-kernel-$run/"*.json "$OUT/ab/$s-wgrad-grid-$run/"*.json \
                > "$OUT/ab/$s-wgrad-compare-$run.txt" 2>&1
            tail -1 "$OUT/ab/$s-wgrad-compare-$run.txt"
        done
    done
    (cd "$OUT" && tar czf ab.tgz ab && rm -rf ab)
}

tune() {
    install
    # the pointwise suites first: their logs time the grid twins that branch grid-reduce-rule makes
    # defaults; commit them as benchmarks/results/tuning/nvidia-h200_DATE_COMMIT-tune-SUITE-wgrad.json,
    # the names the guard in tests/test_short_reduction_rules.py reads
    tune_suites 270 mobilenetv2-pw efficientnet-b0-pw
}

tune_wide() {  # the 64-channel 3x3 wgrads' 192-wide TMA tiles
    install
    tune_suites 180 resnet50 vgg16 unet
}

tune_suites() {
    local limit=$1
    shift
    for s in "$@"; do
        CONVGEN_CACHE_DIR=/tmp/cg-tune timeout "$limit" python3 -m convgen.cli tune --suite "$s" --pass wgrad --no-bias \
            --log "$OUT/tune-$s-wgrad.json" > "$OUT/tune-$s-wgrad.log" 2>&1
        tail -3 "$OUT/tune-$s-wgrad.log"
    done
}

suite() {
    install
    CONVGEN_CACHE_DIR=/tmp/cg-suite timeout 540 $PYTEST 2>&1 | tee "$OUT/gpu-suite.log" | tail -12
}

ncu_layers() {  # Nsight Compute on the rows furthest under cuDNN (depthwise, pointwise, the stem's wgrad): what bounds each side
    install
    local layers=("$@")
    [ ${#layers[@]} -gt 0 ] || layers=("fprop 64 56 56 96 96 7 1 3 96" "fprop 128 56 56 144 144 3 1 1 144" \
        "fprop 128 112 112 96 96 3 2 1 96" "wgrad 128 56 56 144 144 3 1 1 144" \
        "fprop 128 112 112 16 96 1 1 0" "dgrad 128 112 112 16 96 1 1 0" \
        "wgrad 64 224 224 3 64 7 2 3")  # the last: ResNet-50's stem, 327 us against cuDNN's 174
    for layer in "${layers[@]}"; do
        local name
        name=$(echo $layer | tr ' ' '-')
        timeout 60 python3 benchmarks/probes/layer_profile.py $layer 2>&1 | tail -1  # compiles outside the profiler
        for side in convgen cudnn; do
            timeout 90 /usr/local/cuda/bin/ncu --nvtx --nvtx-include "$side/" --section SpeedOfLight \
                --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy --section LaunchStats \
                --section ComputeWorkloadAnalysis --section InstructionStats python3 benchmarks/probes/layer_profile.py $layer \
                > "$OUT/ncu-$name-$side.log" 2>&1
            grep -E "^  [A-Za-z_].*\(|Duration|Memory Throughput|DRAM Throughput|Compute \(SM\) Th|Achieved Occ|Registers Per|Block Size|Grid Size|Issue Slots Busy|Warp Cycles Per Issued|L1/TEX Hit|L2 Hit|Theoretical Occ" \
                "$OUT/ncu-$name-$side.log" | head -40
        done
    done
    (cd "$OUT" && tar czf ncu.tgz ncu-*.log && rm -f ncu-*.log)  # the device returns 8 files a call
}

verify() {  # one call for what has never run: stream-K's tests and sanitizers, then the suite in the rest
    quick
    CONVGEN_CACHE_DIR=/tmp/cg-suite timeout "${SUITE_S:-240}" $PYTEST --ignore=tests/test_stream_k_gpu.py \
        --ignore=tests/test_wgrad_gather.py 2>&1 | tee "$OUT/gpu-suite.log" | tail -8
}

quick() {  # verify without the whole suite (about 350 s): the new kernels' tests, the stem, memcheck
    install
    CONVGEN_CACHE_DIR=/tmp/cg-sk timeout 150 $PYTEST tests/test_stream_k_gpu.py tests/test_wgrad_gather.py 2>&1 \
        | tee "$OUT/stream-k-gpu.log" | tail -4
    # the stepped wgrad gather (thirty-fourth session): ResNet-50's stem, 327 us against cuDNN's 174 at d5be451 (H200)
    CONVGEN_CACHE_DIR=/tmp/cg-sk timeout 60 python3 -m convgen.cli bench --suite resnet50 --layers conv1 --pass wgrad \
        $BENCH --out "$OUT/stem-wgrad" 2>&1 | grep -E "^ *conv1 "
    CONVGEN_CACHE_DIR=/tmp/cg-sk timeout 70 python3 -m convgen.cli tune --suite resnet50 --layers conv1 --pass wgrad \
        --no-bias --log "$OUT/tune-stem-wgrad.json" > "$OUT/tune-stem-wgrad.log" 2>&1
    tail -2 "$OUT/tune-stem-wgrad.log"
    CONVGEN_CACHE_DIR=/tmp/cg-sk timeout 45 /usr/local/cuda/bin/compute-sanitizer --tool memcheck --report-api-errors no \
        python3 benchmarks/probes/sanitize_tma.py streamk > "$OUT/sanitize-streamk-memcheck.log" 2>&1
    tail -3 "$OUT/sanitize-streamk-memcheck.log"
}

gather() {  # the stepped wgrad gather (thirty-fourth session): every GPU wgrad test, then the changed kernels timed
    install
    CONVGEN_CACHE_DIR=/tmp/cg-g timeout 200 $PYTEST tests/test_wgrad_gather.py tests/test_stream_k_gpu.py \
        $(ls tests/test_*.py | grep -v -e test_wgrad_gather -e test_stream_k_gpu) -k "wgrad or gather or stream" 2>&1 \
        | tee "$OUT/wgrad-gpu.log" | tail -6
    for s in resnet50 resnet18 cifar-resnet speech darknet53-down; do  # the suites whose im2col wgrads changed
        CONVGEN_CACHE_DIR=/tmp/cg-g timeout 75 python3 -m convgen.cli bench --suite $s --pass wgrad $BENCH \
            --out "$OUT/wgrad-$s" 2>&1 | grep -E "^ *(conv1|stem|geomean speedup.*GPU)" | head -4
    done
    CONVGEN_CACHE_DIR=/tmp/cg-g timeout 45 /usr/local/cuda/bin/compute-sanitizer --tool memcheck --report-api-errors no \
        python3 benchmarks/probes/sanitize_tma.py streamk > "$OUT/sanitize-streamk-memcheck.log" 2>&1
    tail -3 "$OUT/sanitize-streamk-memcheck.log"
}

mini() {  # for a nearly spent budget (about 250 s): the new kernels' GPU tests and the stem's wgrad beside cuDNN
    install
    CONVGEN_CACHE_DIR=/tmp/cg-sk timeout 150 $PYTEST tests/test_wgrad_gather.py tests/test_stream_k_gpu.py 2>&1 \
        | tee "$OUT/mini-gpu.log" | tail -4
    CONVGEN_CACHE_DIR=/tmp/cg-sk timeout 60 python3 -m convgen.cli bench --suite resnet50 --layers conv1 --pass wgrad \
        $BENCH --out "$OUT/stem-wgrad" 2>&1 | grep -E "^ *conv1 "
}

gather_ab() {  # the stepped wgrad gather against the templates before it (268db0d), twice, on one machine:
    # the 35th session's cross-day comparison left cifar-resnet res1, darknet down1 and unet enc2a 6-8% slower
    install
    git worktree add -q /tmp/before 268db0d 2>&1 | tail -1
    for run in 1 2; do
        for side in before after; do
            for s in cifar-resnet darknet53-down unet; do
                if [ $side = before ]; then
                    (cd /tmp/before && PYTHONPATH=/tmp/before CONVGEN_BENCH_COMMIT=268db0d CONVGEN_CACHE_DIR=/tmp/cg-ab-$side timeout 45 python3 -m convgen.cli bench --suite $s \
                        --pass wgrad $BENCH --out "$OUT/gab/$side-$run-$s" 2>&1 | grep -E "geomean speedup.*GPU" | sed "s/^/$side $run $s /")
                else
                    CONVGEN_CACHE_DIR=/tmp/cg-ab-$side timeout 45 python3 -m convgen.cli bench --suite $s --pass wgrad $BENCH \
                        --out "$OUT/gab/$side-$run-$s" 2>&1 | grep -E "geomean speedup.*GPU" | sed "s/^/$side $run $s /"
                fi
            done
        done
    done
    for s in cifar-resnet darknet53-down unet; do
        python3 scripts/bench_compare.py "$OUT/gab/before-1-$s/"*.json "$OUT/gab/after-1-$s/"*.json | tail -1
        python3 scripts/bench_compare.py "$OUT/gab/before-2-$s/"*.json "$OUT/gab/after-2-$s/"*.json | tail -1
    done
}

hint_off_tree() {  # /tmp/before: this tree with cp.async's L2 hint defined empty
    rm -rf /tmp/before && mkdir -p /tmp/before && cp -r convgen templates pyproject.toml /tmp/before/
    sed -i 's|^#define CONVGEN_L2_PREFETCH ".L2::256B"$|#define CONVGEN_L2_PREFETCH ""|' /tmp/before/templates/include/convgen/device.h
    grep -c '^#define CONVGEN_L2_PREFETCH ""$' /tmp/before/templates/include/convgen/device.h
}

hint_ab() {  # NAME RUNS TIMEOUT SUITE[:PASS]...: each suite (one pass, or all) benched with the hint off
    # (/tmp/before) and on, RUNS times, compared; the results tarred as $OUT/NAME.tgz
    hint_off_tree
    trees_ab "$@"
}

trees_ab() {  # NAME RUNS TIMEOUT SUITE[:PASS]...: each suite (one pass, or all) benched on the tree in
    # /tmp/before and on this one, RUNS times, compared; the results tarred as $OUT/NAME.tgz
    local name=$1 runs=$2 limit=$3
    shift 3
    mkdir -p "$OUT/$name"
    for run in $(seq "$runs"); do
        for sp in "$@"; do
            local s=${sp%%:*} pass=() tag=${sp/:/-}  # one folder per suite and pass: a second pass of a suite
            [ "$sp" != "$s" ] && pass=(--pass "${sp#*:}")  # must not land beside the first (39th session)
            for side in before after; do
                local dir=$PWD
                [ $side = before ] && dir=/tmp/before
                (cd $dir && PYTHONPATH=$dir CONVGEN_CACHE_DIR=/tmp/cg-l2-$side timeout "$limit" python3 -m convgen.cli bench \
                    --suite $s "${pass[@]}" $BENCH --out "$OUT/$name/$side-$run-$tag" 2>&1 \
                    | grep -E "rror|geomean speedup.*GPU" | sed "s/^/$side $run $tag /")
            done
            python3 scripts/bench_compare.py "$OUT/$name/before-$run-$tag/"*.json "$OUT/$name/after-$run-$tag/"*.json \
                > "$OUT/$name/compare-$run-$tag.txt" 2>&1
            tail -4 "$OUT/$name/compare-$run-$tag.txt"
        done
    done
    (cd "$OUT" && tar czf "$name.tgz" "$name" && rm -rf "$name")  # the device returns 8 files a call
}

l2_ab() {  # cp.async's L2 prefetch hint (thirty-sixth session) on and off, on one machine: the before side is
    # this tree with CONVGEN_L2_PREFETCH defined empty (the device's git may not hold the commit before)
    install
    hint_ab l2 "${RUNS:-1}" 100 ${L2_SUITES:-mobilenetv2-pw mobilenetv2-dw resnet50 cifar-resnet}
}

l2_check() {  # the hint where it stays (pointwise dgrad's dy, depthwise wgrad's boxes): GPU tests, then on/off twice
    install
    CONVGEN_CACHE_DIR=/tmp/cg-l2c timeout 170 $PYTEST tests/test_depthwise_gpu.py tests/test_kernels_gpu.py -k "dgrad or depthwise" \
        2>&1 | tee "$OUT/l2-gpu-tests.log" | tail -4
    hint_ab l2c 2 40 mobilenetv2-pw:dgrad mobilenetv2-dw:wgrad convnext-dw:wgrad
}

verify36() {  # the thirty-sixth session's candidates: their GPU tests, then the tunes that time them (about 8 min)
    install
    CONVGEN_CACHE_DIR=/tmp/cg-v36 timeout 170 $PYTEST tests/test_kernels_gpu.py tests/test_depthwise_gpu.py \
        -k "fill_split or whole_pixel or tuning_variations or (suite_layers and pw112-16to96)" 2>&1 | tee "$OUT/v36-gpu-tests.log" | tail -4
    mkdir -p "$OUT/v36"
    CONVGEN_CACHE_DIR=/tmp/cg-v36 timeout 60 python3 -m convgen.cli tune --suite unet --layers head --pass wgrad --no-bias \
        --log "$OUT/v36/tune-unet-head-wgrad.json" > "$OUT/v36/tune-unet-head-wgrad.log" 2>&1
    tail -2 "$OUT/v36/tune-unet-head-wgrad.log"
    for p in fprop dgrad; do
        CONVGEN_CACHE_DIR=/tmp/cg-v36 timeout 150 python3 -m convgen.cli tune --suite mobilenetv2-dw \
            --layers dw144-56px,dw144-56px-s2 --pass $p --no-bias --log "$OUT/v36/tune-mobilenetv2-dw144-$p.json" \
            > "$OUT/v36/tune-mobilenetv2-dw144-$p.log" 2>&1
        tail -3 "$OUT/v36/tune-mobilenetv2-dw144-$p.log"
    done
    (cd "$OUT" && tar czf v36.tgz v36 && rm -rf v36)  # the device returns 8 files a call
}

verify37() {  # the thirty-seventh session's defaults: whole-pixel depthwise blocks, the head's 64-deep step (about 5 min)
    install
    CONVGEN_CACHE_DIR=/tmp/cg-v37 timeout 200 $PYTEST tests/test_depthwise_gpu.py tests/test_kernels_gpu.py \
        -k "whole_pixel or tuning_variations or (suite_layers and (dw144 or head))" 2>&1 | tee "$OUT/v37-gpu-tests.log" | tail -4
    mkdir -p "$OUT/v37"
    CONVGEN_CACHE_DIR=/tmp/cg-v37 timeout 150 python3 -m convgen.cli bench --suite mobilenetv2-dw $BENCH \
        --out "$OUT/v37/mobilenetv2-dw" 2>&1 | grep -E "^ *dw144|geomean speedup"
    CONVGEN_CACHE_DIR=/tmp/cg-v37 timeout 90 python3 -m convgen.cli bench --suite unet --layers head $BENCH \
        --out "$OUT/v37/unet-head" 2>&1 | grep -E "^ *head"
    (cd "$OUT" && tar czf v37.tgz v37 && rm -rf v37)  # the device returns 8 files a call
}

verify37b() {  # depthwise wgrad's slices for 4 blocks an SM, its grid twin second: GPU tests, then both suites timed
    install
    CONVGEN_CACHE_DIR=/tmp/cg-v37b timeout 200 $PYTEST tests/test_depthwise_gpu.py tests/test_split_reduce.py \
        tests/test_kernels_gpu.py -k "(depthwise and wgrad) or split_reduce or (suite_layers and (mobilenetv2-dw or convnext-dw))" 2>&1 | tee "$OUT/v37b-gpu-tests.log" | tail -4
    mkdir -p "$OUT/v37b"
    for s in mobilenetv2-dw convnext-dw; do
        CONVGEN_CACHE_DIR=/tmp/cg-v37b timeout 150 python3 -m convgen.cli bench --suite $s $BENCH \
            --out "$OUT/v37b/$s" 2>&1 | grep -E "geomean speedup"
    done
    (cd "$OUT" && tar czf v37b.tgz v37b && rm -rf v37b)
}

verify37c() {  # the pointwise wgrad TMA tiles priced with their operands: GPU tests, then the suites' wgrad timed
    install
    CONVGEN_CACHE_DIR=/tmp/cg-v37c timeout 150 $PYTEST tests/test_kernels_gpu.py tests/test_tma_gpu.py \
        -k "(suite_layers and wgrad and (pw7 or pw14 or l4-1x1)) or (tma and wgrad)" 2>&1 | tee "$OUT/v37c-gpu-tests.log" | tail -4
    mkdir -p "$OUT/v37c"
    for s in mobilenetv2-pw efficientnet-b0-pw; do
        CONVGEN_CACHE_DIR=/tmp/cg-v37c timeout 120 python3 -m convgen.cli bench --suite $s --pass wgrad $BENCH \
            --out "$OUT/v37c/$s" 2>&1 | grep -E "^ *pw(7|14)-|geomean speedup"
    done
    CONVGEN_CACHE_DIR=/tmp/cg-v37c timeout 60 python3 -m convgen.cli bench --suite resnet50 --layers l4-1x1 --pass wgrad \
        $BENCH --out "$OUT/v37c/resnet50-l4-1x1" 2>&1 | grep -E "^ *l4-1x1"
    (cd "$OUT" && tar czf v37c.tgz v37c && rm -rf v37c)
}

verify38() {  # depthwise wgrad summed in its grid by default: GPU tests, both suites' wgrad timed; resnext fprop tuned
    install
    CONVGEN_CACHE_DIR=/tmp/cg-v38 timeout 150 $PYTEST tests/test_split_reduce_gpu.py tests/test_depthwise_gpu.py \
        tests/test_autotune_gpu.py 2>&1 | tee "$OUT/v38-gpu-tests.log" | tail -3
    CONVGEN_CACHE_DIR=/tmp/cg-v38 timeout 120 $PYTEST tests/test_kernels_gpu.py \
        -k "suite_layers and (mobilenetv2-dw or convnext-dw)" 2>&1 | tee -a "$OUT/v38-gpu-tests.log" | tail -3
    mkdir -p "$OUT/v38"
    for s in mobilenetv2-dw convnext-dw; do
        CONVGEN_CACHE_DIR=/tmp/cg-v38 timeout 100 python3 -m convgen.cli bench --suite $s --pass wgrad $BENCH \
            --out "$OUT/v38/$s-wgrad" 2>&1 | grep -E "geomean speedup"
    done
    CONVGEN_CACHE_DIR=/tmp/cg-v38 timeout 100 python3 -m convgen.cli bench --suite resnext50-grouped --pass fprop $BENCH \
        --out "$OUT/v38/resnext50-grouped-fprop" 2>&1 | grep -E "geomean speedup"
    CONVGEN_CACHE_DIR=/tmp/cg-v38 timeout 180 python3 -m convgen.cli tune --suite resnext50-grouped --pass fprop --no-bias \
        --log "$OUT/v38/tune-resnext50-grouped-fprop.json" > "$OUT/v38/tune-resnext50-grouped-fprop.log" 2>&1
    tail -9 "$OUT/v38/tune-resnext50-grouped-fprop.log"
    (cd "$OUT" && tar czf v38.tgz v38 && rm -rf v38)
}

verify38b() {  # grouped fprop persistent, the depthwise fixes: GPU tests; resnext50-grouped and both depthwise suites timed
    install
    CONVGEN_CACHE_DIR=/tmp/cg-v38b timeout 170 $PYTEST tests/test_groups_gpu.py tests/test_group_pack_gpu.py \
        tests/test_split_reduce_gpu.py tests/test_depthwise_gpu.py tests/test_tma_gpu.py \
        -k "group or split or depthwise" 2>&1 | tee "$OUT/v38b-gpu-tests.log" | tail -3
    CONVGEN_CACHE_DIR=/tmp/cg-v38b timeout 90 $PYTEST tests/test_kernels_gpu.py -k "suite_layers and resnext50" 2>&1 \
        | tee -a "$OUT/v38b-gpu-tests.log" | tail -2
    mkdir -p "$OUT/v38b"
    for s in resnext50-grouped mobilenetv2-dw convnext-dw; do
        CONVGEN_CACHE_DIR=/tmp/cg-v38b timeout 120 python3 -m convgen.cli bench --suite $s $BENCH \
            --out "$OUT/v38b/$s" 2>&1 | grep -E "geomean speedup"
    done
    (cd "$OUT" && tar czf v38b.tgz v38b && rm -rf v38b)
}

verify38c() {  # wgrad's 192-wide tile on N = 576: GPU tests, then the changed rows timed (about 5 min)
    install
    CONVGEN_CACHE_DIR=/tmp/cg-v38c timeout 120 $PYTEST tests/test_tma_gpu.py tests/test_kernels_gpu.py \
        -k "(tma and wgrad) or (suite_layers and wgrad and (l1-3x3 or conv1_2 or enc2b or res3 or resnext50))" 2>&1 \
        | tee "$OUT/v38c-gpu-tests.log" | tail -3
    mkdir -p "$OUT/v38c"
    CONVGEN_CACHE_DIR=/tmp/cg-v38c timeout 90 python3 -m convgen.cli bench --suite resnext50-grouped --pass wgrad $BENCH \
        --out "$OUT/v38c/resnext50-grouped-wgrad" 2>&1 | grep -E "geomean speedup"
    CONVGEN_CACHE_DIR=/tmp/cg-v38c timeout 90 python3 -m convgen.cli bench --suite resnet50,resnet18,vgg16,unet,cifar-resnet \
        --layers l1-3x3,conv1_2,enc2b,res3 --pass wgrad $BENCH --out "$OUT/v38c/n576-wgrad" 2>&1 | grep -E "^ *(l1-3x3|conv1_2|enc2b|res3) "
    (cd "$OUT" && tar czf v38c.tgz v38c && rm -rf v38c)
}

tune_dw7() {  # ConvNeXt's 7x7 depthwise: the long-run candidate (runs of 8 over 4 channels) never timed (about 5 min)
    install
    # first, the thirty-seventh session's one GPU test not yet run: a tuned grid that is not resident falls back
    CONVGEN_CACHE_DIR=/tmp/cg-dw7 timeout 60 $PYTEST tests/test_split_reduce_gpu.py 2>&1 | tee "$OUT/split-reduce-gpu.log" | tail -3
    tune_passes dw7 110 convnext-dw fprop dgrad
}

sanitize_dw() {  # TAG CACHE: memcheck and racecheck on benchmarks/probes/sanitize_dw.py (the depthwise fprop forms,
    # each also checked against the exact reference), logs as $OUT/sanitize-TAG-TOOL.log
    for tool in memcheck racecheck; do
        CONVGEN_CACHE_DIR=$2 timeout 60 /usr/local/cuda/bin/compute-sanitizer --tool $tool \
            --report-api-errors no python3 benchmarks/probes/sanitize_dw.py > "$OUT/sanitize-$1-$tool.log" 2>&1
        echo "dw $tool: $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY|differ" "$OUT/sanitize-$1-$tool.log" \
            | grep -v " 0 of " | sort | uniq -c | head -6 | tr '\n' ' ')"
    done
}

tune_passes() {  # DIR LIMIT SUITE PASS...: each pass of SUITE tuned (no bias, dW alone), the logs tarred as $OUT/DIR.tgz
    local dir=$1 limit=$2 suite=$3
    shift 3
    mkdir -p "$OUT/$dir"
    for p in "$@"; do
        CONVGEN_CACHE_DIR=/tmp/cg-$dir timeout "$limit" python3 -m convgen.cli tune --suite "$suite" --pass "$p" --no-bias \
            --log "$OUT/$dir/tune-$suite-$p.json" > "$OUT/$dir/tune-$suite-$p.log" 2>&1
        tail -5 "$OUT/$dir/tune-$suite-$p.log"
    done
    (cd "$OUT" && tar czf "$dir.tgz" "$dir" && rm -rf "$dir")
}

s39b() {  # packed wgrad storing its own channels (055a879): GPU tests, resnext's wgrad against the tree before
    # (764c871's convgen and templates, carried as benchmarks/before-764c871.tgz), twice; ConvNeXt's 7x7 under ncu
    install
    CONVGEN_CACHE_DIR=/tmp/cg-s39b timeout 200 $PYTEST tests/test_group_pack_gpu.py tests/test_groups_gpu.py \
        2>&1 | tee "$OUT/packed-gpu-tests.log" | tail -4
    rm -rf /tmp/before && mkdir -p /tmp/before && tar xzf benchmarks/before-764c871.tgz -C /tmp/before
    trees_ab packed 2 60 resnext50-grouped:wgrad
    NCU_LAYERS="fprop 64 56 56 96 96 7 1 3 96" ncu_rows
}

s42() {  # the forty-first session's depthwise candidates (tiles fitted to 28/14/7-pixel outputs, 144d427; the
    # long run over whole 144/240-channel pixels and 48-channel chunks, 7233932) and tuning on first use of a
    # packed wgrad (44fa6fe): their GPU tests, then EfficientNet-B0's fprop and dgrad tuned (about 5 min)
    install
    CONVGEN_CACHE_DIR=/tmp/cg-s42 timeout 100 $PYTEST tests/test_group_pack_gpu.py -k "tune_times or first_use_tunes" \
        2>&1 | tee "$OUT/s42-gpu-tests.log" | tail -2
    CONVGEN_CACHE_DIR=/tmp/cg-s42 timeout 200 $PYTEST tests/test_depthwise_gpu.py -k "variations or fitted" 2>&1 \
        | tee -a "$OUT/s42-gpu-tests.log" | tail -2
    tune_passes s42-effnet 90 efficientnet-b0-dw fprop dgrad
}

s42b() {  # the fitted tiles on ConvNeXt's and MobileNetV2's 28/14/7-pixel rows, tuned; EfficientNet-B0's fprop benched
    # with tuning on first use (about 8 min)
    install
    tune_passes s42-convnext 60 convnext-dw fprop dgrad
    tune_passes s42-mbv2 90 mobilenetv2-dw fprop dgrad
    mkdir -p "$OUT/s42-autotune"
    CONVGEN_TUNED=1 CONVGEN_AUTOTUNE=1 CONVGEN_CACHE_DIR=/tmp/cg-s42at timeout 200 python3 -m convgen.cli bench --suite efficientnet-b0-dw \
        --pass fprop $BENCH --out "$OUT/s42-autotune" 2>&1 | grep -E "rror|geomean speedup"
    (cd "$OUT" && tar czf s42-autotune.tgz s42-autotune && rm -rf s42-autotune)
}

s41() {  # the long run as the 5-7 wide depthwise default (6c73621), EfficientNet-B0's depthwise suite (new) and
    # stream-K from 96 K-steps (12f76c3): checked, 5x5 tuned, timed against 40d7cdc's tree (about 9 min).
    # Before the call, on this machine: git archive 40d7cdc convgen templates pyproject.toml | gzip > benchmarks/before-s41.tgz
    install
    CONVGEN_CACHE_DIR=/tmp/cg-s41 timeout 100 $PYTEST tests/test_depthwise_gpu.py 2>&1 | tee "$OUT/s41-gpu-tests.log" | tail -2
    CONVGEN_CACHE_DIR=/tmp/cg-s41 timeout 100 $PYTEST tests/test_kernels_gpu.py -k "suite_layers and (efficientnet-b0-dw \
        or convnext-dw or (wgrad and (vgg16 or resnet18)))" 2>&1 | tee -a "$OUT/s41-gpu-tests.log" | tail -2
    tune_passes effnet-dw 75 efficientnet-b0-dw fprop dgrad
    rm -rf /tmp/before && mkdir -p /tmp/before && tar xzf benchmarks/before-s41.tgz -C /tmp/before
    trees_ab s41ab 1 60 convnext-dw:fprop convnext-dw:dgrad vgg16:wgrad resnet18:wgrad
    # the new suite has no "before": convgen against cuDNN alone, every pass
    CONVGEN_CACHE_DIR=/tmp/cg-s41 timeout 150 python3 -m convgen.cli bench --suite efficientnet-b0-dw $BENCH \
        --out "$OUT/effnet-bench" 2>&1 | grep -E "rror|geomean"
    (cd "$OUT" && tar czf effnet-bench.tgz effnet-bench && rm -rf effnet-bench)
}

s40() {  # stream-K's default (e7f7cd7) and the depthwise staging variant, each checked then timed (about 9 min).
    # Before the call, on this machine: git archive 9e97264 convgen templates pyproject.toml | gzip > benchmarks/before-s40.tgz
    # (the tree before stream-K's default; carried as an untracked file, never committed)
    install
    CONVGEN_CACHE_DIR=/tmp/cg-s40 timeout 150 $PYTEST tests/test_stream_k_gpu.py tests/test_kernels_gpu.py \
        -k "stream_k or (suite_layers and wgrad and (vgg or large))" 2>&1 | tee "$OUT/s40-gpu-tests.log" | tail -4
    rm -rf /tmp/before && mkdir -p /tmp/before && tar xzf benchmarks/before-s40.tgz -C /tmp/before
    trees_ab streamk-default 1 150 large:wgrad vgg16:wgrad
    # The staging variant with independent copies (benchmarks/probes/dw_stage_independent_copies.patch): does
    # it keep the walk's gains without dw32-112px's 15% loss?  Here /tmp/before is the VARIANT and "after"
    # this tree (the walk): A/B above 1 means the walk is faster.
    rm -rf /tmp/before && mkdir -p /tmp/before && cp -r convgen templates tests pyproject.toml /tmp/before/
    (cd /tmp/before && patch -s -p1 < "$OLDPWD/benchmarks/probes/dw_stage_independent_copies.patch" && \
        CONVGEN_CACHE_DIR=/tmp/cg-s40v PYTHONPATH=/tmp/before timeout 120 $PYTEST tests/test_depthwise_gpu.py 2>&1 | tail -2)
    trees_ab dwvariant 1 45 mobilenetv2-dw:fprop mobilenetv2-dw:dgrad convnext-dw:fprop
}

s40b() {  # stream-K's rule at its bounds, on layers the large suite's tune did not cover (about 5 min):
    # VGG-16's conv4_1 (36 tiles), conv4_2 (72, 392 K-steps: the rule's one untimed default) and conv5 (72, 98
    # K-steps), ResNet-18's l4 (72 and 36 tiles, 98 K-steps), Darknet-53's down4 (36, 256) and down5 (144, 64)
    install
    mkdir -p "$OUT/sk"
    for sl in vgg16:conv4_1,conv4_2,conv5 resnet18:l4-3x3,l4-3x3-down darknet53-down:down4,down5; do
        CONVGEN_CACHE_DIR=/tmp/cg-sk timeout 100 python3 -m convgen.cli tune --suite ${sl%%:*} --layers ${sl#*:} \
            --pass wgrad --no-bias --log "$OUT/sk/tune-${sl%%:*}-wgrad.json" > "$OUT/sk/tune-${sl%%:*}-wgrad.log" 2>&1
        grep -E "^[a-z]" "$OUT/sk/tune-${sl%%:*}-wgrad.log" | tail -4
    done
    (cd "$OUT" && tar czf sk.tgz sk && rm -rf sk)
}

s40c() {  # depthwise's wide run (runs of 8 over 8 channels, the third fprop/dgrad candidate on 5-7 wide filters,
    # never timed): ConvNeXt's fprop and dgrad tuned, and the variations' GPU test (about 5 min)
    install
    CONVGEN_CACHE_DIR=/tmp/cg-wide timeout 120 $PYTEST tests/test_depthwise_gpu.py -k variations 2>&1 | tail -2
    tune_passes wide 110 convnext-dw fprop dgrad
}

s39c() {  # the depthwise halo's walked copies (4f6e59d): depthwise GPU tests, both depthwise suites' fprop and
    # dgrad against the tree before (489329a, carried as benchmarks/before-dw.tgz), once (about 5 min)
    install
    CONVGEN_CACHE_DIR=/tmp/cg-s39c timeout 200 $PYTEST tests/test_depthwise_gpu.py 2>&1 | tee "$OUT/dw-gpu-tests.log" | tail -4
    rm -rf /tmp/before && mkdir -p /tmp/before && tar xzf benchmarks/before-dw.tgz -C /tmp/before
    trees_ab dwstage 1 45 mobilenetv2-dw:fprop convnext-dw:fprop mobilenetv2-dw:dgrad convnext-dw:dgrad
}

s39a() {  # ConvNeXt's 7x7 fprop under Nsight Compute (what bounds it), then the large suite's wgrad tuned (never tuned)
    install
    NCU_LAYERS="fprop 64 56 56 96 96 7 1 3 96;fprop 128 112 112 96 96 3 2 1 96" ncu_rows
    tune_suites 300 large
}

ncu_rows() {  # NCU_LAYERS (";"-separated layer_profile.py arguments) under Nsight Compute, both sides, stall reasons too
    local IFS=";"
    for layer in $NCU_LAYERS; do
        IFS=" "
        local name
        name=$(echo $layer | tr ' ' '-')
        timeout 60 python3 benchmarks/probes/layer_profile.py $layer 2>&1 | tail -1
        for side in convgen cudnn; do
            timeout 100 /usr/local/cuda/bin/ncu --nvtx --nvtx-include "$side/" --section SpeedOfLight \
                --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy --section LaunchStats \
                --section ComputeWorkloadAnalysis --section SchedulerStats --section InstructionStats $NCU_EXTRA \
                ${NCU_SOURCE:+-o /tmp/ncu-$name-$side -f} python3 benchmarks/probes/layer_profile.py $layer \
                > "$OUT/ncu-$name-$side.log" 2>&1
            if [ -n "${NCU_SOURCE:-}" ]; then  # SASS with its stall samples, per kernel (the report itself stays here)
                /usr/local/cuda/bin/ncu -i /tmp/ncu-$name-$side.ncu-rep --page source --csv --print-source sass \
                    > "$OUT/ncu-$name-$side-source.csv" 2>&1
                /usr/local/cuda/bin/ncu -i /tmp/ncu-$name-$side.ncu-rep > "$OUT/ncu-$name-$side.log" 2>&1
            fi
            grep -E "^  [A-Za-z_].*\(|Duration|Memory Throughput|DRAM Throughput|Compute \(SM\) Th|Achieved Occ|Registers Per|Block Size|Grid Size|Issue Slots Busy|Warp Cycles Per Issued|L1/TEX Hit|L2 Hit|Theoretical Occ|Stall|No Eligible|Eligible Warps" \
                "$OUT/ncu-$name-$side.log" | head -50
        done
    done
    (cd "$OUT" && tar czf ncu.tgz ncu-*.log $(ls ncu-*.csv 2>/dev/null) && rm -f ncu-*.log ncu-*.csv)
}

cluster() {  # thread-block clusters of two sharing the weights' tile (TmaWgmma.cluster, forty-second session,
    # not yet run on a GPU): GPU tests, compute-sanitizer, then the planner's fprop against its twins in clusters of
    # two on the large and resnet50 suites, twice (about 8 min)
    install
    CONVGEN_CACHE_DIR=/tmp/cg-cl timeout 150 $PYTEST tests/test_tma_cluster_gpu.py 2>&1 | tee "$OUT/cluster-gpu-tests.log" \
        | tail -3
    for tool in memcheck racecheck synccheck; do
        CONVGEN_CACHE_DIR=/tmp/cg-cl timeout 60 /usr/local/cuda/bin/compute-sanitizer --tool $tool --report-api-errors no \
            python3 benchmarks/probes/sanitize_tma.py cluster > "$OUT/cluster-sanitize-$tool.log" 2>&1
        grep -E "ERROR SUMMARY|RACECHECK SUMMARY|differ" "$OUT/cluster-sanitize-$tool.log" | sort | uniq -c | head -6
    done
    cluster_ab "${CLUSTER_RUNS:-2}"
    (cd "$OUT" && tar czf cluster.tgz cluster cluster-sanitize-*.log && rm -rf cluster cluster-sanitize-*.log)
}

twin_ab() {  # TWIN RUNS: the planner's plans against their TWIN twins (tma_twin_probe.py), on large and resnet50,
    # in the pass TWIN_PASS names (fprop by default; dgrad's twins run at stride 1 only)
    mkdir -p "$OUT/$1"
    for run in $(seq "$2"); do
        for s in large resnet50; do
            for t in none "$1"; do
                TWIN=$t CONVGEN_CACHE_DIR=/tmp/cg-tw$t timeout 80 python3 benchmarks/probes/tma_twin_probe.py bench \
                    --suite $s --pass "${TWIN_PASS:-fprop}" $BENCH --out "$OUT/$1/$t-$s-$run" 2>&1 \
                    | grep -E "rror|geomean" | head -2
            done
            python3 scripts/bench_compare.py "$OUT/$1/none-$s-$run/"*.json "$OUT/$1/$1-$s-$run/"*.json \
                > "$OUT/$1/compare-$s-$run.txt" 2>&1
            tail -3 "$OUT/$1/compare-$s-$run.txt"
        done
    done
}

cluster_ab() { twin_ab cluster "$1"; }

step_batch() {  # issue 18's training step where the GPU, not torch's host work, sets the pace (about 6 min): at
    # batch 256 both sides' compiled steps take 1.3-1.9 ms of host time over 0.2-0.4 ms of GPU work (thirty-second
    # session's profile: the same phases, the same cost), so their ratio is 1.0 plus noise whatever the kernels do;
    # at batch 2048 the GPU work is about 8x, and the ratio shows the kernels
    install
    for b in 256 2048; do
        timeout 270 python3 examples/train_step.py --batch $b --steps 30 --warmup 10 2>&1 \
            | tee "$OUT/train-step-batch$b.log" | tail -8
    done
}

dw_ablate() {  # where depthwise fprop's time goes (about 5 min): each kernel as emitted, without its later halo
    # copies, with half its filter rows, and both (benchmarks/probes/dw_ablation_probe.py), on ConvNeXt's four 7x7
    # layers and two of MobileNetV2's 3x3 ones
    install
    mkdir -p "$OUT/ablate"
    for a in none nostage halftaps both; do
        ABLATE=$a CONVGEN_CACHE_DIR=/tmp/cg-ab$a timeout 70 python3 benchmarks/probes/dw_ablation_probe.py bench \
            --suite convnext-dw,mobilenetv2-dw --layers dw96-56px,dw192-28px,dw384-14px,dw768-7px,dw144-56px,dw96-112px-s2 \
            --pass fprop $BENCH --out "$OUT/ablate/$a" 2>&1 | grep -E "rror" | head -2
        [ $a = none ] || python3 scripts/bench_compare.py "$OUT/ablate/none/"*.json "$OUT/ablate/$a/"*.json \
            > "$OUT/ablate/compare-$a.txt" 2>&1
    done
    for a in nostage halftaps both; do echo "== $a"; grep -E "fprop" "$OUT/ablate/compare-$a.txt"; done
    (cd "$OUT" && tar czf ablate.tgz ablate && rm -rf ablate)
}

s44one() {  # issue 17's twins in one call (about 8.5 min): the store's and the clusters' GPU tests but the fuzz, then, if they
    # pass, the planner's fprop against its store twins and its cluster twins on large and resnet50 (one baseline
    # run a suite, shared by both twins)
    install
    CONVGEN_CACHE_DIR=/tmp/cg-st timeout 150 $PYTEST tests/test_tma_store_gpu.py tests/test_tma_cluster_gpu.py \
        -k "not fuzz" 2>&1 | tee "$OUT/s44-twins-gpu-tests.log" | tail -4  # the fuzz runs in s44
    if ! grep -qE "^[0-9]+ passed" <(tail -1 "$OUT/s44-twins-gpu-tests.log"); then
        echo "s44one: the twins' GPU tests did not all pass; no A/B"
        return
    fi
    mkdir -p "$OUT/twins"
    for s in large resnet50; do
        for t in none store cluster; do
            TWIN=$t CONVGEN_CACHE_DIR=/tmp/cg-tw$t timeout 75 python3 benchmarks/probes/tma_twin_probe.py bench \
                --suite $s --pass fprop $BENCH --out "$OUT/twins/$t-$s" 2>&1 | grep -E "rror|geomean speedup" | head -2
        done
        for t in store cluster; do
            python3 scripts/bench_compare.py "$OUT/twins/none-$s/"*.json "$OUT/twins/$t-$s/"*.json \
                > "$OUT/twins/compare-$t-$s.txt" 2>&1
            echo "$t $s: $(grep -E "^geomean|rror" "$OUT/twins/compare-$t-$s.txt" | tr '\n' ' ')"
        done
    done
    (cd "$OUT" && tar czf twins.tgz twins && rm -rf twins)
}

s49() {  # the forty-eighth session's first call (about 9 min): s48b (autotune's GPU tests, MobileNetV2's pointwise
    # suite with tuning on first use, against the forty-seventh session's prediction), then ncu-mma (the mma.sync
    # stencil's GPU tests since its jobs went to every warp, ConvNeXt's fprop tuned again, Nsight Compute on it)
    s48b
    ncu_mma
}

s50() {  # stream-K's cut tiles summed in its own kernel (split_reduce "grid", the forty-eighth session; about 9 min):
    # its GPU tests (both forms, and bit-for-bit against each other), the 72-tile layers tuned (the grid form
    # beside its kernel-summed twin), resnet18's and vgg16's wgrad benched, then memcheck and racecheck, each
    # step only while S50_BUDGET seconds (default 540) allow
    install
    local budget=${S50_BUDGET:-540}
    CONVGEN_CACHE_DIR=/tmp/cg-sk timeout 170 $PYTEST tests/test_stream_k_gpu.py 2>&1 | tee "$OUT/s50-stream-k-gpu.log" \
        | tail -3
    grep -qE "^[0-9]+ passed" <(tail -1 "$OUT/s50-stream-k-gpu.log") || return 1
    mkdir -p "$OUT/sk50"
    for sl in resnet18:l4-3x3 vgg16:conv5,conv4_2; do
        [ $SECONDS -lt $((budget - 200)) ] || break
        CONVGEN_CACHE_DIR=/tmp/cg-sk timeout 100 python3 -m convgen.cli tune --suite ${sl%%:*} --layers ${sl#*:} \
            --pass wgrad --no-bias --log "$OUT/sk50/tune-${sl%%:*}-wgrad.json" > "$OUT/sk50/tune-${sl%%:*}-wgrad.log" 2>&1
        grep -E "^[a-z]" "$OUT/sk50/tune-${sl%%:*}-wgrad.log" | tail -4
    done
    (cd "$OUT" && tar czf sk50.tgz sk50 && rm -rf sk50)
    for s in resnet18 vgg16 large; do
        [ $SECONDS -lt $((budget - 120)) ] || break
        CONVGEN_CACHE_DIR=/tmp/cg-sk timeout 90 python3 -m convgen.cli bench --suite $s --pass wgrad $BENCH \
            --out "$OUT/s50-$s-wgrad" 2>&1 | grep -E "rror|geomean speedup.*GPU" | head -3
    done
    for tool in memcheck racecheck; do
        [ $SECONDS -lt $((budget - 50)) ] || break
        CONVGEN_CACHE_DIR=/tmp/cg-sk timeout 45 /usr/local/cuda/bin/compute-sanitizer --tool $tool --report-api-errors no \
            python3 benchmarks/probes/sanitize_tma.py streamk > "$OUT/s50-sanitize-streamk-$tool.log" 2>&1
        tail -2 "$OUT/s50-sanitize-streamk-$tool.log"
    done
}

s51() {  # stream-K's two forms (cut tiles summed by a second kernel, or in the kernel after a grid-wide barrier)
    # and two tiles (128x256, 128x128) on one machine, on the 72-tile layers (about 5 min): s50 found the 128x128
    # grid form fastest in tuning, but its 128x256 default slower than the kernel form on another day's H100
    install
    mkdir -p "$OUT/skf"
    for sl in resnet18:l4-3x3 large:vgg-conv5,vgg-conv4_2; do
        for cfg in kernel: grid: kernel:128x128 grid:128x128; do
            local red=${cfg%%:*} tile=${cfg#*:} tag=${cfg/:/}
            [ $SECONDS -lt 520 ] || break
            (cd benchmarks/probes && SK_REDUCE=$red SK_TILE=$tile CONVGEN_CACHE_DIR=/tmp/cg-skf-$tag timeout 80 \
                python3 stream_k_forms_probe.py bench --suite ${sl%%:*} --layers ${sl#*:} --pass wgrad $BENCH \
                --out "$OUT/skf/$tag-${sl%%:*}" 2>&1 | grep -E "rror|geomean speedup.*GPU" | sed "s/^/$tag ${sl%%:*} /")
        done
        for pair in "kernel grid" "kernel128x128 grid128x128" "grid grid128x128"; do
            set -- $pair
            python3 scripts/bench_compare.py "$OUT/skf/$1-${sl%%:*}/"*.json "$OUT/skf/$2-${sl%%:*}/"*.json \
                > "$OUT/skf/compare-$1-$2-${sl%%:*}.txt" 2>&1
            echo "$1 -> $2 ${sl%%:*}: $(tail -1 "$OUT/skf/compare-$1-$2-${sl%%:*}.txt")"
        done
    done
    (cd "$OUT" && tar czf skf.tgz skf && rm -rf skf)
}

s58() {  # Nsight Compute on l4-3x3's new stream-K default (grid form) with its SASS's stall samples (about 3 min):
    # where the third of the cycles the tensor pipe idles goes (s53: 67.8% busy before the slots)
    install
    NCU_SOURCE=1 NCU_EXTRA="--section SourceCounters" NCU_LAYERS="wgrad 128 7 7 512 512 3 1 1" ncu_rows
}

s60() {  # the fiftieth session's rules benched beside cuDNN (about 90 s): UNet's dec1-cat96 and dec2-cat192
    # dgrad (exactly-N tiles), ResNet-18's l4-3x3-down and Darknet's down4-5 dgrad (a block's fill and drain)
    install
    mkdir -p "$OUT/s60"
    for sl in unet:dec1-cat96,dec2-cat192 resnet18:l4-3x3-down darknet53-down:down4,down5; do
        CONVGEN_CACHE_DIR=/tmp/cg-s60 timeout 60 python3 -m convgen.cli bench --suite ${sl%%:*} --layers ${sl#*:} \
            --pass dgrad $BENCH --out "$OUT/s60/${sl%%:*}-dgrad" 2>&1 | grep -E "rror|^dec|^l4|^down" | head -4
    done
    (cd "$OUT" && tar czf s60.tgz s60 && rm -rf s60)
}

unrun_tests() {  # the GPU tests written since their last GPU run (logs prefixed $1): stream-K's default and its
    # Sum<4> reduction (f22eb99), the tuner's exactly-N-wide tiles (fiftieth session)
    install
    CONVGEN_CACHE_DIR=/tmp/cg-fw57 timeout 150 $PYTEST tests/test_stream_k_gpu.py 2>&1 | tee "$OUT/$1-stream-k-gpu.log" | tail -2
    CONVGEN_CACHE_DIR=/tmp/cg-fw57 timeout 150 $PYTEST tests/test_kernels_gpu.py tests/test_tma_gpu.py \
        -k "(every_halo_candidate and unet) or (persistent and 128x192)" 2>&1 | tee "$OUT/$1-exact-tiles-gpu.log" | tail -2
}

s59() {  # the fiftieth session's one call (about 9 min): the GPU tests of what has not run (stream-K's default and
    # its Sum<4> reduction; the tuner's exactly-N-wide tiles), then Darknet-53's and ResNet-18's dgrad benched
    # (e32b355: residue-class blocks costed longest first), then s57's tuning in the time left
    unrun_tests s59
    mkdir -p "$OUT/s59"
    for sl in darknet53-down:down3,down4,down5 resnet18:l3-3x3-down,l4-3x3-down; do
        CONVGEN_CACHE_DIR=/tmp/cg-fw57 timeout 100 python3 -m convgen.cli bench --suite ${sl%%:*} --layers ${sl#*:} \
            --pass dgrad $BENCH --out "$OUT/s59/${sl%%:*}-dgrad" 2>&1 | grep -E "rror|^down|^l[34]|geomean speedup.*GPU" | head -8
    done
    (cd "$OUT" && tar czf s59.tgz s59 && rm -rf s59)
    S57_TESTS=0 s57
}

s57() {  # the split-K wgrads with few tiles tuned again now that stream-K's parts are cheap (the forty-ninth
    # session's first; about 7 min): large's vgg-conv3_2 (0.78x cuDNN at 32 slices) and vgg-conv2_2, Darknet's
    # down3-5, resnet50's l4-3x3; each log times stream-K's candidates (kernel and grid forms) beside the default.
    # First stream-K's GPU tests: the planner's default (grid form, cooperative) and the reduction kernel's sums
    # through Sum<4> (f22eb99), both written after s54's run
    [ "${S57_TESTS:-1}" = 1 ] && unrun_tests s57
    mkdir -p "$OUT/fw57"
    # suite:layers:pass; UNet's dgrad first (dec1-cat96 0.48x cuDNN, dec2-cat192 0.79x): tiles exactly N wide, new
    # to the tuner (96-wide halo tiles; a persistent 128x192 TMA tile)
    for slp in unet:dec1-cat96,dec2-cat192:dgrad large:vgg-conv3_2,vgg-conv2_2:wgrad darknet53-down:down3,down4,down5:wgrad \
            resnet50:l4-3x3,l4-1x1:wgrad resnet50:l4-1x1:fprop; do
        [ $SECONDS -lt ${S57_BUDGET:-440} ] || break
        local s=${slp%%:*} l=${slp#*:}; local p=${l##*:}; l=${l%:*}
        CONVGEN_CACHE_DIR=/tmp/cg-fw57 timeout 150 python3 -m convgen.cli tune --suite $s --layers $l \
            --pass $p --no-bias --log "$OUT/fw57/tune-$s-$p.json" > "$OUT/fw57/tune-$s-$p.log" 2>&1
        grep -E "^[a-z]" "$OUT/fw57/tune-$s-$p.log" | tail -5
    done
    (cd "$OUT" && tar czf fw57.tgz fw57 && rm -rf fw57)
}

s56() {  # stream-K's new default (grid form, slots from the accumulators; 527ab10) benched against cuDNN on the
    # suites whose wgrads it takes (about 4 min): resnet18, vgg16, then large while S56_BUDGET (default 230) s allow
    install
    for s in resnet18 vgg16 large; do
        [ $SECONDS -lt $((${S56_BUDGET:-230} - 60)) ] || break
        CONVGEN_CACHE_DIR=/tmp/cg-s56 timeout $((${S56_BUDGET:-230} - SECONDS)) python3 -m convgen.cli bench --suite $s \
            --pass wgrad $BENCH --out "$OUT/s56-$s-wgrad" 2>&1 | grep -E "rror|geomean speedup.*GPU|compute-bound:" | head -8
    done
    (cd "$OUT" && tar czf s56.tgz s56-* && rm -rf s56-*)
}

s55() {  # stream-K's two forms again now that parts go from the accumulators (a3e43f5; about 3 min): the 128x256
    # kernel form (the default) against the grid form on the 72-tile layers, then large's wgrad before/after if time allows
    install
    mkdir -p "$OUT/skf55"
    for sl in resnet18:l4-3x3 large:vgg-conv5,vgg-conv4_2; do
        for red in kernel grid; do
            (cd benchmarks/probes && SK_REDUCE=$red SK_TILE= CONVGEN_CACHE_DIR=/tmp/cg-skf-$red timeout 80 \
                python3 stream_k_forms_probe.py bench --suite ${sl%%:*} --layers ${sl#*:} --pass wgrad $BENCH \
                --out "$OUT/skf55/$red-${sl%%:*}" 2>&1 | grep -E "rror|geomean speedup.*GPU" | sed "s/^/$red ${sl%%:*} /")
        done
        python3 scripts/bench_compare.py "$OUT/skf55/kernel-${sl%%:*}/"*.json "$OUT/skf55/grid-${sl%%:*}/"*.json \
            > "$OUT/skf55/compare-${sl%%:*}.txt" 2>&1
        tail -4 "$OUT/skf55/compare-${sl%%:*}.txt"
    done
    (cd "$OUT" && tar czf skf55.tgz skf55 && rm -rf skf55)
    if [ $SECONDS -lt ${S55_LARGE_BY:-200} ]; then
        rm -rf /tmp/before && mkdir -p /tmp/before && tar xzf benchmarks/before-524c28e.tgz -C /tmp/before
        trees_ab sk55 1 120 large:wgrad
    fi
}

s54() {  # stream-K's parts stored from the accumulators (9270f77; about 8 min): its GPU tests (both forms, bit for bit
    # against each other), then the tree before (524c28e, carried untracked as benchmarks/before-524c28e.tgz, made with
    # `git archive 524c28e convgen templates | gzip > benchmarks/before-524c28e.tgz`; never committed) and
    # this one on resnet18's and vgg16's wgrad (their 72-tile stream-K defaults), then memcheck, then large's wgrad
    install
    CONVGEN_CACHE_DIR=/tmp/cg-sk timeout 170 $PYTEST tests/test_stream_k_gpu.py 2>&1 | tee "$OUT/s54-stream-k-gpu.log" \
        | tail -3
    grep -qE "^[0-9]+ passed" <(tail -1 "$OUT/s54-stream-k-gpu.log") || return 1
    rm -rf /tmp/before && mkdir -p /tmp/before && tar xzf benchmarks/before-524c28e.tgz -C /tmp/before
    trees_ab sk54 1 100 resnet18:wgrad vgg16:wgrad
    CONVGEN_CACHE_DIR=/tmp/cg-sk timeout 45 /usr/local/cuda/bin/compute-sanitizer --tool memcheck --report-api-errors no \
        python3 benchmarks/probes/sanitize_tma.py streamk > "$OUT/s54-sanitize-streamk-memcheck.log" 2>&1
    tail -2 "$OUT/s54-sanitize-streamk-memcheck.log"
    [ $SECONDS -lt ${S54_LARGE_BY:-430} ] && trees_ab sk54b 1 120 large:wgrad
}

s53() {  # the forty-ninth session's first call (about 8 min): what has never run on a GPU (autotune's timing in
    # turns behind an L2 flush; the mma.sync stencil's jobs on every warp), then Nsight Compute on ResNet-18's l4-3x3
    # wgrad (the 128x256 stream-K default, 65 us against cuDNN's 53-56 on the H100) beside cuDNN, then MobileNetV2's
    # pointwise fprop benched with tuning on first use in the time left
    install
    CONVGEN_CACHE_DIR=/tmp/cg-at timeout 70 $PYTEST tests/test_autotune_gpu.py 2>&1 | tee "$OUT/s53-autotune-gpu.log" \
        | tail -2
    CONVGEN_CACHE_DIR=/tmp/cg-mma timeout 120 $PYTEST tests/test_depthwise_gpu.py -k mma 2>&1 \
        | tee "$OUT/s53-mma-gpu.log" | tail -2
    NCU_EXTRA="--section SourceCounters" NCU_LAYERS="wgrad 128 7 7 512 512 3 1 1" ncu_rows
    CONVGEN_TUNED=1 CONVGEN_AUTOTUNE=1 CONVGEN_CACHE_DIR=/tmp/cg-at53 timeout $((520 - SECONDS)) python3 -m convgen.cli \
        bench --suite mobilenetv2-pw --pass fprop $BENCH --out "$OUT/s53-at" 2>&1 | grep -E "rror|geomean speedup|below 300"
    (cd "$OUT" && tar czf s53-at.tgz s53-at && rm -rf s53-at)
}

s52() {  # the least worth a last short lease (about 3 min): autotune's GPU tests (its timing in turns behind an
    # L2 flush, never run on a GPU), then MobileNetV2's pointwise fprop benched with tuning on first use
    install
    CONVGEN_CACHE_DIR=/tmp/cg-at timeout 70 $PYTEST tests/test_autotune_gpu.py 2>&1 | tee "$OUT/s52-autotune-gpu.log" \
        | tail -2
    CONVGEN_TUNED=1 CONVGEN_AUTOTUNE=1 CONVGEN_CACHE_DIR=/tmp/cg-at52 timeout $((200 - SECONDS)) python3 -m convgen.cli \
        bench --suite mobilenetv2-pw --pass fprop $BENCH --out "$OUT/s52-at" 2>&1 | grep -E "rror|geomean speedup|below 300"
}

ncu_mma() {  # the restaged mma.sync stencil (about 6 min): its GPU tests since its jobs went to every warp
    # (11aec81), ConvNeXt's fprop tuned again (the stencil beside the held default), then Nsight Compute on
    # dw96-56px's first mma.sync candidate (PROFILE_PLAN) beside cuDNN; the held default's profile is ncu-dw46's
    install
    CONVGEN_CACHE_DIR=/tmp/cg-mma timeout 120 $PYTEST tests/test_depthwise_gpu.py -k mma 2>&1 | tail -2
    tune_passes mma49 130 convnext-dw fprop
    PROFILE_PLAN=mma NCU_LAYERS="fprop 64 56 56 96 96 7 1 3 96" ncu_rows
}

s48b() {  # a short lease (about 3 min): autotune's GPU tests (its timing in turns behind an L2 flush), then
    # MobileNetV2's pointwise suite benched with tuning on first use
    install
    CONVGEN_CACHE_DIR=/tmp/cg-at timeout 60 $PYTEST tests/test_autotune_gpu.py 2>&1 | tee "$OUT/s48b-autotune-gpu.log" \
        | tail -2
    AT_SUITES=mobilenetv2-pw README_BUDGET=$((170 - SECONDS)) s48at
}

s48() {  # the forty-seventh session's call (about 9.5 min): the mma.sync stencil restaged (cp.async halo, turned
    # channel-major by ldmatrix.trans, epilogue from registers): its GPU tests and racecheck / memcheck, then
    # ConvNeXt's fprop tuned (every candidate timed, the stencil beside the held default); then issue 16's suites
    # under 1.0x at the defaults, benched with tuning on first use (s48at), in the time left
    install
    CONVGEN_CACHE_DIR=/tmp/cg-mma timeout 150 $PYTEST tests/test_depthwise_gpu.py -k mma 2>&1 \
        | tee "$OUT/s48-mma-gpu-tests.log" | tail -3
    if grep -qE "^[0-9]+ passed" <(tail -1 "$OUT/s48-mma-gpu-tests.log"); then
        sanitize_dw mma /tmp/cg-mma
        tune_passes mma48 130 convnext-dw fprop
        python3 - "$OUT/mma48.tgz" <<'PY'
import json, sys, tarfile
with tarfile.open(sys.argv[1]) as t:
    for m in t.getmembers():
        if m.name.endswith(".json"):
            for layer in json.load(t.extractfile(m))["layers"]:
                rows = [r for r in layer["rows"] if r.get("ok") and r.get("us")]
                default = next((r["us"] for r in rows if r.get("default")), None)
                mma = min((r["us"] for r in rows if r["plan"].get("dw_mma")), default=None)
                best = min(r["us"] for r in rows)
                print(f"{layer['layer']:12s} default {default} best {best:.1f} mma {mma}")
PY
    else
        echo "s48: the mma.sync stencil's GPU tests did not all pass; no tuning"
    fi
    README_BUDGET=$((440 - SECONDS)) s48at
}

s48at() {  # issue 16's 1.0x with tuning on first use, on the suites whose defaults read under 1.0x on the H100
    # (forty-sixth / forty-seventh sessions): README's bench with CONVGEN_TUNED=1 CONVGEN_AUTOTUNE=1 and an empty
    # database, so every row is tuned on its first call; $AT_SUITES (default: the pointwise suites, EfficientNet-B0's
    # depthwise suite), as many as fit in 520 s
    CONVGEN_TUNED=1 CONVGEN_AUTOTUNE=1 README_SUITES="${AT_SUITES:-efficientnet-b0-pw mobilenetv2-pw efficientnet-b0-dw}" \
        readme
    (cd "$OUT" && mv readme.tgz autotune.tgz)
}

s47() {  # the forty-sixth session's depthwise wgrad (16-channel blocks and runs of two dy rows on 7x7; row-run
    # candidates everywhere) in one call (about 7 min): every depthwise GPU test, the three depthwise suites benched
    # against cuDNN, then EfficientNet-B0's and MobileNetV2's wgrad tuned (their row runs never timed)
    install
    CONVGEN_CACHE_DIR=/tmp/cg-s47 timeout 150 $PYTEST tests/test_depthwise_gpu.py 2>&1 \
        | tee "$OUT/s47-dw-gpu-tests.log" | tail -3
    README_SUITES="convnext-dw mobilenetv2-dw efficientnet-b0-dw" readme
    tune_passes dw47 110 efficientnet-b0-dw wgrad
    tune_passes dw47b 110 mobilenetv2-dw wgrad
}

s47b() {  # issue 17's 30-60 GFLOP 3x3 rows under its per-layer rate (forty-sixth session's H100 runs): tuned, to
    # learn whether a rule reaches them (about 8 min): resnet18's and vgg16's wgrad (7-14 pixel 512-channel rows at
    # 0.81-0.82x cuDNN), darknet53-down's stride-2 dgrad (426-599 TFLOP/s)
    install
    tune_passes r18w 150 resnet18 wgrad
    tune_passes vggw 150 vgg16 wgrad
    tune_passes dkd 150 darknet53-down dgrad
}

s45dw() {  # the depthwise fprop candidates of the forty-fifth session (issue 21) in one call (about 6 min): the
    # held-filter and mma.sync stencils' GPU tests (exact tier, bf16, epilogues, fuzz), then `convgen tune` on
    # ConvNeXt's and EfficientNet-B0's fprop, whose logs time each beside the default; tarred as $OUT/dw45*.tgz
    install
    CONVGEN_CACHE_DIR=/tmp/cg-dw45 timeout 150 $PYTEST tests/test_depthwise_gpu.py -k "held or mma" 2>&1 \
        | tee "$OUT/s45-held-gpu-tests.log" | tail -4
    if ! grep -qE "^[0-9]+ passed" <(tail -1 "$OUT/s45-held-gpu-tests.log"); then
        echo "s45dw: the held-filter and mma.sync stencils' GPU tests did not all pass; no tuning"
        return
    fi
    sanitize_dw dw /tmp/cg-dw45
    tune_passes dw45 110 convnext-dw fprop
    tune_passes dw45b 120 efficientnet-b0-dw fprop
    python3 - "$OUT" <<'PY'
import json, pathlib, sys, tarfile
for tgz in sorted(pathlib.Path(sys.argv[1]).glob("dw45*.tgz")):
    with tarfile.open(tgz) as t:
        for m in t.getmembers():
            if not m.name.endswith(".json"):
                continue
            for layer in json.load(t.extractfile(m))["layers"]:
                rows = [r for r in layer["rows"] if r.get("ok") and r.get("us")]
                default = next((r["us"] for r in rows if r.get("default")), None)
                held = sorted((round(r["us"], 1), r["plan"].get("dw_out_rows", 1), r["plan"]["depthwise"], r["plan"]["vec_a"])
                              for r in rows if r["plan"].get("dw_out_rows", 1) > 1)
                mma = sorted((round(r["us"], 1), r["plan"]["block_m"], r["plan"]["tile_w"], r["plan"]["block_n"])
                             for r in rows if r["plan"].get("dw_mma"))
                best = min(r["us"] for r in rows) if rows else None
                print(layer["layer"], layer["pass"], f"default {default} best {best} held (us, rows, cols, vec)", held[:4],
                      "mma (us, pixels, tile_w, chunk)", mma[:3])
PY
}

s44() {  # one call for all that has not run since 40d7cdc (about 9.5 min): the TMA store's and the clusters' GPU
    # tests first (a hang there is a barrier fault, found before the rest), then every other GPU test, then
    # racecheck on the store's cases and memcheck on the clusters'
    install
    CONVGEN_CACHE_DIR=/tmp/cg-suite timeout 150 $PYTEST tests/test_tma_store_gpu.py tests/test_tma_cluster_gpu.py 2>&1 \
        | tee "$OUT/s44-twins-gpu-tests.log" | tail -4
    CONVGEN_CACHE_DIR=/tmp/cg-suite timeout "${SUITE_S:-330}" $PYTEST --ignore=tests/test_tma_store_gpu.py \
        --ignore=tests/test_tma_cluster_gpu.py 2>&1 | tee "$OUT/gpu-suite.log" | tail -8
    for run in "store racecheck" "cluster memcheck"; do
        set -- $run
        CONVGEN_CACHE_DIR=/tmp/cg-suite timeout 45 /usr/local/cuda/bin/compute-sanitizer --tool $2 --report-api-errors no \
            python3 benchmarks/probes/sanitize_tma.py $1 > "$OUT/sanitize-$1-$2.log" 2>&1
        echo "$1 $2: $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY|differ" "$OUT/sanitize-$1-$2.log" | sort | uniq -c \
            | head -6 | tr '\n' ' ')"
    done
}

s43() {  # what no GPU has run (about 7 min): the GPU tests of the TMA store (forty-third session), the cluster
    # twins, the depthwise fitted tiles and spare lanes, packed-wgrad tuning and tuning on first use; memcheck and
    # racecheck on the store's and the clusters' cases
    install
    CONVGEN_CACHE_DIR=/tmp/cg-st timeout 250 $PYTEST tests/test_tma_store_gpu.py tests/test_tma_cluster_gpu.py \
        tests/test_depthwise_gpu.py tests/test_group_pack_gpu.py tests/test_autotune_gpu.py 2>&1 \
        | tee "$OUT/s43-gpu-tests.log" | tail -4
    for case in store cluster; do
        for tool in memcheck racecheck; do
            CONVGEN_CACHE_DIR=/tmp/cg-st timeout 60 /usr/local/cuda/bin/compute-sanitizer --tool $tool \
                --report-api-errors no python3 benchmarks/probes/sanitize_tma.py $case > "$OUT/sanitize-$case-$tool.log" 2>&1
            echo "$case $tool: $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY|differ" "$OUT/sanitize-$case-$tool.log" \
                | sort | uniq -c | head -6 | tr '\n' ' ')"
        done
    done
    (cd "$OUT" && tar czf sanitize.tgz sanitize-*.log && rm -f sanitize-*.log)
}

s43min() {  # the least worth a short lease (about 4 min): the TMA store's and the clusters' GPU tests, racecheck on
    # the store's cases
    install
    CONVGEN_CACHE_DIR=/tmp/cg-st timeout 170 $PYTEST tests/test_tma_store_gpu.py tests/test_tma_cluster_gpu.py 2>&1 \
        | tee "$OUT/s43min-gpu-tests.log" | tail -4
    CONVGEN_CACHE_DIR=/tmp/cg-st timeout 60 /usr/local/cuda/bin/compute-sanitizer --tool racecheck \
        python3 benchmarks/probes/sanitize_tma.py store > "$OUT/sanitize-store-racecheck.log" 2>&1
    grep -E "RACECHECK SUMMARY|differ" "$OUT/sanitize-store-racecheck.log" | sort | uniq -c | head -6
}

s43ab() {  # the planner's fprop against its store twins and its cluster twins, on large and resnet50, once each
    # (about 9 min)
    install
    twin_ab store 1
    twin_ab cluster 1
    (cd "$OUT" && tar czf twins.tgz store cluster && rm -rf store cluster)
}

s42min() {  # the least worth a short lease (about 4 min): the cluster twins' and the depthwise fitted tiles' GPU
    # tests, then racecheck on the cluster cases
    install
    CONVGEN_CACHE_DIR=/tmp/cg-cl timeout 170 $PYTEST tests/test_tma_cluster_gpu.py tests/test_depthwise_gpu.py \
        -k "cluster or fitted or variations" 2>&1 | tee "$OUT/s42min-gpu-tests.log" | tail -4
    CONVGEN_CACHE_DIR=/tmp/cg-cl timeout 60 /usr/local/cuda/bin/compute-sanitizer --tool racecheck \
        python3 benchmarks/probes/sanitize_tma.py cluster > "$OUT/cluster-sanitize-racecheck.log" 2>&1
    grep -E "RACECHECK SUMMARY|differ" "$OUT/cluster-sanitize-racecheck.log" | sort | uniq -c | head -6
}

s42c() {  # what changed since the last whole suite, on a short budget (about 8 min): the GPU tests of the
    # cluster twins, the depthwise fitted tiles and spare lanes, packed-wgrad tuning and tuning on first use; the
    # cluster sanitizers; one cluster A/B run
    install
    CONVGEN_CACHE_DIR=/tmp/cg-cl timeout 200 $PYTEST tests/test_tma_cluster_gpu.py tests/test_depthwise_gpu.py \
        tests/test_group_pack_gpu.py tests/test_autotune_gpu.py 2>&1 | tee "$OUT/s42c-gpu-tests.log" | tail -4
    for tool in memcheck racecheck; do
        CONVGEN_CACHE_DIR=/tmp/cg-cl timeout 60 /usr/local/cuda/bin/compute-sanitizer --tool $tool --report-api-errors no \
            python3 benchmarks/probes/sanitize_tma.py cluster > "$OUT/cluster-sanitize-$tool.log" 2>&1
        grep -E "ERROR SUMMARY|RACECHECK SUMMARY|differ" "$OUT/cluster-sanitize-$tool.log" | sort | uniq -c | head -6
    done
    cluster_ab 1
    (cd "$OUT" && tar czf cluster.tgz cluster cluster-sanitize-*.log && rm -rf cluster cluster-sanitize-*.log)
}

readme() {  # README's table re-measured (same-work bench, planner defaults): the suites in $README_SUITES (default:
    # every suite), each whole, until ${README_BUDGET:-520} s have passed; the ones not reached are printed, for the next call
    install
    local start=$SECONDS left=() s ran=
    mkdir -p "$OUT/readme"
    for s in ${README_SUITES:-cifar-resnet cifar-vgg resnet50 resnet18 vgg16 unet darknet53-down mobilenetv2-pw \
            efficientnet-b0-pw mobilenetv2-dw convnext-dw efficientnet-b0-dw resnext50-grouped large speech}; do
        if [ -n "$ran" ] && [ $((SECONDS - start)) -gt $((${README_BUDGET:-520} - 120)) ]; then left+=("$s"); continue; fi
        ran=1  # (the first suite always starts, with what is left of the budget)
        CONVGEN_CACHE_DIR=/tmp/cg-readme timeout $((${README_BUDGET:-520} - (SECONDS - start))) python3 -m convgen.cli bench --suite "$s" \
            $BENCH --out "$OUT/readme" 2>&1 | grep -E "rror|geomean speedup|below 300" | sed "s/^/$s /"
    done
    echo "not reached: ${left[*]:-none}"
    (cd "$OUT" && tar czf readme.tgz readme && rm -rf readme)
}

case "${1:-}" in
    readme) readme ;;
    cluster) cluster ;;
    s42c) s42c ;;
    s43) s43 ;;
    s44) s44 ;;
    s44one) s44one ;;
    s45dw) s45dw ;;
    s47) s47 ;;
    s48at) s48at ;;
    s48) s48 ;;
    s48b) s48b ;;
    s49) s49 ;;
    s50) s50 ;;
    s51) s51 ;;
    s52) s52 ;;
    s53) s53 ;;
    s54) s54 ;;
    s55) s55 ;;
    s56) s56 ;;
    s57) s57 ;;
    s59) s59 ;;
    s60) s60 ;;
    s58) s58 ;;
    ncu-mma) ncu_mma ;;
    s47b) s47b ;;
    dw-ablate) dw_ablate ;;
    step-batch) step_batch ;;
    s43ab) s43ab ;;
    s43min) s43min ;;
    s42min) s42min ;;
    s39a) s39a ;;
    s39b) s39b ;;
    s39c) s39c ;;
    s42) s42 ;;
    s42b) s42b ;;
    s41) s41 ;;
    s40) s40 ;;
    s40b) s40b ;;
    s40c) s40c ;;
    gather) gather ;;
    gather-ab) gather_ab ;;
    mini) mini ;;
    halo) halo ;;
    streamk) streamk ;;
    streamk-large) install; streamk_ab large ;;
    host) host ;;
    halo-tune) halo_tune ;;
    probes) probes ;;
    ab) ab ;;
    tune) tune ;;
    tune-wide) tune_wide ;;
    suite) suite ;;
    verify) verify ;;
    quick) quick ;;
    ncu) ncu_layers ;;
    ncu-dw46) ncu_layers "fprop 64 56 56 96 96 7 1 3 96" "wgrad 64 56 56 96 96 7 1 3 96" "wgrad 128 56 56 144 144 3 1 1 144" "fprop 128 112 112 96 96 3 2 1 96" ;;  # the depthwise rows issue 21 misses on (forty-sixth session)
    ncu-effnet) ncu_layers "fprop 128 28 28 240 240 5 1 2 240" "fprop 128 56 56 144 144 5 2 2 144" ;;  # the whole-pixel
        # 5x5 rows, 0.77-0.79x cuDNN in fprop (fortieth session): what bounds each side (about 3 min)
    l2-ab) l2_ab ;;
    l2-check) l2_check ;;
    verify36) verify36 ;;
    verify37) verify37 ;;
    verify37b) verify37b ;;
    verify37c) verify37c ;;
    tune-dw7) tune_dw7 ;;
    verify38) verify38 ;;
    verify38b) verify38b ;;
    verify38c) verify38c ;;
    *) echo "usage: $0 gather|gather-ab|mini|verify|quick|ncu|suite|streamk|streamk-large|host|halo|halo-tune|tune|tune-wide|ab|probes|l2-ab|l2-check|verify36|verify37|verify37b|verify37c|tune-dw7" >&2; exit 2 ;;
esac
