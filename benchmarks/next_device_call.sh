#!/usr/bin/env bash
# The GPU machine's calls, as parts: each fits one call's 10 minutes and is run from the repository
# root on the GPU machine.  Give COMMIT this machine's `git rev-parse --short HEAD` literally: the
# device's copy of the tree can carry a stale git HEAD, and its git may not hold recent commits.
# The device returns at most 8 files a call, so parts with many outputs tar them.
#
#   COMMIT=... OUT=... bash benchmarks/next_device_call.sh PART
#
# Reusable parts:
#   suite     the whole GPU test suite (SUITE_LIMIT s, default 540), log as $OUT/gpu-suite.log
#   readme    README's table: the suites in $README_SUITES (default: every suite), planner defaults, same-work
#             bench, until $README_BUDGET s (default 520) have passed; names the suites not reached
#   autotune  the same with tuning on first use (CONVGEN_AUTOTUNE=1, an empty database) on $AT_SUITES
#   tune      `convgen tune` on $TUNE ("suite:layer,layer:pass ..."; layers "-" for the whole suite), in turn
#             until $TUNE_BUDGET s (default 520) have passed
#   rows      `convgen bench` on $ROWS ("suite:layer,layer:pass ..."), planner defaults, beside cuDNN
#   ncu       Nsight Compute on $NCU_LAYERS (";"-separated layer_profile.py arguments), both sides; NCU_SOURCE=1
#             adds the SASS with its stall samples
#   host      host cost per call (benchmarks/probes/host_cost.py) and the training step's three modes
#   step-batch  the training step at batch 256 and 2048 (where the GPU, not torch's host work, sets the pace)
#   sanitize-dw  memcheck and racecheck on the depthwise forms (benchmarks/probes/sanitize_dw.py)
#   odd-k     branch odd-k-stores' GPU tests and the 116-channel layer's bench (and main's, as tap-pad)
#   holdout   layers of networks with no suite here (a list git ignores: carry it), all passes beside cuDNN
#   tap-pad   branch wgrad-tap-pad's GPU tests, and the three held-out wgrads it moves to the TMA loop beside
#             cuDNN; with AB_BASE (a folder holding main's convgen/ and templates/, untracked; AB_COMMIT its
#             commit) main's plans too, on the same machine; make it with
#             `mkdir .ab-main && git archive main convgen templates | tar -x -C .ab-main` (AB_BASE=.ab-main)
#   whole-rows  branch odd-k-rows' GPU tests, and YOLOv5s' head fprop beside cuDNN (and main's, as tap-pad)
# The last sessions' calls (s61 and s62 planned in the fifty-first, not run; s63 ran in the fifty-second):
#   s61       the whole GPU suite, then README's compute-heavy suites (README_SUITES; about 9.5 min)
#   s62       the co-resident wgrad twins tuned (pointwise suites, ResNet-50's 1x1 layers), then the pointwise
#             suites with tuning on first use (about 9.5 min)
#   s63       the whole GPU suite, then the held-out layers (carry .heldout), within $TOTAL s
#   s64       the twins tuned as in s62, then mobilenetv2-pw at the defaults, within $TOTAL s
#   s66       on a branch with odd-k-stores, wgrad-tap-pad and odd-k-rows merged: odd-k, tap-pad and whole-rows,
#             each beside main's on the same machine (AB_BASE as ab_layers says; about 8 min)
#
# The one-off parts of earlier sessions (s39a ... s60, the twin and cluster A/Bs, the gather and L2-hint
# A/Bs) are in git history: `git show b4e76d2:benchmarks/next_device_call.sh`; benchmarks/NOTES.md says what
# each found.  `benchmarks/probes/` holds the one-question scripts they ran.  Nothing here is run by CI.
set -uo pipefail
: "${OUT:?set OUT to the folder whose files come back}" "${COMMIT:?set COMMIT to the commit under test}"
# CONVGEN_TUNED=0: the planner's plans, unless a part says otherwise.  It also turns tuning on first
# use off (autotune.enabled), so a part that times autotune sets CONVGEN_TUNED=1 with it.
export PYTHONUNBUFFERED=1 CONVGEN_BENCH_COMMIT="$COMMIT" CONVGEN_TUNED=0
PYTEST="python3 -m pytest -q -m gpu -n 16 --dist worksteal --timeout 200 --timeout-method thread -rfE -p no:cacheprovider"
BENCH="--reps 30 --warmup 5 --no-compile-time --plot off --no-progress"
ALL_SUITES="cifar-resnet cifar-vgg resnet50 resnet18 vgg16 unet darknet53-down mobilenetv2-pw efficientnet-b0-pw \
mobilenetv2-dw convnext-dw efficientnet-b0-dw resnext50-grouped large speech"

