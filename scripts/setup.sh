#!/usr/bin/env bash
# Prepare a fresh machine (Debian bookworm, root, no GPU, no registry) to
# run the tests, the demo and the bench. Idempotent: each step checks first
# and skips what is already done, so `make test` can run it every time.
#
#   1. apt: docker.io debootstrap chromium python3-venv python3-pip postgresql btrfs-progs
#      e2fsprogs (missing only; the tests' private PostgreSQL is scripts/test-postgres.sh;
#      the homes' tests make btrfs and ext4 filesystems on loop devices)
#   2. npm: configurable-http-proxy from package-lock.json into node_modules/
#   3. .venv (Debian's /usr/bin/python3) with `pip install -e '.[test,notebook,kubernetes]'`
#   4. a running Docker engine: the machine's own (scripts/dockerd.sh), or
#      with SETUP_ENGINE=test the private test engine that carries the fake
#      NVIDIA hook (scripts/test-dockerd.sh), which `make test` and the bench use
#   5. the notebook images in that engine (scripts/build-images.sh)
#
# Env: SKIP_IMAGES=1 stops after step 4. SETUP_ENGINE=system (default) or test.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

SAY_TAG=setup
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$ROOT/scripts/lib.sh"
T0=$(now)

# ------------------------------------------------------------------ apt ---
installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }
missing=()
for pkg in docker.io debootstrap chromium python3-venv python3-pip postgresql btrfs-progs e2fsprogs; do
    installed "$pkg" || missing+=("$pkg")
done
# node and npm come from the machine image (NodeSource node 20); Debian's
# own are the fallback.
command -v npm >/dev/null 2>&1 || missing+=(nodejs npm)
if [ ${#missing[@]} -gt 0 ]; then
    [ "$(id -u)" -eq 0 ] || die "need root to apt-get install ${missing[*]}"
    say "apt-get install ${missing[*]}"
    apt_install "${missing[@]}"
else
    say "system packages present"
fi

# ------------------------------------------------------------------ npm ---
# npm writes node_modules/.package-lock.json on every install: newer than
# package-lock.json means node_modules matches it.
if [ -x node_modules/.bin/configurable-http-proxy ] &&
   [ node_modules/.package-lock.json -nt package-lock.json ]; then
    say "configurable-http-proxy present"
else
    say "npm ci (configurable-http-proxy)"
    # configurable-http-proxy 5 runs on node 20; npm's EBADENGINE warning is harmless
    # (docs/deployment.md#prerequisites).
    npm ci --no-audit --no-fund --loglevel=error
fi

# ----------------------------------------------------------------- venv ---
# Debian's Python, not the machine's default python3: the images run
# Debian's 3.11.2 and the wheels are resolved with this venv.
if [ ! -x .venv/bin/python ]; then
    say "creating .venv with /usr/bin/python3"
    /usr/bin/python3 -m venv .venv
fi
home=$(sed -n 's/^home *= *//p' .venv/pyvenv.cfg)
[ "$home" = /usr/bin ] || say "WARNING: .venv was made from $home, not /usr/bin; image wheels may not match (rm -rf .venv to redo)"

stamp=.venv/.quota-spawner-setup
want=$(sha256sum pyproject.toml | cut -c1-16)
if [ "$(cat "$stamp" 2>/dev/null)" = "$want" ] && .venv/bin/python -c 'import spawner' 2>/dev/null; then
    say ".venv up to date"
else
    say "pip install -e '.[test,notebook,kubernetes]'"
    log=.venv/.quota-spawner-setup.log
    .venv/bin/python -m pip install --disable-pip-version-check -e '.[test,notebook,kubernetes]' >"$log" 2>&1 ||
        { tail -n 30 "$log" >&2; die "pip install failed (log: $log)"; }
    echo "$want" >"$stamp"
fi
# jupyter_events asks for jsonschema's format extras; one of them, rfc3987-syntax, builds
# 39 lark grammars whenever jsonschema is imported, as JupyterHub does at every start: 0.8 s
# of a hub's 2.1 s of CPU to come up. Without it jsonschema skips the two formats it
# checks (iri, iri-reference), which no Jupyter event schema uses. The images do the same
# (images/common/notebook-setup.sh).
if .venv/bin/python -c 'import importlib.util as u, sys; sys.exit(u.find_spec("rfc3987_syntax") is None)'; then
    say "pip uninstall rfc3987-syntax lark (a hub starts in 0.8 s less CPU)"
    .venv/bin/python -m pip uninstall -y -q rfc3987-syntax lark
fi

# --------------------------------------------------------------- docker ---
case "${SETUP_ENGINE:-system}" in
    system) scripts/dockerd.sh ;;
    test)
        scripts/test-dockerd.sh
        DOCKER_HOST=$(scripts/test-dockerd.sh --host)
        export DOCKER_HOST ;;
    *) die "SETUP_ENGINE must be system or test, not $SETUP_ENGINE" ;;
esac

# --------------------------------------------------------------- images ---
if [ "${SKIP_IMAGES:-0}" = 1 ]; then
    say "SKIP_IMAGES=1: not building images"
else
    scripts/build-images.sh
fi

say "done in $(( $(now) - T0 ))s"
