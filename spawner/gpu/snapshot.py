"""The GPU pool and the host's room as a JSON document, for the admins' host map in
another process.

The hub holds the GPUs, the host's reservations and the queue in memory; the usage
service that draws the map is another process. So the pool publishes ``pool_snapshot`` as
the hub's ``GPUS`` document (spawner/usage/documents.py: a row of the ledger's database, or
``quota-spawner-gpus.json`` in the state folder of a hub without a ledger) whenever its
holdings or its queue change, at most once a second (``SnapshotWriter``).

Format (``"version": 1``, fields are only ever added; times are epoch seconds, memory
in bytes, CPUs as numbers of CPUs):

- ``version``, ``time`` (when it was taken), ``hub`` (the hub id);
- ``inventory``: ``source`` ("nvml", "declared", "none") and ``reason``;
- ``usage``: counts of GPUs ``total``, ``exclusive``, ``shared``, ``free``;
- ``gpus``: one object per GPU of the pool, in inventory order: ``uuid``,
  ``index``, ``name``, ``memory`` (None: unknown), ``parent`` (a MIG
  instance's GPU), ``state`` ("free", "exclusive" or "shared"), ``free_slots``
  (how many more shared holders it takes; None when free, 0 when exclusive),
  ``reserved_for`` (the owner a preemption keeps it for, or None) and
  ``holders``: ``owner`` (container name), ``user``, ``role``, ``mode``
  ("exclusive" or "shared:N"), ``memory_cap`` (a shared role's soft cap, or
  None), ``since`` (the server's start, None when unknown), ``evicting_for``
  (the owner whose preemption stops it, or None);
- ``queue_strategy``: the queue's strategy ("BestEffortFIFO" or "StrictFIFO") and
  ``queue_fair``: true, the queue serves a user's first server before anyone's second
  (docs/preemption.md#the-queues-strategies);
- ``queue``: the waiting tickets in order: ``position`` (1-based), ``owner``,
  ``user``, ``role``, ``priority``, ``since``, ``gpus`` (how many asked; 0 for a
  CPU-only start, which waits for host room only), ``mode`` ("" for none),
  ``preempting`` (a preemption is under way for it), ``victims`` (the owners being
  stopped for it), ``reserved`` (the GPUs kept for it), ``cpus`` and ``memory`` (the
  host room it asks for; None when host admission is off), ``waiting_for`` (why it
  waits for room on the host, as a sentence with its own figures, or whom it is held
  behind; else None), ``behind`` (the owner of the older start it is held behind while
  it fits, or None) and ``user_servers`` (the servers its user has before it, held or
  asked for earlier: its place among equal priorities);
- ``host``: None when host admission is off, else the host's room
  (docs/deployment.md#host-capacity): ``cpus`` and ``memory`` (what the hub counts of
  the engine), ``kept_cpus`` and ``kept_memory`` (kept back for the hub, the proxy and
  the system), ``cpu_ratio`` and ``memory_ratio`` (the overcommit), ``share``
  (``cpus``, ``memory``: what the notebooks together may reserve), ``reserved``
  (``cpus``, ``memory``: what the servers hold now) and ``servers``: one per holder,
  by owner: ``owner``, ``user`` and ``role`` (None when the pool does not know them),
  ``cpus``, ``memory``.

A reader learns from it what the hub checks the quota table against (``hub_room``): its
GPU inventory, as ``GpuPool.capacity``, and its host's share, as ``HostCapacity``, so
that the table editor checks a table as this hub would, like ``quota-spawner validate
--gpus N --gpu-memory SIZE --engine``. The hub publishes it as soon as its runtime is
built (``GpuPool.set_host``), before any server starts.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from spawner.gpu.allocator import GpuAllocator, GpuRequest, Slot
from spawner.gpu.inventory import Inventory
from spawner.gpu.queue import GpuQueue, Ticket
from spawner.host.admission import HostBook, HostCapacity
from spawner.quota.model import GpuCapacity

SNAPSHOT_VERSION = 1
WRITE_INTERVAL = 1.0  # seconds: the most often the file is written


class PoolView(Protocol):
    """What a snapshot reads of a GpuPool."""

    inventory: Inventory
    allocator: GpuAllocator
    queue: GpuQueue
    servers: Mapping[str, Any]  # owner -> pool.Server (user, role, started)
    hub_id: str
    host: HostBook | None  # None: host admission is off


def _mode(request: GpuRequest | None) -> str:
    if request is None:
        return ""
    return f"shared:{request.share}" if request.shared else "exclusive"


def _cpus(value: float) -> float:
    return round(value, 3)  # sums of fractions of CPUs: no float noise in the file


def pool_snapshot(pool: PoolView, now: float, monotonic_now: float | None = None) -> dict:
    """The pool's GPUs, holders and queue at ``now`` (epoch); JSON-serialisable.

    ``monotonic_now``: the queue's clock at ``now``, to turn its arrival times
    into epoch seconds (default: ``time.monotonic()``).
    """
    mono = time.monotonic() if monotonic_now is None else monotonic_now
    holders, reserved = pool.allocator.snapshot()
    evicting = dict(pool.queue.evicting)
    usage = pool.allocator.usage()
    gpus = []
    for device in pool.inventory.devices:
        held = holders.get(device.uuid, {})
        slot = Slot.of(held.values())
        if not held:
            state, free_slots = "free", None
        elif slot.exclusive:
            state, free_slots = "exclusive", 0
        else:
            state, free_slots = "shared", max(0, slot.share - slot.count)
        rows = []
        for owner, request in sorted(held.items()):
            server = pool.servers.get(owner)
            rows.append({
                "owner": owner,
                "user": getattr(server, "user", None),
                "role": getattr(server, "role", None),
                "mode": _mode(request),
                "memory_cap": request.memory if request.shared else None,
                "since": getattr(server, "started", None) or None,
                "evicting_for": evicting.get(owner),
            })
        gpus.append({
            "uuid": device.uuid, "index": device.index, "name": device.name,
            "memory": device.memory, "parent": device.parent, "state": state,
            "free_slots": free_slots, "reserved_for": reserved.get(device.uuid),
            "holders": rows,
        })
    queue = []
    for position, ticket in enumerate(pool.queue.waiting(), 1):
        victims = ([v for v in ticket.plan.victims if evicting.get(v) == ticket.owner]
                   if ticket.plan is not None else [])
        queue.append({
            "position": position, "owner": ticket.owner, "user": ticket.user,
            "role": ticket.role, "priority": ticket.priority,
            "since": round(now - (mono - ticket.arrived), 1),
            "gpus": ticket.request.count if ticket.request is not None else 0,
            "mode": _mode(ticket.request),
            "preempting": ticket.plan is not None, "victims": victims,
            "reserved": sorted(u for u, o in reserved.items() if o == ticket.owner),
            "user_servers": ticket.servers,
            **_room(ticket),
        })
    return {
        "version": SNAPSHOT_VERSION,
        "time": round(now, 3),
        "hub": pool.hub_id,
        "inventory": {"source": pool.inventory.source, "reason": pool.inventory.reason},
        "usage": {"total": usage.total, "exclusive": usage.exclusive,
                  "shared": usage.shared, "free": usage.free},
        "gpus": gpus,
        "queue_strategy": pool.queue.strategy,
        "queue_fair": True,
        "queue": queue,
        "host": _host(pool.host, pool.servers) if pool.host is not None else None,
    }


def _room(ticket: Ticket) -> dict[str, Any]:
    """A queue row's host room, and why it waits for room."""
    room = ticket.host
    return {"cpus": _cpus(room.cpus) if room is not None else None,
            "memory": room.memory if room is not None else None,
            "waiting_for": ticket.room_sentence(),
            "behind": ticket.behind.owner if ticket.behind is not None else None}


