#!/usr/bin/env bash
# Build the notebook images quota-spawner/pytorch:latest and
# quota-spawner/paddle:latest, and everything they need, in one command:
#
#   1. the local base quota-spawner/base:local (images/base/build.sh; skipped
#      when up to date),
#   2. wheels on the host (images/.build/wheels): project/ holds this package,
#      deps/ everything in images/common/requirements.txt with all their
#      dependencies, resolved with Debian's Python 3.11.2 (images/README.md),
#   3. each image with `docker build --network none` on the local base.
#
# Each image carries the label quota-spawner.inputs: a hash of its Dockerfile,
# images/common/, the package sources (spawner/, pyproject.toml) and the base
# image. When the label matches, the image is skipped, so running this before
# every test run costs well under a second.
#
#   scripts/build-images.sh [pytorch] [paddle]   # default: both
#
# Env:
#   FORCE=1      rebuild the images even when their inputs are unchanged
#                (FORCE=1 images/base/build.sh redoes the base).
#   VERBOSE=1    stream `docker build` output (default: log to
#                images/.build/logs/<image>.log, shown on failure).
#   UPSTREAM=1   build FROM the pinned upstream CUDA images (pytorch/pytorch,
#                paddlepaddle/paddle) instead, with network and PyPI: for real
#                GPU hosts with a registry.
#   WHEEL_PYTHON interpreter that resolves the wheels (default .venv/bin/python,
#                which must be Debian's /usr/bin/python3, like the base).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

