"""The notebooks' parent cgroup: one memory limit around every notebook of this hub.

Each notebook container has its role's memory limit, but together they could still
take the memory the hub and the proxy need (admission off, or ``memory_overcommit``
above 1), and then the kernel's OOM killer chooses what dies. So every notebook
container of this hub is created under one parent cgroup (``HostConfig.CgroupParent``,
set by the product in container.py's quota, never by admin configuration), whose
memory limit is the notebooks' physical share of the host: what the engine has less
the reserve (host/admission.py), without the overcommit ratio. Past it, the kernel
reclaims and OOM-kills inside the notebooks' cgroup only; the hub and the proxy are
outside it.

How the limit is set depends on the engine's cgroup driver and version (``docker
info`` ``CgroupDriver``, ``CgroupVersion``):

- cgroupfs, v1: ``/sys/fs/cgroup/memory/<name>``: ``memory.limit_in_bytes`` and, with
  swap accounting, ``memory.memsw.limit_in_bytes`` (no swap, as for each container);
  the parent is ``/<name>``;
- cgroupfs, v2: ``/sys/fs/cgroup/<name>``: ``memory.max`` and ``memory.swap.max`` 0,
  with the memory controller enabled for the root's children; the parent is ``/<name>``;
- systemd, v1 or v2: the slice ``<name>.slice``, with ``systemctl set-property
  --runtime`` (``MemoryLimit=`` on v1, ``MemoryMax=`` and ``MemorySwapMax=0`` on v2);
  the parent is the slice.

The hub can do this only where it shares the engine's cgroup tree: on the engine's
machine, as root (or with ``/sys/fs/cgroup`` writable and the host's cgroup
namespace). Elsewhere ``ParentCgroupError`` says why and the hub logs it at start
(docs/deployment.md#the-notebooks-cgroup). Every function here blocks: call it in a
thread.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spawner.quota.units import format_human

CGROUP_ROOT = Path("/sys/fs/cgroup")
NAME_PREFIX = "quota_spawner_"
PAGE = 4096  # cgroup v1 rounds a limit down to whole pages
Run = Callable[..., subprocess.CompletedProcess[str]]


class ParentCgroupError(Exception):
    """The parent cgroup cannot be set up here; the message says why."""


@dataclass(frozen=True)
class ParentCgroup:
    """A parent cgroup whose memory limit is set."""

    parent: str  # HostConfig.CgroupParent for every notebook container of this hub
    limit: int  # bytes
    how: str  # "cgroup v1, cgroupfs driver, /sys/fs/cgroup/memory/…", for the log

    def describe(self) -> str:
        return (f"the notebooks together may use {format_human(self.limit)} of memory, in "
                f"the cgroup {self.parent} ({self.how}); past it the kernel's OOM killer "
                "acts inside that cgroup, never on the hub or the proxy")


def parent_cgroup_name(hub_id: str) -> str:
    """The parent cgroup's name for ``hub_id``: letters, digits and underscores only (a
    dash nests a systemd slice), with a hash when the id had to be changed."""
    safe = re.sub(r"[^A-Za-z0-9_]", "_", hub_id)[:48]
    if safe != hub_id:
        safe += "_" + hashlib.sha256(hub_id.encode()).hexdigest()[:8]
    return NAME_PREFIX + safe


def is_local(base_url: str) -> bool:
    """Whether a docker client's URL is a socket on this machine (not tcp:// or ssh://)."""
    return base_url.startswith(("http+docker://", "npipe://", "unix://"))


def set_up(info: Mapping[str, Any], hub_id: str, limit: int, *, local: bool,
           root: Path = CGROUP_ROOT, run: Run = subprocess.run) -> ParentCgroup:
    """Create (or update) the parent cgroup of ``hub_id``'s notebooks with ``limit`` bytes
    of memory, for the engine ``info`` describes; raises ParentCgroupError saying why not."""
    if limit <= 0:
        raise ParentCgroupError("the notebooks' share of the host's memory is 0")
    if not local:
        raise ParentCgroupError("the Docker engine is on another machine, whose cgroups this hub "
                         "cannot reach")
    driver = str(info.get("CgroupDriver") or "")
    version = str(info.get("CgroupVersion") or "1")
    name = parent_cgroup_name(hub_id)
    if driver == "systemd":
        return _systemd(name, limit, version, run)
    if driver != "cgroupfs":
        raise ParentCgroupError(f"the engine's cgroup driver is {driver or 'unknown'!r}, not "
                         "cgroupfs or systemd")
    if version == "2":
        return _cgroupfs_v2(name, limit, root)
    return _cgroupfs_v1(name, limit, root)


