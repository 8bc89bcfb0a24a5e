# shellcheck shell=bash
# Helpers shared by the host-side scripts in scripts/. Each script sets
# SAY_TAG, the prefix of every line it prints ("[setup] ...",
# "[images] ..."), and sources this file from its own directory:
#
#   SAY_TAG=setup
#   # shellcheck source-path=SCRIPTDIR source=lib.sh
#   . "$ROOT/scripts/lib.sh"
#
# Two image scripts keep their own one-line `say` instead, on purpose:
#   images/base/build.sh         its code (not its comments) is hashed into
#                                the base image's label; sourcing this file
#                                would change that hash and rebuild the base
#                                and every image on it.
#   images/common/notebook-setup.sh
#                                runs inside `docker build`, where only the
#                                build context images/ exists; and every byte
#                                of images/common/ is hashed into the
#                                notebook images' label.

: "${SAY_TAG:?set SAY_TAG before sourcing scripts/lib.sh}"

say() { echo "[$SAY_TAG] $*"; }
die() { echo "[$SAY_TAG] ERROR: $*" >&2; exit 1; }
now() { date +%s; }

# apt-get install without questions, after refreshing the package lists;
# options (--no-install-recommends) pass through.
apt_install() {
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "$@" >/dev/null
}

# Debian's docker.io, only when this machine has no dockerd at all.
ensure_dockerd() {
    if ! command -v dockerd >/dev/null 2>&1; then
        say "dockerd missing: apt-get install docker.io"
        apt_install --no-install-recommends docker.io
    fi
}

# A pid file left by an engine that is gone would make dockerd refuse to start.
drop_stale_pidfile() {   # FILE
    if [ -f "$1" ] && ! kill -0 "$(cat "$1")" 2>/dev/null; then
        rm -f "$1"
    fi
}

# Run CHECK... once a second until it succeeds (status 0), at most SECONDS
# times (status 1).
retry_seconds() {   # SECONDS CHECK...
    local _retry_tries=$1 _retry_i   # names no CHECK uses: bash scopes locals dynamically
    shift
    for _retry_i in $(seq 1 "$_retry_tries"); do
        "$@" && return 0
        sleep 1
    done
    return 1
}
