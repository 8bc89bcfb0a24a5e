"""What the hub reads from the Docker engine: the checks the quotas depend on
(docker info), what each image holds (its label), and the engine's own view
of volumes and of paths inside a created container (the socket rule).

The engine calls go through ``docker``, DockerSpawner's ``self.docker``,
which runs each call in a thread; ``stat_in_container`` blocks, and is
called in a thread too.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from docker.errors import APIError
from docker.utils import decode_json_header

from .contract import FRAMEWORKS_LABEL
from .mounts import BindSource, is_socket, named_volumes, probe_paths
from .quota.model import QuotaTable
from .quota.units import format_human

Docker = Callable[..., Awaitable[Any]]  # DockerSpawner.docker: (method, *args, **kwargs)

SWAP_WARNING = (
    "The Docker engine cannot limit swap (docker info: SwapLimit false). "
    "Memory quotas are NOT fully enforced: containers can use swap beyond their "
    "memory limit. Enable swap accounting on the host (swapaccount=1 on the kernel "
    "command line for cgroup v1, or use cgroup v2)."
)


def check_engine_info(info: Mapping[str, Any], log: logging.Logger | logging.LoggerAdapter) -> bool:
    """Warn loudly about engine settings that weaken quotas; True when all is well."""
    ok = True
    if not info.get("SwapLimit", False):
        log.warning("!" * 20 + " %s " + "!" * 20, SWAP_WARNING)
        ok = False
    if not info.get("MemoryLimit", True):
        log.warning("The Docker engine cannot enforce memory limits (docker info: MemoryLimit "
                    "false): memory quotas will not be applied.")
        ok = False
    return ok


def check_engine(
    log: logging.Logger | logging.LoggerAdapter, client: Any = None
) -> dict[str, Any] | None:
    """Ask the engine for ``docker info`` and check it; blocking, for hub start.

    Returns the info, or None, after logging why, when the engine cannot be reached.
    """
    try:
        if client is None:
            import docker

            client = docker.from_env()
        info = client.info()
    except Exception as e:  # the hub must still start; spawns will say what is wrong
        log.warning("Cannot reach the Docker engine to check its limits: %s", e)
        return None
    check_engine_info(info, log)
    return info


def oversized_roles(table: QuotaTable, info: Mapping[str, Any] | None) -> list[str]:
    """A warning per role that asks for more CPUs or memory than the engine has.

    Warnings, not errors: overcommitting can be deliberate, but an admin
    should know that such a role can never get what it promises.
    """
    if not info:
        return []
    cpus, memory = info.get("NCPU"), info.get("MemTotal")
    warnings = []
    for role in table.roles.values():
        if cpus and role.cpus > cpus:
            warnings.append(f"Role '{role.name}' in {table.path} asks for {role.cpus:g} CPUs, "
                            f"but the Docker engine has {cpus}.")
        if memory and role.memory > memory:
            warnings.append(f"Role '{role.name}' in {table.path} asks for "
                            f"{format_human(role.memory)} of memory, but the Docker engine "
                            f"has {format_human(memory)}.")
    return warnings


_warned: set[str] = set()


def warn_oversized_roles(
    table: QuotaTable, info: Mapping[str, Any] | None, log: logging.Logger | logging.LoggerAdapter
) -> None:
    """Log each oversized role once per hub process (at hub start and after each edit)."""
    for warning in oversized_roles(table, info):
        if warning not in _warned:
            _warned.add(warning)
            log.warning("%s", warning)


class FrameworkLabels:
    """What each image holds, from its quota-spawner.frameworks label, read at most
    once a ``ttl``: the spawn form shows it, and the torch cap depends on it."""

    def __init__(self, ttl: float = 60.0):
        self.ttl = ttl
        self._read: dict[str, tuple[float, str]] = {}  # image -> (when read, label)

    async def get(self, images: Iterable[str], docker: Docker,
                  log: logging.Logger | logging.LoggerAdapter) -> dict[str, str]:
        """The label of each image that has one."""
        now = time.monotonic()
        found = {}
        for image in sorted(set(images)):
            cached = self._read.get(image)
            if cached is None or now - cached[0] > self.ttl:
                try:
                    info = await docker("inspect_image", image)
                    text = ((info.get("Config") or {}).get("Labels") or {}).get(FRAMEWORKS_LABEL)
                except Exception as e:  # a missing image is reported when it is started
                    log.debug("No contents label for %s: %s", image, e)
                    text = None
                cached = self._read[image] = (now, text or "")
            if cached[1]:
                found[image] = cached[1]
        return found


async def volume_info(docker: Docker, host: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The engine's view of the named volumes: a local volume may bind a host folder."""
    info = {}
    for name in named_volumes(host):
        try:
            info[name] = await docker("inspect_volume", name)
        except APIError as e:
            if e.status_code != 404:  # a missing volume is created empty
                raise
    return info


