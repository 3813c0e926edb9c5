#!/usr/bin/env bash
# Set up a compile-only HIP/rocWMMA toolchain for convgen's HIP backend (no AMD GPU needed).
#
#   scripts/setup_hip_toolchain.sh [DEST]
#   eval "$(scripts/setup_hip_toolchain.sh)"     # export the variables into this shell
#
# DEST defaults to ${CONVGEN_TOOLCHAIN:-$HOME/.cache/convgen-toolchain}.  Idempotent: a second
# run finds everything in DEST and touches no network.  What it sets up:
#   * clang-19 (apt, Debian bookworm or later) -- the device compiler; no hipcc, no ROCm install.
#   * HIP 6.4.x headers: Debian's libamdhip64-dev + libhsa-runtime-dev, fetched with
#     `apt-get download` through a private apt configuration in DEST/apt (own sources list and
#     state; the system's apt sources and state are untouched) and unpacked with `dpkg -x` into
#     DEST/hip.  6.4.x on purpose: HIP 7.x headers break rocWMMA ("no member named 'data'").
#   * rocWMMA headers (library/include, which must include rocwmma/internal/ -- Debian's
#     librocwmma-dev lacks those and cannot compile anything): $ROCWMMA_INCLUDE if set, else a
#     shallow fetch of ROCm/rocWMMA at the pinned commit (below) into DEST/rocWMMA.
# At the end it compiles a tiny rocWMMA kernel for gfx1201 and checks the ISA has v_wmma.
#
# Environment knobs:
#   ROCWMMA_INCLUDE              rocWMMA's library/include (or the repo root) to use, no clone
#                                (CONVGEN_ROCWMMA_INCLUDE is read too)
#   ROCWMMA_REF                  commit, branch or tag to fetch (default: the pin, develop at
#                                fa7e8ee6f1ad = rocWMMA 1.6.0, Oct 2024, what convgen is checked with)
#   ROCWMMA_URL                  repository to fetch from (default https://github.com/ROCm/rocWMMA)
#   CONVGEN_HIP_PATH             use this HIP install (dir with include/hip) instead of Debian's
#   CONVGEN_HIP_CLANG            use this clang++ instead of clang++-19
#   CONVGEN_HIP_SERIES           HIP version series to fetch (default 6.4)
#   CONVGEN_DEBIAN_MIRROR        Debian mirror for the private sources list (default: the one
#                                this machine's apt sources use, scripts/apt_mirror.sh, so a
#                                machine behind its own mirror or proxy fetches through it)
#   CONVGEN_HIP_SNAPSHOT         snapshot timestamp to fall back on when the live sid/forky
#                                lists no longer carry the series (default 20260601T000000Z;
#                                sid carried 6.4.3-5 then)
#   CONVGEN_DEBIAN_SNAPSHOT_URL  snapshot archive to take it from (default: the machine's mirror
#                                when that is itself a snapshot archive, .../archive/debian/<ts>;
#                                else http://snapshot.debian.org/archive/debian)
#   CONVGEN_TOOLCHAIN_REFRESH=1  re-fetch the HIP headers even if DEST/hip is present
#   CONVGEN_TOOLCHAIN_NOCHECK=1  skip the final test compile
#
# stdout carries only the `export ...` lines; progress and errors go to stderr.
set -euo pipefail

log() { printf 'setup_hip_toolchain: %s\n' "$*" >&2; }
die() { printf 'setup_hip_toolchain: ERROR: %s\n' "$*" >&2; exit 1; }

DEST=${1:-${CONVGEN_TOOLCHAIN:-$HOME/.cache/convgen-toolchain}}
mkdir -p "$DEST"
DEST=$(cd "$DEST" && pwd)
SERIES=${CONVGEN_HIP_SERIES:-6.4}
SNAPSHOT=${CONVGEN_HIP_SNAPSHOT:-20260601T000000Z}
HIP_PKGS=(libamdhip64-dev libhsa-runtime-dev)
# shellcheck source=scripts/apt_mirror.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/apt_mirror.sh"
ROCWMMA_PIN=fa7e8ee6f1ad43261fe5a66abddfe7c4ef8e7d6e  # rocWMMA develop, 1.6.0 (2024-10-22)

as_root() {
    if [ "$(id -u)" = 0 ]; then "$@"
    elif command -v sudo >/dev/null 2>&1; then sudo "$@"
    else die "need root (or sudo) to run: $*"
    fi
}

