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

SAY_TAG=dockerd
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
answers() { docker info >/dev/null 2>&1; }

if answers; then
    say "engine already running"
    exit 0
fi

[ "$(id -u)" -eq 0 ] || die "no Docker engine is reachable and starting one needs root"

ensure_dockerd

# A CLI without an engine: a stale socket or pid file from an earlier engine
# would make dockerd refuse to start.
drop_stale_pidfile /var/run/docker.pid

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

if retry_seconds "$WAIT" answers; then
    say "engine ready ($(docker version --format '{{.Server.Version}}' 2>/dev/null || echo '?'))"
    exit 0
fi

say "ERROR: dockerd did not answer 'docker info' within ${WAIT}s." >&2
say "Last lines of $LOG:" >&2
tail -n 20 "$LOG" >&2 || true
exit 1
