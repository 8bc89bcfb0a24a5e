"""A home with a size, as the create body has it: the bind, the read-only root, /tmp.

Where the hub enforces disk (docs/disk.md), a server's home is a host folder of its
role's size (spawner/homes), bind-mounted as the home in place of the Docker volume,
and disk cannot be filled around it:

- the root filesystem is read-only (``ReadonlyRootfs``): the container's writable layer,
  which overlay2 cannot size without XFS project quotas, takes no byte;
- ``/tmp`` and ``/var/tmp`` are tmpfs, whose pages count in the container's memory
  cgroup (checked on cgroup v1 and v2), each as large as the role's memory, as
  Kubernetes sizes a memory-backed emptyDir: what a user puts there, they take from
  their memory;
- the folder with the home's use (``home.json``, written by docker/homes.py at the
  start and by the watchdog) is bound read-only at HOME_USE_DIR.

``apply_home`` writes that on top of the body (any other mount at the home or at
HOME_USE_DIR goes: an override's volume there would lift the limit), and
``home_problems`` is the last check's part. Pure, like container.py.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from spawner.contract import (
    DISK_LABEL,
    DISK_LIMIT,
    HOME_OVER_SIZE,
    HOME_USE_DIR,
    HOME_USE_FILE,
    HOME_USE_PATH,
    OFF_HOME,
)

# The writable places of a read-only root besides the home and /dev/shm.
TMPFS_PATHS = ("/tmp", "/var/tmp")


@dataclass(frozen=True)
class HomeBind:
    """This start's home where disk is enforced: the host folder bound as the home, the
    role's size, the host folder of its use file, and the sentence for a home that held
    its size or more at the start ("" otherwise)."""

    path: str
    size: int
    use_folder: str
    over_size: str = ""


def disk_label(home: HomeBind | None) -> dict[str, str]:
    """The DISK_LABEL: the home's size in bytes, "" without one."""
    return {DISK_LABEL: str(home.size) if home is not None else ""}


def disk_environment(home: HomeBind | None) -> dict[str, str]:
    """The contract's disk variables (only with a home of a size)."""
    if home is None:
        return {}
    env = {DISK_LIMIT: str(home.size), HOME_USE_FILE: HOME_USE_PATH}
    if home.over_size:
        env[HOME_OVER_SIZE] = home.over_size
    return env


def tmpfs_options(memory: int) -> str:
    return f"rw,nosuid,nodev,size={memory},mode=1777"


def _target(path: Any) -> str:
    return posixpath.normpath("/" + str(path or "").strip("/"))


def _bind_target(spec: Any) -> str:
    parts = str(spec).split(":")
    return _target(parts[1] if len(parts) > 1 else parts[0])


def home_mounts(home: HomeBind, home_dir: str) -> list[dict[str, Any]]:
    """The two binds: the home, writable, and its use folder, read-only."""
    return [
        {"Type": "bind", "Source": home.path, "Target": _target(home_dir), "ReadOnly": False},
        {"Type": "bind", "Source": home.use_folder, "Target": HOME_USE_DIR, "ReadOnly": True},
    ]


def apply_home(body: dict[str, Any], home: HomeBind | None, home_dir: str,
               memory: int) -> None:
    """Write the home of a size on top of a create body, in place; nothing without one."""
    if home is None:
        return
    host = body["HostConfig"]
    ours = {_target(home_dir), HOME_USE_DIR}
    host["Binds"] = [b for b in host.get("Binds") or [] if _bind_target(b) not in ours]
    host["Mounts"] = [m for m in host.get("Mounts") or []
                      if _target(m.get("Target")) not in ours] + home_mounts(home, home_dir)
    if isinstance(body.get("Volumes"), dict):  # DockerSpawner's anonymous mount points
        body["Volumes"] = {k: v for k, v in body["Volumes"].items() if _target(k) not in ours}
    host["ReadonlyRootfs"] = True
    host["Tmpfs"] = {**{k: v for k, v in (host.get("Tmpfs") or {}).items()
                        if _target(k) not in TMPFS_PATHS},
                     **dict.fromkeys(TMPFS_PATHS, tmpfs_options(memory))}
    env = [e for e in body.get("Env") or [] if e.partition("=")[0] not in OFF_HOME]
    body["Env"] = env + [f"{k}={v}" for k, v in OFF_HOME.items()]


def home_problems(body: Mapping[str, Any], home: HomeBind | None, home_dir: str,
                  memory: int) -> list[str]:
    """Every way the body breaks the home's limit or lets disk fill around it."""
    if home is None:
        return []
    host: Mapping[str, Any] = body.get("HostConfig") or {}
    problems = []
    ours = {_target(home_dir): "the home", HOME_USE_DIR: "the home's use"}
    for spec in host.get("Binds") or []:
        if _bind_target(spec) in ours:
            problems.append(f"HostConfig.Binds has {spec!r}: only the spawner mounts "
                            f"{ours[_bind_target(spec)]}, so that its size holds")
    for wanted in home_mounts(home, home_dir):
        found = [m for m in host.get("Mounts") or [] if _target(m.get("Target")) ==
                 wanted["Target"]]
        if len(found) != 1 or {k: found[0].get(k) for k in wanted} != wanted or any(
                found[0].get(k) for k in ("VolumeOptions", "TmpfsOptions", "BindOptions")):
            problems.append(f"HostConfig.Mounts at {wanted['Target']} are {found!r}, not "
                            f"[{wanted!r}]: only {ours[wanted['Target']]}, as the spawner "
                            "made it, goes there")
    if host.get("ReadonlyRootfs") is not True:
        problems.append("HostConfig.ReadonlyRootfs is not true: with a home of a size, the "
                        "container's own layer must take no byte")
    tmpfs = host.get("Tmpfs") or {}
    for path in TMPFS_PATHS:
        if tmpfs.get(path) != tmpfs_options(memory):
            problems.append(f"HostConfig.Tmpfs[{path!r}] is {tmpfs.get(path)!r}, not "
                            f"{tmpfs_options(memory)!r}: counted in the role's memory")
    env = [str(e).partition("=") for e in body.get("Env") or []]
    for name, value in OFF_HOME.items():
        values = [v for n, _, v in env if n == name]
        if values != [value]:
            problems.append(f"environment {name} is {values!r}, not [{value!r}]: what every "
                            "Jupyter start writes stays out of a home that may be full")
    return problems