# --------------------------------------------------------------------------- clang-19
CLANG=${CONVGEN_HIP_CLANG:-}
if [ -z "$CLANG" ]; then
    if ! command -v clang++-19 >/dev/null 2>&1; then
        command -v apt-get >/dev/null 2>&1 \
            || die "clang++-19 not found and no apt-get; install clang 19 and set CONVGEN_HIP_CLANG"
        log "installing clang-19 with apt"
        as_root apt-get install -y clang-19 >&2 \
            || { as_root apt-get update >&2 && as_root apt-get install -y clang-19 >&2; } \
            || die "apt-get install clang-19 failed"
    fi
    CLANG=$(command -v clang++-19)
fi
command -v "$CLANG" >/dev/null 2>&1 || die "CONVGEN_HIP_CLANG=$CLANG is not an executable"
CLANG=$(command -v "$CLANG")
log "clang: $CLANG ($("$CLANG" --version | head -n1))"

# --------------------------------------------------------------------------- HIP headers
# Private apt setup: everything lives in DEST/apt; APT_CONFIG points apt at it for the few
# commands below only.  /etc/apt/apt.conf.d is still read (proxy settings), but the sources
# list, preferences, lists, caches and dpkg status are all our own.
APT_DIR="$DEST/apt"
write_apt_config() { # $1 = "live" or "snapshot"
    local keyring=/usr/share/keyrings/debian-archive-keyring.gpg
    if [ ! -f "$keyring" ]; then
        log "installing debian-archive-keyring (needed to verify Debian's package lists)"
        as_root apt-get install -y debian-archive-keyring >&2 || true
        [ -f "$keyring" ] || die "$keyring missing; install the debian-archive-keyring package"
    fi
    mkdir -p "$APT_DIR"/lists/partial "$APT_DIR"/cache/archives/partial "$APT_DIR"/empty.d
    : > "$APT_DIR/status"
    if [ "$1" = live ]; then
        cat > "$APT_DIR/sources.list" <<EOF
deb [arch=amd64 signed-by=$keyring] $MIRROR sid main
deb [arch=amd64 signed-by=$keyring] $MIRROR forky main
EOF
    else
        cat > "$APT_DIR/sources.list" <<EOF
deb [arch=amd64 signed-by=$keyring check-valid-until=no] $SNAPSHOT_URL/$SNAPSHOT sid main
EOF
    fi
    cat > "$APT_DIR/apt.conf" <<EOF
Dir::Etc::SourceList "$APT_DIR/sources.list";
Dir::Etc::SourceParts "$APT_DIR/empty.d";
Dir::Etc::Preferences "$APT_DIR/empty.d/none";
Dir::Etc::PreferencesParts "$APT_DIR/empty.d";
Dir::State "$APT_DIR";
Dir::State::Lists "$APT_DIR/lists";
Dir::State::status "$APT_DIR/status";
Dir::Cache "$APT_DIR/cache";
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
APT::Architecture "amd64";
APT::Architectures { "amd64"; };
APT::Sandbox::User "$(id -un)";
Acquire::Languages "none";
EOF
}
papt() { APT_CONFIG="$APT_DIR/apt.conf" "$@"; }

# newest version of package $1 in the private lists whose upstream version is $SERIES.x
pick_version() {
    papt apt-cache madison "$1" 2>/dev/null | awk -F'|' '{gsub(/ /, "", $2); print $2}' \
        | grep -E "^(1:)?${SERIES//./\\.}\." | sort -V | tail -n1 || true
}

HIP_STAMP="$DEST/hip/.convgen-hip-version"
if [ -n "${CONVGEN_HIP_PATH:-}" ]; then
    HIP_PATH=$CONVGEN_HIP_PATH
    [ -f "$HIP_PATH/include/hip/hip_runtime.h" ] \
        || die "CONVGEN_HIP_PATH=$HIP_PATH has no include/hip/hip_runtime.h"
    log "HIP: using CONVGEN_HIP_PATH=$HIP_PATH"
elif [ -f "$HIP_STAMP" ] && [ -f "$DEST/hip/usr/include/hip/hip_runtime.h" ] \
        && [ "${CONVGEN_TOOLCHAIN_REFRESH:-0}" != 1 ]; then
    HIP_PATH="$DEST/hip/usr"
    log "HIP: already in $DEST/hip ($(tr '\n' ' ' < "$HIP_STAMP"))"