def stat_in_container(client: Any, container_id: str, path: str) -> dict[str, Any] | None:
    """The engine's stat of a path inside a created container (HEAD .../archive); blocks."""
    response = client.head(client._url("/containers/{0}/archive", container_id),
                           params={"path": path})
    if response.status_code == 404:
        return None
    client._raise_for_status(response)
    header = response.headers.get("X-Docker-Container-Path-Stat")
    return decode_json_header(header) if header else None


async def socket_probe_problems(client: Any, container_id: str,
                                binds: Iterable[BindSource]) -> list[str]:
    """Ask the engine what each bind of a created container really is: it sees
    through symlinks. One sentence per bind that reaches a socket."""
    problems = []
    for bind in binds:
        for path in probe_paths(bind.target):
            stat = await asyncio.to_thread(stat_in_container, client, container_id, path)
            if stat and is_socket(stat):
                problems.append(f"{bind.setting} mounts {bind.source!r} at {bind.target!r}, "
                                f"and the engine finds a socket at {path!r} in it; an "
                                "engine socket must never reach a notebook")
                break
    return problems


def docker_time(stamp: str | None) -> float | None:
    """The engine's RFC 3339 time ("2026-11-30T18:10:01.123456789Z", nanoseconds, Z or an
    offset) in epoch seconds; None when unset ("0001-01-01T00:00:00Z") or unreadable."""
    if not stamp or stamp.startswith("0001-"):
        return None
    from datetime import datetime

    main, _, rest = stamp.partition(".")
    zone = rest.lstrip("0123456789") if rest else stamp[19:]
    fraction = float("0." + rest[: len(rest) - len(zone)]) if rest else 0.0
    zone = "+00:00" if zone in ("Z", "") else zone
    try:
        return datetime.fromisoformat(main[:19] + zone).timestamp() + fraction
    except ValueError:
        return None


def container_end(client: Any, container_id: str, since: float) -> dict[str, Any] | None:
    """How a container that is gone ended, from the engine's event history (blocking):
    {"oom": killed for memory, "exit_code", "finished": epoch seconds}; None when the
    engine has no record of its end (it was restarted since, say).

    The engine removes our containers when they exit (AutoRemove), so their state,
    OOMKilled included, is gone by the time the hub polls; its events stay.
    """
    end: dict[str, Any] | None = None
    oom = False
    for event in client.events(since=int(since) - 1, until=int(time.time()) + 1, decode=True,
                               filters={"type": "container", "container": container_id}):
        action = event.get("Action") or event.get("status")
        if action == "oom":
            oom = True
        elif action == "die":
            attributes = (event.get("Actor") or {}).get("Attributes") or {}
            code = attributes.get("exitCode")
            end = {"exit_code": int(code) if str(code).lstrip("-").isdigit() else None,
                   "finished": (event.get("timeNano") or 0) / 1e9 or event.get("time")}
    if end is not None:
        end["oom"] = oom
    return end
