"""The hub's GPU pool: the allocator kept in step with the running containers.

The labels on running containers are the record of which GPUs are held
(docs/gpus.md#hub-restarts-and-unclaimed-containers). The pool rebuilds its
holdings from them before it serves the first spawn after a hub start, and
then on a timer:

- a holding whose container is gone (``docker rm``, OOM, a crash) is released;
- a running container holding GPUs that the allocator does not know about
  (another hub process, a restart) is adopted, so its GPUs are never handed out;
- a container of this hub that no spawner claims (a "zombie", e.g. left by a
  hub whose database was lost) is reported, and stopped and removed after a
  grace period, which releases its GPUs. Its home volume is kept.

Docker and NVML calls run in threads; the allocator itself is in-memory.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from spawner.contract import (
    GPU_MODE_LABEL,
    GPUS_LABEL,
    HUB_LABEL,
    ROLE_LABEL,
    USER_LABEL,
    labelled_gpus,
)
from spawner.events import EventLog
from spawner.gpu.allocator import GpuAllocator, GpuRequest
from spawner.gpu.inventory import (
    DISCOVERY_OFF,
    INVALID,
    Inventory,
    declared_inventory,
    discover_nvml,
    free_memory,
)
from spawner.gpu.preemption import Running
from spawner.gpu.queue import Dispatched, GpuQueue, Ticket
from spawner.gpu.snapshot import SnapshotWriter
from spawner.quota.model import GpuCapacity, Role
from spawner.usage.ledger import ZOMBIE

if TYPE_CHECKING:
    from spawner.docker.engine import NvidiaRuntime
    from spawner.usage.ledger import LedgerWriter

# How long a stop may take before the server is taken down by removing its container.
STOP_TIMEOUT = 60.0

ALIVE_STATES = ("created", "running", "restarting", "paused")


def hub_inventory(declared: list[dict[str, Any]], discovery: bool) -> Inventory:
    """The GPUs a hub hands out: declared in its config, or found with NVML (blocks)."""
    if declared:
        try:
            return declared_inventory(declared)
        except ValueError as e:
            return Inventory((), "none", f"{INVALID}: {e}")
    if not discovery:
        return Inventory((), "none", DISCOVERY_OFF)
    return discover_nvml()


def request_for(role: Role) -> GpuRequest | None:
    """What a role asks of the pool; None for a CPU-only role."""
    if not role.gpus:
        return None
    return GpuRequest(role.gpus, role.gpu_mode, role.gpu_share, role.gpu_memory)


def mode_label(request: GpuRequest | None) -> str:
    if request is None:
        return ""
    return f"shared:{request.share}" if request.shared else "exclusive"


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


@dataclass(frozen=True)
class Server:
    """Who holds a GPU holding, for preemption and the queue's estimates."""

    user: str
    role: str  # the quota table's role name
    started: float  # epoch seconds


class Evictions(Protocol):
    """What carries out the queue's preemption decisions (spawner/docker/evictor.py)."""

    def start(self, ticket: Ticket) -> None: ...
    def call_off(self, ticket: Ticket, victims: tuple[str, ...], why: str) -> None: ...


def container_name(container: dict[str, Any]) -> str:
    names = container.get("Names") or ["/"]
    return names[0].lstrip("/")


