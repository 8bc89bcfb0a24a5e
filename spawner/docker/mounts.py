"""The socket rule: no container engine's socket ever reaches a notebook.

A notebook that can reach the Docker, containerd or Podman socket is root on
the host. The rule is decided from the engine's point of view, never from
what exists on the hub's filesystem (the hub may run in a container, or on a
machine where nothing listens at the default socket):

- every bind source (binds, mounts, read-only volumes, local volumes that
  bind a host folder) is normalised as the engine would read it, and the
  engine sockets, every folder above them, and ``/`` are refused;
- after the container is created, and before it starts, the engine itself is
  asked what each bind target holds, which sees through symlinks
  (``probe_paths`` and ``is_socket``).
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

# The engines' sockets as their packages place them. /var/run is a symlink to
# /run on every current distribution, so both spellings are covered.
ENGINE_SOCKETS = (
    "/run/docker.sock",
    "/run/docker/containerd/containerd.sock",  # dockerd's own containerd
    "/run/containerd/containerd.sock",
    "/run/podman/podman.sock",
    "/run/crio/crio.sock",
)
SOCKET_NAMES = frozenset({"docker.sock", "containerd.sock", "podman.sock", "crio.sock"})
# Rootless engines keep their sockets in the user's runtime folder.
_ROOTLESS = re.compile(r"^/run/user(/[^/]+)?(/(docker|podman|containerd))?$")
# Inside a bound folder, where an engine socket would sit.
PROBE_NAMES = (
    "docker.sock",
    "containerd.sock",
    "podman.sock",
    "docker/containerd/containerd.sock",
    "containerd/containerd.sock",
    "podman/podman.sock",
    "crio.sock",
    "crio/crio.sock",
)
# Go's os.ModeSocket, in the mode the engine reports for a path in a container.
GO_MODE_SOCKET = 1 << 24


def normalise(path: str) -> str:
    """The path as the engine resolves it lexically: no '.', '..', '//' or trailing '/'."""
    path = "/" + str(path).lstrip("/")
    path = posixpath.normpath(path)
    if path == "/var/run" or path.startswith("/var/run/"):
        path = "/run" + path[len("/var/run"):]
    return path


def _folders_above(path: str) -> set[str]:
    folders = set()
    while path != "/":
        path = posixpath.dirname(path)
        folders.add(path)
    return folders


# Every folder above an engine socket, ``/`` included; /var holds /var/run.
FORBIDDEN_FOLDERS = frozenset({"/var"}.union(*(_folders_above(s) for s in ENGINE_SOCKETS)))


def refused(source: str) -> str | None:
    """Why this bind source must never be mounted, or None when it may be."""
    path = normalise(source)
    if path == "/":
        return "it is the host's root folder, which holds the container engine's socket"
    if posixpath.basename(path) in SOCKET_NAMES or path in ENGINE_SOCKETS:
        return "it is a container engine's socket"
    if _ROOTLESS.match(path):
        return "it holds a rootless container engine's socket"
    if path in FORBIDDEN_FOLDERS:
        return "it is a folder that holds a container engine's socket"
    return None


@dataclass(frozen=True)
class BindSource:
    """A host path that a container mount binds, and where it lands inside."""

    setting: str  # where it comes from, for the message: "Binds", "Mounts", "volume quota-x"
    source: str
    target: str


def _bind_target(spec: str) -> tuple[str, str]:
    source, _, rest = spec.partition(":")
    return source, rest.partition(":")[0]


def _bind_device(driver: str | None, options: Mapping[str, Any] | None) -> str | None:
    """The host folder a local-driver volume binds (``o=bind``), if it is one."""
    options = options or {}
    if (driver or "local") != "local":
        return None
    flags = str(options.get("o") or "").split(",")
    if "bind" in flags or "rbind" in flags or str(options.get("type") or "") == "none":
        device = options.get("device")
        return str(device) if device else None
    return None


def named_volumes(host_config: Mapping[str, Any]) -> list[str]:
    """Named volumes the container uses, whose driver options only the engine knows."""
    names = []
    for spec in host_config.get("Binds") or []:
        source, _ = _bind_target(str(spec))
        if source and not source.startswith("/"):
            names.append(source)
    for mount in host_config.get("Mounts") or []:
        options = mount.get("VolumeOptions") or {}
        if mount.get("Type") == "volume" and mount.get("Source") and not options.get(
            "DriverConfig"
        ):
            names.append(str(mount["Source"]))
    return names


def bind_sources(
    host_config: Mapping[str, Any], volumes: Mapping[str, Mapping[str, Any]] | None = None
) -> Iterator[BindSource]:
    """Every host path the container would bind, from an engine HostConfig.

    ``volumes`` maps a named volume to the engine's ``docker volume inspect``
    of it, for the local volumes that bind a host folder.
    """
    volumes = volumes or {}
    for spec in host_config.get("Binds") or []:
        source, target = _bind_target(str(spec))
        if source.startswith("/"):
            yield BindSource("Binds", source, target)
        elif source in volumes:
            info = volumes[source]
            device = _bind_device(info.get("Driver"), info.get("Options"))
            if device:
                yield BindSource(f"volume {source}", device, target)
    for mount in host_config.get("Mounts") or []:
        kind, source, target = mount.get("Type"), mount.get("Source"), mount.get("Target", "")
        if kind == "bind" and source:
            yield BindSource("Mounts", str(source), target)
        elif kind == "volume":
            config = (mount.get("VolumeOptions") or {}).get("DriverConfig") or {}
            device = _bind_device(config.get("Name"), config.get("Options"))
            if device is None and source in volumes:
                info = volumes[source]
                device = _bind_device(info.get("Driver"), info.get("Options"))
            if device:
                yield BindSource(f"volume {source or '(inline)'}", device, target)


def socket_problems(binds: Iterable[BindSource]) -> list[str]:
    """One sentence per bind that the socket rule refuses."""
    problems = []
    for bind in binds:
        reason = refused(bind.source)
        if reason:
            problems.append(f"{bind.setting} mounts {bind.source!r} at {bind.target!r}: {reason}")
    return problems


def probe_paths(target: str) -> list[str]:
    """Paths inside the container to ask the engine about for one bind target."""
    target = "/" + target.strip("/")
    return [target, *(posixpath.join(target, name) for name in PROBE_NAMES)]


def is_socket(stat: Mapping[str, Any]) -> bool:
    """Whether the engine's stat of a container path (X-Docker-Container-Path-Stat) is a socket."""
    return bool(int(stat.get("mode") or 0) & GO_MODE_SOCKET)