else
    command -v apt-get >/dev/null 2>&1 && command -v dpkg >/dev/null 2>&1 \
        || die "no apt-get/dpkg to fetch Debian's HIP headers; set CONVGEN_HIP_PATH to a ROCm $SERIES install"
    MIRROR=${CONVGEN_DEBIAN_MIRROR:-$(apt_debian_mirror || true)}
    [ -n "$MIRROR" ] || die "found no Debian mirror in this machine's apt sources (/etc/apt/sources.list, sources.list.d/*.list, *.sources); set CONVGEN_DEBIAN_MIRROR (e.g. http://deb.debian.org/debian)"
    MIRROR=${MIRROR%/}
    SNAPSHOT_URL=${CONVGEN_DEBIAN_SNAPSHOT_URL:-$(apt_snapshot_archive "$MIRROR" || echo http://snapshot.debian.org/archive/debian)}
    SNAPSHOT_URL=${SNAPSHOT_URL%/}
    log "Debian mirror: $MIRROR (snapshots: $SNAPSHOT_URL)"
    versions=()
    for mode in live snapshot; do
        write_apt_config "$mode"
        log "apt-get update (private config in $APT_DIR, $mode sources)"
        if ! papt apt-get update -q >&2; then
            log "apt-get update with $mode sources failed"
            continue
        fi
        versions=()
        for p in "${HIP_PKGS[@]}"; do
            v=$(pick_version "$p")
            [ -n "$v" ] || { log "no $p $SERIES.x in the $mode lists"; versions=(); break; }
            versions+=("$p=$v")
        done
        [ ${#versions[@]} -gt 0 ] && break
    done
    [ ${#versions[@]} -gt 0 ] \
        || die "could not find HIP $SERIES.x headers (${HIP_PKGS[*]}) in Debian sid/forky nor in snapshot $SNAPSHOT; set CONVGEN_HIP_PATH to a ROCm $SERIES install (the dir holding include/hip)"
    log "fetching ${versions[*]}"
    rm -rf "$DEST/debs" "$DEST/hip.new"
    mkdir -p "$DEST/debs" "$DEST/hip.new"
    (cd "$DEST/debs" && papt apt-get download -q "${versions[@]}" >&2) || die "apt-get download failed"
    for deb in "$DEST"/debs/*.deb; do dpkg -x "$deb" "$DEST/hip.new"; done
    [ -f "$DEST/hip.new/usr/include/hip/hip_runtime.h" ] || die "unpacked packages have no hip/hip_runtime.h"
    printf '%s\n' "${versions[@]}" > "$DEST/hip.new/.convgen-hip-version"
    rm -rf "$DEST/hip"
    mv "$DEST/hip.new" "$DEST/hip"
    HIP_PATH="$DEST/hip/usr"
    log "HIP: unpacked into $DEST/hip"
fi

# --------------------------------------------------------------------------- rocWMMA headers
rocwmma_ok() { [ -f "$1/rocwmma/rocwmma.hpp" ] && [ -d "$1/rocwmma/internal" ]; }
ROCWMMA=""
ROCWMMA_INCLUDE=${ROCWMMA_INCLUDE:-${CONVGEN_ROCWMMA_INCLUDE:-}}  # either name works
if [ -n "${ROCWMMA_INCLUDE:-}" ]; then
    for cand in "$ROCWMMA_INCLUDE" "$ROCWMMA_INCLUDE/library/include"; do
        if rocwmma_ok "$cand"; then ROCWMMA=$(cd "$cand" && pwd); break; fi
    done
    [ -n "$ROCWMMA" ] || die "ROCWMMA_INCLUDE=$ROCWMMA_INCLUDE has no rocwmma/rocwmma.hpp with rocwmma/internal/ (point it at rocWMMA's library/include; Debian's librocwmma-dev is incomplete)"
    log "rocWMMA: using ROCWMMA_INCLUDE=$ROCWMMA"
elif rocwmma_ok "$DEST/rocWMMA/library/include"; then
    ROCWMMA="$DEST/rocWMMA/library/include"
    log "rocWMMA: already in $DEST/rocWMMA ($(git -C "$DEST/rocWMMA" rev-parse HEAD 2>/dev/null || echo 'not a git checkout'); pin $ROCWMMA_PIN)"
else
    ref=${ROCWMMA_REF:-$ROCWMMA_PIN}
    url=${ROCWMMA_URL:-https://github.com/ROCm/rocWMMA}
    command -v git >/dev/null 2>&1 || die "git not found; install git or set ROCWMMA_INCLUDE"
    rm -rf "$DEST/rocWMMA"
    log "rocWMMA: fetching $ref from $url (shallow)"
    # init + fetch works for a commit id as well as a branch or tag (clone --branch does not).
    if git init -q "$DEST/rocWMMA" >&2 \
        && GIT_TERMINAL_PROMPT=0 git -C "$DEST/rocWMMA" fetch -q --depth 1 "$url" "$ref" >&2 \
        && git -C "$DEST/rocWMMA" -c advice.detachedHead=false checkout -q FETCH_HEAD >&2; then
        log "rocWMMA: at $(git -C "$DEST/rocWMMA" rev-parse HEAD)"
    else
        rm -rf "$DEST/rocWMMA"
    fi
    rocwmma_ok "$DEST/rocWMMA/library/include" || die "could not get rocWMMA headers (no network to github.com?).
  Get a copy of https://github.com/ROCm/rocWMMA at $ROCWMMA_PIN (develop, v1.6.0)
  some other way and rerun with
      ROCWMMA_INCLUDE=/path/to/rocWMMA/library/include $0 ${1:-}"
    ROCWMMA="$DEST/rocWMMA/library/include"
fi

# --------------------------------------------------------------------------- ockl shim
# For ISA inspection: with -nogpulib (Debian has no ROCm device libraries built for clang 19)
# threadIdx/blockIdx/blockDim/gridDim lower to calls to undefined __ockl_* functions;
# `-include scripts/hip_ockl_shim.h` (committed next to this script) defines them with amdgcn
# builtins so the ISA has no s_swappc calls and realistic register/scratch counts.  Not needed
# for the compile to succeed.
SHIM="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/hip_ockl_shim.h"
[ -f "$SHIM" ] || { log "note: $SHIM not found; ISA register counts will not be realistic"; SHIM=""; }

# --------------------------------------------------------------------------- self-check
if [ "${CONVGEN_TOOLCHAIN_NOCHECK:-0}" != 1 ]; then
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    cat > "$tmp/check.hip" <<'EOF'
#include <hip/hip_runtime.h>
#include <hip/hip_fp16.h>
#include <rocwmma/rocwmma.hpp>
extern "C" __global__ void __launch_bounds__(32) check(const __half* a, const __half* b, float* c)
{
    rocwmma::fragment<rocwmma::matrix_a, 16, 16, 16, __half, rocwmma::row_major> fa;
    rocwmma::fragment<rocwmma::matrix_b, 16, 16, 16, __half, rocwmma::col_major> fb;
    rocwmma::fragment<rocwmma::accumulator, 16, 16, 16, float> acc;
    rocwmma::fill_fragment(acc, 0.0f);
    rocwmma::load_matrix_sync(fa, a, 16);
    rocwmma::load_matrix_sync(fb, b, 16);
    rocwmma::mma_sync(acc, fa, fb, acc);
    rocwmma::store_matrix_sync(c, acc, 16, rocwmma::mem_row_major);
}
EOF
    if ! "$CLANG" -x hip --offload-arch=gfx1201 --cuda-device-only -nogpulib --hip-path="$HIP_PATH" \
            -isystem "$ROCWMMA" -isystem "$HIP_PATH/include" -std=c++17 -O3 \
            -S -o "$tmp/check.s" "$tmp/check.hip" >"$tmp/log" 2>&1; then
        head -n 30 "$tmp/log" >&2
        die "test compile of a rocWMMA kernel failed (see above)"
    fi
    grep -qE '^[[:space:]]+v_wmma_' "$tmp/check.s" || die "test compile produced no v_wmma instruction"
    log "self-check: rocWMMA 16x16x16 f16 kernel compiles to v_wmma for gfx1201"
fi

log "done; export these (or: eval \"\$($0${1:+ $1})\"):"
printf 'export CONVGEN_HIP_PATH=%q\n' "$HIP_PATH"
printf 'export CONVGEN_ROCWMMA_INCLUDE=%q\n' "$ROCWMMA"
printf 'export CONVGEN_HIP_CLANG=%q\n' "$CLANG"
[ -z "$SHIM" ] || printf 'export CONVGEN_HIP_OCKL_SHIM=%q\n' "$SHIM"