class GpuPool:
    """One per hub process (and inventory): shared by all its spawners."""

    def __init__(
        self,
        inventory: Inventory,
        hub_id: str,
        docker: Callable[..., Any],
        log: logging.Logger | logging.LoggerAdapter,
        sync_interval: float = 30.0,
        zombie_grace: float = 300.0,
        known: set[str] | None = None,
        spawners: weakref.WeakValueDictionary[str, Any] | None = None,
        events: EventLog | None = None,
        gpus_file: str = "",
    ):
        self.inventory = inventory
        self.allocator = GpuAllocator(inventory.devices)
        self.hub_id = hub_id
        self._docker = docker  # a docker APIClient (its methods block)
        self.log = log
        self.sync_interval = sync_interval
        self.zombie_grace = zombie_grace
        # containers a spawner of this hub claims (shared with the spawner class)
        self.known: set[str] = known if known is not None else set()
        self.starting: set[str] = set()  # owners mid-start: not gone, not zombies
        self._suspects: dict[str, float] = {}  # unclaimed container -> first seen
        # owner -> when its holding last changed here; a container list taken
        # before that says nothing about the holding
        self._changed: dict[str, float] = {}
        self._ready = False
        self._sync_lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self.queue = GpuQueue(self.allocator)
        self.servers: dict[str, Server] = {}  # holder -> who, for preemption
        self.roles: Mapping[str, Role] = {}  # the quota table's roles, as last read
        # container name -> its spawner, to stop a preempted server the hub's way
        self.spawners: weakref.WeakValueDictionary[str, Any] = (
            spawners if spawners is not None else weakref.WeakValueDictionary())
        self.events = events or EventLog("")
        # the admins' GPU map reads this file (gpu/snapshot.py): every change of the
        # holdings or the queue passes through acquire, dispatch or _reconcile
        self.snapshots = SnapshotWriter(self, gpus_file, self.events.replace)
        self.evictions: Evictions | None = None
        self.usage: LedgerWriter | None = None  # the usage ledger, when there is one
        self.usage_duties: Any = None
        # whether the engine can give GPUs at all (engine.py); None without GPUs
        self.nvidia: NvidiaRuntime | None = None
        self._queue_task: asyncio.Task[None] | None = None
        self._running: tuple[tuple[int, int, int], float, dict[str, Running]] | None = None

    async def stop_server(self, name: str, why: str) -> bool:
        """Stop ``name`` the way the hub stops any server (its proxy route, then its
        spawner), so the hub's record and the user's page agree; if that fails or no
        spawner holds it, remove its container. False when neither worked."""
        spawner = self.spawners.get(name)
        if spawner is not None and not spawner.pending and spawner.server is not None:
            try:
                user = spawner.user
                proxy = user.settings.get("proxy")
                if proxy is not None:
                    await proxy.delete_user(user, spawner.name)
                await asyncio.wait_for(user.stop(spawner.name), STOP_TIMEOUT)
                return True
            except Exception as e:
                self.log.error("Could not stop %s (%s) through the hub (%s); removing its "
                               "container", name, why, e)
        try:
            await asyncio.to_thread(self._docker.remove_container, name, force=True)
        except Exception as e:
            if getattr(getattr(e, "response", None), "status_code", None) != 404:
                self.log.error("Could not remove container %s (%s): %s", name, why, e)
                return False
        return True

    # --- the spawners' side ---------------------------------------------------

    @property
    def docker_client(self) -> Any:
        """The docker APIClient (its methods block: call them in a thread)."""
        return self._docker

    @property
    def capacity(self) -> GpuCapacity:
        """What the quota table is checked against."""
        return GpuCapacity(len(self.inventory.devices), self.inventory.smallest_memory())

    async def ready(self) -> None:
        """Holdings rebuilt from the containers; awaited before any spawn is served."""
        if not self._ready:
            await self.sync()
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._loop())

    def claim(self, name: str, spawner: Any = None) -> None:
        self.known.add(name)
        self._suspects.pop(name, None)
        if spawner is not None:
            self.spawners[name] = spawner

    def acquire(self, owner: str, request: GpuRequest) -> tuple[str, ...]:
        """Hold GPUs at once, outside the queue (raises NoGpuFree)."""
        self._changed[owner] = time.monotonic()
        try:
            return self.allocator.acquire(owner, request)
        finally:
            self.snapshots.changed()

    def join(self, owner: str, server: Server, role: Role) -> Ticket:
        """Ask for ``role``'s GPUs for ``owner``: served now, or queued (await
        ``ticket.grant``). Whoever joins must ``leave`` if it stops waiting."""
        request = request_for(role)
        assert request is not None
        self._changed[owner] = time.monotonic()
        self.servers[owner] = server
        ticket = self.queue.join(owner, server.user, role.name, role.priority,
                                 role.may_preempt, request, time.monotonic())
        self.dispatch()
        if not ticket.grant.done() and self._queue_task is None:
            self._queue_task = asyncio.ensure_future(self._queue_loop())
        return ticket

    def leave(self, owner: str, why: str) -> None:
        """Take ``owner`` out of the queue (served, refused, timed out or cancelled)."""
        ticket, victims = self.queue.leave(owner)
        if self.allocator.holding(owner) is None:
            self.servers.pop(owner, None)
        if ticket is not None and victims and self.evictions is not None:
            self.evictions.call_off(ticket, victims, why)
        self.dispatch()

    def next_release(self, ticket: Ticket) -> tuple[float, str] | None:
        """When a GPU may next come free for ``ticket`` without anyone stopping: the
        soonest max_age due, or (for a role that may preempt this holder) the soonest
        min_runtime or reclaim_after passed. (epoch seconds, why); None if none is due."""
        now = time.time()
        due: list[tuple[float, str]] = []
        for owner in self.allocator.holdings():
            server = self.servers.get(owner)
            role = self.roles.get(server.role) if server else None
            if server is None or role is None:
                continue
            whose = f"{server.user}'s server"
            if role.max_age:
                due.append((server.started + role.max_age, f"{whose} reaches its max_age"))
            if ticket.may_preempt and role.priority < ticket.priority:
                if not role.preemptible:
                    if role.reclaim_after:  # else never preemptible
                        due.append((server.started + max(role.reclaim_after, role.min_runtime),
                                    f"{whose} passes its reclaim_after and may be preempted"))
                elif role.min_runtime:
                    due.append((server.started + role.min_runtime,
                                f"{whose} passes its min_runtime and may be preempted"))
        future = [d for d in due if d[0] > now]
        return min(future) if future else None

    def running(self) -> dict[str, Running]:
        """Every GPU holder that a preemption may consider, as it stands now: built
        again when the holdings, the servers or the table change, or a second on
        (ages move; a second is finer than any min_runtime an admin writes)."""
        now = time.time()
        key = (self.allocator.version, len(self.servers), id(self.roles))
        if self._running is not None and self._running[0] == key and \
                now - self._running[1] < 1.0:
            return self._running[2]
        found = self._build_running(now)
        self._running = (key, now, found)
        return found

    def _build_running(self, now: float) -> dict[str, Running]:
        found = {}
        for owner in self.allocator.holdings():
            server = self.servers.get(owner)
            role = self.roles.get(server.role) if server else None
            if server is None or role is None:
                continue  # unknown: never a victim
            age = max(0.0, now - server.started)
            found[owner] = Running(owner, role.priority, age, role.min_runtime,
                                   role.protected_at(age),
                                   role.reclaim_after - age if role.reclaim_after
                                   else float("inf"))
        return found

    def dispatch(self) -> Dispatched:
        """Hand free GPUs to the queue in order, and start any preemption it plans."""
        done = (self.queue.dispatch(self.running, time.monotonic())
                if self.queue.waiting() else Dispatched())
        for ticket in done.granted:
            self._changed[ticket.owner] = time.monotonic()
        if self.evictions is not None:
            for ticket in done.planned:
                self.evictions.start(ticket)
            for ticket, victims in done.called_off:
                self.evictions.call_off(ticket, victims, f"{ticket.user} got GPUs without "
                                        "needing this server's")
        self.snapshots.changed()
        return done

    async def _queue_loop(self) -> None:
        # min_runtime and reclaim_after expire with time, not with an event
        try:
            while self.queue.waiting():
                await asyncio.sleep(1.0)
                self.dispatch()
        finally:
            self._queue_task = None

    def release(self, owner: str, why: str) -> tuple[str, ...]:
        self._changed[owner] = time.monotonic()
        uuids = self.allocator.release(owner)
        if uuids:
            self.log.info("GPU %s released by %s: %s", ",".join(uuids), owner, why)
            self.servers.pop(owner, None)
            self.queue.victim_gone(owner)
            self.dispatch()
        return uuids

    def forget(self, name: str, why: str) -> None:
        self.known.discard(name)
        self.release(name, why)

    # --- keeping in step with Docker ------------------------------------------

    async def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(getattr(self._docker, method), *args, **kwargs)

    async def sync(self) -> None:
        async with self._sync_lock:
            listed_at = time.monotonic()
            containers = await self._call("containers", all=True,
                                          filters={"label": GPUS_LABEL})
            self._reconcile(containers, listed_at)
            self._ready = True
            zombies = [name for name, seen in self._suspects.items()
                       if time.monotonic() - seen >= self.zombie_grace]
        for name in zombies:
            await self._stop_zombie(name)
        if self.inventory.source == "nvml" and self.inventory.devices:
            free = await asyncio.to_thread(free_memory, self.inventory.uuids)
            self.allocator.set_free_memory(free)

    def _reconcile(self, containers: list[dict[str, Any]], listed_at: float) -> None:
        """Bring the holdings in line with a container list taken at ``listed_at``."""
        alive = {container_name(c): c for c in containers if c.get("State") in ALIVE_STATES}
        self._changed = {o: t for o, t in self._changed.items() if t >= listed_at}

        def settled(owner: str) -> bool:
            # not mid-start, and not acquired or released since the list was taken
            return owner not in self.starting and owner not in self._changed

        for owner in self.allocator.holdings():
            if owner not in alive and settled(owner):
                self.release(owner, "its container is gone")
        held = self.allocator.holdings()
        for name, c in alive.items():
            labels = c.get("Labels") or {}
            uuids, request = request_from_labels(labels)
            if request is not None and settled(name):
                holding = held.get(name)
                if holding is None or holding.uuids != uuids:
                    self._adopt(name, uuids, request)
                if name not in self.servers and labels.get(ROLE_LABEL):
                    self.servers[name] = Server(labels.get(USER_LABEL, ""),
                                                labels[ROLE_LABEL], float(c.get("Created") or 0))
            if labels.get(HUB_LABEL) == self.hub_id and USER_LABEL in labels:
                self._check_claimed(name, labels, listed_at)
        for name in list(self._suspects):
            if name not in alive or name in self.known:
                self._suspects.pop(name)
        self.snapshots.changed()  # adoptions; a write that changes nothing is skipped

    def _adopt(self, name: str, uuids: tuple[str, ...], request: GpuRequest) -> None:
        conflicts = self.allocator.adopt(name, uuids, request)
        self.log.info("GPU %s held by running container %s (%s)", ",".join(uuids), name,
                      mode_label(request))
        for conflict in conflicts:
            self.log.error("GPU double-booked: %s", conflict)

    def _check_claimed(self, name: str, labels: dict[str, str], now: float) -> None:
        if name in self.known or name in self.starting or name in self._suspects:
            return
        self._suspects[name] = now
        self.log.warning(
            "Container %s (user %s, GPUs %s) has this hub's labels, but no server of this "
            "hub claims it; it will be stopped in %.0f s unless one does",
            name, labels.get(USER_LABEL, "?"), labels.get(GPUS_LABEL) or "none",
            self.zombie_grace,
        )

    async def _stop_zombie(self, name: str) -> None:
        if name in self.known or name in self.starting:
            self._suspects.pop(name, None)
            return
        self.log.warning("Stopping unclaimed container %s, which held GPUs %s", name,
                         ",".join(h.uuids) if (h := self.allocator.holding(name)) else "none")
        try:
            await self._call("remove_container", name, force=True)
        except Exception as e:
            if getattr(getattr(e, "response", None), "status_code", None) != 404:
                self.log.error("Could not remove unclaimed container %s: %s", name, e)
                return
        self._suspects.pop(name, None)
        self.release(name, "unclaimed container removed")
        if self.usage is not None:
            await self.usage.close(self.hub_id, name, ZOMBIE)

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.sync_interval)
            try:
                await self.sync()
            except Exception as e:  # keep syncing; Docker may be back next time
                self.log.error("GPU sync with Docker failed: %s", e)
