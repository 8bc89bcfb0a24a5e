#!/bin/sh
# Shared build steps of the notebook images (images/pytorch, images/paddle).
# Both Dockerfiles run this script, once per build step:
#
#   notebook-setup.sh venv     `deps` stage: create the /opt/notebook venv
#                              (--system-site-packages, so the base image's
#                              torch / paddle stay importable) and install
#                              requirements.txt and quota-spawner's own
#                              dependencies, but not quota-spawner itself.
#   notebook-setup.sh package  `builder` stage: install quota-spawner
#                              (--no-deps) and stage its files under
#                              /opt/notebook-delta for the final stage.
#   notebook-setup.sh runtime  final stage: make sure tini and bash exist and
#                              create the user jovyan (uid 1000, gid 100) with
#                              a writable HOME /home/jovyan.
#
# Works on the local Debian base (no network: everything must already be
# there) and on upstream CUDA images (Ubuntu, conda or system Python), where
# apt-get is used only for what is missing.
#
# Env: PIP_INSTALL_ARGS (venv, package): extra pip arguments; the local
#      build passes "--no-index". --find-links for /wheels/deps and
#      /wheels/project (copied from images/.build/wheels) is always added.
set -eu

VENV=/opt/notebook
DELTA=/opt/notebook-delta
NB_USER=jovyan
NB_UID=1000
NB_GID=100
HERE=$(cd "$(dirname "$0")" && pwd)

say() { echo "[notebook-setup] $*"; }