def _host(book: HostBook, servers: Mapping[str, Any]) -> dict[str, Any]:
    capacity, share, reserved = book.capacity, book.capacity.share, book.reserved
    rows = []
    for owner in sorted(book.owners()):
        room = book.holding(owner)
        assert room is not None
        server = servers.get(owner)
        rows.append({"owner": owner, "user": getattr(server, "user", None),
                     "role": getattr(server, "role", None),
                     "cpus": _cpus(room.cpus), "memory": room.memory})
    return {
        "cpus": _cpus(capacity.cpus), "memory": capacity.memory,
        "kept_cpus": _cpus(capacity.kept_cpus), "kept_memory": capacity.kept_memory,
        "cpu_ratio": capacity.cpu_ratio, "memory_ratio": capacity.memory_ratio,
        "share": {"cpus": _cpus(share.cpus), "memory": share.memory},
        "reserved": {"cpus": _cpus(reserved.cpus), "memory": reserved.memory},
        "servers": rows,
    }


class SnapshotWriter:
    """Publishes a pool's snapshot after changes, at most every ``interval``.

    ``changed`` only marks the snapshot dirty and, on a running event loop,
    schedules one write; the write goes through ``publish`` (the runtime's: the
    ``GPUS`` document, saved on the event log's thread). Without it nothing is written.
    """

    def __init__(self, pool: PoolView, publish: Callable[[str], None] | None,
                 interval: float = WRITE_INTERVAL):
        self.pool = pool
        self._publish = publish  # the snapshot's JSON -> None, never blocking
        self.interval = interval
        self.dirty = False
        self.written = 0  # how many times it was published
        self._last = -float("inf")  # monotonic time of the last write
        self._timer: asyncio.TimerHandle | None = None
        self._body: dict | None = None  # the last written, less its time

    def changed(self) -> None:
        if self._publish is None:
            return
        self.dirty = True
        if self._timer is not None:
            return  # a write is already due: this change goes with it
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop (a test, a sync call): the next change on the loop writes
        delay = max(0.0, self._last + self.interval - time.monotonic())
        self._timer = loop.call_later(delay, self.write)

    def write(self) -> None:
        """Write now if dirty (the timer's call)."""
        self._timer = None
        if not self.dirty or self._publish is None:
            return
        self.dirty = False
        self._last = time.monotonic()
        snapshot = pool_snapshot(self.pool, time.time(), self._last)
        body = {k: v for k, v in snapshot.items() if k != "time"}
        if body == self._body:
            return  # nothing but the time moved
        self._body = body
        self.written += 1
        self._publish(json.dumps(snapshot, sort_keys=True))

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None



