#!/usr/bin/env bash
# Build the small local base image `quota-spawner/base:local` without any
# container registry: debootstrap a minimal Debian bookworm and `docker import`
# it. It stands in for the CUDA framework images (pytorch/pytorch,
# paddlepaddle/paddle) on machines with no registry and no GPU; see images/README.md.
#
#   images/base/build.sh            # build if the image is missing or stale
#   FORCE=1 images/base/build.sh    # debootstrap and import again
#
# Env: BASE_IMAGE (tag, default quota-spawner/base:local),
#      DEBIAN_MIRROR (default http://deb.debian.org/debian), SUITE (bookworm).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BUILD_DIR=$(cd "$HERE/.." && pwd)/.build/base
TAG=${BASE_IMAGE:-quota-spawner/base:local}
SUITE=${SUITE:-bookworm}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
# Keep this list in step with what images/common/notebook-setup.sh expects;
# libgomp1 is the OpenMP runtime PaddlePaddle's CPU build links against.
PACKAGES=python3,python3-venv,ca-certificates,tini,passwd,bash,libgomp1

# Its own `say`, not scripts/lib.sh's: this script's code is hashed into the
# base image's label (INPUTS below), so sourcing a file here would rebuild the
# base and every image on it.
say() { echo "[base] $*"; }

# The image records what it was built from; change this script's code (not
# its comments), the package list, suite or mirror, and it is rebuilt.
INPUTS=$( { grep -v '^[[:space:]]*#' "$HERE/build.sh"; echo "$SUITE $MIRROR $PACKAGES"; } | sha256sum | cut -c1-16)

if [ "${FORCE:-0}" != 1 ] && docker image inspect "$TAG" >/dev/null 2>&1; then
    have=$(docker image inspect -f '{{index .Config.Labels "quota-spawner.inputs"}}' "$TAG" 2>/dev/null || true)
    if [ "$have" = "$INPUTS" ]; then
        say "$TAG is up to date"
        exit 0
    fi
    say "$TAG is stale (inputs $have, want $INPUTS): rebuilding"
fi

command -v debootstrap >/dev/null 2>&1 || {
    say "debootstrap missing: apt-get install debootstrap"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
}

ROOTFS=$BUILD_DIR/rootfs
STAMP=$BUILD_DIR/rootfs.inputs
mkdir -p "$BUILD_DIR"

if [ "${FORCE:-0}" = 1 ] || [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$INPUTS" ]; then
    TMP=$BUILD_DIR/rootfs.tmp
    cleanup() {
        for m in proc sys dev/pts; do umount "$TMP/$m" 2>/dev/null || true; done
    }
    trap cleanup EXIT
    rm -rf "$TMP" "$ROOTFS" "$STAMP"
    say "debootstrap --variant=minbase $SUITE ($PACKAGES) from $MIRROR"
    start=$(date +%s)
    if ! debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$TMP" "$MIRROR" \
            >"$BUILD_DIR/debootstrap.log" 2>&1; then
        tail -n 30 "$BUILD_DIR/debootstrap.log" >&2
        [ -f "$TMP/debootstrap/debootstrap.log" ] && tail -n 30 "$TMP/debootstrap/debootstrap.log" >&2
        echo "[base] ERROR: debootstrap failed (full log: $BUILD_DIR/debootstrap.log)" >&2
        exit 1
    fi
    cleanup
    trap - EXIT
    # Trim what a notebook base never needs: package caches, apt lists (an
    # upstream-style `apt-get update` fetches them again), docs, man pages.
    rm -rf "$TMP"/var/cache/apt/archives/*.deb "$TMP"/var/cache/apt/*.bin \
           "$TMP"/var/lib/apt/lists/* "$TMP"/usr/share/man/* "$TMP"/usr/share/info/* \
           "$TMP"/var/log/*.log
    find "$TMP/usr/share/doc" -mindepth 2 ! -name copyright -delete 2>/dev/null || true
    mv "$TMP" "$ROOTFS"
    echo "$INPUTS" >"$STAMP"
    say "debootstrap done in $(( $(date +%s) - start ))s"
else
    say "reusing cached rootfs $ROOTFS"
fi

say "docker import -> $TAG"
# An imported image has no ENV or CMD: set the basics here (the notebook
# Dockerfiles set PATH, HOME, LANG and SHELL again, so any base works).
tar --numeric-owner -C "$ROOTFS" \
    --exclude='./dev/*' --exclude='./proc/*' --exclude='./sys/*' -c . |
    docker import \
        -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        -c 'ENV LANG=C.UTF-8' \
        -c 'CMD ["/bin/bash"]' \
        -c "LABEL quota-spawner.inputs=$INPUTS" \
        -c "LABEL org.opencontainers.image.description=\"quota-spawner local base: Debian $SUITE minbase + python3\"" \
        - "$TAG" >/dev/null
say "$TAG: $(docker image inspect -f '{{.Size}}' "$TAG" | awk '{printf "%.0f MB", $1/1e6}')"