apt_install() {
    # Only reached when something is missing; needs network.
    command -v apt-get >/dev/null 2>&1 || { say "ERROR: need $*, and there is no apt-get"; exit 1; }
    say "apt-get install $*"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "$@" >/dev/null
    apt-get clean
    rm -rf /var/lib/apt/lists/*
}

pip_install() {
    links=
    for d in /wheels/deps /wheels/project; do
        [ -d "$d" ] && links="$links --find-links $d"
    done
    # shellcheck disable=SC2086  # word lists on purpose
    PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PIP_ROOT_USER_ACTION=ignore \
        "$VENV/bin/pip" install --no-warn-script-location ${PIP_INSTALL_ARGS:-} $links "$@"
}

make_venv() {
    py=$(command -v python3 || command -v python || true)
    [ -n "$py" ] || { say "ERROR: the base image has no python3"; exit 1; }
    say "venv $VENV from $py ($("$py" -V 2>&1))"
    if ! "$py" -m venv --system-site-packages "$VENV" 2>/dev/null; then
        # Debian/Ubuntu system Python without ensurepip: add python3.X-venv.
        rm -rf "$VENV"
        ver=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
        apt_install "python$ver-venv"
        "$py" -m venv --system-site-packages "$VENV"
    fi
    # Everything but quota-spawner itself, including its own dependencies
    # (project-requirements.txt, written by scripts/build-images.sh from
    # pyproject.toml), so that this slow layer stays cached while only the
    # package changes.
    grep -v '^quota-spawner' "$HERE/requirements.txt" >/tmp/requirements-deps.txt
    [ -f /wheels/deps/project-requirements.txt ] &&
        cat /wheels/deps/project-requirements.txt >>/tmp/requirements-deps.txt
    pip_install -r /tmp/requirements-deps.txt
    rm -f /tmp/requirements-deps.txt
    # jupyter_events asks for jsonschema's format extras; one of them,
    # rfc3987-syntax, builds a parser grammar with lark at every import: 1.6 s
    # of a 3 s notebook server start. jsonschema skips the two formats it checks
    # ("iri", "iri-reference"; no Jupyter event schema uses them) without it.
    "$VENV/bin/pip" uninstall -y -q rfc3987-syntax lark

    say "smoke test"
    printf 'jupyterhub-singleuser %s\n' "$("$VENV/bin/jupyterhub-singleuser" --version)"
    printf 'jupyter lab %s\n' "$("$VENV/bin/jupyter-lab" --version)"
    "$VENV/bin/python" -c 'import jupyter_server, jupyterlab, pynvml, yaml'
}

install_package() {
    [ -x "$VENV/bin/pip" ] || { say "ERROR: run '$0 venv' first"; exit 1; }
    # quota-spawner comes from the copied wheel, by path: a same-named
    # distribution on an index can never be picked instead.
    whl=$(ls /wheels/project/quota_spawner-*.whl 2>/dev/null | head -n 1)
    [ -n "$whl" ] || { say "ERROR: no quota_spawner wheel in /wheels/project"; exit 1; }
    pip_install --no-deps "$whl"
    if "$VENV/bin/pip" check 2>/dev/null | grep -i '^quota-spawner'; then
        say "ERROR: quota-spawner's dependencies are not all installed (see above)"
        exit 1
    fi

    # Stage just the package's files (its RECORD: modules, dist-info, console
    # scripts, data files) under $DELTA, so the final stage copies a few
    # hundred KB on top of the cached venv instead of the whole venv again.
    rm -rf "$DELTA"
    "$VENV/bin/python" - "$DELTA" "$VENV" <<'PY'
import importlib.metadata as md
import os
import shutil
import sys

delta, venv = sys.argv[1], sys.argv[2]
dist = md.distribution("quota-spawner")
n = 0
for f in dist.files or []:
    src = os.path.normpath(os.path.abspath(dist.locate_file(f)))
    if not src.startswith(venv + "/"):
        sys.exit(f"unexpected path outside {venv}: {src}")
    if not os.path.lexists(src):
        continue
    dst = delta + src
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    shutil.copy2(src, dst, follow_symlinks=False)
    n += 1
print(f"[notebook-setup] staged {n} files of quota-spawner {dist.version} in {delta}")
PY

    # PyTorch's soft GPU memory cap (spawner/notebook/torch_cap.py): the .pth
    # line runs at every Python start, and imports the hook only when the
    # spawner set GPU_MEMORY_LIMIT.
    site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    mkdir -p "$DELTA$site"
    cp "$HERE/quota_spawner_gpu_cap.pth" "$DELTA$site/quota_spawner_gpu_cap.pth"

    # jupyterhub-singleuser is JupyterHub's own server, started through
    # spawner/notebook/launch.py: once the server has shut down, the process
    # exits without tearing down its 1,400 modules (0.35 s of CPU per stop;
    # docs/images.md#a-fast-stop). Same name, same arguments, so every
    # spawner that runs the image's command gets it.
    cat >"$VENV/bin/jupyterhub-singleuser" <<LAUNCHER
#!$VENV/bin/python
from spawner.notebook.launch import main

if __name__ == "__main__":
    main()
LAUNCHER
    chmod 0755 "$VENV/bin/jupyterhub-singleuser"
    mkdir -p "$DELTA$VENV/bin"
    cp -p "$VENV/bin/jupyterhub-singleuser" "$DELTA$VENV/bin/jupyterhub-singleuser"
    printf 'jupyterhub-singleuser %s, through spawner.notebook.launch\n' \
        "$("$VENV/bin/jupyterhub-singleuser" --version)"
    # The python3 kernel likewise: ipykernel through spawner/notebook/kernel.py, the
    # kernelspec's other fields (display name, debugger, protocol) as ipykernel wrote them.
    spec=share/jupyter/kernels/python3/kernel.json
    mkdir -p "$(dirname "$DELTA$VENV/$spec")"
    "$VENV/bin/python" - "$VENV/$spec" "$DELTA$VENV/$spec" <<'PY'
import json
import sys

try:
    spec = json.load(open(sys.argv[1]))
except FileNotFoundError:  # ipykernel came with the base image, outside the venv
    spec = {"argv": ["python", "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "Python 3 (ipykernel)", "language": "python",
            "metadata": {"debugger": True}}
assert spec["argv"][:3] == ["python", "-m", "ipykernel_launcher"], spec["argv"]
spec["argv"][2] = "spawner.notebook.kernel"
with open(sys.argv[2], "w") as f:
    json.dump(spec, f, indent=1)
    f.write("\n")
PY
    (cd /tmp && "$VENV/bin/python" -m spawner.notebook.kernel --version >/dev/null)

    # The images' Jupyter settings (not the package's: they apply to these
    # images only): jupyter-resource-usage against the container's limits,
    # JupyterLab without news, update checks, PyPI extension manager or
    # language-server scan (docs/images.md). config.d files carry only
    # jpserver_extensions, so the rest needs the plain config file.
    mkdir -p "$DELTA$VENV/etc/jupyter" "$DELTA$VENV/share/jupyter/lab/settings"
    cp "$HERE/jupyter_server_config.json" "$DELTA$VENV/etc/jupyter/jupyter_server_config.json"
    # and what depends on the server's environment (a home with a size: docs/disk.md)
    cp "$HERE/jupyter_server_config.py" "$DELTA$VENV/etc/jupyter/jupyter_server_config.py"
    cp "$HERE/lab-overrides.json" "$DELTA$VENV/share/jupyter/lab/settings/overrides.json"
    # The light JupyterLab, off until a server's JUPYTER_CONFIG_PATH names this
    # folder: a class's lab without the plugins its students do not need
    # (docs/images.md#a-lighter-jupyterlab-for-a-class).
    mkdir -p "$DELTA$VENV/etc/jupyter-light/labconfig"
    cp "$HERE/lab-light.json" "$DELTA$VENV/etc/jupyter-light/labconfig/page_config.json"

    # Checked, not required: a broken package import shows up here as a
    # warning (and in the tests) without blocking the image.
    "$VENV/bin/python" -c 'import spawner' || say "WARNING: 'import spawner' failed in the image"
}

setup_runtime() {
    missing=
    command -v tini >/dev/null 2>&1 || missing="$missing tini"
    command -v bash >/dev/null 2>&1 || missing="$missing bash"
    command -v useradd >/dev/null 2>&1 || missing="$missing passwd"
    # shellcheck disable=SC2086
    [ -z "$missing" ] || apt_install $missing

    getent group "$NB_GID" >/dev/null || groupadd -g "$NB_GID" users
    if id -u "$NB_USER" >/dev/null 2>&1; then
        usermod -u "$NB_UID" -g "$NB_GID" -d "/home/$NB_USER" -s /bin/bash "$NB_USER"
    elif other=$(getent passwd "$NB_UID" | cut -d: -f1) && [ -n "$other" ]; then
        # e.g. the `ubuntu` user of Ubuntu 24.04 images holds uid 1000.
        say "renaming user $other (uid $NB_UID) to $NB_USER"
        usermod -l "$NB_USER" -g "$NB_GID" -d "/home/$NB_USER" -s /bin/bash "$other"
    else
        useradd -l -u "$NB_UID" -g "$NB_GID" -d "/home/$NB_USER" -s /bin/bash "$NB_USER"
    fi
    # HOME exists in the image and belongs to jovyan, so Docker seeds a new
    # named volume mounted there with the same owner: writable.
    mkdir -p "/home/$NB_USER"
    if [ -d /etc/skel ]; then cp -rn /etc/skel/. "/home/$NB_USER/" 2>/dev/null || true; fi
    chown -R "$NB_UID:$NB_GID" "/home/$NB_USER"
    chmod 0755 "/home/$NB_USER"
    say "user: $(id "$NB_USER")"
}

case "${1:-}" in
    venv) make_venv ;;
    package) install_package ;;
    runtime) setup_runtime ;;
    *) echo "usage: $0 venv|package|runtime" >&2; exit 2 ;;
esac
