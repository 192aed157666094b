# Shell helpers the scripts in this folder share; source it, do not run it.
# log and die prefix messages with the calling script's name.

log() { printf '%s: %s\n' "$(basename "$0")" "$*" >&2; }
die() { log "error: $*"; exit 1; }

as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo "$@"
    else
        die "need root for: $*; run it as root or install sudo"
    fi
}

# apt_install PACKAGE...: install Debian packages, without their recommends unless
# APT_RECOMMENDS=1.
apt_install() {
    command -v apt-get >/dev/null 2>&1 || die "apt-get not found; install these packages by hand: $*"
    log "installing Debian packages: $*"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q
    local recommends=--no-install-recommends
    [ "${APT_RECOMMENDS:-0}" = 1 ] && recommends=--install-recommends
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$recommends" "$@"
}

# need_commands COMMAND:PACKAGE...: install the package of each command that is missing.
need_commands() {
    local pair missing=()
    for pair in "$@"; do
        command -v "${pair%%:*}" >/dev/null 2>&1 || missing+=("${pair#*:}")
    done
    if [ "${#missing[@]}" -gt 0 ]; then
        apt_install "${missing[@]}"
    fi
}
