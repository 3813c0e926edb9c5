# shellcheck shell=bash
# The Debian mirror this machine's apt is configured with, for scripts that write their own
# sources list (scripts/setup_hip_toolchain.sh): a machine behind a local mirror or proxy then
# fetches through it, not from a host baked into the script.
#
#   source scripts/apt_mirror.sh
#   apt_debian_mirror                # the mirror of /etc/apt's sources (apt-config's paths)
#   apt_debian_mirror FILE...        # of these sources.list / *.list / *.sources files
#   apt_snapshot_archive MIRROR      # MIRROR's snapshot archive, when it is one (else returns 1)
#
# Prints the base URI of the first enabled `deb` source that serves the Debian archive (not
# debian-security, not a third-party repository), e.g. http://deb.debian.org/debian, without
# a trailing slash; returns 1 when there is none.  A source serves the archive when its URI's
# path ends in /debian (or is a snapshot.debian.org-style /archive/debian/<timestamp>) or its
# suite is one of Debian's (sid, trixie, stable, ...).  Both formats are read: one-line
# (`deb [options] URI suite components`) and deb822 stanzas (Types/URIs/Suites/Enabled).

_apt_source_files() {
    local etc="/etc/apt/" list="" parts=""
    if command -v apt-config >/dev/null 2>&1; then
        eval "$(apt-config shell etc Dir::Etc/ list Dir::Etc::sourcelist/f parts Dir::Etc::sourceparts/d 2>/dev/null)" || true
    fi
    [ -n "$list" ] || list="${etc%/}/sources.list"
    [ -n "$parts" ] || parts="${etc%/}/sources.list.d/"
    [ -f "$list" ] && printf '%s\n' "$list"
    local f
    for f in "${parts%/}"/*.list "${parts%/}"/*.sources; do
        [ -f "$f" ] && printf '%s\n' "$f"
    done
    return 0
}

apt_debian_mirror() {
    local files=("$@")
    if [ ${#files[@]} -eq 0 ]; then
        mapfile -t files < <(_apt_source_files)
    fi
    [ ${#files[@]} -gt 0 ] || return 1
    local f out
    for f in "${files[@]}"; do
        [ -r "$f" ] || continue
        case "$f" in
            *.sources) out=$(_apt_mirror_deb822 < "$f") ;;
            *) out=$(_apt_mirror_one_line < "$f") ;;
        esac
        if [ -n "$out" ]; then
            printf '%s\n' "${out%/}"
            return 0
        fi
    done
    return 1
}

# awk helper shared by both formats: is (uri, suite) the Debian archive?
_APT_MIRROR_AWK_LIB='
function debian_suite(s) {
    return s ~ /^(sid|unstable|experimental|testing|stable|oldstable|oldoldstable|forky|trixie|bookworm|bullseye|buster|stretch|duke)(-updates|-backports|-proposed-updates)?$/
}
function archive(uri, suite,   path) {
    if (suite ~ /-security$/ || uri ~ /debian-security/) return 0
    path = uri; sub(/^[a-z+]+:\/\/[^\/]*/, "", path); sub(/\/+$/, "", path)
    return path ~ /\/debian$/ || path ~ /\/archive\/debian\/[0-9]+T[0-9]+Z$/ || debian_suite(suite)
}'

_apt_mirror_one_line() {
    awk "$_APT_MIRROR_AWK_LIB"'
    { sub(/#.*/, "") }
    $1 == "deb" {
        line = $0
        sub(/^[ \t]*deb[ \t]+/, "", line)
        if (line ~ /^\[/) sub(/^\[[^]]*\][ \t]*/, "", line)
        n = split(line, f, /[ \t]+/)
        if (n >= 2 && archive(f[1], f[2])) { print f[1]; exit }
    }'
}

_apt_mirror_deb822() {
    awk "$_APT_MIRROR_AWK_LIB"'
    function flush(   nu, ns, i, j, u, s) {
        if (types ~ /(^|[ \t])deb([ \t]|$)/ && tolower(enabled) != "no") {
            nu = split(uris, u, /[ \t]+/); ns = split(suites, s, /[ \t]+/)
            for (i = 1; i <= nu; i++) for (j = 1; j <= ns; j++)
                if (u[i] != "" && s[j] != "" && archive(u[i], s[j])) { print u[i]; found = 1; exit }
        }
        types = uris = suites = enabled = ""; last = ""
    }
    /^[ \t]*#/ { next }
    /^[ \t]*$/ { flush(); next }
    /^[ \t]/ { if (last == "uris") uris = uris " " $0; else if (last == "suites") suites = suites " " $0; next }
    {
        key = tolower($0); sub(/:.*/, "", key)
        value = $0; sub(/^[^:]*:[ \t]*/, "", value)
        last = key
        if (key == "types") types = value
        else if (key == "uris") uris = value
        else if (key == "suites") suites = value
        else if (key == "enabled") enabled = value
    }
    END { if (!found) flush() }'
}

# A snapshot.debian.org-style mirror, .../archive/debian/<timestamp>: print its archive base
# (.../archive/debian), where other timestamps are found too.  Returns 1 for any other mirror.
apt_snapshot_archive() {
    if [[ "${1%/}" =~ ^(.*/archive/debian)/[0-9]+T[0-9]+Z$ ]]; then
        printf '%s\n' "${BASH_REMATCH[1]}"
    else
        return 1
    fi
}