install() {
    nvidia-smi --query-gpu=name --format=csv,noheader
    python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
}

suite() {
    install
    # -v: a line a test as it ends, so a run the limit cuts still names what ran (the fifty-second session's
    # -q log said only "64%"); --durations: where a whole run's time went
    CONVGEN_CACHE_DIR=/tmp/cg-suite timeout "${SUITE_LIMIT:-540}" ${PYTEST/ -q / } -v --durations=25 2>&1 \
        | tee "$OUT/gpu-suite.log" | grep -vE "^\[gw[0-9]+\] .*PASSED" | tail -40
}

readme() {  # each suite whole; the first always starts, with what is left of the budget
    install
    local start=$SECONDS left=() s ran= budget=${README_BUDGET:-520} dir=${README_DIR:-readme}
    mkdir -p "$OUT/$dir"
    for s in ${README_SUITES:-$ALL_SUITES}; do
        if [ -n "$ran" ] && [ $((SECONDS - start)) -gt $((budget - 120)) ]; then left+=("$s"); continue; fi
        ran=1
        CONVGEN_CACHE_DIR=${README_CACHE:-/tmp/cg-readme} timeout $((budget - (SECONDS - start))) python3 -m convgen.cli bench \
            --suite "$s" $BENCH --out "$OUT/$dir" 2>&1 | grep -E "rror|geomean speedup|below 300" | sed "s/^/$s /"
    done
    echo "not reached: ${left[*]:-none}"
    (cd "$OUT" && tar czf "$dir.tgz" "$dir" && rm -rf "$dir")
}

autotune() {  # issue 16's 1.0x with tuning on first use: every row tuned on its first call, from an empty database
    # (the user's database lives in the cache directory, so a cache of its own starts it empty)
    CONVGEN_TUNED=1 CONVGEN_AUTOTUNE=1 README_CACHE=/tmp/cg-autotune-$RANDOM \
        README_SUITES="${AT_SUITES:-mobilenetv2-pw efficientnet-b0-pw}" README_DIR=autotune readme
}