BUILD=images/.build
WHEELS=$BUILD/wheels
LOGS=$BUILD/logs
LOCAL_BASE=quota-spawner/base:local
ALL_IMAGES=(pytorch paddle)
IMAGES=("$@")
[ ${#IMAGES[@]} -gt 0 ] || IMAGES=("${ALL_IMAGES[@]}")
# Fixed zip timestamps: the same sources give the same project wheel, so
# Docker's layer cache holds when nothing changed.
export SOURCE_DATE_EPOCH=315532800

SAY_TAG=images
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$ROOT/scripts/lib.sh"

# The quota-spawner.inputs label of image TAG ("" when there is none).
inputs_label() { docker image inspect -f '{{index .Config.Labels "quota-spawner.inputs"}}' "$1" 2>/dev/null || true; }
image_size() { docker image inspect -f '{{.Size}}' "$1" | awk '{printf "%.0f MB", $1/1e6}'; }
wheel_count() { find "$1" -maxdepth 1 -name '*.whl' | wc -l; }

for name in "${IMAGES[@]}"; do
    [ -f "images/$name/Dockerfile" ] || die "no images/$name/Dockerfile"
done

mkdir -p "$BUILD" "$LOGS"
# One build at a time, machine-wide: the image tags are global, and parallel
# test runs or a second checkout (a CI clone) share them.
exec 9>"${TMPDIR:-/tmp}/quota-spawner-images.lock"
if ! flock -n 9; then
    say "another build is running; waiting for it"
    flock 9
fi

if ! docker info >/dev/null 2>&1; then
    [ -z "${DOCKER_HOST:-}" ] || die "no Docker engine answers at DOCKER_HOST=$DOCKER_HOST"
    scripts/dockerd.sh
fi

# ---------------------------------------------------------------- base ---
if [ "${UPSTREAM:-0}" = 1 ]; then
    BUILD_ARGS=()
    PIP_ARGS=""
else
    BASE_IMAGE=$LOCAL_BASE images/base/build.sh
    BUILD_ARGS=(--network none)
    PIP_ARGS=--no-index
fi
export DOCKER_BUILDKIT=0   # the legacy builder: Debian's engine may have no buildx (images/README.md)

# The base each notebook image is built FROM: upstream, the image's own
# Dockerfile default (the vendor's CUDA image); locally, a framework base
# (images/framework/Dockerfile): the local base plus the pinned wheels of
# images/NAME/framework.txt from the package index, built once and kept
# until that list or the local base changes.
framework_base() {   # NAME -> prints the tag to build FROM ("" = the Dockerfile's default)
    local name=$1
    [ "${UPSTREAM:-0}" != 1 ] || { echo ""; return; }
    local tag=quota-spawner/$name-framework:local
    local list=images/$name/framework.txt
    [ -f "$list" ] || die "no $list: the pinned framework of $name"
    local want have ctx t log
    want=$( { sha256sum <"$list"; sha256sum <images/framework/Dockerfile;
              docker image inspect -f '{{.Id}}' "$LOCAL_BASE"; } | sha256sum | cut -c1-16)
    have=$(inputs_label "$tag")
    if [ "${FORCE_FRAMEWORK:-0}" != 1 ] && [ "$have" = "$want" ]; then
        echo "$tag"; return
    fi
    t=$(now)
    ctx=$BUILD/frameworks/$name
    log=$LOGS/$name-framework.log
    say "$tag: ${have:-missing} -> $want; downloading the wheels of $list (log: $log)" >&2
    mkdir -p "$ctx"
    # Only the listed files stay: an old pin's wheel must not linger in the context.
    "${PIP[@]}" download -q --no-deps --only-binary :all: -d "$ctx.tmp" -r "$list" >"$log" 2>&1 ||
        { tail -n 30 "$log" >&2; die "downloading the wheels of $list failed"; }
    rm -rf "$ctx" && mv "$ctx.tmp" "$ctx" && cp "$list" "$ctx/framework.txt"
    say "$name framework: $(wheel_count "$ctx") wheels, $(du -sh "$ctx" | cut -f1); docker build $tag" >&2
    docker build --force-rm --network none --build-arg "BASE_IMAGE=$LOCAL_BASE" \
        --label "quota-spawner.inputs=$want" -f images/framework/Dockerfile -t "$tag" "$ctx" >>"$log" 2>&1 ||
        { tail -n 40 "$log" >&2; die "building $tag failed (full log: $log)"; }
    rm -rf "$ctx"  # gigabytes of wheels, now inside the image
    say "built $tag, $(image_size "$tag") ($(( $(now) - t ))s)" >&2
    echo "$tag"
}

# What the base's Python holds, for the label the spawn form shows.
frameworks_label() {   # BASE_TAG ("" = upstream: the Dockerfile's default) NAME
    local base=$1
    [ -n "$base" ] || base=$(sed -n 's/^ARG BASE_IMAGE=//p' "images/$2/Dockerfile" | head -n 1)
    local out
    out=$(docker run --rm --network none --entrypoint sh -i "$base" \
        -c 'exec "$(command -v python3 || command -v python)" -' \
        <images/common/frameworks.py 2>"$LOGS/$2.log") || return 1
    printf '%s\n' "$out" | tail -n 1
}

# -------------------------------------------------------------- inputs ---
# What goes into the project wheel: pyproject.toml, the package, and the
# few top-level files setuptools may read.
package_sources() {
    local f
    for f in pyproject.toml README.md README.rst LICENSE LICENSE.txt MANIFEST.in setup.py setup.cfg; do
        [ -f "$f" ] && echo "$f"
    done
    find spawner jupyter-config -type f ! -path '*/__pycache__/*' ! -name '*.py[co]' | LC_ALL=C sort
}

# Of pyproject.toml only the tables that shape the wheel count: editing
# [tool.ruff] or [tool.pytest] must not rebuild the images.
PYPROJECT_DIGEST=$(/usr/bin/python3 scripts/image_inputs.py pyproject-digest)

hash_files() {   # file names and contents
    local f
    for f in "$@"; do
        printf '%s\n' "$f"
        if [ "$f" = pyproject.toml ]; then echo "$PYPROJECT_DIGEST"; else sha256sum <"$f"; fi
    done | sha256sum | cut -c1-16
}

mapfile -t SOURCES < <(package_sources)
mapfile -t COMMON < <(find images/common images/.dockerignore -type f | LC_ALL=C sort)
SHARED_HASH=$( { hash_files "${SOURCES[@]}" "${COMMON[@]}"; echo "$PIP_ARGS"; } | sha256sum | cut -c1-16)

declare -A BASE_OF
image_hash() {   # NAME: sources, Dockerfile and the base it is built FROM
    local base_id=upstream
    [ -z "${BASE_OF[$1]}" ] || base_id=$(docker image inspect -f '{{.Id}}' "${BASE_OF[$1]}")
    { echo "$SHARED_HASH $base_id"; hash_files "images/$1/Dockerfile"; } | sha256sum | cut -c1-16
}

PY=${WHEEL_PYTHON:-.venv/bin/python}
if [ ! -x "$PY" ]; then
    # No project venv yet (setup.sh makes one): a small one just for pip.
    PY=$BUILD/wheel-venv/bin/python
    [ -x "$PY" ] || /usr/bin/python3 -m venv "$BUILD/wheel-venv"
fi
# The Python version of an interpreter: a path, or a command that runs one.
pyver() { "$@" -c 'import platform; print(platform.python_version())'; }
HOST_PY=$(pyver "$PY")
if [ "${UPSTREAM:-0}" != 1 ]; then
    BASE_PY=$(pyver docker run --rm --network none "$LOCAL_BASE" python3)
    [ "$HOST_PY" = "$BASE_PY" ] || die "$PY is Python $HOST_PY but the base image has $BASE_PY;" \
        "wheels resolved there may not install in the image. Recreate .venv with /usr/bin/python3" \
        "or set WHEEL_PYTHON."
fi
PIP=("$PY" -m pip --disable-pip-version-check)

for name in "${IMAGES[@]}"; do
    BASE_OF[$name]=$(framework_base "$name") || exit 1
done

STALE=()
for name in "${IMAGES[@]}"; do
    tag=quota-spawner/$name:latest
    want=$(image_hash "$name")
    have=$(inputs_label "$tag")
    if [ "${FORCE:-0}" != 1 ] && [ "$have" = "$want" ]; then
        say "$tag is up to date ($want)"
    else
        say "$tag: ${have:-missing} -> $want, will build"
        STALE+=("$name")
    fi
done
[ ${#STALE[@]} -gt 0 ] || exit 0

# -------------------------------------------------------------- wheels ---

t=$(now)
# Build from a clean copy: setuptools' build/ in the tree can keep modules
# that were deleted since, and would put them into the wheel.
rm -rf "$BUILD/src" "$WHEELS/project"
mkdir -p "$BUILD/src" "$WHEELS/project"
tar -cf - "${SOURCES[@]}" | tar -xf - -C "$BUILD/src"
"${PIP[@]}" wheel --no-deps -q -w "$WHEELS/project" "$BUILD/src" >"$LOGS/wheel-project.log" 2>&1 ||
    { tail -n 30 "$LOGS/wheel-project.log" >&2; die "building the quota-spawner wheel failed"; }
PROJECT_WHEEL=$(ls "$WHEELS"/project/quota_spawner-*.whl)
say "project wheel $(basename "$PROJECT_WHEEL") ($(( $(now) - t ))s)"

# Dependencies: resolved again only when what they come from changes.
DEPS_STAMP=$( { hash_files pyproject.toml images/common/requirements.txt; echo "$HOST_PY"; } | sha256sum | cut -c1-16)
if [ "$(cat "$WHEELS/deps.stamp" 2>/dev/null)" = "$DEPS_STAMP" ] && [ -d "$WHEELS/deps" ]; then
    say "dependency wheels up to date ($(wheel_count "$WHEELS/deps") wheels)"
else
    t=$(now)
    say "pip wheel: dependencies with Python $HOST_PY (log: $LOGS/wheel-deps.log)"
    rm -rf "$WHEELS/deps.tmp" "$WHEELS/deps.stamp"
    sed "s#^quota-spawner#$ROOT/$PROJECT_WHEEL#" images/common/requirements.txt >"$BUILD/requirements.txt"
    "${PIP[@]}" wheel -w "$WHEELS/deps.tmp" -r "$BUILD/requirements.txt" >"$LOGS/wheel-deps.log" 2>&1 ||
        { tail -n 30 "$LOGS/wheel-deps.log" >&2; die "pip wheel failed"; }
    rm -f "$WHEELS"/deps.tmp/quota_spawner-*.whl
    rm -rf "$WHEELS/deps"
    mv "$WHEELS/deps.tmp" "$WHEELS/deps"
    echo "$DEPS_STAMP" >"$WHEELS/deps.stamp"
    say "dependency wheels: $(wheel_count "$WHEELS/deps") wheels, $(du -sh "$WHEELS/deps" | cut -f1) ($(( $(now) - t ))s)"
fi

# quota-spawner's own requirements: the image installs them in its cached
# deps layer, then the package alone with --no-deps. (Docker's cache looks
# at content, so rewriting the same list each time costs nothing.)
/usr/bin/python3 scripts/image_inputs.py project-requirements >"$WHEELS/deps/project-requirements.txt"

# -------------------------------------------------------------- images ---
for name in "${STALE[@]}"; do
    tag=quota-spawner/$name:latest
    want=$(image_hash "$name")
    old=$(docker image inspect -f '{{.Id}}' "$tag" 2>/dev/null || true)
    log=$LOGS/$name.log
    t=$(now)
    say "docker build $tag (log: $log)"
    args=("${BUILD_ARGS[@]}" --build-arg "PIP_INSTALL_ARGS=$PIP_ARGS")
    [ -z "${BASE_OF[$name]}" ] || args+=(--build-arg "BASE_IMAGE=${BASE_OF[$name]}")
    # The framework must import in its base: an image whose torch or paddle
    # fails at import is never built.
    holds=$(frameworks_label "${BASE_OF[$name]}" "$name") ||
        { tail -n 20 "$LOGS/$name.log" >&2; die "the framework does not import in ${BASE_OF[$name]:-the upstream base}"; }
    say "$tag holds: ${holds:-?}"
    cmd=(docker build --force-rm "${args[@]}" --label "quota-spawner.inputs=$want"
         --label "quota-spawner.frameworks=$holds" -f "images/$name/Dockerfile" -t "$tag" images)
    if [ "${VERBOSE:-0}" = 1 ]; then
        set +e
        "${cmd[@]}" 2>&1 | tee "$log"
        ok=${PIPESTATUS[0]}
        set -e
    else
        ok=0
        "${cmd[@]}" >"$log" 2>&1 || ok=$?
    fi
    if [ "$ok" != 0 ]; then
        tail -n 40 "$log" >&2
        die "building $tag failed (full log: $log)"
    fi
    grep -h "WARNING: 'import spawner'" "$log" >&2 || true
    # Tag the builder stage (all cache hits now): it keeps the layer cache
    # that makes the next rebuild short, and lets the cleanup below tell
    # current cache from garbage.
    docker build --force-rm "${args[@]}" --target builder \
        -t "quota-spawner/build-cache:$name" -f "images/$name/Dockerfile" images >>"$log" 2>&1 ||
        say "WARNING: could not tag the build cache of $tag (see $log)"
    new=$(docker image inspect -f '{{.Id}}' "$tag")
    # Drop the image this one replaces (it is untagged now), unless a
    # container still uses it.
    if [ -n "$old" ] && [ "$old" != "$new" ]; then
        docker rmi "$old" >/dev/null 2>&1 || true
    fi
    say "built $tag, $(image_size "$tag") ($(( $(now) - t ))s)"
done

# ------------------------------------------------------------- cleanup ---
# Untagged leftovers of earlier builds: replaced notebook images, old
# builder caches, old bases. Images a container still uses are kept (docker
# rmi refuses); the current cache is tagged quota-spawner/build-cache:*.
freed=0
for id in $(docker images -q --filter dangling=true --filter label=quota-spawner.inputs); do
    docker rmi "$id" >/dev/null 2>&1 && freed=$((freed + 1))
done
[ "$freed" = 0 ] || say "removed $freed old untagged image(s)"
