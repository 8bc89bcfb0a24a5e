"""The hub's GPU pool: who holds which GPU, and who waits for one.

One pool per hub process and inventory, shared by all its spawners: the
allocator (which GPUs each server holds), the wait queue in front of it, and
what the queue's preemption decisions need to know about each holder (its
user, role and start). It keeps no engine: keeping it in step with the running
containers is the backend's job (spawner/docker/reconcile.py), and so is
carrying out a preemption (``Evictions``, spawner/docker/evictor.py).

In memory, on the hub's event loop; the only thing it writes is the host map's
snapshot (gpu/snapshot.py), through the event log's thread.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from spawner.gpu.allocator import GpuAllocator, GpuRequest, Holding
from spawner.gpu.inventory import (
    DISCOVERY_OFF,
    INVALID,
    Inventory,
    declared_inventory,
    discover_nvml,
)
from spawner.gpu.preemption import Running
from spawner.gpu.queue import BEST_EFFORT_FIFO, Dispatched, GpuQueue, Ticket, next_release
from spawner.gpu.snapshot import SnapshotWriter
from spawner.host.admission import HostBook, Reservation
from spawner.quota.model import GpuCapacity, Role
from spawner.quota.units import format_human
from spawner.usage.event_log import EventLog


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


class GpuPool:
    """One per hub process (and inventory): shared by all its spawners."""

    def __init__(self, inventory: Inventory, hub_id: str,
                 log: logging.Logger | logging.LoggerAdapter,
                 events: EventLog | None = None,
                 publish: Callable[[str], None] | None = None,
                 strategy: str = BEST_EFFORT_FIFO):
        self.inventory = inventory
        self.allocator = GpuAllocator(inventory.devices)
        self.hub_id = hub_id
        self.log = log
        self.starting: set[str] = set()  # owners mid-start: not gone, not zombies
        # owner -> when its holding last changed here; a container list taken
        # before that says nothing about the holding (changed_since)
        self._changed: dict[str, float] = {}
        self.servers: dict[str, Server] = {}  # holder -> who, for preemption and fairness
        # ``strategy``: c.QuotaSpawner.queue_strategy (docs/preemption.md#the-queues-strategies)
        self.queue = GpuQueue(self.allocator, strategy=strategy, user_of=self._user_of)
        self.roles: Mapping[str, Role] = {}  # the quota table's roles, as last read
        self.events = events or EventLog("")
        # the admins' host map reads the snapshot (gpu/snapshot.py), which ``publish``
        # saves: every change of the holdings or the queue passes through acquire,
        # dispatch, release or adopt
        self.snapshots = SnapshotWriter(self, publish)
        self.evictions: Evictions | None = None
        self._queue_task: asyncio.Task[None] | None = None
        self._running: tuple[tuple[int, ...], float, dict[str, Running]] | None = None
        self.host: HostBook | None = None  # the host's CPUs and memory, when admission is on

    def set_host(self, book: HostBook | None) -> None:
        """Count the host's CPUs and memory (docs/deployment.md#host-capacity): every
        start then joins the queue, and waits while the host is full."""
        self.host = self.queue.host = book
        # published now: the table editor checks tables against the inventory and the host
        # before any server has started (snapshot.hub_room)
        self.snapshots.changed()

    def _user_of(self, owner: str) -> str | None:
        server = self.servers.get(owner)
        return server.user if server is not None else None

    @property
    def capacity(self) -> GpuCapacity:
        """What the quota table is checked against."""
        return GpuCapacity(len(self.inventory.devices), self.inventory.smallest_memory())

    # --- holding ------------------------------------------------------------------------

    def acquire(self, owner: str, request: GpuRequest) -> tuple[str, ...]:
        """Hold GPUs at once, outside the queue (raises NoGpuFree)."""
        self._changed[owner] = time.monotonic()
        try:
            return self.allocator.acquire(owner, request)
        finally:
            self.snapshots.changed()

    def adopt(self, owner: str, uuids: tuple[str, ...], request: GpuRequest) -> None:
        """Record a holding found on a running container (after a restart, or
        another hub's); a GPU it shares against the rules is logged, never refused."""
        conflicts = self.allocator.adopt(owner, uuids, request)
        self.log.info("GPU %s held by running container %s (%s)", ",".join(uuids), owner,
                      mode_label(request))
        for conflict in conflicts:
            self.log.error("GPU double-booked: %s", conflict)

    def release(self, owner: str, why: str) -> tuple[str, ...]:
        """``owner``'s GPUs and host room come free."""
        self._changed[owner] = time.monotonic()
        uuids = self.allocator.release(owner)
        room = self.host.release(owner) if self.host is not None else None
        if uuids:
            self.log.info("GPU %s released by %s: %s", ",".join(uuids), owner, why)
        if uuids or room:
            self.servers.pop(owner, None)
            self.queue.victim_gone(owner)
            self.dispatch()
        return uuids

    def adopt_room(self, owner: str, room: Reservation) -> None:
        """Count the host room of a running container found on the engine (a restart)."""
        assert self.host is not None
        self.host.hold(owner, room)
        self.log.info("Host room %g CPUs, %s held by running container %s", room.cpus,
                      format_human(room.memory), owner)

    def holdings(self) -> dict[str, Holding]:
        return self.allocator.holdings()

    def changed_since(self, moment: float) -> set[str]:
        """The owners whose holding changed here at or after ``moment`` (monotonic):
        a container list taken at ``moment`` is out of date for them."""
        self._changed = {o: t for o, t in self._changed.items() if t >= moment}
        return set(self._changed)

    # --- the queue ----------------------------------------------------------------------

    def join(self, owner: str, server: Server, role: Role) -> Ticket:
        """Ask for ``role``'s GPUs and host room for ``owner``: served now, or queued (await
        ``ticket.grant``). Whoever joins must ``leave`` if it stops waiting."""
        request = request_for(role)
        assert request is not None or self.host is not None
        self._changed[owner] = time.monotonic()
        self.servers[owner] = server
        room = Reservation.of(role) if self.host is not None else None
        ticket = self.queue.join(owner, server.user, role.name, role.priority,
                                 role.may_preempt, request, time.monotonic(), host=room)
        self.dispatch()
        if not ticket.grant.done() and self._queue_task is None:
            self._queue_task = asyncio.ensure_future(self._queue_loop())
        return ticket

    def leave(self, owner: str, why: str) -> None:
        """Take ``owner`` out of the queue (served, refused, timed out or cancelled)."""
        ticket, victims = self.queue.leave(owner)
        if self.allocator.holding(owner) is None and \
                (self.host is None or self.host.holding(owner) is None):
            self.servers.pop(owner, None)
        if ticket is not None and victims and self.evictions is not None:
            self.evictions.call_off(ticket, victims, why)
        self.dispatch()

    def dispatch(self) -> Dispatched:
        """Hand free GPUs to the queue in order, and hand the preemptions it plans (and
        calls off) to ``evictions``."""
        done = (self.queue.dispatch(self.running, time.monotonic())
                if self.queue.any_waiting() else Dispatched())
        for ticket in done.granted:
            self._changed[ticket.owner] = time.monotonic()
        if self.evictions is not None:
            for ticket in done.planned:
                self.evictions.start(ticket)
            for ticket, victims in done.called_off:
                what = "GPUs" if ticket.request is not None and \
                    (ticket.plan is None or ticket.plan.uuids) else "room on the host"
                self.evictions.call_off(ticket, victims, f"{ticket.user} got {what} without "
                                        "needing this server's")
        self.snapshots.changed()
        return done

    async def _queue_loop(self) -> None:
        # min_runtime and reclaim_after expire with time, not with an event
        try:
            while self.queue.any_waiting():
                await asyncio.sleep(1.0)
                self.dispatch()
        finally:
            self._queue_task = None

    def next_release(self, ticket: Ticket) -> tuple[float, str] | None:
        """When a GPU may next come free for ``ticket`` (gpu/queue.py ``next_release``)."""
        return next_release(ticket, self._holders(), time.time())

    def running(self) -> dict[str, Running]:
        """Every GPU or host room holder that a preemption may consider, as it stands now: built
        again when the holdings, the servers or the table change, or a second on
        (ages move; a second is finer than any min_runtime an admin writes)."""
        now = time.time()
        key = (self.allocator.version, self.host.version if self.host else 0,
               len(self.servers), id(self.roles))
        if self._running is not None and self._running[0] == key and \
                now - self._running[1] < 1.0:
            return self._running[2]
        found = {owner: Running.of(owner, role, started, now)
                 for owner, _, role, started in self._holders()}
        self._running = (key, now, found)
        return found

    def _holders(self) -> list[tuple[str, str, Role, float]]:
        """(owner, user, role, started) of each holder of GPUs or host room whose role
        the table knows: the others (another hub's, a role gone from the table) are
        never victims."""
        found = []
        owners = dict.fromkeys(self.allocator.holdings())
        if self.host is not None:
            owners.update(dict.fromkeys(self.host.owners()))
        for owner in owners:
            server = self.servers.get(owner)
            role = self.roles.get(server.role) if server else None
            if server is not None and role is not None:
                found.append((owner, server.user, role, server.started))
        return found

    def close(self) -> None:
        """Stop the queue's timer and the snapshot's (the hub is going)."""
        if self._queue_task is not None:
            self._queue_task.cancel()
        self.snapshots.close()