each_entry() {  # FUNCTION LIST: FUNCTION suite layers pass, for each "suite:layers:pass" of LIST, until the budget
    local fn=$1 start=$SECONDS e
    for e in $2; do
        [ $((SECONDS - start)) -lt "${3:-520}" ] || { echo "not reached: $e"; continue; }
        local s=${e%%:*} rest=${e#*:}
        "$fn" "$s" "${rest%:*}" "${rest##*:}"
    done
}

tune_one() {  # SUITE LAYERS PASS
    local layers=() name="$1-$3"
    [ "$2" = - ] || { layers=(--layers "$2"); name="$1-$(echo "$2" | tr , +)-$3"; }
    CONVGEN_CACHE_DIR=/tmp/cg-tune timeout 200 python3 -m convgen.cli tune --suite "$1" "${layers[@]}" --pass "$3" \
        --no-bias --log "$OUT/tune/tune-$name.json" > "$OUT/tune/tune-$name.log" 2>&1
    grep -E "^[a-z]" "$OUT/tune/tune-$name.log" | tail -6
}

tune() {
    install
    mkdir -p "$OUT/tune"
    each_entry tune_one "${TUNE:?set TUNE to suite:layers:pass entries}" "${TUNE_BUDGET:-520}"
    (cd "$OUT" && tar czf tune.tgz tune && rm -rf tune)
}

rows_one() {  # SUITE LAYERS PASS
    CONVGEN_CACHE_DIR=/tmp/cg-rows timeout 100 python3 -m convgen.cli bench --suite "$1" --layers "$2" --pass "$3" \
        $BENCH --out "$OUT/rows/$1-$3" 2>&1 | grep -E "rror|geomean speedup.*GPU|^[a-z0-9_-]+ +[0-9]" | head -12
}

rows() {
    install
    mkdir -p "$OUT/rows"
    each_entry rows_one "${ROWS:?set ROWS to suite:layers:pass entries}" "${ROWS_BUDGET:-520}"
    (cd "$OUT" && tar czf rows.tgz rows && rm -rf rows)
}

ncu() {
    install
    local IFS=";" layer name side
    for layer in ${NCU_LAYERS:?set NCU_LAYERS}; do
        IFS=" "
        name=$(echo $layer | tr ' ' '-')
        timeout 60 python3 benchmarks/probes/layer_profile.py $layer 2>&1 | tail -1  # compiles outside the profiler
        for side in convgen cudnn; do
            timeout 100 /usr/local/cuda/bin/ncu --nvtx --nvtx-include "$side/" --section SpeedOfLight \
                --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy --section LaunchStats \
                --section ComputeWorkloadAnalysis --section SchedulerStats --section InstructionStats \
                ${NCU_SOURCE:+-o /tmp/ncu-$name-$side -f} python3 benchmarks/probes/layer_profile.py $layer \
                > "$OUT/ncu-$name-$side.log" 2>&1
            if [ -n "${NCU_SOURCE:-}" ]; then  # SASS with its stall samples, per kernel (the report itself stays)
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

host() {
    install
    timeout 70 python3 benchmarks/probes/host_cost.py --calls 200 --json "$OUT/host-cost.json" > "$OUT/host-cost.log" 2>&1
    grep -E "operator|launch\(\)|fwd\+bwd|floor   " "$OUT/host-cost.log"
    timeout 150 python3 examples/train_step.py --steps 50 2>&1 | tee "$OUT/train-step.log" | tail -12
}

step_batch() {  # at batch 256 both sides' compiled steps are host-bound (1.3-1.9 ms of host time over 0.2-0.4 ms
    # of GPU work), so their ratio is 1.0 plus noise whatever the kernels do; at 2048 the ratio shows the kernels
    install
    for b in 256 2048; do
        timeout 270 python3 examples/train_step.py --batch $b --steps 30 --warmup 10 2>&1 \
            | tee "$OUT/train-step-batch$b.log" | tail -8
    done
}

sanitize_dw() {  # each tool's log as $OUT/sanitize-dw-TOOL.log; every sanitized case is also checked exactly
    install
    for tool in memcheck racecheck; do
        CONVGEN_CACHE_DIR=/tmp/cg-sanitize timeout 60 /usr/local/cuda/bin/compute-sanitizer --tool $tool \
            --report-api-errors no python3 benchmarks/probes/sanitize_dw.py > "$OUT/sanitize-dw-$tool.log" 2>&1
        echo "dw $tool: $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY|differ" "$OUT/sanitize-dw-$tool.log" \
            | grep -v " 0 of " | sort | uniq -c | head -6 | tr '\n' ' ')"
    done
}

bench_layer() {  # LIMIT OUT PASS n h w c k r s stride padding [dilation groups]: `convgen bench` on one layer, beside cuDNN
    timeout "$1" python3 -m convgen.cli bench -n $4 -h $5 -w $6 -c $7 -k $8 -r $9 -s ${10} --stride ${11} \
        --padding ${12} --dilation ${13:-1} --groups ${14:-1} --pass $3 $BENCH --out "$2" 2>&1
}

holdout() {  # speed off the suites: every layer of $HOLDOUT (default .heldout/layers.txt, which git ignores, so the
    # shapes stay out of the repository and out of every rule's fit; pass it with run's carry) in all three passes
    # beside cuDNN, until $HOLDOUT_BUDGET s (default 520); one line a layer: name n h w c k r s stride padding dilation groups.
    # Read back with `python3 scripts/targets.py --assume-plans defaults --pool holdout holdout/*/*.json`
    install
    local start=$SECONDS name n h w c k r s st pad dil g
    mkdir -p "$OUT/holdout"
    while read -r name n h w c k r s st pad dil g; do
        case "$name" in ''|'#'*) continue ;; esac
        [ $((SECONDS - start)) -lt "${HOLDOUT_BUDGET:-520}" ] || { echo "not reached: $name"; continue; }
        CONVGEN_CACHE_DIR=/tmp/cg-holdout bench_layer 90 "$OUT/holdout/$name" all $n $h $w $c $k $r $s $st $pad $dil $g \
            | grep -E "rror|geomean speedup.*GPU" | sed "s/^/$name /"
    done < "${HOLDOUT:-.heldout/layers.txt}"
    (cd "$OUT" && tar czf holdout.tgz holdout && rm -rf holdout)
}

s61() {  # the fifty-first session's first call: the whole GPU suite (last whole at 360b732; the planner's defaults
    # have moved since), then README's suites in what is left of 585 s
    SUITE_LIMIT=330 suite
    README_SUITES="${README_SUITES:-resnet50 large darknet53-down unet resnet18 vgg16 cifar-resnet cifar-vgg}" \
        README_BUDGET=$((585 - SECONDS)) readme
}

s62() {  # the co-resident twins (fifty-first session) timed: the pointwise suites' wgrad and ResNet-50's 1x1 wgrads
    # tuned whole (the logs the planner's rule would be fitted to), then the pointwise suites with tuning on first use
    TUNE="mobilenetv2-pw:-:wgrad efficientnet-b0-pw:-:wgrad resnet50:l4-1x1,l3-1x1,l2-1x1,l1-1x1c:wgrad" \
        TUNE_BUDGET=330 tune
    AT_SUITES="mobilenetv2-pw efficientnet-b0-pw" README_BUDGET=$((585 - SECONDS)) autotune
}

