#!/usr/bin/env bash
# Compile convgen's HIP kernels to AMD ISA (gfx1100 / gfx1201 / gfx942) -- no AMD GPU needed.
#
#   scripts/hip_check.sh [pytest args...]
#
# Runs scripts/setup_hip_toolchain.sh (idempotent; toolchain in
# ${CONVGEN_TOOLCHAIN:-$HOME/.cache/convgen-toolchain}), exports CONVGEN_HIP_PATH,
# CONVGEN_ROCWMMA_INCLUDE and CONVGEN_HIP_CLANG (plus the optional CONVGEN_HIP_OCKL_SHIM), then
# runs tests/test_hip_compile.py.  Without network access to github.com, set ROCWMMA_INCLUDE to
# a copy of rocWMMA's library/include first (the setup script says so when it needs it).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

exports=$(bash "$ROOT/scripts/setup_hip_toolchain.sh" "${CONVGEN_TOOLCHAIN:-$HOME/.cache/convgen-toolchain}") || {
    echo "hip_check: toolchain setup failed (see above)" >&2
    exit 1
}
eval "$exports"
export CONVGEN_HIP_PATH CONVGEN_ROCWMMA_INCLUDE CONVGEN_HIP_CLANG CONVGEN_HIP_OCKL_SHIM
echo "hip_check: CONVGEN_HIP_PATH=$CONVGEN_HIP_PATH" >&2
echo "hip_check: CONVGEN_ROCWMMA_INCLUDE=$CONVGEN_ROCWMMA_INCLUDE" >&2
echo "hip_check: CONVGEN_HIP_CLANG=$CONVGEN_HIP_CLANG" >&2

TEST=tests/test_hip_compile.py
if [ ! -f "$TEST" ]; then
    echo "hip_check: $TEST does not exist yet; the toolchain is ready, nothing to run" >&2
    exit 2
fi
exec python3 -m pytest -q "$TEST" "$@"
