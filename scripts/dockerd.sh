#!/usr/bin/env bash
# Make sure a Docker engine answers `docker info`; start one if not.
#
# Idempotent: exits 0 at once when an engine is already reachable. Otherwise
# installs Debian's docker.io (only if `dockerd` is missing), starts `dockerd`
# detached from the calling shell (setsid + nohup, so it outlives `make` or a
# test run) and waits up to DOCKERD_WAIT seconds (default 60) for it.
#
# Log: /var/log/quota-spawner-dockerd.log (override with DOCKERD_LOG).
# This script never installs anything named nvidia-*: GPU stubs belong only to
# a dockerd that the tests start themselves
# (docs/deployment.md#tests-and-the-private-test-engine).
set -euo pipefail

LOG=${DOCKERD_LOG:-/var/log/quota-spawner-dockerd.log}
WAIT=${DOCKERD_WAIT:-60}

say() { echo "[dockerd] $*"; }
die() { echo "[dockerd] ERROR: $*" >&2; exit 1; }

if docker info >/dev/null 2>&1; then
    say "engine already running"
    exit 0
fi

[ "$(id -u)" -eq 0 ] || die "no Docker engine is reachable and starting one needs root"

if ! command -v dockerd >/dev/null 2>&1; then
    say "dockerd missing: apt-get install docker.io"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends docker.io >/dev/null
fi

# A CLI without an engine: a stale socket or pid file from an earlier engine
# would make dockerd refuse to start.
if [ -f /var/run/docker.pid ] && ! kill -0 "$(cat /var/run/docker.pid)" 2>/dev/null; then
    rm -f /var/run/docker.pid
fi

# By its pid file, not by process name: the test engine (scripts/test-dockerd.sh)
# is another dockerd and may be running beside this one.
if [ -f /var/run/docker.pid ]; then
    say "a dockerd process exists but does not answer yet; waiting for it"
else
    say "starting dockerd (log: $LOG)"
    mkdir -p "$(dirname "$LOG")"
    # setsid: own session, so the caller's SIGINT/SIGHUP does not reach it.
    setsid nohup dockerd >>"$LOG" 2>&1 </dev/null &
fi

for _ in $(seq 1 "$WAIT"); do
    if docker info >/dev/null 2>&1; then
        say "engine ready ($(docker version --format '{{.Server.Version}}' 2>/dev/null || echo '?'))"
        exit 0
    fi
    sleep 1
done

echo "[dockerd] ERROR: dockerd did not answer 'docker info' within ${WAIT}s." >&2
echo "[dockerd] Last lines of $LOG:" >&2
tail -n 20 "$LOG" >&2 || true
exit 1
