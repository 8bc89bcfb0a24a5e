#!/usr/bin/env bash
# Start the private Docker engine the test suite and the bench run against,
# or reuse it when it already answers. It is separate from the machine's own
# engine (scripts/dockerd.sh), because it carries the FAKE NVIDIA hook
# (scripts/fake-nvidia/): dockerd enables its `nvidia` device driver when
# that hook is on its PATH, so containers with GPU DeviceRequests really
# start on a machine without a GPU
# (docs/deployment.md#tests-and-the-private-test-engine). Users' containers
# never run on this engine.
#
# Everything it owns lives under its own paths, so it runs beside a system
# dockerd:
#   socket   unix:///run/quota-spawner-test/docker.sock   (print with --host)
#   data     /var/lib/quota-spawner-test
#   bridge   qs-test0 (172.31.254.1/24), no iptables rules
#   log      /var/log/quota-spawner-test-dockerd.log
#
#   scripts/test-dockerd.sh          start it (idempotent) and wait for it
#   scripts/test-dockerd.sh --host   print the DOCKER_HOST value
#   scripts/test-dockerd.sh --stop   stop it
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
RUN=/run/quota-spawner-test
SOCK=$RUN/docker.sock
HOST=unix://$SOCK
DATA=${TEST_DOCKER_DATA:-/var/lib/quota-spawner-test}
BRIDGE=qs-test0
BRIDGE_CIDR=172.31.254.1/24
LOG=${TEST_DOCKERD_LOG:-/var/log/quota-spawner-test-dockerd.log}
WAIT=${DOCKERD_WAIT:-60}
HOOK_DIR=$ROOT/scripts/fake-nvidia
# The engine's own copy of the fake hook: the engine outlives the checkout that started
# it (a clean clone that CI removes), and must still find its hook afterwards.
ENGINE_BIN=$RUN/bin
HOOK=nvidia-container-runtime-hook

SAY_TAG=test-dockerd
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$ROOT/scripts/lib.sh"
answers() { DOCKER_HOST=$HOST docker info >/dev/null 2>&1; }
# The running engine has ENGINE_BIN first on its PATH, and the hook is there.
finds_hook() {
    local pid
    pid=$(cat "$RUN/docker.pid" 2>/dev/null) || return 1
    tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx "PATH=$ENGINE_BIN:.*" &&
        [ -x "$ENGINE_BIN/$HOOK" ]
}

case "${1:-}" in
    --host) echo "$HOST"; exit 0 ;;
    --stop)
        if [ -f "$RUN/docker.pid" ] && kill "$(cat "$RUN/docker.pid")" 2>/dev/null; then
            say "stopping"
            for _ in $(seq 1 30); do answers || exit 0; sleep 1; done
        fi
        exit 0 ;;
    "") ;;
    *) die "unknown argument $1" ;;
esac

if answers; then
    if finds_hook; then
        say "test engine already running at $HOST"
        exit 0
    fi
    say "the running test engine cannot find its fake NVIDIA hook (started by an older" \
        "setup, or from a checkout since removed); restarting it"
    "$0" --stop
fi
[ "$(id -u)" -eq 0 ] || die "starting the test engine needs root"

# The fake hook must never shadow a real NVIDIA toolkit.
for real in nvidia-container-runtime-hook nvidia-container-toolkit nvidia-ctk; do
    if command -v "$real" >/dev/null 2>&1; then
        die "this host has a real NVIDIA toolkit ($(command -v "$real")); the test engine's fake hook must not run here"
    fi
done

ensure_dockerd

mkdir -p "$RUN" "$DATA" "$(dirname "$LOG")"
drop_stale_pidfile "$RUN/docker.pid"

if [ -f "$RUN/docker.pid" ]; then
    say "the test dockerd exists but does not answer yet; waiting for it"
else
    # Its own bridge, so it does not fight a system dockerd over docker0.
    if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
        ip link add "$BRIDGE" type bridge
        ip addr add "$BRIDGE_CIDR" dev "$BRIDGE"
    fi
    ip link set "$BRIDGE" up
    mkdir -p "$ENGINE_BIN"
    install -m 0755 "$HOOK_DIR/$HOOK" "$ENGINE_BIN/$HOOK"
    say "starting (log: $LOG)"
    # setsid: own session, so the caller's SIGINT/SIGHUP does not reach it.
    PATH="$ENGINE_BIN:$PATH" setsid nohup dockerd \
        --host "$HOST" \
        --data-root "$DATA/docker" \
        --exec-root "$RUN/exec" \
        --pidfile "$RUN/docker.pid" \
        --bridge "$BRIDGE" \
        --iptables=false --ip-masq=false \
        >>"$LOG" 2>&1 </dev/null &
fi

if retry_seconds "$WAIT" answers; then
    say "test engine ready at $HOST"
    exit 0
fi
say "ERROR: the test dockerd did not answer within ${WAIT}s. Last lines of $LOG:" >&2
tail -n 20 "$LOG" >&2 || true
exit 1