def _write(path: Path, value: str) -> None:
    try:
        path.write_text(value)
    except OSError as e:
        raise ParentCgroupError(f"cannot write {path}: {e.strerror or e}") from None


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return None if text == "max" else int(text)


def _make(path: Path) -> None:
    try:
        path.mkdir(exist_ok=True)
    except OSError as e:
        raise ParentCgroupError(f"cannot create {path}: {e.strerror or e}") from None


def _cgroupfs_v1(name: str, limit: int, root: Path) -> ParentCgroup:
    memory = root / "memory"
    if not (memory / "memory.limit_in_bytes").exists():
        raise ParentCgroupError(f"{memory} is not a cgroup v1 memory controller here")
    folder = memory / name
    _make(folder)
    limit_file, swap_file = folder / "memory.limit_in_bytes", folder / "memory.memsw.limit_in_bytes"
    value = str(limit)
    if swap_file.exists():
        # memory + swap may never be below memory: raise it first, lower it last
        current = _read_int(limit_file) or 0
        order = [(swap_file, value), (limit_file, value)] if limit > current else \
            [(limit_file, value), (swap_file, value)]
    else:
        order = [(limit_file, value)]
    for path, text in order:
        _write(path, text)
    _check(limit_file, limit)
    return ParentCgroup(f"/{name}", limit, f"cgroup v1, cgroupfs driver, {folder}")


def _cgroupfs_v2(name: str, limit: int, root: Path) -> ParentCgroup:
    try:
        controllers = (root / "cgroup.controllers").read_text().split()
    except OSError:
        raise ParentCgroupError(f"{root} is not a cgroup v2 hierarchy here") from None
    if "memory" not in controllers:
        raise ParentCgroupError(f"the memory controller is not available in {root}")
    subtree = root / "cgroup.subtree_control"
    if "memory" not in subtree.read_text().split():
        _write(subtree, "+memory")
    folder = root / name
    _make(folder)
    _write(folder / "memory.max", str(limit))
    if (folder / "memory.swap.max").exists():
        _write(folder / "memory.swap.max", "0")
    _check(folder / "memory.max", limit)
    return ParentCgroup(f"/{name}", limit, f"cgroup v2, cgroupfs driver, {folder}")


def _check(path: Path, limit: int) -> None:
    found = _read_int(path)
    if found is None or not limit - PAGE < found <= limit:
        raise ParentCgroupError(f"{path} reads {found} after writing {limit}")


def _systemd(name: str, limit: int, version: str, run: Run) -> ParentCgroup:
    unit = f"{name}.slice"
    systemctl = shutil.which("systemctl")
    if systemctl is None:
        raise ParentCgroupError("the engine uses the systemd cgroup driver, but systemctl is not "
                         "here")
    settings = ([f"MemoryMax={limit}", "MemorySwapMax=0"] if version == "2"
                else [f"MemoryLimit={limit}"])
    done = run([systemctl, "set-property", "--runtime", unit, *settings],
               capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise ParentCgroupError(f"systemctl set-property {unit} failed: "
                         f"{(done.stderr or done.stdout).strip()}")
    key = settings[0].partition("=")[0]
    shown = run([systemctl, "show", "-p", key, "--value", unit], capture_output=True,
                text=True, timeout=30)
    if shown.returncode != 0 or shown.stdout.strip() != str(limit):
        raise ParentCgroupError(f"systemctl show {unit} gives {key}={shown.stdout.strip()!r} after "
                         f"setting {limit}")
    return ParentCgroup(unit, limit, f"cgroup v{version}, systemd driver, slice {unit}")
