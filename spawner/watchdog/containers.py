"""The notebook containers on this host's engine, as the watchdog needs them.

``Containers.servers()`` lists the running containers that carry the
spawner's labels and describes each as a ``Server``: who, which role and
image, which GPUs, and its limits. Limits and the main PID do not change
while a container runs, except the CPU quota at the end of the start boost,
so each container is inspected when first seen and again every
``refresh`` seconds. ``OomEvents`` follows the engine's event stream for
the OOM kills that take a whole container with them (its cgroup is gone
before the next cycle could read the counter). ``EngineClient`` connects to
the engine when first used, so an engine that is down when the watchdog
starts is a cycle that says so (``EngineUnreachable``), not a failed start.

Blocking: the watchdog calls these in threads.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

from spawner.contract import (
    HUB_LABEL,
    USER_LABEL,
    gpu_memory_limit,
    reserved_cpus,
)
from spawner.quota.units import rfc3339_time as docker_time
from spawner.watchdog.model import Server


def server_from_inspect(info: Mapping[str, Any]) -> Server | None:
    """A ``Server`` from ``docker inspect``; None for a container without the user label."""
    config = info.get("Config") or {}
    labels = config.get("Labels") or {}
    if USER_LABEL not in labels:
        return None
    host = info.get("HostConfig") or {}
    env = dict(e.partition("=")[::2] for e in config.get("Env") or [])
    quota, period = host.get("CpuQuota") or 0, host.get("CpuPeriod") or 100_000
    cpus = quota / period if quota > 0 else None
    limit = (host.get("NanoCpus") or 0) / 1e9 or cpus
    state = info.get("State") or {}
    return Server.from_labels(
        labels,
        container_id=str(info.get("Id") or ""),
        name=str(info.get("Name") or "").lstrip("/"),
        memory_limit=host.get("Memory") or None,
        cpus=cpus,
        cpus_reserved=reserved_cpus(env, limit),
        gpu_memory_limit=gpu_memory_limit(env),
        pid=int(state.get("Pid") or 0),
        started=docker_time(state.get("StartedAt")),
    )


class EngineUnreachable(Exception):
    """The engine did not answer (not started, restarting, a wrong ``docker_host``)."""


class EngineClient:
    """docker's ``APIClient`` for ``base_url``, connected when first used: its API
    version is asked of the engine then, and again at the next use after a failure."""

    def __init__(self, base_url: str):
        self.base_url = base_url
        self._client: Any = None
        self._lock = threading.Lock()  # the cycle's thread and the OOM events' thread

    def connect(self) -> Any:
        with self._lock:
            if self._client is None:
                import docker

                try:
                    self._client = docker.APIClient(base_url=self.base_url, version="auto")
                except docker.errors.DockerException as error:
                    raise EngineUnreachable(str(error)) from None
            return self._client

    def __getattr__(self, name: str) -> Any:
        return getattr(self.connect(), name)


class Containers:
    """This host's notebook containers, for one hub (``hub_id``) or for all."""

    def __init__(self, client: Any, hub_id: str = "", refresh: float = 60.0,
                 engine_refresh: float = 300.0):
        self.client = client  # a docker APIClient
        self.hub_id = hub_id
        self.refresh = refresh
        self._seen: dict[str, tuple[float, Server]] = {}  # id -> (when inspected, server)
        self.engine_refresh = engine_refresh
        self._engine: tuple[float, tuple[float, int] | None] | None = None  # (when, size)

    def engine_size(self, now: float | None = None) -> tuple[float, int] | None:
        """The engine's CPUs and memory (docker info NCPU, MemTotal), asked at most every
        ``engine_refresh`` seconds (they change only with the machine); None when unknown."""
        now = time.monotonic() if now is None else now
        if self._engine is not None and now - self._engine[0] < self.engine_refresh:
            return self._engine[1]
        size = self._engine[1] if self._engine is not None else None
        try:
            info = self.client.info()
            cpus, memory = float(info.get("NCPU") or 0), int(info.get("MemTotal") or 0)
            size = (cpus, memory) if cpus > 0 and memory > 0 else None
        except Exception:  # the engine is down: its container list says so
            pass
        self._engine = (now, size)
        return size

    def servers(self, now: float | None = None) -> list[Server]:
        """The running notebook containers; EngineUnreachable when the engine does not
        answer."""
        import requests

        now = time.monotonic() if now is None else now
        try:
            listed = self.client.containers(
                filters={"label": USER_LABEL, "status": "running"})
        except requests.exceptions.ConnectionError as error:
            raise EngineUnreachable(str(error)) from None
        found: dict[str, tuple[float, Server]] = {}
        for entry in listed:
            labels = entry.get("Labels") or {}
            if self.hub_id and labels.get(HUB_LABEL) != self.hub_id:
                continue
            cid = entry["Id"]
            cached = self._seen.get(cid)
            if cached is None or now - cached[0] >= self.refresh:
                try:
                    server = server_from_inspect(self.client.inspect_container(cid))
                except Exception:  # gone between the list and the inspect
                    continue
                if server is None or not server.pid:
                    continue
                cached = (now, server)
            found[cid] = cached
        self._seen = found
        return [server for _, server in found.values()]


class OomEvents:
    """The engine's OOM events for notebook containers, collected by a daemon thread."""

    def __init__(self, client: Any, hub_id: str, log: logging.Logger | logging.LoggerAdapter):
        self.client, self.hub_id, self.log = client, hub_id, log
        self._events: list[Server] = []
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._follow, name="oom-events", daemon=True)
        self._thread.start()

    def take(self) -> list[Server]:
        """The OOM-killed servers since the last call."""
        with self._lock:
            events, self._events = self._events, []
        return events

    def _follow(self) -> None:
        lost = ""  # why the stream was lost: logged once while the engine stays away
        while True:
            try:
                stream = self.client.events(decode=True,
                                            filters={"event": "oom", "label": USER_LABEL})
                if lost:
                    self.log.info("Following the engine's event stream again")
                    lost = ""
                for event in stream:
                    self._record(event)
            except Exception as e:  # the engine restarted: follow it again
                if str(e) != lost:
                    self.log.warning("Lost the engine's event stream (%s); following it "
                                     "again", e)
                    lost = str(e)
                time.sleep(5)

    def _record(self, event: Mapping[str, Any]) -> None:
        actor = event.get("Actor") or {}
        labels = dict(actor.get("Attributes") or {})
        if self.hub_id and labels.get(HUB_LABEL) != self.hub_id:
            return
        info = {"Id": actor.get("ID", ""), "Name": labels.get("name", ""),
                "Config": {"Labels": labels}}
        server = server_from_inspect(info)
        if server is not None:
            with self._lock:
                self._events.append(server)