s63() {  # the fifty-second session's first call: the whole GPU suite, then the held-out layers (carry .heldout)
    # in what is left of 585 s; the holdout part names the layers it did not reach
    SUITE_LIMIT=330 suite
    HOLDOUT_BUDGET=$((${TOTAL:-585} - 90 - SECONDS)) holdout
}

s64() {  # the second call, in what is left of $TOTAL s (default 585): the co-resident twins tuned (as s62), then
    # mobilenetv2-pw at the defaults (the one-tile wgrad rule's two rows among them)
    local total=${TOTAL:-585}
    TUNE="mobilenetv2-pw:-:wgrad efficientnet-b0-pw:-:wgrad resnet50:l4-1x1,l3-1x1,l2-1x1,l1-1x1c:wgrad" \
        TUNE_BUDGET=$((total - 200)) tune
    README_SUITES=mobilenetv2-pw README_BUDGET=$((total - SECONDS)) readme
}

ab_layers() {  # TAG PASS "name n h w c k r s stride padding" ...: each layer's PASS beside cuDNN, this tree's plans and,
    # with AB_BASE (a folder holding main's convgen/ and templates/, untracked; AB_COMMIT its commit), main's, under $OUT/TAG.tgz
    local tag=$1 pass=$2 side layer
    shift 2
    local layers=("$@")  # (set -- below takes each layer's fields)
    for side in branch ${AB_BASE:+base}; do
        for layer in "${layers[@]}"; do
            set -- $layer
            (cd "$([ "$side" = base ] && echo "$AB_BASE" || echo .)" && CONVGEN_CACHE_DIR=/tmp/cg-$tag-$side \
                CONVGEN_BENCH_COMMIT=$([ "$side" = base ] && echo "${AB_COMMIT:-main}" || echo "$COMMIT") \
                bench_layer 100 "$OUT/$tag-$side-$1" $pass "${@:2}" | grep -E "rror|^conv +[a-z]" | sed "s/^/$side $1 /")
        done
    done
    (cd "$OUT" && tar czf $tag.tgz $tag-* && rm -rf $tag-*/)
}

odd_k() {  # branch odd-k-stores: its exact GPU tests (none on main) and the one-tile wgrad test, then the
    # 116-channel pointwise layer's fprop and dgrad beside cuDNN (and main's, with AB_BASE: ab_layers)
    install
    CONVGEN_CACHE_DIR=/tmp/cg-oddk timeout 200 $PYTEST tests/test_kernels_gpu.py -k "8_byte or one_tile" 2>&1 | tail -3
    local p
    for p in fprop dgrad; do
        ab_layers odd-k-$p $p "shufflenetv2-1x1-116 128 28 28 116 116 1 1 1 0"
    done
}

tap_pad() {  # wgrad with each tap's channels in whole 64-channel boxes (fifty-third session, branch wgrad-tap-pad)
    install
    CONVGEN_CACHE_DIR=/tmp/cg-tappad timeout 200 $PYTEST tests/test_tma_gpu.py -k "wgrad_channel_tail or taps_in_whole_boxes" 2>&1 | tail -3
    CONVGEN_CACHE_DIR=/tmp/cg-tappad timeout 120 $PYTEST tests/test_stream_k_gpu.py -k 160 2>&1 | tail -3
    ab_layers tap-pad wgrad "incv3-3x3-s2-288to384 64 35 35 288 384 3 3 2 0" "incv3-5x5-48to64 64 35 35 48 64 5 5 1 2" \
        "convnext-down-2x2-96to192 64 56 56 96 192 2 2 2 0"
}

whole_rows() {  # a TMA fprop's rows of y stored whole where they are no whole 16-byte runs (fifty-third, odd-k-rows)
    install
    CONVGEN_CACHE_DIR=/tmp/cg-whole-rows timeout 200 $PYTEST tests/test_tma_gpu.py -k rows_stored_whole 2>&1 | tail -3
    ab_layers whole-rows fprop "yolov5s-head-1x1-128to255 32 80 80 128 255 1 1 1 0"
}

s66() {  # the fifty-third session's plan (no machine was lent then): the branches' GPU tests and A/B benches
    odd_k
    tap_pad
    whole_rows
}

case "${1:-}" in
    suite) suite ;;
    readme) readme ;;
    autotune) autotune ;;
    tune) tune ;;
    rows) rows ;;
    ncu) ncu ;;
    host) host ;;
    step-batch) step_batch ;;
    sanitize-dw) sanitize_dw ;;
    holdout) holdout ;;
    s61) s61 ;;
    s62) s62 ;;
    s63) s63 ;;
    odd-k) odd_k ;;
    s64) s64 ;;
    tap-pad) tap_pad ;;
    whole-rows) whole_rows ;;
    s66) s66 ;;
    *) echo "usage: COMMIT=... OUT=... $0 PART (see the header)" >&2; exit 2 ;;
esac
