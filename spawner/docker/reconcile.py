"""The GPU pool in step with the Docker engine.

The labels on running containers are the record of which GPUs are held
(docs/gpus.md#hub-restarts-and-unclaimed-containers). The ``Reconciler``
rebuilds the pool's holdings from them before the hub serves its first spawn
(``ready``), and then on a timer (``gpu_sync_interval``):

- a holding whose container is gone (``docker rm``, OOM, a crash) is released;
- a running container holding GPUs that the pool does not know about (another
  hub process, a restart) is adopted, so its GPUs are never handed out;
- a container of this hub that no spawner claims (a "zombie", e.g. left by a
  hub whose database was lost) is reported, and stopped and removed after a
  grace period, which releases its GPUs and closes its session as ``zombie``.
  Its home volume is kept.

Docker and NVML calls run in threads; the pool itself is in memory.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from spawner.contract import (
    GPU_MODE_LABEL,
    GPUS_LABEL,
    HUB_LABEL,
    ROLE_LABEL,
    USER_LABEL,
    labelled_gpus,
    reserved_cpus,
)
from spawner.gpu.allocator import GpuRequest
from spawner.gpu.inventory import free_memory
from spawner.gpu.pool import GpuPool, Server
from spawner.host.admission import Reservation
from spawner.usage.ledger import ZOMBIE, LedgerWriter

ALIVE_STATES = ("created", "running", "restarting", "paused")


def container_name(container: dict[str, Any]) -> str:
    names = container.get("Names") or ["/"]
    return names[0].lstrip("/")


def room_of(info: dict[str, Any]) -> Reservation:
    """The CPUs and memory a container reserves, from ``docker inspect``: its role's CPUs
    (CPU_LIMIT; its CPU quota is the start boost's for its first seconds), else its CPU
    quota or NanoCpus, and its memory limit."""
    host = info.get("HostConfig") or {}
    quota, period = host.get("CpuQuota") or 0, host.get("CpuPeriod") or 100_000
    limit = (host.get("NanoCpus") or 0) / 1e9 or (quota / period if quota > 0 else 0.0)
    env = dict(e.partition("=")[::2] for e in (info.get("Config") or {}).get("Env") or [])
    return Reservation(reserved_cpus(env, limit) or 0.0, int(host.get("Memory") or 0))


def request_from_labels(labels: dict[str, str]) -> tuple[tuple[str, ...], GpuRequest | None]:
    """The UUIDs and the kind of holding a container's labels record."""
    uuids = labelled_gpus(labels)
    if not uuids:
        return (), None
    mode = labels.get(GPU_MODE_LABEL, "exclusive")
    if mode.startswith("shared:"):
        try:
            share = max(1, int(mode.partition(":")[2]))
        except ValueError:
            share = 1
        return uuids, GpuRequest(len(uuids), "shared", share)
    return uuids, GpuRequest(len(uuids))


class Claims:
    """The containers the servers of this hub claim, and those of its containers that
    none claims (suspected zombies, since when). Filled from each spawner's
    ``load_state`` as the hub starts, before the first sync can suspect them."""

    def __init__(self) -> None:
        self.known: set[str] = set()
        self.suspects: dict[str, float] = {}  # unclaimed container -> first seen

    def claim(self, name: str) -> None:
        self.known.add(name)
        self.suspects.pop(name, None)  # a later lapse gets a fresh grace period

    def forget(self, name: str) -> None:
        self.known.discard(name)


class Reconciler:
    """Keeps one pool's holdings in step with the engine's containers. ``client``: a
    docker APIClient (its methods block); ``usage``: the ledger's writer, for the
    sessions of removed zombies."""

    def __init__(self, pool: GpuPool, client: Any, log: logging.Logger | logging.LoggerAdapter,
                 *, sync_interval: float = 30.0, zombie_grace: float = 300.0,
                 claims: Claims | None = None, usage: LedgerWriter | None = None):
        self.pool = pool
        self.client = client
        self.log = log
        self.sync_interval = sync_interval
        self.zombie_grace = zombie_grace
        self.claims = claims if claims is not None else Claims()
        self.usage = usage
        self._ready = False
        self._sync_lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None

    async def ready(self) -> None:
        """Holdings rebuilt from the containers; awaited before any spawn is served."""
        if not self._ready:
            await self.sync()
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._loop())

    async def sync(self) -> None:
        async with self._sync_lock:
            listed_at = time.monotonic()
            containers = await asyncio.to_thread(self.client.containers, all=True,
                                                 filters={"label": GPUS_LABEL})
            rooms = await self._rooms(containers) if self.pool.host is not None else {}
            self._reconcile(containers, listed_at, rooms)
            self._ready = True
            zombies = [name for name, seen in self.claims.suspects.items()
                       if time.monotonic() - seen >= self.zombie_grace]
        for name in zombies:
            await self._stop_zombie(name)
        inventory = self.pool.inventory
        if inventory.source == "nvml" and inventory.devices:
            free = await asyncio.to_thread(free_memory, inventory.uuids)
            self.pool.allocator.set_free_memory(free)

    async def _rooms(self, containers: list[dict[str, Any]]) -> dict[str, Reservation]:
        """The CPUs and memory of this hub's running containers that the host book does
        not hold yet (after a restart), read once each from the engine."""
        pool, host = self.pool, self.pool.host
        assert host is not None
        found = {}
        for c in containers:
            name = container_name(c)
            if (c.get("State") not in ALIVE_STATES or name in pool.starting
                    or (c.get("Labels") or {}).get(HUB_LABEL) != pool.hub_id
                    or host.holding(name) is not None):
                continue
            try:
                info = await asyncio.to_thread(self.client.inspect_container, name)
            except Exception:  # gone meanwhile: the next sync sees it gone
                continue
            found[name] = room_of(info)
        return found

    def _reconcile(self, containers: list[dict[str, Any]], listed_at: float,
                   rooms: dict[str, Reservation] | None = None) -> None:
        """Bring the holdings in line with a container list taken at ``listed_at``;
        ``rooms``: the host room of containers the host book lacks."""
        pool, claims = self.pool, self.claims
        alive = {container_name(c): c for c in containers if c.get("State") in ALIVE_STATES}
        changed = pool.changed_since(listed_at)

        def settled(owner: str) -> bool:
            # not mid-start, and not acquired or released since the list was taken
            return owner not in pool.starting and owner not in changed

        for owner in pool.holdings():
            if owner not in alive and settled(owner):
                pool.release(owner, "its container is gone")
        if pool.host is not None:
            for owner in list(pool.host.owners()):
                if owner not in alive and settled(owner):
                    pool.release(owner, "its container is gone")
            for name, room in (rooms or {}).items():
                if name in alive and settled(name) and pool.host.holding(name) is None:
                    pool.adopt_room(name, room)
        held = pool.holdings()
        for name, c in alive.items():
            labels = c.get("Labels") or {}
            uuids, request = request_from_labels(labels)
            if request is not None and settled(name):
                holding = held.get(name)
                if holding is None or holding.uuids != uuids:
                    pool.adopt(name, uuids, request)
            holds_room = pool.host is not None and pool.host.holding(name) is not None
            # who it is, so a preemption may choose it (its age from its creation)
            if (request is not None or holds_room) and settled(name) and \
                    name not in pool.servers and labels.get(ROLE_LABEL):
                pool.servers[name] = Server(labels.get(USER_LABEL, ""),
                                            labels[ROLE_LABEL], float(c.get("Created") or 0))
            if labels.get(HUB_LABEL) == pool.hub_id and USER_LABEL in labels:
                self._check_claimed(name, labels, listed_at)
        for name in list(claims.suspects):
            if name not in alive or name in claims.known:
                claims.suspects.pop(name)
        pool.snapshots.changed()  # adoptions; a write that changes nothing is skipped

    def _check_claimed(self, name: str, labels: dict[str, str], now: float) -> None:
        claims = self.claims
        if name in claims.known or name in self.pool.starting or name in claims.suspects:
            return
        claims.suspects[name] = now
        self.log.warning(
            "Container %s (user %s, GPUs %s) has this hub's labels, but no server of this "
            "hub claims it; it will be stopped in %.0f s unless one does",
            name, labels.get(USER_LABEL, "?"), labels.get(GPUS_LABEL) or "none",
            self.zombie_grace,
        )

    async def _stop_zombie(self, name: str) -> None:
        if name in self.claims.known or name in self.pool.starting:
            self.claims.suspects.pop(name, None)
            return
        holding = self.pool.allocator.holding(name)
        self.log.warning("Stopping unclaimed container %s, which held GPUs %s", name,
                         ",".join(holding.uuids) if holding else "none")
        try:
            await asyncio.to_thread(self.client.remove_container, name, force=True)
        except Exception as e:
            if getattr(getattr(e, "response", None), "status_code", None) != 404:
                self.log.error("Could not remove unclaimed container %s: %s", name, e)
                return
        self.claims.suspects.pop(name, None)
        self.pool.release(name, "unclaimed container removed")
        if self.usage is not None:
            await self.usage.close(self.pool.hub_id, name, ZOMBIE)

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.sync_interval)
            try:
                await self.sync()
            except Exception as e:  # keep syncing; Docker may be back next time
                self.log.error("GPU sync with Docker failed: %s", e)

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