# --- what a reader learns of the hub's room -----------------------------------------------


@dataclass(frozen=True)
class HubRoom:
    """What the hub checks the quota table against, as its snapshot tells it."""

    gpus: GpuCapacity  # the inventory: how many GPUs, and the smallest's memory
    host: HostCapacity | None  # the host's share; None when host admission is off
    time: float  # when the hub published it (epoch seconds)


def _count(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0


def hub_room(snapshot: Mapping[str, Any] | None) -> HubRoom | None:
    """The hub's room in ``snapshot`` (a ``pool_snapshot``, as read back from its JSON);
    None when there is none, or it is of another version or not one (a reader never
    fails on an odd document). A host part that cannot be read is taken as none."""
    if not snapshot or snapshot.get("version") != SNAPSHOT_VERSION:
        return None
    devices = snapshot.get("gpus")
    when = snapshot.get("time")
    if not isinstance(devices, list) or not _count(when):
        return None
    memories = [d.get("memory") if isinstance(d, dict) else None for d in devices]
    # as Inventory.smallest_memory: unknown when any GPU's memory is
    smallest = (min(memories) if memories and all(_count(m) for m in memories) else None)
    return HubRoom(GpuCapacity(len(devices), smallest), _host_of(snapshot.get("host")),
                   float(when))


def _host_of(host: Any) -> HostCapacity | None:
    if not isinstance(host, dict):
        return None
    values = [host.get(k) for k in ("cpus", "memory", "kept_cpus", "kept_memory",
                                    "cpu_ratio", "memory_ratio")]
    if not all(_count(v) for v in values):
        return None
    cpus, memory, kept_cpus, kept_memory, cpu_ratio, memory_ratio = values
    try:
        return HostCapacity(float(cpus), int(memory), reserve_cpus=float(kept_cpus),
                            reserve_memory=int(kept_memory), cpu_ratio=float(cpu_ratio),
                            memory_ratio=float(memory_ratio))
    except ValueError:
        return None
