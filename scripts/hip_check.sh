#!/usr/bin/env bash
# Compile convgen's HIP kernels to AMD ISA (gfx1100 / gfx1201 / gfx942) -- no AMD GPU needed.
#
#   scripts/hip_check.sh [pytest args...]
#
# Runs scripts/setup_hip_toolchain.sh (idempotent; toolchain in
# ${CONVGEN_TOOLCHAIN:-$HOME/.cache/convgen-toolchain}), exports CONVGEN_HIP_PATH,
# CONVGEN_ROCWMMA_INCLUDE and CONVGEN_HIP_CLANG (plus the optional CONVGEN_HIP_OCKL_SHIM), then
# runs tests/test_hip_compile.py (clang jobs in parallel: CONVGEN_HIP_JOBS, default all CPUs).
# The per-kernel VGPR/scratch table lands in ${CONVGEN_HIP_REPORT:-build/hip-check/report.txt},
# each kernel's source and ISA in ${CONVGEN_HIP_ISA_DIR:-build/hip-check/isa}/.
# Without network access to github.com, set ROCWMMA_INCLUDE to
# a copy of rocWMMA's library/include first (the setup script says so when it needs it).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

exports=$(bash "$ROOT/scripts/setup_hip_toolchain.sh" "${CONVGEN_TOOLCHAIN:-$HOME/.cache/convgen-toolchain}") || {
    echo "hip_check: toolchain setup failed (see above)" >&2
    exit 1
}
eval "$exports"
export CONVGEN_HIP_PATH CONVGEN_ROCWMMA_INCLUDE CONVGEN_HIP_CLANG
[ -z "${CONVGEN_HIP_OCKL_SHIM:-}" ] || export CONVGEN_HIP_OCKL_SHIM
echo "hip_check: CONVGEN_HIP_PATH=$CONVGEN_HIP_PATH" >&2
echo "hip_check: CONVGEN_ROCWMMA_INCLUDE=$CONVGEN_ROCWMMA_INCLUDE" >&2
echo "hip_check: CONVGEN_HIP_CLANG=$CONVGEN_HIP_CLANG" >&2
echo "hip_check: CONVGEN_HIP_OCKL_SHIM=${CONVGEN_HIP_OCKL_SHIM:-(none)}" >&2

TEST=tests/test_hip_compile.py
[ -f "$TEST" ] || { echo "hip_check: $TEST not found" >&2; exit 2; }
export CONVGEN_HIP_REPORT=${CONVGEN_HIP_REPORT:-$ROOT/build/hip-check/report.txt}
export CONVGEN_HIP_ISA_DIR=${CONVGEN_HIP_ISA_DIR:-$ROOT/build/hip-check/isa}
rm -f "$CONVGEN_HIP_REPORT"
start=$SECONDS
rc=0
python3 -m pytest -q "$TEST" "$@" || rc=$?
if [ -f "$CONVGEN_HIP_REPORT" ]; then
    echo "hip_check: VGPR/scratch table: $CONVGEN_HIP_REPORT" >&2
    head -n 3 "$CONVGEN_HIP_REPORT" >&2
    tail -n 1 "$CONVGEN_HIP_REPORT" >&2
fi
echo "hip_check: pytest exit status $rc after $((SECONDS - start)) s" >&2
exit $rc
